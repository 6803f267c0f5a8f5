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
