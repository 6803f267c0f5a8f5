//! The closed loop every target runs under: one task per unit of
//! concurrency sends one operation at a time; operations that begin during
//! the warm-up are not measured; the measured part ends after a fixed
//! duration or a fixed number of operations. Latencies go into an HDR
//! histogram per task, merged at the end; CPU use is sampled at the start
//! and the end of the measured part; a progress bar shows the run.

use super::cpu;
use super::workload::{Generator, Op, Shape};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Attempts at each seeding PUT before the run gives up.
const SEED_ATTEMPTS: u32 = 5;

/// Writes every key a read workload reads, once, through the tasks'
/// own clients, before anything is measured ([`Shape::seed_ops`]).
async fn seed<T: TaskClient>(clients: Vec<T>, shape: Shape) -> anyhow::Result<Vec<T>> {
    if !shape.reads_seeded_keys() {
        return Ok(clients);
    }
    let tasks = clients.len();
    let mut seeding = Vec::with_capacity(tasks);
    for (index, mut client) in clients.into_iter().enumerate() {
        let ops = shape.seed_ops(index, tasks);
        seeding.push(tokio::spawn(async move {
            for op in ops {
                let mut attempt = 1;
                while let Err(error) = client.execute(op.clone()).await {
                    if attempt >= SEED_ATTEMPTS {
                        anyhow::bail!("seeding the keys: {}", error.message);
                    }
                    attempt += 1;
                }
            }
            Ok::<T, anyhow::Error>(client)
        }));
    }
    let mut clients = Vec::with_capacity(tasks);
    for task in seeding {
        clients.push(task.await??);
    }
    Ok(clients)
}

/// Highest latency the histograms hold, in microseconds (longer ones are
/// recorded as this).
const LATENCY_MAX_US: u64 = 600_000_000;

/// How an operation that completed ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// A compare-and-swap that found another value than the one read: the
    /// race was lost, nothing was written.
    pub cas_conflict: bool,
    /// Read-modify-write rounds that were retried after a conflict.
    pub retries: u32,
    /// The write had been applied by an earlier attempt, and the retry was
    /// recognised as a duplicate.
    pub duplicate: bool,
}

/// Why an operation did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    /// A short, stable name to count errors by.
    pub kind: String,
    /// The whole message.
    pub message: String,
}

impl OpError {
    /// An error of `kind`.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> OpError {
        OpError {
            kind: kind.into(),
            message: message.into(),
        }
    }
}

/// The client of one task: runs one operation at a time.
pub trait TaskClient: Send + 'static {
    /// Runs `op` to completion (retries included).
    fn execute(&mut self, op: Op) -> impl Future<Output = Result<Completion, OpError>> + Send;
}

/// When the measured part ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// After this long.
    After(Duration),
    /// After this many operations (completed or failed).
    Operations(u64),
}

/// How to run.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Keys, values and operations.
    pub shape: Shape,
    /// The unmeasured part before.
    pub warmup: Duration,
    /// The end of the measured part.
    pub stop: Stop,
    /// Draw a progress bar on the terminal.
    pub progress: bool,
}

/// What the measured part gave.
#[derive(Debug)]
pub struct Measured {
    /// What the operations did.
    pub tally: Tally,
    /// Length of the measured part.
    pub elapsed: Duration,
    /// CPU use over it.
    pub cpu: cpu::Usage,
}

/// Counts of measured operations: one task's, or the run's.
#[derive(Debug)]
pub struct Tally {
    /// Latencies of completed operations, in microseconds.
    pub histogram: Histogram<u64>,
    /// Completed operations.
    pub operations: u64,
    /// Completed operations by kind (`get`, `put`, ...).
    pub by_kind: BTreeMap<&'static str, u64>,
    /// Failed operations by error kind.
    pub errors: BTreeMap<String, u64>,
    /// The first message of each error kind.
    pub error_examples: BTreeMap<String, String>,
    /// CAS operations that lost the race (included in `operations`).
    pub cas_conflicts: u64,
    /// Read-modify-write rounds retried after a conflict.
    pub retries: u64,
    /// Writes recognised as duplicates of an earlier attempt.
    pub duplicates: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            histogram: Histogram::new_with_bounds(1, LATENCY_MAX_US, 3)
                .expect("constant bounds are valid"),
            operations: 0,
            by_kind: BTreeMap::new(),
            errors: BTreeMap::new(),
            error_examples: BTreeMap::new(),
            cas_conflicts: 0,
            retries: 0,
            duplicates: 0,
        }
    }

    /// Adds `other`'s counts to these.
    fn add(&mut self, other: Tally) -> Result<(), hdrhistogram::AdditionError> {
        self.histogram.add(&other.histogram)?;
        self.operations += other.operations;
        for (kind, count) in other.by_kind {
            *self.by_kind.entry(kind).or_default() += count;
        }
        for (kind, count) in other.errors {
            *self.errors.entry(kind).or_default() += count;
        }
        for (kind, message) in other.error_examples {
            self.error_examples.entry(kind).or_insert(message);
        }
        self.cas_conflicts += other.cas_conflicts;
        self.retries += other.retries;
        self.duplicates += other.duplicates;
        Ok(())
    }
}

struct TaskResult {
    tally: Tally,
    /// When its last measured operation ended.
    last_end: Option<Instant>,
}

/// Shared between the tasks and the progress bar.
#[derive(Debug, Default)]
struct Counters {
    /// Measured operations claimed (the `--ops` budget).
    claimed: AtomicU64,
    /// Measured operations ended, completed or failed.
    ended: AtomicU64,
    /// Measured operations failed.
    failed: AtomicU64,
}

/// Runs one task per client until the plan's end.
pub async fn run<T: TaskClient>(clients: Vec<T>, plan: Plan) -> anyhow::Result<Measured> {
    let clients = seed(clients, plan.shape).await?;
    let counters = Arc::new(Counters::default());
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let end = match plan.stop {
        Stop::After(duration) => Some(measure_from + duration),
        Stop::Operations(_) => None,
    };
    let first_sample = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from).await;
        cpu::sample()
    });
    let bar = progress_bar(&plan, measure_from, counters.clone());
    let mut tasks = Vec::with_capacity(clients.len());
    for (index, client) in clients.into_iter().enumerate() {
        let counters = counters.clone();
        let generator = Generator::new(plan.shape, index);
        tasks.push(tokio::spawn(task(
            client,
            generator,
            plan.stop,
            measure_from,
            end,
            counters,
        )));
    }
    let mut tally = Tally::new();
    let mut last_end = measure_from;
    for task in tasks {
        let result = task.await?;
        tally.add(result.tally)?;
        last_end = last_end.max(result.last_end.unwrap_or(measure_from));
    }
    let last_sample = cpu::sample();
    let cpu = cpu::usage(&first_sample.await?, &last_sample);
    let elapsed = match plan.stop {
        // Operations that began before the end count: the measured part
        // is the nominal duration.
        Stop::After(duration) => duration,
        Stop::Operations(_) => last_end.saturating_duration_since(measure_from),
    };
    if let Some((bar, ticker)) = bar {
        ticker.abort();
        bar.finish_and_clear();
    }
    Ok(Measured {
        tally,
        elapsed,
        cpu,
    })
}

async fn task<T: TaskClient>(
    mut client: T,
    mut generator: Generator,
    stop: Stop,
    measure_from: Instant,
    end: Option<Instant>,
    counters: Arc<Counters>,
) -> TaskResult {
    let mut result = TaskResult {
        tally: Tally::new(),
        last_end: None,
    };
    let tally = &mut result.tally;
    loop {
        let began = Instant::now();
        if end.is_some_and(|end| began >= end) {
            break;
        }
        let measured = began >= measure_from;
        if measured
            && let Stop::Operations(budget) = stop
            && counters.claimed.fetch_add(1, Ordering::Relaxed) >= budget
        {
            break;
        }
        let op = generator.next_op();
        let kind = op.kind();
        let outcome = client.execute(op).await;
        if !measured {
            continue;
        }
        let ended = Instant::now();
        result.last_end = Some(ended);
        counters.ended.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(completion) => {
                let micros = u64::try_from((ended - began).as_micros()).unwrap_or(u64::MAX);
                tally.histogram.saturating_record(micros.max(1));
                tally.operations += 1;
                *tally.by_kind.entry(kind).or_default() += 1;
                tally.cas_conflicts += u64::from(completion.cas_conflict);
                tally.retries += u64::from(completion.retries);
                tally.duplicates += u64::from(completion.duplicate);
            }
            Err(error) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                *tally.errors.entry(error.kind.clone()).or_default() += 1;
                tally
                    .error_examples
                    .entry(error.kind)
                    .or_insert(error.message);
            }
        }
    }
    result
}

/// A bar on stderr, redrawn by a ticker task; `None` when not wanted.
fn progress_bar(
    plan: &Plan,
    measure_from: Instant,
    counters: Arc<Counters>,
) -> Option<(ProgressBar, tokio::task::JoinHandle<()>)> {
    if !plan.progress {
        return None;
    }
    let length = match plan.stop {
        Stop::After(duration) => u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
        Stop::Operations(budget) => budget,
    };
    let bar = ProgressBar::new(length);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {elapsed_precise} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let stop = plan.stop;
    let ticking = bar.clone();
    let ticker = tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(200));
        loop {
            interval.tick().await;
            let now = Instant::now();
            if now < measure_from {
                ticking.set_message(format!(
                    "warm-up, {:.1} s left",
                    (measure_from - now).as_secs_f64()
                ));
                ticking.tick();
                continue;
            }
            let ended = counters.ended.load(Ordering::Relaxed);
            let failed = counters.failed.load(Ordering::Relaxed);
            let seconds = (now - measure_from).as_secs_f64().max(1e-3);
            ticking.set_position(match stop {
                Stop::After(_) => u64::try_from((now - measure_from).as_millis()).unwrap_or(0),
                Stop::Operations(_) => ended,
            });
            ticking.set_message(format!(
                "{ended} ops, {:.0} ops/s, {failed} errors",
                ended as f64 / seconds
            ));
        }
    });
    Some((bar, ticker))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    /// A client that completes every operation after `delay`, reports every
    /// third CAS as a conflict and fails every fifth operation.
    struct Fake {
        delay: Duration,
        calls: u64,
    }

    impl TaskClient for Fake {
        async fn execute(&mut self, op: Op) -> Result<Completion, OpError> {
            tokio::time::sleep(self.delay).await;
            self.calls += 1;
            if self.calls.is_multiple_of(5) {
                return Err(OpError::new("Fake", "every fifth fails"));
            }
            Ok(Completion {
                cas_conflict: matches!(op, Op::Cas { .. }) && self.calls.is_multiple_of(3),
                ..Completion::default()
            })
        }
    }

    fn plan(workload: Workload, stop: Stop) -> Plan {
        Plan {
            shape: Shape {
                workload,
                keys: 10,
                key_bytes: 8,
                value_bytes: 8,
                read_ratio: 0.5,
            },
            warmup: Duration::ZERO,
            stop,
            progress: false,
        }
    }

    fn fakes(n: usize, delay: Duration) -> Vec<Fake> {
        (0..n).map(|_| Fake { delay, calls: 0 }).collect()
    }

    #[tokio::test]
    async fn an_operation_budget_is_spent_exactly() {
        let measured = run(
            fakes(4, Duration::from_millis(1)),
            plan(Workload::Cas, Stop::Operations(101)),
        )
        .await
        .expect("run");
        let failed: u64 = measured.tally.errors.values().sum();
        assert_eq!(measured.tally.operations + failed, 101);
        assert!(failed > 0 && measured.tally.operations > 0);
        assert_eq!(
            measured.tally.by_kind.get("cas"),
            Some(&measured.tally.operations)
        );
        assert!(
            measured.tally.cas_conflicts > 0
                && measured.tally.cas_conflicts < measured.tally.operations
        );
        assert_eq!(measured.tally.histogram.len(), measured.tally.operations);
        assert!(measured.elapsed > Duration::ZERO);
        assert_eq!(
            measured
                .tally
                .error_examples
                .get("Fake")
                .map(String::as_str),
            Some("every fifth fails")
        );
    }

    #[tokio::test]
    async fn the_warm_up_is_not_measured() {
        let mut with_warmup = plan(Workload::Mixed, Stop::After(Duration::from_millis(300)));
        with_warmup.warmup = Duration::from_millis(300);
        let clients = fakes(2, Duration::from_millis(10));
        let measured = run(clients, with_warmup).await.expect("run");
        // Each operation takes at least 10 ms: at most 2 tasks x 30 begin in
        // the measured 300 ms; had the warm-up been measured, about twice.
        let failed: u64 = measured.tally.errors.values().sum();
        let ended = measured.tally.operations + failed;
        assert!(ended >= 10, "{ended} operations measured in 300 ms");
        assert!(ended <= 2 * 30, "{ended} operations measured in 300 ms");
        assert_eq!(measured.elapsed, Duration::from_millis(300));
        let reads = measured.tally.by_kind.get("get").copied().unwrap_or(0);
        let writes = measured.tally.by_kind.get("put").copied().unwrap_or(0);
        assert_eq!(reads + writes, measured.tally.operations);
    }
}
