//! `oncekv verify`: a fault run from this binary. It starts a local
//! cluster of `oncekv serve` processes, on loopback or each on a host of
//! its own (`--topology netns`: network namespaces, root only), its peer
//! links shaped if asked (`--link-delay`, `--link-jitter`, `--link-loss`),
//! or uses `--endpoints`, runs the
//! workload under the nemesis with a progress bar, heals, checks the
//! history, prints the summary table, the write stall of each fault window
//! and the seed, writes the history and an HTML timeline, and exits
//! non-zero on any violation.

use crate::commands::{Connection, Output};
use crate::links::LinkArgs;
use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use oncekv_check::coverage::RunVerdict;
use oncekv_harness::cluster::Topology;
use oncekv_harness::nemesis::Fault;
use oncekv_harness::run::{self, Api, Progress, RunConfig, Target};
use oncekv_harness::stalls::{self, WindowStall};
use oncekv_harness::workload::{ClientMode, WorkloadOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const AFTER_HELP: &str = "\
Examples:
  oncekv verify --duration 30s --seed 7              # 3 local nodes, every fault kind
  oncekv verify --faults kill,drop-reply --clients 4 # only some faults
  oncekv verify --endpoints 10.0.0.1:7379,10.0.0.2:7379 --faults drop-reply,delay
  oncekv verify --topology netns --nodes 5           # 5 hosts in network namespaces
                                                     # (root), network faults added
  oncekv verify --naive-client                       # negative control: must FAIL
  oncekv verify --api etcd                           # through etcd's v3 API, with the
                                                     # oncekv-idempotency-key metadata
  oncekv verify --api etcd --naive-client            # the same without it: must FAIL
  oncekv verify --api etcd --endpoints 127.0.0.1:2379 --faults drop-reply,reset
                                                     # against a real etcd: must FAIL

Fault kinds: kill (SIGKILL + restart), pause (SIGSTOP longer than the
election timeout), drop-reply (the proxy drops replies after commit),
delay, reset (client connections reset), partition (peer links cut),
fsync (disk syncs fail; needs fiu-run/fiu-ctrl from Debian's fiu-utils),
flood (unused sessions and one-shot keys sent outside the history; the
nodes run with a small session table, so it fills and must refuse without
evicting a live session). With --topology netns (each node a network
namespace on a private bridge; needs root and iproute2), also the network
between the hosts: link-down (a node's link down, then up), one-way (a
node's packets to its peers, or theirs to it, dropped), cut-leader (a
follower cut from the leader only), split (a minority and a majority, 2/3
of five), flap (a node's link down and up in quick turns); there partition
cuts the links themselves. A kind that cannot run here is skipped with a
message.

Membership changes, on loopback, only when named in --faults (each takes
seconds; the run lasts until each named kind has run once, at most twice
--duration): transfer (leadership handed to a follower), add-learner (a
new node added as a learner, caught up, promoted; then a follower
removed), remove-follower (cut off first the first time, so it misses its
removal; then a fresh member added), remove-leader (then a fresh member
added), replace (a member stopped, its data wiped, removed, a fresh one
added at its addresses), grow-shrink (3 -> 5 -> 3), rolling-restart
(every member restarted in turn, the leader last). A removed member that
still runs is watched before it is stopped: no member may follow it, it
may not lead. Example:
  oncekv verify --duration 60s --faults transfer,add-learner,replace,grow-shrink,rolling-restart

slow-link, on either topology, only when named in --faults: the peer link
between a node (the leader the first time) and another slows for a window,
both ways: 50 to 200 ms one way, as much jitter, 10% of its chunks lost.

Every peer link shaped for the whole run (--link-delay, --link-jitter,
--link-loss; either topology, a cluster the run starts): each node's Raft
traffic passes through a proxy in front of its peer port (no netem
needed), which holds each chunk of bytes for the delay of its link
(sender to receiver, each direction on its own), give or take the jitter
(uniform; --link-spread normal for a normal spread; never below zero, and
never overtaking the chunk before it on its connection). A lost chunk
(--link-loss percent of them) is what TCP makes of a lost segment: it
arrives a retransmission timeout (200 ms) late, the stream whole. Clients
reach the nodes unshaped, so a write takes at least one round trip
between nodes (twice the delay) besides the disk. Examples:
  oncekv verify --link-delay 5ms --link-jitter 1ms
  sudo oncekv verify --topology netns --link-delay 10ms --link-loss 1% --faults slow-link,split

full-disk, on either topology, only when named in --faults (root and
util-linux's unshare/nsenter; skipped with a message otherwise): each
node's data directory is a 512 MiB tmpfs of its own, in a mount namespace
of the run's (gone with it), the nodes started in it through nsenter. A
filler takes the free space of one node's disk (the leader the first
time); the node must stop on its next write (exit code 12, not a crash)
without losing an acknowledged write; then the filler is removed and the
node started again on its data, until it has caught up. Example:
  sudo oncekv verify --duration 30s --faults full-disk,kill,drop-reply

Exit codes (the table shared by every subcommand: oncekv --help):
  0  pass: every checker passed and the dangerous paths were exercised
  2  usage error
  7  violation: a checker failed (or a node crashed, or a removed member
     led or was followed)
  8  inconclusive: nothing failed, but something was undecided or not exercised
  9  the run could not be carried out (cluster did not start, ...)";

/// Flags of `oncekv verify`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct VerifyArgs {
    /// Nodes of the local cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
    nodes: u64,
    /// Where the local cluster's nodes run: all on loopback, or each in a
    /// network namespace of its own with its own address on a private
    /// bridge (needs root; adds the network faults to the default kinds).
    #[arg(long, value_enum, default_value_t = TopologyArg::Loopback)]
    topology: TopologyArg,
    /// Concurrent clients (an expiry probe runs besides them).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    clients: u64,
    /// How long the workload runs under faults.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Seed of the workload and the fault schedule [default: random, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Fault kinds, comma-separated [default: all but the membership
    /// changes and full-disk, which run only when named].
    #[arg(long, value_delimiter = ',', value_parser = Fault::parse)]
    faults: Option<Vec<Fault>>,
    /// Inject no faults at all.
    #[arg(long, conflicts_with = "faults")]
    no_faults: bool,
    /// Where the history (history.jsonl) and report (report.html) go
    /// [default: ./oncekv-verify/seed-N].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The API the workload speaks: oncekv's own (sessions, keys,
    /// transactions, leases, watches), or etcd's v3 API (read, then a Txn
    /// guarded by the key's mod revision, resent when its reply is lost,
    /// with the oncekv-idempotency-key metadata; also against a real
    /// etcd with --endpoints).
    #[arg(long, value_enum, default_value_t = ApiArg::Native)]
    api: ApiArg,
    /// Negative control: clients resend plain requests on an unknown
    /// outcome instead of using sessions (with --api etcd: without the
    /// idempotency metadata). The checkers must catch it.
    #[arg(long)]
    naive_client: bool,
    /// Negative control: start the nodes with deduplication off. The
    /// checkers must catch it.
    #[arg(long)]
    unsafe_no_dedup: bool,
    /// Every peer link's delay, jitter and loss, for the whole run.
    #[command(flatten)]
    links: LinkArgs,
}

/// `--topology`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TopologyArg {
    /// All nodes on this machine's loopback.
    Loopback,
    /// Each node in a network namespace of its own (root).
    Netns,
}

impl From<TopologyArg> for Topology {
    fn from(arg: TopologyArg) -> Topology {
        match arg {
            TopologyArg::Loopback => Topology::Loopback,
            TopologyArg::Netns => Topology::Netns,
        }
    }
}

/// `--api`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ApiArg {
    /// oncekv's own API.
    Native,
    /// etcd's v3 API.
    Etcd,
}

use crate::exit::{
    INCONCLUSIVE as EXIT_INCONCLUSIVE, NOT_RUN as EXIT_NOT_RUN, VIOLATION as EXIT_VIOLATION,
};

/// Runs `oncekv verify`. `endpoints_given`: whether `--endpoints` was set
/// (then the workload runs against that cluster).
pub async fn run(connection: &Connection, args: VerifyArgs, endpoints_given: bool) -> ExitCode {
    match run_inner(connection, args, endpoints_given).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(EXIT_NOT_RUN)
        }
    }
}

async fn run_inner(
    connection: &Connection,
    args: VerifyArgs,
    endpoints_given: bool,
) -> anyhow::Result<ExitCode> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let topology = Topology::from(args.topology);
    let faults = if args.no_faults {
        Vec::new()
    } else {
        args.faults
            .clone()
            .unwrap_or_else(|| Fault::defaults(topology))
    };
    if topology == Topology::Netns {
        if endpoints_given {
            anyhow::bail!("--topology netns starts its own nodes: it does not go with --endpoints");
        }
        if let Err(why) = oncekv_harness::netns::available() {
            anyhow::bail!("--topology netns cannot run here: {why}");
        }
    }
    let links = args.links.shape()?;
    if endpoints_given && !links.is_none() {
        anyhow::bail!(
            "--link-delay, --link-jitter and --link-loss shape the links of a cluster verify \
             starts: they do not go with --endpoints"
        );
    }
    if connection.tls.cacert.is_some() {
        anyhow::bail!(
            "oncekv verify does not connect over TLS (--cacert): run it on a plaintext cluster"
        );
    }
    let target = if endpoints_given {
        Target::Endpoints(connection.endpoints.clone())
    } else {
        let binary = std::env::current_exe().context("finding the oncekv binary")?;
        Target::Local {
            binary,
            nodes: usize::try_from(args.nodes)?,
            dedup: !args.unsafe_no_dedup,
            topology,
        }
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("oncekv-verify").join(format!("seed-{seed}")));
    let config = RunConfig {
        target,
        api: match args.api {
            ApiArg::Native => Api::Native,
            ApiArg::Etcd => Api::Etcd,
        },
        workload: WorkloadOptions {
            clients: usize::try_from(args.clients)?,
            mode: if args.naive_client {
                ClientMode::Naive
            } else {
                ClientMode::Session
            },
            ..WorkloadOptions::default()
        },
        duration: args.duration,
        seed,
        faults,
        out_dir: Some(out),
        links,
    };
    eprintln!("oncekv verify: seed {seed}");
    let bar = ProgressBar::new(args.duration.as_millis().try_into().unwrap_or(u64::MAX));
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {elapsed_precise} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let report = |progress: Progress| {
        bar.set_position(progress.elapsed.as_millis().try_into().unwrap_or(u64::MAX));
        bar.set_message(format!(
            "{} ops, {} faults",
            progress.operations, progress.faults
        ));
    };
    let result = run::run(&config, &report).await;
    bar.finish_and_clear();
    let summary = result?;
    let verdict = summary.verification.report.verdict();
    let violated = verdict == RunVerdict::Fail
        || !summary.crashed.is_empty()
        || !summary.disruptions.is_empty();
    // Faults that could not be made or healed: the run was not the one
    // asked for.
    let not_run = !violated && !summary.nemesis_failures.is_empty();
    match connection.output {
        Output::Json => {
            let json = serde_json::json!({
                "seed": seed,
                "verdict": if violated {
                    "FAIL"
                } else if not_run {
                    "NOT_RUN"
                } else {
                    verdict.name()
                },
                "coverage": oncekv_check::coverage::Coverage::of(&summary.record),
                "checkers": summary.verification.summaries().iter().map(|s| serde_json::json!({
                    "checker": s.checker,
                    "status": format!("{:?}", s.status).to_lowercase(),
                    "headline": s.headline,
                    "details": s.details,
                })).collect::<Vec<_>>(),
                "skipped": summary.skipped,
                "crashed": summary.crashed,
                "stopped_on_sync_failure": summary.stopped_on_sync_failure,
                "nemesis_failures": summary.nemesis_failures,
                "disruptions": summary.disruptions,
                "faults": summary.record.faults.iter().map(|f| serde_json::json!({
                    "kind": f.kind.name(),
                    "target": f.target,
                    "detail": f.detail,
                    "start_ms": f.start_ns / 1_000_000,
                    "end_ms": f.end_ns.map(|end| end / 1_000_000),
                })).collect::<Vec<_>>(),
                "stalls": summary.stalls.iter().map(stall_json).collect::<Vec<_>>(),
                "history": summary.history,
                "html": summary.html,
                "kept": summary.kept,
            });
            sayln!("{json}");
        }
        Output::Text => {
            for skipped in &summary.skipped {
                sayln!("skipped fault {skipped}");
            }
            say!("{}", summary.verification.report.to_text());
            let stalls = stalls::to_text(&summary.stalls);
            if !stalls.is_empty() {
                say!("\n{stalls}");
            }
            for crash in &summary.crashed {
                sayln!("CRASH: {crash}");
            }
            for disruption in &summary.disruptions {
                sayln!("DISRUPTED: {disruption}");
            }
            for failure in &summary.nemesis_failures {
                sayln!("NEMESIS FAILED: {failure}");
            }
            if summary.stopped_on_sync_failure > 0 {
                sayln!(
                    "nodes stopped on a failed log write or sync, or a full disk (and were \
                     restarted): {}",
                    summary.stopped_on_sync_failure
                );
            }
            if let Some(path) = &summary.history {
                sayln!("history: {}", path.display());
            }
            if let Some(path) = &summary.html {
                sayln!("report:  {}", path.display());
            }
            if let Some(path) = &summary.kept {
                sayln!("node data and logs kept in {}", path.display());
            }
            let word = if violated {
                "FAIL"
            } else if not_run {
                "NOT RUN (a fault could not be made or healed)"
            } else {
                verdict.name()
            };
            sayln!("verdict: {word} (seed {seed}; rerun with --seed {seed})");
        }
    }
    Ok(if violated {
        ExitCode::from(EXIT_VIOLATION)
    } else if not_run {
        ExitCode::from(EXIT_NOT_RUN)
    } else if verdict == RunVerdict::Pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INCONCLUSIVE)
    })
}

/// Milliseconds, to a microsecond.
fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e3).round() / 1e3
}

/// One fault window's write stall in `-o json` (`stalls`): the window,
/// the longest gap between successful writes (`gap_*`) and the writes
/// invoked during it (`writes_*`); times in ms since the run's start.
fn stall_json(stall: &WindowStall) -> serde_json::Value {
    let gap = &stall.longest_gap;
    let writes = &stall.writes;
    serde_json::json!({
        "fault_id": stall.fault_id,
        "kind": stall.kind.name(),
        "change": stall.change.map(|change| change.name()),
        "step": stall.step,
        "label": stall.label(),
        "target": stall.target,
        "detail": stall.detail,
        "mark": stall.mark,
        "window_start_ms": ms(stall.start_ns),
        "window_end_ms": ms(stall.end_ns),
        "window_open": stall.window_open,
        "longest_gap_ms": ms(gap.len_ns()),
        "gap_start_ms": ms(gap.from_ns),
        "gap_end_ms": ms(gap.to_ns),
        "gap_open": gap.open,
        "writes_invoked": writes.invoked,
        "writes_ok": writes.ok,
        "writes_failed": writes.failed,
        "writes_unknown": writes.unknown,
        "write_p50_ms": writes.p50_ns.map(ms),
        "write_p99_ms": writes.p99_ns.map(ms),
        "write_max_ms": writes.max_ns.map(ms),
    })
}
