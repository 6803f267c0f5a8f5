//! The multi-process test harness ([`oncekv_harness::testing`]), with its
//! clusters started from this package's `oncekv` binary.

#![allow(dead_code, unused_imports)]

pub use oncekv_harness::cluster::NodeProcess;
pub use oncekv_harness::testing::{
    Dependency, FAST, TestSession, connect, eventually, exclusive, execute_on, failure, free_port,
    missing_dependency, without_meta,
};
pub use oncekv_proto::convert::CallFailure;

const BINARY: &str = env!("CARGO_BIN_EXE_oncekv");

/// A cluster of `oncekv serve` processes of this package's binary.
pub struct Cluster(oncekv_harness::cluster::Cluster);

impl Cluster {
    /// Starts `size` nodes with extra `serve` flags.
    pub fn start(size: u64, extra: &[&str]) -> Cluster {
        Cluster(oncekv_harness::testing::start(BINARY, size, extra))
    }

    /// Starts `size` nodes with extra `serve` flags and TLS on both ports
    /// (client certificates required if `client_certificates`).
    pub fn start_tls(size: u64, extra: &[&str], client_certificates: bool) -> Cluster {
        Cluster(oncekv_harness::testing::start_tls(
            BINARY,
            size,
            extra,
            client_certificates,
        ))
    }

    /// Plans `size` nodes with extra `serve` flags, starting none.
    pub fn new(size: u64, extra: &[&str]) -> Cluster {
        Cluster(oncekv_harness::testing::plan(BINARY, size, extra))
    }
}

impl std::ops::Deref for Cluster {
    type Target = oncekv_harness::cluster::Cluster;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}
pub mod etcdctl;

/// Runs this package's `oncekv` with `args` to its end, with `env` set and
/// none of the caller's `ONCEKV_*` connection variables: its exit code and
/// all it printed (standard output, then standard error).
pub fn oncekv_cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut command = std::process::Command::new(BINARY);
    command.args(args).stdin(std::process::Stdio::null());
    for name in [
        "ONCEKV_USER",
        "ONCEKV_PASSWORD",
        "ONCEKV_ENDPOINTS",
        "ONCEKV_CACERT",
        "ONCEKV_CERT",
        "ONCEKV_KEY",
    ] {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    let output = command.output().expect("run oncekv");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().expect("an exit code"), text)
}
