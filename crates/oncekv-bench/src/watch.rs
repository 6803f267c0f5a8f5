//! The watch workload: not a closed loop. `--watchers` watchers of one
//! prefix (dealt over `--connections` client connections) and
//! `--concurrency` writers that put keys under it at `--rate` writes per
//! second in all (each writer at its share, on its own schedule: a writer
//! whose put takes longer than its period skips ticks, so the rate reached
//! is reported). Every value carries the time its write was sent, in
//! microseconds since the run began; a watcher that sees the event records
//! now minus that time. So the latency is write sent → event seen, per
//! event and watcher, the write's commit included.
//!
//! The run: start every watcher and wait until each has heard from its
//! node (the watch is in place), write through the warm-up and the measured
//! part, then give the watchers up to `DRAIN` to see the events of the
//! writes sent in the measured part. Events of writes sent in the measured
//! part go into the latency histogram; events received (of any write)
//! during the measured part, divided by its length, are the events
//! delivered per second. Events never seen are reported as missing.

use super::closed_loop::{OpError, TaskClient};
use super::cpu;
use super::workload::{Generator, Op, Shape};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

/// Highest latency recorded, in microseconds.
const LATENCY_MAX_US: u64 = 600_000_000;

/// How long the watchers get, after the last write, to see the events of
/// the measured writes.
const DRAIN: Duration = Duration::from_secs(10);

/// How long every watcher gets to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Digits of the time stamp at the start of each value.
pub const STAMP_BYTES: usize = 16;

/// A watcher: yields the values of the puts it sees, in order (an empty
/// batch: the node said something else, such as "watch started" or
/// progress).
pub trait WatchClient: Send + 'static {
    /// The next batch of values.
    fn next_values(&mut self) -> impl Future<Output = Result<Vec<Vec<u8>>, OpError>> + Send;
}

/// How to run.
#[derive(Clone, Copy, Debug)]
pub struct WatchPlan {
    /// Keys written (the workload's prefix, then the key's number).
    pub shape: Shape,
    /// Writes per second, all writers together.
    pub rate: f64,
    /// The unmeasured part before.
    pub warmup: Duration,
    /// The measured part.
    pub duration: Duration,
}

/// The prefix watched: the workload's key prefix.
pub fn prefix(shape: &Shape) -> Vec<u8> {
    shape.key(0)[..1].to_vec()
}

/// A value of `bytes` bytes (at least the stamp) that starts with `micros`.
fn stamped(micros: u64, bytes: usize) -> Vec<u8> {
    let mut value = format!("{micros:0width$}", width = STAMP_BYTES).into_bytes();
    value.resize(bytes.max(STAMP_BYTES), b'v');
    value
}

/// The stamp at the start of `value`, if it has one.
fn stamp(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value.get(..STAMP_BYTES)?)
        .ok()?
        .parse()
        .ok()
}

/// Shared by the watchers, the writers and the run.
#[derive(Debug)]
struct Shared {
    epoch: Instant,
    /// The measured part, in microseconds since `epoch` (`u64::MAX` until
    /// known).
    from_us: AtomicU64,
    end_us: AtomicU64,
    /// Watchers that heard from their node.
    started: AtomicU64,
    /// Events of measured writes seen, all watchers.
    seen: AtomicU64,
    /// Events received during the measured part, all watchers.
    received_in_window: AtomicU64,
}

impl Shared {
    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn window(&self) -> (u64, u64) {
        (
            self.from_us.load(Ordering::Acquire),
            self.end_us.load(Ordering::Acquire),
        )
    }
}

/// One watcher's findings.
#[derive(Debug)]
struct WatcherTally {
    histogram: Histogram<u64>,
    error: Option<OpError>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("constant bounds are valid")
}

async fn watcher_task<W: WatchClient>(
    mut watcher: W,
    shared: Arc<Shared>,
    tally: Arc<Mutex<WatcherTally>>,
) {
    let mut started = false;
    loop {
        let values = match watcher.next_values().await {
            Ok(values) => values,
            Err(error) => {
                lock(&tally).error = Some(error);
                return;
            }
        };
        if !started {
            started = true;
            shared.started.fetch_add(1, Ordering::AcqRel);
        }
        if values.is_empty() {
            continue;
        }
        let now = shared.now_us();
        let (from, end) = shared.window();
        if (from..end).contains(&now) {
            shared
                .received_in_window
                .fetch_add(values.len() as u64, Ordering::Relaxed);
        }
        let mut measured = 0;
        let mut tally = lock(&tally);
        for sent in values.iter().filter_map(|value| stamp(value)) {
            if (from..end).contains(&sent) {
                tally
                    .histogram
                    .saturating_record(now.saturating_sub(sent).max(1));
                measured += 1;
            }
        }
        drop(tally);
        shared.seen.fetch_add(measured, Ordering::Relaxed);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One writer's findings.
#[derive(Debug)]
struct WriterTally {
    /// Put latencies of measured writes, in microseconds.
    histogram: Histogram<u64>,
    /// Measured writes that completed.
    writes: u64,
    errors: BTreeMap<String, u64>,
    error_examples: BTreeMap<String, String>,
}

async fn writer_task<T: TaskClient>(
    mut client: T,
    mut generator: Generator,
    period: Duration,
    first: Instant,
    value_bytes: usize,
    shared: Arc<Shared>,
) -> WriterTally {
    let mut tally = WriterTally {
        histogram: histogram(),
        writes: 0,
        errors: BTreeMap::new(),
        error_examples: BTreeMap::new(),
    };
    let (from, end) = shared.window();
    let mut ticks = tokio::time::interval_at(first, period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        let sent = shared.now_us();
        if sent >= end {
            break;
        }
        let Op::Put { key, .. } = generator.next_op() else {
            unreachable!("the watch workload draws puts");
        };
        let op = Op::Put {
            key,
            value: stamped(sent, value_bytes),
        };
        let outcome = client.execute(op).await;
        if sent < from {
            continue;
        }
        match outcome {
            Ok(_) => {
                tally
                    .histogram
                    .saturating_record(shared.now_us().saturating_sub(sent).max(1));
                tally.writes += 1;
            }
            Err(error) => {
                *tally.errors.entry(error.kind.clone()).or_default() += 1;
                tally
                    .error_examples
                    .entry(error.kind)
                    .or_insert(error.message);
            }
        }
    }
    tally
}

/// What the watch run gave.
#[derive(Debug)]
pub struct WatchMeasured {
    /// Delivery latencies (write sent → event seen), microseconds.
    pub delivery: Histogram<u64>,
    /// Put latencies of the measured writes, microseconds.
    pub puts: Histogram<u64>,
    /// Measured writes that completed.
    pub writes: u64,
    /// Events of measured writes seen (all watchers).
    pub seen: u64,
    /// Events received during the measured part (all watchers).
    pub received_in_window: u64,
    /// Failed writes by kind, and watchers that failed by kind.
    pub errors: BTreeMap<String, u64>,
    /// The first message of each error kind.
    pub error_examples: BTreeMap<String, String>,
    /// CPU over the measured part.
    pub cpu: cpu::Usage,
    /// Length of the measured part.
    pub elapsed: Duration,
}

/// Starts the watchers, runs the writers, and drains.
pub async fn run<W: WatchClient, T: TaskClient>(
    watchers: Vec<W>,
    writers: Vec<T>,
    plan: WatchPlan,
) -> anyhow::Result<WatchMeasured> {
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        from_us: AtomicU64::new(u64::MAX),
        end_us: AtomicU64::new(u64::MAX),
        started: AtomicU64::new(0),
        seen: AtomicU64::new(0),
        received_in_window: AtomicU64::new(0),
    });
    let watcher_count = watchers.len() as u64;
    let mut watching = Vec::with_capacity(watchers.len());
    for watcher in watchers {
        let tally = Arc::new(Mutex::new(WatcherTally {
            histogram: histogram(),
            error: None,
        }));
        let task = tokio::spawn(watcher_task(watcher, shared.clone(), tally.clone()));
        watching.push((task, tally));
    }
    let start_deadline = Instant::now() + START_TIMEOUT;
    while shared.started.load(Ordering::Acquire) < watcher_count {
        let failed = watching
            .iter()
            .find_map(|(_, tally)| lock(tally).error.clone());
        if let Some(error) = failed {
            anyhow::bail!("a watcher could not start: {}", error.message);
        }
        if Instant::now() >= start_deadline {
            anyhow::bail!(
                "only {} of {watcher_count} watchers started within {START_TIMEOUT:?}",
                shared.started.load(Ordering::Acquire)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let begin = Instant::now();
    let measure_from = begin + plan.warmup;
    let end = measure_from + plan.duration;
    let since_epoch =
        |at: Instant| u64::try_from((at - shared.epoch).as_micros()).unwrap_or(u64::MAX);
    shared
        .from_us
        .store(since_epoch(measure_from), Ordering::Release);
    shared.end_us.store(since_epoch(end), Ordering::Release);
    let first_sample = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from).await;
        cpu::sample()
    });
    let last_sample = tokio::spawn(async move {
        tokio::time::sleep_until(end).await;
        cpu::sample()
    });

    let count = writers.len().max(1);
    let period = Duration::from_secs_f64(count as f64 / plan.rate);
    let mut writing = Vec::with_capacity(count);
    for (index, client) in writers.into_iter().enumerate() {
        // Staggered, so that the writes are spread over each period.
        let first = begin + period.mul_f64(index as f64 / count as f64);
        writing.push(tokio::spawn(writer_task(
            client,
            Generator::new(plan.shape, index),
            period,
            first,
            plan.shape.value_bytes,
            shared.clone(),
        )));
    }
    let mut puts = histogram();
    let mut writes = 0;
    let mut errors = BTreeMap::new();
    let mut error_examples = BTreeMap::new();
    for task in writing {
        let tally = task.await?;
        puts.add(&tally.histogram)?;
        writes += tally.writes;
        for (kind, n) in tally.errors {
            *errors.entry(kind).or_default() += n;
        }
        for (kind, message) in tally.error_examples {
            error_examples.entry(kind).or_insert(message);
        }
    }
    let cpu = cpu::usage(&first_sample.await?, &last_sample.await?);

    let expected = writes.saturating_mul(watcher_count);
    let drain_deadline = Instant::now() + DRAIN;
    while shared.seen.load(Ordering::Relaxed) < expected && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut delivery = histogram();
    for (task, tally) in watching {
        task.abort();
        let tally = lock(&tally);
        delivery.add(&tally.histogram)?;
        if let Some(error) = &tally.error {
            let kind = format!("watch:{}", error.kind);
            *errors.entry(kind.clone()).or_default() += 1;
            error_examples
                .entry(kind)
                .or_insert_with(|| error.message.clone());
        }
    }
    Ok(WatchMeasured {
        delivery,
        puts,
        writes,
        seen: shared.seen.load(Ordering::Relaxed),
        received_in_window: shared.received_in_window.load(Ordering::Relaxed),
        errors,
        error_examples,
        cpu,
        elapsed: plan.duration,
    })
}

/// What was run, as the report names it.
#[derive(Clone, Debug)]
pub struct WatchSettings {
    /// The mode's name (of the writes).
    pub mode: &'static str,
    /// The target's name.
    pub target: &'static str,
    /// With etcd: which members the clients talk to.
    pub etcd_route: Option<&'static str>,
    /// Watchers.
    pub watchers: usize,
    /// Connections the watchers are dealt over.
    pub connections: usize,
    /// Writer tasks.
    pub writers: usize,
    /// Writes per second asked for.
    pub rate: f64,
    /// Unmeasured warm-up, in seconds.
    pub warmup_s: f64,
    /// Distinct keys written.
    pub keys: u64,
    /// Bytes per value.
    pub value_bytes: usize,
}

/// The watch run's report. The JSON keys are read by
/// `scripts/bench-txn-watch.sh`: keys may be added, never renamed.
#[derive(Clone, Debug, Serialize)]
pub struct WatchReport {
    /// Always `watch`.
    pub workload: &'static str,
    /// Mode of the writes.
    pub mode: &'static str,
    /// `oncekv` or `etcd`.
    pub target: &'static str,
    /// With etcd: `leader` or `balanced`.
    pub etcd_route: Option<&'static str>,
    /// Watchers.
    pub watchers: usize,
    /// Connections the watchers were dealt over.
    pub connections: usize,
    /// Writer tasks.
    pub writers: usize,
    /// Writes per second asked for.
    pub rate: f64,
    /// Length of the measured part.
    pub duration_s: f64,
    /// The unmeasured warm-up before it.
    pub warmup_s: f64,
    /// Writes sent in the measured part that completed.
    pub writes: u64,
    /// Those per second.
    pub writes_per_s: f64,
    /// Events of those writes the watchers should see: writes × watchers.
    pub events_expected: u64,
    /// Events of those writes seen.
    pub events_seen: u64,
    /// Expected but not seen within the drain time.
    pub events_missing: u64,
    /// Events received per second during the measured part, all watchers.
    pub events_per_s: f64,
    /// Delivery latency (write sent → event seen): median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Highest.
    pub max_ms: f64,
    /// Put latency of the measured writes: median.
    pub put_p50_ms: f64,
    /// Put latency: 99th percentile.
    pub put_p99_ms: f64,
    /// Failed writes by kind; failed watchers as `watch:<kind>`.
    pub errors: BTreeMap<String, u64>,
    /// The first message of each error kind.
    pub error_examples: BTreeMap<String, String>,
    /// This client process's CPU, in percent of one core.
    pub client_cpu_pct: Option<f64>,
    /// The machine's CPU, in percent of all cores.
    pub machine_cpu_pct: Option<f64>,
    /// Cores of the machine.
    pub cores: usize,
    /// Distinct keys written.
    pub keys: u64,
    /// Bytes per value.
    pub value_bytes: usize,
}

impl WatchReport {
    /// The report of `measured`.
    pub fn new(settings: WatchSettings, measured: WatchMeasured) -> WatchReport {
        let seconds = measured.elapsed.as_secs_f64();
        let per_s = |n: u64| {
            if seconds > 0.0 {
                n as f64 / seconds
            } else {
                0.0
            }
        };
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let expected = measured.writes.saturating_mul(settings.watchers as u64);
        let delivery = &measured.delivery;
        WatchReport {
            workload: "watch",
            mode: settings.mode,
            target: settings.target,
            etcd_route: settings.etcd_route,
            watchers: settings.watchers,
            connections: settings.connections,
            writers: settings.writers,
            rate: settings.rate,
            duration_s: seconds,
            warmup_s: settings.warmup_s,
            writes: measured.writes,
            writes_per_s: per_s(measured.writes),
            events_expected: expected,
            events_seen: measured.seen,
            events_missing: expected.saturating_sub(measured.seen),
            events_per_s: per_s(measured.received_in_window),
            p50_ms: ms(delivery, 0.5),
            p90_ms: ms(delivery, 0.9),
            p99_ms: ms(delivery, 0.99),
            p999_ms: ms(delivery, 0.999),
            max_ms: delivery.max() as f64 / 1000.0,
            put_p50_ms: ms(&measured.puts, 0.5),
            put_p99_ms: ms(&measured.puts, 0.99),
            errors: measured.errors,
            error_examples: measured.error_examples,
            client_cpu_pct: measured.cpu.client_pct,
            machine_cpu_pct: measured.cpu.machine_pct,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            keys: settings.keys,
            value_bytes: settings.value_bytes,
        }
    }

    /// The report as one JSON object.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as a few lines for a person.
    pub fn text(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "watch on {}: {} watchers over {} connections, {} writers ({} mode) at {} writes/s asked, \
             {:.2} s measured after {:.1} s warm-up",
            self.target,
            self.watchers,
            self.connections,
            self.writers,
            self.mode,
            self.rate,
            self.duration_s,
            self.warmup_s
        );
        let _ = writeln!(
            text,
            "  writes      {} ({:.0}/s), put p50 {:.3} ms, p99 {:.3} ms",
            self.writes, self.writes_per_s, self.put_p50_ms, self.put_p99_ms
        );
        let _ = writeln!(
            text,
            "  events      {:.0} delivered/s; {} of {} expected seen, {} missing",
            self.events_per_s, self.events_seen, self.events_expected, self.events_missing
        );
        let _ = writeln!(
            text,
            "  delivery    p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms \
             (write sent to event seen)",
            self.p50_ms, self.p90_ms, self.p99_ms, self.p999_ms, self.max_ms
        );
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
            "  cpu         client {} of one core, machine {} of {} cores",
            pct(self.client_cpu_pct),
            pct(self.machine_cpu_pct),
            self.cores
        );
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::closed_loop::Completion;
    use crate::workload::Workload;
    use tokio::sync::broadcast;

    #[test]
    fn values_carry_their_stamp() {
        let value = stamped(1234, 64);
        assert_eq!(value.len(), 64);
        assert_eq!(stamp(&value), Some(1234));
        assert_eq!(stamped(7, 4).len(), STAMP_BYTES);
        assert_eq!(stamp(b"short"), None);
    }

    /// Writers that publish each value to every fake watcher.
    struct FakeWriter(broadcast::Sender<Vec<u8>>);

    impl TaskClient for FakeWriter {
        async fn execute(&mut self, op: Op) -> Result<Completion, OpError> {
            let Op::Put { value, .. } = op else {
                return Err(OpError::new("Fake", "puts only"));
            };
            let _ = self.0.send(value);
            Ok(Completion::default())
        }
    }

    struct FakeWatcher {
        receiver: broadcast::Receiver<Vec<u8>>,
        started: bool,
    }

    impl WatchClient for FakeWatcher {
        async fn next_values(&mut self) -> Result<Vec<Vec<u8>>, OpError> {
            if !self.started {
                self.started = true;
                return Ok(Vec::new());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            match self.receiver.recv().await {
                Ok(value) => Ok(vec![value]),
                // The writers are gone: nothing more comes, as on a quiet
                // watch.
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                Err(error) => Err(OpError::new("Lagged", error.to_string())),
            }
        }
    }

    #[tokio::test]
    async fn every_watcher_sees_every_measured_write() {
        let (sender, _) = broadcast::channel(10_000);
        let watchers: Vec<_> = (0..5)
            .map(|_| FakeWatcher {
                receiver: sender.subscribe(),
                started: false,
            })
            .collect();
        let writers = vec![FakeWriter(sender.clone()), FakeWriter(sender)];
        let plan = WatchPlan {
            shape: Shape {
                workload: Workload::Watch,
                keys: 10,
                key_bytes: 4,
                value_bytes: 32,
                read_ratio: 0.0,
            },
            rate: 200.0,
            warmup: Duration::from_millis(100),
            duration: Duration::from_millis(500),
        };
        let measured = run(watchers, writers, plan).await.expect("run");
        assert!(
            (50..=110).contains(&measured.writes),
            "{} writes",
            measured.writes
        );
        assert_eq!(measured.seen, measured.writes * 5);
        assert_eq!(measured.delivery.len(), measured.seen);
        assert!(measured.errors.is_empty(), "{:?}", measured.errors);
        let report = WatchReport::new(
            WatchSettings {
                mode: "plain",
                target: "fake",
                etcd_route: None,
                watchers: 5,
                connections: 1,
                writers: 2,
                rate: 200.0,
                warmup_s: 0.1,
                keys: 10,
                value_bytes: 32,
            },
            measured,
        );
        assert_eq!(report.events_missing, 0);
        assert!(report.text().contains("0 missing"), "{}", report.text());
    }
}
