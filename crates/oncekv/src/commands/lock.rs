//! `oncekv lock` and `oncekv elect`: a distributed lock held while a
//! command runs, and leader elections (the client's
//! [`oncekv_client::Lock`] and [`oncekv_client::Election`]).

use super::*;
use oncekv_client::{Election, Leader, Lock, Ownership};

/// `oncekv lock`.
#[derive(Debug, Args)]
#[command(after_help = "\
Waits until lock NAME is free, then runs COMMAND holding it; releases it
when COMMAND exits and exits with COMMAND's exit code (128 + the signal's
number if a signal ended it). COMMAND's environment has:
  ONCEKV_LOCK_KEY       the holder's key, NAME/<owner id>
  ONCEKV_LOCK_REVISION  the fencing token: the key's create revision, higher
                        for every new holder, so a resource that keeps the
                        highest token it has seen can refuse a stale holder

The lock is a lease kept alive while COMMAND runs: if this process dies, the
lock is freed after --ttl. The lease is this holder's own: its name follows
from the holder's session secret, so no one can grant it first, and a key of
the holder's found on another lease is refused. Holders are served in the
order they asked.
SIGTERM is passed on to COMMAND. Interrupted while waiting, it leaves the
queue and exits 1 without running COMMAND; if the lock cannot be taken, it
exits with a code of the table in `oncekv --help`.

Example:
  oncekv lock backups -- sh -c './backup.sh --fence \"$ONCEKV_LOCK_REVISION\"'")]
pub struct LockArgs {
    /// The lock's name (its holders' keys are NAME/OWNER-ID).
    pub name: String,

    /// The lease's time-to-live: how long after this process dies the lock
    /// is freed.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,

    /// The command to run while holding the lock, and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `oncekv elect`.
#[derive(Debug, Args)]
#[command(after_help = "\
Campaigns in election NAME with VALUE: waits until elected, prints it, and
holds the leadership until interrupted (SIGINT or SIGTERM), then resigns.
Campaigners are elected in the order they campaigned. If the leadership is
lost (the lease ended), says so and exits 1.

With --listen NAME: prints the leader now and on every change (\"no leader\"
when there is none), until interrupted.

Examples:
  oncekv elect scheduler node-a
  oncekv elect --listen scheduler")]
pub struct ElectArgs {
    /// The election's name (campaigners' keys are NAME/OWNER-ID).
    pub name: String,

    /// The value to campaign with (the leader's value is what listeners
    /// see).
    #[arg(required_unless_present = "listen", conflicts_with = "listen")]
    pub value: Option<String>,

    /// Print each leadership change instead of campaigning.
    #[arg(long, short = 'l')]
    pub listen: bool,

    /// The lease's time-to-live: how long after this process dies its
    /// leadership ends.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
}

/// SIGINT and SIGTERM, caught from the start (so a signal that comes
/// between two waits is not lost, nor ends the process unreleased).
struct Interrupts {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn new() -> std::io::Result<Interrupts> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Interrupts {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// The next of either.
    async fn recv(&mut self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal;
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
        }
    }
}

async fn open_session(client: &Client, printer: &Printer) -> Result<Session, ExitCode> {
    client
        .open_session(SessionOptions::default().with_window(4))
        .await
        .map_err(|error| printer.error(&error))
}

fn ownership_fields(name: &str, held: &Ownership) -> Map<String, Value> {
    let mut fields = Map::new();
    fields.insert("name".into(), json!(name));
    fields.insert("key".into(), json!(output::text(&held.key)));
    fields.insert("revision".into(), json!(held.revision));
    fields
}

/// The exit code of a finished COMMAND: its own, or 128 + its signal.
fn child_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(1),
        (None, None) => EXIT_ERROR,
    }
}

/// Passes a signal on to the child.
fn forward(child: &tokio::process::Child, signal: nix::sys::signal::Signal) {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// `oncekv lock NAME -- COMMAND`.
pub(super) async fn lock(
    client: &Client,
    printer: &Printer,
    args: LockArgs,
) -> anyhow::Result<ExitCode> {
    let mut interrupts = Interrupts::new()?;
    let session = match open_session(client, printer).await {
        Ok(session) => session,
        Err(code) => return Ok(code),
    };
    let mut lock = Lock::new(&session, &args.name, args.ttl);
    let acquired = tokio::select! {
        acquired = lock.acquire() => acquired,
        _ = interrupts.recv() => {
            // Leave the queue rather than wait for the lease to end.
            let _ = lock.unlock().await;
            let _ = session.close().await;
            eprintln!("interrupted: lock {} not acquired, COMMAND not run", args.name);
            return Ok(ExitCode::from(EXIT_ERROR));
        }
    };
    let held = match acquired {
        Ok(held) => held,
        Err(error) => {
            let _ = lock.unlock().await;
            let _ = session.close().await;
            return Ok(printer.error(&error));
        }
    };
    if printer.output == Output::Json {
        let mut fields = ownership_fields(&args.name, &held);
        fields.insert("outcome".into(), json!("acquired"));
        printer.emit(fields, String::new());
    }
    let spawned = tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("ONCEKV_LOCK_KEY", output::text(&held.key))
        .env("ONCEKV_LOCK_REVISION", held.revision.to_string())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            let _ = lock.unlock().await;
            let _ = session.close().await;
            eprintln!("error: cannot run {:?}: {error}", args.command[0]);
            return Ok(ExitCode::from(EXIT_ERROR));
        }
    };
    let mut lost_said = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            // SIGTERM is passed on to COMMAND, which decides when to exit
            // (a terminal's ^C reaches it already, as its process group's).
            signal = interrupts.recv() => {
                if signal == nix::sys::signal::Signal::SIGTERM {
                    forward(&child, signal);
                }
            }
            result = lock.lost(), if !lost_said => {
                lost_said = true;
                if result.is_ok() {
                    eprintln!(
                        "warning: lock {} lost (its lease ended) while COMMAND runs",
                        args.name
                    );
                }
            }
        }
    };
    let released = lock.unlock().await;
    let _ = session.close().await;
    if let Err(error) = &released {
        eprintln!("warning: releasing lock {}: {error}", args.name);
    }
    match status {
        Ok(status) => Ok(ExitCode::from(child_code(status))),
        Err(error) => {
            eprintln!("error: waiting for COMMAND: {error}");
            Ok(ExitCode::from(EXIT_ERROR))
        }
    }
}

fn leader_line(printer: &Printer, leader: &Option<Leader>) {
    let mut fields = Map::new();
    let human = match leader {
        Some(leader) => {
            fields.insert("leader".into(), json!(output::text(&leader.value)));
            fields.insert("key".into(), json!(output::text(&leader.key)));
            fields.insert("revision".into(), json!(leader.revision));
            format!(
                "leader {} (key {}, revision {})",
                output::text(&leader.value),
                output::text(&leader.key),
                leader.revision
            )
        }
        None => {
            fields.insert("leader".into(), Value::Null);
            "no leader".to_string()
        }
    };
    printer.emit(fields, human);
}

/// `oncekv elect NAME VALUE` and `oncekv elect --listen NAME`.
pub(super) async fn elect(
    client: &Client,
    printer: &Printer,
    args: ElectArgs,
) -> anyhow::Result<ExitCode> {
    let mut interrupts = Interrupts::new()?;
    if args.listen {
        let mut observer = client.observe_election(&args.name);
        loop {
            tokio::select! {
                leader = observer.next() => match leader {
                    Ok(leader) => leader_line(printer, &leader),
                    Err(error) => return Ok(printer.error(&error)),
                },
                _ = interrupts.recv() => return Ok(ExitCode::from(EXIT_OK)),
            }
        }
    }
    let value = args.value.unwrap_or_default();
    let session = match open_session(client, printer).await {
        Ok(session) => session,
        Err(code) => return Ok(code),
    };
    let mut election = Election::new(&session, &args.name, args.ttl);
    let campaigned = tokio::select! {
        campaigned = election.campaign(&value) => campaigned,
        _ = interrupts.recv() => {
            let _ = election.resign().await;
            let _ = session.close().await;
            return Ok(ExitCode::from(EXIT_OK));
        }
    };
    let held = match campaigned {
        Ok(held) => held,
        Err(error) => {
            let _ = election.resign().await;
            let _ = session.close().await;
            return Ok(printer.error(&error));
        }
    };
    let mut fields = ownership_fields(&args.name, &held);
    fields.insert("outcome".into(), json!("elected"));
    fields.insert("value".into(), json!(value));
    printer.emit(
        fields,
        format!(
            "elected {value} (key {}, revision {})",
            output::text(&held.key),
            held.revision
        ),
    );
    let code = tokio::select! {
        lost = election.lost() => {
            match lost {
                Ok(()) => {
                    let mut fields = ownership_fields(&args.name, &held);
                    fields.insert("outcome".into(), json!("lost"));
                    printer.emit(fields, format!("lost the leadership of {}", args.name));
                    ExitCode::from(EXIT_ERROR)
                }
                Err(error) => printer.error(&error),
            }
        }
        _ = interrupts.recv() => {
            let resigned = election.resign().await;
            let mut fields = ownership_fields(&args.name, &held);
            fields.insert("outcome".into(), json!("resigned"));
            printer.emit(fields, format!("resigned {}", args.name));
            match resigned {
                Ok(()) => ExitCode::from(EXIT_OK),
                Err(error) => printer.error(&error),
            }
        }
    };
    let _ = session.close().await;
    Ok(code)
}
