//! Runs oncekv clusters: the node processes, and live fault runs against
//! them (the workload, the fault proxies, the nemesis and the run that
//! ties them together), recording the history that `oncekv-check` judges.
//! `oncekv verify`, the multi-process tests of the `oncekv` package and
//! the simulation (`oncekv-sim`, which runs the workload and proxies over
//! a simulated network) all use it.
//!
//! * [`recorder`]: the run's history, as events stamped in time order;
//! * [`workload`]: clients doing appends, increments, CAS, PUT/GET,
//!   transfers (transactions) and leases, in session mode or as the naive
//!   negative control;
//! * [`etcd_workload`]: the same checks through etcd's v3 API, as etcd's
//!   users write read-modify-write code, with the idempotency metadata or
//!   (the negative control) without;
//! * [`etcd_resources`]: Kubernetes-shaped resources through etcd's API
//!   (kine's create, update, delete and compaction Txns, paged lists);
//! * [`etcd_watch`]: Kubernetes-style watchers through etcd's API (list,
//!   watch from its revision with progress requests, relist when
//!   compacted), and the reference read over etcd's Watch;
//! * [`watchers`]: watchers through the faults, and the reference read
//!   of the committed changes after them;
//! * [`client_proxy`]: a gRPC proxy per node that drops replies after
//!   commit, delays them or resets connections, recording every answer;
//! * [`peer_proxy`]: TCP proxies on the peer links, for partitions;
//! * [`certs`]: a CA, node and client certificates for TLS clusters
//!   (`oncekv_server::certs`, the implementation `oncekv certs` runs);
//! * [`cluster`]: the node processes (start, kill, restart, pause,
//!   resume, exits), the one implementation of them, on loopback or each
//!   on a host of its own;
//! * [`netns`]: hosts as network namespaces on a private bridge (a run's
//!   own, removed with it), the clients' namespace the harness reaches
//!   them from, and the network faults between hosts (links down, cuts);
//! * [`disk`]: a disk of its own for each node's data directory, a
//!   tmpfs in a private mount namespace, for the full-disk fault;
//! * [`nemesis`]: the seeded fault schedule (process, proxy, flood, full
//!   disks and, between namespaces, network faults);
//! * [`membership`]: membership changes as faults (leadership handed
//!   over, learners added and promoted, followers and the leader removed
//!   and watched, members replaced, 3 -> 5 -> 3, rolling restarts),
//!   through etcd's Cluster API, each step waiting on the nodes' status;
//! * [`flood`]: the flood fault (sessions and idempotency keys nobody
//!   uses, sent outside the history);
//! * [`run`]: one run from start to verdict;
//! * [`stalls`]: the write stall clients saw during each fault window
//!   (the longest gap between successful writes, the writes' latency),
//!   from the record, as tables for the report;
//! * [`convert`]: client and wire answers in the history's terms;
//! * [`testing`]: the multi-process tests' view of a cluster (status,
//!   execute, the leader, sessions, bounded waits; failures panic).

pub mod certs;
pub mod client_proxy;
pub mod cluster;
pub mod convert;
pub mod disk;
pub mod etcd_resources;
pub mod etcd_watch;
pub mod etcd_workload;
pub mod flood;
pub mod membership;
pub mod nemesis;
pub mod netns;
pub mod peer_proxy;
pub mod recorder;
pub mod run;
pub mod stalls;
pub mod testing;
pub mod watchers;
pub mod workload;
