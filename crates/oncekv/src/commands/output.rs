//! How a client command reports: one human line or one JSON object per
//! answer ([`Printer`]), the fields of each reply, and values read from
//! standard input.

use super::*;

pub(super) struct Printer {
    pub(super) output: Output,
}

/// Most bytes read from standard input as a value: far above any value a
/// server accepts (it refuses oversized values with a clear error), low
/// enough that a runaway pipe cannot exhaust memory.
const STDIN_VALUE_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// The value given on the command line, or else all of standard input.
pub(super) fn value_or_stdin(value: Option<String>) -> anyhow::Result<Vec<u8>> {
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

pub(super) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Printer {
    pub(super) fn emit(&self, fields: Map<String, Value>, human: String) {
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
    pub(super) fn error(&self, error: &ClientError) -> ExitCode {
        let (outcome, code) = outcome_of(error);
        let mut fields = Map::new();
        fields.insert("outcome".into(), json!(outcome));
        let text = error_text(error);
        fields.insert("error".into(), json!(text));
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
                last_answer,
            } => {
                fields.insert("attempts".into(), json!(attempts));
                if let Some(answer) = last_answer {
                    fields.insert("last_answer".into(), json!(outcome_of(answer).0));
                }
                if let Some(id) = request_id {
                    fields.insert("request_id".into(), json!(id.to_string()));
                }
            }
            _ => {}
        }
        match self.output {
            Output::Json => sayln!("{}", Value::Object(fields)),
            Output::Text => eprintln!("{outcome}: {text}"),
        }
        ExitCode::from(code)
    }

    /// Prints a completed mutation and returns its exit code.
    pub(super) fn completed(&self, done: &Completed) -> ExitCode {
        let mut fields = Map::new();
        fields.insert(
            "outcome".into(),
            json!(if done.replayed { "replayed" } else { "applied" }),
        );
        fields.insert("applied_index".into(), json!(done.applied_index));
        fields.insert("attempts".into(), json!(done.attempts));
        let (mut human, code) = reply_fields(&done.reply, &mut fields);
        if matches!(done.reply, Reply::Cas { swapped: false, .. }) {
            fields.insert("outcome".into(), json!("rejected"));
        }
        if done.replayed {
            // A retry answered from its completion record: say so, so the
            // answer is not taken for a second execution.
            human = match human.as_str() {
                "" | "OK" => "OK (replayed, original answer)".to_string(),
                _ => format!("{human} (replayed, original answer)"),
            };
        }
        self.emit(fields, human);
        ExitCode::from(code)
    }
}

/// An error's outcome (the `outcome` field of `-o json`) and exit code.
pub(super) fn outcome_of(error: &ClientError) -> (&'static str, u8) {
    match error {
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
        ClientError::Unauthenticated(_) => ("unauthenticated", crate::exit::DENIED),
        ClientError::PermissionDenied(_) => ("permission_denied", crate::exit::DENIED),
    }
}

/// What the command line says of `error`. An unknown outcome is told in
/// its own words: the refusal its last attempt met is named without the
/// "not applied" it carries on its own (true of that attempt, but not of
/// the request, which an earlier send may have applied).
fn error_text(error: &ClientError) -> String {
    let ClientError::OutcomeUnknown {
        request_id,
        attempts,
        last_answer: Some(answer),
    } = error
    else {
        return error.to_string();
    };
    let request = request_id
        .map(|id| format!(" of request {id}"))
        .unwrap_or_default();
    let refusal = match &**answer {
        ClientError::SessionExpired => "the session has expired".to_string(),
        ClientError::Unauthorized => "unauthorized: wrong session secret".to_string(),
        ClientError::Overloaded(full) => format!("overloaded: {full}"),
        ClientError::Unauthenticated(why) => format!("unauthenticated: {why}"),
        ClientError::PermissionDenied(why) => format!("permission denied: {why}"),
        other => other.to_string(),
    };
    let mut text = format!(
        "outcome unknown after {attempts} attempt(s){request}: this send was refused \
         ({refusal}), but an earlier send of the same request may have applied"
    );
    match &**answer {
        ClientError::SessionExpired => text.push_str(
            "; the session can no longer tell, so read the key to see, and open a new session",
        ),
        ClientError::Stale { .. } => {
            text.push_str("; its record was freed, so the cluster can no longer tell")
        }
        _ => {}
    }
    text
}

/// Adds a reply's result fields; returns the human line and exit code.
pub(super) fn reply_fields(reply: &Reply, fields: &mut Map<String, Value>) -> (String, u8) {
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
        Reply::Get { value, meta } => {
            fields.insert("value".into(), json!(optional(value)));
            if let Some(meta) = meta {
                insert_meta(fields, meta);
            }
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
        Reply::Scan { entries, more } | Reply::Range { entries, more, .. } => {
            if let Reply::Range { count, .. } = reply {
                fields.insert("count".into(), json!(count));
            }
            let list: Vec<Value> = entries
                .iter()
                .map(|kv| {
                    let mut entry = Map::new();
                    entry.insert("key".into(), json!(text(&kv.key)));
                    entry.insert("value".into(), json!(text(&kv.value)));
                    insert_meta(&mut entry, &kv.meta);
                    Value::Object(entry)
                })
                .collect();
            fields.insert("entries".into(), Value::Array(list));
            fields.insert("more".into(), json!(more));
            let lines: Vec<String> = entries
                .iter()
                .map(|kv| format!("{} {}", text(&kv.key), text(&kv.value)))
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
        Reply::AlarmSet { changed } => {
            fields.insert("changed".into(), json!(changed));
            let human = if *changed {
                "alarm changed"
            } else {
                "alarm unchanged"
            };
            (human.into(), EXIT_OK)
        }
        Reply::AuthChanged => ("OK".into(), EXIT_OK),
        Reply::UserPurged { sessions, keys } => {
            fields.insert("sessions_closed".into(), json!(sessions));
            fields.insert("keys_forgotten".into(), json!(keys));
            let human = format!("closed {sessions} sessions, forgot {keys} idempotency keys");
            (human, EXIT_OK)
        }
        Reply::Auth(view) => {
            fields.insert("enabled".into(), json!(view.enabled));
            let state = if view.enabled { "enabled" } else { "disabled" };
            (format!("authentication {state}"), EXIT_OK)
        }
        Reply::Rejected(rejection) => {
            fields.insert("error".into(), json!(rejection.to_string()));
            (format!("rejected: {rejection}"), EXIT_REJECTED)
        }
        Reply::Txn { succeeded, results } => {
            fields.insert("succeeded".into(), json!(succeeded));
            let mut lines = vec![if *succeeded { "SUCCESS" } else { "FAILURE" }.to_string()];
            let mut list = Vec::new();
            for result in results {
                let mut op = Map::new();
                let (human, _) = reply_fields(result, &mut op);
                list.push(Value::Object(op));
                lines.push(if human.is_empty() {
                    "(absent)".into()
                } else {
                    human
                });
            }
            fields.insert("results".into(), Value::Array(list));
            let code = if *succeeded { EXIT_OK } else { EXIT_REJECTED };
            (lines.join("\n"), code)
        }
        Reply::DeletePrefix { deleted } => {
            fields.insert("deleted".into(), json!(deleted));
            (format!("{deleted} key(s) deleted"), EXIT_OK)
        }
        Reply::Compacted { revision } => {
            fields.insert("compacted".into(), json!(revision));
            (
                format!("history compacted up to revision {revision}"),
                EXIT_OK,
            )
        }
    }
}

/// A key's revisions, as fields.
fn insert_meta(fields: &mut Map<String, Value>, meta: &oncekv_client::KeyMeta) {
    fields.insert("create_revision".into(), json!(meta.create_revision));
    fields.insert("mod_revision".into(), json!(meta.mod_revision));
    fields.insert("version".into(), json!(meta.version));
}
