//! [`Node`]: an oncekv replica as its services see it. It refuses before
//! proposing what the state machine would refuse whatever the state (so a
//! refusal costs no log entry), limits the rate of session opens, proposes
//! what concurrent callers hand over together (one write to the log, not
//! one per caller), stamps proposals with cluster time, joins a retry to the identical request
//! already in flight (the retry rendezvous, keyed by the whole header,
//! secret included), answers a plain request that only reads (a
//! transaction of reads, say) as a linearizable read with no log entry,
//! so a reply past its bound is refused before anything is proposed,
//! serves linearizable and serializable reads, keeps
//! cluster time moving on an idle leader, reports status, and checks who
//! is calling (credentials and logins, on [`crate::auth`]'s tokens and
//! password hashes).
//! Deduplication itself is decided only by the state machine at apply.

use crate::auth::{AuthError, Credentials, LoginError, issue_token, principal_of, verify_password};
use crate::clock::LeaderClock;
use crate::raft::consensus::{Consensus, RaftStatus, WriteError};
use crate::raft::type_config::{Executed, NodeId, NodeInfo};
use crate::sync::lock;
use oncekv_state::{
    ClusterTime, Command, LogIndex, Origin, Principal, Proposal, Query, Reply, Request, RequestId,
    Secret, Stats, command_digest,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Settings of the node's request handling.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// How long a request waits for its entry to be applied before the
    /// caller is told "unavailable, may still apply".
    pub propose_timeout: Duration,
    /// How often an idle leader proposes a tick while anything can expire
    /// (a passed expiry deadline is ticked for sooner).
    pub tick_interval: Duration,
    /// Most session opens this node proposes per second (a burst of as
    /// many is allowed); more are refused as overloaded before proposing.
    pub session_opens_per_second: u32,
    /// How long (in cluster time) a login token is accepted.
    pub token_ttl: Duration,
    /// The peer port's TLS, when on: a new member must present a
    /// certificate for its id before it is added.
    pub peer_tls: Option<crate::tls::PeerTls>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            propose_timeout: Duration::from_secs(5),
            tick_interval: Duration::from_secs(1),
            session_opens_per_second: 1000,
            token_ttl: Duration::from_secs(600),
            peer_tls: None,
        }
    }
}

/// How often the leader looks for a passed expiry deadline (at most
/// [`NodeOptions::tick_interval`]): a lease or session expires this late
/// at most, plus the tick's commit.
const EXPIRY_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// A token bucket: `rate` tokens a second, holding at most `rate`.
#[derive(Debug)]
struct RateLimit {
    rate: f64,
    tokens: f64,
    refilled: Instant,
}

impl RateLimit {
    fn new(per_second: u32) -> RateLimit {
        let rate = f64::from(per_second);
        RateLimit {
            rate,
            tokens: rate,
            refilled: Instant::now(),
        }
    }

    /// Takes a token if one is left.
    fn take(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A node's status: consensus progress and the state machine's counts.
#[derive(Clone, Debug)]
pub struct NodeStatus {
    /// Consensus progress and membership.
    pub raft: RaftStatus,
    /// State machine counts.
    pub state: Stats,
}

/// Requests on sessions proposed here and not yet applied, by their whole
/// header (dedup key and secret) and command digest: a caller joins only a
/// request it could have sent itself.
type InFlightKey = (RequestId, Secret, u64, Option<Principal>);
type InFlight = HashMap<InFlightKey, Arc<ResultSlot>>;

/// Where a proposed request's result is delivered, once, to its caller
/// and to every retry joined to it meanwhile: one allocation and one
/// wake-up list per request, as the request path needs no more.
#[derive(Default)]
struct ResultSlot {
    result: OnceLock<Result<Executed, WriteError>>,
    delivered: Notify,
}

impl ResultSlot {
    /// Delivers `result` unless a result was delivered already, and wakes
    /// whoever waits.
    fn deliver(&self, result: Result<Executed, WriteError>) {
        if self.result.set(result).is_ok() {
            self.delivered.notify_waiters();
        }
    }

    /// Resolves once a result is delivered.
    async fn delivered(&self) {
        loop {
            let notified = self.delivered.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before looking, so a delivery in between wakes it.
            notified.as_mut().enable();
            if self.result.get().is_some() {
                return;
            }
            notified.await;
        }
    }
}

/// A request this node proposes: its result goes to `slot`, and `key`
/// (on a session) is what a retry joins it by until then.
struct InFlightRequest {
    /// The command's name, for the metrics.
    command: &'static str,
    key: Option<InFlightKey>,
    slot: Arc<ResultSlot>,
}

impl Drop for InFlightRequest {
    /// A request dropped unanswered (its proposer went away) may have been
    /// appended: its waiters are told so rather than left waiting.
    fn drop(&mut self) {
        self.slot.deliver(Err(WriteError::Unavailable(
            "its proposer went away before answering; it may still apply".to_string(),
        )));
    }
}

/// The metric handles of the requests one proposal answers, looked up
/// once per operation and outcome rather than once per request.
#[derive(Default)]
struct RequestMetrics {
    handles: Vec<RequestMetricHandles>,
}

struct RequestMetricHandles {
    command: &'static str,
    outcome: &'static str,
    total: metrics::Counter,
    /// Registered with the first latency, so a refusal that was never
    /// proposed adds no empty histogram.
    duration: Option<metrics::Histogram>,
}

impl RequestMetrics {
    /// Counts one answered request, with its latency when it was proposed.
    fn count(&mut self, command: &'static str, outcome: &'static str, latency: Option<Duration>) {
        let at = match self
            .handles
            .iter()
            .position(|h| h.command == command && h.outcome == outcome)
        {
            Some(at) => at,
            None => {
                self.handles.push(RequestMetricHandles {
                    command,
                    outcome,
                    total: metrics::counter!(
                        "oncekv_requests_total", "operation" => command, "outcome" => outcome
                    ),
                    duration: None,
                });
                self.handles.len() - 1
            }
        };
        let handles = &mut self.handles[at];
        handles.total.increment(1);
        if let Some(latency) = latency {
            handles
                .duration
                .get_or_insert_with(|| {
                    metrics::histogram!(
                        "oncekv_request_duration_seconds",
                        "operation" => command,
                        "outcome" => outcome
                    )
                })
                .record(latency.as_secs_f64());
        }
    }
}

/// A request waiting to be proposed, with who sent it.
type Waiting = (Request, InFlightRequest, Option<Principal>);

/// The requests that callers handed over for proposing and that no
/// proposal has taken yet: the concurrent calls of many clients (each an
/// etcd call or an `ExecuteBatch`) go out as one proposal, consecutive
/// log entries of one write, rather than one proposal each.
#[derive(Default)]
struct ProposalQueue {
    waiting: Vec<Waiting>,
    /// A task is on its way to propose what is waiting.
    scheduled: bool,
}

/// A request's answer: known at once (refused before proposing), or once
/// its entry (or its twin's, already in flight) is applied.
enum Answer {
    Now(Result<Executed, WriteError>),
    Later(Arc<ResultSlot>),
}

struct Inner {
    consensus: Consensus,
    options: NodeOptions,
    limits: oncekv_state::Limits,
    clock: LeaderClock,
    in_flight: Mutex<InFlight>,
    proposals: Mutex<ProposalQueue>,
    last_proposal: Mutex<Instant>,
    session_opens: Mutex<RateLimit>,
    /// One state digest at a time: it reads the whole state.
    digesting: tokio::sync::Mutex<()>,
}

/// An oncekv replica.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.inner.consensus.id())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// A node over started consensus; spawns its ticker.
    pub fn new(consensus: Consensus, options: NodeOptions) -> Node {
        let limits = consensus.limits();
        let session_opens = Mutex::new(RateLimit::new(options.session_opens_per_second));
        let node = Node {
            inner: Arc::new(Inner {
                consensus,
                options,
                limits,
                clock: LeaderClock::default(),
                in_flight: Mutex::new(HashMap::new()),
                proposals: Mutex::default(),
                last_proposal: Mutex::new(Instant::now()),
                session_opens,
                digesting: tokio::sync::Mutex::new(()),
            }),
        };
        let weak = Arc::downgrade(&node.inner);
        let interval = node.inner.options.tick_interval;
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(EXPIRY_CHECK_INTERVAL.min(interval));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut snapshot_checked = Instant::now();
            loop {
                ticker.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let node = Node { inner };
                if snapshot_checked.elapsed() >= interval {
                    snapshot_checked = Instant::now();
                    node.snapshot_if_due().await;
                }
                node.tick_if_due().await;
            }
        });
        node
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.inner.consensus.id()
    }

    /// How long a login token is accepted.
    pub fn token_ttl(&self) -> Duration {
        self.inner.options.token_ttl
    }

    /// The consensus handle (for the peer service).
    pub fn consensus(&self) -> &Consensus {
        &self.inner.consensus
    }

    /// Draws the secret of a new session (on the leader, into the entry).
    pub fn draw_secret() -> Secret {
        Secret(crate::raft::runtime::secret_bits())
    }

    /// The client address of node `id`, if it is a member.
    pub fn client_address_of(&self, id: NodeId) -> Option<String> {
        self.inner
            .consensus
            .member(id)
            .map(|info| info.client_address)
    }

    /// The peer address of node `id`, if it is a member.
    pub fn peer_address_of(&self, id: NodeId) -> Option<String> {
        self.inner
            .consensus
            .member(id)
            .map(|info| info.peer_address)
    }

    /// Asks for a snapshot when enough was applied since the last one
    /// ([`crate::raft::consensus::Consensus::snapshot_due`]).
    async fn snapshot_if_due(&self) {
        if self.inner.consensus.snapshot_due()
            && let Err(error) = self.inner.consensus.trigger_snapshot().await
        {
            tracing::debug!(%error, "snapshot not triggered");
        }
    }

    /// On the leader, proposes a tick (an entry that only carries time)
    /// once the clock passes the applied state's next expiry, so a lease,
    /// session or idempotency key expires on time without other writes;
    /// and every tick interval without proposals while anything can
    /// expire, so cluster time keeps up with the leader's clock.
    async fn tick_if_due(&self) {
        let leadership = self.inner.consensus.leadership();
        if !leadership.is_leader {
            return;
        }
        let Some(deadline) = self.inner.consensus.next_expiry() else {
            return;
        };
        let idle = self.lock_last_proposal().elapsed() >= self.inner.options.tick_interval;
        // What a proposal made now would carry (the stamp never goes back,
        // so asking does not change what later proposals carry).
        let now = self
            .inner
            .clock
            .stamp(leadership.term, self.inner.consensus.cluster_time());
        if (idle || now > deadline)
            && let Err(error) = self.execute(Request::plain(Command::Tick), None).await
        {
            tracing::debug!(%error, "tick not applied");
        }
    }

    fn lock_last_proposal(&self) -> std::sync::MutexGuard<'_, Instant> {
        lock(&self.inner.last_proposal)
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, InFlight> {
        lock(&self.inner.in_flight)
    }

    /// Proposes a request and returns what applying it decided. A request
    /// the state machine would refuse whatever the state is refused here
    /// ([`WriteError::Invalid`]), and session opens beyond the configured
    /// rate too ([`WriteError::Overloaded`]): neither costs a log entry. A
    /// request on a session that is already in flight here, with the same
    /// header, command and principal, waits for that entry's result instead
    /// of being proposed again. `principal` is who sent it (see
    /// [`Node::authenticate`]); the state machine checks its permissions.
    pub async fn execute(
        &self,
        request: Request,
        principal: Option<Principal>,
    ) -> Result<Executed, WriteError> {
        let mut results = self.execute_many(vec![request], principal).await;
        results.pop().unwrap_or_else(|| {
            Err(WriteError::Unavailable(
                "no answer; it may still apply".to_string(),
            ))
        })
    }

    /// [`execute`](Self::execute) for many requests from one caller: each
    /// is admitted, joined to its in-flight twin, refused, or (a plain
    /// request that only reads) answered at once as a read, on its own,
    /// and those left are proposed together, in their order, as
    /// consecutive log entries of one write (with those of other callers
    /// that came meanwhile). A read answered at once may
    /// not see the writes of the same batch: they were sent together, so
    /// neither is ordered before the other. Returns one result per
    /// request, in order.
    pub async fn execute_many(
        &self,
        requests: Vec<Request>,
        principal: Option<Principal>,
    ) -> Vec<Result<Executed, WriteError>> {
        let deadline = self.inner.options.propose_timeout;
        let mut answers = Vec::with_capacity(requests.len());
        let mut proposing = Vec::new();
        for request in requests {
            let request = match self.refuse_early(request).await {
                Ok(request) => request,
                Err(error) => {
                    answers.push(Answer::Now(Err(error)));
                    continue;
                }
            };
            if let Some(answer) = self.answer_unlogged(&request, principal.as_ref()).await {
                answers.push(Answer::Now(answer));
                continue;
            }
            let key: Option<InFlightKey> = match &request.origin {
                Origin::Session(header) => Some((
                    header.id,
                    header.secret,
                    command_digest(&request.command),
                    principal.clone(),
                )),
                _ => None,
            };
            let mut in_flight = self.lock_in_flight();
            if let Some(joined) = key.as_ref().and_then(|key| in_flight.get(key)) {
                metrics::counter!("oncekv_retry_rendezvous_total").increment(1);
                answers.push(Answer::Later(joined.clone()));
                continue;
            }
            let slot = Arc::new(ResultSlot::default());
            if let Some(key) = &key {
                in_flight.insert(key.clone(), slot.clone());
            }
            answers.push(Answer::Later(slot.clone()));
            let in_flight = InFlightRequest {
                command: request.command.name(),
                key,
                slot,
            };
            proposing.push((request, in_flight, principal.clone()));
        }
        self.queue_for_proposal(proposing);
        // One timer for the whole call; the results come in log order, so
        // waiting for each in turn wakes this task about once per result.
        let waits = async {
            for answer in &answers {
                if let Answer::Later(slot) = answer {
                    slot.delivered().await;
                }
            }
        };
        let _ = tokio::time::timeout(deadline, waits).await;
        answers
            .into_iter()
            .map(|answer| match answer {
                Answer::Now(result) => result,
                Answer::Later(slot) => slot.result.get().cloned().unwrap_or_else(|| {
                    Err(WriteError::Unavailable(format!(
                        "not applied within {} ms; it may still apply",
                        deadline.as_millis()
                    )))
                }),
            })
            .collect()
    }

    /// Answers, at the leader, a request that needs no log entry
    /// ([`Request::needs_log`]: a plain read, or a plain transaction that
    /// only reads) as a linearizable read: once the leader has confirmed
    /// it leads, from a copy of its applied state, through the state
    /// machine's own path for it ([`StateMachine::answer_unlogged`]), so
    /// a reply past the bound is refused before anything is proposed. The
    /// answer's index is the last applied one, which it reflects. `None`
    /// for a request that must be proposed.
    ///
    /// [`StateMachine::answer_unlogged`]: oncekv_state::StateMachine::answer_unlogged
    async fn answer_unlogged(
        &self,
        request: &Request,
        principal: Option<&Principal>,
    ) -> Option<Result<Executed, WriteError>> {
        if request.needs_log() {
            return None;
        }
        if let Some(refused) = self.not_leader() {
            return Some(Err(refused));
        }
        if let Err(error) = self.inner.consensus.read_barrier().await {
            return Some(Err(error));
        }
        let copy = self.inner.consensus.state_copy();
        let index = copy.last_applied().unwrap_or(LogIndex(0));
        let outcome = copy.answer_unlogged(request, principal)?;
        Some(Ok(Executed { index, outcome }))
    }

    /// Why this node does not carry out what only the leader carries out,
    /// unless it leads: where to go instead, or, once its consensus has
    /// stopped, that it is unavailable ([`Consensus::leading`]).
    pub fn not_leader(&self) -> Option<WriteError> {
        self.inner.consensus.leading().err()
    }

    /// Refuses before proposing what the state machine would refuse
    /// whatever the state, and session opens beyond the configured rate;
    /// hashes the passwords a command carries.
    async fn refuse_early(&self, mut request: Request) -> Result<Request, WriteError> {
        self.inner.limits.check_request(&request)?;
        crate::auth::hash_passwords(&mut request.command).await?;
        if matches!(request.command, Command::OpenSession { .. })
            && !lock(&self.inner.session_opens).take()
        {
            return Err(WriteError::Overloaded("session-open-rate"));
        }
        Ok(request)
    }

    /// Queues `requests` for proposing, in their order, and makes sure a
    /// task will propose them. That task first lets the other tasks that
    /// are ready run (the calls that arrived with these), so what they
    /// hand over meanwhile joins the same proposal; with nothing else
    /// ready, it proposes at once.
    fn queue_for_proposal(&self, requests: Vec<Waiting>) {
        if requests.is_empty() {
            return;
        }
        let mut queue = lock(&self.inner.proposals);
        queue.waiting.extend(requests);
        if std::mem::replace(&mut queue.scheduled, true) {
            return;
        }
        drop(queue);
        let node = self.clone();
        tokio::spawn(async move {
            after_the_ready_tasks().await;
            let waiting = {
                let mut queue = lock(&node.inner.proposals);
                queue.scheduled = false;
                std::mem::take(&mut queue.waiting)
            };
            node.propose(waiting).await;
        });
    }

    /// Proposes `requests` in one write, answers each through its channel
    /// as its entry applies, and then forgets it as in flight.
    async fn propose(&self, requests: Vec<Waiting>) {
        let mut in_flight = Vec::with_capacity(requests.len());
        let mut proposing = Vec::with_capacity(requests.len());
        for (request, waiting, principal) in requests {
            in_flight.push(waiting);
            proposing.push((request, principal));
        }
        let requests = proposing;
        // Refused here, nothing reaches openraft: "not the leader" is true.
        let leadership = match self.inner.consensus.leading() {
            Ok(leadership) => leadership,
            Err(refused) => {
                let mut counted = RequestMetrics::default();
                for request in &in_flight {
                    self.answer(request, Err(refused.clone()), None, &mut counted);
                }
                return;
            }
        };
        // What the leader stamps on an entry, in one place: its cluster
        // time, who sent it, a new session's secret and a new token key.
        let applied_time = self.inner.consensus.cluster_time();
        let time = self.inner.clock.stamp(leadership.term, applied_time);
        let proposals = requests
            .into_iter()
            .map(|(mut request, principal)| {
                match &mut request.command {
                    Command::OpenSession { secret, .. } => *secret = Node::draw_secret(),
                    Command::Auth(oncekv_state::AuthCommand::Enable { token_key }) => {
                        *token_key = crate::auth::draw_token_key();
                    }
                    _ => {}
                }
                Proposal {
                    time,
                    principal,
                    request,
                }
            })
            .collect();
        *self.lock_last_proposal() = Instant::now();
        let started = Instant::now();
        let mut counted = RequestMetrics::default();
        self.inner
            .consensus
            .write_many(proposals, |position, result| {
                if let Some(request) = in_flight.get(position) {
                    self.answer(request, result, Some(started), &mut counted);
                }
            })
            .await;
    }

    /// Sends `result` to whoever waits for `request`, forgets it as in
    /// flight, and counts it (with its latency, when it was proposed).
    fn answer(
        &self,
        request: &InFlightRequest,
        result: Result<Executed, WriteError>,
        proposed: Option<Instant>,
        counted: &mut RequestMetrics,
    ) {
        let command = request.command;
        let outcome = match &result {
            Ok(executed) => executed.outcome.name(),
            Err(WriteError::NotLeader { .. }) => "not_leader",
            Err(WriteError::Unavailable(_)) => "unavailable",
            Err(WriteError::Invalid(_)) => "invalid",
            Err(WriteError::Overloaded(_)) => "overloaded",
            Err(WriteError::Refused(_)) => "refused",
            Err(WriteError::Unauthenticated(_)) => "unauthenticated",
            Err(WriteError::PermissionDenied(_)) => "permission_denied",
        };
        counted.count(command, outcome, proposed.map(|at| at.elapsed()));
        request.slot.deliver(result);
        if let Some(key) = &request.key {
            let mut in_flight = self.lock_in_flight();
            if in_flight
                .get(key)
                .is_some_and(|slot| Arc::ptr_eq(slot, &request.slot))
            {
                in_flight.remove(key);
            }
        }
    }

    /// Answers a query: linearizable (the leader confirms it leads, by its
    /// lease or read-index: `ReadPolicy`) unless `serializable`
    /// (then from this replica's applied state, possibly stale), if
    /// `principal` may read it.
    pub async fn read(
        &self,
        query: &Query,
        serializable: bool,
        principal: Option<&Principal>,
    ) -> Result<Reply, WriteError> {
        let (reply, _) = self.read_at(query, serializable, principal).await?;
        Ok(reply)
    }

    /// [`read`](Self::read), returning the last applied index it was read
    /// at too.
    pub async fn read_at(
        &self,
        query: &Query,
        serializable: bool,
        principal: Option<&Principal>,
    ) -> Result<(Reply, u64), WriteError> {
        let (reply, applied, ()) = self
            .read_then(query, serializable, principal, |_, _| ())
            .await?;
        Ok((reply, applied))
    }

    /// [`read_at`](Self::read_at), then `then` on the same applied state:
    /// for what the reply does not carry (such as the lease each read key
    /// is attached to). A read that walks keys (a scan, a range and its
    /// count, a read of the past) runs on a copy of the applied state
    /// taken under the lock and read outside it, so writes apply
    /// meanwhile; the copy shares the state's maps, so it costs the same
    /// whatever their size.
    pub async fn read_then<R>(
        &self,
        query: &Query,
        serializable: bool,
        principal: Option<&Principal>,
        then: impl FnOnce(&oncekv_state::StateMachine, &Reply) -> R,
    ) -> Result<(Reply, u64, R), WriteError> {
        if !serializable {
            self.inner.consensus.read_barrier().await?;
        }
        let read = |state: &oncekv_state::StateMachine| {
            let applied = state.last_applied().map_or(0, |index| index.0);
            // A lease list names only the leases `principal` may use.
            let reply = state.read_as(principal, query);
            let more = then(state, &reply);
            (reply, applied, more)
        };
        let walks = matches!(
            query,
            Query::Scan { .. } | Query::Range { .. } | Query::At { .. }
        );
        if walks {
            let copy = self.inner.consensus.with_state(|state| {
                state
                    .check_query(principal, query)
                    .map_err(WriteError::PermissionDenied)?;
                Ok::<_, WriteError>(state.clone())
            })?;
            return Ok(read(&copy));
        }
        self.inner.consensus.with_state(|state| {
            state
                .check_query(principal, query)
                .map_err(WriteError::PermissionDenied)?;
            Ok(read(state))
        })
    }

    /// Starts a watch of `spec` on this replica's applied state, if
    /// `principal` may read every key it covers (for the recipes inside
    /// the node; clients' watches are [`watch_as`](Self::watch_as)). It
    /// ends if the principal loses that right.
    pub fn watch(
        &self,
        spec: crate::watch::WatchSpec,
        principal: Option<&Principal>,
    ) -> Result<tokio::sync::mpsc::Receiver<crate::watch::WatchMessage>, WriteError> {
        let covered = Query::covering(&spec.key, &spec.scope);
        let principal = principal.cloned();
        let check: crate::watch::Check = Arc::new(move |state| {
            state
                .check_query(principal.as_ref(), &covered)
                .map_err(WriteError::PermissionDenied)
        });
        let rights = crate::watch::Rights::new(check, None);
        crate::watch::watch(self.watch_lock(), spec, Some(rights))
    }

    /// Whom a client's watches count against: the user `credentials`
    /// authenticate, or (authentication off) the source address of
    /// `address`; and `channel`, its connection or stream. Refused as a
    /// call is when the credentials do not hold.
    pub fn watch_owner(
        &self,
        credentials: &crate::auth::Credentials,
        address: Option<std::net::SocketAddr>,
        channel: Option<crate::watch::Holder>,
    ) -> Result<crate::watch::WatchOwner, WriteError> {
        use crate::watch::Holder;
        let user = match self.authenticate(credentials)? {
            Some(principal) => Some(Holder::User(principal.0)),
            None => address.map(|address| Holder::Address(address.ip())),
        };
        let mut owner = None;
        self.inner.consensus.with_state_and_watch(&mut |_, hub| {
            owner = Some(hub.owner(user.clone(), channel.clone()))
        });
        Ok(owner.unwrap_or_default())
    }

    /// Starts a client's watch of `spec` for `owner`, if `credentials`
    /// authenticate a user who may read every key it covers and no cap on
    /// watchers is reached. The watch ends when they no longer do: a
    /// changed password, a deleted user, a revoked role or permission,
    /// enforcement switched on, or the token's expiry.
    pub fn watch_as(
        &self,
        spec: crate::watch::WatchSpec,
        credentials: &crate::auth::Credentials,
        owner: &crate::watch::WatchOwner,
    ) -> Result<crate::watch::WatchInbox, crate::watch::WatchError> {
        let covered = Query::covering(&spec.key, &spec.scope);
        let expires = credentials
            .token
            .as_deref()
            .and_then(crate::auth::token_expires);
        let credentials = credentials.clone();
        let check: crate::watch::Check = Arc::new(move |state| {
            let principal =
                crate::auth::principal_of(state.auth(), &credentials, state.cluster_time())
                    .map_err(|error| WriteError::Unauthenticated(error.to_string()))?;
            state
                .check_query(principal.as_ref(), &covered)
                .map_err(WriteError::PermissionDenied)
        });
        let rights = crate::watch::Rights::new(check, expires);
        crate::watch::start(self.watch_lock(), spec, owner, Some(rights))
    }

    /// How a watch reaches the applied state and its hub.
    fn watch_lock(&self) -> impl Fn(crate::watch::Visit<'_>) + Send + Sync + 'static {
        let consensus = self.inner.consensus.clone();
        move |f: crate::watch::Visit<'_>| consensus.with_state_and_watch(f)
    }

    /// Consensus progress and state machine counts.
    pub fn status(&self) -> NodeStatus {
        let raft = self.inner.consensus.status();
        NodeStatus {
            raft,
            state: self.inner.consensus.stats(),
        }
    }

    /// What `hash` computes over a copy of the whole state, on a blocking
    /// thread, one whole-state computation at a time (with digests and
    /// backups: each holds a copy and takes a core).
    pub async fn over_state_copy<T: Send + 'static>(
        &self,
        hash: impl FnOnce(oncekv_state::StateMachine) -> T + Send + 'static,
    ) -> T {
        let _one_at_a_time = self.inner.digesting.lock().await;
        let copy = self.inner.consensus.state_copy();
        match tokio::task::spawn_blocking(move || hash(copy)).await {
            Ok(result) => result,
            Err(panicked) => std::panic::resume_unwind(panicked.into_panic()),
        }
    }

    /// A digest of this replica's state machine and the index it was taken
    /// at. The state lock is held only to copy the state; the digest is
    /// computed from the copy on a blocking thread while applies go on.
    /// Calls are served one at a time (each holds a copy): for checks, not
    /// for polling; status reports counters only.
    pub async fn state_digest(&self) -> (Option<LogIndex>, u64) {
        self.over_state_copy(|copy| (copy.last_applied(), copy.state_digest()))
            .await
    }

    /// A consistent copy of the whole state, for a backup: on the leader,
    /// after a read barrier (so it holds every acknowledged write); the
    /// lock is held only to copy, the snapshot bytes are written to a file
    /// off the async threads (never a buffer as large as the state), one
    /// backup or digest at a time.
    pub async fn backup(&self) -> Result<crate::backup::BackupFile, WriteError> {
        self.inner.consensus.leading()?;
        self.inner.consensus.read_barrier().await?;
        let _one_at_a_time = self.inner.digesting.lock().await;
        let copy = self.inner.consensus.state_copy();
        let dir = self.inner.consensus.state_dir().to_path_buf();
        let made =
            tokio::task::spawn_blocking(move || crate::backup::BackupFile::make(&copy, &dir)).await;
        match made {
            Ok(Ok(backup)) => Ok(backup),
            Ok(Err(error)) => Err(WriteError::Unavailable(format!(
                "writing the backup failed: {error}"
            ))),
            Err(error) => Err(WriteError::Unavailable(format!(
                "making the backup failed: {error}"
            ))),
        }
    }

    /// Adds a member (learner first, then voter). With peer TLS on, the new
    /// member must first complete a handshake presenting a certificate of
    /// the peer CA for `node-<id>`; otherwise it is refused, unadded.
    pub async fn add_member(&self, id: NodeId, info: NodeInfo) -> Result<(), WriteError> {
        if let Some(tls) = &self.inner.options.peer_tls {
            tls.probe(id, &info.peer_address)
                .await
                .map_err(|why| WriteError::Refused(format!("node {id} not added: {why}")))?;
        }
        self.inner.consensus.add_member(id, info).await
    }

    /// Removes a member. The leader does not remove itself: the members
    /// refuse a sender once they hold the entry that removes it, so it
    /// would never learn that its removal committed and would lead on,
    /// alone. It hands leadership to another voter first and answers
    /// [`WriteError::NotLeader`] naming it (clients ask the new leader,
    /// which removes this node as a follower), or
    /// [`WriteError::Unavailable`] if no voter took it.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), WriteError> {
        let consensus = &self.inner.consensus;
        if id != self.id() {
            return consensus.remove_member(id).await;
        }
        consensus.leading()?;
        if self.hand_over_leadership(id).await.is_none() {
            return Err(WriteError::Refused(format!(
                "node {id} is the only voter: it cannot be removed"
            )));
        }
        match consensus.leading() {
            Err(not_leader) => Err(not_leader),
            Ok(_) => Err(WriteError::Unavailable(format!(
                "node {id} leads and hands leadership to another voter before it is removed; \
                 none took it yet (try again)"
            ))),
        }
    }

    /// Hands leadership to another voter than this node: to one that
    /// answered within an election timeout and holds the whole log, other
    /// than `avoid` if there is one. Waits until it leads, at most three
    /// election timeouts (else another is elected once this node stops
    /// leading). The voter asked, or `None` if there is no other voter.
    pub async fn hand_over_leadership(&self, avoid: NodeId) -> Option<NodeId> {
        let me = self.id();
        let consensus = &self.inner.consensus;
        let view = consensus.membership();
        let status = self.status().raft;
        let reachable = view.reachable.clone().unwrap_or_default();
        let caught_up = |id: NodeId| {
            status
                .replication
                .iter()
                .any(|(follower, matched)| *follower == id && *matched == status.last_log_index)
        };
        let target = view
            .members
            .iter()
            .filter(|member| member.voter && member.id != me)
            .map(|member| member.id)
            .max_by_key(|id| (*id != avoid, reachable.contains(id), caught_up(*id)))?;
        if let Err(error) = consensus.transfer_leader(target).await {
            tracing::warn!(%error, target, "handing leadership over failed");
        } else if !consensus.wait_for_leader(target).await {
            tracing::info!(
                target,
                "leadership was not handed over within three election timeouts; another voter \
                 will be elected"
            );
        }
        Some(target)
    }
}

/// Who is calling: a call's credentials checked against the replicated
/// users ([`crate::auth`]), and logins.
impl Node {
    /// The principal of a call: `None` while authentication is off,
    /// otherwise its user, or why it has none.
    pub fn authenticate(&self, credentials: &Credentials) -> Result<Option<Principal>, WriteError> {
        self.consensus()
            .with_state(|state| principal_of(state.auth(), credentials, state.cluster_time()))
            .map_err(|error| WriteError::Unauthenticated(error.to_string()))
    }

    /// The principal of a call that only the leader can carry out (a write,
    /// a linearizable read). A follower's applied state may lag the
    /// leader's, where a new user, role or password already counts: a
    /// follower that cannot authenticate such a call sends the caller to
    /// the leader instead of refusing it.
    pub fn authenticate_at_leader(
        &self,
        credentials: &Credentials,
    ) -> Result<Option<Principal>, WriteError> {
        self.authenticate(credentials)
            .map_err(|error| self.not_leader().unwrap_or(error))
    }

    /// Refuses a call whose user is not an admin (anyone is while
    /// authentication is off): membership changes, status details, the
    /// state digest.
    pub fn require_admin(&self, credentials: &Credentials, what: &str) -> Result<(), WriteError> {
        let principal = self.authenticate(credentials)?;
        let admin = self
            .consensus()
            .with_state(|state| state.auth().is_admin(principal.as_ref()));
        if admin {
            return Ok(());
        }
        let user = principal.map_or_else(String::new, |p| p.0);
        Err(WriteError::PermissionDenied(format!(
            "{what} needs the admin role; user {user:?} lacks it"
        )))
    }

    /// Checks a password against the user's (after a read barrier, so a
    /// changed password counts at once) and returns a token valid for `ttl`
    /// of cluster time, and when it expires. `source` is the caller's
    /// address, if known.
    ///
    /// Cheap refusals first: a user name or an address that failed too
    /// often lately is refused before the read barrier
    /// ([`crate::login_guard`]). An unknown user, or one without a
    /// password, costs what a wrong password costs (its password is
    /// checked against a dummy hash), counts as a failure the same, and is
    /// answered the same.
    pub async fn login(
        &self,
        user: &str,
        password: &str,
        ttl: std::time::Duration,
        source: Option<std::net::IpAddr>,
    ) -> Result<(String, ClusterTime), LoginError> {
        let attempt = crate::login_guard::guard().begin_attempt(user, source)?;
        self.consensus().read_barrier().await?;
        let found = self.consensus().with_state(|state| {
            let auth = state.auth();
            let key = auth.token_key().copied();
            let user = auth.user(user).cloned();
            (auth.is_enabled(), key, user, state.cluster_time())
        });
        let (enabled, key, found, now) = found;
        if !enabled {
            return Err(WriteError::Unauthenticated(
                "authentication is not enabled: calls need no token".to_string(),
            )
            .into());
        }
        let hash = found.as_ref().and_then(|found| found.password_hash.clone());
        let password = password.to_string();
        let matches = attempt
            .verify(move || {
                // Made on first use, before any check: every first login
                // pays for it, whoever it names.
                let dummy = crate::auth::dummy_hash();
                match hash {
                    Some(hash) => verify_password(&hash, &password),
                    None => {
                        verify_password(dummy, &password);
                        false
                    }
                }
            })
            .await?;
        let (true, Some(key), Some(found)) = (matches, key, found) else {
            attempt.failed();
            tracing::debug!("a login failed: wrong user name or password");
            return Err(WriteError::Unauthenticated(AuthError::WrongPassword.to_string()).into());
        };
        drop(attempt);
        metrics::counter!("oncekv_logins_total", "result" => "ok").increment(1);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let expires = now.plus_ms(ttl_ms);
        Ok((issue_token(&key, user, found.revision, expires), expires))
    }
}

/// Resolves once the tasks that were ready to run on this worker have run:
/// the task wakes itself, which puts it at the back of the worker's queue
/// (a task woken while it runs is queued behind the others, never in the
/// slot that runs next). Unlike `tokio::task::yield_now`, which waits
/// for the worker to next poll its I/O driver (under load, dozens of
/// tasks later), this lets only what was ready go first.
async fn after_the_ready_tasks() {
    let mut woken = false;
    std::future::poll_fn(|cx| {
        if std::mem::replace(&mut woken, true) {
            std::task::Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executed(index: u64) -> Result<Executed, WriteError> {
        Ok(Executed {
            index: LogIndex(index),
            outcome: oncekv_state::Outcome::SessionExpired,
        })
    }

    #[tokio::test]
    async fn a_result_slot_answers_every_waiter_with_its_first_result() {
        let slot = Arc::new(ResultSlot::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let slot = slot.clone();
                tokio::spawn(async move {
                    slot.delivered().await;
                    slot.result.get().cloned()
                })
            })
            .collect();
        tokio::task::yield_now().await;
        slot.deliver(executed(7));
        slot.deliver(executed(8));
        for waiter in waiters {
            assert_eq!(
                waiter.await.expect("waiter").expect("a result"),
                executed(7)
            );
        }
        // A waiter that comes after the result has it at once.
        slot.delivered().await;
        assert_eq!(slot.result.get().cloned(), Some(executed(7)));
    }

    #[tokio::test]
    async fn a_request_dropped_unanswered_tells_its_waiters_it_may_still_apply() {
        let slot = Arc::new(ResultSlot::default());
        let request = InFlightRequest {
            command: "put",
            key: None,
            slot: slot.clone(),
        };
        let waiter = tokio::spawn({
            let slot = slot.clone();
            async move { slot.delivered().await }
        });
        drop(request);
        waiter.await.expect("waiter");
        match slot.result.get() {
            Some(Err(WriteError::Unavailable(why))) => assert!(why.contains("may still apply")),
            other => panic!("unexpected {other:?}"),
        }
        // An answered request keeps its answer when dropped.
        let answered = Arc::new(ResultSlot::default());
        answered.deliver(executed(3));
        drop(InFlightRequest {
            command: "put",
            key: None,
            slot: answered.clone(),
        });
        assert_eq!(answered.result.get().cloned(), Some(executed(3)));
    }
}
