//! Membership changes as faults of a simulated run, made while the
//! clients write, the way an operator makes them: through the node's
//! admin API (`AddMember`: a learner, caught up, then a voter;
//! `RemoveMember`, which a leader removing itself answers by handing its
//! leadership over first) and etcd's `MoveLeader`, asked of the leader
//! (the only node that serves it). A new member is a fresh node on a host
//! of its own: [`Hosts`] says which node runs on which host, and the
//! driver starts and stops them between simulation steps when a change
//! asks ([`HostAction`]).
//!
//! Every step waits on what the nodes report in their status (the
//! members the leader lists, a new member's applied index, who leads),
//! polled every [`POLL`] for at most [`STEP_PATIENCE`], and is recorded as
//! a fault window of the history (`other`, or `leader_transfer`), its
//! detail saying what it did. A change keeps what it saw as [`Proof`]s
//! in its [`ChangeReport`]; the run requires the proofs each kind must
//! give, so a change that did not complete leaves the run inconclusive.
//!
//! Every kind ends with three voters: one that adds a member removes
//! one, and one that removes a member adds a fresh one, so the other
//! kinds always find a cluster of three. A removed member that still runs
//! is watched for [`HOLD_OFF_ELECTIONS`] election timeouts: no member may
//! follow it, it may not lead, and the members' term may not rise (a
//! removed follower seldom learns that its removal committed, so it
//! campaigns, and the members must refuse it). What it did wrong is kept
//! in [`ChangeReport::disruptions`], a violation of the run.

use crate::net::SimConnector;
use crate::plan::{SimFault, Window};
use oncekv_check::record::{FaultKind, NodeId};
use oncekv_client::{Client, ClientOptions};
use oncekv_harness::recorder::Recorder;
use oncekv_proto::etcd::etcdserverpb::MoveLeaderRequest;
use oncekv_proto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::{StatusRequest, StatusResponse};
use oncekv_server::sync::lock;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::Channel;

/// How long one step may take (a new member catching up, an election, a
/// membership entry committed and seen by every member).
pub const STEP_PATIENCE: Duration = Duration::from_secs(10);

/// How many of the longest election timeouts a removed member that still
/// runs is watched for.
pub const HOLD_OFF_ELECTIONS: u32 = 3;

/// How often the nodes are asked.
pub const POLL: Duration = Duration::from_millis(100);

/// How long one node gets to answer a status request.
const STATUS_PATIENCE: Duration = Duration::from_millis(300);

/// How long one `MoveLeader` call may take.
const CALL_PATIENCE: Duration = Duration::from_secs(3);

/// How long the driver gets to act on a host (it acts between two steps).
const ACT_PATIENCE: Duration = Duration::from_secs(1);

/// What the driver does to a host between two simulation steps when a
/// change asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostAction {
    /// Starts node `id` on host `host`, on a fresh data directory (it
    /// waits to be added).
    Start {
        /// The host (1-based).
        host: u64,
        /// The new node's id.
        id: NodeId,
    },
    /// Stops the node on `host` at once (its tasks dropped, as in a
    /// crash) and removes its data directory: the host stays empty.
    Stop {
        /// The host (1-based).
        host: u64,
    },
    /// Cuts `host` off from every other node's host (not from the
    /// clients).
    Isolate {
        /// The host (1-based).
        host: u64,
    },
    /// Ends [`HostAction::Isolate`].
    Rejoin {
        /// The host (1-based).
        host: u64,
    },
}

/// Which node runs on which host, and the host actions changes ask for:
/// shared by the driver, the hosts (each reads its node when it starts)
/// and the changes.
#[derive(Debug)]
pub struct Hosts {
    /// The node on each host (index: host - 1), if any.
    occupants: Mutex<Vec<Option<NodeId>>>,
    /// Actions asked and not yet taken, with their tickets.
    asked: Mutex<VecDeque<(u64, HostAction)>>,
    /// The last ticket issued.
    issued: AtomicU64,
    /// The last ticket acted on.
    acted: AtomicU64,
}

impl Hosts {
    /// `count` hosts, the first ones running `nodes` (in order).
    pub fn new(count: u64, nodes: &[NodeId]) -> Arc<Hosts> {
        let occupants = (0..count)
            .map(|index| {
                usize::try_from(index)
                    .ok()
                    .and_then(|i| nodes.get(i).copied())
            })
            .collect();
        Arc::new(Hosts {
            occupants: Mutex::new(occupants),
            asked: Mutex::default(),
            issued: AtomicU64::new(0),
            acted: AtomicU64::new(0),
        })
    }

    /// How many hosts there are.
    pub fn count(&self) -> u64 {
        lock(&self.occupants).len() as u64
    }

    /// The node on `host`, if any.
    pub fn occupant(&self, host: u64) -> Option<NodeId> {
        let index = usize::try_from(host.checked_sub(1)?).ok()?;
        lock(&self.occupants).get(index).copied().flatten()
    }

    /// Puts `node` on `host` (`None`: empties it); the node there before.
    pub fn set_occupant(&self, host: u64, node: Option<NodeId>) -> Option<NodeId> {
        let index = host
            .checked_sub(1)
            .and_then(|index| usize::try_from(index).ok());
        let mut occupants = lock(&self.occupants);
        match index.and_then(|index| occupants.get_mut(index)) {
            Some(slot) => std::mem::replace(slot, node),
            None => None,
        }
    }

    /// The host node `id` runs on.
    pub fn host_of(&self, id: NodeId) -> Option<u64> {
        let index = lock(&self.occupants)
            .iter()
            .position(|occupant| *occupant == Some(id))?;
        u64::try_from(index + 1).ok()
    }

    /// The hosts that run a node, in host order, with their nodes.
    pub fn occupied(&self) -> Vec<(u64, NodeId)> {
        lock(&self.occupants)
            .iter()
            .zip(1..)
            .filter_map(|(occupant, host)| occupant.map(|id| (host, id)))
            .collect()
    }

    /// The actions asked since the last call, for the driver, which calls
    /// [`Hosts::acted`] with each ticket once it took the action.
    pub fn take_asked(&self) -> Vec<(u64, HostAction)> {
        lock(&self.asked).drain(..).collect()
    }

    /// The driver took the action of `ticket`.
    pub fn acted(&self, ticket: u64) {
        self.acted.fetch_max(ticket, Ordering::Relaxed);
    }

    /// Asks the driver for `action` and waits until it is taken (at the
    /// next step), for at most [`ACT_PATIENCE`].
    async fn act(&self, action: HostAction) -> Result<(), ChangeError> {
        let ticket = self.issued.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.asked).push_back((ticket, action));
        let until = Instant::now() + ACT_PATIENCE;
        while self.acted.load(Ordering::Relaxed) < ticket {
            if Instant::now() >= until {
                return Err(ChangeError::Impossible(format!(
                    "{action:?} was not taken within {ACT_PATIENCE:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
}

/// What a change showed: each kind must give some of these
/// (`run::requirements`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proof {
    /// The follower asked to take leadership was seen leading.
    Transferred,
    /// A new member applied what the leader had committed once it was a
    /// voter.
    CaughtUp,
    /// A new member was added while the leader's log no longer held the
    /// entries from index 1 on (its snapshot was further along than the
    /// entries it keeps behind one), so it caught up from a snapshot, and
    /// it holds one.
    FromSnapshot,
    /// The leader and every voter that answers list a new member as a
    /// voter.
    Promoted,
    /// The leader (another node) and every member that answers list the
    /// removed node no more.
    Removed,
    /// Another leader was elected after the leader was removed or stopped.
    Succeeded,
    /// A removed member that still ran was watched for its whole hold-off
    /// (whether it disrupted anything is in
    /// [`ChangeReport::disruptions`]).
    HeldOff,
}

impl Proof {
    /// What it proves, in a sentence's words.
    pub fn describe(self) -> &'static str {
        match self {
            Proof::Transferred => "leadership moved to the follower asked",
            Proof::CaughtUp => "the new member applied what the leader committed",
            Proof::FromSnapshot => "the new member caught up from a snapshot",
            Proof::Promoted => "the new member a voter on every member",
            Proof::Removed => "the removed node out of every member's membership",
            Proof::Succeeded => "another leader elected",
            Proof::HeldOff => "the removed node watched while it still ran",
        }
    }
}

impl fmt::Display for Proof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// How one change went.
#[derive(Clone, Debug, Default)]
pub struct ChangeReport {
    /// The window's index in the plan.
    pub index: usize,
    /// The window.
    pub window: Option<Window>,
    /// What it showed, with what was seen.
    pub proofs: BTreeMap<Proof, String>,
    /// What removed members did that they must not (violations).
    pub disruptions: Vec<String>,
    /// Why it stopped short, if it did.
    pub failure: Option<String>,
    /// Its steps and proofs, one line each, as the fault list shows them.
    pub lines: Vec<String>,
}

/// Why a change did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// A step did not complete within [`STEP_PATIENCE`].
    #[error("{step} did not complete within {STEP_PATIENCE:?}: {last}")]
    Timeout {
        /// The step.
        step: String,
        /// What was last seen.
        last: String,
    },
    /// The step cannot be made in this cluster.
    #[error("{0}")]
    Impossible(String),
}

/// A change the driver orders: the plan's window `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Order {
    /// The window's index in the plan.
    pub index: usize,
    /// The window.
    pub window: Window,
}

/// Orders from the driver to the changes, and their reports back.
#[derive(Debug)]
pub struct Control {
    orders: watch::Sender<Option<Order>>,
    ordered: AtomicU64,
    reports: Mutex<Vec<ChangeReport>>,
}

impl Control {
    /// No order yet.
    pub fn new() -> Arc<Control> {
        Arc::new(Control {
            orders: watch::Sender::new(None),
            ordered: AtomicU64::new(0),
            reports: Mutex::default(),
        })
    }

    /// Orders a change (the driver, one at a time).
    pub fn order(&self, order: Order) {
        self.ordered.fetch_add(1, Ordering::Relaxed);
        self.orders.send_replace(Some(order));
    }

    /// Whether the change of window `index` was reported.
    pub fn finished(&self, index: usize) -> bool {
        lock(&self.reports).iter().any(|r| r.index == index)
    }

    /// Whether every change ordered was reported.
    pub fn idle(&self) -> bool {
        lock(&self.reports).len() as u64 >= self.ordered.load(Ordering::Relaxed)
    }

    /// The reports so far.
    pub fn reports(&self) -> Vec<ChangeReport> {
        lock(&self.reports).clone()
    }
}

/// One node's status.
#[derive(Clone, Debug)]
struct View {
    host: u64,
    status: StatusResponse,
}

impl View {
    /// Whether it lists `id`, and as a voter.
    fn lists(&self, id: NodeId) -> Option<bool> {
        self.status
            .members
            .iter()
            .find(|member| member.id == id)
            .map(|member| member.voter)
    }

    /// The voters it lists.
    fn voters(&self) -> Vec<NodeId> {
        self.status
            .members
            .iter()
            .filter(|member| member.voter)
            .map(|member| member.id)
            .collect()
    }
}

/// The node that says it leads, at the highest term.
fn leader_of(views: &[View]) -> Option<&View> {
    views
        .iter()
        .filter(|view| view.status.is_leader)
        .max_by_key(|view| view.status.term)
}

/// A deadline for one step.
struct Step {
    what: String,
    until: Instant,
    last: String,
}

impl Step {
    fn new(what: impl Into<String>) -> Step {
        Step {
            what: what.into(),
            until: Instant::now() + STEP_PATIENCE,
            last: "nothing yet".into(),
        }
    }

    /// Waits a poll; the step's failure once its time is up.
    async fn again(&self) -> Result<(), ChangeError> {
        if Instant::now() >= self.until {
            return Err(ChangeError::Timeout {
                step: self.what.clone(),
                last: self.last.clone(),
            });
        }
        tokio::time::sleep(POLL).await;
        Ok(())
    }
}

/// How the changes reach the cluster.
#[derive(Debug)]
pub struct Setup {
    /// Each host's client address (index: host - 1).
    pub client_addresses: Vec<String>,
    /// Each host's peer address (index: host - 1).
    pub peer_addresses: Vec<String>,
    /// The simulated network.
    pub connector: SimConnector,
    /// Options of the admin client (its connector is `connector`).
    pub client_options: ClientOptions,
    /// Which node runs where.
    pub hosts: Arc<Hosts>,
    /// Where steps are recorded.
    pub recorder: Arc<Recorder>,
    /// When the workload started, in simulated time.
    pub started: Duration,
    /// Seeds the changes' choices.
    pub seed: u64,
    /// The nodes' longest election timeout.
    pub election_timeout: Duration,
    /// The entries a node keeps in its log behind a snapshot.
    pub log_kept: u64,
    /// The id the first new member gets (then the next ones).
    pub first_new_id: NodeId,
}

/// Makes the changes the driver orders, one at a time.
#[derive(Debug)]
pub struct Changes {
    setup: Setup,
    admin: Client,
    channels: Mutex<BTreeMap<u64, Channel>>,
    next_id: NodeId,
}

impl Changes {
    /// Ready to change `setup`'s cluster.
    pub fn new(setup: Setup) -> Result<Changes, oncekv_client::ClientError> {
        let admin = Client::connect(setup.client_addresses.clone(), setup.client_options.clone())?;
        let next_id = setup.first_new_id;
        Ok(Changes {
            setup,
            admin,
            channels: Mutex::default(),
            next_id,
        })
    }

    /// Makes each change ordered through `control` and reports it, until
    /// the orders end.
    pub async fn serve(mut self, control: Arc<Control>) {
        let mut orders = control.orders.subscribe();
        while orders.changed().await.is_ok() {
            let order = *orders.borrow_and_update();
            if let Some(order) = order {
                let report = self.make(order).await;
                lock(&control.reports).push(report);
            }
        }
    }

    /// Makes the change of `order`.
    async fn make(&mut self, order: Order) -> ChangeReport {
        let mut change = Change {
            report: ChangeReport {
                index: order.index,
                window: Some(order.window),
                ..ChangeReport::default()
            },
            rng: StdRng::seed_from_u64(
                self.setup.seed ^ (order.index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
            window: order.window,
        };
        let made = match order.window.fault {
            SimFault::TransferLeader => self.transfer(&mut change).await,
            SimFault::AddLearner => self.add_learner(&mut change).await,
            SimFault::RemoveFollower => self.remove_follower(&mut change).await,
            SimFault::RemoveLeader => self.remove_leader(&mut change).await,
            SimFault::Replace => self.replace(&mut change).await,
            other => Err(ChangeError::Impossible(format!(
                "{other} is not a membership change"
            ))),
        };
        if let Err(error) = made {
            let line = format!(
                "{:>6.1}s       {}: NOT COMPLETED: {error}",
                self.now().as_secs_f64(),
                order.window.fault
            );
            change.report.lines.push(line);
            change.report.failure = Some(error.to_string());
        }
        change.report
    }

    /// Simulated time since the workload started.
    fn now(&self) -> Duration {
        turmoil::sim_elapsed()
            .unwrap_or_default()
            .saturating_sub(self.setup.started)
    }

    /// A channel to `host`'s client port.
    fn channel(&self, host: u64) -> Option<Channel> {
        let mut channels = lock(&self.channels);
        if let Some(channel) = channels.get(&host) {
            return Some(channel.clone());
        }
        let address = self.client_address(host)?;
        let channel = self.setup.connector.channel_to(&address).ok()?;
        channels.insert(host, channel.clone());
        Some(channel)
    }

    fn client_address(&self, host: u64) -> Option<String> {
        let index = usize::try_from(host.checked_sub(1)?).ok()?;
        self.setup.client_addresses.get(index).cloned()
    }

    fn peer_address(&self, host: u64) -> Option<String> {
        let index = usize::try_from(host.checked_sub(1)?).ok()?;
        self.setup.peer_addresses.get(index).cloned()
    }

    /// The status of `host`'s node, if it answers in time.
    async fn status(&self, host: u64) -> Option<StatusResponse> {
        let channel = self.channel(host)?;
        let mut request = tonic::Request::new(StatusRequest {});
        request.set_timeout(STATUS_PATIENCE);
        let mut client = KvClient::new(channel);
        match tokio::time::timeout(STATUS_PATIENCE, client.status(request)).await {
            Ok(Ok(status)) => Some(status.into_inner()),
            _ => None,
        }
    }

    /// Every host's status, asked at once (those that answer).
    async fn views(&self) -> Vec<View> {
        let hosts = 1..=self.setup.hosts.count();
        let asked = hosts
            .map(|host| async move { self.status(host).await.map(|status| View { host, status }) });
        futures_util::future::join_all(asked)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Waits for a leader other than `except`; its view.
    async fn wait_leader(&self, except: Option<NodeId>) -> Result<View, ChangeError> {
        let mut step = Step::new("a leader elected");
        loop {
            let views = self.views().await;
            match leader_of(&views) {
                Some(leader) if Some(leader.status.id) != except => return Ok(leader.clone()),
                Some(leader) => {
                    step.last = format!(
                        "node {} leads, in term {}",
                        leader.status.id, leader.status.term
                    );
                }
                None => step.last = format!("{} node(s) answered, none leading", views.len()),
            }
            step.again().await?;
        }
    }

    /// Waits until the leader (not `except`) and every member that answers
    /// (not `except`) pass `check`, and more than half the voters answer.
    async fn visible(
        &self,
        what: &str,
        check: impl Fn(&View) -> bool,
        except: Option<NodeId>,
    ) -> Result<View, ChangeError> {
        let mut step = Step::new(what);
        loop {
            let views: Vec<View> = self
                .views()
                .await
                .into_iter()
                .filter(|view| Some(view.status.id) != except)
                .collect();
            if let Some(leader) = leader_of(&views) {
                let voters = leader.voters();
                let lagging: Vec<NodeId> = views
                    .iter()
                    .filter(|view| voters.contains(&view.status.id) && !check(view))
                    .map(|view| view.status.id)
                    .collect();
                let answered = views
                    .iter()
                    .filter(|view| voters.contains(&view.status.id))
                    .count();
                if check(leader) && lagging.is_empty() && answered > voters.len() / 2 {
                    return Ok(leader.clone());
                }
                step.last = format!("leader {}, not yet seen by {lagging:?}", leader.status.id);
            } else {
                step.last = "no leader".into();
            }
            step.again().await?;
        }
    }

    /// Records `detail` as a fault window of `kind` on `target` around
    /// `step`, and as a line of the change.
    async fn recorded<T>(
        &self,
        change: &mut Change,
        kind: FaultKind,
        target: NodeId,
        detail: String,
        step: impl Future<Output = Result<T, ChangeError>>,
    ) -> Result<T, ChangeError> {
        let began = self.now();
        let id = self
            .setup
            .recorder
            .fault_started(kind, Some(target), Some(detail.clone()));
        let result = step.await;
        self.setup.recorder.fault_ended(id);
        let took = self.now().saturating_sub(began);
        change.report.lines.push(format!(
            "{:>6.1}s +{:.1}s {detail}",
            began.as_secs_f64(),
            took.as_secs_f64()
        ));
        result
    }

    /// Keeps `proof`, with what was seen, as a line of the change too.
    fn proved(&self, change: &mut Change, proof: Proof, seen: String) {
        change.report.lines.push(format!(
            "{:>6.1}s       proved: {proof}: {seen}",
            self.now().as_secs_f64()
        ));
        change.report.proofs.insert(proof, seen);
    }

    /// The `pick`-th (1-based, cyclic) of `ids`.
    fn pick(ids: &[NodeId], pick: u64) -> Option<NodeId> {
        let count = u64::try_from(ids.len()).ok().filter(|count| *count > 0)?;
        let index = usize::try_from(pick.saturating_sub(1) % count).ok()?;
        ids.get(index).copied()
    }

    /// The leader's followers among the voters, other than `spare`.
    fn followers(leader: &View, spare: Option<NodeId>) -> Vec<NodeId> {
        leader
            .voters()
            .into_iter()
            .filter(|&id| id != leader.status.id && Some(id) != spare)
            .collect()
    }

    /// A host no node runs on, drawn by `change`.
    fn free_host(&self, change: &mut Change) -> Result<u64, ChangeError> {
        let occupied: BTreeSet<u64> = self
            .setup
            .hosts
            .occupied()
            .into_iter()
            .map(|(host, _)| host)
            .collect();
        let free: Vec<u64> = (1..=self.setup.hosts.count())
            .filter(|host| !occupied.contains(host))
            .collect();
        let count = free.len();
        if count == 0 {
            return Err(ChangeError::Impossible(
                "no free host for a new member".into(),
            ));
        }
        Ok(free[change.rng.random_range(0..count)])
    }

    fn host_of(&self, id: NodeId) -> Result<u64, ChangeError> {
        self.setup
            .hosts
            .host_of(id)
            .ok_or_else(|| ChangeError::Impossible(format!("node {id} runs on no host")))
    }

    /// Moves leadership to a follower (`MoveLeader` on the leader) and
    /// waits until the nodes report it leading.
    async fn transfer(&mut self, change: &mut Change) -> Result<(), ChangeError> {
        let leader = self.wait_leader(None).await?;
        let from = leader.status.id;
        let Some(target) = Self::pick(&Self::followers(&leader, None), change.window.node) else {
            return Err(ChangeError::Impossible(
                "no follower to hand leadership to".into(),
            ));
        };
        let detail =
            format!("transfer-leader: leadership from node {from} to node {target} (MoveLeader)");
        let seen = self
            .recorded(change, FaultKind::LeaderTransfer, target, detail, async {
                let mut step = Step::new(format!("node {target} leading"));
                let mut asked: Option<Instant> = None;
                loop {
                    let views = self.views().await;
                    let now = leader_of(&views);
                    if let Some(now) = now
                        && now.status.id == target
                    {
                        return Ok(format!(
                            "node {target} leads in term {} (node {from} led in term {})",
                            now.status.term, leader.status.term
                        ));
                    }
                    // Ask (again) every two seconds, of whoever leads.
                    if asked.is_none_or(|at| at.elapsed() > Duration::from_secs(2))
                        && let Some(channel) = now.and_then(|now| self.channel(now.host))
                    {
                        asked = Some(Instant::now());
                        let mut request =
                            tonic::Request::new(MoveLeaderRequest { target_id: target });
                        request.set_timeout(CALL_PATIENCE);
                        if let Err(status) =
                            MaintenanceClient::new(channel).move_leader(request).await
                        {
                            step.last = format!("MoveLeader: {}", status.message());
                        }
                    }
                    step.again().await?;
                }
            })
            .await?;
        self.proved(change, Proof::Transferred, seen);
        Ok(())
    }

    /// Adds a fresh node on `host` (started first, then `AddMember`: a
    /// learner, caught up, then a voter) and waits until every voter lists
    /// it and it applied what the leader committed. With `from_snapshot`,
    /// first waits until the leader's log no longer starts at index 1.
    async fn add(
        &mut self,
        change: &mut Change,
        host: u64,
        from_snapshot: bool,
    ) -> Result<NodeId, ChangeError> {
        let kind = change.window.fault;
        let kept = self.setup.log_kept;
        if from_snapshot {
            let detail = format!(
                "{kind}: waiting until the leader's snapshot is further along than the {kept} \
                 entries it keeps behind one"
            );
            let leader = self.wait_leader(None).await?.status.id;
            self.recorded(change, FaultKind::Other, leader, detail, async {
                let mut step = Step::new("the leader's log compacted behind a snapshot");
                loop {
                    let leader = self.wait_leader(None).await?;
                    let snapshot = leader.status.snapshot_index.unwrap_or(0);
                    if snapshot > kept {
                        return Ok(());
                    }
                    step.last = format!("node {} holds a snapshot at {snapshot}", leader.status.id);
                    step.again().await?;
                }
            })
            .await?;
        }
        let id = self.next_id;
        self.next_id += 1;
        let (Some(peer), Some(client)) = (self.peer_address(host), self.client_address(host))
        else {
            return Err(ChangeError::Impossible(format!("no host {host}")));
        };
        let leader = self.wait_leader(None).await?;
        let snapshot = leader.status.snapshot_index.unwrap_or(0);
        let from = if snapshot > kept {
            format!(
                "from the leader's snapshot (at index {snapshot}; its log starts after index {})",
                snapshot - kept
            )
        } else {
            "from the leader's log".to_string()
        };
        let detail = format!(
            "{kind}: node {id} started fresh on n{host}, added (AddMember: a learner, caught up \
             {from}, then a voter)"
        );
        let admin = self.admin.clone();
        let promoted = self
            .recorded(change, FaultKind::Other, id, detail, async {
                self.setup.hosts.act(HostAction::Start { host, id }).await?;
                let mut step = Step::new(format!("node {id} added"));
                let mut learner = false;
                loop {
                    match admin.add_member(id, &peer, &client).await {
                        Ok(members) if members.iter().any(|m| m.id == id && m.voter) => break,
                        Ok(_) => step.last = format!("node {id} not yet listed as a voter"),
                        Err(error) => step.last = format!("AddMember: {error}"),
                    }
                    // Added by a call whose answer was lost?
                    let views = self.views().await;
                    if let Some(leader) = leader_of(&views) {
                        match leader.lists(id) {
                            Some(true) => break,
                            Some(false) => learner = true,
                            None => {}
                        }
                    }
                    step.again().await?;
                }
                let leader = self
                    .visible(
                        &format!("node {id} a voter on every member"),
                        |view| view.lists(id) == Some(true),
                        None,
                    )
                    .await?;
                Ok((leader, learner))
            })
            .await?;
        let (leader, learner) = promoted;
        let voters = leader.voters();
        self.proved(
            change,
            Proof::Promoted,
            format!(
                "leader {} lists voters {voters:?}{}",
                leader.status.id,
                if learner {
                    " (node seen listed as a learner first)"
                } else {
                    ""
                }
            ),
        );
        let committed = leader.status.commit_index.unwrap_or(0);
        let mut step = Step::new(format!("node {id} caught up to index {committed}"));
        let caught_up = loop {
            if let Some(status) = self.status(host).await {
                let applied = status.applied_index.unwrap_or(0);
                if status.id == id && applied >= committed {
                    break status;
                }
                step.last = format!("applied {applied} of {committed}");
            }
            step.again().await?;
        };
        let holding = caught_up.snapshot_index.map_or_else(
            || "no snapshot".to_string(),
            |index| format!("a snapshot at index {index}"),
        );
        self.proved(
            change,
            Proof::CaughtUp,
            format!(
                "node {id} applied index {} (leader {} had committed {committed}), holding \
                 {holding}",
                caught_up.applied_index.unwrap_or(0),
                leader.status.id
            ),
        );
        if snapshot > kept && caught_up.snapshot_index.is_some() {
            self.proved(
                change,
                Proof::FromSnapshot,
                format!(
                    "the leader's log started after index {} when node {id} was added; node {id} \
                     holds {holding}",
                    snapshot - kept
                ),
            );
        }
        Ok(id)
    }

    /// `RemoveMember` of `id`, asked again until a leader other than it no
    /// longer lists it; then waits until no member does. `why` says how it
    /// was chosen.
    async fn remove(
        &mut self,
        change: &mut Change,
        id: NodeId,
        why: &str,
    ) -> Result<View, ChangeError> {
        let kind = change.window.fault;
        let detail = format!("{kind}: node {id} removed (RemoveMember){why}");
        let admin = self.admin.clone();
        let leader = self
            .recorded(change, FaultKind::Other, id, detail, async {
                let mut step = Step::new(format!("node {id} removed"));
                loop {
                    let views = self.views().await;
                    let leader = leader_of(&views);
                    if let Some(leader) = leader
                        && leader.status.id != id
                        && leader.lists(id).is_none()
                    {
                        break;
                    }
                    step.last = match leader {
                        Some(leader) => format!("leader {}", leader.status.id),
                        None => "no leader".into(),
                    };
                    if leader.is_some_and(|leader| leader.lists(id).is_some())
                        && let Err(error) = admin.remove_member(id).await
                    {
                        step.last = format!("RemoveMember: {error}");
                    }
                    step.again().await?;
                }
                self.visible(
                    &format!("node {id} gone from every member"),
                    |view| view.lists(id).is_none(),
                    Some(id),
                )
                .await
            })
            .await?;
        self.proved(
            change,
            Proof::Removed,
            format!(
                "leader {} (term {}) lists voters {:?}, and no member that answers lists node {id}",
                leader.status.id,
                leader.status.term,
                leader.voters()
            ),
        );
        Ok(leader)
    }

    /// Watches removed node `removed` (on `host`), which still runs, for
    /// [`HOLD_OFF_ELECTIONS`] election timeouts, then stops it and removes
    /// its data. What it did wrong goes to the report's disruptions.
    async fn hold_off(
        &mut self,
        change: &mut Change,
        removed: NodeId,
        host: u64,
    ) -> Result<(), ChangeError> {
        let kind = change.window.fault;
        // A member that has not heard from the new leader yet may still
        // name the removed one: wait until each names another.
        let leader = self
            .visible(
                &format!("every member following a leader other than node {removed}"),
                |view| {
                    view.status
                        .leader_id
                        .is_some_and(|leader| leader != removed)
                },
                Some(removed),
            )
            .await?;
        let window = self.setup.election_timeout * HOLD_OFF_ELECTIONS;
        let detail = format!(
            "{kind}: removed node {removed} still runs on n{host}: watched for {window:?} (no \
             member may follow it, it may not lead, the members' term may not rise), then stopped \
             and its data removed"
        );
        let base_term = leader.status.term;
        let (seen, disruptions) = self
            .recorded(change, FaultKind::Other, removed, detail, async {
                let began = Instant::now();
                let mut disruptions = Vec::new();
                let mut removed_terms: Option<(u64, u64)> = None;
                let mut member_terms: Option<(u64, u64)> = None;
                let mut leaders = BTreeSet::new();
                let mut asked = 0u32;
                while began.elapsed() < window {
                    asked += 1;
                    for view in self.views().await {
                        let term = view.status.term;
                        let id = view.status.id;
                        if id == removed {
                            if view.status.is_leader {
                                disruptions.push(format!(
                                    "removed node {removed} says it leads, in term {term}"
                                ));
                            }
                            removed_terms = Some(
                                removed_terms
                                    .map_or((term, term), |(a, b)| (a.min(term), b.max(term))),
                            );
                            continue;
                        }
                        if view.status.leader_id == Some(removed) {
                            disruptions.push(format!(
                                "member {id} follows removed node {removed}, in term {term}"
                            ));
                        }
                        if term > base_term {
                            disruptions.push(format!(
                                "member {id} went from term {base_term} to {term} while removed \
                                 node {removed} ran"
                            ));
                        }
                        if let Some(leader) = view.status.leader_id {
                            leaders.insert(leader);
                        }
                        member_terms = Some(
                            member_terms.map_or((term, term), |(a, b)| (a.min(term), b.max(term))),
                        );
                    }
                    if !disruptions.is_empty() {
                        break;
                    }
                    tokio::time::sleep(POLL).await;
                }
                self.setup.hosts.act(HostAction::Stop { host }).await?;
                let span = |terms: Option<(u64, u64)>| match terms {
                    Some((low, high)) if low == high => format!("term {low}"),
                    Some((low, high)) => format!("terms {low} to {high}"),
                    None => "no answer".to_string(),
                };
                let campaigned = match (removed_terms, member_terms) {
                    (Some((low, high)), Some((_, members))) if high > low && high > members => {
                        ", it campaigned and was refused"
                    }
                    _ => "",
                };
                let seen = format!(
                    "watched {asked} times over {window:?}: removed node {removed} at {}{campaigned}; \
                     members at {}, leaders {leaders:?}",
                    span(removed_terms),
                    span(member_terms),
                );
                Ok((seen, disruptions))
            })
            .await?;
        if disruptions.is_empty() {
            self.proved(change, Proof::HeldOff, seen);
        } else {
            for disruption in &disruptions {
                change.report.lines.push(format!(
                    "{:>6.1}s       DISRUPTED: {disruption}",
                    self.now().as_secs_f64()
                ));
            }
            change.report.disruptions.extend(disruptions);
        }
        Ok(())
    }

    /// Adds a fresh node on the free host (caught up from the leader's
    /// snapshot), then removes a follower (not the new node) and, after
    /// watching it, stops it: three voters again.
    async fn add_learner(&mut self, change: &mut Change) -> Result<(), ChangeError> {
        let host = self.free_host(change)?;
        let added = self.add(change, host, true).await?;
        let leader = self.wait_leader(None).await?;
        let Some(target) = Self::pick(&Self::followers(&leader, Some(added)), change.window.node)
        else {
            return Err(ChangeError::Impossible("no follower to remove".into()));
        };
        let target_host = self.host_of(target)?;
        self.remove(change, target, ", back to three voters")
            .await?;
        self.hold_off(change, target, target_host).await
    }

    /// Removes a follower cut off from the other members first (so it
    /// misses its removal), lets it back, watches it, stops it, and adds a
    /// fresh node on its host.
    async fn remove_follower(&mut self, change: &mut Change) -> Result<(), ChangeError> {
        let leader = self.wait_leader(None).await?;
        let Some(target) = Self::pick(&Self::followers(&leader, None), change.window.node) else {
            return Err(ChangeError::Impossible("no follower to remove".into()));
        };
        let host = self.host_of(target)?;
        self.setup.hosts.act(HostAction::Isolate { host }).await?;
        let removed = self
            .remove(
                change,
                target,
                ", cut off from the other members first so it misses its removal",
            )
            .await;
        self.setup.hosts.act(HostAction::Rejoin { host }).await?;
        removed?;
        self.hold_off(change, target, host).await?;
        self.add(change, host, false).await.map(|_| ())
    }

    /// Removes the leader (it hands leadership over first), watches it,
    /// stops it, and adds a fresh node on a free host.
    async fn remove_leader(&mut self, change: &mut Change) -> Result<(), ChangeError> {
        let leader = self.wait_leader(None).await?;
        let target = leader.status.id;
        let host = self.host_of(target)?;
        let after = self
            .remove(
                change,
                target,
                ", the leader: it hands leadership over first",
            )
            .await?;
        self.proved(
            change,
            Proof::Succeeded,
            format!(
                "node {} leads in term {} (node {target} led in term {})",
                after.status.id, after.status.term, leader.status.term
            ),
        );
        self.hold_off(change, target, host).await?;
        let free = self.free_host(change)?;
        self.add(change, free, false).await.map(|_| ())
    }

    /// Replaces a member (the leader, if the window hits it): stops it at
    /// once and removes its data, removes it, and adds a fresh node on
    /// its host.
    async fn replace(&mut self, change: &mut Change) -> Result<(), ChangeError> {
        let leader = self.wait_leader(None).await?;
        let target = if change.window.on_leader {
            leader.status.id
        } else {
            Self::pick(&Self::followers(&leader, None), change.window.node)
                .unwrap_or(leader.status.id)
        };
        let led = target == leader.status.id;
        let host = self.host_of(target)?;
        let detail = format!(
            "replace: node {target}{} on n{host} stopped at once, its data removed",
            if led { " (the leader)" } else { "" }
        );
        let successor = self
            .recorded(change, FaultKind::Other, target, detail, async {
                self.setup.hosts.act(HostAction::Stop { host }).await?;
                if led {
                    self.wait_leader(Some(target)).await.map(Some)
                } else {
                    Ok(None)
                }
            })
            .await?;
        if let Some(successor) = successor {
            self.proved(
                change,
                Proof::Succeeded,
                format!(
                    "node {} leads in term {} (node {target} led in term {})",
                    successor.status.id, successor.status.term, leader.status.term
                ),
            );
        }
        self.remove(change, target, ", after it was stopped")
            .await?;
        self.add(change, host, false).await.map(|_| ())
    }
}

/// One change being made: its report so far, and its random draws.
struct Change {
    report: ChangeReport,
    rng: StdRng,
    window: Window,
}
