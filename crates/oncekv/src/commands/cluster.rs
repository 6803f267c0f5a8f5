//! The cluster commands: `status`, `alarm list` and `member`.

use super::*;

pub(super) async fn status(client: &Client, printer: &Printer) -> ExitCode {
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

pub(super) async fn alarms(client: &Client, printer: &Printer) -> ExitCode {
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

pub(super) async fn member(client: &Client, printer: &Printer, command: MemberCommand) -> ExitCode {
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
