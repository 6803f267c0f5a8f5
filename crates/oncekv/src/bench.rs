//! `oncekv bench`: a closed-loop load generator. N tasks each send one
//! request at a time for a fixed duration after an unmeasured warm-up, and
//! the run reports throughput, latency percentiles (HDR histogram) and
//! errors by kind, in text or JSON.

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use oncekv_client::{Client, ClientError, ClientOptions, Command, Query, Session, SessionOptions};
use serde_json::json;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::commands::{Connection, Output};

/// What each request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// PUT of a value to a random key.
    Put,
    /// APPEND to a random key.
    Append,
    /// INCR of a random counter.
    Incr,
    /// Linearizable GET.
    Get,
    /// Serializable GET (local replica).
    GetSerializable,
}

/// How writes are made safe to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// No deduplication (at-least-once, as etcd).
    Plain,
    /// Exactly-once on one session per client, pipelined up to its window.
    Session,
    /// An idempotency key per request.
    Key,
}

/// Flags of `oncekv bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The operation.
    #[arg(long, value_enum, default_value_t = Workload::Put)]
    workload: Workload,
    /// Exactly-once mode of writes.
    #[arg(long, value_enum, default_value_t = Mode::Session)]
    mode: Mode,
    /// Concurrent requests (closed loop).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Measured duration.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured warm-up before it.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Distinct keys.
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    /// Value size in bytes (PUT, APPEND).
    #[arg(long, default_value_t = 64)]
    value_bytes: usize,
}

struct Worker {
    histogram: Histogram<u64>,
    errors: BTreeMap<String, u64>,
    done: u64,
}

fn error_kind(error: &ClientError) -> String {
    format!("{error:?}")
        .split(['(', ' ', '{'])
        .next()
        .unwrap_or("error")
        .to_string()
}

async fn one(
    args: &BenchArgs,
    client: &Client,
    session: Option<&Session>,
    key: Vec<u8>,
    value: &[u8],
) -> Result<(), ClientError> {
    let command = match args.workload {
        Workload::Put => Command::Put {
            key,
            value: value.to_vec(),
            lease: None,
        },
        Workload::Append => Command::Append {
            key,
            value: value.to_vec(),
        },
        Workload::Incr => Command::Incr { key, by: 1 },
        Workload::Get | Workload::GetSerializable => {
            let serializable = args.workload == Workload::GetSerializable;
            return client
                .read(Query::Get { key }, serializable)
                .await
                .map(|_| ());
        }
    };
    match (args.mode, session) {
        (Mode::Session, Some(session)) => session.execute(command).await.map(|_| ()),
        (Mode::Key, _) => client.execute_once(command, None).await.map(|_| ()),
        _ => client.execute_plain(command).await.map(|_| ()),
    }
}

/// Runs the benchmark; prints the report.
pub async fn run(connection: &Connection, args: BenchArgs) -> anyhow::Result<ExitCode> {
    let options = ClientOptions {
        deadline: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    let client = Client::connect(connection.endpoints.clone(), options)?;
    let window = u32::try_from(args.concurrency.clamp(1, 1024))
        .unwrap_or(1024)
        .max(128);
    let session = match args.mode {
        Mode::Session => Some(
            client
                .open_session(SessionOptions {
                    window,
                    ..SessionOptions::default()
                })
                .await?,
        ),
        _ => None,
    };
    let args = Arc::new(args);
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let mut tasks = Vec::new();
    for task in 0..args.concurrency.max(1) {
        let (client, session, args) = (client.clone(), session.clone(), args.clone());
        tasks.push(tokio::spawn(async move {
            let mut worker = Worker {
                histogram: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
                errors: BTreeMap::new(),
                done: 0,
            };
            let value = vec![b'v'; args.value_bytes];
            let mut n = task as u64;
            while Instant::now() < end {
                n = n
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let key =
                    format!("bench/{:08}", (n >> 33) as usize % args.keys.max(1)).into_bytes();
                let began = Instant::now();
                let result = one(&args, &client, session.as_ref(), key, &value).await;
                if began < measure_from {
                    continue;
                }
                match result {
                    Ok(()) => {
                        let micros = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
                        let _ = worker.histogram.record(micros.max(1));
                        worker.done += 1;
                    }
                    Err(error) => *worker.errors.entry(error_kind(&error)).or_default() += 1,
                }
            }
            worker
        }));
    }
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut done = 0;
    for task in tasks {
        let worker = task.await?;
        histogram.add(&worker.histogram)?;
        for (kind, count) in worker.errors {
            *errors.entry(kind).or_default() += count;
        }
        done += worker.done;
    }
    if let Some(session) = &session {
        let _ = session.close().await;
    }
    let seconds = args.duration.as_secs_f64();
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    let report = json!({
        "workload": format!("{:?}", args.workload).to_lowercase(),
        "mode": format!("{:?}", args.mode).to_lowercase(),
        "concurrency": args.concurrency,
        "duration_s": seconds,
        "operations": done,
        "throughput_ops": done as f64 / seconds,
        "p50_ms": ms(0.50), "p90_ms": ms(0.90), "p99_ms": ms(0.99), "p999_ms": ms(0.999),
        "max_ms": histogram.max() as f64 / 1000.0,
        "errors": errors,
    });
    match connection.output {
        Output::Json => println!("{report}"),
        Output::Text => println!(
            "{:?} {:?} x{}: {:.0} ops/s, p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms, errors {:?}",
            args.workload,
            args.mode,
            args.concurrency,
            done as f64 / seconds,
            ms(0.5),
            ms(0.9),
            ms(0.99),
            ms(0.999),
            histogram.max() as f64 / 1000.0,
            errors
        ),
    }
    Ok(ExitCode::SUCCESS)
}
