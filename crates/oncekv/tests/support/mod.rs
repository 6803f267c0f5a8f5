//! Multi-process test harness: starts `oncekv serve` processes on free
//! loopback ports in temporary directories, kills, pauses and restarts them
//! by PID, and talks to them over the real gRPC API. Every wait is bounded.

#![allow(dead_code)]

use oncekv_proto::convert;
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::{self, ExecuteRequest, ExecuteResponse, ReadRequest, StatusRequest};
use oncekv_state::{
    Command, Origin, Outcome, Query, Reply, Request, RequestHeader, RequestId, Secret, Seq,
    SessionId,
};
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A gRPC client of the node at `address`.
pub async fn connect(address: &str) -> Result<KvClient<Channel>, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(10));
    // The HTTP/2 handshake with a paused process would wait forever.
    let channel = tokio::time::timeout(Duration::from_secs(2), endpoint.connect())
        .await
        .map_err(|_| format!("{address}: connect timed out"))?
        .map_err(|e| e.to_string())?;
    Ok(KvClient::new(channel).max_decoding_message_size(64 << 20))
}

/// Sends a request to the node at `address`.
pub async fn execute_on(address: &str, request: &Request) -> Result<ExecuteResponse, String> {
    let mut client = connect(address).await.map_err(|e| e.to_string())?;
    let wire: ExecuteRequest = convert::request_to_wire(request).map_err(|e| e.to_string())?;
    client
        .execute(wire)
        .await
        .map(|r| r.into_inner())
        .map_err(|e| e.to_string())
}

/// Serialises the multi-process tests of one test binary (2 cores).
pub static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Takes the cluster lock.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME.lock().await
}

/// Flags that make failover fast on loopback.
pub const FAST: &[&str] = &[
    "--heartbeat",
    "50ms",
    "--election-timeout",
    "800ms",
    "--tick-interval",
    "200ms",
];

/// One node process.
pub struct NodeProcess {
    pub id: u64,
    pub client: String,
    pub peer: String,
    pub data_dir: PathBuf,
    pub child: Option<Child>,
    /// Stopped with SIGSTOP and not yet continued.
    pub paused: bool,
    /// A command the node is started through (`nsenter ...`), if any.
    pub launcher: Vec<String>,
    extra: Vec<String>,
    cluster: String,
    log: PathBuf,
}

/// A cluster of node processes sharing a temp dir.
pub struct Cluster {
    pub nodes: Vec<NodeProcess>,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `size` nodes with extra `serve` flags.
    pub fn start(size: u64, extra: &[&str]) -> Cluster {
        let mut cluster = Cluster::new(size, extra);
        for node in &mut cluster.nodes {
            node.spawn();
        }
        cluster
    }

    /// Plans `size` nodes with extra `serve` flags, starting none.
    pub fn new(size: u64, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let addresses: Vec<(u64, String, String)> = (1..=size)
            .map(|id| {
                (
                    id,
                    format!("127.0.0.1:{}", free_port()),
                    format!("127.0.0.1:{}", free_port()),
                )
            })
            .collect();
        let cluster = addresses
            .iter()
            .map(|(id, client, peer)| format!("{id}={peer}/{client}"))
            .collect::<Vec<_>>()
            .join(",");
        let nodes: Vec<NodeProcess> = addresses
            .into_iter()
            .map(|(id, client, peer)| NodeProcess {
                id,
                data_dir: dir.path().join(format!("node{id}")),
                log: dir.path().join(format!("node{id}.log")),
                client,
                peer,
                child: None,
                paused: false,
                launcher: Vec::new(),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                cluster: cluster.clone(),
            })
            .collect();
        Cluster { nodes, dir }
    }

    pub fn node(&mut self, id: u64) -> &mut NodeProcess {
        self.nodes.iter_mut().find(|n| n.id == id).expect("node")
    }

    /// Waits until some live node reports itself leader; returns its id.
    pub async fn leader(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            for node in self.nodes.iter().filter(|n| n.child.is_some() && !n.paused) {
                if let Ok(status) = node.status().await
                    && status.is_leader
                {
                    return node.id;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no leader within {timeout:?}\n{}", self.logs());
    }

    /// Sends `request` to the leader until it answers with an outcome,
    /// following leadership changes. A request that is not on a session
    /// or under a key is retried only when it was definitely not proposed.
    pub async fn outcome(&self, request: &Request, timeout: Duration) -> Outcome {
        let deduplicated = !matches!(request.origin, Origin::Plain);
        let deadline = Instant::now() + timeout;
        loop {
            let leader = self
                .leader(deadline.saturating_duration_since(Instant::now()))
                .await;
            let node = self
                .nodes
                .iter()
                .find(|n| n.id == leader)
                .expect("leader node");
            match node.execute(request).await.map(|r| r.result) {
                Ok(Some(v1::execute_response::Result::Outcome(outcome))) => {
                    return convert::outcome_from_wire(outcome).expect("valid outcome");
                }
                Ok(Some(v1::execute_response::Result::NotLeader(_))) => {}
                Ok(Some(v1::execute_response::Result::Unavailable(why))) if deduplicated => {
                    eprintln!("retrying after: {}", why.reason);
                }
                Err(error) if deduplicated => eprintln!("retrying after: {error}"),
                other => panic!("no outcome from node {leader}: {other:?}"),
            }
            assert!(
                Instant::now() < deadline,
                "no outcome within {timeout:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every node's log, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(&n.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                format!(
                    "--- node {} ---\n{}",
                    n.id,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl NodeProcess {
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let binary = env!("CARGO_BIN_EXE_oncekv");
        let mut command = match self.launcher.split_first() {
            Some((program, args)) => {
                let mut command = Process::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Process::new(binary),
        };
        let child = command
            .args(["serve", "--id", &self.id.to_string(), "--data-dir"])
            .arg(&self.data_dir)
            .args(["--listen-client", &self.client, "--listen-peer", &self.peer])
            .args(["--initial-cluster", &self.cluster, "--log", "info"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn oncekv serve");
        self.child = Some(child);
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn signal(&mut self, signal: &str) {
        self.paused = signal == "-STOP";
        let child = self.child.as_ref().expect("running");
        let status = Process::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("kill command");
        assert!(status.success(), "kill {signal} failed");
    }

    pub async fn connect(&self) -> Result<KvClient<Channel>, String> {
        connect(&self.client).await
    }

    pub async fn status(&self) -> Result<v1::StatusResponse, String> {
        let mut client = self.connect().await.map_err(|e| e.to_string())?;
        client
            .status(StatusRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|e| e.to_string())
    }

    /// The digest of this node's state and the index it was taken at.
    pub async fn state_digest(&self) -> Result<(Option<u64>, u64), String> {
        let mut client = self.connect().await.map_err(|e| e.to_string())?;
        client
            .state_digest(v1::StateDigestRequest {})
            .await
            .map(|r| r.into_inner())
            .map(|r| (r.applied_index, r.digest))
            .map_err(|e| e.to_string())
    }

    /// Sends a request; returns the raw response.
    pub async fn execute(&self, request: &Request) -> Result<ExecuteResponse, String> {
        execute_on(&self.client, request).await
    }

    /// Sends a request and expects an outcome.
    pub async fn outcome(&self, request: &Request) -> Outcome {
        let response = self.execute(request).await.expect("execute");
        match response.result {
            Some(v1::execute_response::Result::Outcome(outcome)) => {
                convert::outcome_from_wire(outcome).expect("valid outcome")
            }
            other => panic!("node {} gave no outcome: {other:?}", self.id),
        }
    }

    pub async fn read(&self, query: &Query, serializable: bool) -> Result<Reply, String> {
        let mut client = self.connect().await.map_err(|e| e.to_string())?;
        let response = client
            .read(ReadRequest {
                query: Some(convert::query_to_wire(query)),
                serializable,
            })
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        match response.result {
            Some(v1::read_response::Result::Reply(reply)) => {
                convert::reply_from_wire(reply).map_err(|e| e.to_string())
            }
            other => Err(format!("{other:?}")),
        }
    }

    /// The value of `key` on this replica (serializable read).
    pub async fn local_value(&self, key: &[u8]) -> Option<Vec<u8>> {
        match self.read(&Query::Get { key: key.to_vec() }, true).await {
            Ok(Reply::Get { value }) => value,
            _ => None,
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            let _ = Process::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill();
    }
}

static OPENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A session opened through the leader.
#[derive(Clone, Copy, Debug)]
pub struct TestSession {
    pub id: SessionId,
    pub secret: Secret,
}

impl TestSession {
    /// Opens a session through the leader (under an idempotency key, so
    /// the open is retried safely across leader changes).
    pub async fn open(cluster: &Cluster, ttl_ms: u64, window: u32) -> TestSession {
        let key = format!(
            "open-{}-{}",
            std::process::id(),
            OPENS.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let open = Request {
            origin: Origin::Key(oncekv_state::IdempotencyKey(key.into_bytes())),
            command: Command::OpenSession {
                ttl_ms,
                window,
                secret: Secret(0),
            },
        };
        match cluster.outcome(&open, Duration::from_secs(15)).await {
            Outcome::Applied(Reply::SessionOpened {
                session, secret, ..
            })
            | Outcome::Replayed {
                reply:
                    Reply::SessionOpened {
                        session, secret, ..
                    },
                ..
            } => TestSession {
                id: session,
                secret,
            },
            other => panic!("session not opened: {other:?}"),
        }
    }

    pub fn request(&self, seq: u64, attempt: u32, command: Command) -> Request {
        Request {
            origin: Origin::Session(RequestHeader {
                id: RequestId {
                    session: self.id,
                    seq: Seq(seq),
                },
                secret: self.secret,
                first_incomplete: Seq(seq),
                attempt,
            }),
            command,
        }
    }
}

/// Polls `check` until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
