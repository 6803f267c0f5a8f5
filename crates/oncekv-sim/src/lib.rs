//! Deterministic simulation of an oncekv cluster under faults.
//!
//! Three real nodes (the `oncekv-server` code, its log and state files,
//! openraft) and the workload of `oncekv verify` (`oncekv-harness`'s
//! workload, client options and recording proxies) run on a
//! [turmoil](https://docs.rs/turmoil) network in simulated time, injected
//! through the node's listeners and the client's and peers' connectors.
//! A seeded plan crashes and restarts nodes, partitions them, cuts the
//! clients off the leader, drops committed replies, loses a committed
//! reply's connection and then keeps the leader out of the clients'
//! reach, and breaks links at random; then the `oncekv-check` checkers
//! judge the history.
//!
//! * [`net`]: turmoil streams as gRPC connections;
//! * [`plan`]: the seeded fault schedule;
//! * [`run`]: one run, from seed to verdict.

pub mod net;
pub mod plan;
pub mod run;

pub use run::{SimError, SimOptions, SimOutcome, simulate};
