//! The multi-process tests' view of a [`Cluster`]: [`start`] (or
//! [`plan`]) `oncekv serve` processes of a given binary (from another
//! package's tests, [`oncekv_binary`]) on free loopback ports in a
//! temporary folder, kill, pause and restart them by PID
//! ([`NodeProcess::spawn`], [`NodeProcess::kill`],
//! [`NodeProcess::signal`]), and talk to them over the real gRPC API:
//! status, state digests, execute and read requests, the leader, an
//! outcome through leader changes, sessions ([`TestSession`]). Failures
//! panic, with the nodes' logs where they help. Every wait is bounded
//! ([`eventually`]); [`exclusive`] runs one cluster of a test binary at a
//! time. A test that cannot run for lack of something on the machine
//! (root, etcd, fiu) says so through [`missing_dependency`]: it fails
//! under `CI=true` and is skipped, and listed, elsewhere.

use crate::cluster::{Cluster, ClusterOptions, NodeProcess, free_address};
use oncekv_proto::convert::{self, CallFailure};
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::{self, ExecuteRequest, ExecuteResponse, ReadRequest, StatusRequest};
use oncekv_state::{
    Command, Origin, Outcome, Query, Reply, Request, RequestHeader, RequestId, Secret, Seq,
    SessionId,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    free_address().expect("a free port").port()
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

/// The options of a test cluster: `size` nodes of `binary` with extra
/// `serve` flags, logging at `info`.
pub fn options(binary: impl AsRef<Path>, size: u64, extra: &[&str]) -> ClusterOptions {
    ClusterOptions {
        binary: binary.as_ref().to_path_buf(),
        nodes: usize::try_from(size).expect("a cluster size"),
        dedup: true,
        extra_args: extra.iter().map(|s| (*s).to_string()).collect(),
        fiu: false,
        log: Some("info".into()),
        folder_prefix: "oncekv-test-".into(),
        tls: false,
        client_certificates: false,
        insecure_peers: false,
        topology: crate::cluster::Topology::Loopback,
        private_disks: None,
        link_shape: crate::peer_proxy::LinkShape::default(),
        link_seed: 0,
    }
}

/// Starts `size` nodes of `binary` with extra `serve` flags.
pub fn start(binary: impl AsRef<Path>, size: u64, extra: &[&str]) -> Cluster {
    let mut cluster = plan(binary, size, extra);
    for node in &mut cluster.nodes {
        node.spawn();
    }
    cluster
}

/// Starts `size` nodes of `binary` with extra `serve` flags, serving TLS
/// on both ports (certificates made in the cluster's folder), requiring
/// client certificates if `client_certificates`. Its nodes' clients
/// ([`NodeProcess::connect`], [`Cluster::client_options`]) use TLS.
pub fn start_tls(
    binary: impl AsRef<Path>,
    size: u64,
    extra: &[&str],
    client_certificates: bool,
) -> Cluster {
    let mut options = options(binary, size, extra);
    options.tls = true;
    options.client_certificates = client_certificates;
    let mut cluster = Cluster::plan(&options).expect("a cluster's ports, folder and certificates");
    for node in &mut cluster.nodes {
        node.spawn();
    }
    cluster
}

/// Plans `size` nodes of `binary` with extra `serve` flags, starting none.
pub fn plan(binary: impl AsRef<Path>, size: u64, extra: &[&str]) -> Cluster {
    Cluster::plan(&options(binary, size, extra)).expect("a cluster's ports and folder")
}

/// The `oncekv` binary, for the tests of another package (the `oncekv`
/// package's own use `CARGO_BIN_EXE_oncekv`): `ONCEKV_BIN` if set, else
/// `oncekv` in the profile folder the running test was built into (a test
/// runs from `<target>/<profile>/deps/`). `cargo test --workspace` builds
/// it before any test runs; where it is missing (`cargo test -p
/// oncekv-bench` in a fresh target folder) it is built with cargo first.
/// A binary that is there is taken as it is: after changing the node, run
/// `cargo build -p oncekv` (or the whole workspace's tests).
pub fn oncekv_binary() -> PathBuf {
    static BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BINARY.get_or_init(find_or_build_oncekv).clone()
}

fn find_or_build_oncekv() -> PathBuf {
    if let Some(binary) = std::env::var_os("ONCEKV_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(binary);
    }
    let test = std::env::current_exe().expect("the running test's path");
    let profile = test
        .parent()
        .and_then(Path::parent)
        .expect("a test runs from <target>/<profile>/deps/");
    let binary = profile.join("oncekv");
    if binary.is_file() {
        return binary;
    }
    let target = profile.parent().expect("a target folder");
    let mut build = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
    build.args([
        "build",
        "--package",
        "oncekv",
        "--bin",
        "oncekv",
        "--target-dir",
    ]);
    build.arg(target);
    match profile.file_name().and_then(|name| name.to_str()) {
        Some("debug") => {}
        Some("release") => {
            build.arg("--release");
        }
        Some(other) => {
            build.args(["--profile", other]);
        }
        None => {}
    }
    let status = build.status().expect("run cargo build -p oncekv");
    assert!(
        status.success() && binary.is_file(),
        "building {} failed ({status}); build it with `cargo build -p oncekv`, or set ONCEKV_BIN",
        binary.display()
    );
    binary
}

impl Cluster {
    /// Node `id`.
    pub fn node(&mut self, id: u64) -> &mut NodeProcess {
        self.node_mut(id).expect("node")
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
                Ok(Some(v1::execute_response::Result::Failure(failure))) => {
                    match convert::failure_from_wire(failure) {
                        Ok(CallFailure::NotLeader { .. } | CallFailure::NoLeader(_)) => {}
                        Ok(CallFailure::Unavailable(why)) if deduplicated => {
                            eprintln!("retrying after: {why}");
                        }
                        other => panic!("no outcome from node {leader}: {other:?}"),
                    }
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
}

impl NodeProcess {
    /// Starts the process (again) on its data.
    pub fn spawn(&mut self) {
        self.start().expect("spawn oncekv serve");
    }

    /// Sends a signal by its `kill` name: `-STOP`, `-CONT`, ...
    pub fn signal(&mut self, signal: &str) {
        self.paused = signal == "-STOP";
        assert!(self.child.is_some(), "running");
        let name = format!("SIG{}", signal.trim_start_matches('-'));
        let sent = name
            .parse::<nix::sys::signal::Signal>()
            .is_ok_and(|signal| self.send(signal));
        assert!(sent, "kill {signal} failed");
    }

    /// A gRPC client of this node (over TLS when the cluster serves it).
    pub async fn connect(&self) -> Result<KvClient<Channel>, String> {
        match &self.tls {
            Some(tls) => {
                use oncekv_client::Connector as _;
                let channel = tls.channel(&self.client)?;
                Ok(KvClient::new(channel).max_decoding_message_size(64 << 20))
            }
            None => connect(&self.client).await,
        }
    }

    /// What this node reports of itself.
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
        let mut client = self.connect().await?;
        let wire: ExecuteRequest = convert::request_to_wire(request).map_err(|e| e.to_string())?;
        client
            .execute(wire)
            .await
            .map(|r| r.into_inner())
            .map_err(|e| e.to_string())
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

    /// Reads `query` on this node (`serializable`: from its own state,
    /// without a read barrier).
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
            Ok(Reply::Get { value, .. }) => value,
            _ => None,
        }
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

    /// Request `seq` of this session (acknowledging everything below it).
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

/// Why an execute call was not carried out, if it was not.
pub fn failure(response: &ExecuteResponse) -> Option<CallFailure> {
    match &response.result {
        Some(v1::execute_response::Result::Failure(failure)) => {
            convert::failure_from_wire(failure.clone()).ok()
        }
        _ => None,
    }
}

/// A GET reply's revisions dropped (in a reply, an outcome or a result
/// holding one), so a test compares values only.
pub trait WithoutMeta {
    /// This, with `Reply::Get`'s `meta` set to `None`.
    fn without_meta(self) -> Self;
}

impl WithoutMeta for oncekv_state::Reply {
    fn without_meta(self) -> Self {
        match self {
            oncekv_state::Reply::Get { value, .. } => {
                oncekv_state::Reply::Get { value, meta: None }
            }
            other => other,
        }
    }
}

impl WithoutMeta for oncekv_state::Outcome {
    fn without_meta(self) -> Self {
        match self {
            oncekv_state::Outcome::Applied(reply) => {
                oncekv_state::Outcome::Applied(reply.without_meta())
            }
            other => other,
        }
    }
}

impl<T: WithoutMeta, E> WithoutMeta for Result<T, E> {
    fn without_meta(self) -> Self {
        self.map(T::without_meta)
    }
}

/// `value` with GET revisions dropped ([`WithoutMeta`]).
pub fn without_meta<T: WithoutMeta>(value: T) -> T {
    value.without_meta()
}

/// The environment variable naming a file to which [`missing_dependency`]
/// appends one line per skipped test: `cargo xtask verify` sets it and
/// prints the file at the end, so a skip shows in the final summary.
pub const SKIP_LOG_ENV: &str = "ONCEKV_SKIP_LOG";

/// Something a test needs from the machine that the build cannot provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependency {
    /// Root, to mount a private tmpfs (`unshare --mount`, `mount`,
    /// `nsenter`).
    Root,
    /// An `etcd` binary on `PATH` (Debian's etcd-server).
    Etcd,
    /// An `etcdctl` binary on `PATH` (Debian's etcd-client).
    Etcdctl,
    /// `fiu-run` and `fiu-ctrl` on `PATH` (Debian's fiu-utils), to make
    /// disk syncs fail.
    Fiu,
    /// aetcd's integration tests and a Python virtual environment with
    /// aetcd and pytest to run them, in `target/aetcd-suite`.
    AetcdSuite,
    /// A shell on `PATH` whose completion script is checked (zsh, fish).
    Shell(&'static str),
    /// A build with `--cfg tokio_unstable` (`.cargo/config.toml` sets it),
    /// for a deterministic simulation.
    TokioUnstable,
    /// Root and `ip netns` (iproute2), to run nodes as hosts of their own
    /// ([`crate::netns`]).
    NetworkNamespaces,
}

impl Dependency {
    /// What is missing.
    pub fn what(self) -> &'static str {
        match self {
            Dependency::Root => "root, to mount a private tmpfs (unshare, mount, nsenter)",
            Dependency::Etcd => "an etcd binary on PATH",
            Dependency::Etcdctl => "an etcdctl binary on PATH",
            Dependency::Fiu => "fiu-run and fiu-ctrl on PATH",
            Dependency::AetcdSuite => {
                "aetcd 1.0.0's integration tests and a virtual environment to run them \
                 (target/aetcd-suite)"
            }
            Dependency::Shell("zsh") => "zsh on PATH",
            Dependency::Shell("fish") => "fish on PATH",
            Dependency::Shell(_) => "a shell on PATH",
            Dependency::TokioUnstable => "a build with --cfg tokio_unstable",
            Dependency::NetworkNamespaces => {
                "root and `ip netns` (iproute2), to give each node a network namespace"
            }
        }
    }

    /// How to provide it.
    pub fn remedy(self) -> &'static str {
        match self {
            Dependency::Root => {
                "run the tests as root, where mounting is allowed (scripts/setup.sh cannot \
                 grant that)"
            }
            Dependency::Etcd => {
                "scripts/setup.sh installs it as root with apt (apt-get install etcd-server)"
            }
            Dependency::Etcdctl => {
                "scripts/setup.sh installs it as root with apt (apt-get install etcd-client)"
            }
            Dependency::Fiu => {
                "scripts/setup.sh installs them as root with apt (apt-get install fiu-utils)"
            }
            Dependency::AetcdSuite => {
                "scripts/setup.sh makes them from PyPI (python3 -m venv, pip install \
                 aetcd[test]==1.0.0, the tests/ of its sdist)"
            }
            Dependency::Shell(_) => {
                "scripts/setup.sh installs zsh and fish as root with apt (apt-get install zsh \
                 fish)"
            }
            Dependency::TokioUnstable => {
                "build with the workspace's .cargo/config.toml (it sets --cfg tokio_unstable), \
                 not with RUSTFLAGS that replace it"
            }
            Dependency::NetworkNamespaces => {
                "run the tests as root (CI does), with iproute2 installed (apt-get install \
                 iproute2); scripts/setup.sh cannot grant root"
            }
        }
    }
}

/// The path of `program` on `PATH`, if it is there.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// A one-member etcd (Debian's `etcd`) on free loopback ports in a
/// temporary folder, killed by PID on drop: the reference the etcd API is
/// compared with.
#[derive(Debug)]
pub struct EtcdProcess {
    child: std::process::Child,
    /// Its client address, `127.0.0.1:PORT`.
    pub endpoint: String,
    dir: tempfile::TempDir,
}

impl EtcdProcess {
    /// Starts one if an `etcd` binary is on `PATH`.
    pub fn start() -> Option<EtcdProcess> {
        let binary = on_path("etcd")?;
        let dir = tempfile::tempdir().expect("temp dir");
        let client = format!("http://127.0.0.1:{}", free_port());
        let peer = format!("http://127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log");
        let child = std::process::Command::new(binary)
            .args(["--name", "reference", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("reference={peer}")])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        Some(EtcdProcess {
            child,
            endpoint: client.trim_start_matches("http://").to_string(),
            dir,
        })
    }

    /// Its log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this is a CI run: the `CI` environment variable is `true` (or
/// `1`), as CI services set it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| {
        let value = value.trim();
        value.eq_ignore_ascii_case("true") || value == "1"
    })
}

/// Test `test` cannot run here for lack of `dependency`; `detail` says
/// what was found missing. Under `CI=true` ([`in_ci`]) this panics, naming
/// the dependency and how to provide it, so that CI fails instead of
/// passing a test that never ran. Elsewhere it prints a `skipped: ...`
/// line and appends it to the file [`SKIP_LOG_ENV`] names (when set), and
/// the caller skips what it cannot do.
#[track_caller]
pub fn missing_dependency(test: &str, dependency: Dependency, detail: &str) {
    let log = std::env::var_os(SKIP_LOG_ENV).filter(|path| !path.is_empty());
    report_missing(
        in_ci(),
        log.as_deref().map(Path::new),
        test,
        dependency,
        detail,
    );
}

/// [`missing_dependency`] with the environment read: panics if `ci`, else
/// prints the skip and appends it to `log`.
#[track_caller]
fn report_missing(ci: bool, log: Option<&Path>, test: &str, dependency: Dependency, detail: &str) {
    let what = dependency.what();
    let remedy = dependency.remedy();
    let detail = detail.split_whitespace().collect::<Vec<_>>().join(" ");
    if ci {
        panic!(
            "{test} needs {what}, missing here ({detail}); with CI=true a missing dependency \
             fails the test instead of skipping it: {remedy}"
        );
    }
    let line = format!("skipped: {test}: needs {what} ({detail}); {remedy}");
    eprintln!("{line}");
    if let Some(path) = log {
        // One write of one line: lines from concurrent tests stay whole.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
        if let Err(error) = appended {
            eprintln!(
                "could not record the skip in {} ({SKIP_LOG_ENV}): {error}",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Dependency, report_missing};

    #[test]
    fn a_skip_outside_ci_is_printed_and_logged_line_by_line() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("skipped.txt");
        report_missing(false, Some(&log), "a::b", Dependency::Etcd, "no etcd\nhere");
        report_missing(false, Some(&log), "c::d", Dependency::Fiu, "fsync: skipped");
        report_missing(false, None, "e::f", Dependency::Root, "not logged");
        let text = std::fs::read_to_string(&log).expect("log written");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with("skipped: a::b: needs an etcd binary"),
            "{text}"
        );
        assert!(lines[0].contains("(no etcd here)"), "{text}");
        assert!(lines[0].contains("apt-get install etcd-server"), "{text}");
        assert!(lines[1].contains("apt-get install fiu-utils"), "{text}");
    }

    #[test]
    #[should_panic(expected = "a::b needs root")]
    fn a_missing_dependency_fails_in_ci() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("skipped.txt");
        report_missing(
            true,
            Some(&log),
            "a::b",
            Dependency::Root,
            "unshare: denied",
        );
    }
}
