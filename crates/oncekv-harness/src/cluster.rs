//! [`LocalCluster`]: real `oncekv serve` processes on loopback, each in a
//! data directory of a temporary folder, with the process controls the
//! nemesis needs: SIGKILL and restart on the same data, SIGSTOP and
//! SIGCONT. Each node's peer address is a [`PeerProxy`] and its outgoing
//! peer connections come from its own loopback source address, so
//! partitions can be cut between any pair. Every process is stopped by PID
//! when the cluster is dropped.

use crate::peer_proxy::{Partitions, PeerProxy, source_ip};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oncekv_check::record::NodeId;
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// How the nodes are started.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The `oncekv` binary.
    pub binary: PathBuf,
    /// How many nodes.
    pub nodes: usize,
    /// Whether retries are deduplicated (off only for the negative control).
    pub dedup: bool,
    /// Extra `serve` flags for every node.
    pub extra_args: Vec<String>,
    /// Start each node under `fiu-run`, so its disk syncs can be made to
    /// fail (see [`LocalCluster::fiu_ctrl`]).
    pub fiu: bool,
}

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A port, folder or process could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// One node: its addresses, data and process.
#[derive(Debug)]
pub struct NodeProcess {
    /// Its id.
    pub id: NodeId,
    /// Its real client address.
    pub client_address: SocketAddr,
    /// Its real peer address (behind the peer proxy).
    pub peer_address: SocketAddr,
    /// The proxy other nodes reach it through.
    pub peer_proxy: SocketAddr,
    args: Vec<String>,
    child: Option<Child>,
    paused: bool,
    log: PathBuf,
}

impl NodeProcess {
    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (possibly paused).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }
}

/// A local cluster of `oncekv serve` processes.
#[derive(Debug)]
pub struct LocalCluster {
    options: ClusterOptions,
    nodes: Vec<NodeProcess>,
    partitions: Partitions,
    path: PathBuf,
    /// Processes that exited on their own: node, exit code, description.
    exits: Vec<(NodeId, Option<i32>, String)>,
    /// Removed on drop unless kept.
    dir: Option<tempfile::TempDir>,
}

/// A free loopback port (bound, then released for the node to take).
fn free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

impl LocalCluster {
    /// Starts the nodes and their peer proxies (on the current tokio
    /// runtime). Does not wait for a leader.
    pub async fn start(options: ClusterOptions) -> Result<LocalCluster, ClusterError> {
        let dir = tempfile::Builder::new()
            .prefix("oncekv-verify-")
            .tempdir()
            .map_err(io("creating the run's folder"))?;
        let ids: Vec<NodeId> = (1..=options.nodes as NodeId).collect();
        let partitions = Partitions::default();
        let mut nodes = Vec::new();
        let mut listeners = Vec::new();
        for &id in &ids {
            let (proxy, listener) = PeerProxy::bind()
                .await
                .map_err(io("binding a peer proxy"))?;
            listeners.push(listener);
            nodes.push(NodeProcess {
                id,
                client_address: free_port().map_err(io("finding a free port"))?,
                peer_address: free_port().map_err(io("finding a free port"))?,
                peer_proxy: proxy.address(),
                args: Vec::new(),
                child: None,
                paused: false,
                log: dir.path().join(format!("node-{id}.log")),
            });
        }
        let shared_ids = Arc::new(ids);
        for (node, listener) in nodes.iter().zip(listeners) {
            PeerProxy::run(
                listener,
                node.id,
                node.peer_address,
                shared_ids.clone(),
                partitions.clone(),
            );
        }
        let initial: Vec<String> = nodes
            .iter()
            .map(|n| format!("{}={}/{}", n.id, n.peer_proxy, n.client_address))
            .collect();
        let initial = initial.join(",");
        for node in &mut nodes {
            let data = dir.path().join(format!("node-{}", node.id));
            node.args = vec![
                "serve".into(),
                "--id".into(),
                node.id.to_string(),
                "--data-dir".into(),
                data.display().to_string(),
                "--listen-client".into(),
                node.client_address.to_string(),
                "--listen-peer".into(),
                node.peer_address.to_string(),
                "--advertise-peer".into(),
                node.peer_proxy.to_string(),
                "--initial-cluster".into(),
                initial.clone(),
                "--peer-source-ip".into(),
                source_ip(node.id).to_string(),
            ];
            node.args.extend(options.extra_args.iter().cloned());
            if !options.dedup {
                node.args.push("--unsafe-no-dedup".into());
            }
        }
        let mut cluster = LocalCluster {
            options,
            nodes,
            partitions,
            path: dir.path().to_path_buf(),
            exits: Vec::new(),
            dir: Some(dir),
        };
        for id in shared_ids.iter() {
            cluster
                .restart(*id)
                .map_err(io(format!("starting node {id}")))?;
        }
        Ok(cluster)
    }

    /// The nodes.
    pub fn nodes(&self) -> &[NodeProcess] {
        &self.nodes
    }

    /// The peer-link partitions.
    pub fn partitions(&self) -> &Partitions {
        &self.partitions
    }

    /// The run's folder (data directories and node logs).
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// The base path of the nodes' `fiu-ctrl` pipes (in the run's folder).
    pub fn fiu_ctrl(&self) -> PathBuf {
        self.path.join("fiu-ctrl")
    }

    /// Keeps the run's folder after the cluster is dropped.
    pub fn keep_dir(&mut self) -> PathBuf {
        if let Some(dir) = self.dir.take() {
            let _ = dir.keep();
        }
        self.path.clone()
    }

    fn node_mut(&mut self, id: NodeId) -> Option<&mut NodeProcess> {
        self.nodes.iter_mut().find(|n| n.id == id)
    }

    /// Starts node `id` (again), on the same data.
    pub fn restart(&mut self, id: NodeId) -> std::io::Result<()> {
        let binary = self.options.binary.clone();
        let fiu = self.options.fiu.then(|| self.fiu_ctrl());
        self.reap();
        let Some(node) = self.node_mut(id) else {
            return Ok(());
        };
        if node.is_running() {
            return Ok(());
        }
        let log = File::options().create(true).append(true).open(&node.log)?;
        let mut command = match fiu {
            Some(control) => {
                let mut command = Command::new("fiu-run");
                command.arg("-x").arg("-f").arg(control).arg(&binary);
                command
            }
            None => Command::new(&binary),
        };
        command
            .args(&node.args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        node.child = Some(command.spawn()?);
        node.paused = false;
        Ok(())
    }

    fn signal(&mut self, id: NodeId, signal: Signal) -> bool {
        let Some(node) = self.node_mut(id) else {
            return false;
        };
        let Some(pid) = node.pid().and_then(|pid| i32::try_from(pid).ok()) else {
            return false;
        };
        kill(Pid::from_raw(pid), signal).is_ok()
    }

    /// SIGKILLs node `id` and reaps it.
    pub fn kill(&mut self, id: NodeId) {
        self.signal(id, Signal::SIGCONT);
        if let Some(node) = self.node_mut(id) {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            node.paused = false;
        }
    }

    /// SIGSTOPs node `id`.
    pub fn pause(&mut self, id: NodeId) {
        if self.signal(id, Signal::SIGSTOP)
            && let Some(node) = self.node_mut(id)
        {
            node.paused = true;
        }
    }

    /// SIGCONTs node `id`.
    pub fn resume(&mut self, id: NodeId) {
        self.signal(id, Signal::SIGCONT);
        if let Some(node) = self.node_mut(id) {
            node.paused = false;
        }
    }

    /// Resumes paused nodes, restarts dead ones and heals partitions.
    pub fn heal(&mut self) -> std::io::Result<()> {
        self.partitions.heal();
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        for id in ids {
            self.resume(id);
            self.restart(id)?;
        }
        Ok(())
    }

    /// Notes every process that exited on its own since the last look.
    fn reap(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = &mut node.child
                && let Ok(Some(status)) = child.try_wait()
            {
                self.exits
                    .push((node.id, status.code(), status.to_string()));
                node.child = None;
            }
        }
    }

    /// Processes that exited on their own (not killed by the nemesis)
    /// during the run: node, exit code, description.
    pub fn exits(&mut self) -> Vec<(NodeId, Option<i32>, String)> {
        self.reap();
        self.exits.clone()
    }

    /// Kills every node.
    pub fn stop_all(&mut self) {
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        for id in ids {
            self.kill(id);
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// How long a node gets to come up before the run gives up on it.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
