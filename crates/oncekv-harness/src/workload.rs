//! The live workload: clients whose double application would show in the
//! final state, each recording every operation it issues.
//!
//! Each client runs one operation at a time, chosen by its own seeded RNG:
//! unique-token APPENDs to a few keys (a token applied twice shows twice),
//! INCRs of counters by 1 (some under an idempotency key), CAS and PUT/GET
//! on registers (for linearizability), lease grant/revoke by name, and
//! transfers between a few accounts: one transaction moving an amount
//! from one account to another and appending the transfer's unique token
//! to the client's ledger (sometimes with reads, sometimes under a
//! compare), so the final balances and ledgers show whether each applied
//! exactly once. (A ledger per client keeps each value, and the history
//! of its changes, small.)
//!
//! In [`ClientMode::Session`] every mutation runs on the client's session;
//! an unknown outcome is retried with the **same sequence number** until
//! the answer is definite (or the run's grace period ends), so counters
//! can be checked for "exactly 1..N". An expiry probe lets short sessions
//! lapse and then uses them, so the run exercises expiry.
//!
//! [`ClientMode::Naive`] is the negative control: plain requests, resent on
//! an unknown outcome, the retry bug Jepsen found in etcd's Java client.
//! The checkers must catch it.

use crate::convert::{self, error_outcome, ok};
use crate::recorder::Recorder;
use oncekv_check::record::{Bytes, ClientId, Op, Outcome, RequestIdentity};
use oncekv_client::{
    Backoff, Client, ClientError, ClientOptions, EarlierSends, Session, SessionOptions,
};
use oncekv_state::{Command, Compare, Query, Reply, Txn, TxnOp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How clients send their mutations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientMode {
    /// On sessions (and idempotency keys), retried with the same identity:
    /// exactly-once.
    Session,
    /// Plain requests resent on an unknown outcome: the negative control.
    Naive,
}

/// The client options of the workload: short attempts, so a dropped reply
/// is retried soon, and requests batched behind any call in flight on
/// their connection. (A simulation keeps these and injects its own
/// connector and random draws.)
pub fn client_options() -> ClientOptions {
    ClientOptions {
        batch_after_calls: 1,
        attempt_timeout: Duration::from_millis(1_000),
        deadline: Duration::from_secs(4),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(300),
        },
        ..ClientOptions::default()
    }
}

/// The workload's shape.
#[derive(Clone, Debug)]
pub struct WorkloadOptions {
    /// Concurrent clients (an expiry probe runs besides them).
    pub clients: usize,
    /// How mutations are sent.
    pub mode: ClientMode,
    /// Seeds every client's choices.
    pub seed: u64,
    /// Keys receiving appends.
    pub append_keys: usize,
    /// Counters.
    pub counter_keys: usize,
    /// Registers (PUT/GET/CAS).
    pub register_keys: usize,
    /// Lease names.
    pub lease_names: usize,
    /// Accounts transfers move amounts between (at least 2 for any).
    pub accounts: usize,
    /// Watchers of the accounts through the run (where the driver runs
    /// them: `run` does); through etcd's API, of the resources.
    pub watchers: usize,
    /// Resources kept as Kubernetes keeps its objects in etcd (through
    /// etcd's API only: `etcd_resources`).
    pub resources: usize,
    /// TTL of the clients' sessions.
    pub session_ttl: Duration,
    /// TTL of the expiry probe's sessions, which are left to lapse.
    pub probe_ttl: Duration,
    /// How long a client keeps retrying an unknown outcome after the run
    /// stops.
    pub grace: Duration,
    /// Prefix of every key and lease name, so a run against a cluster
    /// in use touches only its own keys.
    pub prefix: String,
    /// Clients sharing one client connection (each keeps its own
    /// session): requests of several clients in flight on one connection
    /// go together as batches (the client options batch behind one call
    /// in flight), so a session's requests travel in different batches,
    /// and a retry in another batch than its original.
    pub clients_per_connection: usize,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        WorkloadOptions {
            clients: 8,
            mode: ClientMode::Session,
            seed: 0,
            append_keys: 3,
            counter_keys: 2,
            register_keys: 2,
            lease_names: 2,
            accounts: 4,
            watchers: 3,
            resources: 4,
            session_ttl: Duration::from_secs(10),
            probe_ttl: Duration::from_millis(1000),
            grace: Duration::from_secs(15),
            prefix: String::new(),
            clients_per_connection: 4,
        }
    }
}

impl WorkloadOptions {
    /// The keys whose final value the checkers need (appends, counters).
    pub fn final_keys(&self) -> Vec<Vec<u8>> {
        (0..self.append_keys)
            .map(|i| self.key("append", i))
            .chain((0..self.counter_keys).map(|i| self.key("counter", i)))
            .chain(std::iter::once(self.probe_key()))
            .collect()
    }

    /// The `i`th key of a kind (`append`, `counter`, `register`, `lease`).
    pub fn key(&self, kind: &str, i: usize) -> Vec<u8> {
        format!("{}{kind}-{i}", self.prefix).into_bytes()
    }

    /// The `i`th account.
    pub fn account(&self, i: usize) -> Vec<u8> {
        format!("{}acct/{i}", self.prefix).into_bytes()
    }

    /// Every account's key.
    pub fn accounts(&self) -> Vec<Vec<u8>> {
        (0..self.accounts).map(|i| self.account(i)).collect()
    }

    /// The prefix every account is under (and nothing else): what the
    /// watchers watch.
    pub fn accounts_prefix(&self) -> Vec<u8> {
        format!("{}acct/", self.prefix).into_bytes()
    }

    /// The `i`th resource (through etcd's API).
    pub fn resource(&self, i: usize) -> Vec<u8> {
        format!("{}registry/pods/pod-{i}", self.prefix).into_bytes()
    }

    /// Every resource's key.
    pub fn resources(&self) -> Vec<Vec<u8>> {
        (0..self.resources).map(|i| self.resource(i)).collect()
    }

    /// The prefix every resource is under (and nothing else): what the
    /// watchers through etcd's API watch and the lists list.
    pub fn resources_prefix(&self) -> Vec<u8> {
        format!("{}registry/pods/", self.prefix).into_bytes()
    }

    /// The key the compactor keeps its count in, as Kubernetes' API
    /// server does (outside the resources).
    pub fn compact_key(&self) -> Vec<u8> {
        format!("{}compact_rev_key", self.prefix).into_bytes()
    }

    /// The key client `client`'s transfers append their tokens to.
    pub fn ledger(&self, client: ClientId) -> Vec<u8> {
        format!("{}ledger/{client}", self.prefix).into_bytes()
    }

    /// Every client's ledger (the expiry probe makes no transfers).
    pub fn ledgers(&self) -> Vec<Vec<u8>> {
        (1..=self.clients as ClientId)
            .map(|client| self.ledger(client))
            .collect()
    }

    /// The key the expiry probe appends to.
    fn probe_key(&self) -> Vec<u8> {
        format!("{}append-probe", self.prefix).into_bytes()
    }
}

/// When clients stop starting operations, and when they stop retrying.
#[derive(Clone, Debug)]
pub struct Stop {
    /// Set when the run's time is up.
    pub stop: watch::Receiver<bool>,
}

impl Stop {
    /// Whether the run's time is up.
    pub fn stopped(&self) -> bool {
        *self.stop.borrow()
    }
}

/// One client's state.
struct Worker {
    id: ClientId,
    client: Client,
    options: WorkloadOptions,
    recorder: Arc<Recorder>,
    rng: StdRng,
    stop: Stop,
    /// Operations issued, for unique tokens and keys.
    issued: u64,
    /// The last value this client saw in each register.
    registers: Vec<Option<Vec<u8>>>,
    /// Whether this client believes it holds each lease.
    leases: Vec<bool>,
    session: Option<Session>,
    stopped_at: Option<Instant>,
}

/// What one send returned, and how many times it was sent.
type Sent = (Result<Reply, ClientError>, u32);

fn sent(result: Result<oncekv_client::Completed, ClientError>) -> Sent {
    match result {
        Ok(completed) => (Ok(completed.reply), completed.attempts),
        Err(ClientError::OutcomeUnknown {
            attempts,
            last_answer,
            ..
        }) => (
            Err(ClientError::OutcomeUnknown {
                request_id: None,
                attempts,
                last_answer,
            }),
            attempts,
        ),
        Err(error) => (Err(error), 1),
    }
}

fn outcome_of(result: &Result<Reply, ClientError>) -> Outcome {
    match result {
        Ok(reply) => ok(reply),
        Err(error) => error_outcome(error),
    }
}

fn is_unknown(result: &Result<Reply, ClientError>) -> bool {
    matches!(result, Err(ClientError::OutcomeUnknown { .. }))
}

/// Whether an unknown outcome's last answer shows that resending cannot
/// learn more: the session expired, or the request's record was freed.
fn cannot_learn_more(result: &Result<Reply, ClientError>) -> bool {
    matches!(
        result,
        Err(ClientError::OutcomeUnknown { last_answer: Some(answer), .. })
            if matches!(**answer, ClientError::SessionExpired | ClientError::Stale { .. })
    )
}

impl Worker {
    /// Whether retries of an unknown outcome must end: the run stopped
    /// more than the grace period ago.
    fn retries_over(&mut self) -> bool {
        if !self.stop.stopped() {
            return false;
        }
        let since = *self.stopped_at.get_or_insert_with(Instant::now);
        since.elapsed() >= self.options.grace
    }

    fn token(&mut self) -> Vec<u8> {
        self.issued += 1;
        format!("c{}-{}", self.id, self.issued).into_bytes()
    }

    async fn session(&mut self, ttl: Duration, keep_alive: bool) -> Option<Session> {
        if let Some(session) = &self.session {
            return Some(session.clone());
        }
        let options = SessionOptions {
            ttl,
            window: 4,
            keep_alive,
        };
        match self.client.open_session(options).await {
            Ok(session) => {
                self.session = Some(session.clone());
                Some(session)
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                None
            }
        }
    }

    /// Runs `command` on the session, retrying an unknown outcome with the
    /// same sequence number; records it as `op`.
    async fn on_session(&mut self, session: &Session, op: Op, command: Command) -> Outcome {
        let seq = session.next_seq();
        let id = session.id().0;
        let identity = RequestIdentity::session(id, seq);
        let op_id = self.recorder.invoke(self.id, identity, op);
        let (mut result, mut attempts) = sent(session.execute_completed(command.clone()).await);
        // A resend after an unknown outcome tells the client so: it then
        // ends applied, replayed or unknown, never "not applied". It stops
        // when the answer is known, when the run is over, or when the
        // last answer shows retrying cannot learn more (the session
        // expired, or its record was freed).
        while is_unknown(&result) && !self.retries_over() && !cannot_learn_more(&result) {
            let (again, more) = sent(
                session
                    .execute_seq(
                        seq,
                        Some(seq),
                        command.clone(),
                        EarlierSends::MaybeDelivered,
                    )
                    .await,
            );
            result = again;
            attempts += more;
        }
        if session.is_expired() {
            self.recorder.session_expired(self.id, id);
            self.session = None;
        }
        let outcome = outcome_of(&result);
        self.recorder
            .complete(self.id, op_id, attempts.max(1), outcome.clone());
        outcome
    }

    /// Runs `command` under a fresh idempotency key, retried with the same
    /// key on an unknown outcome.
    async fn under_key(&mut self, op: Op, command: Command) -> Outcome {
        let key = format!("k-c{}-{}", self.id, self.issued).into_bytes();
        let identity = RequestIdentity::idempotent(key.clone());
        let op_id = self.recorder.invoke(self.id, identity, op);
        let mut attempts = 0;
        let mut earlier = EarlierSends::None;
        let result = loop {
            let (result, more) = sent(
                self.client
                    .execute_once_after(command.clone(), key.clone(), earlier)
                    .await,
            );
            attempts += more;
            if !is_unknown(&result) || self.retries_over() {
                break result;
            }
            // A resend after an unknown outcome ends applied, replayed or
            // unknown, never "not applied".
            earlier = EarlierSends::MaybeDelivered;
        };
        let outcome = outcome_of(&result);
        self.recorder
            .complete(self.id, op_id, attempts.max(1), outcome.clone());
        outcome
    }

    /// The negative control: a plain request, resent up to three times when
    /// its outcome is unknown.
    async fn naive(&mut self, op: Op, command: Command) -> Outcome {
        let op_id = self.recorder.invoke(self.id, RequestIdentity::plain(), op);
        let mut attempts = 0;
        let mut result;
        loop {
            let (again, more) = sent(self.client.execute_plain(command.clone()).await);
            result = again;
            attempts += more;
            if !is_unknown(&result) || attempts >= 4 {
                break;
            }
        }
        let outcome = outcome_of(&result);
        self.recorder
            .complete(self.id, op_id, attempts.max(1), outcome.clone());
        outcome
    }

    /// Sends a mutation the way the mode says.
    async fn mutate(&mut self, op: Op, command: Command) -> Option<Outcome> {
        match self.options.mode {
            ClientMode::Naive => Some(self.naive(op, command).await),
            ClientMode::Session => {
                let ttl = self.options.session_ttl;
                let session = self.session(ttl, true).await?;
                Some(self.on_session(&session, op, command).await)
            }
        }
    }

    async fn read(&mut self, key: Vec<u8>) -> Outcome {
        let op = Op::Get {
            key: Bytes(key.clone()),
        };
        let op_id = self.recorder.invoke(self.id, RequestIdentity::plain(), op);
        let result = self.client.read(Query::Get { key }, false).await;
        let outcome = outcome_of(&result);
        self.recorder.complete(self.id, op_id, 1, outcome.clone());
        outcome
    }

    async fn step(&mut self) {
        let o = &self.options;
        let choice = self.rng.random_range(0..100);
        match choice {
            0..25 => {
                let key = o.key("append", self.rng.random_range(0..o.append_keys.max(1)));
                let token = self.token();
                let mut value = token.clone();
                value.push(b';');
                let op = Op::Append {
                    key: Bytes(key.clone()),
                    token: Bytes(token),
                };
                self.mutate(op, Command::Append { key, value }).await;
            }
            25..40 => {
                let key = o.key("counter", self.rng.random_range(0..o.counter_keys.max(1)));
                self.issued += 1;
                let op = Op::Incr {
                    key: Bytes(key.clone()),
                    by: 1,
                };
                let command = Command::Incr { key, by: 1 };
                if self.options.mode == ClientMode::Session && self.rng.random_bool(0.3) {
                    self.under_key(op, command).await;
                } else {
                    self.mutate(op, command).await;
                }
            }
            40..62 => self.register_step().await,
            62..85 if o.accounts >= 2 => self.transfer_step().await,
            _ => self.lease_step().await,
        }
    }

    async fn register_step(&mut self) {
        let index = self.rng.random_range(0..self.options.register_keys.max(1));
        let key = self.options.key("register", index);
        match self.rng.random_range(0..3) {
            0 => {
                if let Outcome::Ok {
                    reply: oncekv_check::record::Reply::Get { value },
                    ..
                } = self.read(key).await
                {
                    self.registers[index] = value.map(|v| v.0);
                }
            }
            1 => {
                let value = self.token();
                let op = Op::Put {
                    key: Bytes(key.clone()),
                    value: Bytes(value.clone()),
                };
                let command = Command::Put {
                    key,
                    value: value.clone().into(),
                    lease: None,
                };
                if let Some(Outcome::Ok { .. }) = self.mutate(op, command).await {
                    self.registers[index] = Some(value);
                }
            }
            _ => {
                let new = self.token();
                let expected = self.registers[index].clone();
                let op = Op::Cas {
                    key: Bytes(key.clone()),
                    expected: expected.clone().map(Bytes),
                    new: Bytes(new.clone()),
                };
                let command = Command::Cas { key, expected, new };
                if let Some(Outcome::Ok {
                    reply: oncekv_check::record::Reply::Cas { current, .. },
                    ..
                }) = self.mutate(op, command).await
                {
                    self.registers[index] = current.map(|v| v.0);
                }
            }
        }
    }

    /// Moves a random amount between two accounts in one transaction that
    /// also appends its unique token to the ledger; one in three reads
    /// both accounts too, one in three runs only if the source exists
    /// (else reads both).
    async fn transfer_step(&mut self) {
        let accounts = self.options.accounts.max(2);
        let from = self.rng.random_range(0..accounts);
        let to = (from + self.rng.random_range(1..accounts)) % accounts;
        let amount = self.rng.random_range(1..=100);
        let variant = self.rng.random_range(0..3);
        let (from, to) = (self.options.account(from), self.options.account(to));
        let mut entry = self.token();
        entry.push(b';');
        let mut txn = Txn::new();
        if variant == 1 {
            txn = txn.on_success(TxnOp::get(from.clone()));
        }
        txn = txn
            .on_success(TxnOp::incr(from.clone(), -amount))
            .on_success(TxnOp::incr(to.clone(), amount))
            .on_success(TxnOp::Append {
                key: self.options.ledger(self.id),
                value: entry,
            });
        if variant == 1 {
            txn = txn.on_success(TxnOp::get(to.clone()));
        }
        if variant == 2 {
            txn = txn
                .compare(Compare::exists(from.clone()))
                .on_failure(TxnOp::get(from))
                .on_failure(TxnOp::get(to));
        }
        let Some(recorded) = convert::txn(&txn) else {
            unreachable!("a transfer is built of operations the record models");
        };
        self.mutate(Op::Txn(recorded), Command::Txn(txn)).await;
    }

    async fn lease_step(&mut self) {
        let index = self.rng.random_range(0..self.options.lease_names.max(1));
        let name = String::from_utf8_lossy(&self.options.key("lease", index)).into_owned();
        self.issued += 1;
        let (op, command) = if self.leases[index] {
            (
                Op::LeaseRevoke { name: name.clone() },
                Command::LeaseRevoke { name },
            )
        } else {
            let ttl_ms = 5_000;
            (
                Op::LeaseGrant {
                    name: name.clone(),
                    ttl_ms,
                },
                Command::LeaseGrant { name, ttl_ms },
            )
        };
        if let Some(Outcome::Ok { reply, .. }) = self.mutate(op, command).await {
            self.leases[index] = matches!(reply, oncekv_check::record::Reply::LeaseGranted { .. });
        }
    }

    /// Opens short sessions without keep-alive, uses them, lets them lapse
    /// and uses them again: the second use must be refused as expired.
    async fn probe_step(&mut self) {
        let ttl = self.options.probe_ttl;
        self.session = None;
        let Some(session) = self.session(ttl, false).await else {
            return;
        };
        for _ in 0..2 {
            let token = self.token();
            let mut value = token.clone();
            value.push(b';');
            let key = self.options.probe_key();
            let op = Op::Append {
                key: Bytes(key.clone()),
                token: Bytes(token),
            };
            let command = Command::Append { key, value };
            self.on_session(&session, op, command).await;
            if self.stop.stopped() {
                break;
            }
            tokio::time::sleep(ttl * 3).await;
        }
        session.detach();
        self.session = None;
    }
}

/// Starts the workload's clients (and the expiry probe, in session mode)
/// against `endpoints`; they run until `stop` is set, then finish their
/// retries.
pub fn start(
    endpoints: &[String],
    client_options: oncekv_client::ClientOptions,
    options: &WorkloadOptions,
    recorder: Arc<Recorder>,
    stop: watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, ClientError> {
    let probe = options.mode == ClientMode::Session;
    let total = options.clients + usize::from(probe);
    let mut tasks = Vec::new();
    let connections = options
        .clients
        .div_ceil(options.clients_per_connection.max(1))
        .max(1);
    let shared: Vec<Client> = (0..connections)
        .map(|_| Client::connect(endpoints.to_vec(), client_options.clone()))
        .collect::<Result<_, _>>()?;
    for index in 0..total {
        let id = index as ClientId + 1;
        let is_probe = index == options.clients;
        let client = if is_probe {
            Client::connect(endpoints.to_vec(), client_options.clone())?
        } else {
            shared[index % shared.len()].clone()
        };
        let mut worker = Worker {
            id,
            client,
            options: options.clone(),
            recorder: recorder.clone(),
            rng: StdRng::seed_from_u64(options.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            stop: Stop { stop: stop.clone() },
            issued: 0,
            registers: vec![None; options.register_keys.max(1)],
            leases: vec![false; options.lease_names.max(1)],
            session: None,
            stopped_at: None,
        };
        tasks.push(tokio::spawn(async move {
            while !worker.stop.stopped() {
                if is_probe {
                    worker.probe_step().await;
                } else {
                    worker.step().await;
                }
            }
            if let Some(session) = worker.session.take() {
                let _ = tokio::time::timeout(Duration::from_secs(2), session.close()).await;
            }
        }));
    }
    Ok(tasks)
}

/// Reads every account (in one transaction of reads, so the balances
/// are one consistent cut) and every ledger, retrying up to `patience`,
/// and records them as final values.
pub async fn record_final_balances(
    client: &Client,
    options: &WorkloadOptions,
    recorder: &Recorder,
    patience: Duration,
) -> Result<(), ClientError> {
    let mut keys = options.accounts();
    keys.extend(options.ledgers());
    // The accounts come first, so they are read together; the ledgers
    // (one per client) may take more transactions than one.
    let deadline = Instant::now() + patience;
    for chunk in keys.chunks(READS_PER_TXN) {
        let txn = chunk.iter().fold(Txn::new(), |txn, key| {
            txn.on_success(TxnOp::get(key.clone()))
        });
        let outcome = loop {
            match client.txn(txn.clone()).await {
                Ok(outcome) => break outcome,
                Err(error) if Instant::now() >= deadline => return Err(error),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        if outcome.results.len() != chunk.len() {
            return Err(ClientError::Invalid(format!(
                "a transaction of {} reads answered {} results",
                chunk.len(),
                outcome.results.len()
            )));
        }
        for (key, result) in chunk.iter().zip(outcome.results) {
            let Reply::Get { value, .. } = result else {
                return Err(ClientError::Invalid(format!(
                    "a read in a transaction answered {result:?}"
                )));
            };
            recorder.final_value(Bytes(key.clone()), value.map(Bytes));
        }
    }
    Ok(())
}

/// Most reads in one transaction of [`record_final_balances`] (well under
/// the node's default limit of operations per transaction).
const READS_PER_TXN: usize = 64;

/// Reads the final value of every key in `keys` (linearizably, retrying up
/// to `patience`) and records it.
pub async fn record_final_values(
    client: &Client,
    keys: &[Vec<u8>],
    recorder: &Recorder,
    patience: Duration,
) -> Result<(), ClientError> {
    let deadline = Instant::now() + patience;
    for key in keys {
        loop {
            match client.read(Query::Get { key: key.clone() }, false).await {
                Ok(Reply::Get { value, .. }) => {
                    recorder.final_value(Bytes(key.clone()), value.map(Bytes));
                    break;
                }
                Ok(other) => {
                    return Err(ClientError::Invalid(format!("a read answered {other:?}")));
                }
                Err(error) if Instant::now() >= deadline => return Err(error),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    Ok(())
}
