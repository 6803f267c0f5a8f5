//! The client commands of `oncekv`: key-value operations, leases, sessions,
//! status and membership. Each prints a short human line or, with
//! `-o json`, one JSON object, and exits with a code that says what is
//! known (see `oncekv --help`).

use crate::session_file::SessionFile;
use anyhow::{Context as _, anyhow};
use clap::{Args, Subcommand};
use oncekv_client::{
    Client, ClientError, Command, Completed, EarlierSends, Query, Reply, Session, SessionOptions,
};
use oncekv_state::{Secret, SessionId};
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod auth;
mod cluster;
mod endpoint;
mod lock;
mod output;
mod session;
mod snapshot;
mod txn;
mod watch;

use auth::{AuthSwitch, RoleCommand, UserCommand};
use cluster::{alarms, member, status};
use endpoint::EndpointCommand;
use output::{Printer, reply_fields, value_or_stdin};
use session::{saved_session_handle, session};
use snapshot::SnapshotCommand;

/// The flags that reach a cluster, and the output format
/// (`oncekv_client::cli`, shared with `oncekv-bench`).
pub use oncekv_client::cli::{Connection, Output};

/// The exit codes client commands return (the table is [`crate::exit`]).
pub use crate::exit::{
    ERROR as EXIT_ERROR, OK as EXIT_OK, OVERLOADED as EXIT_OVERLOADED, REJECTED as EXIT_REJECTED,
    SESSION as EXIT_SESSION, UNKNOWN as EXIT_UNKNOWN,
};

/// How a mutating command is made exactly-once.
#[derive(Debug, Args)]
pub struct Once {
    /// Use (and advance) the session saved in FILE (see `session open`).
    #[arg(long, value_name = "FILE")]
    pub session_file: Option<PathBuf>,

    /// With --session-file: send exactly this sequence number (to retry a
    /// specific request by hand). A number the file has used before may
    /// have applied, so its retry ends with the original answer or
    /// unknown (exit 5), never "not applied" (also when the session has
    /// expired since: its records are gone, so only reading can tell).
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
    /// Print the value of KEY (exit 3 if absent); with -o json, its
    /// revisions too.
    Get {
        key: String,
        /// Read this node's state without a read-index round (may be stale).
        #[arg(long)]
        serializable: bool,
        /// Read KEY as it was at this revision (while the history reaches
        /// back that far; else exit 3, compacted).
        #[arg(long, value_name = "REVISION")]
        rev: Option<u64>,
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
        /// List the keys as they were at this revision.
        #[arg(long, value_name = "REVISION")]
        rev: Option<u64>,
    },
    /// Run a transaction read from standard input, exactly once (exit 3
    /// when a compare failed).
    #[command(long_about = TXN_HELP)]
    Txn {
        #[command(flatten)]
        once: Once,
    },
    /// Print every change to KEY (or under it, with --prefix) as it
    /// happens: one line "REVISION PUT KEY VALUE" or "REVISION DELETE KEY"
    /// each (-o json: one object each). Resumes across node failures
    /// without losing or repeating a change.
    Watch {
        key: String,
        /// Watch every key starting with KEY.
        #[arg(long)]
        prefix: bool,
        /// Start at this revision (exit 3 if compacted); by default, with
        /// the changes after now.
        #[arg(long, value_name = "REVISION", default_value_t = 0)]
        rev: u64,
        /// Print each change's previous value too.
        #[arg(long)]
        prev: bool,
        /// Exit after printing this many changes.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// Print progress notices ("REVISION PROGRESS") while idle.
        #[arg(long)]
        progress: bool,
    },
    /// Drop the history of changes at and below REVISION (reads of the
    /// past and watches from there are refused after; admin only once
    /// authentication is on). The history is also compacted on its own,
    /// past its bounds (`serve --history-*`).
    Compact {
        revision: u64,
        #[command(flatten)]
        once: Once,
    },
    /// Leases: named TTLs that own keys.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Run COMMAND while holding lock NAME (its fencing revision in
    /// ONCEKV_LOCK_REVISION).
    Lock(lock::LockArgs),
    /// Campaign in election NAME with VALUE, or --listen to its leaders.
    Elect(lock::ElectArgs),
    /// Sessions saved in files, for exactly-once across invocations.
    #[command(subcommand)]
    Session(SessionCommand),
    /// This node's view of the cluster (the admin role once
    /// authentication is enabled); with several --endpoints, each
    /// endpoint's status in a table (as `endpoint status`: exit 13 if
    /// every endpoint that failed refused the caller, 1 if any failed
    /// otherwise).
    Status,
    /// Cluster membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// Alarms: NOSPACE is raised when a write would take the store past its
    /// byte quota (`serve --store-bytes-max`); writes that grow the store
    /// are then refused (exit 6) until keys are deleted and it is disarmed.
    #[command(subcommand)]
    Alarm(AlarmCommand),
    /// Users and their passwords (once authentication is enabled, admin
    /// only).
    #[command(subcommand)]
    User(UserCommand),
    /// Roles: permissions to read, write or both on keys or key prefixes.
    #[command(subcommand)]
    Role(RoleCommand),
    /// Whether the cluster enforces authentication and permissions.
    #[command(subcommand)]
    Auth(AuthSwitch),
    /// Each endpoint on its own: health (`grpc.health.v1`) or status, in a
    /// table.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// Backups: save the whole state from the leader, or seed a new
    /// cluster's nodes from a saved file.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

/// The long help of `oncekv txn`.
const TXN_HELP: &str = "Run a transaction read from standard input, exactly once: compares, a \
blank line, the operations run if all hold, a blank line, the operations run otherwise (exit 3 \
when a compare failed).

Compares: TARGET(\"KEY\") OP \"VALUE\", TARGET one of value, version, create, mod, exists; OP \
one of =, !=, <, >; \"PREFIX*\" compares every key under a prefix.

Operations: put KEY VALUE [--lease NAME], get KEY, del KEY, del --prefix PREFIX, \
scan PREFIX [LIMIT], append KEY VALUE, incr KEY [BY], cas KEY EXPECTED NEW, \
cas --absent KEY NEW. Words are split as a shell would; # starts a comment line.

Example:

  printf 'value(\"acct/a\") = \"100\"\\n\\nincr acct/a -30\\nincr acct/b 30\\n\\nget acct/a\\n' | oncekv txn";

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
    /// Raise a member's NOSPACE alarm by hand, as etcd's Alarm ACTIVATE
    /// does: writes that grow the store are refused (reads and deletes
    /// go on) until it is cleared or disarmed. Needs the admin role while
    /// authentication is enforced.
    Raise {
        /// The member the alarm is of (0, as etcd's clients send by
        /// default, names none in particular).
        #[arg(long, default_value_t = 0)]
        member: u64,
        #[command(flatten)]
        once: Once,
    },
    /// Clear a member's NOSPACE alarm raised by hand (and the quota's).
    Clear {
        /// The member the alarm is of.
        #[arg(long, default_value_t = 0)]
        member: u64,
        #[command(flatten)]
        once: Once,
    },
}

/// Lease commands. A lease is its granter's: while the cluster enforces
/// authentication, only its owner or an admin may renew, revoke, list or
/// attach keys to it (anyone else exits 13).
#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Create lease NAME living --ttl (e.g. 10s) unless kept alive; it is
    /// yours (a NAME another user holds is refused).
    Grant {
        name: String,
        /// How long it lives without a keep-alive (as `lock --ttl` and
        /// `session open --ttl`).
        #[arg(long, value_parser = humantime::parse_duration,
              required_unless_present = "ttl_positional", conflicts_with = "ttl_positional")]
        ttl: Option<Duration>,
        /// The same as --ttl (`lease grant NAME 10s`, the earlier form).
        #[arg(value_name = "TTL", value_parser = humantime::parse_duration, hide = true)]
        ttl_positional: Option<Duration>,
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
    /// List live leases (with authentication on: your own, or all for an
    /// admin).
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
        // A number the file says was used (below its next number, or
        // still awaited) is a resend: an earlier send may have applied, so
        // this one ends with its reply or unknown, never "not applied"
        // (whatever it meets: a session expired since, a freed record, a
        // cluster it cannot reach). Only a number never used before may
        // be told "not applied". It is awaited from now on, so that a
        // concurrent resend of it knows so too; numbers still awaited stay
        // unacknowledged, so their records are kept for their own retries.
        let (earlier, first_incomplete) = SessionFile::update(path, |file| {
            let used = seq < file.next_seq || file.pending.contains(&seq);
            file.pending.insert(seq);
            let first_incomplete = file.pending.first().copied().unwrap_or(seq);
            let earlier = if used {
                EarlierSends::MaybeDelivered
            } else {
                EarlierSends::None
            };
            Ok((earlier, first_incomplete))
        })?;
        let result = session
            .execute_seq(seq, Some(first_incomplete), command, earlier)
            .await;
        // A number given by hand that the cluster took (or may have taken)
        // is used: later automatic numbers go past it, so they never reuse
        // it for another command. One it refused outright stays free.
        let refused = matches!(
            result,
            Err(ClientError::SequenceGap { .. }
                | ClientError::Malformed(_)
                | ClientError::Invalid(_))
        );
        let unknown = matches!(result, Err(ClientError::OutcomeUnknown { .. }));
        SessionFile::update(path, |file| {
            if !refused {
                file.next_seq = file.next_seq.max(seq.saturating_add(1));
            }
            if unknown {
                file.pending.insert(seq);
            } else {
                file.pending.remove(&seq);
            }
            Ok(())
        })?;
        return Ok(result);
    }
    let (seq, first_incomplete) = SessionFile::update(path, |file| {
        let seq = file.next_seq;
        file.next_seq += 1;
        file.pending.insert(seq);
        Ok((seq, file.pending.first().copied().unwrap_or(seq)))
    })?;
    let result = session
        .execute_seq(seq, Some(first_incomplete), command, EarlierSends::None)
        .await;
    if !matches!(result, Err(ClientError::OutcomeUnknown { .. })) {
        SessionFile::update(path, |file| {
            file.pending.remove(&seq);
            Ok(())
        })?;
    }
    Ok(result)
}

fn finish(printer: &Printer, result: Result<Completed, ClientError>) -> ExitCode {
    match result {
        Ok(done) => printer.completed(&done),
        Err(error) => printer.error(&error),
    }
}

/// Runs a client command; returns its exit code.
pub async fn run(connection: &Connection, command: ClientCommand) -> anyhow::Result<ExitCode> {
    let client = Client::connect(connection.endpoints.clone(), connection.client_options()?)?;
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
                    value: (value_or_stdin(value)?).into(),
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
        ClientCommand::Get {
            key,
            serializable,
            rev,
        } => read(
            &printer,
            client
                .read(at(rev, Query::Get { key: bytes(&key) }), serializable)
                .await,
        ),
        ClientCommand::Scan { prefix, limit, rev } => read(
            &printer,
            client
                .read(
                    at(
                        rev,
                        Query::Scan {
                            prefix: bytes(&prefix),
                            limit,
                        },
                    ),
                    false,
                )
                .await,
        ),
        ClientCommand::Txn { once } => {
            let text = String::from_utf8(value_or_stdin(None)?)
                .context("the transaction on standard input is not UTF-8 text")?;
            let parsed = txn::parse(&text)?;
            finish(
                &printer,
                mutate(&client, &once, Command::Txn(parsed)).await?,
            )
        }
        ClientCommand::Watch {
            key,
            prefix,
            rev,
            prev,
            count,
            progress,
        } => {
            let args = watch::WatchArgs {
                key,
                prefix,
                rev,
                prev,
                count,
                progress,
            };
            watch::watch(&client, &printer, args).await
        }
        ClientCommand::Compact { revision, once } => finish(
            &printer,
            mutate(&client, &once, Command::Compact { revision }).await?,
        ),
        ClientCommand::Lease(LeaseCommand::Grant {
            name,
            ttl,
            ttl_positional,
            once,
        }) => {
            let ttl = ttl.or(ttl_positional).unwrap_or_default();
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
        ClientCommand::Lock(args) => lock::lock(&client, &printer, args).await?,
        ClientCommand::Elect(args) => lock::elect(&client, &printer, args).await?,
        ClientCommand::Session(command) => session(&client, &printer, command).await?,
        ClientCommand::Status if connection.endpoints.len() > 1 => {
            let each = EndpointCommand::Status { cluster: false };
            endpoint::endpoint(&client, &printer, &connection.endpoints, each).await
        }
        ClientCommand::Status => status(&client, &printer).await,
        ClientCommand::Member(command) => member(&client, &printer, command).await,
        ClientCommand::Alarm(AlarmCommand::List) => alarms(&client, &printer).await,
        ClientCommand::Alarm(AlarmCommand::Disarm { once }) => finish(
            &printer,
            mutate(&client, &once, Command::AlarmDisarm).await?,
        ),
        ClientCommand::Alarm(AlarmCommand::Raise { member, once }) => finish(
            &printer,
            mutate(
                &client,
                &once,
                Command::AlarmSet {
                    member,
                    raise: true,
                },
            )
            .await?,
        ),
        ClientCommand::Alarm(AlarmCommand::Clear { member, once }) => finish(
            &printer,
            mutate(
                &client,
                &once,
                Command::AlarmSet {
                    member,
                    raise: false,
                },
            )
            .await?,
        ),
        ClientCommand::User(command) => auth::user(&client, &printer, command).await?,
        ClientCommand::Role(command) => auth::role(&client, &printer, command).await,
        ClientCommand::Auth(command) => auth::auth(&client, &printer, command).await?,
        ClientCommand::Snapshot(command) => snapshot::snapshot(&client, &printer, command).await?,
        ClientCommand::Endpoint(command) => {
            endpoint::endpoint(&client, &printer, &connection.endpoints, command).await
        }
    })
}

/// `query` at `revision`, if given.
fn at(revision: Option<u64>, query: Query) -> Query {
    match revision {
        Some(revision) => Query::At {
            revision,
            query: Box::new(query),
        },
        None => query,
    }
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
