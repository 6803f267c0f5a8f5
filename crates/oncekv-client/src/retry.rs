//! Retrying a call: what one attempt learned ([`Attempt`]), read from the
//! transport's typed errors and the node's typed failures, never from
//! their text; the backoff between attempts ([`Backoff`], jittered from an
//! injected [`RandomSource`], so tests and simulations can make it
//! deterministic); and the one loop every call of the client runs
//! ([`Client::run`]): to the leader or to any node, following leader
//! hints, skipping nodes that cannot be reached, pausing while a node is
//! busy, logging in again once when a token expired, until the deadline.
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
pub(crate) fn refused_by_transport(status: &tonic::Status) -> Option<ClientError> {
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

/// The bookkeeping of one call's attempts.
struct Tally {
    attempts: u32,
    retries: u32,
    maybe_delivered: bool,
    last_error: String,
    busy: Option<ClientError>,
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
        self.run_until(policy, deadline, attempt).await
    }

    async fn run_until<T, F, Fut>(
        &self,
        policy: Policy,
        deadline: Instant,
        attempt: F,
    ) -> Result<(T, Ran), ClientError>
    where
        F: FnMut(Rpc, &str, Duration, u32) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        let mut tally = Tally {
            attempts: 0,
            retries: 0,
            maybe_delivered: policy.earlier == EarlierSends::MaybeDelivered,
            last_error: String::new(),
            busy: None,
        };
        let result = self.attempts(policy, deadline, &mut tally, attempt).await;
        let ran = Ran {
            attempts: tally.attempts,
            maybe_delivered: tally.maybe_delivered,
        };
        match result {
            Ok(value) => Ok((value, ran)),
            Err(error @ ClientError::OutcomeUnknown { .. }) => Err(error),
            Err(error) if policy.mutating && tally.maybe_delivered => {
                Err(ClientError::OutcomeUnknown {
                    request_id: policy.request_id,
                    attempts: tally.attempts,
                    last_answer: Some(Box::new(error)),
                })
            }
            Err(error) => Err(error),
        }
    }

    async fn attempts<T, F, Fut>(
        &self,
        policy: Policy,
        deadline: Instant,
        tally: &mut Tally,
        mut attempt: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Rpc, &str, Duration, u32) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        let options = self.options();
        let password = matches!(options.credentials, Some(Credentials::Password { .. }));
        // A password logs in again once per call (the token expired or
        // the password changed); the login call itself never does.
        let mut logged_in = !policy.logs_in;
        if policy.logs_in && self.needs_login() {
            self.login(deadline).await?;
            logged_in = true;
        }
        let mut target = match policy.route {
            Route::Leader => self.first_target(),
            Route::AnyNode => self.read_target(),
        };
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(if tally.maybe_delivered {
                    ClientError::OutcomeUnknown {
                        request_id: policy.request_id,
                        attempts: tally.attempts,
                        last_answer: tally.busy.take().map(Box::new),
                    }
                } else if let Some(refusal) = tally.busy.take() {
                    refusal
                } else {
                    ClientError::Unreachable(std::mem::take(&mut tally.last_error))
                });
            }
            tally.attempts = tally.attempts.saturating_add(1);
            let timeout = options.attempt_timeout.min(remaining);
            let result = match self.rpc(&target) {
                Ok(rpc) => attempt(rpc, &target, timeout, tally.attempts).await,
                Err(error) => Attempt::NotSent(error),
            };
            match result {
                Attempt::Done(value) => {
                    self.answered(policy.route, Some(target));
                    return Ok(value);
                }
                Attempt::Refused(error) => return Err(error),
                Attempt::Unauthenticated(reason) => {
                    if !password || logged_in {
                        return Err(ClientError::Unauthenticated(reason));
                    }
                    self.forget_token();
                    self.login(deadline).await?;
                    logged_in = true;
                }
                Attempt::Busy(refusal) => {
                    if policy.route == Route::Leader {
                        self.answered(Route::Leader, Some(target.clone()));
                    }
                    tally.busy = Some(refusal);
                    self.pause(&mut tally.retries, deadline).await;
                }
                Attempt::Shed(reason) => {
                    // The node is there and turned the call away unhandled:
                    // the same node again, on the same connection.
                    tally.last_error = format!("{target}: {reason}");
                    self.pause(&mut tally.retries, deadline).await;
                }
                Attempt::Redirect(hint) => {
                    tally.last_error = format!("{target} is not the leader");
                    self.answered(policy.route, None);
                    target = match hint {
                        Some(leader) if leader != target && policy.route == Route::Leader => leader,
                        _ => {
                            self.pause(&mut tally.retries, deadline).await;
                            self.next_target(&target)
                        }
                    };
                }
                Attempt::NotSent(error) => {
                    tally.last_error = format!("{target}: {error}");
                    self.forget_channel(&target);
                    if policy.route == Route::AnyNode {
                        self.answered(Route::AnyNode, None);
                    }
                    target = self.next_target(&target);
                    self.pause(&mut tally.retries, deadline).await;
                }
                Attempt::MaybeSent(error) => {
                    tally.maybe_delivered = true;
                    tally.last_error = format!("{target}: {error}");
                    if !policy.retry_safe {
                        return Err(ClientError::OutcomeUnknown {
                            request_id: policy.request_id,
                            attempts: tally.attempts,
                            last_answer: None,
                        });
                    }
                    self.forget_channel(&target);
                    self.answered(policy.route, None);
                    target = self.next_target(&target);
                    self.pause(&mut tally.retries, deadline).await;
                }
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
            let logged_in = self
                .run_until(policy, deadline, |mut rpc, _, timeout, _| {
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

    async fn pause(&self, retries: &mut u32, deadline: Instant) {
        let options = self.options();
        let delay = options.backoff.delay(*retries, options.random.as_ref());
        *retries = retries.saturating_add(1);
        tokio::time::sleep_until((Instant::now() + delay).min(deadline)).await;
    }

    /// Remembers (or forgets, with `None`) the node that answered a call
    /// of `route`: the leader, or the node for the next read at any node.
    fn answered(&self, route: Route, node: Option<String>) {
        match route {
            Route::Leader => *lock(self.leader_slot()) = node,
            Route::AnyNode => *lock(self.reader_slot()) = node,
        }
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
