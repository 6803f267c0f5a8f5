//! `oncekv netns`: holds a network of hosts (network namespaces on a
//! private bridge, `oncekv_harness::netns`) with a shaped peer proxy for
//! each host in the clients' namespace, for benchmarks across hosts
//! (`scripts/bench-links.sh`): it prints where everything is, as shell
//! assignments, and holds the network until SIGINT or SIGTERM, then
//! removes it with whatever still runs in it.

use crate::links::LinkArgs;
use anyhow::Context;
use clap::Args;
use oncekv_check::record::NodeId;
use oncekv_harness::netns::{self, Network};
use oncekv_harness::peer_proxy::Partitions;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

const AFTER_HELP: &str = "\
Each host h (1 to --hosts) is a namespace with the address 10.77.0.(10+h);
the clients' namespace, 10.77.0.2, holds a peer proxy for each host on
port 7400+h, which forwards to the host's port 7380 and shapes what
passes as --link-* ask (each direction of each host-to-host link on its
own; callers are told apart by their hosts' addresses). A program on host
h listens on its address (peers on port 7380) and advertises its proxy
as its peer address; clients run in the clients' namespace and reach the
hosts directly. Printed on standard output, then `# ready`:

  client_namespace=okv1f2e-0-cl
  host_namespace_1=okv1f2e-0-n1 host_ip_1=10.77.0.11 peer_proxy_1=10.77.0.2:7401
  ...

Start programs with `ip netns exec NAMESPACE ...`. The network (and all
that runs in it) goes on SIGINT or SIGTERM. Root only. Example:
  sudo oncekv netns --hosts 6 --link-delay 2ms > net.env &
  until grep -q '^# ready' net.env; do sleep 0.1; done; . ./net.env";

/// Flags of `oncekv netns`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct NetnsArgs {
    /// How many hosts.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=netns::NODES_MAX as u64))]
    hosts: u64,
    /// Seeds the links' draws (jitter, loss).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The peer links' delay, jitter and loss.
    #[command(flatten)]
    links: LinkArgs,
}

/// Runs `oncekv netns`.
pub async fn run(args: NetnsArgs) -> ExitCode {
    match hold(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(crate::exit::NOT_RUN)
        }
    }
}

async fn hold(args: NetnsArgs) -> anyhow::Result<()> {
    if let Err(why) = netns::available() {
        anyhow::bail!("oncekv netns cannot run here: {why}");
    }
    let shape = args.links.shape()?;
    let hosts: Vec<NodeId> = (1..=args.hosts).collect();
    let network = Network::create(&hosts).context("making the hosts' namespaces")?;
    let partitions = Partitions::default();
    partitions.shaping().set_seed(args.seed);
    partitions.shaping().set_all(shape);
    sayln!("client_namespace={}", network.client_namespace());
    for &host in &hosts {
        // The node on host `host` is numbered after it.
        let proxy = network
            .run_peer_proxy(host, Arc::new(AtomicU64::new(host)), partitions.clone())
            .with_context(|| format!("running host {host}'s peer proxy"))?;
        sayln!(
            "host_namespace_{host}={} host_ip_{host}={} peer_proxy_{host}={proxy}",
            network.namespace(host),
            netns::node_ip(host)
        );
    }
    sayln!("# ready");
    crate::serve::shutdown_signal().await;
    drop(network);
    Ok(())
}
