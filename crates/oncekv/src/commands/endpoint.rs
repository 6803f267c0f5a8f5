//! `endpoint health` and `endpoint status`: every endpoint (or, with
//! `--cluster`, every member) asked on its own, in a table, as `etcdctl
//! endpoint health/status` prints them.

use super::output::{Printer, outcome_of};
use super::{EXIT_ERROR, EXIT_OK};
use clap::Subcommand;
use oncekv_client::{Client, ClientError};
use serde_json::{Map, Value, json};
use std::process::ExitCode;
use std::time::Instant;

/// Endpoint commands. Each exits 0 when every endpoint answered; 13 when
/// every one that did not was refused for the caller (not authenticated,
/// or not permitted); 1 otherwise.
#[derive(Debug, Subcommand)]
pub enum EndpointCommand {
    /// Whether each endpoint is serving (knows a leader and has applied
    /// what it knows committed); exit 1 if any is not (13 if each that is
    /// not refused the caller).
    Health {
        /// Ask every member the cluster lists, not only --endpoints.
        #[arg(long)]
        cluster: bool,
    },
    /// Each endpoint's id, leader, term, indexes and sizes (the admin role
    /// once authentication is enabled): exit 13 if every endpoint that
    /// failed refused the caller (not authenticated or not permitted), 1
    /// if any failed otherwise.
    Status {
        /// Ask every member the cluster lists, not only --endpoints.
        #[arg(long)]
        cluster: bool,
    },
}

/// The addresses to ask: the given endpoints, or every member's.
async fn targets(client: &Client, endpoints: &[String], cluster: bool) -> Vec<String> {
    if !cluster {
        return endpoints.to_vec();
    }
    match client.status(None).await {
        Ok(status) if !status.members.is_empty() => status
            .members
            .into_iter()
            .map(|m| m.client_address)
            .collect(),
        _ => endpoints.to_vec(),
    }
}

fn table(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            row.iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What endpoints that did not answer add up to.
#[derive(Default)]
struct Failures {
    any: bool,
    /// Some failed for another reason than a refusal of the caller.
    other: bool,
}

impl Failures {
    /// One endpoint's failure: `Some(error)` if the call failed, `None`
    /// if it answered but not as hoped (not serving).
    fn add(&mut self, error: Option<&ClientError>) {
        self.any = true;
        let denied = error.is_some_and(|e| outcome_of(e).1 == crate::exit::DENIED);
        self.other |= !denied;
    }

    /// The exit code: 0 when none failed, 13 when every failure was a
    /// refusal of the caller (as a single call refused so would exit),
    /// else 1.
    fn code(&self) -> u8 {
        match (self.any, self.other) {
            (false, _) => EXIT_OK,
            (true, false) => crate::exit::DENIED,
            (true, true) => EXIT_ERROR,
        }
    }
}

/// Runs an `endpoint` command.
pub(super) async fn endpoint(
    client: &Client,
    printer: &Printer,
    endpoints: &[String],
    command: EndpointCommand,
) -> ExitCode {
    match command {
        EndpointCommand::Health { cluster } => {
            let mut rows = vec![vec![
                "ENDPOINT".to_string(),
                "HEALTH".into(),
                "TOOK".into(),
                "ERROR".into(),
            ]];
            let mut list = Vec::new();
            let mut failures = Failures::default();
            for address in targets(client, endpoints, cluster).await {
                let started = Instant::now();
                let answer = client.health(&address).await;
                let took = format!("{:.1?}", started.elapsed());
                let (healthy, error) = match &answer {
                    Ok(true) => (true, String::new()),
                    Ok(false) => (false, "not serving: no leader, or applying".to_string()),
                    Err(error) => (false, error.to_string()),
                };
                if !healthy {
                    failures.add(answer.as_ref().err());
                }
                list.push(
                    json!({"endpoint": address, "health": healthy, "took": took, "error": error}),
                );
                rows.push(vec![address, healthy.to_string(), took, error]);
            }
            let mut fields = Map::new();
            fields.insert("endpoints".into(), Value::Array(list));
            printer.emit(fields, table(&rows));
            ExitCode::from(failures.code())
        }
        EndpointCommand::Status { cluster } => {
            let mut rows = vec![
                [
                    "ENDPOINT", "ID", "LEADER", "TERM", "COMMIT", "APPLIED", "KEYS", "STORE",
                    "SESSIONS", "ERROR",
                ]
                .map(String::from)
                .to_vec(),
            ];
            let mut list = Vec::new();
            let mut failures = Failures::default();
            for address in targets(client, endpoints, cluster).await {
                match client.status(Some(&address)).await {
                    Ok(s) => {
                        let index = |i: Option<u64>| i.map_or("-".to_string(), |i| i.to_string());
                        let leader = s.leader_id.map_or("none".to_string(), |id| {
                            if s.is_leader {
                                format!("{id} (this)")
                            } else {
                                id.to_string()
                            }
                        });
                        list.push(json!({
                            "endpoint": address, "id": s.id, "leader_id": s.leader_id,
                            "is_leader": s.is_leader, "term": s.term, "commit_index": s.commit_index,
                            "applied_index": s.applied_index, "keys": s.keys,
                            "store_bytes": s.store_bytes, "sessions": s.sessions,
                        }));
                        rows.push(vec![
                            address,
                            s.id.to_string(),
                            leader,
                            s.term.to_string(),
                            index(s.commit_index),
                            index(s.applied_index),
                            s.keys.to_string(),
                            s.store_bytes.to_string(),
                            s.sessions.to_string(),
                            String::new(),
                        ]);
                    }
                    Err(error) => {
                        failures.add(Some(&error));
                        list.push(json!({
                            "endpoint": address, "outcome": outcome_of(&error).0,
                            "error": error.to_string(),
                        }));
                        let mut row = vec![address];
                        row.extend(std::iter::repeat_n("-".to_string(), 8));
                        row.push(error.to_string());
                        rows.push(row);
                    }
                }
            }
            let mut fields = Map::new();
            fields.insert("endpoints".into(), Value::Array(list));
            printer.emit(fields, table(&rows));
            ExitCode::from(failures.code())
        }
    }
}
