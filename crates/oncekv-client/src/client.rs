//! [`Client`]: leader discovery and the retry loop. A request goes to the
//! node believed to lead; `NotLeader` hints redirect it, unreachable nodes
//! are skipped in turn, and transient failures are retried with jittered
//! backoff until the deadline. Only requests that are deduplicated (on a
//! session or under an idempotency key) or read-only are retried after
//! they may have been sent.

use crate::auth::{AuthInterceptor, Credentials, TokenSlot};
use crate::batch::Batcher;
use crate::connector::{Connector, TcpConnector};
use crate::error::ClientError;
use crate::random::{OsRandom, RandomSource, key_hex};
use crate::retry::Backoff;
use oncekv_proto::convert::{self, CallFailure};
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::{self, execute_response, read_response};
use oncekv_state::{Command, IdempotencyKey, Origin, Outcome, Query, Reply, Request, RequestId};
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
    /// together as one `ExecuteBatch` message when the next call finishes.
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

/// A backup as [`Client::save_snapshot`] received it.
#[derive(Clone, PartialEq, Eq)]
pub struct SavedSnapshot {
    /// The log index of the last entry the state includes.
    pub applied_index: u64,
    /// The state machine's snapshot bytes (their SHA-256 was checked).
    pub state: Vec<u8>,
}

impl std::fmt::Debug for SavedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavedSnapshot")
            .field("applied_index", &self.applied_index)
            .field("bytes", &self.state.len())
            .finish()
    }
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

/// What one attempt learned.
enum Attempt<T> {
    Done(T),
    /// Definitely not proposed there; try `hint` (or the next node).
    Redirect(Option<String>),
    /// Not proposed: the node could not be reached.
    NotSent(String),
    /// May have been proposed.
    MaybeSent(String),
    /// Refused for now by a full table or budget: not applied by this
    /// attempt; retried after a pause until the deadline.
    Busy(ClientError),
    Refused(ClientError),
    /// Not carried out: the call named no valid user (a missing or
    /// expired token). Logging in again may help.
    Unauthenticated(String),
}

/// Locks `mutex`, taking the data of a poisoned lock as it is: the client's
/// locks guard plain bookkeeping (leader, channels, the incomplete set),
/// valid after any panic. (The same policy as the node's `sync` module.)
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a transport status means the request never left this client.
fn never_sent(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && {
        // Only a failed connect proves it; "connection reset" or "closed"
        // may come after the request left.
        let text = format!("{status:?}").to_lowercase();
        [
            "tcp connect error",
            "connecterror",
            "connection refused",
            "error trying to connect",
        ]
        .iter()
        .any(|marker| text.contains(marker))
    }
}

/// The words of a TLS refusal in `status`'s sources (a certificate, a
/// host name, a client certificate): a setting to fix, so the call fails
/// at once instead of retrying until its deadline.
fn refused_by_tls(status: &tonic::Status) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(current) = next {
        if let Some(tls) = current.downcast_ref::<crate::connector::TlsConnectError>()
            && tls.refused_by_tls()
        {
            return Some(tls.to_string());
        }
        next = current.source();
    }
    None
}

/// The metadata key a server sets on a request it shed unhandled because
/// a limit was full; its value names the limit.
const OVERLOADED_METADATA: &str = "oncekv-overloaded";

/// What was full, if the server shed the request unhandled: status
/// RESOURCE_EXHAUSTED carrying the `oncekv-overloaded` metadata entry
/// (never the message text). Such a request definitely did not apply.
fn shed_by_server(status: &tonic::Status) -> Option<String> {
    if status.code() != tonic::Code::ResourceExhausted {
        return None;
    }
    let value = status.metadata().get(OVERLOADED_METADATA)?;
    Some(value.to_str().unwrap_or("a limit").to_string())
}

/// What a transport-level failure says about an attempt: not sent (could
/// not connect, or the server shed it unhandled), refused (message too
/// large or invalid), or maybe sent.
fn failed<T>(status: tonic::Status) -> Attempt<T> {
    if let Some(words) = refused_by_tls(&status) {
        return Attempt::Refused(ClientError::Unreachable(words));
    }
    if never_sent(&status) {
        return Attempt::NotSent(status.message().to_string());
    }
    if status.code() == tonic::Code::Unimplemented {
        // The node has no such call (a batch to an older node): nothing
        // was handled.
        return Attempt::NotSent(status.message().to_string());
    }
    if let Some(full) = shed_by_server(&status) {
        return Attempt::NotSent(format!("server overloaded ({full} full), not handled"));
    }
    match refused_by_transport(&status) {
        Some(error) => Attempt::Refused(error),
        None => Attempt::MaybeSent(status.message().to_string()),
    }
}

/// Follows a `NotLeader` answer: to the hinted leader, if one is named.
/// What a call's `Failure` says about the attempt: the one place the
/// client reads it.
fn call_failed<T>(failure: v1::Failure) -> Attempt<T> {
    match convert::failure_from_wire(failure) {
        Ok(CallFailure::NotLeader {
            leader_client_address,
            ..
        }) => Attempt::Redirect(leader_client_address),
        Ok(CallFailure::Unavailable(reason)) => Attempt::MaybeSent(reason),
        Ok(CallFailure::NoLeader(reason)) => Attempt::NotSent(reason),
        Ok(CallFailure::Invalid(reason)) => Attempt::Refused(ClientError::Invalid(reason)),
        Ok(CallFailure::Unauthenticated(reason)) => Attempt::Unauthenticated(reason),
        Ok(CallFailure::PermissionDenied(reason)) => {
            Attempt::Refused(ClientError::PermissionDenied(reason))
        }
        Ok(CallFailure::Shed { what, .. }) => {
            Attempt::NotSent(format!("server overloaded ({what} full), not handled"))
        }
        Err(error) => Attempt::MaybeSent(format!("undecodable failure: {error}")),
    }
}

fn refused_by_transport(status: &tonic::Status) -> Option<ClientError> {
    if shed_by_server(status).is_some() {
        // Not a refusal of the message: it is retried later.
        return None;
    }
    match status.code() {
        tonic::Code::ResourceExhausted | tonic::Code::OutOfRange | tonic::Code::InvalidArgument => {
            Some(ClientError::Invalid(status.message().to_string()))
        }
        tonic::Code::PermissionDenied => {
            Some(ClientError::PermissionDenied(status.message().to_string()))
        }
        tonic::Code::Unauthenticated => {
            Some(ClientError::Unauthenticated(status.message().to_string()))
        }
        _ => None,
    }
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

    /// Runs `attempt` against the leader until it is done, the deadline
    /// passes, or it fails after maybe being sent when `retry_safe` is off.
    /// Returns the value, the attempts made, and whether an attempt before
    /// the last may have reached the cluster.
    async fn with_retries<T, F, Fut>(
        &self,
        retry_safe: bool,
        request_id: Option<RequestId>,
        mut attempt: F,
    ) -> Result<(T, u32, bool), ClientError>
    where
        F: FnMut(Rpc, &str, Duration, u32) -> Fut,
        Fut: std::future::Future<Output = Attempt<T>>,
    {
        let options = &self.inner.options;
        let deadline = Instant::now() + options.deadline;
        let mut logged_in = false;
        if self.needs_login() {
            self.login(deadline).await?;
            logged_in = true;
        }
        let mut target = self.first_target();
        let mut attempts = 0u32;
        let mut retries = 0u32;
        let mut maybe_sent = false;
        let mut last_error = String::new();
        let mut busy = None;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(if maybe_sent {
                    ClientError::OutcomeUnknown {
                        request_id,
                        attempts,
                    }
                } else if let Some(refusal) = busy {
                    refusal
                } else {
                    ClientError::Unreachable(last_error)
                });
            }
            attempts += 1;
            let timeout = options.attempt_timeout.min(remaining);
            let result = match self.rpc(&target) {
                Ok(rpc) => attempt(rpc, &target, timeout, attempts).await,
                Err(error) => Attempt::NotSent(error),
            };
            match result {
                Attempt::Done(value) => {
                    *lock(&self.inner.leader) = Some(target);
                    return Ok((value, attempts, maybe_sent));
                }
                Attempt::Refused(error) => return Err(error),
                Attempt::Unauthenticated(reason) => {
                    // Not carried out. A password logs in again, once per
                    // call (the token expired or the password changed).
                    let password =
                        matches!(options.credentials, Some(Credentials::Password { .. }));
                    if !password || logged_in {
                        return Err(ClientError::Unauthenticated(reason));
                    }
                    self.inner.token.set(None);
                    self.login(deadline).await?;
                    logged_in = true;
                }
                Attempt::Busy(refusal) => {
                    *lock(&self.inner.leader) = Some(target.clone());
                    busy = Some(refusal);
                    self.pause(&mut retries, deadline).await;
                }
                Attempt::Redirect(hint) => {
                    last_error = format!("{target} is not the leader");
                    target = match hint {
                        Some(leader) if leader != target => leader,
                        _ => {
                            self.pause(&mut retries, deadline).await;
                            self.next_target(&target)
                        }
                    };
                    *lock(&self.inner.leader) = None;
                }
                Attempt::NotSent(error) => {
                    last_error = format!("{target}: {error}");
                    self.forget_channel(&target);
                    target = self.next_target(&target);
                    self.pause(&mut retries, deadline).await;
                }
                Attempt::MaybeSent(error) => {
                    maybe_sent = true;
                    last_error = format!("{target}: {error}");
                    if !retry_safe {
                        return Err(ClientError::OutcomeUnknown {
                            request_id,
                            attempts,
                        });
                    }
                    self.forget_channel(&target);
                    *lock(&self.inner.leader) = None;
                    target = self.next_target(&target);
                    self.pause(&mut retries, deadline).await;
                }
            }
        }
    }

    pub(crate) fn needs_login(&self) -> bool {
        matches!(
            self.inner.options.credentials,
            Some(Credentials::Password { .. })
        ) && self.inner.token.get().is_none()
    }

    /// Logs in with the configured password and keeps the token: at any
    /// node (each checks against the replicated users after a read
    /// barrier), following leader hints, until `deadline`.
    pub(crate) async fn login(&self, deadline: Instant) -> Result<(), ClientError> {
        let Some(Credentials::Password { user, password }) = &self.inner.options.credentials else {
            return Ok(());
        };
        let mut target = self.first_target();
        let mut retries = 0;
        let mut last_error = String::new();
        while Instant::now() < deadline {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let mut rpc = match self.rpc(&target) {
                Ok(rpc) => rpc,
                Err(error) => return Err(ClientError::Unreachable(error)),
            };
            let mut message = tonic::Request::new(v1::AuthenticateRequest {
                user: user.clone(),
                password: password.clone(),
            });
            message.set_timeout(self.inner.options.attempt_timeout.min(remaining));
            let answer = match rpc.authenticate(message).await {
                Ok(response) => match response.into_inner().result {
                    Some(v1::authenticate_response::Result::Token(token)) => {
                        self.inner.token.set(Some(token.token));
                        return Ok(());
                    }
                    Some(v1::authenticate_response::Result::Failure(failure)) => {
                        call_failed::<()>(failure)
                    }
                    None => Attempt::MaybeSent("empty response".into()),
                },
                Err(status) => failed(status),
            };
            match answer {
                Attempt::Unauthenticated(reason) => {
                    return Err(ClientError::Unauthenticated(reason));
                }
                Attempt::Refused(error) => return Err(error),
                Attempt::Redirect(Some(leader)) if leader != target => target = leader,
                Attempt::Redirect(_) => {
                    last_error = format!("{target} is not the leader");
                    target = self.next_target(&target);
                    self.pause(&mut retries, deadline).await;
                }
                Attempt::NotSent(error) | Attempt::MaybeSent(error) => {
                    last_error = format!("{target}: {error}");
                    self.forget_channel(&target);
                    target = self.next_target(&target);
                    self.pause(&mut retries, deadline).await;
                }
                Attempt::Busy(error) => {
                    last_error = error.to_string();
                    self.pause(&mut retries, deadline).await;
                }
                Attempt::Done(()) => return Ok(()),
            }
        }
        Err(ClientError::Unreachable(format!("login: {last_error}")))
    }

    async fn pause(&self, retries: &mut u32, deadline: Instant) {
        let options = &self.inner.options;
        let delay = options.backoff.delay(*retries, options.random.as_ref());
        *retries += 1;
        tokio::time::sleep_until((Instant::now() + delay).min(deadline)).await;
    }

    /// Sends a request through the log and returns what the state machine
    /// decided. Retries follow the rules above; `Tick` cannot be sent.
    pub async fn execute_request(
        &self,
        request: Request,
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
        let ((outcome, index), attempts, resent) = self
            .with_retries(retry_safe, request_id, |rpc, target, timeout, attempt| {
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
        // A refusal that forgets the past (the session is gone, or its
        // record was freed) or that was decided before looking at it (a
        // wrong secret) says nothing about an earlier attempt that may have
        // applied: the outcome is unknown, not "not applied".
        if resent
            && matches!(
                outcome,
                Outcome::SessionExpired | Outcome::Stale { .. } | Outcome::Unauthorized
            )
        {
            return Err(ClientError::OutcomeUnknown {
                request_id,
                attempts,
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
        let request = Request {
            origin: Origin::Key(IdempotencyKey(key)),
            command,
        };
        let (outcome, index, attempts) = self.execute_request(request).await?;
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
        let reply = if serializable {
            self.at_any_node(attempt).await?
        } else {
            self.with_retries(true, None, attempt).await?.0
        };
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

    /// Runs a read that any node can answer, from
    /// [`read_target`](Self::read_target) on, moving to the next endpoint
    /// when one cannot answer, until the deadline. Reads change nothing,
    /// so every attempt may be retried.
    async fn at_any_node<T, F, Fut>(&self, mut attempt: F) -> Result<T, ClientError>
    where
        F: FnMut(Rpc, &str, Duration, u32) -> Fut,
        Fut: std::future::Future<Output = Attempt<T>>,
    {
        let options = &self.inner.options;
        let deadline = Instant::now() + options.deadline;
        let mut logged_in = false;
        if self.needs_login() {
            self.login(deadline).await?;
            logged_in = true;
        }
        let mut target = self.read_target();
        let mut attempts = 0u32;
        let mut retries = 0u32;
        let mut last_error = String::new();
        let mut busy = None;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(busy.unwrap_or(ClientError::Unreachable(last_error)));
            }
            attempts = attempts.saturating_add(1);
            let timeout = options.attempt_timeout.min(remaining);
            let result = match self.rpc(&target) {
                Ok(rpc) => attempt(rpc, &target, timeout, attempts).await,
                Err(error) => Attempt::NotSent(error),
            };
            match result {
                Attempt::Done(value) => {
                    *lock(&self.inner.reader) = Some(target);
                    return Ok(value);
                }
                Attempt::Refused(error) => return Err(error),
                Attempt::Unauthenticated(reason) => {
                    let password =
                        matches!(options.credentials, Some(Credentials::Password { .. }));
                    if !password || logged_in {
                        return Err(ClientError::Unauthenticated(reason));
                    }
                    self.inner.token.set(None);
                    self.login(deadline).await?;
                    logged_in = true;
                }
                Attempt::Busy(refusal) => {
                    busy = Some(refusal);
                    self.pause(&mut retries, deadline).await;
                }
                Attempt::Redirect(_) => {
                    last_error = format!("{target} could not answer");
                    *lock(&self.inner.reader) = None;
                    target = self.next_target(&target);
                    self.pause(&mut retries, deadline).await;
                }
                Attempt::NotSent(error) | Attempt::MaybeSent(error) => {
                    last_error = format!("{target}: {error}");
                    self.forget_channel(&target);
                    *lock(&self.inner.reader) = None;
                    target = self.next_target(&target);
                    self.pause(&mut retries, deadline).await;
                }
            }
        }
    }

    /// The status of one node (`address`), or of the first reachable
    /// endpoint when `None`.
    pub async fn status(&self, address: Option<&str>) -> Result<v1::StatusResponse, ClientError> {
        let candidates: Vec<String> = match address {
            Some(address) => vec![address.to_string()],
            None => self.inner.endpoints.clone(),
        };
        let mut last = String::new();
        if self.needs_login() {
            self.login(Instant::now() + self.inner.options.deadline)
                .await?;
        }
        for address in candidates {
            let mut rpc = self.rpc(&address).map_err(ClientError::Unreachable)?;
            let mut message = tonic::Request::new(v1::StatusRequest {});
            message.set_timeout(self.inner.options.attempt_timeout);
            match rpc.status(message).await {
                Ok(status) => return Ok(status.into_inner()),
                Err(status) => match refused_by_transport(&status) {
                    Some(
                        denied @ (ClientError::PermissionDenied(_)
                        | ClientError::Unauthenticated(_)),
                    ) => return Err(denied),
                    _ => last = format!("{address}: {}", status.message()),
                },
            }
        }
        Err(ClientError::Unreachable(last))
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
    /// the index it was taken at and its bytes, whose SHA-256 is checked.
    pub async fn save_snapshot(&self) -> Result<SavedSnapshot, ClientError> {
        use v1::save_snapshot_chunk::Kind;
        let (saved, _, _) = self
            .with_retries(true, None, |mut rpc, _, _timeout, _| async move {
                // A large state takes longer than one attempt: no timeout
                // per attempt here; the server's call timeout bounds it.
                let mut stream = match rpc.save_snapshot(v1::SaveSnapshotRequest {}).await {
                    Ok(response) => response.into_inner(),
                    Err(status) => return failed(status),
                };
                let mut info: Option<v1::SnapshotInfo> = None;
                let mut state = Vec::new();
                loop {
                    match stream.message().await {
                        Ok(Some(chunk)) => match chunk.kind {
                            Some(Kind::Failure(failure)) => return call_failed(failure),
                            Some(Kind::Info(first)) => {
                                let bytes = usize::try_from(first.bytes).unwrap_or(usize::MAX);
                                // Grown as data comes, from a modest start:
                                // the announced size is the server's word.
                                state.reserve(bytes.min(64 << 20));
                                info = Some(first);
                            }
                            Some(Kind::Data(data)) => {
                                let announced = info.as_ref().map_or(0, |i| i.bytes);
                                let total = (state.len() as u64).saturating_add(data.len() as u64);
                                if total > announced {
                                    return Attempt::MaybeSent(format!(
                                        "the snapshot stream sent more than the {announced} bytes it announced"
                                    ));
                                }
                                state.extend_from_slice(&data);
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
                let sha256 = {
                    use sha2::Digest as _;
                    sha2::Sha256::digest(&state).to_vec()
                };
                if state.len() as u64 != info.bytes || sha256 != info.sha256 {
                    return Attempt::MaybeSent(format!(
                        "the snapshot arrived damaged ({} of {} bytes, or a SHA-256 mismatch)",
                        state.len(),
                        info.bytes
                    ));
                }
                Attempt::Done(SavedSnapshot {
                    applied_index: info.applied_index,
                    state,
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
        let (members, _, _) = self
            .with_retries(true, None, |rpc, _, _, _| {
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
            value: vec![0; 2048],
            lease: None,
        };
        let refused = client.execute_once(put, None).await;
        assert!(
            matches!(&refused, Err(ClientError::Invalid(why)) if why.contains("more than this client sends")),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn only_a_refused_connect_counts_as_never_sent() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let channel = TcpConnector
            .channel(&format!("127.0.0.1:{port}"))
            .expect("a channel");
        let refused = KvClient::new(channel)
            .status(v1::StatusRequest {})
            .await
            .expect_err("nothing listens there");
        assert!(never_sent(&refused), "{refused:?}");
        for after_sending in [
            tonic::Status::unavailable("connection reset by peer"),
            tonic::Status::unavailable("connection closed before message completed"),
            tonic::Status::unknown("tcp connect error"),
        ] {
            assert!(!never_sent(&after_sending), "{after_sending:?}");
        }
    }

    fn overloaded(what: &'static str) -> tonic::Status {
        let mut status = tonic::Status::resource_exhausted("server overloaded");
        status.metadata_mut().insert(
            OVERLOADED_METADATA,
            tonic::metadata::MetadataValue::from_static(what),
        );
        status
    }

    #[test]
    fn a_request_shed_by_an_overloaded_server_counts_as_never_sent() {
        let shed = overloaded("in-flight");
        assert_eq!(shed_by_server(&shed).as_deref(), Some("in-flight"));
        assert!(refused_by_transport(&shed).is_none(), "not a refusal");
        match failed::<()>(shed) {
            Attempt::NotSent(reason) => assert!(reason.contains("in-flight"), "{reason}"),
            _ => panic!("a shed request must count as never sent"),
        }
        // The metadata decides, not the text: without it RESOURCE_EXHAUSTED
        // is a refusal of the message (too large), with it under another
        // code it proves nothing.
        let too_large = tonic::Status::resource_exhausted("server overloaded");
        assert!(shed_by_server(&too_large).is_none());
        assert!(matches!(
            failed::<()>(too_large),
            Attempt::Refused(ClientError::Invalid(_))
        ));
        let mut other = tonic::Status::unavailable("server overloaded");
        other.metadata_mut().insert(
            OVERLOADED_METADATA,
            tonic::metadata::MetadataValue::from_static("in-flight"),
        );
        assert!(shed_by_server(&other).is_none());
        assert!(matches!(failed::<()>(other), Attempt::MaybeSent(_)));
    }
}
