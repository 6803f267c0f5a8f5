//! The multi-process test harness ([`oncekv_harness::testing`]), with its
//! clusters started from the workspace's `oncekv` binary
//! ([`oncekv_harness::testing::oncekv_binary`]: this package has none).

#![allow(dead_code, unused_imports)]

pub use oncekv_harness::cluster::Cluster;
pub use oncekv_harness::testing::{
    Dependency, FAST, eventually, exclusive, missing_dependency, oncekv_binary,
};

/// Starts `size` nodes of `oncekv` with extra `serve` flags.
pub fn start(size: u64, extra: &[&str]) -> Cluster {
    oncekv_harness::testing::start(oncekv_binary(), size, extra)
}

/// Starts `size` nodes of `oncekv` with extra `serve` flags and TLS on
/// both ports (client certificates required if `client_certificates`).
pub fn start_tls(size: u64, extra: &[&str], client_certificates: bool) -> Cluster {
    oncekv_harness::testing::start_tls(oncekv_binary(), size, extra, client_certificates)
}
