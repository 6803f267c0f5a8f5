//! `etcdserverpb.Cluster` onto the node's membership. A member's etcd ID
//! is its node id, its name `node-<id>`, its URLs its advertised
//! addresses (the scheme the client port's: `https` when it is on TLS).
//!
//! - MemberList: what etcd's clients use to find every endpoint; with
//!   `linearizable`, answered by the leader after a read barrier.
//! - MemberAdd: oncekv's members have one peer address and one client
//!   address, and etcd's request carries URLs only, so `peerURLs` holds
//!   both: the peer URL, then the client URL. The new member's id is one
//!   more than both the highest member id and the leader's last log index:
//!   never a member's, and, as the log only grows, never one an earlier
//!   MemberAdd answered (so a removed member's process cannot pass for the
//!   new one). The operator then starts `oncekv serve --id <id> --join` at
//!   those addresses. A learner is added as one entry; a voter as a
//!   learner and then promoted, without waiting for it to run (etcd's
//!   order: add, then start), so a voter is refused when the voters
//!   reachable now would not make a quorum with it (a one-voter cluster
//!   grows by a learner, started, then promoted). Each change is proposed
//!   only while the membership it was decided on is still the current one.
//! - MemberPromote: a learner that is reachable, caught up (its log within
//!   90% of the leader's, etcd's rule) and whose promotion leaves a quorum
//!   of reachable voters.
//! - MemberRemove: refused when the voters left reachable would not make
//!   a quorum.
//! - MemberUpdate: `peerURLs` holds the member's new peer URL, and
//!   optionally its new client URL after it (as MemberAdd's); the voters
//!   and learners stay as they are. A URL another member has is refused.
//!   openraft's leader keeps the connection of a running replication
//!   stream, at the address it was started with, when a member's address
//!   changes: so new addresses are one guarded entry, after which, when
//!   a voter's peer address changed, the leader hands leadership to
//!   another voter (whose streams, as any new leader's, dial the addresses
//!   of the membership then); a learner given a new peer address is
//!   removed and added back there instead (two guarded entries, no change
//!   of leader), which restarts the leader's stream to it. The leader's
//!   own addresses change in one entry and nothing more: no stream goes
//!   to it.
//!
//! Changes need the admin role while authentication is enforced (as the
//! native member commands do) and are made by the leader, to which a
//! follower forwards them.

use super::errors::{EtcdError, error_of};
use super::forward::{Route, answered};
use super::{EtcdApi, credentials_of};
use crate::raft::consensus::{MemberChange, MemberChangeError, MemberStatus, MembershipView};
use crate::raft::type_config::{NodeId, NodeInfo};
use crate::raft::write_error::WriteError;
use oncekv_proto::etcd::etcdserverpb::cluster_client::ClusterClient;
use oncekv_proto::etcd::etcdserverpb::cluster_server::Cluster;
use oncekv_proto::etcd::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use std::collections::BTreeSet;
use std::time::Duration;
use tonic::{Response, Status};

/// How many times a change is decided again when the membership changed
/// under it (another change was being committed, or one came first).
const DECISIONS_MAX: u32 = 40;

/// The pause before deciding again.
const DECISION_PAUSE: Duration = Duration::from_millis(50);

/// How far behind the leader's log a learner may be and still be promoted,
/// as etcd has it: its log holds at least 90% of the leader's.
const READY_PERCENT: u128 = 90;

#[tonic::async_trait]
impl Cluster for EtcdApi {
    async fn member_add(
        &self,
        request: tonic::Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        self.require_admin(&request)?;
        let info = member_addresses(&request.get_ref().peer_ur_ls)?;
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(ClusterClient::new(channel).member_add(request).await);
        }
        let is_learner = request.get_ref().is_learner;
        let id = self.add_learner(&info, !is_learner).await?;
        if !is_learner && let Err(error) = self.promote(id, Readiness::NotAwaited).await {
            // The learner was added: the change is made in part.
            tracing::warn!(id, %error, "a member added through etcd's API was not promoted");
            let why = error.message().to_string();
            return Err(EtcdError::AddedAsLearnerOnly { id, why }.into());
        }
        let view = self.node.consensus().membership();
        let mut members = view.members;
        if !members.iter().any(|member| member.id == id) {
            // Made, and not yet in this node's view.
            members.push(MemberStatus {
                id,
                info,
                voter: !is_learner,
            });
        }
        let members = self.members_to_wire(&members);
        let member = members.iter().find(|member| member.id == id).cloned();
        Ok(Response::new(MemberAddResponse {
            header: Some(self.membership_header()),
            member,
            members,
        }))
    }

    async fn member_remove(
        &self,
        request: tonic::Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.require_admin(&request)?;
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(ClusterClient::new(channel).member_remove(request).await);
        }
        let id = request.get_ref().id;
        let view = self.leader_view()?;
        let member = find(&view, id)?;
        if member.voter {
            let voters_after: BTreeSet<NodeId> =
                voters(&view).filter(|voter| *voter != id).collect();
            if !self.quorum_reachable(&voters_after, &view).await {
                return Err(EtcdError::NotEnoughStartedMembers.into());
            }
        }
        let removed = self.node.remove_member(id).await;
        if matches!(removed, Err(WriteError::NotLeader { .. })) && id == self.node.id() {
            // This node led: it handed leadership over, and the new leader
            // removes it as a follower.
            if let Route::Leader(channel) = self.route_after_handover().await? {
                let request = self.forwarded(request);
                return answered(ClusterClient::new(channel).member_remove(request).await);
            }
        }
        removed.map_err(|error| Status::from(error_of(error)))?;
        let mut members = self.node.consensus().membership().members;
        members.retain(|member| member.id != id);
        Ok(Response::new(MemberRemoveResponse {
            header: Some(self.membership_header()),
            members: self.members_to_wire(&members),
        }))
    }

    async fn member_update(
        &self,
        request: tonic::Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.require_admin(&request)?;
        let update = updated_addresses(&request.get_ref().peer_ur_ls)?;
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(ClusterClient::new(channel).member_update(request).await);
        }
        let id = request.get_ref().id;
        let info = self.update_addresses(id, &update).await?;
        let mut members = self.node.consensus().membership().members;
        for member in members.iter_mut().filter(|member| member.id == id) {
            // Made, whether or not this node's view shows it yet.
            member.info = info.clone();
        }
        Ok(Response::new(MemberUpdateResponse {
            header: Some(self.membership_header()),
            members: self.members_to_wire(&members),
        }))
    }

    async fn member_list(
        &self,
        request: tonic::Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        // Who may see the members is who may see the status.
        self.principal(&request, request.get_ref().linearizable)?;
        if request.get_ref().linearizable {
            if let Route::Leader(channel) = self.route(&request).await? {
                let request = self.forwarded(request);
                return answered(ClusterClient::new(channel).member_list(request).await);
            }
            self.node
                .consensus()
                .read_barrier()
                .await
                .map_err(|error| Status::from(error_of(error)))?;
        }
        let members = self.node.consensus().membership().members;
        Ok(Response::new(MemberListResponse {
            header: Some(self.membership_header()),
            members: self.members_to_wire(&members),
        }))
    }

    async fn member_promote(
        &self,
        request: tonic::Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.require_admin(&request)?;
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(ClusterClient::new(channel).member_promote(request).await);
        }
        let id = request.get_ref().id;
        self.promote(id, Readiness::Required).await?;
        let mut members = self.node.consensus().membership().members;
        for member in members.iter_mut().filter(|member| member.id == id) {
            // Made, whether or not this node's view shows it yet.
            member.voter = true;
        }
        Ok(Response::new(MemberPromoteResponse {
            header: Some(self.membership_header()),
            members: self.members_to_wire(&members),
        }))
    }
}

impl EtcdApi {
    /// Refuses `request` unless its caller has the admin role (while
    /// authentication is enforced).
    fn require_admin<T>(&self, request: &tonic::Request<T>) -> Result<(), Status> {
        self.node
            .require_admin(&credentials_of(request), "changing membership")
            .map_err(|error| Status::from(error_of(error)))
    }

    /// A header at this node's applied index.
    fn membership_header(&self) -> oncekv_proto::etcd::etcdserverpb::ResponseHeader {
        self.header(self.node.status().raft.applied_index.unwrap_or(0))
    }

    /// The membership as the leader sees it; an error on any other node.
    fn leader_view(&self) -> Result<MembershipView, Status> {
        let view = self.node.consensus().membership();
        if view.reachable.is_some() {
            return Ok(view);
        }
        Err(self
            .node
            .not_leader()
            .map_or(EtcdError::NotLeader, error_of)
            .into())
    }

    /// `members` as etcd's messages.
    fn members_to_wire(&self, members: &[MemberStatus]) -> Vec<Member> {
        let scheme = if self.client_tls { "https" } else { "http" };
        members
            .iter()
            .map(|member| Member {
                id: member.id,
                name: format!("node-{}", member.id),
                peer_ur_ls: vec![format!("{scheme}://{}", member.info.peer_address)],
                client_ur_ls: vec![format!("{scheme}://{}", member.info.client_address)],
                is_learner: !member.voter,
            })
            .collect()
    }

    /// Adds a learner at `info` under a new id, which it answers. When
    /// `to_be_voter`, first checks that the voters reachable now make a
    /// quorum with it (it is promoted next).
    async fn add_learner(&self, info: &NodeInfo, to_be_voter: bool) -> Result<NodeId, Status> {
        let mut decisions = 0;
        loop {
            let view = self.leader_view()?;
            if view
                .members
                .iter()
                .any(|member| member.info.peer_address == info.peer_address)
            {
                return Err(EtcdError::PeerUrlExists.into());
            }
            let id = new_member_id(&view).ok_or_else(|| {
                Status::from(EtcdError::Invalid("no member id is left".to_string()))
            })?;
            if to_be_voter {
                // The voters reachable now must commit the change without
                // it (openraft's joint step needs a quorum of the new
                // voters too), so etcd's leave to grow a one-member
                // cluster this way is not given: add a learner, start it,
                // promote it.
                let mut voters_after: BTreeSet<NodeId> = voters(&view).collect();
                voters_after.insert(id);
                if !self.quorum_reachable(&voters_after, &view).await {
                    return Err(EtcdError::NotEnoughStartedMembers.into());
                }
            }
            let change = MemberChange::AddLearner {
                id,
                info: info.clone(),
            };
            match self
                .node
                .consensus()
                .change_member_if(change, &view.version)
                .await
            {
                Ok(()) => return Ok(id),
                Err(changed @ MemberChangeError::Changed(_)) => {
                    decisions += 1;
                    if decisions >= DECISIONS_MAX {
                        tracing::info!(%changed, "a membership change was decided too many times");
                        return Err(EtcdError::TooManyRequests("membership-change").into());
                    }
                    tokio::time::sleep(DECISION_PAUSE).await;
                }
                Err(MemberChangeError::Write(error)) => return Err(error_of(error).into()),
            }
        }
    }

    /// Makes learner `id` a voter, if it is one, is caught up (when
    /// `readiness` requires it), and the voters reachable then make a
    /// quorum.
    async fn promote(&self, id: NodeId, readiness: Readiness) -> Result<(), Status> {
        let mut decisions = 0;
        loop {
            let view = self.leader_view()?;
            if find(&view, id)?.voter {
                return Err(EtcdError::MemberNotLearner.into());
            }
            if readiness == Readiness::Required {
                let status = self.node.status().raft;
                let matched = status
                    .replication
                    .iter()
                    .find(|(follower, _)| *follower == id)
                    .and_then(|(_, matched)| *matched);
                if !is_caught_up(matched, status.last_log_index) {
                    return Err(EtcdError::LearnerNotReady.into());
                }
            }
            let mut voters_after: BTreeSet<NodeId> = voters(&view).collect();
            voters_after.insert(id);
            if !self.quorum_reachable(&voters_after, &view).await {
                return Err(EtcdError::NotEnoughStartedMembers.into());
            }
            let change = MemberChange::Promote { id };
            match self
                .node
                .consensus()
                .change_member_if(change, &view.version)
                .await
            {
                Ok(()) => return Ok(()),
                Err(changed @ MemberChangeError::Changed(_)) => {
                    decisions += 1;
                    if decisions >= DECISIONS_MAX {
                        tracing::info!(%changed, "a membership change was decided too many times");
                        return Err(EtcdError::TooManyRequests("membership-change").into());
                    }
                    tokio::time::sleep(DECISION_PAUSE).await;
                }
                Err(MemberChangeError::Write(error)) => return Err(error_of(error).into()),
            }
        }
    }
}

impl EtcdApi {
    /// Gives member `id` the addresses `update` names, and has the leader
    /// reach it there; answers them.
    async fn update_addresses(
        &self,
        id: NodeId,
        update: &AddressUpdate,
    ) -> Result<NodeInfo, Status> {
        let mut decisions = 0;
        loop {
            let view = self.leader_view()?;
            let member = find(&view, id)?;
            let info = update.applied_to(&member.info);
            if view
                .members
                .iter()
                .any(|other| other.id != id && other.info.peer_address == info.peer_address)
            {
                return Err(EtcdError::PeerUrlExists.into());
            }
            if info == member.info {
                // As etcd: the same URLs again change nothing.
                return Ok(info);
            }
            let voter = member.voter;
            // Only a stream's peer address is fixed when it starts.
            let moved = info.peer_address != member.info.peer_address;
            let change = if voter || !moved {
                MemberChange::SetAddresses {
                    id,
                    info: info.clone(),
                }
            } else {
                MemberChange::RemoveLearner { id }
            };
            match self
                .node
                .consensus()
                .change_member_if(change, &view.version)
                .await
            {
                Ok(()) => {}
                Err(changed @ MemberChangeError::Changed(_)) => {
                    decisions += 1;
                    if decisions >= DECISIONS_MAX {
                        tracing::info!(%changed, "a membership change was decided too many times");
                        return Err(EtcdError::TooManyRequests("membership-change").into());
                    }
                    tokio::time::sleep(DECISION_PAUSE).await;
                    continue;
                }
                Err(MemberChangeError::Write(error)) => return Err(error_of(error).into()),
            }
            if moved && !voter {
                self.add_back(id, &info).await?;
            } else if moved && id != self.node.id() {
                self.node.hand_over_leadership(id).await;
            }
            return Ok(info);
        }
    }

    /// Adds learner `id`, just removed, back at `info`: the leader's
    /// stream to it starts again, at its new address.
    async fn add_back(&self, id: NodeId, info: &NodeInfo) -> Result<(), Status> {
        let mut decisions = 0;
        loop {
            let refused = |why: String| -> Status {
                tracing::warn!(id, %why, "a learner removed to change its addresses was not added back");
                EtcdError::RemovedNotAddedBack { id, why }.into()
            };
            let view = self
                .leader_view()
                .map_err(|status| refused(status.message().to_string()))?;
            if view.members.iter().any(|member| member.id == id) {
                return Ok(());
            }
            if view
                .members
                .iter()
                .any(|member| member.info.peer_address == info.peer_address)
            {
                return Err(refused("another member has its peer URL now".to_string()));
            }
            let change = MemberChange::AddLearner {
                id,
                info: info.clone(),
            };
            match self
                .node
                .consensus()
                .change_member_if(change, &view.version)
                .await
            {
                Ok(()) => return Ok(()),
                Err(changed @ MemberChangeError::Changed(_)) => {
                    decisions += 1;
                    if decisions >= DECISIONS_MAX {
                        return Err(refused(changed.to_string()));
                    }
                    tokio::time::sleep(DECISION_PAUSE).await;
                }
                Err(MemberChangeError::Write(error)) => {
                    return Err(refused(Status::from(error_of(error)).message().to_string()));
                }
            }
        }
    }
}

/// What MemberUpdate changes: the peer address, and the client address if
/// given.
#[derive(Clone, Debug, PartialEq, Eq)]
struct AddressUpdate {
    peer: String,
    client: Option<String>,
}

impl AddressUpdate {
    /// `current` with this update made.
    fn applied_to(&self, current: &NodeInfo) -> NodeInfo {
        NodeInfo {
            peer_address: self.peer.clone(),
            client_address: self
                .client
                .clone()
                .unwrap_or_else(|| current.client_address.clone()),
        }
    }
}

/// A member's new addresses from MemberUpdate's `peerURLs`: its peer URL,
/// and its client URL if given after it.
fn updated_addresses(urls: &[String]) -> Result<AddressUpdate, EtcdError> {
    match urls {
        [] => Err(EtcdError::MemberBadUrls),
        [peer] => Ok(AddressUpdate {
            peer: address_of(peer)?,
            client: None,
        }),
        [peer, client] => Ok(AddressUpdate {
            peer: address_of(peer)?,
            client: Some(address_of(client)?),
        }),
        more => Err(EtcdError::Invalid(format!(
            "a member has one peer URL and one client URL (peer first); got {} URLs",
            more.len()
        ))),
    }
}

/// Whether a learner must be caught up before it is promoted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Readiness {
    /// It must (MemberPromote).
    Required,
    /// It need not run yet (MemberAdd of a voter, etcd's order: add, then
    /// start).
    NotAwaited,
}

/// Member `id` of `view`, or etcd's "member not found".
fn find(view: &MembershipView, id: NodeId) -> Result<&MemberStatus, Status> {
    view.members
        .iter()
        .find(|member| member.id == id)
        .ok_or_else(|| EtcdError::MemberNotFound.into())
}

/// The voters of `view`.
fn voters(view: &MembershipView) -> impl Iterator<Item = NodeId> + '_ {
    view.members
        .iter()
        .filter(|member| member.voter)
        .map(|member| member.id)
}

/// Whether the members of `voters` that `view` finds reachable are a
/// majority of them (never of none).
impl EtcdApi {
    /// Whether a majority of `voters` is reachable from this leader: now,
    /// by `view`, or within a moment (a leader just elected, by a transfer
    /// say, has heard no heartbeat answered yet).
    async fn quorum_reachable(&self, voters: &BTreeSet<NodeId>, view: &MembershipView) -> bool {
        quorum_reachable_in(voters, view)
            || self
                .node
                .consensus()
                .wait_for_reachable_quorum(voters)
                .await
    }
}

fn quorum_reachable_in(voters: &BTreeSet<NodeId>, view: &MembershipView) -> bool {
    let Some(reachable) = &view.reachable else {
        return false;
    };
    let running = voters.intersection(reachable).count();
    !voters.is_empty() && running > voters.len() / 2
}

/// A new member's id: one more than both the highest member id and the
/// last log index. A later call's view holds the entry that added this
/// one, at an index at least this id, so it never answers it again.
fn new_member_id(view: &MembershipView) -> Option<NodeId> {
    let highest = view.members.iter().map(|member| member.id).max();
    highest
        .unwrap_or(0)
        .max(view.last_log_index.unwrap_or(0))
        .checked_add(1)
}

/// Whether a learner whose log matches the leader's up to `matched` is
/// caught up with the leader's last log index `leader_last` (etcd's rule:
/// at least 90% of it).
fn is_caught_up(matched: Option<u64>, leader_last: Option<u64>) -> bool {
    let Some(matched) = matched else {
        return false;
    };
    let leader_last = leader_last.unwrap_or(0);
    u128::from(matched) * 100 >= u128::from(leader_last) * READY_PERCENT
}

/// A new member's addresses from MemberAdd's `peerURLs`: its peer URL,
/// then its client URL.
pub(super) fn member_addresses(urls: &[String]) -> Result<NodeInfo, EtcdError> {
    match urls {
        [] => Err(EtcdError::MemberBadUrls),
        [peer, client] => Ok(NodeInfo {
            peer_address: address_of(peer)?,
            client_address: address_of(client)?,
        }),
        [peer] => {
            address_of(peer)?;
            Err(EtcdError::Invalid(
                "a member needs its client URL too: give it after the peer URL, as in \
                 --peer-urls=http://PEER_HOST:PORT,http://CLIENT_HOST:PORT"
                    .to_string(),
            ))
        }
        more => Err(EtcdError::Invalid(format!(
            "a member has one peer URL and one client URL (peer first); got {} URLs",
            more.len()
        ))),
    }
}

/// The `host:port` of a member URL: `http://` or `https://`, a host (a
/// name, an IPv4 address or a bracketed IPv6 address), a port from 1 to
/// 65535, and nothing else (no path, as etcd requires).
fn address_of(url: &str) -> Result<String, EtcdError> {
    let url = url.trim();
    let Some((scheme, address)) = url.split_once("://") else {
        return Err(EtcdError::MemberBadUrls);
    };
    match scheme {
        "http" | "https" => {}
        "unix" | "unixs" => {
            return Err(EtcdError::Invalid(format!(
                "{url:?}: members are reached over TCP (http:// or https://), not unix sockets"
            )));
        }
        _ => return Err(EtcdError::MemberBadUrls),
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(EtcdError::MemberBadUrls);
    };
    match port.parse::<u16>() {
        Ok(1..) => {}
        Ok(0) | Err(_) => return Err(EtcdError::MemberBadUrls),
    }
    let well_formed = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) => inner.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            let name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
            !host.is_empty() && host.len() <= 253 && host.chars().all(name_char)
        }
    };
    if !well_formed {
        return Err(EtcdError::MemberBadUrls);
    }
    Ok(address.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::consensus::MembershipVersion;

    fn member(id: NodeId, voter: bool) -> MemberStatus {
        MemberStatus {
            id,
            info: NodeInfo::default(),
            voter,
        }
    }

    fn view(members: Vec<MemberStatus>, last: u64, reachable: &[NodeId]) -> MembershipView {
        MembershipView {
            members,
            version: MembershipVersion::default(),
            last_log_index: Some(last),
            reachable: Some(reachable.iter().copied().collect()),
        }
    }

    #[test]
    fn member_urls_are_checked_without_panicking() {
        let both = |peer: &str, client: &str| member_addresses(&[peer.into(), client.into()]);
        assert_eq!(
            both("http://127.0.0.1:7380", " https://node-2.example:7379 "),
            Ok(NodeInfo {
                peer_address: "127.0.0.1:7380".into(),
                client_address: "node-2.example:7379".into(),
            })
        );
        assert_eq!(
            both("http://[::1]:7380", "http://[::1]:7379").map(|info| info.peer_address),
            Ok("[::1]:7380".into())
        );
        for bad in [
            "",
            "127.0.0.1:7380",
            "ftp://a:1",
            "http://a",
            "http://a:0",
            "http://a:65536",
            "http://a:1/path",
            "http://a:1/",
            "http://user@a:1",
            "http://[zz]:1",
            "http://:1",
            "http://a b:1",
            "http://\u{e9}:1",
        ] {
            assert_eq!(
                both(bad, "http://a:1"),
                Err(EtcdError::MemberBadUrls),
                "{bad:?}"
            );
        }
        assert!(matches!(
            both("unix://a:1", "http://a:1"),
            Err(EtcdError::Invalid(_))
        ));
        assert_eq!(member_addresses(&[]), Err(EtcdError::MemberBadUrls));
        assert!(matches!(
            member_addresses(&["http://a:1".into()]),
            Err(EtcdError::Invalid(why)) if why.contains("client URL")
        ));
        let three = vec!["http://a:1".to_string(); 3];
        assert!(matches!(
            member_addresses(&three),
            Err(EtcdError::Invalid(why)) if why.contains("got 3")
        ));
    }

    #[test]
    fn an_update_names_the_peer_url_and_perhaps_the_client_url() {
        let current = NodeInfo {
            peer_address: "127.0.0.1:1".into(),
            client_address: "127.0.0.1:2".into(),
        };
        let peer_only = updated_addresses(&["http://10.0.0.1:7380".into()]).unwrap();
        assert_eq!(
            peer_only.applied_to(&current),
            NodeInfo {
                peer_address: "10.0.0.1:7380".into(),
                client_address: "127.0.0.1:2".into(),
            }
        );
        let both =
            updated_addresses(&["http://10.0.0.1:7380".into(), "https://h:7379".into()]).unwrap();
        assert_eq!(both.applied_to(&current).client_address, "h:7379");
        assert_eq!(updated_addresses(&[]), Err(EtcdError::MemberBadUrls));
        assert_eq!(
            updated_addresses(&["10.0.0.1:7380".into()]),
            Err(EtcdError::MemberBadUrls)
        );
        assert!(matches!(
            updated_addresses(&vec!["http://a:1".to_string(); 3]),
            Err(EtcdError::Invalid(why)) if why.contains("got 3")
        ));
    }

    #[test]
    fn a_new_member_id_is_above_every_member_and_the_log() {
        let members = vec![member(1, true), member(2, true), member(3, true)];
        assert_eq!(new_member_id(&view(members.clone(), 17, &[1])), Some(18));
        assert_eq!(
            new_member_id(&view(vec![member(40, true)], 17, &[40])),
            Some(41)
        );
        assert_eq!(
            new_member_id(&view(vec![member(u64::MAX, true)], 1, &[])),
            None
        );
    }

    #[test]
    fn a_quorum_of_the_voters_must_be_reachable() {
        let three = view(
            vec![member(1, true), member(2, true), member(3, true)],
            9,
            &[1, 2],
        );
        let voters = |ids: &[NodeId]| ids.iter().copied().collect::<BTreeSet<_>>();
        assert!(quorum_reachable_in(&voters(&[1, 2, 3]), &three));
        // A fourth voter that is not running yet: 2 of 4 is no quorum.
        assert!(!quorum_reachable_in(&voters(&[1, 2, 3, 4]), &three));
        assert!(quorum_reachable_in(&voters(&[1, 2]), &three));
        assert!(!quorum_reachable_in(&voters(&[]), &three));
        let mut follower = three;
        follower.reachable = None;
        assert!(!quorum_reachable_in(&voters(&[1]), &follower));
    }

    #[test]
    fn a_learner_is_ready_within_ten_percent_of_the_leaders_log() {
        assert!(is_caught_up(Some(90), Some(100)));
        assert!(!is_caught_up(Some(89), Some(100)));
        assert!(!is_caught_up(None, Some(100)));
        assert!(is_caught_up(Some(0), None));
        assert!(is_caught_up(Some(u64::MAX), Some(u64::MAX)));
    }
}
