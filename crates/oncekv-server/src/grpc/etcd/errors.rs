//! The one table of errors the etcd API answers: each with the gRPC code
//! and the exact text etcd's clients match on (etcd's `rpctypes`), and
//! where the node's own refusals ([`WriteError`], outcomes, rejections)
//! fall in it.
//!
//! "Unavailable" promises what it promises natively: nothing was
//! proposed ("not leader", "no leader"). A write that may have been
//! proposed answers etcd's "request timed out" with DEADLINE_EXCEEDED, a
//! code etcd's clients never resend a write on.

use crate::raft::consensus::WriteError;
use oncekv_state::{InvalidRequest, Outcome, Overload, Rejection};
use tonic::{Code, Status};

/// An error of the etcd API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum EtcdError {
    /// A request without a key.
    EmptyKey,
    /// A key, value or message over the node's limits.
    RequestTooLarge,
    /// A transaction over the node's limit of operations.
    TooManyOps,
    /// A transaction writing one key twice.
    DuplicateKey,
    /// A revision older than the history kept.
    Compacted,
    /// A revision beyond the store's.
    FutureRevision,
    /// The store's byte quota is reached (the `NOSPACE` alarm).
    NoSpace,
    /// A bounded table or budget is full, or the node sheds load (named).
    TooManyRequests(&'static str),
    /// The caller may not do this.
    PermissionDenied,
    /// No valid credentials while authentication is enforced.
    InvalidAuthToken,
    /// Not the leader, which is known: nothing was proposed.
    NotLeader,
    /// No leader is known: nothing was proposed.
    NoLeader,
    /// The write may have been proposed, and may still apply.
    Timeout,
    /// No such lease.
    LeaseNotFound,
    /// A lease of that ID exists.
    LeaseExists,
    /// A lease TTL over the node's maximum.
    LeaseTtlTooLarge,
    /// The idempotency key was used for another request.
    KeyReused,
    /// A form of a request oncekv does not serve (what).
    Unsupported(String),
    /// A request refused for the reason given.
    Invalid(String),
}

impl EtcdError {
    /// Its code and text.
    fn code_and_text(&self) -> (Code, String) {
        let fixed = |code, text: &str| (code, text.to_string());
        match self {
            EtcdError::EmptyKey => fixed(Code::InvalidArgument, "etcdserver: key is not provided"),
            EtcdError::RequestTooLarge => {
                fixed(Code::InvalidArgument, "etcdserver: request is too large")
            }
            EtcdError::TooManyOps => fixed(
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            EtcdError::DuplicateKey => fixed(
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            EtcdError::Compacted => fixed(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            EtcdError::FutureRevision => fixed(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            EtcdError::NoSpace => fixed(
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            EtcdError::TooManyRequests(_) => {
                fixed(Code::ResourceExhausted, "etcdserver: too many requests")
            }
            EtcdError::PermissionDenied => {
                fixed(Code::PermissionDenied, "etcdserver: permission denied")
            }
            EtcdError::InvalidAuthToken => {
                fixed(Code::Unauthenticated, "etcdserver: invalid auth token")
            }
            EtcdError::NotLeader => fixed(Code::Unavailable, "etcdserver: not leader"),
            EtcdError::NoLeader => fixed(Code::Unavailable, "etcdserver: no leader"),
            EtcdError::Timeout => fixed(Code::DeadlineExceeded, "etcdserver: request timed out"),
            EtcdError::LeaseNotFound => {
                fixed(Code::NotFound, "etcdserver: requested lease not found")
            }
            EtcdError::LeaseExists => {
                fixed(Code::FailedPrecondition, "etcdserver: lease already exists")
            }
            EtcdError::LeaseTtlTooLarge => {
                fixed(Code::OutOfRange, "etcdserver: too large lease TTL")
            }
            EtcdError::KeyReused => fixed(
                Code::FailedPrecondition,
                "oncekv: the idempotency key was used for another request",
            ),
            EtcdError::Unsupported(what) => (
                Code::Unimplemented,
                format!("oncekv: {what} is not served (see docs/etcd-compatibility.md)"),
            ),
            EtcdError::Invalid(why) => (Code::InvalidArgument, format!("oncekv: {why}")),
        }
    }

    /// Where a state machine rejection falls.
    pub(super) fn of_rejection(rejection: &Rejection) -> EtcdError {
        match rejection {
            Rejection::KeyLength { bytes: 0, .. } => EtcdError::EmptyKey,
            Rejection::KeyLength { .. } | Rejection::ValueTooLarge { .. } => {
                EtcdError::RequestTooLarge
            }
            Rejection::Compacted { .. } => EtcdError::Compacted,
            Rejection::FutureRevision { .. } => EtcdError::FutureRevision,
            Rejection::TxnTooLarge { .. } => EtcdError::TooManyOps,
            Rejection::TxnConflict { .. } => EtcdError::DuplicateKey,
            Rejection::TooManyKeys { .. } => EtcdError::NoSpace,
            Rejection::LeaseNotFound { .. } => EtcdError::LeaseNotFound,
            Rejection::LeaseExists { .. } => EtcdError::LeaseExists,
            Rejection::TooManyLeases { .. } => EtcdError::TooManyRequests("leases"),
            other => EtcdError::Invalid(other.to_string()),
        }
    }

    /// Where an outcome other than a reply falls.
    pub(super) fn of_outcome(outcome: &Outcome) -> EtcdError {
        match outcome {
            Outcome::Overloaded(Overload::NoSpace { .. }) => EtcdError::NoSpace,
            Outcome::Overloaded(overload) => EtcdError::TooManyRequests(overload.name()),
            Outcome::PermissionDenied { .. } => EtcdError::PermissionDenied,
            Outcome::RequestMismatch => EtcdError::KeyReused,
            Outcome::Malformed(malformed) => EtcdError::Invalid(malformed.to_string()),
            // Session outcomes cannot come from the origins this API uses;
            // if one did, the write was not executed.
            other => EtcdError::Invalid(format!("not executed: {other:?}")),
        }
    }
}

impl From<EtcdError> for Status {
    fn from(error: EtcdError) -> Status {
        let (code, text) = error.code_and_text();
        match error {
            EtcdError::TooManyRequests(what) => crate::transport::overloaded(what, text),
            _ => Status::new(code, text),
        }
    }
}

/// Where a call the node did not carry out falls.
pub(super) fn error_of(error: WriteError) -> EtcdError {
    match error {
        WriteError::NotLeader {
            leader_id: None,
            leader: None,
        } => EtcdError::NoLeader,
        WriteError::NotLeader { .. } => EtcdError::NotLeader,
        WriteError::Unavailable(_) => EtcdError::Timeout,
        WriteError::Invalid(InvalidRequest::Rejected(rejection)) => {
            EtcdError::of_rejection(&rejection)
        }
        WriteError::Invalid(why) => EtcdError::Invalid(why.to_string()),
        WriteError::Overloaded(what) => EtcdError::TooManyRequests(what),
        WriteError::Unauthenticated(_) => EtcdError::InvalidAuthToken,
        WriteError::PermissionDenied(_) => EtcdError::PermissionDenied,
        WriteError::Refused(why) => EtcdError::Invalid(why),
    }
}

/// A call the node did not carry out, as the etcd API answers it.
pub fn status_of(error: WriteError) -> Status {
    error_of(error).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maybe_proposed_is_never_unavailable() {
        let status = status_of(WriteError::Unavailable("raft stopped".into()));
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(status.message(), "etcdserver: request timed out");
        let status = status_of(WriteError::NotLeader {
            leader_id: Some(2),
            leader: None,
        });
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "etcdserver: not leader");
    }

    #[test]
    fn shed_load_carries_the_overloaded_metadata() {
        let status = status_of(WriteError::Overloaded("in-flight"));
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), "etcdserver: too many requests");
        assert!(
            status
                .metadata()
                .get(oncekv_proto::OVERLOADED_METADATA)
                .is_some()
        );
    }

    #[test]
    fn rejections_take_etcds_texts() {
        let compacted = Rejection::Compacted {
            revision: 3,
            compacted: 9,
        };
        let status: Status = EtcdError::of_rejection(&compacted).into();
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(
            status.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
        let empty = Rejection::KeyLength { bytes: 0, max: 9 };
        let status: Status = EtcdError::of_rejection(&empty).into();
        assert_eq!(status.message(), "etcdserver: key is not provided");
    }
}
