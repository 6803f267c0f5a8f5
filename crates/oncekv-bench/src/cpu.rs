//! CPU use over the measured interval, from Linux's `/proc`: this client
//! process's user+system time (`/proc/self/stat`, as a percentage of one
//! core) and the whole machine's busy time (`/proc/stat`, as a percentage
//! of all cores). Elsewhere, or if `/proc` cannot be read, both are unknown.

use std::time::Instant;

/// Clock ticks per second of the times in `/proc` (`USER_HZ`, 100 on
/// every Linux architecture this runs on).
const TICKS_PER_SECOND: f64 = 100.0;

/// The counters at one instant.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    at: Instant,
    /// User+system ticks of this process, all threads.
    process_ticks: Option<u64>,
    /// Busy and total ticks of all cores.
    machine: Option<MachineTicks>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MachineTicks {
    busy: u64,
    total: u64,
}

/// CPU use between two samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// This process, in percent of one core (200 = two cores busy).
    pub client_pct: Option<f64>,
    /// The machine, in percent of all its cores.
    pub machine_pct: Option<f64>,
}

/// Reads the counters now.
pub fn sample() -> Sample {
    Sample {
        at: Instant::now(),
        process_ticks: std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|text| process_ticks(&text)),
        machine: std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|text| machine_ticks(&text)),
    }
}

/// The use between `start` and `end`.
pub fn usage(start: &Sample, end: &Sample) -> Usage {
    let seconds = end.at.saturating_duration_since(start.at).as_secs_f64();
    let client_pct = match (start.process_ticks, end.process_ticks) {
        (Some(a), Some(b)) if seconds > 0.0 => {
            Some(b.saturating_sub(a) as f64 / TICKS_PER_SECOND / seconds * 100.0)
        }
        _ => None,
    };
    let machine_pct = match (start.machine, end.machine) {
        (Some(a), Some(b)) if b.total > a.total => {
            Some(b.busy.saturating_sub(a.busy) as f64 / (b.total - a.total) as f64 * 100.0)
        }
        _ => None,
    };
    Usage {
        client_pct,
        machine_pct,
    }
}

/// utime + stime of a `/proc/PID/stat` line. The command name (field 2)
/// is in parentheses and may hold spaces or parentheses itself, so fields
/// are counted after the last `)`: there, state is field 3, utime 14 and
/// stime 15.
fn process_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Busy and total ticks of the `cpu` line of `/proc/stat`: user, nice,
/// system, idle, iowait, irq, softirq, steal (guest time is already
/// counted in user and nice). Idle and iowait are not busy.
fn machine_ticks(stat: &str) -> Option<MachineTicks> {
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if values.len() < 5 {
        return None;
    }
    let total: u64 = values.iter().sum();
    let idle = values[3] + values[4];
    Some(MachineTicks {
        busy: total - idle,
        total,
    })
}

#[cfg(test)]
fn available_cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_process_times_after_an_awkward_command_name() {
        let line = "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    250 75 0 0 20 0 9 0 12345 1000000 300 18446744073709551615";
        assert_eq!(process_ticks(line), Some(325));
        assert_eq!(process_ticks("garbage"), None);
        assert_eq!(process_ticks("1 (x) S 1 2"), None);
    }

    #[test]
    fn reads_machine_times_without_guest_time() {
        let stat = "cpu  100 10 50 800 40 0 0 0 7 0\ncpu0 50 5 25 400 20 0 0 0 0 0\n";
        assert_eq!(
            machine_ticks(stat),
            Some(MachineTicks {
                busy: 160,
                total: 1000
            })
        );
        assert_eq!(machine_ticks("intr 1 2 3\n"), None);
        assert_eq!(machine_ticks("cpu  1 x 3 4 5\n"), None);
    }

    #[test]
    fn usage_is_the_share_of_the_interval() {
        let start = Instant::now();
        let a = Sample {
            at: start,
            process_ticks: Some(100),
            machine: Some(MachineTicks {
                busy: 1000,
                total: 4000,
            }),
        };
        let b = Sample {
            at: start + Duration::from_secs(2),
            process_ticks: Some(250),
            machine: Some(MachineTicks {
                busy: 1300,
                total: 4400,
            }),
        };
        let usage = usage(&a, &b);
        assert!((usage.client_pct.expect("known") - 75.0).abs() < 1e-9);
        assert!((usage.machine_pct.expect("known") - 75.0).abs() < 1e-9);
        let unknown = Sample {
            process_ticks: None,
            machine: None,
            ..b
        };
        assert_eq!(super::usage(&a, &unknown), Usage::default());
    }

    #[test]
    fn this_process_can_be_measured_here() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            eprintln!("no /proc here: skipped");
            return;
        }
        // Spin until this process's own CPU time has grown by a few ticks:
        // on a loaded machine a fixed spell of wall time may get little
        // CPU, so the test waits on the reading, not on the clock.
        let before = sample();
        let start = before.process_ticks.expect("process time readable");
        let give_up = Instant::now() + Duration::from_secs(30);
        let mut x = 0u64;
        let mut now = sample();
        while now.process_ticks.is_some_and(|ticks| ticks < start + 5) && Instant::now() < give_up {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            now = sample();
        }
        let used = usage(&before, &now);
        let client = used.client_pct.expect("process time readable");
        assert!(
            client > 0.0 && client <= 100.0 * available_cores(),
            "{client}% while spinning"
        );
        let machine = used.machine_pct.expect("machine time readable");
        assert!(machine > 0.0 && machine <= 100.0, "{machine}%");
    }
}
