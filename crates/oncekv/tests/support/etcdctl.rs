//! `etcdctl` (Debian's etcd-client) as the etcd API tests run it: one
//! run with its output and exit code, stopped if it outlives 30 s
//! ([`etcdctl`]); the [`Normaliser`] that rewrites what legitimately
//! differs between two servers' transcripts; and the prerequisites, a real
//! etcd beside the node ([`reference`]) that answers ([`answering`]).

use super::{Dependency, eventually, missing_dependency};
use oncekv_harness::testing::{EtcdProcess, on_path};
use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// What one `etcdctl` run printed, and its exit code.
#[derive(Debug, PartialEq, Eq)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `etcdctl ARGS` against `endpoint` with `stdin`, and stops it if it
/// has not ended within 30 s (a watch the server does not end).
pub fn etcdctl(endpoint: &str, args: &[&str], stdin: &str) -> Run {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "--command-timeout", "10s"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run etcdctl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let guard = std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(30)).is_err() {
            // Still running: end it (only this child, by its id).
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    });
    let output = child.wait_with_output().expect("etcdctl output");
    let _ = done.send(());
    let _ = guard.join();
    // The client's own retry warnings are JSON log lines with times in
    // them; the error it ends with is what is compared.
    let stderr = String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| !line.starts_with("{\"level\""))
        .collect::<Vec<_>>()
        .join("\n");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr,
    }
}

/// Rewrites what legitimately differs between two servers: the header's
/// ids, term and revision are dropped, and each key revision (create or
/// mod) is replaced by its rank among the key revisions seen so far in
/// the transcript (both servers give later writes higher revisions, so
/// the ranks agree where the histories do); lease IDs likewise.
#[derive(Default)]
pub struct Normaliser {
    ranks: HashMap<String, usize>,
    leases: HashMap<String, usize>,
}

/// Whether `word` is a lease ID as etcdctl prints it (16 hex digits).
pub fn is_lease_id(word: &str) -> bool {
    word.len() == 16 && word.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Normaliser {
    /// A lease ID (16 hex digits) as its rank among the leases seen.
    pub fn lease(&mut self, hex: &str) -> String {
        let next = self.leases.len() + 1;
        format!(
            "lease-{}",
            self.leases.entry(hex.to_string()).or_insert(next)
        )
    }

    /// A line of text with its lease IDs ranked and a lease's remaining
    /// time (which may differ by a second) dropped.
    pub fn words(&mut self, line: &str) -> String {
        let line = match line.find("remaining(") {
            Some(at) => {
                let end = line[at..].find(')').map_or(line.len(), |e| at + e + 1);
                format!("{}remaining(..){}", &line[..at], &line[end..])
            }
            None => line.to_string(),
        };
        line.split(' ')
            .map(|word| {
                if is_lease_id(word) {
                    self.lease(word)
                } else {
                    word.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn rank(&mut self, revision: &str) -> String {
        let next = self.ranks.len() + 1;
        format!(
            "r{}",
            self.ranks.entry(revision.to_string()).or_insert(next)
        )
    }

    pub fn json(&mut self, value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("header");
                for (name, field) in map.iter_mut() {
                    if name == "create_revision" || name == "mod_revision" {
                        *field = serde_json::Value::String(self.rank(&field.to_string()));
                    } else if name == "lease" && field.as_i64().is_some_and(|id| id > 0) {
                        let hex = format!("{:016x}", field.as_i64().unwrap_or(0));
                        *field = serde_json::Value::String(self.lease(&hex));
                    } else {
                        self.json(field);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|item| self.json(item)),
            _ => {}
        }
    }

    pub fn text(&mut self, text: &str) -> String {
        text.lines()
            .map(|line| {
                if let Ok(mut value) = serde_json::from_str::<serde_json::Value>(line) {
                    self.json(&mut value);
                    return value.to_string();
                }
                // `-w fields`: one `"Name" : value` per line.
                let field = line.split(" : ").collect::<Vec<_>>();
                match field.as_slice() {
                    [
                        "\"ClusterID\"" | "\"MemberID\"" | "\"Revision\"" | "\"RaftTerm\"",
                        _,
                    ] => String::new(),
                    [name @ ("\"CreateRevision\"" | "\"ModRevision\""), revision] => {
                        format!("{name} : {}", self.rank(revision))
                    }
                    _ => self.words(line),
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Waits until `endpoint` answers `etcdctl get`.
pub async fn answering(endpoint: &str) {
    let endpoint = endpoint.to_string();
    eventually(Duration::from_secs(30), "etcdctl to be answered", || {
        let endpoint = endpoint.clone();
        async move { (etcdctl(&endpoint, &["get", "ready"], "").code == 0).then_some(()) }
    })
    .await;
}

/// The prerequisites, or `None` once their absence is reported.
pub fn reference(test: &str) -> Option<EtcdProcess> {
    if on_path("etcdctl").is_none() {
        missing_dependency(test, Dependency::Etcdctl, "no etcdctl binary on PATH");
        return None;
    }
    let etcd = EtcdProcess::start();
    if etcd.is_none() {
        missing_dependency(test, Dependency::Etcd, "no etcd binary on PATH");
    }
    etcd
}
