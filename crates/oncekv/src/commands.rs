//! The client commands of `oncekv`: key-value operations, leases, sessions,
//! status and membership. Each prints a short human line or, with
//! `-o json`, one JSON object, and exits with a code that says what is
//! known (see `oncekv --help`).

use crate::session_file::SessionFile;
use anyhow::{Context as _, anyhow};
use clap::{Args, Subcommand, ValueEnum};
use oncekv_client::{
    Client, ClientError, ClientOptions, Command, Completed, Query, Reply, Session, SessionOptions,
};
use oncekv_state::{Secret, SessionId};
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Exit code: applied, replayed or found.
pub const EXIT_OK: u8 = 0;
/// Exit code: another error.
pub const EXIT_ERROR: u8 = 1;
/// Exit code: a definite application-level "no".
pub const EXIT_REJECTED: u8 = 3;
/// Exit code: session or sequence error.
pub const EXIT_SESSION: u8 = 4;
/// Exit code: outcome unknown.
pub const EXIT_UNKNOWN: u8 = 5;
/// Exit code: refused for now, not applied (a full table or budget, the
/// NOSPACE alarm, load shedding): retry later.
pub const EXIT_OVERLOADED: u8 = 6;

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Short human text.
    Text,
    /// One JSON object.
    Json,
}

/// Flags every client command takes.
#[derive(Debug, Args)]
pub struct Connection {
    /// Client addresses of cluster nodes, comma-separated.
    #[arg(
        long,
        global = true,
        env = "ONCEKV_ENDPOINTS",
        default_value = "127.0.0.1:7379",
        value_delimiter = ','
    )]
    pub endpoints: Vec<String>,

    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,

    /// Give up (outcome unknown, for a write) after this long.
    #[arg(long, global = true, default_value = "15s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// How a mutating command is made exactly-once.
#[derive(Debug, Args)]
pub struct Once {
    /// Use (and advance) the session saved in FILE (see `session open`).
    #[arg(long, value_name = "FILE")]
    pub session_file: Option<PathBuf>,

    /// With --session-file: send exactly this sequence number (to retry a
    /// specific request by hand).
    #[arg(long, requires = "session_file")]
    pub seq: Option<u64>,

    /// Without a session: the idempotency key (1..=128 bytes); a re-run
    /// with the same key applies once. Random per invocation by default.
    #[arg(long, conflicts_with = "session_file")]
    pub idempotency_key: Option<String>,
}

/// Key-value, lease and session commands.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Set KEY to VALUE (prints the previous value).
    Put {
        key: String,
        /// The value; read from standard input when omitted (for large or
        /// binary values: `oncekv put KEY < file`).
        value: Option<String>,
        /// Attach the key to this lease (deleted when it ends).
        #[arg(long)]
        lease: Option<String>,
        #[command(flatten)]
        once: Once,
    },
    /// Print the value of KEY (exit 3 if absent).
    Get {
        key: String,
        /// Read this node's state without a read-index round (may be stale).
        #[arg(long)]
        serializable: bool,
    },
    /// Delete KEY (prints the previous value).
    Del {
        key: String,
        #[command(flatten)]
        once: Once,
    },
    /// Append VALUE to KEY (prints the new length).
    Append {
        key: String,
        /// The bytes to append; read from standard input when omitted.
        value: Option<String>,
        #[command(flatten)]
        once: Once,
    },
    /// Add BY (default 1) to the integer at KEY (prints the new value).
    Incr {
        key: String,
        #[arg(default_value_t = 1, allow_negative_numbers = true)]
        by: i64,
        #[command(flatten)]
        once: Once,
    },
    /// Set KEY to NEW if it holds EXPECTED (exit 3 if it did not).
    Cas {
        key: String,
        /// The expected value (ignored with --absent).
        expected: String,
        new: String,
        /// Expect KEY to be absent.
        #[arg(long)]
        absent: bool,
        #[command(flatten)]
        once: Once,
    },
    /// List keys starting with PREFIX.
    Scan {
        prefix: String,
        /// Most keys to list (0: the server's maximum).
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
    /// Leases: named TTLs that own keys.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Sessions saved in files, for exactly-once across invocations.
    #[command(subcommand)]
    Session(SessionCommand),
    /// This node's view of the cluster.
    Status,
    /// Cluster membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// Alarms: NOSPACE is raised when a write would take the store past its
    /// byte quota (`serve --store-bytes-max`); writes that grow the store
    /// are then refused (exit 6) until keys are deleted and it is disarmed.
    #[command(subcommand)]
    Alarm(AlarmCommand),
}

/// Alarm commands.
#[derive(Debug, Subcommand)]
pub enum AlarmCommand {
    /// List raised alarms (as the leader sees them).
    List,
    /// Lower the NOSPACE alarm (raised again by the next write that would
    /// pass the quota).
    Disarm {
        #[command(flatten)]
        once: Once,
    },
}

/// Lease commands.
#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Create lease NAME living TTL (e.g. 10s) unless kept alive.
    Grant {
        name: String,
        #[arg(value_parser = humantime::parse_duration)]
        ttl: Duration,
        #[command(flatten)]
        once: Once,
    },
    /// Renew lease NAME.
    Keepalive {
        name: String,
        #[command(flatten)]
        once: Once,
    },
    /// End lease NAME, deleting its keys.
    Revoke {
        name: String,
        #[command(flatten)]
        once: Once,
    },
    /// List live leases.
    List,
}

/// Session commands.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Open a session and save it to FILE (mode 0600).
    Open {
        /// Expire after this long without requests or keep-alives.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// Most requests in flight (1..=1024; 1 is strictly sequential).
        #[arg(long, default_value_t = 128)]
        window: u32,
        #[arg(long, value_name = "FILE")]
        session_file: PathBuf,
    },
    /// Keep the session in FILE alive.
    Keepalive {
        #[arg(long, value_name = "FILE")]
        session_file: PathBuf,
    },
    /// Close the session in FILE.
    Close {
        #[arg(long, value_name = "FILE")]
        session_file: PathBuf,
    },
}

/// Membership commands.
#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// Add node ID (as a learner, then a voter).
    Add {
        id: u64,
        /// Its peer address.
        #[arg(long)]
        peer: String,
        /// Its client address.
        #[arg(long)]
        client: String,
    },
    /// Remove node ID.
    Remove { id: u64 },
    /// List the members.
    List,
}

struct Printer {
    output: Output,
}

/// Most bytes read from standard input as a value: far above any value a
/// server accepts (it refuses oversized values with a clear error), low
/// enough that a runaway pipe cannot exhaust memory.
const STDIN_VALUE_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// The value given on the command line, or else all of standard input.
fn value_or_stdin(value: Option<String>) -> anyhow::Result<Vec<u8>> {
    use std::io::{IsTerminal, Read};
    if let Some(value) = value {
        return Ok(value.into_bytes());
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        anyhow::bail!("no VALUE given: pass it as an argument or pipe it in (`< file`)");
    }
    let mut bytes = Vec::new();
    stdin
        .lock()
        .take(STDIN_VALUE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .context("reading the value from standard input")?;
    if bytes.len() as u64 > STDIN_VALUE_BYTES_MAX {
        anyhow::bail!("the value on standard input is over {STDIN_VALUE_BYTES_MAX} bytes");
    }
    Ok(bytes)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Printer {
    fn emit(&self, fields: Map<String, Value>, human: String) {
        match self.output {
            Output::Json => sayln!("{}", Value::Object(fields)),
            Output::Text => {
                if !human.is_empty() {
                    sayln!("{human}");
                }
            }
        }
    }

    /// Prints an error outcome and returns its exit code.
    fn error(&self, error: &ClientError) -> ExitCode {
        let (outcome, code) = match error {
            ClientError::Rejected(_) => ("rejected", EXIT_REJECTED),
            ClientError::SessionExpired => ("session_expired", EXIT_SESSION),
            ClientError::Unauthorized => ("unauthorized", EXIT_SESSION),
            ClientError::Stale { .. } => ("stale", EXIT_SESSION),
            ClientError::SequenceGap { .. } => ("sequence_gap", EXIT_SESSION),
            ClientError::RequestMismatch => ("request_mismatch", EXIT_SESSION),
            ClientError::Malformed(_) => ("malformed", EXIT_SESSION),
            ClientError::OutcomeUnknown { .. } => ("unknown", EXIT_UNKNOWN),
            ClientError::Invalid(_) => ("invalid", EXIT_ERROR),
            ClientError::Unreachable(_) => ("unreachable", EXIT_ERROR),
            ClientError::Config(_) => ("error", EXIT_ERROR),
            ClientError::Overloaded(_) => ("overloaded", EXIT_OVERLOADED),
        };
        let mut fields = Map::new();
        fields.insert("outcome".into(), json!(outcome));
        fields.insert("error".into(), json!(error.to_string()));
        match error {
            ClientError::SequenceGap { expected } => {
                fields.insert("expected".into(), json!(expected));
            }
            ClientError::Stale { floor } => {
                fields.insert("floor".into(), json!(floor));
            }
            ClientError::OutcomeUnknown {
                attempts,
                request_id,
            } => {
                fields.insert("attempts".into(), json!(attempts));
                if let Some(id) = request_id {
                    fields.insert("request_id".into(), json!(id.to_string()));
                }
            }
            _ => {}
        }
        match self.output {
            Output::Json => sayln!("{}", Value::Object(fields)),
            Output::Text => eprintln!("{outcome}: {error}"),
        }
        ExitCode::from(code)
    }

    /// Prints a completed mutation and returns its exit code.
    fn completed(&self, done: &Completed) -> ExitCode {
        let mut fields = Map::new();
        fields.insert(
            "outcome".into(),
            json!(if done.replayed { "replayed" } else { "applied" }),
        );
        fields.insert("applied_index".into(), json!(done.applied_index));
        fields.insert("attempts".into(), json!(done.attempts));
        let (human, code) = reply_fields(&done.reply, &mut fields);
        if matches!(done.reply, Reply::Cas { swapped: false, .. }) {
            fields.insert("outcome".into(), json!("rejected"));
        }
        self.emit(fields, human);
        ExitCode::from(code)
    }
}

/// Adds a reply's result fields; returns the human line and exit code.
fn reply_fields(reply: &Reply, fields: &mut Map<String, Value>) -> (String, u8) {
    let optional = |value: &Option<Vec<u8>>| value.as_deref().map(text);
    match reply {
        Reply::Put { previous } | Reply::Delete { previous } => {
            fields.insert("previous".into(), json!(optional(previous)));
            (
                optional(previous)
                    .map(|p| format!("previous: {p}"))
                    .unwrap_or_else(|| "OK".into()),
                EXIT_OK,
            )
        }
        Reply::Get { value } => {
            fields.insert("value".into(), json!(optional(value)));
            match value {
                Some(value) => (text(value), EXIT_OK),
                None => (String::new(), EXIT_REJECTED),
            }
        }
        Reply::Append { length } => {
            fields.insert("length".into(), json!(length));
            (length.to_string(), EXIT_OK)
        }
        Reply::Incr { value } => {
            fields.insert("value".into(), json!(value));
            (value.to_string(), EXIT_OK)
        }
        Reply::Cas { swapped, current } => {
            fields.insert("swapped".into(), json!(swapped));
            fields.insert("current".into(), json!(optional(current)));
            let current = optional(current).unwrap_or_else(|| "(absent)".into());
            if *swapped {
                (format!("swapped: {current}"), EXIT_OK)
            } else {
                (
                    format!("not swapped: the value is {current}"),
                    EXIT_REJECTED,
                )
            }
        }
        Reply::Scan { entries, more } => {
            let list: Vec<Value> = entries
                .iter()
                .map(|(k, v)| json!({"key": text(k), "value": text(v)}))
                .collect();
            fields.insert("entries".into(), Value::Array(list));
            fields.insert("more".into(), json!(more));
            let lines: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{} {}", text(k), text(v)))
                .collect();
            (lines.join("\n"), EXIT_OK)
        }
        Reply::LeaseGranted {
            name,
            ttl_ms,
            expires_at,
        } => {
            fields.insert("name".into(), json!(name));
            fields.insert("ttl_ms".into(), json!(ttl_ms));
            fields.insert("expires_at_ms".into(), json!(expires_at.0));
            (format!("lease {name} granted, ttl {ttl_ms} ms"), EXIT_OK)
        }
        Reply::LeaseKeptAlive { name, expires_at } => {
            fields.insert("name".into(), json!(name));
            fields.insert("expires_at_ms".into(), json!(expires_at.0));
            (format!("lease {name} kept alive"), EXIT_OK)
        }
        Reply::LeaseRevoked { name, keys_deleted } => {
            fields.insert("name".into(), json!(name));
            fields.insert("keys_deleted".into(), json!(keys_deleted));
            (
                format!("lease {name} revoked, {keys_deleted} key(s) deleted"),
                EXIT_OK,
            )
        }
        Reply::Leases { leases } => {
            let list: Vec<Value> = leases
                .iter()
                .map(|l| json!({"name": l.name, "ttl_ms": l.ttl_ms, "expires_at_ms": l.expires_at.0, "keys": l.keys}))
                .collect();
            fields.insert("leases".into(), Value::Array(list));
            let lines: Vec<String> = leases
                .iter()
                .map(|l| format!("{} ttl={}ms keys={}", l.name, l.ttl_ms, l.keys))
                .collect();
            (lines.join("\n"), EXIT_OK)
        }
        Reply::SessionOpened {
            session,
            ttl_ms,
            window,
            ..
        } => {
            fields.insert("session_id".into(), json!(session.0));
            fields.insert("ttl_ms".into(), json!(ttl_ms));
            fields.insert("window".into(), json!(window));
            (format!("session {} opened", session.0), EXIT_OK)
        }
        Reply::SessionKeptAlive { ttl_ms } => {
            fields.insert("ttl_ms".into(), json!(ttl_ms));
            ("session kept alive".into(), EXIT_OK)
        }
        Reply::SessionClosed => ("session closed".into(), EXIT_OK),
        Reply::Ticked => (String::new(), EXIT_OK),
        Reply::AlarmDisarmed { was_raised } => {
            fields.insert("was_raised".into(), json!(was_raised));
            let human = if *was_raised {
                "alarm NOSPACE disarmed"
            } else {
                "no alarm was raised"
            };
            (human.into(), EXIT_OK)
        }
        Reply::Rejected(rejection) => {
            fields.insert("error".into(), json!(rejection.to_string()));
            (format!("rejected: {rejection}"), EXIT_REJECTED)
        }
    }
}

async fn mutate(
    client: &Client,
    once: &Once,
    command: Command,
) -> anyhow::Result<Result<Completed, ClientError>> {
    let Some(path) = &once.session_file else {
        let key = once.idempotency_key.clone().map(String::into_bytes);
        return Ok(client.execute_once(command, key).await);
    };
    let session = saved_session_handle(client, path)?;
    if let Some(seq) = once.seq {
        return Ok(session.execute_seq(seq, None, command).await);
    }
    let (seq, first_incomplete) = SessionFile::update(path, |file| {
        let seq = file.next_seq;
        file.next_seq += 1;
        file.pending.insert(seq);
        Ok((seq, file.pending.first().copied().unwrap_or(seq)))
    })?;
    let result = session
        .execute_seq(seq, Some(first_incomplete), command)
        .await;
    if !matches!(result, Err(ClientError::OutcomeUnknown { .. })) {
        SessionFile::update(path, |file| {
            file.pending.remove(&seq);
            Ok(())
        })?;
    }
    Ok(result)
}

/// A handle on the session saved at `path`, which stays open when the
/// handle is dropped (the file keeps using it).
fn saved_session_handle(client: &Client, path: &std::path::Path) -> anyhow::Result<Session> {
    let saved = SessionFile::read(path)?;
    let options = SessionOptions {
        ttl: Duration::from_millis(saved.ttl_ms),
        window: saved.window,
        keep_alive: false,
    };
    let session = Session::resume(
        client.clone(),
        SessionId(saved.session_id),
        Secret(saved.secret()?),
        options,
        saved.next_seq,
    );
    session.detach();
    Ok(session)
}

fn finish(printer: &Printer, result: Result<Completed, ClientError>) -> ExitCode {
    match result {
        Ok(done) => printer.completed(&done),
        Err(error) => printer.error(&error),
    }
}

/// Runs a client command; returns its exit code.
pub async fn run(connection: &Connection, command: ClientCommand) -> anyhow::Result<ExitCode> {
    let options = ClientOptions {
        deadline: connection.timeout,
        ..ClientOptions::default()
    };
    let client = Client::connect(connection.endpoints.clone(), options)?;
    let printer = Printer {
        output: connection.output,
    };
    let bytes = |s: &str| s.as_bytes().to_vec();
    Ok(match command {
        ClientCommand::Put {
            key,
            value,
            lease,
            once,
        } => finish(
            &printer,
            mutate(
                &client,
                &once,
                Command::Put {
                    key: bytes(&key),
                    value: value_or_stdin(value)?,
                    lease,
                },
            )
            .await?,
        ),
        ClientCommand::Del { key, once } => finish(
            &printer,
            mutate(&client, &once, Command::Delete { key: bytes(&key) }).await?,
        ),
        ClientCommand::Append { key, value, once } => finish(
            &printer,
            mutate(
                &client,
                &once,
                Command::Append {
                    key: bytes(&key),
                    value: value_or_stdin(value)?,
                },
            )
            .await?,
        ),
        ClientCommand::Incr { key, by, once } => finish(
            &printer,
            mutate(
                &client,
                &once,
                Command::Incr {
                    key: bytes(&key),
                    by,
                },
            )
            .await?,
        ),
        ClientCommand::Cas {
            key,
            expected,
            new,
            absent,
            once,
        } => {
            let expected = (!absent).then(|| bytes(&expected));
            finish(
                &printer,
                mutate(
                    &client,
                    &once,
                    Command::Cas {
                        key: bytes(&key),
                        expected,
                        new: bytes(&new),
                    },
                )
                .await?,
            )
        }
        ClientCommand::Get { key, serializable } => read(
            &printer,
            client
                .read(Query::Get { key: bytes(&key) }, serializable)
                .await,
        ),
        ClientCommand::Scan { prefix, limit } => read(
            &printer,
            client
                .read(
                    Query::Scan {
                        prefix: bytes(&prefix),
                        limit,
                    },
                    false,
                )
                .await,
        ),
        ClientCommand::Lease(LeaseCommand::Grant { name, ttl, once }) => {
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            finish(
                &printer,
                mutate(&client, &once, Command::LeaseGrant { name, ttl_ms }).await?,
            )
        }
        ClientCommand::Lease(LeaseCommand::Keepalive { name, once }) => finish(
            &printer,
            mutate(&client, &once, Command::LeaseKeepAlive { name }).await?,
        ),
        ClientCommand::Lease(LeaseCommand::Revoke { name, once }) => finish(
            &printer,
            mutate(&client, &once, Command::LeaseRevoke { name }).await?,
        ),
        ClientCommand::Lease(LeaseCommand::List) => {
            read(&printer, client.read(Query::LeaseList, false).await)
        }
        ClientCommand::Session(command) => session(&client, &printer, command).await?,
        ClientCommand::Status => status(&client, &printer).await,
        ClientCommand::Member(command) => member(&client, &printer, command).await,
        ClientCommand::Alarm(AlarmCommand::List) => alarms(&client, &printer).await,
        ClientCommand::Alarm(AlarmCommand::Disarm { once }) => finish(
            &printer,
            mutate(&client, &once, Command::AlarmDisarm).await?,
        ),
    })
}

fn read(printer: &Printer, result: Result<Reply, ClientError>) -> ExitCode {
    match result {
        Ok(reply) => {
            let mut fields = Map::new();
            fields.insert("outcome".into(), json!("ok"));
            let (human, code) = reply_fields(&reply, &mut fields);
            if code != EXIT_OK {
                fields.insert("outcome".into(), json!("not_found"));
            }
            printer.emit(fields, human);
            ExitCode::from(code)
        }
        Err(error) => printer.error(&error),
    }
}

async fn session(
    client: &Client,
    printer: &Printer,
    command: SessionCommand,
) -> anyhow::Result<ExitCode> {
    Ok(match command {
        SessionCommand::Open {
            ttl,
            window,
            session_file,
        } => {
            if session_file.exists() {
                return Err(anyhow!(
                    "{} exists: choose a new file, or close that session first",
                    session_file.display()
                ));
            }
            let options = SessionOptions {
                ttl,
                window,
                keep_alive: false,
            };
            match client.open_session(options).await {
                Ok(session) => {
                    session.detach();
                    let saved = SessionFile {
                        session_id: session.id().0,
                        secret: format!("{:032x}", session.secret().0),
                        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                        window,
                        next_seq: 1,
                        pending: Default::default(),
                    };
                    SessionFile::create(&session_file, &saved)?;
                    let mut fields = Map::new();
                    fields.insert("outcome".into(), json!("applied"));
                    fields.insert("session_id".into(), json!(saved.session_id));
                    fields.insert("ttl_ms".into(), json!(saved.ttl_ms));
                    fields.insert("window".into(), json!(window));
                    printer.emit(
                        fields,
                        format!(
                            "session {} opened, saved to {}",
                            saved.session_id,
                            session_file.display()
                        ),
                    );
                    ExitCode::from(EXIT_OK)
                }
                Err(error) => printer.error(&error),
            }
        }
        SessionCommand::Keepalive { session_file } => {
            saved_session(client, printer, &session_file, true).await?
        }
        SessionCommand::Close { session_file } => {
            saved_session(client, printer, &session_file, false).await?
        }
    })
}

async fn saved_session(
    client: &Client,
    printer: &Printer,
    path: &std::path::Path,
    keep_alive: bool,
) -> anyhow::Result<ExitCode> {
    let session = saved_session_handle(client, path)?;
    let result = if keep_alive {
        session.keep_alive().await
    } else {
        session.close().await
    };
    Ok(match result {
        Ok(()) => {
            let mut fields = Map::new();
            fields.insert("outcome".into(), json!("applied"));
            printer.emit(
                fields,
                if keep_alive {
                    "session kept alive".into()
                } else {
                    "session closed".into()
                },
            );
            ExitCode::from(EXIT_OK)
        }
        Err(error) => printer.error(&error),
    })
}

async fn status(client: &Client, printer: &Printer) -> ExitCode {
    match client.status(None).await {
        Ok(status) => {
            let members: Vec<Value> = status
                .members
                .iter()
                .map(|m| json!({"id": m.id, "peer_address": m.peer_address, "client_address": m.client_address, "voter": m.voter}))
                .collect();
            let fields = json!({
                "outcome": "ok", "id": status.id, "leader_id": status.leader_id, "term": status.term,
                "is_leader": status.is_leader, "commit_index": status.commit_index,
                "applied_index": status.applied_index, "last_log_index": status.last_log_index,
                "snapshot_index": status.snapshot_index, "cluster_time_ms": status.cluster_time_ms,
                "sessions": status.sessions, "completion_records": status.completion_records,
                "idempotency_keys": status.idempotency_keys, "leases": status.leases, "keys": status.keys,
                "completion_record_bytes": status.completion_record_bytes,
                "idempotency_bytes": status.idempotency_bytes, "store_bytes": status.store_bytes,
                "alarms": status.alarms, "members": members,
            });
            let leader = status
                .leader_id
                .map_or_else(|| "none".to_string(), |id| id.to_string());
            let mut human = format!(
                "node {} ({}), leader {leader}, term {}, commit {}, applied {}, sessions {}, keys {}",
                status.id,
                if status.is_leader {
                    "leader"
                } else {
                    "follower"
                },
                status.term,
                status.commit_index.map_or("-".into(), |i| i.to_string()),
                status.applied_index.map_or("-".into(), |i| i.to_string()),
                status.sessions,
                status.keys,
            );
            if !status.alarms.is_empty() {
                human.push_str(&format!(", alarms {}", status.alarms.join(",")));
            }
            for member in &status.members {
                human.push_str(&format!(
                    "\n  member {} peer={} client={}{}",
                    member.id,
                    member.peer_address,
                    member.client_address,
                    if member.voter { "" } else { " (learner)" }
                ));
            }
            let Value::Object(fields) = fields else {
                return ExitCode::from(EXIT_ERROR);
            };
            printer.emit(fields, human);
            ExitCode::from(EXIT_OK)
        }
        Err(error) => printer.error(&error),
    }
}

async fn alarms(client: &Client, printer: &Printer) -> ExitCode {
    let status = match client.status(None).await {
        Ok(status) => status,
        Err(error) => return printer.error(&error),
    };
    let leader = match (status.is_leader, status.leader_client_address.as_str()) {
        (false, address) if !address.is_empty() => client.status(Some(address)).await,
        _ => Ok(status),
    };
    match leader {
        Ok(status) => {
            let mut fields = Map::new();
            fields.insert("outcome".into(), json!("ok"));
            fields.insert("alarms".into(), json!(status.alarms));
            printer.emit(fields, status.alarms.join("\n"));
            ExitCode::from(EXIT_OK)
        }
        Err(error) => printer.error(&error),
    }
}

async fn member(client: &Client, printer: &Printer, command: MemberCommand) -> ExitCode {
    let result = match command {
        MemberCommand::Add {
            id,
            peer,
            client: address,
        } => client.add_member(id, &peer, &address).await,
        MemberCommand::Remove { id } => client.remove_member(id).await,
        MemberCommand::List => client.status(None).await.map(|status| status.members),
    };
    match result {
        Ok(members) => {
            let list: Vec<Value> = members
                .iter()
                .map(|m| json!({"id": m.id, "peer_address": m.peer_address, "client_address": m.client_address, "voter": m.voter}))
                .collect();
            let human: Vec<String> = members
                .iter()
                .map(|m| {
                    format!(
                        "{} peer={} client={}{}",
                        m.id,
                        m.peer_address,
                        m.client_address,
                        if m.voter { "" } else { " (learner)" }
                    )
                })
                .collect();
            let mut fields = Map::new();
            fields.insert("outcome".into(), json!("ok"));
            fields.insert("members".into(), Value::Array(list));
            printer.emit(fields, human.join("\n"));
            ExitCode::from(EXIT_OK)
        }
        Err(error) => printer.error(&error),
    }
}
