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
//! reach, and breaks links at random; and it changes the membership as an
//! operator does, on a fourth host: leadership moved to a follower, a
//! learner added and promoted (caught up from a snapshot), a follower
//! removed, the leader removed, a member replaced by a fresh one, each
//! ending with three voters. Then the `oncekv-check` checkers judge the
//! history, and each membership change must prove it completed.
//!
//! * [`net`]: turmoil streams as gRPC connections;
//! * [`plan`]: the seeded fault schedule;
//! * [`membership`]: the membership changes, made from the client host;
//! * [`run`]: one run, from seed to verdict.

pub mod membership;
pub mod net;
pub mod plan;
pub mod run;

pub use run::{SimError, SimOptions, SimOutcome, simulate};
