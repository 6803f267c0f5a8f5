//! Membership changes as faults of a run ([`Changes`]), made while the
//! clients write, the way an operator makes them: through etcd's Cluster
//! API (MemberAdd of a learner, MemberPromote, MemberRemove) and
//! Maintenance's MoveLeader, with each new node started by the cluster
//! ([`Cluster::join`]) at a slot whose addresses the clients' proxies
//! already front. Every step waits on what the nodes report in their
//! status (a learner's applied index reaching the leader's commit index,
//! the members each node lists, the leader), for at most
//! [`STEP_PATIENCE`], and is recorded as a fault window of its own
//! (`other` for membership, `leader_transfer`, `restart`), its detail
//! saying what it did; a step that does not complete in time is a
//! failure of the nemesis ([`ChangeError`]).
//!
//! Every kind ends with as many voters as it began with (the run's
//! `--nodes`): a kind that grows the cluster shrinks it back, and one
//! that removes a member adds a fresh one. A removed member is watched
//! while it still runs, for [`HOLD_OFF_ELECTIONS`] election timeouts: no
//! member may follow it and it may not lead; then it is stopped and its
//! data removed. What it did wrong is kept in [`Changes::disruptions`] (a
//! violation, for the verdict), and the change goes on. A removed
//! follower seldom learns that its removal committed (the leader stops
//! replicating to it as soon as it appends the entry that drops it), so
//! it campaigns, and the members must refuse it; the first removed
//! follower of a run (then one in two) is cut off from the others before
//! its removal, so it surely misses it. A rolling restart stops each
//! member with SIGTERM and kills it if it has not exited after
//! [`TERM_PATIENCE`], saying so on the timeline.

use crate::client_proxy::ClientProxy;
use crate::cluster::Cluster;
use crate::nemesis::Fault;
use crate::recorder::Recorder;
use oncekv_check::record::{FaultKind, NodeId};
use oncekv_proto::etcd::etcdserverpb::cluster_client::ClusterClient;
use oncekv_proto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcd::etcdserverpb::{
    MemberAddRequest, MemberPromoteRequest, MemberRemoveRequest, MoveLeaderRequest,
};
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::{StatusRequest, StatusResponse};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

/// How long one step may take (a learner catching up under load, an
/// election, a membership entry committed and seen by every member).
pub const STEP_PATIENCE: Duration = Duration::from_secs(30);

/// How many election timeouts a removed member that still runs is
/// watched for.
pub const HOLD_OFF_ELECTIONS: u32 = 8;

/// How long a node asked to stop (SIGTERM) gets before it is killed.
pub const TERM_PATIENCE: Duration = Duration::from_secs(10);

/// How often the nodes are asked.
const POLL: Duration = Duration::from_millis(100);

/// How long one node gets to answer a status request.
const STATUS_PATIENCE: Duration = Duration::from_secs(1);

/// How long one membership call may take.
const CALL_PATIENCE: Duration = Duration::from_secs(10);

/// How many entries a node keeps behind its snapshot (the run's
/// `--log-entries-kept`): a leader whose snapshot is further along than
/// this has purged the start of its log, so a new node catches up from
/// the snapshot.
pub const LOG_ENTRIES_KEPT: u64 = 100;

/// Why a membership change did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// A step did not complete within [`STEP_PATIENCE`].
    #[error("{kind}: {step} did not complete within {patience:?}: {last}")]
    Timeout {
        /// The kind.
        kind: Fault,
        /// The step.
        step: String,
        /// How long it was given.
        patience: Duration,
        /// What was last seen.
        last: String,
    },
    /// A removed member disrupted the cluster.
    #[error("{kind}: removed node {removed} disrupted the cluster: {what}")]
    Disrupted {
        /// The kind.
        kind: Fault,
        /// The removed node.
        removed: NodeId,
        /// What was seen.
        what: String,
    },
    /// The step cannot be made in this cluster.
    #[error("{kind}: {why}")]
    Impossible {
        /// The kind.
        kind: Fault,
        /// Why.
        why: String,
    },
}

/// The membership kinds of fault: what [`Changes::make`] does.
pub const KINDS: [Fault; 7] = [
    Fault::Transfer,
    Fault::Learner,
    Fault::RemoveFollower,
    Fault::RemoveLeader,
    Fault::Replace,
    Fault::GrowShrink,
    Fault::RollingRestart,
];

/// What the membership changes work on.
#[derive(Debug)]
pub struct Changes<'a> {
    /// The cluster's processes.
    pub cluster: &'a Arc<Mutex<Cluster>>,
    /// The client proxies (told which node is behind them).
    pub proxies: &'a [ClientProxy],
    /// Where the steps are recorded.
    pub recorder: &'a Recorder,
    /// The nodes' minimum election timeout.
    pub election_timeout: Duration,
    /// What removed members did that they must not (a violation of the
    /// run, not a failure to make it): the kind goes on after one.
    pub disruptions: &'a Mutex<Vec<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A lazily connected channel to `address`.
fn channel(address: &str) -> Option<Channel> {
    Some(
        Endpoint::from_shared(format!("http://{address}"))
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .connect_lazy(),
    )
}

/// The status of the node at `address`, if it answers in time.
async fn status(address: &str) -> Option<StatusResponse> {
    let ask = async {
        let mut client = KvClient::new(channel(address)?);
        let mut request = tonic::Request::new(StatusRequest {});
        request.set_timeout(STATUS_PATIENCE);
        client.status(request).await.ok().map(|r| r.into_inner())
    };
    tokio::time::timeout(STATUS_PATIENCE, ask)
        .await
        .ok()
        .flatten()
}

fn with_timeout<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_PATIENCE);
    request
}

/// One node's view, as its status gives it.
#[derive(Clone, Debug)]
struct View {
    id: NodeId,
    status: StatusResponse,
}

impl View {
    fn lists(&self, id: NodeId) -> Option<bool> {
        self.status
            .members
            .iter()
            .find(|member| member.id == id)
            .map(|member| member.voter)
    }
}

/// A deadline for one step.
struct Step {
    kind: Fault,
    what: String,
    until: Instant,
    last: String,
}

impl Step {
    fn new(kind: Fault, what: impl Into<String>) -> Step {
        Step {
            kind,
            what: what.into(),
            until: Instant::now() + STEP_PATIENCE,
            last: "nothing yet".into(),
        }
    }

    /// Waits a poll; the step's failure once its time is up.
    async fn again(&self) -> Result<(), ChangeError> {
        if Instant::now() >= self.until {
            return Err(ChangeError::Timeout {
                kind: self.kind,
                step: self.what.clone(),
                patience: STEP_PATIENCE,
                last: self.last.clone(),
            });
        }
        tokio::time::sleep(POLL).await;
        Ok(())
    }
}

impl Changes<'_> {
    /// Makes one membership change of kind `kind` (one of [`KINDS`]),
    /// drawing its choices from `rng`; `first` is whether it is the first
    /// of its kind in the run.
    pub async fn make(
        &self,
        kind: Fault,
        first: bool,
        rng: &mut StdRng,
    ) -> Result<(), ChangeError> {
        match kind {
            Fault::Transfer => self.transfer(rng).await,
            Fault::Learner => {
                let added = self.grow(kind, rng).await?;
                self.remove_follower(kind, false, Some(added), rng).await
            }
            Fault::RemoveFollower => {
                let isolated = first || rng.random_bool(0.5);
                self.remove_follower(kind, isolated, None, rng).await?;
                self.grow(kind, rng).await.map(|_| ())
            }
            Fault::RemoveLeader => {
                self.remove_leader(rng).await?;
                self.grow(kind, rng).await.map(|_| ())
            }
            Fault::Replace => self.replace(first, rng).await,
            Fault::GrowShrink => {
                self.grow(kind, rng).await?;
                self.grow(kind, rng).await?;
                self.remove_follower(kind, false, None, rng).await?;
                self.remove_follower(kind, false, None, rng).await
            }
            Fault::RollingRestart => self.rolling_restart().await,
            _ => Err(ChangeError::Impossible {
                kind,
                why: "not a membership change".into(),
            }),
        }
    }

    /// The nodes of the cluster: id and client address.
    fn nodes(&self) -> Vec<(NodeId, String)> {
        lock(self.cluster)
            .nodes
            .iter()
            .map(|node| (node.id, node.client.clone()))
            .collect()
    }

    /// Every node's status, asked at once (those that answer).
    async fn views(&self) -> Vec<View> {
        let mut asked = tokio::task::JoinSet::new();
        for (id, address) in self.nodes() {
            asked.spawn(async move { status(&address).await.map(|status| View { id, status }) });
        }
        let mut views = Vec::new();
        while let Some(answer) = asked.join_next().await {
            if let Ok(Some(view)) = answer {
                views.push(view);
            }
        }
        views.sort_by_key(|view| view.id);
        views
    }

    /// The node that says it leads, at the highest term, and its view.
    fn leader_of(views: &[View]) -> Option<&View> {
        views
            .iter()
            .filter(|view| view.status.is_leader)
            .max_by_key(|view| view.status.term)
    }

    /// The client address of node `id`, if it is one of the cluster's.
    fn address_of(&self, id: NodeId) -> Option<String> {
        self.nodes()
            .into_iter()
            .find(|(node, _)| *node == id)
            .map(|(_, address)| address)
    }

    /// Waits for a leader; its view.
    async fn wait_leader(&self, kind: Fault, except: Option<NodeId>) -> Result<View, ChangeError> {
        let mut step = Step::new(kind, "a leader elected");
        loop {
            let views = self.views().await;
            match Self::leader_of(&views) {
                Some(leader) if Some(leader.id) != except => return Ok(leader.clone()),
                Some(leader) => {
                    step.last = format!("node {} leads, in term {}", leader.id, leader.status.term);
                }
                None => step.last = format!("{} node(s) answered, none leading", views.len()),
            }
            step.again().await?;
        }
    }

    /// The voters the leader lists.
    fn voters(leader: &View) -> Vec<NodeId> {
        leader
            .status
            .members
            .iter()
            .filter(|member| member.voter)
            .map(|member| member.id)
            .collect()
    }

    /// Records a step's window around `step`.
    async fn recorded<T, F>(
        &self,
        kind: FaultKind,
        target: NodeId,
        detail: String,
        step: F,
    ) -> Result<T, ChangeError>
    where
        F: std::future::Future<Output = Result<T, ChangeError>>,
    {
        let id = self
            .recorder
            .fault_started(kind, Some(target), Some(detail));
        let result = step.await;
        self.recorder.fault_ended(id);
        result
    }

    /// Waits until every node that answers and is a member lists the
    /// members as `check` wants (`check(view)`), and at least `quorum`
    /// of them do.
    async fn visible(
        &self,
        kind: Fault,
        what: &str,
        check: impl Fn(&View) -> bool,
        except: Option<NodeId>,
    ) -> Result<(), ChangeError> {
        let mut step = Step::new(kind, what);
        loop {
            let views: Vec<View> = self
                .views()
                .await
                .into_iter()
                .filter(|view| Some(view.id) != except)
                .collect();
            let leader = Self::leader_of(&views).cloned();
            if let Some(leader) = leader {
                let voters = Self::voters(&leader);
                let lagging: Vec<NodeId> = views
                    .iter()
                    .filter(|view| voters.contains(&view.id) && !check(view))
                    .map(|view| view.id)
                    .collect();
                let answered = views.iter().filter(|v| voters.contains(&v.id)).count();
                if check(&leader) && lagging.is_empty() && answered > voters.len() / 2 {
                    return Ok(());
                }
                step.last = format!("leader {}, not yet seen by {lagging:?}", leader.id);
            } else {
                step.last = "no leader".into();
            }
            step.again().await?;
        }
    }

    /// Moves leadership to a follower (MoveLeader on the leader) and waits
    /// until the nodes report it leading.
    async fn transfer(&self, rng: &mut StdRng) -> Result<(), ChangeError> {
        let kind = Fault::Transfer;
        let leader = self.wait_leader(kind, None).await?;
        let followers: Vec<NodeId> = Self::voters(&leader)
            .into_iter()
            .filter(|&id| id != leader.id)
            .collect();
        let Some(&target) = followers.choose(rng) else {
            return Err(ChangeError::Impossible {
                kind,
                why: "no follower to hand leadership to".into(),
            });
        };
        let detail = format!(
            "transfer: leadership from node {} to node {target} (MoveLeader)",
            leader.id
        );
        self.recorded(FaultKind::LeaderTransfer, target, detail, async {
            let mut step = Step::new(kind, format!("node {target} leading"));
            let mut asked: Option<Instant> = None;
            loop {
                let views = self.views().await;
                let now = Self::leader_of(&views);
                if now.is_some_and(|view| view.id == target) {
                    return Ok(());
                }
                // Ask (again) every two seconds, of whoever leads.
                if asked.is_none_or(|at| at.elapsed() > Duration::from_secs(2))
                    && let Some(now) = now
                    && let Some(channel) = self.address_of(now.id).as_deref().and_then(channel)
                {
                    asked = Some(Instant::now());
                    let request = with_timeout(MoveLeaderRequest { target_id: target });
                    if let Err(status) = MaintenanceClient::new(channel).move_leader(request).await
                    {
                        step.last = format!("MoveLeader: {}", status.message());
                    }
                }
                step.again().await?;
            }
        })
        .await
    }

    /// A free slot (no node there), drawn with `rng`.
    fn free_slot(&self, rng: &mut StdRng) -> Option<String> {
        let free: Vec<String> = lock(self.cluster)
            .slots()
            .into_iter()
            .filter(|(occupant, _)| occupant.is_none())
            .map(|(_, address)| address)
            .collect();
        free.choose(rng).cloned()
    }

    /// Tells the proxy of `address` which node is behind it.
    fn name_proxy(&self, address: &str, node: Option<NodeId>) {
        for proxy in self.proxies.iter().filter(|p| p.upstream() == address) {
            proxy.set_node(node);
        }
    }

    /// Adds a fresh learner at a free slot, waits until it caught up,
    /// promotes it and waits until every member lists it as a voter.
    async fn grow(&self, kind: Fault, rng: &mut StdRng) -> Result<NodeId, ChangeError> {
        let Some(slot) = self.free_slot(rng) else {
            return Err(ChangeError::Impossible {
                kind,
                why: "no free slot for a new member".into(),
            });
        };
        self.add_at(kind, &slot).await
    }

    /// [`Changes::grow`] at the slot whose client address is `slot`.
    async fn add_at(&self, kind: Fault, slot: &str) -> Result<NodeId, ChangeError> {
        let peer = lock(self.cluster)
            .slot(slot)
            .map(crate::cluster::Slot::advertised_peer)
            .ok_or_else(|| ChangeError::Impossible {
                kind,
                why: format!("no slot at {slot}"),
            })?;
        let leader = self.wait_leader(kind, None).await?;
        let snapshot = leader.status.snapshot_index.unwrap_or(0);
        let from = if snapshot > LOG_ENTRIES_KEPT {
            format!(
                "from the leader's snapshot (at index {snapshot}; its log starts after index {})",
                snapshot - LOG_ENTRIES_KEPT
            )
        } else {
            "from the leader's log".to_string()
        };
        let detail =
            format!("{kind}: a learner added at {slot} (MemberAdd), started, catching up {from}");
        let id = self
            .recorded(FaultKind::Other, leader.id, detail, async {
                let id = self.add_learner(kind, slot, &peer).await?;
                lock(self.cluster)
                    .join(id, slot)
                    .map_err(|error| ChangeError::Impossible {
                        kind,
                        why: format!("starting node {id}: {error}"),
                    })?;
                self.name_proxy(slot, Some(id));
                let snapshot = self.catch_up(kind, id, slot).await?;
                Ok((id, snapshot))
            })
            .await?;
        let (id, snapshot) = id;
        let holding = snapshot.map_or_else(
            || "no snapshot".to_string(),
            |index| format!("a snapshot at index {index}"),
        );
        let detail = format!(
            "{kind}: learner {id} caught up (holding {holding}), promoted to voter (MemberPromote)"
        );
        self.recorded(FaultKind::Other, id, detail, async {
            self.promote(kind, id).await?;
            self.visible(
                kind,
                &format!("node {id} a voter on every member"),
                |view| view.lists(id) == Some(true),
                None,
            )
            .await
        })
        .await?;
        Ok(id)
    }

    /// MemberAdd of a learner at `slot` (peer address `peer`); its id.
    async fn add_learner(
        &self,
        kind: Fault,
        slot: &str,
        peer: &str,
    ) -> Result<NodeId, ChangeError> {
        let mut step = Step::new(kind, format!("a learner added at {slot}"));
        loop {
            let views = self.views().await;
            if let Some(leader) = Self::leader_of(&views) {
                // Added by an earlier call whose answer was lost?
                if let Some(member) = leader
                    .status
                    .members
                    .iter()
                    .find(|member| member.peer_address == peer)
                {
                    return Ok(member.id);
                }
                if let Some(channel) = self.address_of(leader.id).as_deref().and_then(channel) {
                    let request = with_timeout(MemberAddRequest {
                        peer_ur_ls: vec![format!("http://{peer}"), format!("http://{slot}")],
                        is_learner: true,
                    });
                    match ClusterClient::new(channel).member_add(request).await {
                        Ok(added) => {
                            if let Some(member) = added.into_inner().member {
                                return Ok(member.id);
                            }
                            step.last = "MemberAdd answered no member".into();
                        }
                        Err(status) => step.last = format!("MemberAdd: {}", status.message()),
                    }
                }
            }
            step.again().await?;
        }
    }

    /// Waits until node `id` (at `address`) applied what the leader had
    /// committed when it started; its snapshot index then, if it has one.
    pub(crate) async fn catch_up(
        &self,
        kind: Fault,
        id: NodeId,
        address: &str,
    ) -> Result<Option<u64>, ChangeError> {
        // Any leader: a member restarted in a rolling restart may win the
        // election again (a learner cannot).
        let leader = self.wait_leader(kind, None).await?;
        let target = leader.status.commit_index.unwrap_or(0);
        let mut step = Step::new(kind, format!("node {id} caught up to index {target}"));
        loop {
            if let Some(status) = status(address).await {
                let applied = status.applied_index.unwrap_or(0);
                if applied >= target {
                    return Ok(status.snapshot_index);
                }
                step.last = format!("applied {applied} of {target}");
            }
            step.again().await?;
        }
    }

    /// MemberPromote of learner `id`, asked again until the leader lists
    /// it as a voter.
    async fn promote(&self, kind: Fault, id: NodeId) -> Result<(), ChangeError> {
        let mut step = Step::new(kind, format!("node {id} promoted"));
        loop {
            let views = self.views().await;
            if let Some(leader) = Self::leader_of(&views) {
                if View::lists(leader, id) == Some(true) {
                    return Ok(());
                }
                if let Some(channel) = self.address_of(leader.id).as_deref().and_then(channel) {
                    let request = with_timeout(MemberPromoteRequest { id });
                    match ClusterClient::new(channel).member_promote(request).await {
                        Ok(_) => return Ok(()),
                        Err(status) => step.last = format!("MemberPromote: {}", status.message()),
                    }
                }
            }
            step.again().await?;
        }
    }

    /// MemberRemove of `id`, asked again until a leader other than it no
    /// longer lists it; then waits until no member does.
    async fn remove(&self, kind: Fault, id: NodeId) -> Result<(), ChangeError> {
        let mut step = Step::new(kind, format!("node {id} removed"));
        loop {
            let views = self.views().await;
            let leader = Self::leader_of(&views);
            if let Some(leader) = leader
                && leader.id != id
                && leader.lists(id).is_none()
            {
                break;
            }
            step.last = match leader {
                Some(leader) => format!("leader {}", leader.id),
                None => "no leader".into(),
            };
            if let Some(leader) = leader
                && leader.lists(id).is_some()
                && let Some(channel) = self.address_of(leader.id).as_deref().and_then(channel)
            {
                let request = with_timeout(MemberRemoveRequest { id });
                if let Err(status) = ClusterClient::new(channel).member_remove(request).await {
                    step.last = format!("MemberRemove: {}", status.message());
                }
            }
            step.again().await?;
        }
        self.visible(
            kind,
            &format!("node {id} gone from every member"),
            |view| view.lists(id).is_none(),
            Some(id),
        )
        .await
    }

    /// Watches removed node `removed`, while it runs, for
    /// [`HOLD_OFF_ELECTIONS`] election timeouts: no member may follow it
    /// and it may not lead. Says what it saw.
    async fn hold_off(&self, kind: Fault, removed: NodeId) -> Result<String, ChangeError> {
        let window = self.election_timeout * HOLD_OFF_ELECTIONS;
        let began = Instant::now();
        let mut removed_terms: Option<(u64, u64)> = None;
        let mut member_terms: Option<(u64, u64)> = None;
        let mut leaders = std::collections::BTreeSet::new();
        let mut asked = 0u32;
        while began.elapsed() < window {
            asked += 1;
            for view in self.views().await {
                let term = view.status.term;
                if view.id == removed {
                    if view.status.is_leader {
                        return Err(ChangeError::Disrupted {
                            kind,
                            removed,
                            what: format!("it says it leads, in term {term}"),
                        });
                    }
                    removed_terms = Some(
                        removed_terms.map_or((term, term), |(a, b)| (a.min(term), b.max(term))),
                    );
                    continue;
                }
                if view.status.leader_id == Some(removed) {
                    return Err(ChangeError::Disrupted {
                        kind,
                        removed,
                        what: format!("member {} follows it, in term {term}", view.id),
                    });
                }
                if let Some(leader) = view.status.leader_id {
                    leaders.insert(leader);
                }
                member_terms =
                    Some(member_terms.map_or((term, term), |(a, b)| (a.min(term), b.max(term))));
            }
            tokio::time::sleep(POLL).await;
        }
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
        Ok(format!(
            "watched {asked} times over {window:?}: removed node {removed} at {}{campaigned}; \
             members at {}, leaders {leaders:?}",
            span(removed_terms),
            span(member_terms),
        ))
    }

    /// Removes node `removed` (already out of the membership) from the
    /// cluster's processes, after watching it if it runs.
    async fn retire(&self, kind: Fault, removed: NodeId) -> Result<(), ChangeError> {
        let running = lock(self.cluster)
            .node_mut(removed)
            .is_some_and(crate::cluster::NodeProcess::is_running);
        let watched = if running {
            // A member that has not heard from the new leader yet may
            // still name the removed one: wait until each names another.
            self.visible(
                kind,
                &format!("every member following a leader other than node {removed}"),
                |view| {
                    view.status
                        .leader_id
                        .is_some_and(|leader| leader != removed)
                },
                Some(removed),
            )
            .await?;
            let detail = format!(
                "{kind}: removed node {removed} still runs: watched for {HOLD_OFF_ELECTIONS} \
                 election timeouts (no member may follow it, it may not lead), then stopped"
            );
            let id = self
                .recorder
                .fault_started(FaultKind::Other, Some(removed), Some(detail));
            let seen = self.hold_off(kind, removed).await;
            self.recorder.fault_ended(id);
            match seen {
                Ok(seen) => Some(seen),
                Err(disrupted) => {
                    // Kept for the verdict; the node is stopped and the
                    // change goes on.
                    let what = disrupted.to_string();
                    lock(self.disruptions).push(what.clone());
                    Some(format!("DISRUPTED: {what}"))
                }
            }
        } else {
            None
        };
        let address = self.address_of(removed);
        lock(self.cluster).retire(removed);
        if let Some(address) = address {
            self.name_proxy(&address, None);
        }
        if let Some(seen) = watched {
            // What was seen, as a mark on the timeline.
            let id = self.recorder.fault_started(
                FaultKind::Other,
                Some(removed),
                Some(format!("{kind}: {seen}")),
            );
            self.recorder.fault_ended(id);
        }
        Ok(())
    }

    /// Removes a follower other than `spare` (cut off from the others
    /// first, if `isolated`, so it misses its removal), watches it, stops
    /// it.
    async fn remove_follower(
        &self,
        kind: Fault,
        isolated: bool,
        spare: Option<NodeId>,
        rng: &mut StdRng,
    ) -> Result<(), ChangeError> {
        let leader = self.wait_leader(kind, None).await?;
        let followers: Vec<NodeId> = Self::voters(&leader)
            .into_iter()
            .filter(|&id| id != leader.id && Some(id) != spare)
            .collect();
        let Some(&target) = followers.choose(rng) else {
            return Err(ChangeError::Impossible {
                kind,
                why: "no follower to remove".into(),
            });
        };
        let others: Vec<NodeId> = self
            .nodes()
            .into_iter()
            .map(|(id, _)| id)
            .filter(|&id| id != target)
            .collect();
        let how = if isolated {
            format!(", cut off from {others:?} first so it misses its removal")
        } else {
            String::new()
        };
        let detail = format!("{kind}: follower {target} removed (MemberRemove){how}");
        self.recorded(FaultKind::Other, target, detail, async {
            if isolated {
                lock(self.cluster).isolate(target, &others);
            }
            let removed = self.remove(kind, target).await;
            if isolated {
                lock(self.cluster).heal_isolation();
            }
            removed
        })
        .await?;
        self.retire(kind, target).await
    }

    /// Removes the leader, waits for another, watches it, stops it.
    async fn remove_leader(&self, _rng: &mut StdRng) -> Result<(), ChangeError> {
        let kind = Fault::RemoveLeader;
        let leader = self.wait_leader(kind, None).await?;
        let target = leader.id;
        let detail = format!("{kind}: leader {target} removed (MemberRemove), another elected");
        self.recorded(FaultKind::Other, target, detail, async {
            self.remove(kind, target).await?;
            self.wait_leader(kind, Some(target)).await.map(|_| ())
        })
        .await?;
        self.retire(kind, target).await
    }

    /// Replaces a member (the leader the first time, then at random):
    /// stops it, wipes its data, removes it, and adds a fresh member at
    /// the same addresses.
    async fn replace(&self, first: bool, rng: &mut StdRng) -> Result<(), ChangeError> {
        let kind = Fault::Replace;
        let leader = self.wait_leader(kind, None).await?;
        let voters = Self::voters(&leader);
        let target = if first || rng.random_bool(0.5) {
            leader.id
        } else {
            *voters.choose(rng).unwrap_or(&leader.id)
        };
        let Some(slot) = self.address_of(target) else {
            return Err(ChangeError::Impossible {
                kind,
                why: format!("node {target} is not one of the cluster's processes"),
            });
        };
        let detail = format!(
            "{kind}: node {target} stopped (SIGKILL), its data wiped, removed (MemberRemove)"
        );
        self.recorded(FaultKind::Other, target, detail, async {
            lock(self.cluster).retire(target);
            self.name_proxy(&slot, None);
            self.wait_leader(kind, Some(target)).await?;
            self.remove(kind, target).await
        })
        .await?;
        self.add_at(kind, &slot).await.map(|_| ())
    }

    /// Restarts every member in turn (SIGTERM, then started again on its
    /// data), the leader last, each caught up before the next.
    async fn rolling_restart(&self) -> Result<(), ChangeError> {
        let kind = Fault::RollingRestart;
        let leader = self.wait_leader(kind, None).await?;
        let mut order: Vec<NodeId> = Self::voters(&leader)
            .into_iter()
            .filter(|&id| id != leader.id)
            .collect();
        order.push(leader.id);
        for id in order {
            let Some(address) = self.address_of(id) else {
                continue;
            };
            let detail = format!(
                "{kind}: node {id} stopped (SIGTERM), started again on its data, caught up"
            );
            let stopped = self
                .recorded(FaultKind::Restart, id, detail, async {
                    let stopped = self.stop_gracefully(kind, id).await?;
                    lock(self.cluster)
                        .restart(id)
                        .map_err(|error| ChangeError::Impossible {
                            kind,
                            why: format!("starting node {id} again: {error}"),
                        })?;
                    self.catch_up(kind, id, &address).await.map(|_| stopped)
                })
                .await?;
            // How it stopped, as a mark on the timeline.
            let mark = self.recorder.fault_started(
                FaultKind::Restart,
                Some(id),
                Some(format!("{kind}: node {id} {stopped}")),
            );
            self.recorder.fault_ended(mark);
        }
        Ok(())
    }

    /// SIGTERM to node `id`; waits until it exits, for at most
    /// [`TERM_PATIENCE`], as an operator's service manager does, then
    /// SIGKILLs it. An exit other than 0 is a failure; how it stopped is
    /// said.
    async fn stop_gracefully(&self, kind: Fault, id: NodeId) -> Result<String, ChangeError> {
        let delivered = lock(self.cluster)
            .node_mut(id)
            .is_some_and(crate::cluster::NodeProcess::terminate);
        if !delivered {
            return Ok("was not running".into());
        }
        let began = Instant::now();
        loop {
            let exit = lock(self.cluster)
                .node_mut(id)
                .and_then(crate::cluster::NodeProcess::collect);
            if let Some(exit) = exit {
                if exit.success() {
                    return Ok(format!("exited 0 after {:?}", began.elapsed()));
                }
                return Err(ChangeError::Impossible {
                    kind,
                    why: format!("node {id} stopped on SIGTERM with {exit}"),
                });
            }
            if began.elapsed() >= TERM_PATIENCE {
                lock(self.cluster).kill(id);
                return Ok(format!(
                    "had not exited {TERM_PATIENCE:?} after SIGTERM: killed (SIGKILL)"
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
