//! What a node tells a client about a request it did not carry out is
//! true. "Not the leader" and "no leader" (which a client takes for
//! "nothing was proposed") come only from a refusal made before anything
//! was handed to openraft; whenever the node cannot know (consensus stopped,
//! a log write failed, a membership change was cut short by a leader change
//! after part of it was proposed) the answer is "unavailable: it may have
//! been proposed". Every request of a batch, and a retry joined to its
//! in-flight twin, gets such an answer of its own.
//!
//! And what callers send at the same moment is proposed together.
//!
//! Nodes run in this process: one node over a log whose writes can be made
//! to fail (and are counted), or three nodes behind peer proxies that can
//! cut one off.

use oncekv_harness::peer_proxy::{Partitions, PeerProxy, source_ip};
use oncekv_harness::testing::eventually;
use oncekv_proto::convert::{self, CallFailure};
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::kv_server::Kv;
use oncekv_proto::v1::{
    AddMemberRequest, ExecuteBatchRequest, ExecuteRequest, ExecuteResponse, Member,
    MembershipResponse, StatusRequest, StatusResponse, execute_response, membership_response,
};
use oncekv_server::grpc::KvService;
use oncekv_server::node::{Node, NodeOptions};
use oncekv_server::raft::consensus::{Consensus, ConsensusOptions, WriteError};
use oncekv_server::raft::network::PeerNetwork;
use oncekv_server::raft::segment_log::SegmentLog;
use oncekv_server::raft::state_machine_store::StateMachineStore;
use oncekv_server::raft::type_config::{NodeId, NodeInfo, TypeConfig};
use oncekv_server::server::{ServerConfig, serve};
use oncekv_server::transport::tcp_incoming;
use oncekv_state::{
    Command, Limits, Origin, Request, RequestHeader, RequestId, Secret, Seq, SessionId,
};
use openraft::OptionalSend;
use openraft::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Longest any one wait of these tests may take.
const WAIT: Duration = Duration::from_secs(30);

/// What a test sees and steers of its node's log.
#[derive(Debug, Default)]
struct LogControl {
    /// Appends fail once this is set (as a failed write or fsync would).
    fail: AtomicBool,
    /// Appends asked of the log (each a write of the entries openraft
    /// had for it).
    appends: AtomicUsize,
}

/// The durable log, steered by a [`LogControl`].
#[derive(Clone, Debug)]
struct FailingLog {
    log: SegmentLog,
    control: Arc<LogControl>,
}

impl RaftLogReader<TypeConfig> for FailingLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<EntryOf<TypeConfig>>, io::Error> {
        self.log.try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<TypeConfig>>, io::Error> {
        self.log.read_vote().await
    }
}

impl RaftLogStorage<TypeConfig> for FailingLog {
    type LogReader = SegmentLog;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        self.log.get_log_state().await
    }

    async fn get_log_reader(&mut self) -> SegmentLog {
        self.log.get_log_reader().await
    }

    async fn save_vote(&mut self, vote: &VoteOf<TypeConfig>) -> Result<(), io::Error> {
        self.log.save_vote(vote).await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = EntryOf<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.control.appends.fetch_add(1, Ordering::SeqCst);
        if self.control.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected: the log write failed"));
        }
        self.log.append(entries, callback).await
    }

    async fn truncate_after(
        &mut self,
        last_log_id: Option<LogIdOf<TypeConfig>>,
    ) -> Result<(), io::Error> {
        self.log.truncate_after(last_log_id).await
    }

    async fn purge(&mut self, log_id: LogIdOf<TypeConfig>) -> Result<(), io::Error> {
        self.log.purge(log_id).await
    }
}

/// Node 1 of `members` in this process, over a log `control` steers;
/// and where its data lives.
async fn start_node(
    members: BTreeMap<NodeId, NodeInfo>,
    control: Arc<LogControl>,
) -> (tempfile::TempDir, Node) {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = SegmentLog::open(&dir.path().join("log")).expect("open the log");
    log.set_local_node(1);
    let state = StateMachineStore::open(&dir.path().join("state"), Limits::default())
        .expect("open the state machine store");
    let consensus = Consensus::start(
        1,
        &ConsensusOptions::default(),
        FailingLog { log, control },
        state,
        PeerNetwork::default(),
        Some(members),
    )
    .await
    .expect("consensus starts");
    (dir, Node::new(consensus, NodeOptions::default()))
}

fn info(peer_address: &str) -> NodeInfo {
    NodeInfo {
        peer_address: peer_address.to_string(),
        client_address: "127.0.0.1:1".to_string(),
    }
}

/// A one-node cluster whose node leads.
async fn leading_node(control: Arc<LogControl>) -> (tempfile::TempDir, Node) {
    let (dir, node) = start_node(BTreeMap::from([(1, info("127.0.0.1:1"))]), control).await;
    eventually(WAIT, "node 1 leads", || {
        let leads = node.consensus().leadership().is_leader;
        async move { leads.then_some(()) }
    })
    .await;
    (dir, node)
}

fn put(key: &str) -> Request {
    Request::plain(Command::Put {
        key: key.as_bytes().to_vec(),
        value: b"v".to_vec().into(),
        lease: None,
    })
}

/// A request on session 7 (which need not exist: these requests are
/// never applied).
fn on_session(seq: u64) -> Request {
    Request {
        origin: Origin::Session(RequestHeader {
            id: RequestId {
                session: SessionId(7),
                seq: Seq(seq),
            },
            secret: Secret(42),
            first_incomplete: Seq(1),
            attempt: 1,
        }),
        command: Command::Put {
            key: b"s".to_vec(),
            value: b"v".to_vec().into(),
            lease: None,
        },
    }
}

fn wire(request: &Request) -> ExecuteRequest {
    convert::request_to_wire(request).expect("a request the wire carries")
}

/// Why the node did not carry a request out, as the wire says it.
fn wire_failure(response: &ExecuteResponse) -> CallFailure {
    match &response.result {
        Some(execute_response::Result::Failure(failure)) => {
            convert::failure_from_wire(failure.clone()).expect("a failure the wire carries")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn is_unavailable(failure: &CallFailure) -> bool {
    matches!(failure, CallFailure::Unavailable(_))
}

/// `ExecuteBatch` through the node's client service.
async fn execute_batch(service: &KvService, requests: &[Request]) -> Vec<ExecuteResponse> {
    let batch = ExecuteBatchRequest {
        requests: requests.iter().map(wire).collect(),
    };
    service
        .execute_batch(tonic::Request::new(batch))
        .await
        .expect("a batch is answered")
        .into_inner()
        .responses
}

/// `Execute` through the node's client service.
async fn execute(service: &KvService, request: &Request) -> ExecuteResponse {
    service
        .execute(tonic::Request::new(wire(request)))
        .await
        .expect("a request is answered")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_consensus_shut_down_answers_unavailable_not_a_redirect() {
    let (_dir, node) = leading_node(Arc::default()).await;
    let service = KvService::new(node.clone());
    let applied = execute(&service, &put("before")).await;
    assert!(
        matches!(applied.result, Some(execute_response::Result::Outcome(_))),
        "{applied:?}"
    );

    node.consensus().shutdown().await;

    // Its view of leadership froze when it stopped: it still names itself
    // as the leader. It carries out nothing more, and sends no caller back
    // to itself: every write, alone, batched or joined to its twin, and
    // every membership change is unavailable.
    let alone = node.execute(put("after"), None).await;
    assert!(
        matches!(alone, Err(WriteError::Unavailable(_))),
        "{alone:?}"
    );
    let answered = wire_failure(&execute(&service, &put("after")).await);
    assert!(is_unavailable(&answered), "{answered:?}");
    let batch = execute_batch(&service, &[put("a"), on_session(1), on_session(1)]).await;
    assert_eq!(batch.len(), 3);
    for response in &batch {
        let failure = wire_failure(response);
        assert!(is_unavailable(&failure), "{failure:?}");
    }
    for membership in [
        node.remove_member(2).await,
        node.add_member(2, info("127.0.0.1:1")).await,
    ] {
        assert!(
            matches!(membership, Err(WriteError::Unavailable(_))),
            "{membership:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_log_write_answers_unavailable_to_every_request_in_flight_and_after() {
    let control = Arc::new(LogControl::default());
    let (_dir, node) = leading_node(control.clone()).await;
    let service = KvService::new(node.clone());

    // A batch whose one write to the log fails: a plain request, a request
    // on a session, and a retry of it joined to it in flight. The write
    // stops consensus; nobody is told "not proposed".
    control.fail.store(true, Ordering::SeqCst);
    let batch = execute_batch(&service, &[put("a"), on_session(1), on_session(1)]).await;
    assert_eq!(batch.len(), 3);
    for response in &batch {
        let failure = wire_failure(response);
        assert!(is_unavailable(&failure), "{failure:?}");
    }
    eventually(WAIT, "consensus stops", || {
        let stopped = node.consensus().stopped();
        async move { stopped }
    })
    .await;

    // What comes after the stop is not told to go elsewhere either.
    let after = wire_failure(&execute(&service, &put("b")).await);
    assert!(is_unavailable(&after), "{after:?}");
    let retry = wire_failure(&execute(&service, &on_session(1)).await);
    assert!(is_unavailable(&retry), "{retry:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leader_is_answered_only_for_what_was_never_appended() {
    // Node 2 never answers, so node 1 never leads.
    let members = BTreeMap::from([(1, info("127.0.0.1:1")), (2, info("127.0.0.1:1"))]);
    let (_dir, node) = start_node(members, Arc::default()).await;
    let service = KvService::new(node.clone());
    // The founding membership entry (index 0) is appended in the
    // background as the node starts: the log's end is read after it.
    let before = eventually(WAIT, "the founding membership entry is in the log", || {
        let end = node.status().raft.last_log_index;
        async move { end.map(Some) }
    })
    .await;
    let alone = wire_failure(&execute(&service, &put("a")).await);
    assert!(matches!(alone, CallFailure::NoLeader(_)), "{alone:?}");
    let batch = execute_batch(&service, &[put("b"), on_session(1), on_session(1)]).await;
    for response in &batch {
        let failure = wire_failure(response);
        assert!(matches!(failure, CallFailure::NoLeader(_)), "{failure:?}");
    }
    assert_eq!(
        node.status().raft.last_log_index,
        before,
        "nothing was appended"
    );
    node.consensus().shutdown().await;
}

/// Three nodes in this process, each behind a peer proxy, making their
/// peer connections from addresses of their own so a partition can cut
/// one off.
struct ThreeNodes {
    _dirs: Vec<tempfile::TempDir>,
    clients: BTreeMap<NodeId, String>,
    partitions: Partitions,
    stop: tokio::sync::watch::Sender<bool>,
}

impl ThreeNodes {
    async fn start() -> ThreeNodes {
        let ids: Vec<NodeId> = vec![1, 2, 3];
        let partitions = Partitions::default();
        let mut members = BTreeMap::new();
        let mut listeners = BTreeMap::new();
        for &id in &ids {
            let (proxy, proxy_listener) = PeerProxy::bind().await.expect("bind a proxy");
            let peers = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let clients = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let upstream = peers.local_addr().expect("address");
            PeerProxy::run(
                proxy_listener,
                id,
                upstream,
                Arc::new(ids.clone()),
                partitions.clone(),
            );
            let client_address = clients.local_addr().expect("address").to_string();
            members.insert(
                id,
                NodeInfo {
                    peer_address: proxy.address().to_string(),
                    client_address,
                },
            );
            listeners.insert(id, (clients, peers));
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut dirs = Vec::new();
        for (id, (clients, peers)) in listeners {
            let dir = tempfile::tempdir().expect("temp dir");
            let member = &members[&id];
            let mut config =
                ServerConfig::single_node(dir.path(), &member.client_address, &member.peer_address);
            config.id = id;
            config.initial_cluster = Some(members.clone());
            config.peer_source_ip = Some(source_ip(id));
            let mut stopped = stopped.clone();
            tokio::spawn(serve(
                config,
                tcp_incoming(clients),
                tcp_incoming(peers),
                async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                },
            ));
            dirs.push(dir);
        }
        ThreeNodes {
            _dirs: dirs,
            clients: members
                .into_iter()
                .map(|(id, info)| (id, info.client_address))
                .collect(),
            partitions,
            stop,
        }
    }

    async fn client(&self, id: NodeId) -> Option<KvClient<tonic::transport::Channel>> {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.clients[&id]))
                .ok()?
                .connect_timeout(Duration::from_secs(1))
                .timeout(WAIT);
        Some(KvClient::new(endpoint.connect().await.ok()?))
    }

    async fn status(&self, id: NodeId) -> Option<StatusResponse> {
        let mut client = self.client(id).await?;
        let status = tokio::time::timeout(
            Duration::from_secs(2),
            client.status(StatusRequest::default()),
        )
        .await
        .ok()?
        .ok()?;
        Some(status.into_inner())
    }

    /// The node leading, among `among`, in a term above `after`.
    async fn leader(&self, among: &[NodeId], after: u64) -> (NodeId, u64) {
        eventually(WAIT, "a leader", || async {
            for &id in among {
                if let Some(status) = self.status(id).await
                    && status.is_leader
                    && status.term > after
                {
                    return Some((id, status.term));
                }
            }
            None
        })
        .await
    }
}

impl ThreeNodes {
    /// Sends `requests` (plain writes) to whoever leads until all of them
    /// apply in one batch: only the log's length matters here.
    async fn write_all(&self, requests: &[Request]) {
        let batch = ExecuteBatchRequest {
            requests: requests.iter().map(wire).collect(),
        };
        eventually(WAIT, "a batch of writes applied", || {
            let batch = batch.clone();
            async move {
                let (leader, _) = self.leader(&[1, 2, 3], 0).await;
                let mut client = self.client(leader).await?;
                let responses = client.execute_batch(batch).await.ok()?.into_inner();
                let applied = responses.responses.iter().all(|response| {
                    matches!(response.result, Some(execute_response::Result::Outcome(_)))
                });
                applied.then_some(())
            }
        })
        .await;
    }

    /// The members, as the leader sees them.
    async fn members(&self) -> Vec<Member> {
        let (leader, _) = self.leader(&[1, 2, 3], 0).await;
        self.status(leader)
            .await
            .map(|s| s.members)
            .unwrap_or_default()
    }
}

impl Drop for ThreeNodes {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// More entries than openraft's replication lag threshold (5,000): a
/// learner this far behind is waited for before it is made a voter.
const ENTRIES_BEYOND_THE_LAG_THRESHOLD: usize = 5_200;

/// Why a membership call was not carried out, as the wire says it.
fn membership_failure(response: &MembershipResponse) -> CallFailure {
    match &response.result {
        Some(membership_response::Result::Failure(failure)) => {
            convert::failure_from_wire(failure.clone()).expect("a failure the wire carries")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_change_cut_short_after_its_first_entry_is_unavailable() {
    let cluster = ThreeNodes::start().await;
    let puts: Vec<Request> = (0..ENTRIES_BEYOND_THE_LAG_THRESHOLD)
        .map(|i| put(&format!("k{i}")))
        .collect();
    for chunk in puts.chunks(250) {
        cluster.write_all(chunk).await;
    }

    // A new node that is never reachable: the leader adds it as a learner,
    // commits that, and then waits for it to catch up before making it a
    // voter. (A leader change before that, on a busy machine, ends the
    // attempt: its answer must still be true, and another node is tried.)
    for new_id in 4..7 {
        let (leader, term) = cluster.leader(&[1, 2, 3], 0).await;
        let others: Vec<NodeId> = [1, 2, 3].into_iter().filter(|&id| id != leader).collect();
        let mut client = cluster.client(leader).await.expect("connect to the leader");
        let mut adding = tokio::spawn(async move {
            client
                .add_member(AddMemberRequest {
                    id: new_id,
                    peer_address: "127.0.0.1:1".to_string(),
                    client_address: "127.0.0.1:1".to_string(),
                })
                .await
        });
        let cluster = &cluster;
        let learner_committed = eventually(WAIT, "a learner committed, or an answer", || {
            let finished = adding.is_finished();
            async move {
                if finished {
                    return Some(false);
                }
                let status = cluster.status(leader).await?;
                let learner = status.members.iter().any(|m| m.id == new_id && !m.voter);
                let applied =
                    status.applied_index.is_some() && status.applied_index == status.last_log_index;
                (learner && applied).then_some(true)
            }
        })
        .await;
        if !learner_committed {
            let answered = (&mut adding)
                .await
                .expect("the call's task")
                .expect("a membership answer")
                .into_inner();
            let failure = membership_failure(&answered);
            let member = cluster
                .members()
                .await
                .iter()
                .any(|member| member.id == new_id);
            assert!(
                is_unavailable(&failure) || !member,
                "node {new_id} was added, yet the answer says nothing was proposed: {failure:?}"
            );
            continue;
        }

        // The leader is cut off while it waits; the others elect one of
        // them; healed, the old leader learns it no longer leads, and the
        // change stops half-way with its learner entry committed.
        cluster.partitions.split(&[leader], &others);
        let (new_leader, _) = cluster.leader(&others, term).await;
        cluster.partitions.heal();
        let answered = tokio::time::timeout(WAIT, adding)
            .await
            .expect("the membership change is answered in time")
            .expect("the call's task")
            .expect("a membership answer")
            .into_inner();
        let failure = membership_failure(&answered);
        assert!(
            is_unavailable(&failure),
            "part of the change was committed, so the answer may not say nothing was \
             proposed: {failure:?}"
        );
        let status = cluster.status(new_leader).await.expect("status");
        assert!(
            status.members.iter().any(|m| m.id == new_id && !m.voter),
            "node {new_id} was added as a learner: {:?}",
            status.members
        );
        return;
    }
    panic!("the leader changed before every learner's entry committed");
}

/// Writes that callers send at the same moment go to the log together:
/// the node proposes what is waiting as one batch, so openraft appends
/// it in one write instead of one write per caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_are_proposed_together() {
    const CALLERS: usize = 64;
    let control = Arc::new(LogControl::default());
    let (_dir, node) = leading_node(control.clone()).await;
    // Applied, so the node is past its first entries.
    node.execute(put("warm"), None).await.expect("applied");
    let before = control.appends.load(Ordering::SeqCst);
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let node = node.clone();
            tokio::spawn(async move { node.execute(put(&format!("k{caller}")), None).await })
        })
        .collect();
    for caller in callers {
        caller.await.expect("the caller ran").expect("applied");
    }
    let appends = control.appends.load(Ordering::SeqCst) - before;
    assert!(
        appends <= CALLERS / 4,
        "{CALLERS} concurrent writes took {appends} log appends"
    );
}
