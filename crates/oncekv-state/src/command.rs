//! What the replicated log carries: an [`Entry`] (its index and the
//! [`Proposal`] a leader wrote there: cluster time, principal and a
//! [`Request`]), the request's [`Origin`] (plain, on a session, or under an
//! idempotency key) and the [`Command`] itself, with the command each
//! transaction operation runs as ([`TxnOp::as_command`]).

use crate::auth::AuthCommand;
use crate::ids::{
    ClusterTime, IdempotencyKey, LogIndex, Principal, RequestId, Secret, Seq, SessionId,
};
use crate::key_range::{KeyRange, KeyScope};
use crate::txn::{Txn, TxnOp};
use crate::value::SharedBytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One entry of the replicated log, as the state machine applies it: the
/// proposal, at the index the log gave it.
///
/// Postcard writes a struct as its fields one after the other, so an entry
/// encodes as its index followed by its proposal's fields, as when they
/// were all fields of the entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The entry's log index.
    pub index: LogIndex,
    /// What the leader wrote there.
    pub proposal: Proposal,
}

/// What a leader proposes, and the log stores as it is: a request, the
/// cluster time the leader stamped on it and who sent it.
///
/// The log's bytes are this struct's postcard encoding, field after field:
/// reordering, removing or adding a field makes the logs already written
/// unreadable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// The leader's cluster time when it proposed the entry.
    pub time: ClusterTime,
    /// Who sent the request, as the leader authenticated it (`None` while
    /// authentication is off, and for the leader's own ticks).
    pub principal: Option<Principal>,
    /// The request.
    pub request: Request,
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}ms", self.request.command.name(), self.time.0)
    }
}

/// A request: how it is deduplicated, and what it does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Plain, on a session, or under an idempotency key.
    pub origin: Origin,
    /// The operation.
    pub command: Command,
}

impl Request {
    /// Whether it must be applied from the log: anything but a plain
    /// request whose command changes nothing ([`Command::changes_nothing`]),
    /// which the leader answers from its applied state
    /// ([`crate::StateMachine::answer_unlogged`]).
    pub fn needs_log(&self) -> bool {
        !matches!(self.origin, Origin::Plain) || !self.command.changes_nothing()
    }

    /// A plain request (at-least-once, as in etcd).
    pub fn plain(command: Command) -> Request {
        Request {
            origin: Origin::Plain,
            command,
        }
    }
}

/// How a request is deduplicated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Origin {
    /// No deduplication: applied every time it is committed.
    Plain,
    /// On a session: applied once per `(session, seq)`.
    Session(RequestHeader),
    /// A one-shot request: applied once per key while the key is kept.
    Key(IdempotencyKey),
}

/// The header every request on a session carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestHeader {
    /// Session and sequence number: the dedup key.
    pub id: RequestId,
    /// The session's secret.
    pub secret: Secret,
    /// The lowest sequence number the client still awaits; it acknowledges
    /// every response below it.
    pub first_incomplete: Seq,
    /// Which attempt this is (1, 2, ...): for observability only.
    pub attempt: u32,
}

/// A read that needs no log entry when served by read-index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Query {
    /// The value of one key.
    Get {
        /// The key.
        key: Vec<u8>,
    },
    /// Keys starting with `prefix`, in order, at most `limit` of them
    /// (0 means the configured maximum).
    Scan {
        /// The prefix.
        prefix: Vec<u8>,
        /// Most entries to return.
        limit: u32,
    },
    /// All live leases.
    LeaseList,
    /// Whether authentication is enforced, the users and the roles.
    Auth,
    /// A [`Query::Get`], [`Query::Scan`] or [`Query::Range`] of the store
    /// as it was at `revision` (after every change at or below it), while
    /// the history reaches back that far.
    At {
        /// The revision.
        revision: u64,
        /// The read.
        query: Box<Query>,
    },
    /// Keys in a range, in order, at most `limit` of them (0 means the
    /// configured maximum), and how many keys the range holds in all.
    Range {
        /// The keys.
        range: KeyRange,
        /// Most entries to return.
        limit: u32,
    },
}

impl Query {
    /// The read of every key `key` over `scope` addresses: what a compare
    /// or a watch of them needs permission for.
    pub fn covering(key: &[u8], scope: &KeyScope) -> Query {
        match scope {
            KeyScope::Key => Query::Get { key: key.to_vec() },
            KeyScope::Prefix => Query::Scan {
                prefix: key.to_vec(),
                limit: 0,
            },
            KeyScope::Range { .. } => Query::Range {
                range: scope.range_from(key),
                limit: 0,
            },
        }
    }
}

/// An operation of the state machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Register a session; its id is this entry's index.
    OpenSession {
        /// Idle time after which the session expires.
        ttl_ms: u64,
        /// How many requests may be in flight at once (1..=window_max).
        window: u32,
        /// Drawn at random by the leader that proposed the entry.
        secret: Secret,
    },
    /// Keep a session alive.
    KeepAlive {
        /// The session.
        session: SessionId,
        /// Its secret.
        secret: Secret,
    },
    /// End a session and free its completion records.
    CloseSession {
        /// The session.
        session: SessionId,
        /// Its secret.
        secret: Secret,
    },
    /// No operation but the passage of cluster time (proposed by an idle
    /// leader so that expiry advances).
    Tick,
    /// Set a key; optionally attach it to a lease. Returns the previous value.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The new value (shared with the store once applied).
        value: SharedBytes,
        /// The lease to attach the key to, if any.
        lease: Option<String>,
    },
    /// Remove a key. Returns the previous value.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
    /// Append bytes to a key's value (absent counts as empty). Returns the
    /// new length.
    Append {
        /// The key.
        key: Vec<u8>,
        /// The suffix.
        value: Vec<u8>,
    },
    /// Add `by` to the decimal integer stored at `key` (absent counts as 0).
    /// Returns the new value.
    Incr {
        /// The key.
        key: Vec<u8>,
        /// The increment.
        by: i64,
    },
    /// Set `key` to `new` if its value equals `expected` (`None`: absent).
    Cas {
        /// The key.
        key: Vec<u8>,
        /// The expected value, or `None` for "absent".
        expected: Option<Vec<u8>>,
        /// The new value.
        new: Vec<u8>,
    },
    /// Create a named lease.
    LeaseGrant {
        /// The lease's name.
        name: String,
        /// Time after the last keep-alive at which it expires.
        ttl_ms: u64,
    },
    /// Renew a lease.
    LeaseKeepAlive {
        /// The lease's name.
        name: String,
    },
    /// End a lease and delete its keys.
    LeaseRevoke {
        /// The lease's name.
        name: String,
    },
    /// A read, applied through the log.
    Read(Query),
    /// Lower the `NOSPACE` alarm, so writes are accepted again (raised
    /// again by the next write that would pass the store's byte quota).
    AlarmDisarm,
    /// Change users, roles or enforcement (admin only once enforced).
    Auth(AuthCommand),
    /// A multi-key transaction, applied whole at one revision.
    Txn(Txn),
    /// Drop the history at and below `revision` (admin only once enforced).
    Compact {
        /// The revision.
        revision: u64,
    },
    /// Raise or clear, by hand, the `NOSPACE` alarm of `member` (etcd's
    /// Alarm ACTIVATE and DEACTIVATE; admin only once enforced). While
    /// any member's is raised, writes that grow the store are refused, as
    /// while the quota's own alarm is; clearing one also lowers the
    /// quota's. The last variant: postcard numbers every earlier one as
    /// before.
    AlarmSet {
        /// The member the alarm is of (any number: etcd takes 0 too).
        member: u64,
        /// Raise it (else clear it).
        raise: bool,
    },
}

impl Command {
    /// Whether the command changes replicated data when applied (a read or a
    /// tick does not).
    pub fn is_mutating(&self) -> bool {
        !matches!(self, Command::Read(_) | Command::Tick)
    }

    /// The bytes of keys, values and names the command carries: what it
    /// adds to the log beyond a fixed size.
    pub fn payload_bytes(&self) -> u64 {
        let bytes = match self {
            Command::Put { key, value, lease } => {
                key.len() + value.len() + lease.as_ref().map_or(0, String::len)
            }
            Command::Append { key, value } => key.len() + value.len(),
            Command::Cas { key, expected, new } => {
                key.len() + expected.as_ref().map_or(0, Vec::len) + new.len()
            }
            Command::Delete { key }
            | Command::Incr { key, .. }
            | Command::Read(Query::Get { key }) => key.len(),
            Command::Read(Query::Scan { prefix, .. }) => prefix.len(),
            Command::Read(Query::Range { range, .. }) => range.payload_bytes(),
            Command::Read(Query::At { query, .. }) => {
                return Command::Read((**query).clone()).payload_bytes();
            }
            Command::Txn(txn) => return txn.payload_bytes(),
            Command::LeaseGrant { name, .. }
            | Command::LeaseKeepAlive { name }
            | Command::LeaseRevoke { name } => name.len(),
            Command::Auth(auth) => return auth.payload_bytes(),
            Command::OpenSession { .. }
            | Command::KeepAlive { .. }
            | Command::CloseSession { .. }
            | Command::Tick
            | Command::Read(Query::LeaseList | Query::Auth)
            | Command::AlarmDisarm
            | Command::AlarmSet { .. }
            | Command::Compact { .. } => 0,
        };
        bytes as u64
    }

    /// Whether the command may add bytes to the store, and so is refused
    /// while the `NOSPACE` alarm is raised.
    pub fn grows_store(&self) -> bool {
        matches!(
            self,
            Command::Put { .. }
                | Command::Append { .. }
                | Command::Incr { .. }
                | Command::Cas { .. }
                | Command::LeaseGrant { .. }
                | Command::Txn(_)
        )
    }

    /// Whether it changes nothing, whatever the state: a read, or a
    /// transaction that only reads ([`Txn::only_reads`]).
    pub fn changes_nothing(&self) -> bool {
        match self {
            Command::Read(_) => true,
            Command::Txn(txn) => txn.only_reads(),
            _ => false,
        }
    }

    /// Whether the command manages sessions (or time) and so may not itself
    /// be sent on a session.
    pub fn is_session_control(&self) -> bool {
        matches!(
            self,
            Command::OpenSession { .. }
                | Command::KeepAlive { .. }
                | Command::CloseSession { .. }
                | Command::Tick
        )
    }

    /// A short lowercase name, for metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::OpenSession { .. } => "open_session",
            Command::KeepAlive { .. } => "keep_alive",
            Command::CloseSession { .. } => "close_session",
            Command::Tick => "tick",
            Command::Put { .. } => "put",
            Command::Delete { .. } => "delete",
            Command::Append { .. } => "append",
            Command::Incr { .. } => "incr",
            Command::Cas { .. } => "cas",
            Command::LeaseGrant { .. } => "lease_grant",
            Command::LeaseKeepAlive { .. } => "lease_keep_alive",
            Command::LeaseRevoke { .. } => "lease_revoke",
            Command::Read(Query::Get { .. }) => "get",
            Command::Read(Query::Scan { .. }) => "scan",
            Command::Read(Query::LeaseList) => "lease_list",
            Command::Read(Query::Auth) => "auth_status",
            Command::Read(Query::At { .. }) => "read_at_revision",
            Command::Read(Query::Range { .. }) => "range",
            Command::Txn(_) => "txn",
            Command::Compact { .. } => "compact",
            Command::AlarmDisarm => "alarm_disarm",
            Command::AlarmSet { .. } => "alarm_set",
            Command::Auth(auth) => auth.name(),
        }
    }
}

impl TxnOp {
    /// The single command this operation runs as (`None` for
    /// [`TxnOp::DeletePrefix`], [`TxnOp::DeleteRange`],
    /// [`TxnOp::PutExisting`] and [`TxnOp::Txn`], which have none:
    /// [`TxnOp::PutExisting`] is a put whose value or lease comes from the
    /// state).
    pub fn as_command(&self) -> Option<Command> {
        Some(match self.clone() {
            TxnOp::Put { key, value, lease } => Command::Put {
                key,
                value: value.into(),
                lease,
            },
            TxnOp::Delete { key } => Command::Delete { key },
            TxnOp::Get { key } => Command::Read(Query::Get { key }),
            TxnOp::Scan { prefix, limit } => Command::Read(Query::Scan { prefix, limit }),
            TxnOp::Append { key, value } => Command::Append { key, value },
            TxnOp::Incr { key, by } => Command::Incr { key, by },
            TxnOp::Cas { key, expected, new } => Command::Cas { key, expected, new },
            TxnOp::Range { range, limit } => Command::Read(Query::Range { range, limit }),
            TxnOp::RangeAt {
                range,
                limit,
                revision,
            } => Command::Read(Query::At {
                revision,
                query: Box::new(Query::Range { range, limit }),
            }),
            TxnOp::DeletePrefix { .. }
            | TxnOp::DeleteRange { .. }
            | TxnOp::PutExisting { .. }
            | TxnOp::Txn(_) => {
                return None;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// The bytes below were written by the server's own `Proposal`, before
    /// it became this one: a log written then reads back the same, and a
    /// proposal encodes to the same bytes again (a reordered field would
    /// change them).
    #[test]
    fn a_proposal_encodes_as_the_log_wrote_it_before() {
        let on_session = Proposal {
            time: ClusterTime(1_700_000_000_123),
            principal: Some(Principal("alice".into())),
            request: Request {
                origin: Origin::Session(RequestHeader {
                    id: RequestId {
                        session: SessionId(300),
                        seq: Seq(2),
                    },
                    secret: Secret(0x0102),
                    first_incomplete: Seq(1),
                    attempt: 3,
                }),
                command: Command::Put {
                    key: b"k".to_vec(),
                    value: b"v1".to_vec().into(),
                    lease: Some("l".into()),
                },
            },
        };
        let tick = Proposal {
            time: ClusterTime(5),
            principal: None,
            request: Request::plain(Command::Tick),
        };
        for (proposal, written) in [
            (
                &on_session,
                "fbd095ffbc310105616c69636501ac02028202010304016b02763101016c",
            ),
            (&tick, "05000003"),
        ] {
            let bytes = postcard::to_allocvec(proposal).unwrap();
            assert_eq!(hex(&bytes), written);
            assert_eq!(postcard::from_bytes::<Proposal>(&bytes).unwrap(), *proposal);
            // An entry is its index, then its proposal.
            let entry = Entry {
                index: LogIndex(300),
                proposal: proposal.clone(),
            };
            assert_eq!(
                hex(&postcard::to_allocvec(&entry).unwrap()),
                format!("ac02{written}")
            );
        }
    }
}
