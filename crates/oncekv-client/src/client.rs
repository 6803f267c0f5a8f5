//! [`Client`]: the connections to a cluster's nodes and the calls made
//! through them. Every call runs through the one retry engine of
//! [`crate::retry`]: a request goes to the node believed to lead
//! (`NotLeader` hints redirect it), a serializable read to any node, a
//! node's status to each endpoint in turn; unreachable nodes are skipped,
//! a node that shed the call is asked again over the same connection, and
//! transient failures are retried with jittered backoff until the
//! deadline. Only requests that are deduplicated (on a session or under an
//! idempotency key) or read-only are retried after they may have been
//! sent.

use crate::auth::{AuthInterceptor, Credentials, TokenSlot};
use crate::batch::Batcher;
use crate::connector::{Connector, TcpConnector};
use crate::error::ClientError;
use crate::random::{OsRandom, RandomSource, key_hex};
use crate::retry::{Attempt, Backoff, EarlierSends, Policy, Retrier, Route, call_failed, failed};
use oncekv_proto::convert;
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::{self, execute_response, read_response};
use oncekv_state::{Command, IdempotencyKey, Origin, Outcome, Query, Reply, Request};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// A client of one node's `Kv` service, carrying the client's token.
pub(crate) type Rpc = KvClient<InterceptedService<Channel, AuthInterceptor>>;

/// How the client retries.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Longest wait for one attempt's answer.
    pub attempt_timeout: Duration,
    /// Longest time a call may take in all, retries included.
    pub deadline: Duration,
    /// Delay between retries.
    pub backoff: Backoff,
    /// Random draws: backoff jitter and fresh idempotency keys.
    pub random: Arc<dyn RandomSource>,
    /// How nodes are reached.
    pub connector: Arc<dyn Connector>,
    /// Largest message sent or received, in bytes.
    pub message_bytes_max: usize,
    /// Who the client is, for a cluster that enforces authentication
    /// (`None`: nobody, or the client certificate the connector presents).
    pub credentials: Option<Credentials>,
    /// A request goes to its node alone while fewer than this many calls
    /// to that node are in flight; beyond, the requests that are ready go
    /// together as one `ExecuteBatch` message when the next call finishes,
    /// or as an extra call once the first has waited an eighth of a
    /// call's smoothed duration (at least 1 ms).
    /// 1 batches everything behind one call; a large number never
    /// batches.
    pub batch_after_calls: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            attempt_timeout: Duration::from_secs(3),
            deadline: Duration::from_secs(15),
            backoff: Backoff::default(),
            random: Arc::new(OsRandom),
            connector: Arc::new(TcpConnector),
            message_bytes_max: 64 * 1024 * 1024,
            credentials: None,
            batch_after_calls: 4,
        }
    }
}

/// A backup as [`Client::save_snapshot_with`] received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedSnapshot {
    /// The log index of the last entry the state includes.
    pub applied_index: u64,
    /// How many bytes the state has.
    pub bytes: u64,
    /// Their SHA-256 (checked against the one the server announced).
    pub sha256: [u8; 32],
}

/// A reply and how it was obtained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    /// The command's reply.
    pub reply: Reply,
    /// Whether it came from a completion record (the request had applied
    /// before, on an earlier attempt or run).
    pub replayed: bool,
    /// The log index where the request was applied.
    pub applied_index: u64,
    /// How many times it was sent.
    pub attempts: u32,
}

struct Inner {
    endpoints: Vec<String>,
    options: ClientOptions,
    leader: Mutex<Option<String>>,
    /// The endpoint that answered the last serializable read: the next
    /// goes there too.
    reader: Mutex<Option<String>>,
    channels: Mutex<HashMap<String, Channel>>,
    batchers: Mutex<HashMap<String, Arc<Batcher>>>,
    token: TokenSlot,
}

/// A connection to an oncekv cluster.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.inner.endpoints)
            .finish_non_exhaustive()
    }
}

/// Locks `mutex`, taking the data of a poisoned lock as it is: the client's
/// locks guard plain bookkeeping (leader, channels, the incomplete set),
/// valid after any panic. (The same policy as the node's `sync` module.)
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Client {
    /// A client of the cluster reachable at `endpoints` (`host:port` client
    /// addresses). Connections are made lazily.
    pub fn connect<I, S>(endpoints: I, options: ClientOptions) -> Result<Client, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let endpoints: Vec<String> = endpoints.into_iter().map(Into::into).collect();
        if endpoints.is_empty() {
            return Err(ClientError::Config("no endpoints given".into()));
        }
        let token = TokenSlot::default();
        if let Some(Credentials::Token(given)) = &options.credentials {
            token.set(Some(given.clone()));
        }
        Ok(Client {
            inner: Arc::new(Inner {
                endpoints,
                options,
                leader: Mutex::new(None),
                reader: Mutex::new(None),
                channels: Mutex::new(HashMap::new()),
                batchers: Mutex::new(HashMap::new()),
                token,
            }),
        })
    }

    /// The options in force.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    pub(crate) fn rpc(&self, address: &str) -> Result<Rpc, String> {
        let channel = {
            let mut channels = lock(&self.inner.channels);
            match channels.get(address) {
                Some(channel) => channel.clone(),
                None => {
                    let channel = self.inner.options.connector.channel(address)?;
                    channels.insert(address.to_string(), channel.clone());
                    channel
                }
            }
        };
        let limit = self.inner.options.message_bytes_max;
        let interceptor = AuthInterceptor::new(self.inner.token.clone());
        Ok(KvClient::with_interceptor(channel, interceptor)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit))
    }

    /// The batcher of calls to `address`.
    fn batcher(&self, address: &str) -> Arc<Batcher> {
        let mut batchers = lock(&self.inner.batchers);
        if let Some(batcher) = batchers.get(address) {
            return Arc::clone(batcher);
        }
        let options = &self.inner.options;
        let batcher = Arc::new(Batcher::new(
            options.batch_after_calls,
            options.message_bytes_max,
        ));
        batchers.insert(address.to_string(), Arc::clone(&batcher));
        batcher
    }

    /// The endpoints the client was given, in order.
    pub(crate) fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    pub(crate) fn forget_channel(&self, address: &str) {
        lock(&self.inner.channels).remove(address);
    }

    /// The node to try first: the known leader, else the first endpoint.
    pub(crate) fn first_target(&self) -> String {
        lock(&self.inner.leader)
            .clone()
            .unwrap_or_else(|| self.inner.endpoints[0].clone())
    }

    pub(crate) fn next_target(&self, current: &str) -> String {
        let endpoints = &self.inner.endpoints;
        let position = endpoints.iter().position(|e| e == current);
        let next = position.map_or(0, |p| (p + 1) % endpoints.len());
        endpoints[next].clone()
    }

    pub(crate) fn needs_login(&self) -> bool {
        matches!(
            self.inner.options.credentials,
            Some(Credentials::Password { .. })
        ) && self.inner.token.get().is_none()
    }

    /// Drops the token (it expired, or the password changed).
    pub(crate) fn forget_token(&self) {
        self.inner.token.set(None);
    }

    /// Keeps the token a login returned.
    pub(crate) fn keep_token(&self, token: String) {
        self.inner.token.set(Some(token));
    }

    /// The node believed to lead.
    pub(crate) fn leader_slot(&self) -> &Mutex<Option<String>> {
        &self.inner.leader
    }

    /// The node the next serializable read goes to.
    pub(crate) fn reader_slot(&self) -> &Mutex<Option<String>> {
        &self.inner.reader
    }

    /// Sends a request through the log and returns what the state machine
    /// decided. Retries follow the rules above; `Tick` cannot be sent.
    pub async fn execute_request(
        &self,
        request: Request,
    ) -> Result<(Outcome, u64, u32), ClientError> {
        self.execute_request_after(request, EarlierSends::None)
            .await
    }

    /// Sends a request that earlier calls may already have sent (the same
    /// sequence number or idempotency key), saying what those sends may
    /// have done. After [`EarlierSends::MaybeDelivered`] the request may
    /// have applied already, so the call ends with its reply (applied or
    /// replayed), a request mismatch, or
    /// [`ClientError::OutcomeUnknown`]; any other refusal, or a cluster
    /// that cannot be reached, says nothing about the earlier send.
    pub async fn execute_request_after(
        &self,
        request: Request,
        earlier: EarlierSends,
    ) -> Result<(Outcome, u64, u32), ClientError> {
        let retry_safe = !matches!(request.origin, Origin::Plain) || !request.command.is_mutating();
        let request_id = match &request.origin {
            Origin::Session(header) => Some(header.id),
            _ => None,
        };
        let wire =
            convert::request_to_wire(&request).map_err(|e| ClientError::Invalid(e.to_string()))?;
        // A message over the client's own limit would fail while it is
        // being sent, where it cannot be told from a lost one: refuse it
        // here, unsent.
        let bytes = prost::Message::encoded_len(&wire);
        let limit = self.inner.options.message_bytes_max;
        if bytes > limit {
            return Err(ClientError::Invalid(format!(
                "the request takes {bytes} bytes, more than this client sends ({limit} bytes); \
                 the node's own limit (serve --max-message-bytes) may be lower"
            )));
        }
        let mutating = request.command.is_mutating();
        let policy = Policy {
            route: Route::Leader,
            mutating,
            retry_safe,
            request_id,
            earlier,
            logs_in: true,
        };
        let ((outcome, index), ran) = self
            .run(policy, |rpc, target, timeout, attempt| {
                let mut wire = wire.clone();
                if let Some(v1::execute_request::Origin::Session(header)) = &mut wire.origin {
                    header.attempt = attempt;
                }
                let batcher = self.batcher(target);
                async move {
                    match batcher.execute(rpc, wire, timeout).await {
                        Ok(response) => match response.result {
                            Some(execute_response::Result::Outcome(outcome)) => {
                                match convert::outcome_from_wire(outcome) {
                                    Ok(Outcome::Overloaded(full)) => {
                                        Attempt::Busy(ClientError::Overloaded(full))
                                    }
                                    Ok(outcome) => Attempt::Done((outcome, response.log_index)),
                                    Err(error) => Attempt::MaybeSent(error.to_string()),
                                }
                            }
                            Some(execute_response::Result::Failure(failure)) => {
                                call_failed(failure)
                            }
                            None => Attempt::MaybeSent("empty response".into()),
                        },
                        Err(status) => failed(status),
                    }
                }
            })
            .await?;
        // After a send that may have been delivered, only an answer that
        // looked at the request's record is definite: applied, replayed,
        // or the id taken by another command. A refusal that forgets the
        // past (the session is gone, its record freed), is decided before
        // looking at it (a wrong secret, a malformed header, a full
        // table, a permission) or may change (a gap a delayed earlier send
        // may still fill) says nothing about the earlier send.
        let attempts = ran.attempts;
        if mutating
            && ran.maybe_delivered
            && !matches!(
                outcome,
                Outcome::Applied(_) | Outcome::Replayed { .. } | Outcome::RequestMismatch
            )
        {
            let last_answer = completed(outcome, index, attempts).err().map(Box::new);
            return Err(ClientError::OutcomeUnknown {
                request_id,
                attempts,
                last_answer,
            });
        }
        Ok((outcome, index, attempts))
    }

    /// Runs a command as a one-shot request under an idempotency key
    /// (random when `key` is `None`), so retries and re-runs with the same
    /// key apply it once.
    pub async fn execute_once(
        &self,
        command: Command,
        key: Option<Vec<u8>>,
    ) -> Result<Completed, ClientError> {
        let key = key.unwrap_or_else(|| key_hex(self.options().random.as_ref()).into_bytes());
        self.execute_once_after(command, key, EarlierSends::None)
            .await
    }

    /// Runs a command under idempotency key `key` again, saying what
    /// earlier sends under that key may have done (see [`EarlierSends`]):
    /// after one that may have been delivered, the call ends with the
    /// reply or [`ClientError::OutcomeUnknown`].
    pub async fn execute_once_after(
        &self,
        command: Command,
        key: Vec<u8>,
        earlier: EarlierSends,
    ) -> Result<Completed, ClientError> {
        let request = Request {
            origin: Origin::Key(IdempotencyKey(key)),
            command,
        };
        let (outcome, index, attempts) = self.execute_request_after(request, earlier).await?;
        completed(outcome, index, attempts)
    }

    /// Runs a command as a plain request (at-least-once: never retried once
    /// it may have been sent, if it changes anything).
    pub async fn execute_plain(&self, command: Command) -> Result<Completed, ClientError> {
        let (outcome, index, attempts) = self.execute_request(Request::plain(command)).await?;
        completed(outcome, index, attempts)
    }

    /// Answers a query: linearizable unless `serializable`. A linearizable
    /// read goes to the leader; a serializable one to any node (the one
    /// that answered the last, else a follower), answered from its applied
    /// state, so it may be stale but keeps answering while the leader is
    /// down or partitioned away.
    pub async fn read(&self, query: Query, serializable: bool) -> Result<Reply, ClientError> {
        let wire = v1::ReadRequest {
            query: Some(convert::query_to_wire(&query)),
            serializable,
        };
        let attempt = |mut rpc: Rpc, _: &str, timeout: Duration, _: u32| {
            let wire = wire.clone();
            async move {
                let mut message = tonic::Request::new(wire);
                message.set_timeout(timeout);
                match rpc.read(message).await {
                    Ok(response) => match response.into_inner().result {
                        Some(read_response::Result::Reply(reply)) => {
                            match convert::reply_from_wire(reply) {
                                Ok(reply) => Attempt::Done(reply),
                                Err(error) => Attempt::MaybeSent(error.to_string()),
                            }
                        }
                        Some(read_response::Result::Failure(failure)) => call_failed(failure),
                        None => Attempt::MaybeSent("empty response".into()),
                    },
                    Err(status) => failed(status),
                }
            }
        };
        let route = if serializable {
            Route::AnyNode
        } else {
            Route::Leader
        };
        let (reply, _) = self.run(Policy::read(route), attempt).await?;
        match reply {
            Reply::Rejected(rejection) => Err(ClientError::Rejected(rejection)),
            reply => Ok(reply),
        }
    }

    /// Where a serializable read goes first: the node that answered the
    /// last one; else, drawn at random, an endpoint other than the known
    /// leader (so serializable reads spread over the followers and leave
    /// the leader to the writes); else the first endpoint.
    pub(crate) fn read_target(&self) -> String {
        if let Some(reader) = lock(&self.inner.reader).clone() {
            return reader;
        }
        let leader = lock(&self.inner.leader).clone();
        let others: Vec<&String> = self
            .inner
            .endpoints
            .iter()
            .filter(|endpoint| Some(*endpoint) != leader.as_ref())
            .collect();
        if others.is_empty() {
            return self.inner.endpoints[0].clone();
        }
        let count = u64::try_from(others.len()).unwrap_or(u64::MAX);
        let drawn = self.inner.options.random.next_u64() % count;
        let index = usize::try_from(drawn).unwrap_or(0);
        others.get(index).map_or_else(
            || self.inner.endpoints[0].clone(),
            |endpoint| (*endpoint).clone(),
        )
    }

    /// The status of one node (`address`), or of the first endpoint that
    /// answers, in order, when `None`. Each node is asked once (one that
    /// shed the call or is busy, again after a pause, until the
    /// deadline); none answering is [`ClientError::Unreachable`], a
    /// refused caller `PermissionDenied` or `Unauthenticated`.
    pub async fn status(&self, address: Option<&str>) -> Result<v1::StatusResponse, ClientError> {
        let deadline = Instant::now() + self.inner.options.deadline;
        let mut retrier = Retrier::new(self, Policy::read(Route::Each), Some(deadline));
        if let Some(address) = address {
            retrier = retrier.only(address);
        }
        let (status, _) = self
            .run_with(retrier, |mut rpc, _, timeout, _| async move {
                let mut message = tonic::Request::new(v1::StatusRequest {});
                message.set_timeout(timeout);
                match rpc.status(message).await {
                    Ok(status) => Attempt::Done(status.into_inner()),
                    Err(status) => failed(status),
                }
            })
            .await?;
        Ok(status)
    }

    /// Asks the node at `address` whether it is serving (the standard
    /// `grpc.health.v1` check: it knows a leader and has applied what it
    /// knows committed). `Ok(false)` when it answers NOT_SERVING.
    pub async fn health(&self, address: &str) -> Result<bool, ClientError> {
        use tonic_health::pb::health_check_response::ServingStatus;
        let channel = self
            .inner
            .options
            .connector
            .channel(address)
            .map_err(ClientError::Unreachable)?;
        let mut request = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        });
        request.set_timeout(self.inner.options.attempt_timeout);
        let answer = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(request)
            .await
            .map_err(|status| {
                ClientError::Unreachable(format!("{address}: {}", status.message()))
            })?;
        Ok(answer.into_inner().status == ServingStatus::Serving as i32)
    }

    /// A consistent copy of the whole state (a backup), from the leader:
    /// each piece of its bytes is handed to `sink` with its offset in the
    /// state as it arrives (so no buffer as large as the state is held), and
    /// the index it was taken at, its length and its SHA-256 (checked) are
    /// returned. An attempt that fails part-way is made again from offset
    /// 0: the sink overwrites what it was given before.
    pub async fn save_snapshot_with(
        &self,
        sink: impl FnMut(u64, &[u8]) + Send,
    ) -> Result<SavedSnapshot, ClientError> {
        use sha2::Digest as _;
        use v1::save_snapshot_chunk::Kind;
        let sink = std::sync::Mutex::new(sink);
        let sink = &sink;
        let (saved, _) = self
            .run(Policy::read(Route::Leader), |mut rpc, _, _timeout, _| async move {
                // A large state takes longer than one attempt: no timeout
                // per attempt here; the server's call timeout bounds it.
                let mut stream = match rpc.save_snapshot(v1::SaveSnapshotRequest {}).await {
                    Ok(response) => response.into_inner(),
                    Err(status) => return failed(status),
                };
                let mut info: Option<v1::SnapshotInfo> = None;
                let mut received = 0u64;
                let mut hasher = sha2::Sha256::new();
                loop {
                    match stream.message().await {
                        Ok(Some(chunk)) => match chunk.kind {
                            Some(Kind::Failure(failure)) => return call_failed(failure),
                            Some(Kind::Info(first)) => info = Some(first),
                            Some(Kind::Data(data)) => {
                                let announced = info.as_ref().map_or(0, |i| i.bytes);
                                let total = received.saturating_add(data.len() as u64);
                                if total > announced {
                                    return Attempt::MaybeSent(format!(
                                        "the snapshot stream sent more than the {announced} bytes it announced"
                                    ));
                                }
                                hasher.update(&data);
                                (sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner))(
                                    received, &data,
                                );
                                received = total;
                            }
                            None => return Attempt::MaybeSent("empty snapshot chunk".into()),
                        },
                        Ok(None) => break,
                        Err(status) => return failed(status),
                    }
                }
                let Some(info) = info else {
                    return Attempt::MaybeSent("the snapshot stream ended before its info".into());
                };
                let sha256: [u8; 32] = hasher.finalize().into();
                if received != info.bytes || sha256.as_slice() != info.sha256 {
                    return Attempt::MaybeSent(format!(
                        "the snapshot arrived damaged ({received} of {} bytes, or a SHA-256 mismatch)",
                        info.bytes
                    ));
                }
                Attempt::Done(SavedSnapshot {
                    applied_index: info.applied_index,
                    bytes: received,
                    sha256,
                })
            })
            .await?;
        Ok(saved)
    }

    /// Adds a member (through the leader).
    pub async fn add_member(
        &self,
        id: u64,
        peer: &str,
        client: &str,
    ) -> Result<Vec<v1::Member>, ClientError> {
        let request = v1::AddMemberRequest {
            id,
            peer_address: peer.into(),
            client_address: client.into(),
        };
        self.membership(move |mut rpc, timeout| {
            let request = request.clone();
            async move {
                let mut message = tonic::Request::new(request);
                message.set_timeout(timeout);
                rpc.add_member(message).await
            }
        })
        .await
    }

    /// Removes a member (through the leader).
    pub async fn remove_member(&self, id: u64) -> Result<Vec<v1::Member>, ClientError> {
        self.membership(move |mut rpc, timeout| async move {
            let mut message = tonic::Request::new(v1::RemoveMemberRequest { id });
            message.set_timeout(timeout);
            rpc.remove_member(message).await
        })
        .await
    }

    async fn membership<F, Fut>(&self, mut call: F) -> Result<Vec<v1::Member>, ClientError>
    where
        F: FnMut(Rpc, Duration) -> Fut,
        Fut: std::future::Future<
                Output = Result<tonic::Response<v1::MembershipResponse>, tonic::Status>,
            >,
    {
        use v1::membership_response::Result as Membership;
        let timeout = self.inner.options.deadline;
        // A change of membership that may have been delivered and then
        // refused on a retry (already a member, no such member) may have
        // applied.
        let membership_change = Policy {
            mutating: true,
            ..Policy::read(Route::Leader)
        };
        let (members, _) = self
            .run(membership_change, |rpc, _, _, _| {
                let call = call(rpc, timeout);
                async move {
                    match call.await {
                        Ok(response) => match response.into_inner().result {
                            Some(Membership::Members(members)) => Attempt::Done(members.members),
                            Some(Membership::Failure(failure)) => call_failed(failure),
                            None => Attempt::MaybeSent("empty response".into()),
                        },
                        Err(status) => failed(status),
                    }
                }
            })
            .await?;
        Ok(members)
    }
}

/// Turns an outcome into what the caller is told.
pub(crate) fn completed(
    outcome: Outcome,
    index: u64,
    attempts: u32,
) -> Result<Completed, ClientError> {
    let (reply, replayed, applied_index) = match outcome {
        Outcome::Applied(reply) => (reply, false, index),
        Outcome::Replayed {
            reply,
            applied_index,
        } => (reply, true, applied_index.0),
        Outcome::SessionExpired => return Err(ClientError::SessionExpired),
        Outcome::Unauthorized => return Err(ClientError::Unauthorized),
        Outcome::Stale { floor } => return Err(ClientError::Stale { floor: floor.0 }),
        Outcome::RequestMismatch => return Err(ClientError::RequestMismatch),
        Outcome::SequenceGap { expected } => return Err(ClientError::gap(expected)),
        Outcome::Malformed(why) => return Err(ClientError::Malformed(why.to_string())),
        Outcome::Overloaded(full) => return Err(ClientError::Overloaded(full)),
        Outcome::PermissionDenied { reason } => return Err(ClientError::PermissionDenied(reason)),
    };
    match reply {
        Reply::Rejected(rejection) => Err(ClientError::Rejected(rejection)),
        reply => Ok(Completed {
            reply,
            replayed,
            applied_index,
            attempts,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_over_the_clients_limit_is_refused_unsent() {
        let options = ClientOptions {
            message_bytes_max: 1024,
            deadline: Duration::from_secs(30),
            ..ClientOptions::default()
        };
        // Nothing listens there: an attempt would only time out.
        let client = Client::connect(["127.0.0.1:9"], options).expect("a client");
        let put = Command::Put {
            key: b"k".to_vec(),
            value: vec![0; 2048].into(),
            lease: None,
        };
        let refused = client.execute_once(put, None).await;
        assert!(
            matches!(&refused, Err(ClientError::Invalid(why)) if why.contains("more than this client sends")),
            "{refused:?}"
        );
    }
}
