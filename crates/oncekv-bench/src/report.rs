//! The result of a run, as a few human lines or one JSON object. The JSON
//! keys are a contract with the scripts that read them
//! (`scripts/bench-cluster.sh`, `scripts/bench-vs-etcd.sh`): keys may be
//! added, never renamed or removed.

use super::closed_loop::Measured;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What was run, as the report names it.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The workload's name.
    pub workload: &'static str,
    /// The mode's name.
    pub mode: &'static str,
    /// The target's name.
    pub target: &'static str,
    /// With etcd: which members the clients sent to.
    pub etcd_route: Option<&'static str>,
    /// Tasks.
    pub concurrency: usize,
    /// Client connections.
    pub connections: usize,
    /// Unmeasured warm-up, in seconds.
    pub warmup_s: f64,
    /// The `--ops` budget, if the run had one.
    pub ops_budget: Option<u64>,
    /// Distinct keys.
    pub keys: u64,
    /// Bytes per key.
    pub key_bytes: usize,
    /// Bytes per value.
    pub value_bytes: usize,
    /// For `mixed`: the share of reads.
    pub read_ratio: Option<f64>,
}

/// One run's report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Workload name.
    pub workload: &'static str,
    /// Mode name.
    pub mode: &'static str,
    /// `oncekv` or `etcd`.
    pub target: &'static str,
    /// With etcd: `leader` or `balanced`.
    pub etcd_route: Option<&'static str>,
    /// Tasks (closed loop: operations in flight).
    pub concurrency: usize,
    /// Client connections the tasks were spread over.
    pub connections: usize,
    /// Length of the measured part.
    pub duration_s: f64,
    /// The unmeasured warm-up before it.
    pub warmup_s: f64,
    /// The `--ops` budget, if given.
    pub ops_budget: Option<u64>,
    /// Completed operations (CAS conflicts included, errors not).
    pub operations: u64,
    /// Completed operations per second.
    pub throughput_ops: f64,
    /// Mean latency.
    pub mean_ms: f64,
    /// Median latency.
    pub p50_ms: f64,
    /// 90th percentile latency.
    pub p90_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// 99.9th percentile latency.
    pub p999_ms: f64,
    /// Highest latency.
    pub max_ms: f64,
    /// Failed operations by kind.
    pub errors: BTreeMap<String, u64>,
    /// The first message of each error kind.
    pub error_examples: BTreeMap<String, String>,
    /// Completed operations by kind (`get`, `put`, ...).
    pub op_counts: BTreeMap<&'static str, u64>,
    /// CAS operations that lost the race (counted as completed).
    pub cas_conflicts: u64,
    /// Read-modify-write rounds retried after a conflict (etcd APPEND,
    /// INCR and TRANSFER).
    pub rmw_retries: u64,
    /// Writes recognised as duplicates of an earlier attempt.
    pub duplicates: u64,
    /// This client process's CPU, in percent of one core.
    pub client_cpu_pct: Option<f64>,
    /// The machine's CPU, in percent of all cores.
    pub machine_cpu_pct: Option<f64>,
    /// Cores of the machine.
    pub cores: usize,
    /// Distinct keys.
    pub keys: u64,
    /// Bytes per key.
    pub key_bytes: usize,
    /// Bytes per value.
    pub value_bytes: usize,
    /// For `mixed`: the share of reads.
    pub read_ratio: Option<f64>,
}

impl Report {
    /// The report of `measured`.
    pub fn new(settings: Settings, measured: Measured) -> Report {
        let seconds = measured.elapsed.as_secs_f64();
        let tally = measured.tally;
        let histogram = &tally.histogram;
        let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
        Report {
            workload: settings.workload,
            mode: settings.mode,
            target: settings.target,
            etcd_route: settings.etcd_route,
            concurrency: settings.concurrency,
            connections: settings.connections,
            duration_s: seconds,
            warmup_s: settings.warmup_s,
            ops_budget: settings.ops_budget,
            operations: tally.operations,
            throughput_ops: if seconds > 0.0 {
                tally.operations as f64 / seconds
            } else {
                0.0
            },
            mean_ms: if histogram.is_empty() {
                0.0
            } else {
                histogram.mean() / 1000.0
            },
            p50_ms: ms(0.50),
            p90_ms: ms(0.90),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: histogram.max() as f64 / 1000.0,
            errors: tally.errors,
            error_examples: tally.error_examples,
            op_counts: tally.by_kind,
            cas_conflicts: tally.cas_conflicts,
            rmw_retries: tally.retries,
            duplicates: tally.duplicates,
            client_cpu_pct: measured.cpu.client_pct,
            machine_cpu_pct: measured.cpu.machine_pct,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            keys: settings.keys,
            key_bytes: settings.key_bytes,
            value_bytes: settings.value_bytes,
            read_ratio: settings.read_ratio,
        }
    }

    /// Failed operations.
    pub fn failed(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The report as one JSON object.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as a few lines for a person.
    pub fn text(&self) -> String {
        let mut text = String::new();
        let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        let _ = writeln!(
            text,
            "{} ({} mode) on {}: {} over {}, {:.2} s measured after {:.1} s warm-up",
            self.workload,
            self.mode,
            self.target,
            plural(self.concurrency, "task"),
            plural(self.connections, "connection"),
            self.duration_s,
            self.warmup_s,
        );
        let _ = writeln!(
            text,
            "  throughput  {:.0} ops/s ({} operations{})",
            self.throughput_ops,
            self.operations,
            match self.read_ratio {
                Some(_) => format!(
                    ": {} reads, {} writes",
                    self.op_counts.get("get").copied().unwrap_or(0),
                    self.op_counts.get("put").copied().unwrap_or(0)
                ),
                None => String::new(),
            }
        );
        let _ = writeln!(
            text,
            "  latency     p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
            self.p50_ms, self.p90_ms, self.p99_ms, self.p999_ms, self.max_ms
        );
        if self.workload == "cas" {
            let _ = writeln!(
                text,
                "  cas         {} conflicts (lost the race: counted as completed, nothing written)",
                self.cas_conflicts
            );
        }
        if self.workload == "transfer" {
            let _ = writeln!(
                text,
                "  conflicts   {} transfers retried after a conflict (etcd's read, then guarded write)",
                self.rmw_retries
            );
        } else if self.rmw_retries > 0 {
            let _ = writeln!(
                text,
                "  retries     {} read-modify-write rounds retried after a conflict",
                self.rmw_retries
            );
        }
        if self.duplicates > 0 {
            let _ = writeln!(
                text,
                "  duplicates  {} writes had applied on an earlier attempt",
                self.duplicates
            );
        }
        if self.errors.is_empty() {
            let _ = writeln!(text, "  errors      none");
        } else {
            for (kind, count) in &self.errors {
                let example = self.error_examples.get(kind).map_or("", String::as_str);
                let _ = writeln!(text, "  errors      {kind}: {count} (first: {example})");
            }
        }
        let pct = |value: Option<f64>| value.map_or("unknown".to_string(), |v| format!("{v:.0}%"));
        let _ = write!(
            text,
            "  cpu         client {} of one core, machine {} of {}",
            pct(self.client_cpu_pct),
            pct(self.machine_cpu_pct),
            plural(self.cores, "core")
        );
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::closed_loop::Tally;
    use crate::cpu;
    use hdrhistogram::Histogram;
    use std::time::Duration;

    fn measured() -> Measured {
        let mut histogram = Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds");
        for micros in 1..=1000 {
            histogram.record(micros).expect("in range");
        }
        Measured {
            tally: Tally {
                histogram,
                operations: 1000,
                by_kind: BTreeMap::from([("cas", 1000)]),
                errors: BTreeMap::from([("OutcomeUnknown".to_string(), 2)]),
                error_examples: BTreeMap::from([(
                    "OutcomeUnknown".to_string(),
                    "lost".to_string(),
                )]),
                cas_conflicts: 7,
                retries: 0,
                duplicates: 1,
            },
            elapsed: Duration::from_secs(2),
            cpu: cpu::Usage {
                client_pct: Some(50.0),
                machine_pct: None,
            },
        }
    }

    fn settings() -> Settings {
        Settings {
            workload: "cas",
            mode: "session",
            target: "oncekv",
            etcd_route: None,
            concurrency: 8,
            connections: 1,
            warmup_s: 0.0,
            ops_budget: Some(1002),
            keys: 1,
            key_bytes: 8,
            value_bytes: 64,
            read_ratio: None,
        }
    }

    #[test]
    fn json_keeps_the_keys_scripts_read() {
        let report = Report::new(settings(), measured());
        let value: serde_json::Value = serde_json::from_str(&report.json()).expect("json");
        for key in [
            "workload",
            "mode",
            "concurrency",
            "duration_s",
            "operations",
            "throughput_ops",
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "p999_ms",
            "max_ms",
            "errors",
            "target",
            "connections",
            "client_cpu_pct",
            "machine_cpu_pct",
            "cas_conflicts",
        ] {
            assert!(value.get(key).is_some(), "{key} missing from {value}");
        }
        assert_eq!(value["throughput_ops"], 500.0);
        assert_eq!(value["errors"]["OutcomeUnknown"], 2);
        assert_eq!(value["cas_conflicts"], 7);
        assert_eq!(value["machine_cpu_pct"], serde_json::Value::Null);
        let p50 = value["p50_ms"].as_f64().expect("number");
        assert!((0.49..=0.51).contains(&p50), "{p50}");
        assert_eq!(report.failed(), 2);
    }

    #[test]
    fn text_names_conflicts_errors_and_cpu() {
        let text = Report::new(settings(), measured()).text();
        assert!(text.contains("500 ops/s (1000 operations)"), "{text}");
        assert!(text.contains("7 conflicts"), "{text}");
        assert!(text.contains("OutcomeUnknown: 2 (first: lost)"), "{text}");
        assert!(
            text.contains("client 50% of one core, machine unknown"),
            "{text}"
        );
        assert!(text.contains("8 tasks over 1 connection,"), "{text}");
    }
}
