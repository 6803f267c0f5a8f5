//! The one table of errors the etcd API answers: each with the gRPC code
//! and the exact text etcd's clients match on (etcd's `rpctypes`), and
//! where the node's own refusals ([`WriteError`], outcomes, rejections)
//! fall in it.
//!
//! "Unavailable" promises what it promises natively: nothing was
//! proposed ("not leader", "no leader"). A write that may have been
//! proposed answers etcd's "request timed out" with UNKNOWN: etcd's Go
//! client resends a call on UNAVAILABLE only when it is a read, but on a
//! DEADLINE_EXCEEDED from the server it resends any call, writes included,
//! while its own deadline lasts; on UNKNOWN it resends nothing. (Its
//! errors are matched by text, so "request timed out" still reads as
//! etcd's `ErrTimeout`.)

use crate::auth::AuthError;
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
    /// A transaction whose reply would pass the bound on one reply (why).
    ResponseTooLarge(String),
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
    /// A put keeping a key's value or lease found no such key.
    KeyNotFound,
    /// A put keeping the key's value carried a value.
    ValueProvided,
    /// A put keeping the key's lease carried a lease.
    LeaseProvided,
    /// A watch of a range whose end is not above its start.
    EmptyWatchRange,
    /// A Lock's key was deleted (its lease expired or was revoked) before
    /// the lock was acquired.
    SessionExpired,
    /// The election's leader key is not held (any more) at the revision
    /// given.
    ElectionNotLeader,
    /// The election has no leader.
    ElectionNoLeader,
    /// A Proclaim or Resign without its leader key.
    MissingLeaderKey,
    /// The idempotency key was used for another request.
    KeyReused,
    /// A form of a request oncekv does not serve (what).
    Unsupported(String),
    /// A request refused for the reason given.
    Invalid(String),
    /// Authentication is enforced and the call named no user.
    UserEmpty,
    /// A role without a name.
    RoleEmpty,
    /// A user of that name exists.
    UserExists,
    /// No user of that name exists.
    UserNotFound,
    /// A role of that name exists.
    RoleExists,
    /// No role of that name exists.
    RoleNotFound,
    /// Wrong user name or password.
    AuthFailed,
    /// A login while authentication is not enforced.
    AuthNotEnabled,
    /// Enforcing authentication without a user named `root`.
    RootUserNotExist,
    /// Enforcing authentication while `root` lacks the root role.
    RootRoleNotExist,
    /// Taking from a user a role it does not hold.
    RoleNotGranted,
    /// Taking from a role a permission it does not grant.
    PermissionNotGranted,
    /// A permission grant without the permission.
    PermissionNotGiven,
    /// A change that would leave nobody able to manage authentication, or
    /// that the root role does not take.
    InvalidAuthMgmt,
    /// No member has that ID.
    MemberNotFound,
    /// Another member has that peer URL.
    PeerUrlExists,
    /// A member's URLs that do not parse (or none).
    MemberBadUrls,
    /// A promotion of a member that is not a learner.
    MemberNotLearner,
    /// A promotion of a learner that is not caught up with the leader.
    LearnerNotReady,
    /// A membership change after which too few voters would be running to
    /// make a quorum.
    NotEnoughStartedMembers,
    /// A leadership transfer to no member, or to a learner.
    BadLeaderTransferee,
    /// A leadership transfer that did not complete in time (it may still).
    LeaderTransferTimeout,
    /// A learner removed to be added back at new addresses, which was not
    /// added back (why).
    RemovedNotAddedBack {
        /// Its id.
        id: u64,
        /// Why it was not added back.
        why: String,
    },
    /// A voter added as a learner whose promotion failed (why), perhaps
    /// before it was made.
    AddedAsLearnerOnly {
        /// Its id.
        id: u64,
        /// Why it was not promoted.
        why: String,
    },
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
            EtcdError::ResponseTooLarge(why) => (
                Code::ResourceExhausted,
                format!("etcdserver: response is too large: {why}"),
            ),
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
            EtcdError::Timeout => fixed(Code::Unknown, "etcdserver: request timed out"),
            EtcdError::LeaseNotFound => {
                fixed(Code::NotFound, "etcdserver: requested lease not found")
            }
            EtcdError::LeaseExists => {
                fixed(Code::FailedPrecondition, "etcdserver: lease already exists")
            }
            EtcdError::LeaseTtlTooLarge => {
                fixed(Code::OutOfRange, "etcdserver: too large lease TTL")
            }
            EtcdError::KeyNotFound => fixed(Code::InvalidArgument, "etcdserver: key not found"),
            EtcdError::ValueProvided => {
                fixed(Code::InvalidArgument, "etcdserver: value is provided")
            }
            EtcdError::LeaseProvided => {
                fixed(Code::InvalidArgument, "etcdserver: lease is provided")
            }
            // etcd's watch answers this as a cancellation's reason, not a
            // status.
            EtcdError::EmptyWatchRange => {
                fixed(Code::InvalidArgument, "mvcc: watcher range is empty")
            }
            // etcd answers these four with its recipes' own errors, which
            // reach the wire with gRPC's UNKNOWN code.
            EtcdError::SessionExpired => fixed(Code::Unknown, "mutex: session is expired"),
            EtcdError::ElectionNotLeader => fixed(Code::Unknown, "election: not leader"),
            EtcdError::ElectionNoLeader => fixed(Code::Unknown, "election: no leader"),
            EtcdError::MissingLeaderKey => {
                fixed(Code::Unknown, "\"leader\" field must be provided")
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
            EtcdError::UserEmpty => fixed(Code::InvalidArgument, "etcdserver: user name is empty"),
            EtcdError::RoleEmpty => fixed(Code::InvalidArgument, "etcdserver: role name is empty"),
            EtcdError::UserExists => fixed(
                Code::FailedPrecondition,
                "etcdserver: user name already exists",
            ),
            EtcdError::UserNotFound => {
                fixed(Code::FailedPrecondition, "etcdserver: user name not found")
            }
            EtcdError::RoleExists => fixed(
                Code::FailedPrecondition,
                "etcdserver: role name already exists",
            ),
            EtcdError::RoleNotFound => {
                fixed(Code::FailedPrecondition, "etcdserver: role name not found")
            }
            EtcdError::AuthFailed => fixed(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            EtcdError::AuthNotEnabled => fixed(
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ),
            EtcdError::RootUserNotExist => fixed(
                Code::FailedPrecondition,
                "etcdserver: root user does not exist",
            ),
            EtcdError::RootRoleNotExist => fixed(
                Code::FailedPrecondition,
                "etcdserver: root user does not have root role",
            ),
            EtcdError::RoleNotGranted => fixed(
                Code::FailedPrecondition,
                "etcdserver: role is not granted to the user",
            ),
            EtcdError::PermissionNotGranted => fixed(
                Code::FailedPrecondition,
                "etcdserver: permission is not granted to the role",
            ),
            EtcdError::PermissionNotGiven => {
                fixed(Code::InvalidArgument, "etcdserver: permission not given")
            }
            EtcdError::InvalidAuthMgmt => {
                fixed(Code::InvalidArgument, "etcdserver: invalid auth management")
            }
            EtcdError::MemberNotFound => fixed(Code::NotFound, "etcdserver: member not found"),
            EtcdError::PeerUrlExists => fixed(
                Code::FailedPrecondition,
                "etcdserver: Peer URLs already exists",
            ),
            EtcdError::MemberBadUrls => fixed(
                Code::InvalidArgument,
                "etcdserver: given member URLs are invalid",
            ),
            EtcdError::MemberNotLearner => fixed(
                Code::FailedPrecondition,
                "etcdserver: can only promote a learner member",
            ),
            EtcdError::LearnerNotReady => fixed(
                Code::FailedPrecondition,
                "etcdserver: can only promote a learner member which is in sync with leader",
            ),
            // etcd's server maps these two to errors that are not gRPC
            // statuses, which reach the wire with the UNKNOWN code.
            EtcdError::NotEnoughStartedMembers => fixed(
                Code::Unknown,
                "etcdserver: re-configuration failed due to not enough started members",
            ),
            EtcdError::LeaderTransferTimeout => fixed(
                Code::Unknown,
                "etcdserver: request timed out, leader transfer took too long",
            ),
            EtcdError::BadLeaderTransferee => fixed(
                Code::FailedPrecondition,
                "etcdserver: bad leader transferee",
            ),
            // Not a code etcd's clients resend a call on: the member is
            // gone, and only the native API adds one under a given id.
            EtcdError::RemovedNotAddedBack { id, why } => (
                Code::Unknown,
                format!(
                    "oncekv: learner {id:x} (node {id}) was removed to be added back at its \
                     new addresses, and adding it back failed ({why}): add it again \
                     (`oncekv member add {id} --peer ... --client ...`)"
                ),
            ),
            // Not a code etcd's clients resend a call on: resent, the add
            // would be refused (its peer URL is taken) and the id lost.
            EtcdError::AddedAsLearnerOnly { id, why } => (
                Code::Unknown,
                format!(
                    "oncekv: member {id:x} (node {id}) was added as a learner, and making \
                     it a voter failed ({why}), perhaps before it was done: list the \
                     members, then promote it or remove it"
                ),
            ),
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
            // etcd refuses a nesting too deep as too many operations: each
            // level takes from the budget its enclosing one leaves.
            Rejection::TxnTooLarge { .. } | Rejection::TxnTreeTooLarge { .. } => {
                EtcdError::TooManyOps
            }
            Rejection::TxnConflict { .. } => EtcdError::DuplicateKey,
            Rejection::ReplyTooLarge { .. } => EtcdError::ResponseTooLarge(rejection.to_string()),
            Rejection::TooManyKeys { .. } => EtcdError::NoSpace,
            Rejection::LeaseNotFound { .. } => EtcdError::LeaseNotFound,
            Rejection::LeaseExists { .. } => EtcdError::LeaseExists,
            Rejection::TooManyLeases { .. } => EtcdError::TooManyRequests("leases"),
            Rejection::TooManyAlarms { .. } => EtcdError::TooManyRequests("alarms"),
            Rejection::KeyNotFound { .. } => EtcdError::KeyNotFound,
            Rejection::UserExists { .. } => EtcdError::UserExists,
            Rejection::UserNotFound { .. } => EtcdError::UserNotFound,
            Rejection::RoleExists { .. } => EtcdError::RoleExists,
            Rejection::RoleNotFound { .. } => EtcdError::RoleNotFound,
            Rejection::PermissionNotFound => EtcdError::PermissionNotGranted,
            Rejection::NoAdmin | Rejection::BuiltInRole => EtcdError::InvalidAuthMgmt,
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
        // etcd's answer to a call naming no user while authentication is
        // enforced; a token that does not check out is "invalid", which
        // makes etcd's clients log in again.
        WriteError::Unauthenticated(why) if why == AuthError::Missing.to_string() => {
            EtcdError::UserEmpty
        }
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

    /// The compatibility guide lists every text of the table: each quoted
    /// `etcdserver: `, `mvcc: `, `mutex: ` or `election: ` text above the
    /// tests must appear in it, in backquotes.
    #[test]
    fn the_compatibility_guide_lists_every_text() {
        let source = include_str!("errors.rs");
        let table = source.split("#[cfg(test)]").next().unwrap_or(source);
        let guide = include_str!("../../../../../docs/etcd-compatibility.md");
        let guide = guide.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut texts = 0;
        for (at, _) in table.match_indices('"') {
            let rest = &table[at + 1..];
            let Some(end) = rest.find('"') else { continue };
            let text = &rest[..end];
            let etcds = ["etcdserver: ", "mvcc: ", "mutex: ", "election: "];
            if !etcds.iter().any(|prefix| text.starts_with(prefix)) || text.contains('{') {
                continue;
            }
            texts += 1;
            assert!(
                guide.contains(&format!("`{text}`")),
                "docs/etcd-compatibility.md does not list `{text}`"
            );
        }
        assert!(texts > 20, "only {texts} texts found in the table");
    }

    #[test]
    fn maybe_proposed_is_never_unavailable() {
        let status = status_of(WriteError::Unavailable("raft stopped".into()));
        // Neither UNAVAILABLE nor DEADLINE_EXCEEDED: etcd's Go client
        // resends a write on the latter.
        assert_eq!(status.code(), Code::Unknown);
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

    #[test]
    fn membership_refusals_take_etcds_texts_and_codes() {
        for (error, code, text) in [
            (
                EtcdError::MemberNotFound,
                Code::NotFound,
                "etcdserver: member not found",
            ),
            (
                EtcdError::PeerUrlExists,
                Code::FailedPrecondition,
                "etcdserver: Peer URLs already exists",
            ),
            (
                EtcdError::MemberNotLearner,
                Code::FailedPrecondition,
                "etcdserver: can only promote a learner member",
            ),
            (
                EtcdError::NotEnoughStartedMembers,
                Code::Unknown,
                "etcdserver: re-configuration failed due to not enough started members",
            ),
            (
                EtcdError::BadLeaderTransferee,
                Code::FailedPrecondition,
                "etcdserver: bad leader transferee",
            ),
        ] {
            let status: Status = error.into();
            assert_eq!((status.code(), status.message()), (code, text));
        }
        let half: Status = EtcdError::AddedAsLearnerOnly {
            id: 26,
            why: "no quorum".into(),
        }
        .into();
        // Not a code clientv3 resends a call on.
        assert_eq!(half.code(), Code::Unknown);
        assert!(half.message().contains("member 1a (node 26)"), "{half:?}");
    }

    #[test]
    fn auth_refusals_take_etcds_texts_and_codes() {
        let exists = Rejection::UserExists { name: "a".into() };
        let status: Status = EtcdError::of_rejection(&exists).into();
        assert_eq!(
            (status.code(), status.message()),
            (
                Code::FailedPrecondition,
                "etcdserver: user name already exists"
            )
        );
        let status: Status = EtcdError::of_rejection(&Rejection::PermissionNotFound).into();
        assert_eq!(
            status.message(),
            "etcdserver: permission is not granted to the role"
        );
        let missing = status_of(WriteError::Unauthenticated(AuthError::Missing.to_string()));
        assert_eq!(
            (missing.code(), missing.message()),
            (Code::InvalidArgument, "etcdserver: user name is empty")
        );
        let stale = status_of(WriteError::Unauthenticated(AuthError::BadToken.to_string()));
        assert_eq!(
            (stale.code(), stale.message()),
            (Code::Unauthenticated, "etcdserver: invalid auth token")
        );
        let status: Status = EtcdError::AuthFailed.into();
        assert_eq!(
            (status.code(), status.message()),
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password"
            )
        );
    }
}
