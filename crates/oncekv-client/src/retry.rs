//! Retrying a call: what one attempt learned ([`Attempt`]), read from the
//! transport's typed errors and the node's typed failures, never from
//! their text; the backoff between attempts ([`Backoff`], jittered from an
//! injected [`RandomSource`], so tests and simulations can make it
//! deterministic); and the one retry engine of the client: [`Retrier`]
//! reads each attempt's [`Attempt`] ([`Retrier::step`]) and decides the
//! next: following leader hints, skipping nodes that cannot be reached,
//! pausing while a node is busy, staying on a node (and its connection)
//! that shed the call, logging in again once when a token was refused,
//! until the deadline. Every call runs it through [`Client::run`] (to the
//! leader, to any node, to each node in turn: [`Route`]); the watcher
//! runs it for its starts and breaks (`watch.rs`), with no deadline.
//!
//! What an attempt may have done is never forgotten. A request is
//! *never sent* only when the client can prove it: the connection attempt
//! for this very call failed (a [`tonic::ConnectError`] in the status's
//! source chain: no byte of the request was written), the node answered
//! with a typed failure that promises nothing was proposed (not the
//! leader, no leader known, shed unhandled), or it answered that it has no
//! such call. Every other failure of an attempt *may have delivered* it.
//! A call that changes state and had such an attempt, in this call or in
//! an earlier one ([`EarlierSends::MaybeDelivered`]), ends with a reply or
//! with [`ClientError::OutcomeUnknown`], never with a refusal that claims
//! "not applied".

use crate::auth::Credentials;
use crate::client::{Client, Rpc, lock};
use crate::error::ClientError;
use crate::random::{RandomSource, fraction};
use oncekv_proto::convert::{self, CallFailure};
use oncekv_proto::v1;
use oncekv_state::RequestId;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::time::Instant;

/// Exponential backoff: `initial * 2^attempt`, capped at `max`, then
/// "full jitter" (a random point between half and all of it).
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(1000),
        }
    }
}

impl Backoff {
    /// The delay before retry number `retry` (0-based).
    pub fn delay(&self, retry: u32, random: &dyn RandomSource) -> Duration {
        let exponential = self.initial.saturating_mul(1u32 << retry.min(16));
        let capped = exponential.min(self.max);
        capped.mul_f64(0.5 + 0.5 * fraction(random))
    }
}

/// What earlier sends of the same request (with the same sequence number
/// or idempotency key) may have done, for a call that sends it again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EarlierSends {
    /// There were none, or none can have been delivered: the call's own
    /// attempts decide what it reports.
    #[default]
    None,
    /// One may have been delivered (it ended with an unknown outcome), so
    /// the request may have applied, or may still apply. The call then
    /// ends with the request's reply (applied or replayed), a
    /// [`ClientError::RequestMismatch`], or
    /// [`ClientError::OutcomeUnknown`]: never with a refusal or an
    /// unreachable cluster, which say nothing about the earlier send.
    MaybeDelivered,
}

/// What one attempt learned.
pub(crate) enum Attempt<T> {
    /// An answer.
    Done(T),
    /// Definitely not proposed there; try `hint` (or the next node).
    Redirect(Option<String>),
    /// Not proposed: the connection for this call could not be made.
    NotSent(String),
    /// Not handled: the node shed it because a limit was full; retried on
    /// the same node after a pause.
    Shed(String),
    /// May have been proposed.
    MaybeSent(String),
    /// Refused for now by a full table or budget: not applied by this
    /// attempt; retried after a pause until the deadline.
    Busy(ClientError),
    /// Refused for good (a setting or the request itself is wrong).
    Refused(ClientError),
    /// Not carried out: the call named no valid user (a missing or
    /// expired token). Logging in again may help.
    Unauthenticated(String),
}

/// Where a call's attempts go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// To the leader, following its hints.
    Leader,
    /// To any node, from the one that answered the last such call.
    AnyNode,
    /// To the endpoints in turn, from the known leader or the first, for
    /// as long as it takes, remembering no node: a watch (served by any
    /// node from its applied state).
    Stream,
    /// To each endpoint once, in order from the first (or to one given
    /// node, [`Retrier::only`]), remembering no node: a node's status.
    Each,
}

/// How a call is retried.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// Where attempts go.
    pub(crate) route: Route,
    /// Whether the call may change the cluster's state: then an attempt
    /// that may have been delivered is remembered to the end.
    pub(crate) mutating: bool,
    /// Whether an attempt may be sent again after one may have been
    /// delivered (the request is deduplicated, or changes nothing).
    pub(crate) retry_safe: bool,
    /// The request's id, for an unknown outcome's report.
    pub(crate) request_id: Option<RequestId>,
    /// What earlier calls' sends of the same request may have done.
    pub(crate) earlier: EarlierSends,
    /// Whether the loop logs in with the configured password when it has
    /// no token (not for the login call itself).
    pub(crate) logs_in: bool,
}

impl Policy {
    /// A call that changes nothing, retried freely: to the leader or to
    /// any node.
    pub(crate) fn read(route: Route) -> Policy {
        Policy {
            route,
            mutating: false,
            retry_safe: true,
            request_id: None,
            earlier: EarlierSends::None,
            logs_in: true,
        }
    }
}

/// What a finished call learned besides its value.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ran {
    /// How many attempts were made.
    pub(crate) attempts: u32,
    /// Whether an attempt of this call, or an earlier send, may have been
    /// delivered.
    pub(crate) maybe_delivered: bool,
}

/// The errors in `error`'s source chain, itself first.
fn chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |current| current.source())
}

/// Whether a transport status proves the request never left this client:
/// the connection for this call failed (tonic wraps every failure of its
/// connector, whichever transport it dials, in [`tonic::ConnectError`];
/// a request is written only on a connection that was made).
pub(crate) fn never_sent(status: &tonic::Status) -> bool {
    chain(status).any(|error| error.is::<tonic::ConnectError>())
}

/// The words of a TLS refusal in `status`'s sources (a certificate, a
/// host name, a client certificate): a setting to fix, so the call fails
/// at once instead of retrying until its deadline.
fn refused_by_tls(status: &tonic::Status) -> Option<String> {
    chain(status).find_map(|error| {
        error
            .downcast_ref::<crate::connector::TlsConnectError>()
            .filter(|tls| tls.refused_by_tls())
            .map(ToString::to_string)
    })
}

/// What was full, if the server shed the request unhandled: status
/// RESOURCE_EXHAUSTED carrying the overloaded metadata entry (never the
/// message text). Such a request definitely did not apply.
fn shed_by_server(status: &tonic::Status) -> Option<String> {
    if status.code() != tonic::Code::ResourceExhausted {
        return None;
    }
    let value = status.metadata().get(oncekv_proto::OVERLOADED_METADATA)?;
    Some(value.to_str().unwrap_or("a limit").to_string())
}

/// What a transport-level failure says about an attempt: not sent (could
/// not connect, or the node has no such call), shed (the server turned it
/// away unhandled), refused (message too large or invalid), or maybe sent.
pub(crate) fn failed<T>(status: tonic::Status) -> Attempt<T> {
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
        return Attempt::Shed(format!("server overloaded ({full} full), not handled"));
    }
    match refused_by_transport(&status) {
        Some(error) => Attempt::Refused(error),
        None => Attempt::MaybeSent(status.message().to_string()),
    }
}

/// What a call's `Failure` says about the attempt: the one place the
/// client reads it (the watcher too; `tests/tidy.rs` keeps it so).
pub(crate) fn call_failed<T>(failure: v1::Failure) -> Attempt<T> {
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
            Attempt::Shed(format!("server overloaded ({what} full), not handled"))
        }
        Err(error) => Attempt::MaybeSent(format!("undecodable failure: {error}")),
    }
}

/// A transport status that refuses the message itself or its caller.
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

/// What [`Retrier::step`] decided after an attempt.
pub(crate) enum Step<T> {
    /// The attempt's answer: the call is done.
    Done(T),
    /// Try again: the retrier's target (the same node, another, or the
    /// leader it was told of), after the pause it took.
    Again,
    /// The call ends with this error.
    Stop(ClientError),
}

/// The bookkeeping of one call's attempts, or of a watch's starts: where
/// the next attempt goes, and what the earlier ones learned. The one
/// reading of an [`Attempt`] ([`Retrier::step`]): [`Client::run`] and the
/// watcher both go through it, so both follow hints, skip nodes they
/// cannot reach, pause with the injected [`Backoff`] and stay on a node
/// (and its connection) that shed them.
#[derive(Debug)]
pub(crate) struct Retrier {
    policy: Policy,
    /// When the call gives up (`None`: never, as a watch; each login then
    /// has the client's deadline).
    deadline: Option<Instant>,
    /// The node the next attempt goes to.
    target: String,
    /// With [`Route::Each`]: the nodes not yet tried, in order.
    untried: VecDeque<String>,
    attempts: u32,
    /// Pauses taken (since the stream last started, for a watch): the
    /// backoff grows with them.
    retries: u32,
    maybe_delivered: bool,
    last_error: String,
    busy: Option<ClientError>,
    /// Whether it logged in again after a refused token (once per call).
    logged_in: bool,
    /// Answers in a row from [`Retrier::target`] that shed the call.
    sheds_here: u32,
}

/// Sheds in a row after which a call any node may serve (a watch, a read
/// from any node) goes to the next node instead: a node that stays full
/// (at its cap on watchers, say) is left for one with room.
pub(crate) const SHEDS_BEFORE_ANOTHER_NODE: u32 = 8;

impl Retrier {
    /// The first attempt's target by `policy`'s route; until `deadline`.
    pub(crate) fn new(client: &Client, policy: Policy, deadline: Option<Instant>) -> Retrier {
        let (target, untried) = match policy.route {
            Route::Leader | Route::Stream => (client.first_target(), VecDeque::new()),
            Route::AnyNode => (client.read_target(), VecDeque::new()),
            Route::Each => {
                let mut nodes: VecDeque<String> = client.endpoints().iter().cloned().collect();
                let first = nodes.pop_front().unwrap_or_default();
                (first, nodes)
            }
        };
        Retrier {
            policy,
            deadline,
            target,
            untried,
            attempts: 0,
            retries: 0,
            maybe_delivered: policy.earlier == EarlierSends::MaybeDelivered,
            last_error: String::new(),
            sheds_here: 0,
            busy: None,
            logged_in: false,
        }
    }

    /// Only to `node` (with [`Route::Each`]: that node alone).
    pub(crate) fn only(mut self, node: &str) -> Retrier {
        self.target = node.to_string();
        self.untried.clear();
        self
    }

    /// The node the next attempt goes to.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Logs in with the configured password if the client holds no token
    /// (a policy that logs in, not the login call itself).
    pub(crate) async fn log_in_if_needed(&mut self, client: &Client) -> Result<(), ClientError> {
        if self.policy.logs_in && client.needs_login() {
            client.login(self.login_deadline(client)).await?;
        }
        Ok(())
    }

    /// The start of an attempt: its number and its timeout, or the call's
    /// end once the deadline passed.
    fn begin_attempt(&mut self, client: &Client) -> Result<(u32, Duration), ClientError> {
        let timeout = client.options().attempt_timeout;
        let Some(deadline) = self.deadline else {
            self.attempts = self.attempts.saturating_add(1);
            return Ok((self.attempts, timeout));
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(self.gave_up());
        }
        self.attempts = self.attempts.saturating_add(1);
        Ok((self.attempts, timeout.min(remaining)))
    }

    /// What the call ends with when it gives up: an unknown outcome if a
    /// send may have been delivered, else the last refusal, else why no
    /// node could be reached.
    fn gave_up(&mut self) -> ClientError {
        if self.maybe_delivered {
            ClientError::OutcomeUnknown {
                request_id: self.policy.request_id,
                attempts: self.attempts,
                last_answer: self.busy.take().map(Box::new),
            }
        } else if let Some(refusal) = self.busy.take() {
            refusal
        } else {
            ClientError::Unreachable(std::mem::take(&mut self.last_error))
        }
    }

    /// What an attempt at [`Retrier::target`] learned decides what comes
    /// next: done, refused for good, or another attempt (after logging in
    /// again, after a pause, on this node or another).
    pub(crate) async fn step<T>(&mut self, client: &Client, result: Attempt<T>) -> Step<T> {
        let route = self.policy.route;
        match result {
            Attempt::Done(value) => {
                self.answered(client, Some(self.target.clone()));
                return Step::Done(value);
            }
            Attempt::Refused(error) => return Step::Stop(error),
            Attempt::Unauthenticated(reason) => {
                // A password logs in again once per call (the token
                // expired or the password changed; a login before the
                // first attempt, for want of a token, does not count);
                // the login call itself never does.
                let password = matches!(
                    client.options().credentials,
                    Some(Credentials::Password { .. })
                );
                if !password || !self.policy.logs_in || self.logged_in {
                    return Step::Stop(ClientError::Unauthenticated(reason));
                }
                client.forget_token();
                if let Err(error) = client.login(self.login_deadline(client)).await {
                    return Step::Stop(error);
                }
                self.logged_in = true;
            }
            Attempt::Busy(refusal) => {
                if route == Route::Leader {
                    self.answered(client, Some(self.target.clone()));
                }
                // The store's quota, or an alarm raised by hand, holds
                // until an operator frees space and disarms it: no retry
                // within a call's deadline would see it lifted.
                let lasting = matches!(
                    refusal,
                    ClientError::Overloaded(oncekv_state::Overload::NoSpace { .. })
                );
                self.busy = Some(refusal);
                if lasting {
                    return Step::Stop(self.gave_up());
                }
                self.pause(client).await;
            }
            Attempt::Shed(reason) => {
                // The node is there and turned the call away unhandled:
                // the same node again, on the same connection; a call any
                // node may serve leaves a node that keeps shedding it.
                self.last_error = format!("{}: {reason}", self.target);
                self.sheds_here = self.sheds_here.saturating_add(1);
                let anywhere = matches!(route, Route::Stream | Route::AnyNode);
                if anywhere
                    && self.sheds_here >= SHEDS_BEFORE_ANOTHER_NODE
                    && let Err(error) = self.move_on(client)
                {
                    return Step::Stop(error);
                }
                self.pause(client).await;
            }
            Attempt::Redirect(hint) => {
                self.last_error = format!("{} is not the leader", self.target);
                self.answered(client, None);
                match hint {
                    Some(leader) if leader != self.target && route == Route::Leader => {
                        self.target = leader;
                    }
                    _ => {
                        self.pause(client).await;
                        if let Err(error) = self.move_on(client) {
                            return Step::Stop(error);
                        }
                    }
                }
            }
            Attempt::NotSent(error) => {
                self.last_error = format!("{}: {error}", self.target);
                client.forget_channel(&self.target);
                if route == Route::AnyNode {
                    self.answered(client, None);
                }
                if let Err(error) = self.move_on(client) {
                    return Step::Stop(error);
                }
                self.pause(client).await;
            }
            Attempt::MaybeSent(error) => {
                self.maybe_delivered = true;
                self.last_error = format!("{}: {error}", self.target);
                if !self.policy.retry_safe {
                    return Step::Stop(ClientError::OutcomeUnknown {
                        request_id: self.policy.request_id,
                        attempts: self.attempts,
                        last_answer: None,
                    });
                }
                client.forget_channel(&self.target);
                self.answered(client, None);
                if let Err(error) = self.move_on(client) {
                    return Step::Stop(error);
                }
                self.pause(client).await;
            }
        }
        Step::Again
    }

    /// The next node of the route: the next endpoint in turn, or with
    /// [`Route::Each`] the next one not yet tried (none left: the call
    /// ends, unreachable).
    pub(crate) fn move_on(&mut self, client: &Client) -> Result<(), ClientError> {
        self.sheds_here = 0;
        if self.policy.route == Route::Each {
            match self.untried.pop_front() {
                Some(node) => self.target = node,
                None => {
                    return Err(ClientError::Unreachable(std::mem::take(
                        &mut self.last_error,
                    )));
                }
            }
        } else {
            self.target = client.next_target(&self.target);
        }
        Ok(())
    }

    /// A node answered and served (a stream started, or delivered
    /// changes): the next pause is the shortest again.
    pub(crate) fn served(&mut self) {
        self.retries = 0;
    }

    /// Changes or progress were heard: a token refused from now on may be
    /// logged in again once more.
    pub(crate) fn heard(&mut self) {
        self.logged_in = false;
    }

    /// Waits the backoff's next delay (never past the deadline).
    async fn pause(&mut self, client: &Client) {
        let options = client.options();
        let delay = options.backoff.delay(self.retries, options.random.as_ref());
        self.retries = self.retries.saturating_add(1);
        let until = Instant::now() + delay;
        tokio::time::sleep_until(self.deadline.map_or(until, |deadline| until.min(deadline))).await;
    }

    fn login_deadline(&self, client: &Client) -> Instant {
        self.deadline
            .unwrap_or_else(|| Instant::now() + client.options().deadline)
    }

    /// Remembers (or forgets, with `None`) the node that answered a call
    /// of the route: the leader, or the node for the next read at any
    /// node. The other routes remember nothing.
    fn answered(&self, client: &Client, node: Option<String>) {
        match self.policy.route {
            Route::Leader => *lock(client.leader_slot()) = node,
            Route::AnyNode => *lock(client.reader_slot()) = node,
            Route::Stream | Route::Each => {}
        }
    }
}

impl Client {
    /// Runs `attempt` under `policy` until it is done, the deadline passes,
    /// or it fails for good (or after maybe being delivered when the call
    /// is not `retry_safe`). A call that may change state and may have
    /// been delivered (by this call or an earlier one) never ends with a
    /// refusal: that becomes [`ClientError::OutcomeUnknown`].
    pub(crate) async fn run<T, F, Fut>(
        &self,
        policy: Policy,
        attempt: F,
    ) -> Result<(T, Ran), ClientError>
    where
        F: FnMut(Rpc, &str, Duration, u32) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        let deadline = Instant::now() + self.options().deadline;
        self.run_with(Retrier::new(self, policy, Some(deadline)), attempt)
            .await
    }

    /// [`Client::run`] with attempts that start as `retrier` says (a
    /// route to given nodes, a deadline).
    pub(crate) async fn run_with<T, F, Fut>(
        &self,
        mut retrier: Retrier,
        attempt: F,
    ) -> Result<(T, Ran), ClientError>
    where
        F: FnMut(Rpc, &str, Duration, u32) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        let result = self.attempts(&mut retrier, attempt).await;
        let ran = Ran {
            attempts: retrier.attempts,
            maybe_delivered: retrier.maybe_delivered,
        };
        match result {
            Ok(value) => Ok((value, ran)),
            Err(error @ ClientError::OutcomeUnknown { .. }) => Err(error),
            Err(error) if retrier.policy.mutating && retrier.maybe_delivered => {
                Err(ClientError::OutcomeUnknown {
                    request_id: retrier.policy.request_id,
                    attempts: retrier.attempts,
                    last_answer: Some(Box::new(error)),
                })
            }
            Err(error) => Err(error),
        }
    }

    async fn attempts<T, F, Fut>(
        &self,
        retrier: &mut Retrier,
        mut attempt: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Rpc, &str, Duration, u32) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        retrier.log_in_if_needed(self).await?;
        loop {
            let (number, timeout) = retrier.begin_attempt(self)?;
            let result = match self.rpc(retrier.target()) {
                Ok(rpc) => attempt(rpc, retrier.target(), timeout, number).await,
                Err(error) => Attempt::NotSent(error),
            };
            match retrier.step(self, result).await {
                Step::Done(value) => return Ok(value),
                Step::Stop(error) => return Err(error),
                Step::Again => {}
            }
        }
    }

    /// Logs in with the configured password and keeps the token: at any
    /// node (each checks against the replicated users after a read
    /// barrier), following leader hints, until `deadline`.
    pub(crate) fn login(
        &self,
        deadline: Instant,
    ) -> Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send + '_>> {
        Box::pin(async move {
            let Some(Credentials::Password { user, password }) = &self.options().credentials else {
                return Ok(());
            };
            let policy = Policy {
                logs_in: false,
                ..Policy::read(Route::Leader)
            };
            let request = v1::AuthenticateRequest {
                user: user.clone(),
                password: password.clone(),
            };
            let retrier = Retrier::new(self, policy, Some(deadline));
            let logged_in = self
                .run_with(retrier, |mut rpc, _, timeout, _| {
                    let mut message = tonic::Request::new(request.clone());
                    message.set_timeout(timeout);
                    async move {
                        use v1::authenticate_response::Result as Answer;
                        match rpc.authenticate(message).await {
                            Ok(response) => match response.into_inner().result {
                                Some(Answer::Token(token)) => Attempt::Done(token.token),
                                Some(Answer::Failure(failure)) => call_failed(failure),
                                None => Attempt::MaybeSent("empty response".into()),
                            },
                            Err(status) => failed(status),
                        }
                    }
                })
                .await;
            match logged_in {
                Ok((token, _)) => {
                    self.keep_token(token);
                    Ok(())
                }
                Err(
                    error @ (ClientError::Unauthenticated(_)
                    | ClientError::Invalid(_)
                    | ClientError::PermissionDenied(_)),
                ) => Err(error),
                Err(ClientError::Unreachable(why)) => {
                    Err(ClientError::Unreachable(format!("login: {why}")))
                }
                Err(other) => Err(ClientError::Unreachable(format!("login: {other}"))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::{Connector, TcpConnector};
    use crate::random::Fixed;
    use oncekv_proto::v1::kv_client::KvClient;

    const HIGHEST: Fixed = Fixed(u64::MAX);
    const LOWEST: Fixed = Fixed(0);

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        let near = |delay: Duration, ms: u64| {
            let want = Duration::from_millis(ms);
            assert!(
                delay <= want && want - delay < Duration::from_micros(1),
                "{delay:?} vs {want:?}"
            );
        };
        near(backoff.delay(0, &HIGHEST), 10);
        near(backoff.delay(2, &HIGHEST), 40);
        near(backoff.delay(9, &HIGHEST), 100);
        assert_eq!(backoff.delay(9, &LOWEST), Duration::from_millis(50));
    }

    #[tokio::test]
    async fn only_a_failed_connect_counts_as_never_sent() {
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
        // The words prove nothing: only the typed connect failure does.
        for after_sending in [
            tonic::Status::unavailable("connection reset by peer"),
            tonic::Status::unavailable("connection closed before message completed"),
            tonic::Status::unavailable("tcp connect error: connection refused"),
            tonic::Status::unknown("error trying to connect"),
        ] {
            assert!(!never_sent(&after_sending), "{after_sending:?}");
            assert!(matches!(failed::<()>(after_sending), Attempt::MaybeSent(_)));
        }
    }

    fn overloaded(what: &'static str) -> tonic::Status {
        let mut status = tonic::Status::resource_exhausted("server overloaded");
        status.metadata_mut().insert(
            oncekv_proto::OVERLOADED_METADATA,
            tonic::metadata::MetadataValue::from_static(what),
        );
        status
    }

    #[test]
    fn a_request_shed_by_an_overloaded_server_counts_as_unhandled() {
        let shed = overloaded("in-flight");
        assert_eq!(shed_by_server(&shed).as_deref(), Some("in-flight"));
        assert!(refused_by_transport(&shed).is_none(), "not a refusal");
        match failed::<()>(shed) {
            Attempt::Shed(reason) => assert!(reason.contains("in-flight"), "{reason}"),
            _ => panic!("a shed request must count as unhandled"),
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
            oncekv_proto::OVERLOADED_METADATA,
            tonic::metadata::MetadataValue::from_static("in-flight"),
        );
        assert!(shed_by_server(&other).is_none());
        assert!(matches!(failed::<()>(other), Attempt::MaybeSent(_)));
    }
}
