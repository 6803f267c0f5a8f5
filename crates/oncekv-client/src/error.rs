//! [`ClientError`]: what the client knows when a call does not end with a
//! reply. Each variant says whether the request was applied.

use oncekv_state::{Overload, Rejection, RequestId, Seq};

/// Why a call did not return a reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Applied with an application-level "no" (a value over the limit, a
    /// lease that exists, INCR on text, ...). Definite: nothing changed.
    #[error("rejected: {0}")]
    Rejected(Rejection),
    /// The session expired (or was evicted or closed): this call did not
    /// apply the request. (When an earlier call of the same request ended
    /// with an unknown outcome, that one may still have applied before the
    /// session went; within one call the client reports such a case as
    /// [`ClientError::OutcomeUnknown`].) Open a new session.
    #[error("session expired: this send of the request was not applied")]
    SessionExpired,
    /// The session secret was wrong: not applied.
    #[error("unauthorized: wrong session secret, not applied")]
    Unauthorized,
    /// The sequence number was already acknowledged and its record freed:
    /// not applied again.
    #[error("stale request: sequence numbers below {floor} were acknowledged")]
    Stale {
        /// The session's watermark.
        floor: u64,
    },
    /// The sequence number is beyond the session's window: not applied.
    #[error("sequence gap: the next sequence number expected is {expected}")]
    SequenceGap {
        /// The lowest sequence number not yet executed.
        expected: u64,
    },
    /// The dedup key was used before for a different command: not applied.
    #[error("request mismatch: that sequence number or key was used for another command")]
    RequestMismatch,
    /// The request's framing was refused: not applied.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// The request was refused before proposing: not applied.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A bounded table or budget of the cluster is full of live entries
    /// (sessions, idempotency keys, completion record bytes, the store's
    /// quota): not applied, nothing evicted. The client retries it until
    /// its deadline, except [`Overload::NoSpace`] (the store's quota, or an
    /// alarm raised by hand: only an operator lifts it), reported at once.
    #[error("overloaded, not applied: {0}")]
    Overloaded(Overload),
    /// No definite answer: an attempt (of this call, or a send before it)
    /// may have been delivered, and nothing since proved whether it
    /// applied. The request may or may not have applied (and may still
    /// apply).
    #[error("outcome unknown after {attempts} attempt(s){}: it may or may not have applied{}", request_id.map(|id| format!(" of request {id}")).unwrap_or_default(), last_answer.as_ref().map(|answer| format!(" (the last attempt was answered: {answer})")).unwrap_or_default())]
    OutcomeUnknown {
        /// The request's id, if it was on a session.
        request_id: Option<RequestId>,
        /// How many times it was sent.
        attempts: u32,
        /// The refusal the last attempt got, when there was one: it says
        /// nothing about the earlier send (a session expired since, a
        /// record freed, a full table, a cluster that could not be
        /// reached), but tells the caller whether retrying can help.
        last_answer: Option<Box<ClientError>>,
    },
    /// The cluster enforces authentication and this call named no valid
    /// user (no credentials, a wrong password, an expired token): not
    /// applied.
    #[error("unauthenticated, not applied: {0}")]
    Unauthenticated(String),
    /// The user may not do this (a key outside its grants, an admin call,
    /// another user's session): not applied.
    #[error("permission denied, not applied: {0}")]
    PermissionDenied(String),
    /// No node could be reached before anything was sent: not applied.
    #[error("no node reachable: {0}")]
    Unreachable(String),
    /// The client was configured wrongly.
    #[error("configuration: {0}")]
    Config(String),
}

impl ClientError {
    /// Whether the request definitely did not apply (so the caller may
    /// safely do something else instead).
    pub fn not_applied(&self) -> bool {
        !matches!(self, ClientError::OutcomeUnknown { .. })
    }

    pub(crate) fn gap(expected: Seq) -> ClientError {
        ClientError::SequenceGap {
            expected: expected.0,
        }
    }
}
