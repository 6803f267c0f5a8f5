//! The flags that shape every peer link of a cluster the command starts
//! (`--link-delay`, `--link-jitter`, `--link-spread`, `--link-loss`),
//! shared by `oncekv verify` and `oncekv netns`, and their checks: a
//! duration of at most a minute, a loss from 0 to 100 percent.

use clap::Args;
use oncekv_harness::peer_proxy::{LinkShape, SHAPE_DURATION_MAX, ShapeError, Spread};
use std::time::Duration;

/// Every peer link's delay, jitter and loss.
#[derive(Debug, Clone, Args)]
pub struct LinkArgs {
    /// Every peer link's one-way delay (each direction of each
    /// node-to-node link; e.g. 500us, 2ms, 10ms; at most 60s).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = link_duration)]
    link_delay: Duration,
    /// How far each chunk's delay strays from --link-delay, either way
    /// (never below zero, never reordering a connection's bytes).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = link_duration)]
    link_jitter: Duration,
    /// How the jitter spreads: uniformly within it, or normally (the
    /// jitter the standard deviation).
    #[arg(long, value_enum, default_value_t = SpreadArg::Uniform)]
    link_spread: SpreadArg,
    /// The share of each peer link's chunks lost, in percent (0 to 100;
    /// "1%" or "1"): each arrives a retransmission timeout (200 ms) late,
    /// as TCP resends a lost segment.
    #[arg(long, value_name = "PERCENT", default_value = "0", value_parser = loss_percent)]
    link_loss: f64,
}

impl LinkArgs {
    /// The shape the flags ask for.
    pub fn shape(&self) -> Result<LinkShape, ShapeError> {
        let spread = match self.link_spread {
            SpreadArg::Uniform => Spread::Uniform,
            SpreadArg::Normal => Spread::Normal,
        };
        LinkShape::new(self.link_delay, self.link_jitter, spread, self.link_loss)
    }
}

/// `--link-spread`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum SpreadArg {
    /// Uniformly within the jitter either side of the delay.
    Uniform,
    /// Normally, the jitter being the standard deviation.
    Normal,
}

/// Parses a link's delay or jitter: a duration of at most
/// [`SHAPE_DURATION_MAX`].
fn link_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text.trim())
        .map_err(|error| format!("`{text}` is not a duration (e.g. 500us, 2ms, 1s): {error}"))?;
    if duration > SHAPE_DURATION_MAX {
        return Err(format!(
            "`{text}` is longer than a link's delay or jitter may be ({SHAPE_DURATION_MAX:?})"
        ));
    }
    Ok(duration)
}

/// Parses a loss rate in percent, `1.5` or `1.5%`, from 0 to 100.
fn loss_percent(text: &str) -> Result<f64, String> {
    let number = text.trim().trim_end_matches('%').trim();
    let percent: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a percentage (e.g. 0.5, 1%, 10%)"))?;
    if !(0.0..=100.0).contains(&percent) {
        return Err(format!(
            "`{text}`: a loss rate is from 0 to 100 percent of a link's chunks"
        ));
    }
    Ok(percent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_is_a_percentage_and_delays_are_bounded() {
        assert_eq!(loss_percent("1.5%"), Ok(1.5));
        assert_eq!(loss_percent(" 10 "), Ok(10.0));
        assert_eq!(loss_percent("100"), Ok(100.0));
        for nonsense in ["101", "-1", "NaN", "lots", "%"] {
            assert!(loss_percent(nonsense).is_err(), "{nonsense}");
        }
        assert_eq!(link_duration("500us"), Ok(Duration::from_micros(500)));
        assert!(link_duration("61s").is_err());
        assert!(link_duration("soon").is_err());
    }
}
