//! `oncekv session`: sessions saved in files (open, keep-alive, close,
//! show), and the handle on a saved session that mutating commands use.

use super::*;

/// A handle on the session saved at `path`, which stays open when the
/// handle is dropped (the file keeps using it).
pub(super) fn saved_session_handle(
    client: &Client,
    path: &std::path::Path,
) -> anyhow::Result<Session> {
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

pub(super) async fn session(
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

pub(super) async fn saved_session(
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
