//! Conversions between wire messages (`v1`) and the state machine's model
//! (`oncekv_state`). Wire input is untrusted: every conversion from the wire
//! returns a typed [`ConvertError`] instead of panicking.

use crate::v1;

mod auth;
mod txn;

pub use txn::{event_to_wire, meta_from_wire, meta_to_wire, scope_from_wire};

use oncekv_state::{
    ClusterTime, Command, IdempotencyKey, LeaseInfo, LogIndex, Malformed, Origin, Outcome,
    Overload, Query, Rejection, Reply, Request, RequestHeader, RequestId, Secret, Seq, SessionId,
};

/// Why a wire message does not map to the model.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A required field is absent.
    #[error("missing field {0}")]
    Missing(&'static str),
    /// A secret is not 16 bytes.
    #[error("a session secret must be 16 bytes, got {0}")]
    SecretLength(usize),
    /// A value does not fit.
    #[error("field {field} is out of range")]
    OutOfRange {
        /// The field.
        field: &'static str,
    },
    /// The command cannot travel on the wire (internal commands).
    #[error("command {0} is internal and cannot be sent")]
    Internal(&'static str),
}

type Result<T> = std::result::Result<T, ConvertError>;

/// A secret as 16 big-endian bytes.
pub fn secret_to_wire(secret: Secret) -> Vec<u8> {
    secret.0.to_be_bytes().to_vec()
}

/// A secret from its wire bytes.
pub fn secret_from_wire(bytes: &[u8]) -> Result<Secret> {
    let array: [u8; 16] = bytes
        .try_into()
        .map_err(|_| ConvertError::SecretLength(bytes.len()))?;
    Ok(Secret(u128::from_be_bytes(array)))
}

fn usize_to_u64(value: usize) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

fn u64_to_usize(value: u64, field: &'static str) -> Result<usize> {
    usize::try_from(value).map_err(|_| ConvertError::OutOfRange { field })
}

/// A request from the wire. A session being opened gets the placeholder
/// secret 0: the leader draws the real one when it proposes the entry.
pub fn request_from_wire(request: v1::ExecuteRequest) -> Result<Request> {
    let origin = match request.origin {
        None => Origin::Plain,
        Some(v1::execute_request::Origin::Session(header)) => Origin::Session(RequestHeader {
            id: RequestId {
                session: SessionId(header.session_id),
                seq: Seq(header.seq),
            },
            secret: secret_from_wire(&header.secret)?,
            first_incomplete: Seq(header.first_incomplete),
            attempt: header.attempt,
        }),
        Some(v1::execute_request::Origin::IdempotencyKey(key)) => Origin::Key(IdempotencyKey(key)),
    };
    let command = command_from_wire(request.command.ok_or(ConvertError::Missing("command"))?)?;
    Ok(Request { origin, command })
}

fn command_from_wire(command: v1::Command) -> Result<Command> {
    use v1::command::Kind;
    Ok(
        match command.kind.ok_or(ConvertError::Missing("command.kind"))? {
            Kind::OpenSession(open) => Command::OpenSession {
                ttl_ms: open.ttl_ms,
                window: open.window,
                secret: Secret(0),
            },
            Kind::KeepAlive(session) => Command::KeepAlive {
                session: SessionId(session.session_id),
                secret: secret_from_wire(&session.secret)?,
            },
            Kind::CloseSession(session) => Command::CloseSession {
                session: SessionId(session.session_id),
                secret: secret_from_wire(&session.secret)?,
            },
            Kind::Put(put) => Command::Put {
                key: put.key,
                value: put.value.into(),
                lease: put.lease,
            },
            Kind::Delete(delete) => Command::Delete { key: delete.key },
            Kind::Append(append) => Command::Append {
                key: append.key,
                value: append.value,
            },
            Kind::Incr(incr) => Command::Incr {
                key: incr.key,
                by: incr.by,
            },
            Kind::Cas(cas) => Command::Cas {
                key: cas.key,
                expected: cas.expected,
                new: cas.new_value,
            },
            Kind::LeaseGrant(grant) => Command::LeaseGrant {
                name: grant.name,
                ttl_ms: grant.ttl_ms,
            },
            Kind::LeaseKeepAlive(lease) => Command::LeaseKeepAlive { name: lease.name },
            Kind::LeaseRevoke(lease) => Command::LeaseRevoke { name: lease.name },
            Kind::Read(query) => Command::Read(query_from_wire(query)?),
            Kind::AlarmDisarm(_) => Command::AlarmDisarm,
            Kind::AlarmSet(set) => Command::AlarmSet {
                member: set.member,
                raise: set.raise,
            },
            Kind::Auth(change) => Command::Auth(auth::change_from_wire(change)?),
            Kind::Txn(wire) => Command::Txn(txn::txn_from_wire(wire)?),
            Kind::Compact(compact) => Command::Compact {
                revision: compact.revision,
            },
        },
    )
}

/// A request for the wire. A session open loses its secret (the leader
/// draws one); `Tick` is internal and refused.
pub fn request_to_wire(request: &Request) -> Result<v1::ExecuteRequest> {
    let origin = match &request.origin {
        Origin::Plain => None,
        Origin::Session(header) => Some(v1::execute_request::Origin::Session(v1::RequestHeader {
            session_id: header.id.session.0,
            secret: secret_to_wire(header.secret),
            seq: header.id.seq.0,
            first_incomplete: header.first_incomplete.0,
            attempt: header.attempt,
        })),
        Origin::Key(key) => Some(v1::execute_request::Origin::IdempotencyKey(key.0.clone())),
    };
    Ok(v1::ExecuteRequest {
        origin,
        command: Some(command_to_wire(&request.command)?),
    })
}

fn command_to_wire(command: &Command) -> Result<v1::Command> {
    use v1::command::Kind;
    let kind = match command {
        Command::OpenSession { ttl_ms, window, .. } => Kind::OpenSession(v1::OpenSession {
            ttl_ms: *ttl_ms,
            window: *window,
        }),
        Command::KeepAlive { session, secret } => Kind::KeepAlive(v1::SessionRef {
            session_id: session.0,
            secret: secret_to_wire(*secret),
        }),
        Command::CloseSession { session, secret } => Kind::CloseSession(v1::SessionRef {
            session_id: session.0,
            secret: secret_to_wire(*secret),
        }),
        Command::Tick => return Err(ConvertError::Internal("tick")),
        Command::Put { key, value, lease } => Kind::Put(v1::Put {
            key: key.clone(),
            value: value.to_vec(),
            lease: lease.clone(),
        }),
        Command::Delete { key } => Kind::Delete(v1::Delete { key: key.clone() }),
        Command::Append { key, value } => Kind::Append(v1::Append {
            key: key.clone(),
            value: value.clone(),
        }),
        Command::Incr { key, by } => Kind::Incr(v1::Incr {
            key: key.clone(),
            by: *by,
        }),
        Command::Cas { key, expected, new } => Kind::Cas(v1::Cas {
            key: key.clone(),
            expected: expected.clone(),
            new_value: new.clone(),
        }),
        Command::LeaseGrant { name, ttl_ms } => Kind::LeaseGrant(v1::LeaseGrant {
            name: name.clone(),
            ttl_ms: *ttl_ms,
        }),
        Command::LeaseKeepAlive { name } => {
            Kind::LeaseKeepAlive(v1::LeaseRef { name: name.clone() })
        }
        Command::LeaseRevoke { name } => Kind::LeaseRevoke(v1::LeaseRef { name: name.clone() }),
        Command::Read(query) => Kind::Read(query_to_wire(query)),
        Command::AlarmDisarm => Kind::AlarmDisarm(v1::Empty {}),
        Command::AlarmSet { member, raise } => Kind::AlarmSet(v1::AlarmSet {
            member: *member,
            raise: *raise,
        }),
        Command::Auth(change) => Kind::Auth(auth::change_to_wire(change)),
        Command::Txn(wire) => Kind::Txn(txn::txn_to_wire(wire)?),
        Command::Compact { revision } => Kind::Compact(v1::Compact {
            revision: *revision,
        }),
    };
    Ok(v1::Command { kind: Some(kind) })
}

/// A query from the wire.
pub fn query_from_wire(query: v1::Query) -> Result<Query> {
    use v1::query::Kind;
    Ok(
        match query.kind.ok_or(ConvertError::Missing("query.kind"))? {
            Kind::Get(get) => at_revision(get.revision, Query::Get { key: get.key }),
            Kind::Scan(scan) => at_revision(
                scan.revision,
                Query::Scan {
                    prefix: scan.prefix,
                    limit: scan.limit,
                },
            ),
            Kind::LeaseList(_) => Query::LeaseList,
            Kind::Auth(_) => Query::Auth,
            Kind::Range(range) => at_revision(
                range.revision,
                Query::Range {
                    range: txn::key_range_from_wire(range.keys)?,
                    limit: range.limit,
                },
            ),
        },
    )
}

/// `query` at `revision` (0: now).
fn at_revision(revision: u64, query: Query) -> Query {
    if revision == 0 {
        return query;
    }
    Query::At {
        revision,
        query: Box::new(query),
    }
}

/// A query for the wire.
pub fn query_to_wire(query: &Query) -> v1::Query {
    use v1::query::Kind;
    let kind = match query {
        Query::Get { key } => Kind::Get(v1::Get {
            key: key.clone(),
            revision: 0,
        }),
        Query::Scan { prefix, limit } => Kind::Scan(v1::Scan {
            prefix: prefix.clone(),
            limit: *limit,
            revision: 0,
        }),
        Query::Range { range, limit } => Kind::Range(v1::Range {
            keys: Some(txn::key_range_to_wire(range)),
            limit: *limit,
            revision: 0,
        }),
        Query::LeaseList => Kind::LeaseList(v1::Empty {}),
        Query::Auth => Kind::Auth(v1::Empty {}),
        Query::At { revision, query } => {
            let mut wire = query_to_wire(query);
            match &mut wire.kind {
                Some(Kind::Get(get)) => get.revision = *revision,
                Some(Kind::Scan(scan)) => scan.revision = *revision,
                Some(Kind::Range(range)) => range.revision = *revision,
                // Refused by the state machine as not versioned; sent as is.
                _ => {}
            }
            return wire;
        }
    };
    v1::Query { kind: Some(kind) }
}

/// An outcome for the wire.
pub fn outcome_to_wire(outcome: &Outcome) -> v1::Outcome {
    use v1::outcome::Kind;
    let kind = match outcome {
        Outcome::Applied(reply) => Kind::Applied(reply_to_wire(reply)),
        Outcome::Replayed {
            reply,
            applied_index,
        } => Kind::Replayed(v1::Replayed {
            reply: Some(reply_to_wire(reply)),
            applied_index: applied_index.0,
        }),
        Outcome::SessionExpired => Kind::SessionExpired(v1::Empty {}),
        Outcome::Unauthorized => Kind::Unauthorized(v1::Empty {}),
        Outcome::Stale { floor } => Kind::Stale(v1::Stale { floor: floor.0 }),
        Outcome::RequestMismatch => Kind::RequestMismatch(v1::Empty {}),
        Outcome::SequenceGap { expected } => Kind::SequenceGap(v1::SequenceGap {
            expected: expected.0,
        }),
        Outcome::Malformed(malformed) => Kind::Malformed(malformed_to_wire(malformed)),
        Outcome::Overloaded(overload) => Kind::Overloaded(overload_to_wire(overload)),
        Outcome::PermissionDenied { reason } => Kind::PermissionDenied(v1::PermissionDenied {
            reason: reason.clone(),
        }),
    };
    v1::Outcome { kind: Some(kind) }
}

fn malformed_to_wire(malformed: &Malformed) -> v1::Malformed {
    let mut wire = v1::Malformed {
        reason: malformed.to_string(),
        ..v1::Malformed::default()
    };
    match malformed {
        Malformed::SeqZero => wire.kind = v1::MalformedKind::SeqZero.into(),
        Malformed::FirstIncompleteAhead {
            seq,
            first_incomplete,
        } => {
            wire.kind = v1::MalformedKind::FirstIncompleteAhead.into();
            wire.seq = *seq;
            wire.first_incomplete = *first_incomplete;
        }
        Malformed::IdempotencyKeyLength { bytes } => {
            wire.kind = v1::MalformedKind::IdempotencyKeyLength.into();
            wire.bytes = usize_to_u64(*bytes);
        }
        Malformed::ControlNotAllowed { command } => {
            wire.kind = v1::MalformedKind::ControlNotAllowed.into();
            wire.command = command.clone();
        }
    }
    wire
}

fn overload_to_wire(overload: &Overload) -> v1::Overloaded {
    use v1::OverloadKind as K;
    let kind = match overload {
        Overload::Sessions { .. } => K::Sessions,
        Overload::IdempotencyKeys { .. } => K::IdempotencyKeys,
        Overload::IdempotencyBytes { .. } => K::IdempotencyBytes,
        Overload::SessionRecordBytes { .. } => K::SessionRecordBytes,
        Overload::RecordBytes { .. } => K::RecordBytes,
        Overload::NoSpace { .. } => K::NoSpace,
        Overload::UserSessions { .. } => K::UserSessions,
        Overload::UserRecordBytes { .. } => K::UserRecordBytes,
        Overload::UserIdempotencyKeys { .. } => K::UserIdempotencyKeys,
        Overload::UserIdempotencyBytes { .. } => K::UserIdempotencyBytes,
    };
    v1::Overloaded {
        kind: kind.into(),
        max: overload.max(),
        reason: overload.to_string(),
    }
}

fn overload_from_wire(wire: &v1::Overloaded) -> Result<Overload> {
    use v1::OverloadKind as K;
    let max = wire.max;
    Ok(match K::try_from(wire.kind).unwrap_or(K::Unspecified) {
        K::Sessions => Overload::Sessions { max },
        K::IdempotencyKeys => Overload::IdempotencyKeys { max },
        K::IdempotencyBytes => Overload::IdempotencyBytes { max },
        K::SessionRecordBytes => Overload::SessionRecordBytes { max },
        K::RecordBytes => Overload::RecordBytes { max },
        K::NoSpace => Overload::NoSpace { max },
        K::UserSessions => Overload::UserSessions { max },
        K::UserRecordBytes => Overload::UserRecordBytes { max },
        K::UserIdempotencyKeys => Overload::UserIdempotencyKeys { max },
        K::UserIdempotencyBytes => Overload::UserIdempotencyBytes { max },
        K::Unspecified => return Err(ConvertError::Missing("overloaded.kind")),
    })
}

fn malformed_from_wire(wire: v1::Malformed) -> Result<Malformed> {
    Ok(
        match v1::MalformedKind::try_from(wire.kind).unwrap_or(v1::MalformedKind::Unspecified) {
            v1::MalformedKind::SeqZero => Malformed::SeqZero,
            v1::MalformedKind::FirstIncompleteAhead => Malformed::FirstIncompleteAhead {
                seq: wire.seq,
                first_incomplete: wire.first_incomplete,
            },
            v1::MalformedKind::IdempotencyKeyLength => Malformed::IdempotencyKeyLength {
                bytes: u64_to_usize(wire.bytes, "malformed.bytes")?,
            },
            v1::MalformedKind::ControlNotAllowed => Malformed::ControlNotAllowed {
                command: wire.command,
            },
            v1::MalformedKind::Unspecified => return Err(ConvertError::Missing("malformed.kind")),
        },
    )
}

/// An outcome from the wire.
pub fn outcome_from_wire(outcome: v1::Outcome) -> Result<Outcome> {
    use v1::outcome::Kind;
    Ok(
        match outcome.kind.ok_or(ConvertError::Missing("outcome.kind"))? {
            Kind::Applied(reply) => Outcome::Applied(reply_from_wire(reply)?),
            Kind::Replayed(replayed) => Outcome::Replayed {
                reply: reply_from_wire(
                    replayed
                        .reply
                        .ok_or(ConvertError::Missing("replayed.reply"))?,
                )?,
                applied_index: LogIndex(replayed.applied_index),
            },
            Kind::SessionExpired(_) => Outcome::SessionExpired,
            Kind::Unauthorized(_) => Outcome::Unauthorized,
            Kind::Stale(stale) => Outcome::Stale {
                floor: Seq(stale.floor),
            },
            Kind::RequestMismatch(_) => Outcome::RequestMismatch,
            Kind::SequenceGap(gap) => Outcome::SequenceGap {
                expected: Seq(gap.expected),
            },
            Kind::Malformed(malformed) => Outcome::Malformed(malformed_from_wire(malformed)?),
            Kind::Overloaded(overloaded) => Outcome::Overloaded(overload_from_wire(&overloaded)?),
            Kind::PermissionDenied(denied) => Outcome::PermissionDenied {
                reason: denied.reason,
            },
        },
    )
}

fn lease_info_to_wire(lease: &LeaseInfo) -> v1::LeaseInfo {
    v1::LeaseInfo {
        name: lease.name.clone(),
        ttl_ms: lease.ttl_ms,
        expires_at_ms: lease.expires_at.0,
        keys: lease.keys,
    }
}

/// Why a call was not carried out: the wire's [`v1::Failure`], the one
/// error shape of every response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallFailure {
    /// Not the leader: nothing was proposed there.
    NotLeader {
        /// The leader's id, if known.
        leader_id: Option<u64>,
        /// Where clients reach the leader, if known.
        leader_client_address: Option<String>,
    },
    /// Transient: the request may or may not apply.
    Unavailable(String),
    /// No leader is known (the cluster has lost its quorum, or is electing
    /// one): nothing was proposed; retry later or elsewhere.
    NoLeader(String),
    /// Refused before proposing: never applied.
    Invalid(String),
    /// Authentication is enforced and the call named no valid user: never
    /// applied.
    Unauthenticated(String),
    /// The call's user may not do this: never applied.
    PermissionDenied(String),
    /// Shed before proposing because the node was full (what, and why in
    /// words): never applied; retry later.
    Shed {
        /// What was full.
        what: String,
        /// Why, in words.
        reason: String,
    },
}

/// A call failure to the wire.
pub fn failure_to_wire(failure: CallFailure) -> v1::Failure {
    use v1::failure::Kind;
    let kind = match failure {
        CallFailure::NotLeader {
            leader_id,
            leader_client_address,
        } => Kind::NotLeader(v1::NotLeader {
            leader_id,
            leader_client_address: leader_client_address.unwrap_or_default(),
        }),
        CallFailure::Unavailable(reason) => Kind::Unavailable(v1::Unavailable {
            reason,
            not_proposed: false,
        }),
        CallFailure::NoLeader(reason) => Kind::Unavailable(v1::Unavailable {
            reason,
            not_proposed: true,
        }),
        CallFailure::Invalid(reason) => Kind::Invalid(v1::Invalid { reason }),
        CallFailure::Unauthenticated(reason) => {
            Kind::Unauthenticated(v1::Unauthenticated { reason })
        }
        CallFailure::PermissionDenied(reason) => {
            Kind::PermissionDenied(v1::PermissionDenied { reason })
        }
        CallFailure::Shed { what, reason } => Kind::Shed(v1::Shed { what, reason }),
    };
    v1::Failure { kind: Some(kind) }
}

/// A call failure from the wire.
pub fn failure_from_wire(failure: v1::Failure) -> Result<CallFailure> {
    use v1::failure::Kind;
    Ok(
        match failure.kind.ok_or(ConvertError::Missing("failure.kind"))? {
            Kind::NotLeader(hint) => CallFailure::NotLeader {
                leader_id: hint.leader_id,
                leader_client_address: Some(hint.leader_client_address)
                    .filter(|address| !address.is_empty()),
            },
            Kind::Unavailable(why) if why.not_proposed => CallFailure::NoLeader(why.reason),
            Kind::Unavailable(why) => CallFailure::Unavailable(why.reason),
            Kind::Invalid(why) => CallFailure::Invalid(why.reason),
            Kind::Unauthenticated(why) => CallFailure::Unauthenticated(why.reason),
            Kind::PermissionDenied(why) => CallFailure::PermissionDenied(why.reason),
            Kind::Shed(why) => CallFailure::Shed {
                what: why.what,
                reason: why.reason,
            },
        },
    )
}

/// A reply for the wire.
pub fn reply_to_wire(reply: &Reply) -> v1::Reply {
    use v1::reply::Kind;
    let value = |value: &Option<Vec<u8>>| v1::OptionalValue {
        value: value.clone(),
        meta: None,
    };
    let kind = match reply {
        Reply::SessionOpened {
            session,
            secret,
            ttl_ms,
            window,
        } => Kind::SessionOpened(v1::SessionOpened {
            session_id: session.0,
            secret: secret_to_wire(*secret),
            ttl_ms: *ttl_ms,
            window: *window,
        }),
        Reply::SessionKeptAlive { ttl_ms } => {
            Kind::SessionKeptAlive(v1::SessionKeptAlive { ttl_ms: *ttl_ms })
        }
        Reply::SessionClosed => Kind::SessionClosed(v1::Empty {}),
        Reply::Ticked => Kind::Ticked(v1::Empty {}),
        Reply::Put { previous } => Kind::Put(value(previous)),
        Reply::Get {
            value: current,
            meta,
        } => Kind::Get(v1::OptionalValue {
            value: current.clone(),
            meta: meta.as_ref().map(meta_to_wire),
        }),
        Reply::Delete { previous } => Kind::Delete(value(previous)),
        Reply::Append { length } => Kind::Append(v1::AppendReply { length: *length }),
        Reply::Incr { value } => Kind::Incr(v1::IncrReply { value: *value }),
        Reply::Cas { swapped, current } => Kind::Cas(v1::CasReply {
            swapped: *swapped,
            current: current.clone(),
        }),
        Reply::Scan { entries, more } => Kind::Scan(v1::ScanReply {
            entries: entries.iter().map(txn::key_value_to_wire).collect(),
            more: *more,
        }),
        Reply::Range {
            entries,
            more,
            count,
        } => Kind::Range(v1::RangeReply {
            entries: entries.iter().map(txn::key_value_to_wire).collect(),
            more: *more,
            count: *count,
        }),
        Reply::LeaseGranted {
            name,
            ttl_ms,
            expires_at,
        } => Kind::LeaseGranted(v1::LeaseGranted {
            name: name.clone(),
            ttl_ms: *ttl_ms,
            expires_at_ms: expires_at.0,
        }),
        Reply::LeaseKeptAlive { name, expires_at } => Kind::LeaseKeptAlive(v1::LeaseKeptAlive {
            name: name.clone(),
            expires_at_ms: expires_at.0,
        }),
        Reply::LeaseRevoked { name, keys_deleted } => Kind::LeaseRevoked(v1::LeaseRevoked {
            name: name.clone(),
            keys_deleted: *keys_deleted,
        }),
        Reply::Leases { leases } => Kind::Leases(v1::LeasesReply {
            leases: leases.iter().map(lease_info_to_wire).collect(),
        }),
        Reply::Rejected(rejection) => Kind::Rejected(rejection_to_wire(rejection)),
        Reply::AlarmDisarmed { was_raised } => Kind::AlarmDisarmed(v1::AlarmDisarmed {
            was_raised: *was_raised,
        }),
        Reply::AlarmSet { changed } => Kind::AlarmSet(v1::AlarmSetReply { changed: *changed }),
        Reply::AuthChanged => Kind::AuthChanged(v1::Empty {}),
        Reply::UserPurged { sessions, keys } => Kind::UserPurged(v1::UserPurged {
            sessions: *sessions,
            keys: *keys,
        }),
        Reply::Auth(view) => Kind::Auth(auth::view_to_wire(view)),
        Reply::Txn { succeeded, results } => Kind::Txn(v1::TxnReply {
            succeeded: *succeeded,
            results: results.iter().map(reply_to_wire).collect(),
        }),
        Reply::DeletePrefix { deleted } => {
            Kind::DeletePrefix(v1::DeletePrefixReply { deleted: *deleted })
        }
        Reply::Compacted { revision } => Kind::Compacted(v1::CompactReply {
            revision: *revision,
        }),
    };
    v1::Reply { kind: Some(kind) }
}

/// A reply from the wire.
pub fn reply_from_wire(reply: v1::Reply) -> Result<Reply> {
    use v1::reply::Kind;
    Ok(
        match reply.kind.ok_or(ConvertError::Missing("reply.kind"))? {
            Kind::SessionOpened(opened) => Reply::SessionOpened {
                session: SessionId(opened.session_id),
                secret: secret_from_wire(&opened.secret)?,
                ttl_ms: opened.ttl_ms,
                window: opened.window,
            },
            Kind::SessionKeptAlive(kept) => Reply::SessionKeptAlive {
                ttl_ms: kept.ttl_ms,
            },
            Kind::SessionClosed(_) => Reply::SessionClosed,
            Kind::Ticked(_) => Reply::Ticked,
            Kind::Put(previous) => Reply::Put {
                previous: previous.value,
            },
            Kind::Get(current) => Reply::Get {
                meta: current.meta.map(meta_from_wire),
                value: current.value,
            },
            Kind::Delete(previous) => Reply::Delete {
                previous: previous.value,
            },
            Kind::Append(append) => Reply::Append {
                length: append.length,
            },
            Kind::Incr(incr) => Reply::Incr { value: incr.value },
            Kind::Cas(cas) => Reply::Cas {
                swapped: cas.swapped,
                current: cas.current,
            },
            Kind::Scan(scan) => Reply::Scan {
                entries: scan
                    .entries
                    .into_iter()
                    .map(txn::key_value_from_wire)
                    .collect(),
                more: scan.more,
            },
            Kind::LeaseGranted(granted) => Reply::LeaseGranted {
                name: granted.name,
                ttl_ms: granted.ttl_ms,
                expires_at: ClusterTime(granted.expires_at_ms),
            },
            Kind::LeaseKeptAlive(kept) => Reply::LeaseKeptAlive {
                name: kept.name,
                expires_at: ClusterTime(kept.expires_at_ms),
            },
            Kind::LeaseRevoked(revoked) => Reply::LeaseRevoked {
                name: revoked.name,
                keys_deleted: revoked.keys_deleted,
            },
            Kind::Leases(leases) => Reply::Leases {
                leases: leases
                    .leases
                    .into_iter()
                    .map(|lease| LeaseInfo {
                        name: lease.name,
                        ttl_ms: lease.ttl_ms,
                        expires_at: ClusterTime(lease.expires_at_ms),
                        keys: lease.keys,
                    })
                    .collect(),
            },
            Kind::Rejected(rejection) => Reply::Rejected(rejection_from_wire(rejection)?),
            Kind::AlarmDisarmed(disarmed) => Reply::AlarmDisarmed {
                was_raised: disarmed.was_raised,
            },
            Kind::AlarmSet(set) => Reply::AlarmSet {
                changed: set.changed,
            },
            Kind::AuthChanged(_) => Reply::AuthChanged,
            Kind::UserPurged(purged) => Reply::UserPurged {
                sessions: purged.sessions,
                keys: purged.keys,
            },
            Kind::Auth(view) => Reply::Auth(auth::view_from_wire(view)?),
            Kind::Txn(wire) => Reply::Txn {
                succeeded: wire.succeeded,
                results: wire
                    .results
                    .into_iter()
                    .map(reply_from_wire)
                    .collect::<Result<_>>()?,
            },
            Kind::DeletePrefix(deleted) => Reply::DeletePrefix {
                deleted: deleted.deleted,
            },
            Kind::Range(range) => Reply::Range {
                entries: range
                    .entries
                    .into_iter()
                    .map(txn::key_value_from_wire)
                    .collect(),
                more: range.more,
                count: range.count,
            },
            Kind::Compacted(compacted) => Reply::Compacted {
                revision: compacted.revision,
            },
        },
    )
}

fn length(bytes: usize, max: usize) -> v1::Length {
    v1::Length {
        bytes: usize_to_u64(bytes),
        max: usize_to_u64(max),
    }
}

fn rejection_to_wire(rejection: &Rejection) -> v1::Rejection {
    use v1::rejection::Kind;
    let kind = match rejection {
        Rejection::NotAnInteger => Kind::NotAnInteger(v1::Empty {}),
        Rejection::Overflow => Kind::Overflow(v1::Empty {}),
        Rejection::LeaseExists { name } => Kind::LeaseExists(v1::LeaseRef { name: name.clone() }),
        Rejection::LeaseNotFound { name } => {
            Kind::LeaseNotFound(v1::LeaseRef { name: name.clone() })
        }
        Rejection::KeyLength { bytes, max } => Kind::KeyLength(length(*bytes, *max)),
        Rejection::ValueTooLarge { bytes, max } => Kind::ValueTooLarge(length(*bytes, *max)),
        Rejection::LeaseNameLength { bytes, max } => Kind::LeaseNameLength(length(*bytes, *max)),
        Rejection::TtlOutOfRange {
            ttl_ms,
            min_ms,
            max_ms,
        } => Kind::TtlOutOfRange(v1::TtlOutOfRange {
            ttl_ms: *ttl_ms,
            min_ms: *min_ms,
            max_ms: *max_ms,
        }),
        Rejection::WindowOutOfRange { window, max } => {
            Kind::WindowOutOfRange(v1::WindowOutOfRange {
                window: *window,
                max: *max,
            })
        }
        Rejection::TooManyKeys { max } => Kind::TooManyKeys(v1::Max { max: *max }),
        Rejection::TooManyLeases { max } => Kind::TooManyLeases(v1::Max { max: *max }),
        Rejection::TooManyAlarms { max } => Kind::TooManyAlarms(v1::Max { max: *max }),
        other => match auth::rejection_to_wire(other).or_else(|| txn::rejection_to_wire(other)) {
            Some(kind) => kind,
            None => Kind::InvalidAuth(v1::Invalid {
                reason: other.to_string(),
            }),
        },
    };
    v1::Rejection {
        kind: Some(kind),
        message: rejection.to_string(),
    }
}

fn rejection_from_wire(rejection: v1::Rejection) -> Result<Rejection> {
    use v1::rejection::Kind;
    let lengths = |length: v1::Length, field| -> Result<(usize, usize)> {
        Ok((
            u64_to_usize(length.bytes, field)?,
            u64_to_usize(length.max, field)?,
        ))
    };
    Ok(
        match rejection
            .kind
            .ok_or(ConvertError::Missing("rejection.kind"))?
        {
            Kind::NotAnInteger(_) => Rejection::NotAnInteger,
            Kind::Overflow(_) => Rejection::Overflow,
            Kind::LeaseExists(lease) => Rejection::LeaseExists { name: lease.name },
            Kind::LeaseNotFound(lease) => Rejection::LeaseNotFound { name: lease.name },
            Kind::KeyLength(length) => {
                let (bytes, max) = lengths(length, "key_length")?;
                Rejection::KeyLength { bytes, max }
            }
            Kind::ValueTooLarge(length) => {
                let (bytes, max) = lengths(length, "value_too_large")?;
                Rejection::ValueTooLarge { bytes, max }
            }
            Kind::LeaseNameLength(length) => {
                let (bytes, max) = lengths(length, "lease_name_length")?;
                Rejection::LeaseNameLength { bytes, max }
            }
            Kind::TtlOutOfRange(ttl) => Rejection::TtlOutOfRange {
                ttl_ms: ttl.ttl_ms,
                min_ms: ttl.min_ms,
                max_ms: ttl.max_ms,
            },
            Kind::WindowOutOfRange(window) => Rejection::WindowOutOfRange {
                window: window.window,
                max: window.max,
            },
            Kind::TooManyKeys(max) => Rejection::TooManyKeys { max: max.max },
            Kind::TooManyLeases(max) => Rejection::TooManyLeases { max: max.max },
            Kind::TooManyAlarms(max) => Rejection::TooManyAlarms { max: max.max },
            other => match txn::rejection_from_wire(other.clone()) {
                Some(rejection) => rejection,
                None => auth::rejection_from_wire(other)
                    .ok_or(ConvertError::Missing("rejection.kind"))?,
            },
        },
    )
}
