//! The key-value calls with plain values: `get`, `put`, `delete`,
//! `append`, `incr`, `cas`, `txn` and `scan`, on a [`Client`] (each
//! mutation exactly once under a fresh idempotency key) and on a
//! [`Session`] (each exactly once under the session's next sequence
//! number; reads are linearizable reads). Each write has one body, for
//! both: generic over what runs a command once (the private `RunsOnce`).
//! Every error says whether the request may have applied
//! ([`ClientError::not_applied`]). Builders for the options are here too.

use crate::auth::Credentials;
use crate::client::{Client, ClientOptions, Completed};
use crate::connector::Connector;
use crate::error::ClientError;
use crate::session::{Session, SessionOptions};
use oncekv_state::{Command, KeyValue, Query, Reply, Txn};
use std::sync::Arc;
use std::time::Duration;

/// What a compare-and-set found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CasOutcome {
    /// Whether the value matched and was replaced.
    pub swapped: bool,
    /// The value after the call (the new one if swapped).
    pub current: Option<Vec<u8>>,
}

/// What a transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Whether every compare held (the success branch ran).
    pub succeeded: bool,
    /// One reply per operation of the branch that ran.
    pub results: Vec<Reply>,
    /// The revision it applied at (the original one for a replay).
    pub revision: u64,
    /// Whether this is the original answer of an earlier attempt.
    pub replayed: bool,
}

fn txn_outcome(done: Completed) -> Result<TxnOutcome, ClientError> {
    match done.reply {
        Reply::Txn { succeeded, results } => Ok(TxnOutcome {
            succeeded,
            results,
            revision: done.applied_index,
            replayed: done.replayed,
        }),
        Reply::Rejected(rejection) => Err(ClientError::Rejected(rejection)),
        other => unexpected(other),
    }
}

/// Keys and values from a scan, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanPage {
    /// The keys, their values and revisions.
    pub entries: oncekv_state::KvPairs,
    /// Whether more keys match beyond this page (the server's limit).
    pub more: bool,
}

/// A write's answer: its plain value (a put's or delete's previous value,
/// an append's new length, a counter's new value, a CAS's outcome) and the
/// revision it applied at: the log index of the entry that ran it, which is
/// the changed key's `mod_revision` (a CAS that did not swap changed
/// nothing there). A retry answered from its record gives the original
/// revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written<T> {
    /// The plain value.
    pub value: T,
    /// The revision it applied at.
    pub revision: u64,
    /// Whether this is the original answer of an earlier attempt.
    pub replayed: bool,
}

fn written<T>(
    done: Completed,
    parse: fn(Reply) -> Result<T, ClientError>,
) -> Result<Written<T>, ClientError> {
    Ok(Written {
        revision: done.applied_index,
        replayed: done.replayed,
        value: parse(done.reply)?,
    })
}

fn unexpected<T>(reply: Reply) -> Result<T, ClientError> {
    Err(ClientError::Invalid(format!("unexpected reply: {reply:?}")))
}

fn previous(reply: Reply) -> Result<Option<Vec<u8>>, ClientError> {
    match reply {
        Reply::Put { previous } | Reply::Delete { previous } => Ok(previous),
        other => unexpected(other),
    }
}

fn length(reply: Reply) -> Result<u64, ClientError> {
    match reply {
        Reply::Append { length } => Ok(length),
        other => unexpected(other),
    }
}

fn counter(reply: Reply) -> Result<i64, ClientError> {
    match reply {
        Reply::Incr { value } => Ok(value),
        other => unexpected(other),
    }
}

fn cas_outcome(reply: Reply) -> Result<CasOutcome, ClientError> {
    match reply {
        Reply::Cas { swapped, current } => Ok(CasOutcome { swapped, current }),
        other => unexpected(other),
    }
}

/// What runs a command exactly once and says how: a [`Client`] under a
/// fresh idempotency key, a [`Session`] under its next sequence number.
/// The writes below have one body each, for both.
trait RunsOnce {
    fn complete(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<Completed, ClientError>> + Send;
}

impl RunsOnce for Client {
    fn complete(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<Completed, ClientError>> + Send {
        self.execute_once(command, None)
    }
}

impl RunsOnce for Session {
    fn complete(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<Completed, ClientError>> + Send {
        self.execute_completed(command)
    }
}

async fn put(
    on: &impl RunsOnce,
    key: Vec<u8>,
    value: Vec<u8>,
) -> Result<Written<Option<Vec<u8>>>, ClientError> {
    let command = Command::Put {
        key,
        value: value.into(),
        lease: None,
    };
    written(on.complete(command).await?, previous)
}

async fn delete(on: &impl RunsOnce, key: Vec<u8>) -> Result<Written<Option<Vec<u8>>>, ClientError> {
    written(on.complete(Command::Delete { key }).await?, previous)
}

async fn append(
    on: &impl RunsOnce,
    key: Vec<u8>,
    value: Vec<u8>,
) -> Result<Written<u64>, ClientError> {
    written(on.complete(Command::Append { key, value }).await?, length)
}

async fn incr(on: &impl RunsOnce, key: Vec<u8>, by: i64) -> Result<Written<i64>, ClientError> {
    written(on.complete(Command::Incr { key, by }).await?, counter)
}

async fn cas(
    on: &impl RunsOnce,
    key: Vec<u8>,
    expected: Option<&[u8]>,
    new: Vec<u8>,
) -> Result<Written<CasOutcome>, ClientError> {
    let command = Command::Cas {
        key,
        expected: expected.map(<[u8]>::to_vec),
        new,
    };
    written(on.complete(command).await?, cas_outcome)
}

async fn txn(on: &impl RunsOnce, txn: Txn) -> Result<TxnOutcome, ClientError> {
    txn_outcome(on.complete(Command::Txn(txn)).await?)
}

impl Client {
    /// Runs `txn` once (under a fresh idempotency key): a retry returns
    /// its original result.
    pub async fn txn(&self, txn: Txn) -> Result<TxnOutcome, ClientError> {
        self::txn(self, txn).await
    }

    /// `key` with its value and revisions (linearizable), `None` if absent;
    /// at `revision` if given (a past state, while the history reaches
    /// back: else [`Rejection::Compacted`](oncekv_state::Rejection)).
    pub async fn get_kv(
        &self,
        key: impl Into<Vec<u8>>,
        revision: Option<u64>,
    ) -> Result<Option<KeyValue>, ClientError> {
        let key = key.into();
        let mut query = Query::Get { key: key.clone() };
        if let Some(revision) = revision {
            query = Query::At {
                revision,
                query: Box::new(query),
            };
        }
        match self.read(query, false).await? {
            Reply::Get {
                value: Some(value),
                meta: Some(meta),
            } => Ok(Some(KeyValue { key, value, meta })),
            Reply::Get { .. } => Ok(None),
            Reply::Rejected(rejection) => Err(ClientError::Rejected(rejection)),
            other => unexpected(other),
        }
    }

    /// The value of `key` (linearizable), `None` if absent.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<Vec<u8>>, ClientError> {
        match self.read(Query::Get { key: key.into() }, false).await? {
            Reply::Get { value, .. } => Ok(value),
            other => unexpected(other),
        }
    }

    /// Sets `key` to `value`, once; returns the previous value and the
    /// revision.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<Written<Option<Vec<u8>>>, ClientError> {
        put(self, key.into(), value.into()).await
    }

    /// Deletes `key`, once; returns the previous value and the revision.
    pub async fn delete(
        &self,
        key: impl Into<Vec<u8>>,
    ) -> Result<Written<Option<Vec<u8>>>, ClientError> {
        delete(self, key.into()).await
    }

    /// Appends `value` to `key`, once; returns the new length and the
    /// revision.
    pub async fn append(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<Written<u64>, ClientError> {
        append(self, key.into(), value.into()).await
    }

    /// Adds `by` to the integer at `key` (absent is 0), once; returns the
    /// new value.
    pub async fn incr(
        &self,
        key: impl Into<Vec<u8>>,
        by: i64,
    ) -> Result<Written<i64>, ClientError> {
        incr(self, key.into(), by).await
    }

    /// Sets `key` to `new` if it holds `expected` (`None`: if it is
    /// absent), once.
    pub async fn cas(
        &self,
        key: impl Into<Vec<u8>>,
        expected: Option<&[u8]>,
        new: impl Into<Vec<u8>>,
    ) -> Result<Written<CasOutcome>, ClientError> {
        cas(self, key.into(), expected, new.into()).await
    }

    /// The keys starting with `prefix` and their values, in order, at most
    /// `limit` (0: the server's maximum).
    pub async fn scan(
        &self,
        prefix: impl Into<Vec<u8>>,
        limit: u32,
    ) -> Result<ScanPage, ClientError> {
        let query = Query::Scan {
            prefix: prefix.into(),
            limit,
        };
        match self.read(query, false).await? {
            Reply::Scan { entries, more } => Ok(ScanPage { entries, more }),
            other => unexpected(other),
        }
    }
}

impl Session {
    /// The value of `key` (a linearizable read; reads need no sequence
    /// number).
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<Vec<u8>>, ClientError> {
        self.client().get(key).await
    }

    /// Sets `key` to `value` on this session; returns the previous value and
    /// the revision.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<Written<Option<Vec<u8>>>, ClientError> {
        put(self, key.into(), value.into()).await
    }

    /// Deletes `key` on this session; returns the previous value and the
    /// revision.
    pub async fn delete(
        &self,
        key: impl Into<Vec<u8>>,
    ) -> Result<Written<Option<Vec<u8>>>, ClientError> {
        delete(self, key.into()).await
    }

    /// Appends `value` to `key` on this session; returns the new length and
    /// the revision.
    pub async fn append(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<Written<u64>, ClientError> {
        append(self, key.into(), value.into()).await
    }

    /// Adds `by` to the integer at `key` on this session; returns the new
    /// value.
    pub async fn incr(
        &self,
        key: impl Into<Vec<u8>>,
        by: i64,
    ) -> Result<Written<i64>, ClientError> {
        incr(self, key.into(), by).await
    }

    /// Compare-and-set on this session (see [`Client::cas`]).
    pub async fn cas(
        &self,
        key: impl Into<Vec<u8>>,
        expected: Option<&[u8]>,
        new: impl Into<Vec<u8>>,
    ) -> Result<Written<CasOutcome>, ClientError> {
        cas(self, key.into(), expected, new.into()).await
    }

    /// Runs `txn` on this session: exactly once, and a retry returns its
    /// original result.
    pub async fn txn(&self, txn: Txn) -> Result<TxnOutcome, ClientError> {
        self::txn(self, txn).await
    }

    /// A scan (see [`Client::scan`]).
    pub async fn scan(
        &self,
        prefix: impl Into<Vec<u8>>,
        limit: u32,
    ) -> Result<ScanPage, ClientError> {
        self.client().scan(prefix, limit).await
    }
}

impl ClientOptions {
    /// With this deadline for a whole call, retries included.
    pub fn with_deadline(mut self, deadline: Duration) -> ClientOptions {
        self.deadline = deadline;
        self
    }

    /// With this longest wait for one attempt.
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> ClientOptions {
        self.attempt_timeout = timeout;
        self
    }

    /// Logging in as `user` with `password` (a cluster that enforces
    /// authentication).
    pub fn with_user(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> ClientOptions {
        self.credentials = Some(Credentials::Password {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// Reaching nodes through `connector` (TLS: [`crate::TlsConnector`]).
    pub fn with_connector(mut self, connector: Arc<dyn Connector>) -> ClientOptions {
        self.connector = connector;
        self
    }
}

impl SessionOptions {
    /// Expiring after `ttl` without requests or keep-alives.
    pub fn with_ttl(mut self, ttl: Duration) -> SessionOptions {
        self.ttl = ttl;
        self
    }

    /// With at most `window` requests in flight (1 is strictly sequential).
    pub fn with_window(mut self, window: u32) -> SessionOptions {
        self.window = window;
        self
    }

    /// Keeping itself alive in the background, or not.
    pub fn with_keep_alive(mut self, keep_alive: bool) -> SessionOptions {
        self.keep_alive = keep_alive;
        self
    }
}
