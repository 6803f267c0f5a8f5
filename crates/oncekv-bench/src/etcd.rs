//! The etcd target (cargo feature `etcd`): the same workloads against an
//! etcd v3 cluster, through the `etcd-client` crate.
//!
//! - `plain`: Put, Get and Txn as etcd offers them (at-least-once).
//! - `session`: the closest a user gets to exactly-once on etcd. Each task
//!   is one emulated client with a sequence key (`__seq/<run>-<task>`);
//!   every write is ONE transaction that compares the sequence key with the
//!   previous number and, if it matches, does the write and stores the new
//!   number. A retry of a write that had applied fails the compare, reads
//!   the sequence key back and is recognised as a duplicate (its original
//!   reply is lost: etcd keeps none). etcd cannot order several writes in
//!   flight from one client this way, so there is no pipelining: one
//!   sequence key per task.
//! - GET is a Range of the key: linearizable (etcd's default, a read-index
//!   round on its leader) for `get` and the reads of `mixed`, serializable
//!   for `get-serializable`. Reads are of keys the run wrote first
//!   (`Shape::seed_ops`), on both targets.
//! - APPEND and INCR have no etcd counterpart: they are read-modify-write,
//!   a Get then a Txn that writes only if the key's `mod_revision` did not
//!   change, retried on conflict.
//! - CAS is a Get, then a Txn comparing the value read (or, for an absent
//!   key, version 0).
//! - TRANSFER (two INCRs in one transaction on oncekv) is what an etcd user
//!   writes without a server-side INCR: one Txn of two Gets (a consistent
//!   read of both accounts), then a Txn guarded by both keys' mod revisions
//!   that puts both new balances, retried on conflict.
//! - The watch workload's watchers are etcd-client watch streams on the
//!   prefix (each its own gRPC stream, over the connections).

use super::closed_loop::{Completion, OpError, TaskClient};
use super::watch::WatchClient;
use super::workload::Op;
use super::{EtcdRoute, Mode};
use anyhow::{Context, bail};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, Error, EventType, GetOptions, KeyValue, KvClient,
    Txn, TxnOp, TxnOpResponse, WatchOptions, WatchStream,
};
use oncekv_client::cli::TlsArgs;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

/// The TLS settings of the `oncekv` client flags for etcd's client (an
/// etcd serving TLS): `None` without `--cacert`.
pub fn tls_options(tls: &TlsArgs) -> anyhow::Result<Option<etcd_client::TlsOptions>> {
    let Some(ca) = &tls.cacert else {
        return Ok(None);
    };
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))
    };
    let mut options = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        options = options.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(Some(options))
}

/// Sends of one sequence-guarded write before giving up (a retry is safe:
/// the sequence compare recognises a write that had applied).
const SESSION_ATTEMPTS: u32 = 3;

/// Read-modify-write rounds of one APPEND or INCR before giving up.
const RMW_ROUNDS_MAX: u32 = 1000;

/// The client of one task.
pub struct EtcdTask {
    kv: KvClient,
    /// In session mode: this emulated client's sequence key.
    sequence: Option<Sequence>,
}

impl std::fmt::Debug for EtcdTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTask")
            .field("sequence", &self.sequence)
            .finish_non_exhaustive()
    }
}

/// A per-client sequence key and the last number written to it.
#[derive(Debug)]
struct Sequence {
    key: Vec<u8>,
    last: u64,
}

/// Connects `connections` clients to `endpoints` (or, routed to the
/// leader, to the leader's endpoint alone) and deals `concurrency` tasks
/// over them.
pub async fn connect(
    endpoints: &[String],
    mode: Mode,
    route: EtcdRoute,
    connections: usize,
    concurrency: usize,
    timeout: Duration,
    tls: Option<etcd_client::TlsOptions>,
) -> anyhow::Result<Vec<EtcdTask>> {
    if mode == Mode::Key {
        bail!(
            "--mode key has no counterpart on etcd (it keeps no idempotency keys): \
             use plain or session with --target etcd"
        );
    }
    let clients = clients(endpoints, route, connections, timeout, tls).await?;
    let run: u64 = rand::random();
    Ok((0..concurrency)
        .map(|task| EtcdTask {
            kv: clients[task % connections].kv_client(),
            sequence: (mode == Mode::Session).then(|| Sequence {
                key: format!("__seq/{run:016x}-{task}").into_bytes(),
                last: 0,
            }),
        })
        .collect())
}

/// `connections` clients of `endpoints` (or, routed to the leader, of the
/// leader's endpoint alone), checked to answer.
async fn clients(
    endpoints: &[String],
    route: EtcdRoute,
    connections: usize,
    timeout: Duration,
    tls: Option<etcd_client::TlsOptions>,
) -> anyhow::Result<Vec<Client>> {
    let mut options = ConnectOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        options = options.with_tls(tls);
    }
    let endpoints = match route {
        EtcdRoute::Leader if endpoints.len() > 1 => {
            vec![leader(endpoints, &options, timeout).await?]
        }
        _ => endpoints.to_vec(),
    };
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let client = Client::connect(&endpoints, Some(options.clone()))
            .await
            .with_context(|| format!("connecting to etcd at {}", endpoints.join(",")))?;
        clients.push(client);
    }
    if let Some(first) = clients.first() {
        first
            .maintenance_client()
            .status()
            .await
            .with_context(|| format!("etcd at {} did not answer", endpoints.join(",")))?;
    }
    Ok(clients)
}

/// `--open-sessions N --target etcd`: grants `count` leases of
/// [`fill::SESSION_TTL`](super::fill::SESSION_TTL) (etcd's sessions are
/// leases) with `concurrency` tasks over `connections` clients, and leaves
/// them to live out their TTL.
pub async fn grant_leases(
    endpoints: &[String],
    count: u64,
    connections: usize,
    concurrency: usize,
    timeout: Duration,
    tls: Option<etcd_client::TlsOptions>,
) -> anyhow::Result<super::fill::Opened> {
    let clients = clients(endpoints, EtcdRoute::Balanced, connections, timeout, tls).await?;
    let ttl = i64::try_from(super::fill::SESSION_TTL.as_secs()).unwrap_or(i64::MAX);
    let leases = clients.iter().map(Client::lease_client).collect();
    super::fill::open_each(count, leases, concurrency, move |mut lease| async move {
        let granted = lease.grant(ttl, None).await;
        (0, granted.map(drop).map_err(|error| error.to_string()))
    })
    .await
}

/// One watcher of the watch workload: its stream opens on the first call.
pub struct EtcdWatcher {
    client: Client,
    prefix: Vec<u8>,
    stream: Option<WatchStream>,
}

impl std::fmt::Debug for EtcdWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdWatcher")
            .field("open", &self.stream.is_some())
            .finish_non_exhaustive()
    }
}

/// `watchers` watchers of `prefix`, dealt round-robin over `connections`
/// clients (the members as `route` says).
pub async fn watchers(
    endpoints: &[String],
    route: EtcdRoute,
    connections: usize,
    watchers: usize,
    prefix: &[u8],
    timeout: Duration,
    tls: Option<etcd_client::TlsOptions>,
) -> anyhow::Result<Vec<EtcdWatcher>> {
    let clients = clients(endpoints, route, connections, timeout, tls).await?;
    Ok((0..watchers)
        .map(|n| EtcdWatcher {
            client: clients[n % connections].clone(),
            prefix: prefix.to_vec(),
            stream: None,
        })
        .collect())
}

impl WatchClient for EtcdWatcher {
    async fn next_values(&mut self) -> Result<Vec<Vec<u8>>, OpError> {
        let stream = match self.stream.take() {
            Some(stream) => stream,
            None => {
                let options = WatchOptions::new().with_prefix();
                self.client
                    .watch(self.prefix.clone(), Some(options))
                    .await
                    .map_err(failure)?
            }
        };
        let stream = self.stream.insert(stream);
        // The first message says the watch was created: no events, and the
        // watcher counts as started.
        match stream.message().await.map_err(failure)? {
            Some(response) if response.canceled() => Err(OpError::new(
                "WatchCanceled",
                format!("etcd canceled the watch: {}", response.cancel_reason()),
            )),
            Some(response) => Ok(response
                .events()
                .iter()
                .filter(|event| matches!(event.event_type(), EventType::Put))
                .filter_map(|event| event.kv().map(|kv| kv.value().to_vec()))
                .collect()),
            None => Err(OpError::new("WatchEnded", "etcd ended the watch stream")),
        }
    }
}

/// The endpoint of the member that leads: each endpoint is asked for its
/// status until one says it leads (elections take a moment after start).
async fn leader(
    endpoints: &[String],
    options: &ConnectOptions,
    timeout: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    let mut last_error = String::from("no member reported itself leader");
    loop {
        for endpoint in endpoints {
            let status = async {
                let client = Client::connect([endpoint.as_str()], Some(options.clone())).await?;
                client.maintenance_client().status().await
            };
            match status.await {
                Ok(status) => {
                    let member = status.header().map(|h| h.member_id());
                    if member.is_some() && member == Some(status.leader()) {
                        return Ok(endpoint.clone());
                    }
                }
                Err(error) => last_error = format!("{endpoint}: {error}"),
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "no etcd leader found at {} within {timeout:?} ({last_error})",
                endpoints.join(",")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A short, stable name of an etcd error, to count errors by.
fn error_kind(error: &Error) -> String {
    match error {
        Error::GRpcStatus(status) => format!("GRpcStatus:{:?}", status.code()),
        other => format!("{other:?}")
            .split(['(', ' ', '{'])
            .next()
            .unwrap_or("Error")
            .to_string(),
    }
}

fn failure(error: Error) -> OpError {
    OpError::new(error_kind(&error), error.to_string())
}

/// What a guarded write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Written {
    /// The data compares held and the write was made (for a duplicate: it
    /// was, on the attempt that applied, as far as can be known).
    swapped: bool,
    /// The write had applied on an earlier attempt.
    duplicate: bool,
}

impl EtcdTask {
    async fn read(&mut self, key: &[u8], serializable: bool) -> Result<Option<KeyValue>, OpError> {
        let options = serializable.then(|| GetOptions::new().with_serializable());
        let mut response = self.kv.get(key, options).await.map_err(failure)?;
        Ok(response.take_kvs().into_iter().next())
    }

    /// Makes `ops` if `compares` hold: one Txn, or in session mode one Txn
    /// guarded by the sequence key (with the data compares nested inside).
    async fn write(&mut self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<Written, OpError> {
        let Some(sequence) = &mut self.sequence else {
            let response = self
                .kv
                .txn(Txn::new().when(compares).and_then(ops))
                .await
                .map_err(failure)?;
            return Ok(Written {
                swapped: response.succeeded(),
                duplicate: false,
            });
        };
        let next = sequence.last + 1;
        let guard = if sequence.last == 0 {
            Compare::version(sequence.key.clone(), CompareOp::Equal, 0)
        } else {
            Compare::value(
                sequence.key.clone(),
                CompareOp::Equal,
                sequence.last.to_string(),
            )
        };
        let nested = !compares.is_empty();
        let mut then = vec![TxnOp::put(sequence.key.clone(), next.to_string(), None)];
        if nested {
            then.push(TxnOp::txn(Txn::new().when(compares).and_then(ops)));
        } else {
            then.extend(ops);
        }
        let txn = Txn::new()
            .when([guard])
            .and_then(then)
            .or_else([TxnOp::get(sequence.key.clone(), None)]);
        let mut attempt = 1;
        let response = loop {
            match self.kv.txn(txn.clone()).await {
                Ok(response) => break response,
                // The outcome is unknown; resending is safe, as the
                // sequence compare turns a second apply into a no-op.
                Err(_) if attempt < SESSION_ATTEMPTS => attempt += 1,
                Err(error) => return Err(failure(error)),
            }
        };
        if response.succeeded() {
            sequence.last = next;
            let swapped = !nested
                || response
                    .op_responses()
                    .iter()
                    .any(|r| matches!(r, TxnOpResponse::Txn(inner) if inner.succeeded()));
            return Ok(Written {
                swapped,
                duplicate: false,
            });
        }
        let stored = response.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
            _ => None,
        });
        let stored = stored.map(|kv| kv.value().to_vec());
        if stored.as_deref() == Some(next.to_string().as_bytes()) {
            // An earlier attempt applied it: a duplicate, recognised.
            sequence.last = next;
            return Ok(Written {
                swapped: true,
                duplicate: true,
            });
        }
        Err(OpError::new(
            "SequenceMismatch",
            format!(
                "sequence key {} holds {:?}, expected {}",
                String::from_utf8_lossy(&sequence.key),
                stored.map(|v| String::from_utf8_lossy(&v).into_owned()),
                sequence.last
            ),
        ))
    }

    /// Reads `key`, computes its new value with `update`, and writes it if
    /// the key's revision did not change in between; again on conflict.
    async fn read_modify_write(
        &mut self,
        key: Vec<u8>,
        update: impl Fn(Option<&[u8]>) -> Result<Vec<u8>, OpError>,
    ) -> Result<Completion, OpError> {
        let mut retries = 0;
        loop {
            let current = self.read(&key, false).await?;
            let revision = current.as_ref().map_or(0, KeyValue::mod_revision);
            let new = update(current.as_ref().map(KeyValue::value))?;
            let guard = Compare::mod_revision(key.clone(), CompareOp::Equal, revision);
            let written = self
                .write(vec![guard], vec![TxnOp::put(key.clone(), new, None)])
                .await?;
            if written.swapped {
                return Ok(Completion {
                    cas_conflict: false,
                    retries,
                    duplicate: written.duplicate,
                });
            }
            retries += 1;
            if retries >= RMW_ROUNDS_MAX {
                return Err(OpError::new(
                    "ConflictRetriesExhausted",
                    format!(
                        "{} conflicting writers: gave up after {retries} rounds",
                        String::from_utf8_lossy(&key)
                    ),
                ));
            }
        }
    }
}

impl EtcdTask {
    /// Moves one unit from `from` to `to`: reads both accounts in one Txn,
    /// then writes both new balances in a Txn guarded by both keys' mod
    /// revisions; again on conflict (each round counts as a retry).
    async fn transfer(&mut self, from: Vec<u8>, to: Vec<u8>) -> Result<Completion, OpError> {
        let mut retries = 0;
        loop {
            let read =
                Txn::new().and_then([TxnOp::get(from.clone(), None), TxnOp::get(to.clone(), None)]);
            let response = self.kv.txn(read).await.map_err(failure)?;
            let mut accounts = response.op_responses().into_iter().map(|r| match r {
                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                _ => None,
            });
            let (debited, credited) = (accounts.next().flatten(), accounts.next().flatten());
            let revision = |kv: &Option<KeyValue>| kv.as_ref().map_or(0, KeyValue::mod_revision);
            let guards = vec![
                Compare::mod_revision(from.clone(), CompareOp::Equal, revision(&debited)),
                Compare::mod_revision(to.clone(), CompareOp::Equal, revision(&credited)),
            ];
            let debit = added(debited.as_ref().map(KeyValue::value), -1)?;
            let credit = added(credited.as_ref().map(KeyValue::value), 1)?;
            let written = self
                .write(
                    guards,
                    vec![
                        TxnOp::put(from.clone(), debit, None),
                        TxnOp::put(to.clone(), credit, None),
                    ],
                )
                .await?;
            if written.swapped {
                return Ok(Completion {
                    cas_conflict: false,
                    retries,
                    duplicate: written.duplicate,
                });
            }
            retries += 1;
            if retries >= RMW_ROUNDS_MAX {
                return Err(OpError::new(
                    "ConflictRetriesExhausted",
                    format!(
                        "transfer {} -> {}: gave up after {retries} conflicting rounds",
                        String::from_utf8_lossy(&from),
                        String::from_utf8_lossy(&to)
                    ),
                ));
            }
        }
    }
}

/// The counter after an INCR of `current` (absent: 0).
fn incremented(current: Option<&[u8]>) -> Result<Vec<u8>, OpError> {
    added(current, 1)
}

/// The counter `current` (absent: 0) plus `by`.
fn added(current: Option<&[u8]>, by: i64) -> Result<Vec<u8>, OpError> {
    let value = match current {
        None => 0,
        Some(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| text.parse::<i64>().ok())
            .ok_or_else(|| {
                OpError::new("NotAnInteger", "INCR of a value that is not a decimal i64")
            })?,
    };
    let value = value
        .checked_add(by)
        .ok_or_else(|| OpError::new("Overflow", "INCR past the i64 range"))?;
    Ok(value.to_string().into_bytes())
}

impl TaskClient for EtcdTask {
    async fn execute(&mut self, op: Op) -> Result<Completion, OpError> {
        match op {
            Op::Get { key, serializable } => {
                self.read(&key, serializable).await?;
                Ok(Completion::default())
            }
            Op::Put { key, value } if self.sequence.is_none() => {
                self.kv.put(key, value, None).await.map_err(failure)?;
                Ok(Completion::default())
            }
            Op::Put { key, value } => {
                let written = self
                    .write(vec![], vec![TxnOp::put(key, value, None)])
                    .await?;
                Ok(Completion {
                    duplicate: written.duplicate,
                    ..Completion::default()
                })
            }
            Op::Cas { key, new } => {
                let guard = match self.read(&key, false).await? {
                    Some(current) => {
                        Compare::value(key.clone(), CompareOp::Equal, current.value().to_vec())
                    }
                    None => Compare::version(key.clone(), CompareOp::Equal, 0),
                };
                let written = self
                    .write(vec![guard], vec![TxnOp::put(key, new, None)])
                    .await?;
                Ok(Completion {
                    cas_conflict: !written.swapped,
                    retries: 0,
                    duplicate: written.duplicate,
                })
            }
            Op::Append { key, value } => {
                self.read_modify_write(key, |current| {
                    let mut new = current.map(<[u8]>::to_vec).unwrap_or_default();
                    new.extend_from_slice(&value);
                    Ok(new)
                })
                .await
            }
            Op::Incr { key } => self.read_modify_write(key, incremented).await,
            Op::Transfer { from, to } => self.transfer(from, to).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incr_reads_decimal_counters_only() {
        assert_eq!(incremented(None), Ok(b"1".to_vec()));
        assert_eq!(incremented(Some(b"41")), Ok(b"42".to_vec()));
        assert_eq!(incremented(Some(b"-1")), Ok(b"0".to_vec()));
        assert_eq!(
            incremented(Some(b"abc")).map_err(|e| e.kind),
            Err("NotAnInteger".to_string())
        );
        assert_eq!(
            incremented(Some(i64::MAX.to_string().as_bytes())).map_err(|e| e.kind),
            Err("Overflow".to_string())
        );
        assert_eq!(added(None, -1), Ok(b"-1".to_vec()));
        assert_eq!(added(Some(b"5"), -1), Ok(b"4".to_vec()));
    }

    #[test]
    fn etcd_errors_are_counted_by_a_short_name() {
        assert_eq!(
            error_kind(&Error::GRpcStatus(tonic::Status::unavailable("down"))),
            "GRpcStatus:Unavailable"
        );
        assert_eq!(error_kind(&Error::InvalidArgs("x y".into())), "InvalidArgs");
    }
}
