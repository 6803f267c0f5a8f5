//! The live workload through etcd's v3 API, written as etcd's users write
//! read-modify-write code (Kubernetes' `GuaranteedUpdate`): read the key,
//! then a Txn that puts the new value only if the key's mod revision is
//! still the one read, and on a failed compare read again and retry. Each
//! client runs one operation at a time, chosen by its own seeded RNG:
//!
//! * an APPEND of a unique token (the Txn writes the value read plus the
//!   token): a token applied twice shows twice;
//! * an INCR of a counter by 1 (the Txn writes the number read plus one);
//! * a PUT of a unique value with `prev_kv`, and a linearizable GET, on
//!   registers.
//!
//! A write whose reply is lost (a timeout, a broken connection) is resent.
//! In [`ClientMode::Session`] every write carries the
//! `oncekv-idempotency-key` metadata, the same on every resend, and is
//! resent until its answer is known: the node applies it once and a
//! resend gets the first response, so the Txn answers "succeeded" and the
//! update ends. [`ClientMode::Naive`] sends no metadata: a resend of an
//! applied Txn finds the mod revision changed, the client reads again and
//! applies its update a second time, the double application etcd's own
//! clients make through lost replies. The checkers must catch it; and
//! against a real etcd, which ignores the metadata, they must catch it in
//! either mode.
//!
//! Operations are recorded as the history's APPEND, INCR, PUT and GET, so
//! the exactly-once, counter and linearizability checkers judge them as
//! they judge the native workload's; each write's answers on the wire are
//! recorded by the fault proxy under its idempotency key
//! (`client_proxy`), for the replies checker.

use crate::etcd_resources;
use crate::recorder::Recorder;
use crate::workload::{ClientMode, Stop, WorkloadOptions};
use oncekv_check::record::{
    Bytes, ClientId, FailReason, NodeId, Op, Outcome, Reply, RequestIdentity,
};
use oncekv_proto::IDEMPOTENCY_KEY_METADATA;
use oncekv_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcd::etcdserverpb::{
    Compare, PutRequest, RangeRequest, RequestOp, StatusRequest, TxnRequest, TxnResponse,
    request_op,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// How long one call may take before the client gives up on it (and, for
/// a write, does not know whether it applied).
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1_000);

/// Most sends of one write in [`ClientMode::Naive`], as a client with a
/// fixed retry count makes them.
const NAIVE_SENDS_MAX: u32 = 4;

/// Most read-then-Txn rounds of one update that find the key changed
/// meanwhile, once the run has stopped.
const ROUNDS_AFTER_STOP_MAX: u32 = 20;

/// What one call came to.
pub(crate) enum Sent<T> {
    /// The node answered.
    Answered(T),
    /// Certainly not applied.
    NotApplied(Status),
    /// Perhaps applied.
    Unknown(Status),
}

/// Whether `status` says the call was certainly not carried out: a
/// refusal etcd (and oncekv's etcd API) gives only before proposing.
pub(crate) fn certainly_not_applied(status: &Status) -> bool {
    match status.code() {
        Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::ResourceExhausted
        | Code::Unimplemented => true,
        Code::Unavailable => {
            let message = status.message();
            message.contains("etcdserver: not leader")
                || message.contains("etcdserver: no leader")
                || message.contains("node unreachable")
        }
        _ => false,
    }
}

/// Why a refusal refused, in the history's terms.
pub(crate) fn reason_of(status: &Status) -> FailReason {
    match status.code() {
        Code::Unavailable if status.message().contains("node unreachable") => {
            FailReason::Unreachable
        }
        Code::Unavailable => FailReason::NotLeader,
        Code::ResourceExhausted => FailReason::Overloaded,
        Code::PermissionDenied | Code::Unauthenticated => FailReason::PermissionDenied,
        Code::InvalidArgument => FailReason::Invalid,
        Code::FailedPrecondition => FailReason::RequestMismatch,
        _ => FailReason::Other,
    }
}

/// A write the workload sends.
#[derive(Clone)]
pub(crate) enum Write {
    Put(PutRequest),
    Txn(TxnRequest),
}

/// A write's answer.
pub(crate) enum Written {
    /// A put, and the value it replaced.
    Put(Option<Vec<u8>>),
    /// A transaction's response.
    Txn(TxnResponse),
}

/// One client.
pub(crate) struct EtcdWorker {
    pub(crate) id: ClientId,
    pub(crate) endpoints: Vec<KvClient<Channel>>,
    /// The endpoint in use; the next after a failure, as etcd's clients
    /// move on.
    pub(crate) current: usize,
    pub(crate) options: WorkloadOptions,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) rng: StdRng,
    pub(crate) stop: Stop,
    pub(crate) stopped_at: Option<Instant>,
    /// Operations issued, for unique tokens and keys.
    pub(crate) issued: u64,
}

impl EtcdWorker {
    /// Whether retries of an unknown outcome must end: the run stopped
    /// more than the grace period ago.
    pub(crate) fn retries_over(&mut self) -> bool {
        if !self.stop.stopped() {
            return false;
        }
        let since = *self.stopped_at.get_or_insert_with(Instant::now);
        since.elapsed() >= self.options.grace
    }

    pub(crate) fn client(&self) -> KvClient<Channel> {
        self.endpoints[self.current % self.endpoints.len()].clone()
    }

    /// Moves on to the next endpoint and waits a little.
    pub(crate) async fn next_endpoint(&mut self) {
        self.current = self.current.wrapping_add(1);
        let pause = self.rng.random_range(20..300);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }

    pub(crate) fn token(&mut self) -> Vec<u8> {
        self.issued += 1;
        format!("c{}-{}", self.id, self.issued).into_bytes()
    }

    /// Reads `key` linearizably: its value and mod revision (0: absent).
    pub(crate) async fn get(&mut self, key: &[u8]) -> Result<(Option<Vec<u8>>, i64), Status> {
        let mut request = tonic::Request::new(RangeRequest {
            key: key.to_vec(),
            ..RangeRequest::default()
        });
        request.set_timeout(ATTEMPT_TIMEOUT);
        let response = self.client().range(request).await?.into_inner();
        Ok(match response.kvs.into_iter().next() {
            Some(kv) => (Some(kv.value), kv.mod_revision),
            None => (None, 0),
        })
    }

    /// Sends `write` once, under `key` if given.
    pub(crate) async fn send(&mut self, write: &Write, key: Option<&[u8]>) -> Sent<Written> {
        let metadata = |request: &mut tonic::metadata::MetadataMap| {
            if let Some(key) = key
                && let Ok(value) = tonic::metadata::MetadataValue::try_from(key)
            {
                request.insert(IDEMPOTENCY_KEY_METADATA, value);
            }
        };
        let mut client = self.client();
        let answered = match write {
            Write::Put(put) => {
                let mut request = tonic::Request::new(put.clone());
                request.set_timeout(ATTEMPT_TIMEOUT);
                metadata(request.metadata_mut());
                client
                    .put(request)
                    .await
                    .map(|response| Written::Put(response.into_inner().prev_kv.map(|kv| kv.value)))
            }
            Write::Txn(txn) => {
                let mut request = tonic::Request::new(txn.clone());
                request.set_timeout(ATTEMPT_TIMEOUT);
                metadata(request.metadata_mut());
                client
                    .txn(request)
                    .await
                    .map(|response| Written::Txn(response.into_inner()))
            }
        };
        match answered {
            Ok(written) => Sent::Answered(written),
            Err(status) if certainly_not_applied(&status) => Sent::NotApplied(status),
            Err(status) => Sent::Unknown(status),
        }
    }

    /// Sends `write` until its outcome is known, as the mode says: under
    /// `key`, resent with it until answered (or the run's grace is over);
    /// without, resent up to [`NAIVE_SENDS_MAX`] times. Returns the last
    /// result and whether any send may have applied.
    pub(crate) async fn send_until_known(
        &mut self,
        write: &Write,
        key: Option<&[u8]>,
    ) -> (Sent<Written>, bool) {
        let mut sends = 0;
        let mut maybe_applied = false;
        loop {
            sends += 1;
            let sent = self.send(write, key).await;
            let again = match &sent {
                Sent::Answered(_) => return (sent, maybe_applied),
                // A refusal after a send that may have applied says
                // nothing of that send: under a key, ask again.
                Sent::NotApplied(_) => maybe_applied && key.is_some(),
                Sent::Unknown(_) => {
                    maybe_applied = true;
                    true
                }
            };
            let out_of_sends = key.is_none() && sends >= NAIVE_SENDS_MAX;
            if !again || out_of_sends || self.retries_over() {
                return (sent, maybe_applied);
            }
            self.next_endpoint().await;
        }
    }

    /// The idempotency key of this client's `round`th write of its
    /// current operation, in [`ClientMode::Session`].
    pub(crate) fn write_key(&self, round: u32) -> Option<Vec<u8>> {
        (self.options.mode == ClientMode::Session)
            .then(|| format!("e-c{}-{}-{round}", self.id, self.issued).into_bytes())
    }

    /// Attributes the wire answers of `key`'s write to operation `op_id`.
    pub(crate) fn attribute(&self, key: Option<&[u8]>, op_id: u64) {
        if let Some(key) = key {
            self.recorder
                .attribute(RequestIdentity::idempotent(key.to_vec()), self.id, op_id);
        }
    }

    /// Read-modify-write of `key` as `op`: `update` makes the new value
    /// and the reply to record from the value read.
    async fn update(
        &mut self,
        op: Op,
        key: Vec<u8>,
        update: impl Fn(Option<&[u8]>) -> (Vec<u8>, Reply),
    ) -> Outcome {
        let op_id = self.recorder.invoke(self.id, RequestIdentity::plain(), op);
        let mut attempts = 0u32;
        let mut maybe_applied = false;
        let mut last_refusal: Option<Status> = None;
        let mut rounds_after_stop = 0;
        let mut round = 0;
        let outcome = loop {
            if self.stop.stopped() {
                rounds_after_stop += 1;
            }
            if self.retries_over() || rounds_after_stop > ROUNDS_AFTER_STOP_MAX {
                break None;
            }
            let (value, revision) = match self.get(&key).await {
                Ok(read) => read,
                Err(status) => {
                    last_refusal = Some(status);
                    self.next_endpoint().await;
                    continue;
                }
            };
            let (new, reply) = update(value.as_deref());
            let txn = TxnRequest {
                compare: vec![Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Mod as i32,
                    key: key.clone(),
                    range_end: Vec::new(),
                    target_union: Some(TargetUnion::ModRevision(revision)),
                }],
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: key.clone(),
                        value: new,
                        ..PutRequest::default()
                    })),
                }],
                failure: Vec::new(),
            };
            round += 1;
            let write_key = self.write_key(round);
            self.attribute(write_key.as_deref(), op_id);
            let (sent, maybe) = self
                .send_until_known(&Write::Txn(txn), write_key.as_deref())
                .await;
            attempts = attempts.saturating_add(1);
            maybe_applied |= maybe;
            match sent {
                Sent::Answered(Written::Txn(response)) if response.succeeded => break Some(reply),
                // The key changed since the read (perhaps by this very
                // update, whose reply was lost): read again.
                Sent::Answered(_) => {}
                Sent::NotApplied(status) => {
                    last_refusal = Some(status);
                    self.next_endpoint().await;
                }
                Sent::Unknown(status) => {
                    // Without a key a client cannot learn more: it goes on
                    // with a fresh read, as etcd's users do.
                    last_refusal = Some(status);
                    if write_key.is_some() {
                        break None;
                    }
                    self.next_endpoint().await;
                }
            }
        };
        let outcome = match outcome {
            Some(reply) => Outcome::Ok {
                reply,
                canonical: None,
            },
            None if maybe_applied => Outcome::Unknown {
                detail: last_refusal.map(|status| status.message().to_string()),
            },
            None => Outcome::Failed {
                reason: last_refusal.as_ref().map_or(FailReason::Other, reason_of),
                detail: last_refusal.map(|status| status.message().to_string()),
            },
        };
        self.recorder
            .complete(self.id, op_id, attempts.max(1), outcome.clone());
        outcome
    }

    async fn append(&mut self) {
        let index = self.rng.random_range(0..self.options.append_keys.max(1));
        let key = self.options.key("append", index);
        let token = self.token();
        let op = Op::Append {
            key: Bytes(key.clone()),
            token: Bytes(token.clone()),
        };
        self.update(op, key, |value| {
            let mut new = value.unwrap_or_default().to_vec();
            new.extend_from_slice(&token);
            new.push(b';');
            let length = new.len() as u64;
            (new, Reply::Append { length })
        })
        .await;
    }

    async fn increment(&mut self) {
        let index = self.rng.random_range(0..self.options.counter_keys.max(1));
        let key = self.options.key("counter", index);
        self.issued += 1;
        let op = Op::Incr {
            key: Bytes(key.clone()),
            by: 1,
        };
        self.update(op, key, |value| {
            let current = value
                .and_then(|bytes| std::str::from_utf8(bytes).ok())
                .and_then(|text| text.parse::<i64>().ok())
                .unwrap_or(0);
            let next = current.saturating_add(1);
            (next.to_string().into_bytes(), Reply::Incr { value: next })
        })
        .await;
    }

    async fn put(&mut self) {
        let index = self.rng.random_range(0..self.options.register_keys.max(1));
        let key = self.options.key("register", index);
        let value = self.token();
        let op = Op::Put {
            key: Bytes(key.clone()),
            value: Bytes(value.clone()),
        };
        let op_id = self.recorder.invoke(self.id, RequestIdentity::plain(), op);
        let write_key = self.write_key(1);
        self.attribute(write_key.as_deref(), op_id);
        let put = Write::Put(PutRequest {
            key,
            value,
            prev_kv: true,
            ..PutRequest::default()
        });
        let (sent, maybe_applied) = self.send_until_known(&put, write_key.as_deref()).await;
        let outcome = match sent {
            Sent::Answered(Written::Put(previous)) => Outcome::Ok {
                reply: Reply::Put {
                    previous: previous.map(Bytes),
                },
                canonical: None,
            },
            Sent::Answered(Written::Txn(_)) => Outcome::Unknown {
                detail: Some("a transaction's answer to a put".to_string()),
            },
            Sent::NotApplied(status) if !maybe_applied => Outcome::Failed {
                reason: reason_of(&status),
                detail: Some(status.message().to_string()),
            },
            Sent::NotApplied(status) | Sent::Unknown(status) => Outcome::Unknown {
                detail: Some(status.message().to_string()),
            },
        };
        self.recorder.complete(self.id, op_id, 1, outcome);
    }

    async fn read(&mut self) {
        let index = self.rng.random_range(0..self.options.register_keys.max(1));
        let key = self.options.key("register", index);
        let op = Op::Get {
            key: Bytes(key.clone()),
        };
        let op_id = self.recorder.invoke(self.id, RequestIdentity::plain(), op);
        let outcome = match self.get(&key).await {
            Ok((value, _)) => Outcome::Ok {
                reply: Reply::Get {
                    value: value.map(Bytes),
                },
                canonical: None,
            },
            Err(status) => {
                self.next_endpoint().await;
                Outcome::Failed {
                    reason: reason_of(&status),
                    detail: Some(status.message().to_string()),
                }
            }
        };
        self.recorder.complete(self.id, op_id, 1, outcome);
    }

    async fn step(&mut self) {
        if self.options.resources == 0 {
            match self.rng.random_range(0..100) {
                0..35 => self.append().await,
                35..60 => self.increment().await,
                60..80 => self.put().await,
                _ => self.read().await,
            }
            return;
        }
        match self.rng.random_range(0..100) {
            0..30 => self.append().await,
            30..50 => self.increment().await,
            50..62 => self.put().await,
            62..70 => self.read().await,
            _ => self.resource_step().await,
        }
    }
}

/// A lazily connected channel to `address`.
pub(crate) fn channel(address: &str) -> Result<Channel, String> {
    Ok(Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| format!("bad endpoint {address}: {e}"))?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .connect_lazy())
}

/// Starts the workload's clients against the etcd API at `endpoints`;
/// they run until `stop` is set, then finish their retries.
pub fn start(
    endpoints: &[String],
    options: &WorkloadOptions,
    recorder: Arc<Recorder>,
    stop: watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, String> {
    if endpoints.is_empty() {
        return Err("no endpoints".to_string());
    }
    let channels: Vec<Channel> = endpoints
        .iter()
        .map(|address| channel(address))
        .collect::<Result<_, _>>()?;
    let worker = |index: usize, id: ClientId| EtcdWorker {
        id,
        endpoints: channels.iter().cloned().map(KvClient::new).collect(),
        current: index,
        options: options.clone(),
        recorder: recorder.clone(),
        rng: StdRng::seed_from_u64(options.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        stop: Stop { stop: stop.clone() },
        stopped_at: None,
        issued: 0,
    };
    let mut tasks = Vec::new();
    for index in 0..options.clients {
        let mut worker = worker(index, index as ClientId + 1);
        tasks.push(tokio::spawn(async move {
            while !worker.stop.stopped() {
                worker.step().await;
            }
        }));
    }
    if options.resources > 0 {
        let id = etcd_resources::compactor_id(options.clients);
        let compactor = worker(options.clients, id);
        tasks.push(tokio::spawn(etcd_resources::compactor(
            compactor,
            stop.clone(),
        )));
    }
    Ok(tasks)
}

/// Reads the final value of every key in `keys` through etcd's API
/// (linearizably, from any endpoint, retrying up to `patience`) and
/// records it.
pub async fn record_final_values(
    endpoints: &[String],
    keys: &[Vec<u8>],
    recorder: &Recorder,
    patience: Duration,
) -> Result<(), String> {
    let clients: Vec<KvClient<Channel>> = endpoints
        .iter()
        .map(|address| channel(address).map(KvClient::new))
        .collect::<Result<_, _>>()?;
    if clients.is_empty() {
        return Err("no endpoints".to_string());
    }
    let deadline = Instant::now() + patience;
    let mut turn = 0usize;
    for key in keys {
        loop {
            let mut client = clients[turn % clients.len()].clone();
            let mut request = tonic::Request::new(RangeRequest {
                key: key.clone(),
                ..RangeRequest::default()
            });
            request.set_timeout(Duration::from_secs(2));
            match client.range(request).await {
                Ok(response) => {
                    let value = response.into_inner().kvs.into_iter().next();
                    recorder.final_value(Bytes(key.clone()), value.map(|kv| Bytes(kv.value)));
                    break;
                }
                Err(status) if Instant::now() >= deadline => {
                    return Err(format!(
                        "reading {}: {}",
                        String::from_utf8_lossy(key),
                        status.message()
                    ));
                }
                Err(_) => {
                    turn = turn.wrapping_add(1);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    Ok(())
}

/// The leader and Raft term the member at `address` reports through
/// etcd's Maintenance.Status, if it answers and knows one.
pub async fn status_of(address: &str) -> Option<(NodeId, u64)> {
    let mut client = MaintenanceClient::new(channel(address).ok()?);
    let mut request = tonic::Request::new(StatusRequest {});
    request.set_timeout(Duration::from_millis(300));
    let status = client.status(request).await.ok()?.into_inner();
    let term = status
        .header
        .map_or(status.raft_term, |header| header.raft_term);
    (status.leader != 0).then_some((status.leader, term))
}
