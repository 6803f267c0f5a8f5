//! Data-driven script tests of the state machine: each file under
//! `tests/scripts/` holds one command per line with its expected outcome
//! after `=>`. Run with `ONCEKV_UPDATE_SCRIPTS=1` to rewrite the expectations
//! from the actual outcomes (then review the diff).
//!
//! Syntax, one per line (`#` starts a comment):
//! - `time MS` / `advance MS`: cluster time of the following entries;
//! - `open S ttl=MS window=N [secret=N]`: open a session called `S`;
//! - `[on S seq=N [ack=N] [secret=N]] [key=K] OP`: an operation, plain, on
//!   session `S` (the ack watermark defaults to `seq`) or under key `K`;
//! - OP is one of `put K V [lease=L]`, `get K`, `del K`, `append K V`,
//!   `incr K N`, `cas K EXPECTED NEW` (`-` for absent), `scan P [LIMIT]`,
//!   `range START END [LIMIT]` (END `-`: every key from START on),
//!   `lease-grant L MS`, `lease-keepalive L`, `lease-revoke L`,
//!   `lease-list`, `keepalive S`, `close S`, `tick`;
//! - `stats`: prints the state's counts; `bytes`: what its byte budgets
//!   count, and whether the `NOSPACE` alarm is raised;
//! - `alarm-disarm` (an OP): lowers the `NOSPACE` alarm;
//! - `limits NAME=N ...` (before any entry): starts over with these limits
//!   changed (`sessions_max`, `idempotency_keys_max`,
//!   `idempotency_bytes_max`, `session_record_bytes_max`,
//!   `record_bytes_max`, `store_bytes_max`, `scan_bytes_max`, `value_bytes_max`,
//!   `user_share_percent`, `admin_reserve_percent`).
//! - `get K rev=R`, `scan P [LIMIT] rev=R` and `range START END [LIMIT]
//!   rev=R`: read the store as it was at
//!   revision R; `get` prints the key's revisions as `@create/mod/version`;
//! - `txn CMP ... | OP, OP ... | OP, OP ...`: a transaction; a CMP is
//!   `TARGET(KEY)OP VALUE` (`TARGET(PREFIX*)` for a prefix,
//!   `TARGET(START..END)` for a range, `TARGET(START..)` without an end)
//!   with TARGET one of `value`, `version`, `create`, `mod`, `exists`,
//!   `lease` (`-` for none) and OP one of `=`, `!=`, `<`, `>`; an OP is
//!   any operation above, `delp PREFIX`, `delr START END` (END `-`: to the
//!   end), `putx K V|= [lease=L|lease=-|lease==]` (a put of an existing
//!   key, `=` keeping its value or its lease), or `{CMP ... | OP, ... |
//!   OP, ...}`, a transaction nested in the branch;
//! - `compact R` (an OP): drops the history at and below revision R;
//!   `events FROM`: prints the history's events from revision FROM;
//! - `nodedup`: switch deduplication off (the checkers' negative control).
//! - `as USER` (`as -` for nobody): the principal of the following entries;
//! - auth OPs: `auth-enable`, `auth-disable`, `auth-status`, `user-add U`,
//!   `user-del U`, `user-purge U`, `cert-revoke HEX`, `cert-unrevoke HEX`, `user-passwd U`, `user-grant U R`, `user-revoke U R`,
//!   `role-add R`, `role-del R`, `role-grant R read|write|readwrite K
//!   [prefix]`, `role-revoke R K [prefix]`.

use oncekv_state::{
    Access, AuthCommand, ClusterTime, Command, Compare, CompareOp, CompareTarget, Entry,
    IdempotencyKey, KeyRange, KeyScope, Limits, LogIndex, Origin, Outcome, Permission, Principal,
    Proposal, Query, Reply, Request, RequestHeader, RequestId, Secret, Seq, SessionId,
    StateMachine, TokenKey, Txn, TxnOp, Update, serial_hex,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

struct Runner {
    machine: StateMachine,
    next_index: u64,
    time: u64,
    principal: Option<Principal>,
    sessions: BTreeMap<String, (SessionId, Secret)>,
}

impl Runner {
    fn new() -> Runner {
        let limits = Limits {
            sessions_max: 3,
            idempotency_keys_max: 4,
            key_bytes_max: 16,
            value_bytes_max: 32,
            scan_limit_max: 3,
            ..Limits::default()
        };
        Runner {
            machine: StateMachine::new(limits),
            next_index: 1,
            time: 0,
            principal: None,
            sessions: BTreeMap::new(),
        }
    }

    fn apply(&mut self, request: Request) -> Outcome {
        let entry = Entry {
            index: LogIndex(self.next_index),
            proposal: Proposal {
                time: ClusterTime(self.time),
                principal: self.principal.clone(),
                request,
            },
        };
        self.next_index += 1;
        self.machine.apply(&entry)
    }

    /// The session called `name`; a name never opened stands for a session
    /// id that does not exist.
    fn session(&self, name: &str) -> Result<(SessionId, Secret), String> {
        Ok(self
            .sessions
            .get(name)
            .copied()
            .unwrap_or((SessionId(424_242), Secret(0))))
    }

    /// Runs one line; returns its printed outcome, or `None` for directives.
    fn run(&mut self, line: &str) -> Result<Option<String>, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((&first, rest)) = words.split_first() else {
            return Ok(None);
        };
        match first {
            "time" => {
                self.time = number(rest.first())?;
                return Ok(None);
            }
            "nodedup" => {
                let machine =
                    std::mem::replace(&mut self.machine, StateMachine::new(Limits::default()));
                self.machine = machine.without_dedup();
                return Ok(None);
            }
            "as" => {
                let name = rest.first().ok_or("as needs a user name or -")?;
                self.principal = (*name != "-").then(|| Principal(name.to_string()));
                return Ok(None);
            }
            "advance" => {
                self.time += number(rest.first())?;
                return Ok(None);
            }
            "limits" => {
                if self.next_index != 1 {
                    return Err("limits must come before the first entry".into());
                }
                let mut limits = self.machine.limits().clone();
                for (name, value) in options(rest)? {
                    let value = parse_u(value)?;
                    match name {
                        "sessions_max" => limits.sessions_max = value,
                        "idempotency_keys_max" => limits.idempotency_keys_max = value,
                        "idempotency_bytes_max" => limits.idempotency_bytes_max = value,
                        "session_record_bytes_max" => limits.session_record_bytes_max = value,
                        "record_bytes_max" => limits.record_bytes_max = value,
                        "store_bytes_max" => limits.store_bytes_max = value,
                        "scan_bytes_max" => limits.scan_bytes_max = value,
                        "value_bytes_max" => {
                            limits.value_bytes_max = usize::try_from(value)
                                .map_err(|_| format!("value_bytes_max {value} is too large"))?
                        }
                        "history_events_max" => limits.history_events_max = value,
                        "history_bytes_max" => limits.history_bytes_max = value,
                        "history_retention_ms" => limits.history_retention_ms = value,
                        "txn_ops_max" => limits.txn_ops_max = value as u32,
                        "user_share_percent" => {
                            limits.quotas.user_share_percent = u8::try_from(value)
                                .map_err(|_| format!("user_share_percent {value} is too large"))?
                        }
                        "admin_reserve_percent" => {
                            limits.quotas.admin_reserve_percent =
                                u8::try_from(value).map_err(|_| {
                                    format!("admin_reserve_percent {value} is too large")
                                })?
                        }
                        other => return Err(format!("unknown limit {other}")),
                    }
                }
                self.machine = StateMachine::new(limits);
                return Ok(None);
            }
            "bytes" => {
                let s = self.machine.stats();
                let mut alarm = if s.no_space_alarm { "NOSPACE" } else { "none" }.to_string();
                for member in self.machine.alarmed_members() {
                    let _ = write!(alarm, ",NOSPACE@{member}");
                }
                return Ok(Some(format!(
                    "records={} idempotency={} store={} alarm={alarm}",
                    s.completion_record_bytes, s.idempotency_bytes, s.store_bytes,
                )));
            }
            "events" => {
                let from = number(rest.first())?;
                let history = self.machine.kv().history();
                let mut out = format!("events compacted={}", history.compacted());
                match history.since(from) {
                    Err(rejection) => {
                        let _ = write!(out, " refused: {rejection}");
                    }
                    Ok(events) => {
                        for event in events {
                            match &event.value {
                                Some(stored) => {
                                    let _ = write!(
                                        out,
                                        " {}:put {}={}",
                                        event.revision,
                                        bytes(&event.key),
                                        bytes(&stored.value)
                                    );
                                }
                                None => {
                                    let _ = write!(
                                        out,
                                        " {}:del {}",
                                        event.revision,
                                        bytes(&event.key)
                                    );
                                }
                            }
                            if let Some(previous) = &event.previous {
                                let _ = write!(out, "(was {})", bytes(&previous.value));
                            }
                        }
                    }
                }
                return Ok(Some(out));
            }
            "stats" => {
                let s = self.machine.stats();
                return Ok(Some(format!(
                    "keys={} sessions={} records={} idempotency_keys={} leases={}",
                    s.keys, s.sessions, s.completion_records, s.idempotency_keys, s.leases
                )));
            }
            "open" => {
                let name = rest.first().ok_or("open needs a name")?.to_string();
                let opts = options(&rest[1..])?;
                let secret = Secret(
                    opts.get("secret")
                        .map_or(Ok(0xfeed), |v| parse_u(v))?
                        .into(),
                );
                let command = Command::OpenSession {
                    ttl_ms: opts.get("ttl").map_or(Ok(60_000), |v| parse_u(v))?,
                    window: opts.get("window").map_or(Ok(128), |v| parse_u(v))? as u32,
                    secret,
                };
                let outcome = self.apply(Request::plain(command));
                if let Outcome::Applied(Reply::SessionOpened { session, .. }) = &outcome {
                    self.sessions.insert(name, (*session, secret));
                }
                return Ok(Some(render(&outcome)));
            }
            _ => {}
        }
        let mut words = words.as_slice();
        let mut origin = Origin::Plain;
        if words.first() == Some(&"on") {
            let name = words.get(1).ok_or("on needs a session")?;
            let (session, mut secret) = self.session(name)?;
            let mut seq = None;
            let mut ack = None;
            let mut used = 2;
            for word in &words[2..] {
                match word.split_once('=') {
                    Some(("seq", v)) => seq = Some(parse_u(v)?),
                    Some(("ack", v)) => ack = Some(parse_u(v)?),
                    Some(("secret", v)) => secret = Secret(parse_u(v)?.into()),
                    _ => break,
                }
                used += 1;
            }
            let seq = seq.ok_or("on needs seq=")?;
            origin = Origin::Session(RequestHeader {
                id: RequestId {
                    session,
                    seq: Seq(seq),
                },
                secret,
                first_incomplete: Seq(ack.unwrap_or(seq)),
                attempt: 1,
            });
            words = &words[used..];
        } else if let Some(key) = words.first().and_then(|w| w.strip_prefix("key=")) {
            origin = Origin::Key(IdempotencyKey(key.as_bytes().to_vec()));
            words = &words[1..];
        }
        let command = if words.first() == Some(&"txn") {
            Command::Txn(self.txn(&words[1..])?)
        } else {
            self.command(words)?
        };
        Ok(Some(render(&self.apply(Request { origin, command }))))
    }

    fn txn(&self, words: &[&str]) -> Result<Txn, String> {
        let text = words.join(" ");
        let parts = split_outside_braces(&text, '|');
        let mut parts = parts.iter().map(|part| part.trim());
        let compares = parts.next().unwrap_or("");
        let ops = |part: Option<&str>| -> Result<Vec<TxnOp>, String> {
            split_outside_braces(part.unwrap_or(""), ',')
                .into_iter()
                .map(str::trim)
                .filter(|op| !op.is_empty())
                .map(|op| {
                    if let Some(nested) = op.strip_prefix('{').and_then(|op| op.strip_suffix('}')) {
                        let words: Vec<&str> = nested.split_whitespace().collect();
                        return Ok(TxnOp::Txn(self.txn(&words)?));
                    }
                    let words: Vec<&str> = op.split_whitespace().collect();
                    if words.first() == Some(&"delp") {
                        let prefix = words.get(1).ok_or("delp needs a prefix")?;
                        return Ok(TxnOp::DeletePrefix {
                            prefix: prefix.as_bytes().to_vec(),
                        });
                    }
                    if words.first() == Some(&"delr") {
                        return Ok(TxnOp::DeleteRange {
                            range: key_range(words.get(1), words.get(2))?,
                        });
                    }
                    if words.first() == Some(&"putx") {
                        let key = words.get(1).ok_or("putx needs a key")?;
                        let value = match *words.get(2).ok_or("putx needs a value")? {
                            "=" => Update::Keep,
                            value => Update::Set(value.as_bytes().to_vec()),
                        };
                        let lease = match words.get(3).and_then(|w| w.strip_prefix("lease=")) {
                            None | Some("-") => Update::Set(None),
                            Some("=") => Update::Keep,
                            Some(name) => Update::Set(Some(name.to_string())),
                        };
                        return Ok(TxnOp::PutExisting {
                            key: key.as_bytes().to_vec(),
                            value,
                            lease,
                        });
                    }
                    txn_op(self.command(&words)?)
                })
                .collect()
        };
        let compare = compares
            .split_whitespace()
            .map(compare)
            .collect::<Result<_, _>>()?;
        Ok(Txn {
            compare,
            success: ops(parts.next())?,
            failure: ops(parts.next())?,
        })
    }

    fn command(&self, words: &[&str]) -> Result<Command, String> {
        let text = |i: usize| -> Result<String, String> {
            let word = words
                .get(i)
                .ok_or_else(|| format!("missing argument {i}"))?;
            Ok(if *word == "\"\"" {
                String::new()
            } else {
                word.to_string()
            })
        };
        let arg = |i: usize| text(i).map(String::into_bytes);
        let op = words.first().ok_or("missing operation")?;
        Ok(match *op {
            "put" => {
                let lease = words
                    .get(3)
                    .and_then(|w| w.strip_prefix("lease="))
                    .map(String::from);
                Command::Put {
                    key: arg(1)?,
                    value: (arg(2)?).into(),
                    lease,
                }
            }
            "get" => at_revision(words, Query::Get { key: arg(1)? })?,
            "del" => Command::Delete { key: arg(1)? },
            "append" => Command::Append {
                key: arg(1)?,
                value: arg(2)?,
            },
            "incr" => Command::Incr {
                key: arg(1)?,
                by: text(2)?
                    .parse()
                    .map_err(|e| format!("bad increment: {e}"))?,
            },
            "cas" => Command::Cas {
                key: arg(1)?,
                expected: (words.get(2) != Some(&"-")).then(|| arg(2)).transpose()?,
                new: arg(3)?,
            },
            "scan" => {
                let limit = words.get(2).filter(|w| !w.starts_with("rev="));
                let query = Query::Scan {
                    prefix: arg(1)?,
                    limit: limit.map_or(Ok(0), |w| parse_u(w))? as u32,
                };
                at_revision(words, query)?
            }
            "range" => {
                let limit = words.get(3).filter(|w| !w.starts_with("rev="));
                let query = Query::Range {
                    range: key_range(words.get(1), words.get(2))?,
                    limit: limit.map_or(Ok(0), |w| parse_u(w))? as u32,
                };
                at_revision(words, query)?
            }
            "compact" => Command::Compact {
                revision: parse_u(&text(1)?)?,
            },
            "lease-grant" => Command::LeaseGrant {
                name: text(1)?,
                ttl_ms: parse_u(&text(2)?)?,
            },
            "lease-keepalive" => Command::LeaseKeepAlive { name: text(1)? },
            "lease-revoke" => Command::LeaseRevoke { name: text(1)? },
            "lease-list" => Command::Read(Query::LeaseList),
            "keepalive" | "close" => {
                let (session, secret) = self.session(&text(1)?)?;
                let secret = match words.get(2).and_then(|w| w.strip_prefix("secret=")) {
                    Some(v) => Secret(parse_u(v)?.into()),
                    None => secret,
                };
                if *op == "close" {
                    Command::CloseSession { session, secret }
                } else {
                    Command::KeepAlive { session, secret }
                }
            }
            "tick" => Command::Tick,
            "alarm-disarm" => Command::AlarmDisarm,
            "alarm-raise" | "alarm-clear" => Command::AlarmSet {
                member: parse_u(&text(1)?)?,
                raise: *op == "alarm-raise",
            },
            "auth-status" => Command::Read(Query::Auth),
            "auth-enable" => Command::Auth(AuthCommand::Enable {
                token_key: TokenKey([9; 32]),
            }),
            "auth-disable" => Command::Auth(AuthCommand::Disable),
            "user-add" => Command::Auth(AuthCommand::UserAdd {
                name: text(1)?,
                password_hash: Some("$argon2id$test".into()),
            }),
            "user-del" => Command::Auth(AuthCommand::UserDelete { name: text(1)? }),
            "user-purge" => Command::Auth(AuthCommand::UserPurge { name: text(1)? }),
            "cert-revoke" | "cert-unrevoke" => {
                let hex = text(1)?;
                let serial = (0..hex.len())
                    .step_by(2)
                    .map(|i| {
                        hex.get(i..i + 2)
                            .and_then(|b| u8::from_str_radix(b, 16).ok())
                    })
                    .collect::<Option<Vec<u8>>>()
                    .ok_or_else(|| format!("{hex:?} is not hex"))?;
                if *op == "cert-revoke" {
                    Command::Auth(AuthCommand::CertificateRevoke { serial })
                } else {
                    Command::Auth(AuthCommand::CertificateUnrevoke { serial })
                }
            }
            "user-passwd" => Command::Auth(AuthCommand::UserPasswd {
                name: text(1)?,
                password_hash: Some("$argon2id$new".into()),
            }),
            "user-grant" => Command::Auth(AuthCommand::UserGrantRole {
                user: text(1)?,
                role: text(2)?,
            }),
            "user-revoke" => Command::Auth(AuthCommand::UserRevokeRole {
                user: text(1)?,
                role: text(2)?,
            }),
            "role-add" => Command::Auth(AuthCommand::RoleAdd { name: text(1)? }),
            "role-del" => Command::Auth(AuthCommand::RoleDelete { name: text(1)? }),
            "role-grant" => Command::Auth(AuthCommand::RoleGrant {
                role: text(1)?,
                permission: Permission {
                    access: match text(2)?.as_str() {
                        "read" => Access::Read,
                        "write" => Access::Write,
                        "readwrite" => Access::ReadWrite,
                        other => return Err(format!("unknown access {other}")),
                    },
                    key: arg(3)?,
                    prefix: words.get(4) == Some(&"prefix"),
                },
            }),
            "role-revoke" => Command::Auth(AuthCommand::RoleRevoke {
                role: text(1)?,
                key: arg(2)?,
                prefix: words.get(3) == Some(&"prefix"),
            }),
            other => return Err(format!("unknown operation {other}")),
        })
    }
}

/// `text` split at each `separator` outside `{...}` (a nested
/// transaction).
fn split_outside_braces(text: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            c if c == separator && depth == 0 => {
                parts.push(&text[start..at]);
                start = at + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// `query` as a read, at the revision a `rev=R` word names, if any.
fn at_revision(words: &[&str], query: Query) -> Result<Command, String> {
    let revision = words.iter().find_map(|w| w.strip_prefix("rev="));
    Ok(Command::Read(match revision {
        Some(revision) => Query::At {
            revision: parse_u(revision)?,
            query: Box::new(query),
        },
        None => query,
    }))
}

/// A transaction operation from the command a script line names.
fn txn_op(command: Command) -> Result<TxnOp, String> {
    Ok(match command {
        Command::Put { key, value, lease } => TxnOp::Put {
            key,
            value: value.to_vec(),
            lease,
        },
        Command::Delete { key } => TxnOp::Delete { key },
        Command::Append { key, value } => TxnOp::Append { key, value },
        Command::Incr { key, by } => TxnOp::Incr { key, by },
        Command::Cas { key, expected, new } => TxnOp::Cas { key, expected, new },
        Command::Read(Query::Get { key }) => TxnOp::Get { key },
        Command::Read(Query::Scan { prefix, limit }) => TxnOp::Scan { prefix, limit },
        Command::Read(Query::Range { range, limit }) => TxnOp::Range { range, limit },
        other => return Err(format!("{} cannot run in a transaction", other.name())),
    })
}

/// A compare written `TARGET(KEY)OP VALUE`, e.g. `value(a)=1`,
/// `version(p/*)>0`, `exists(b)=false`.
fn compare(word: &str) -> Result<Compare, String> {
    let (target, rest) = word
        .split_once('(')
        .ok_or_else(|| format!("bad compare {word:?}"))?;
    let (key, rest) = rest
        .split_once(')')
        .ok_or_else(|| format!("bad compare {word:?}"))?;
    let (op, value) = if let Some(v) = rest.strip_prefix("!=") {
        (CompareOp::NotEqual, v)
    } else if let Some(v) = rest.strip_prefix('=') {
        (CompareOp::Equal, v)
    } else if let Some(v) = rest.strip_prefix('<') {
        (CompareOp::Less, v)
    } else if let Some(v) = rest.strip_prefix('>') {
        (CompareOp::Greater, v)
    } else {
        return Err(format!("bad compare operator in {word:?}"));
    };
    let (key, scope) = match (key.strip_suffix('*'), key.split_once("..")) {
        (Some(prefix), _) => (prefix, KeyScope::Prefix),
        (None, Some((start, ""))) => (start, KeyScope::Range { end: None }),
        (None, Some((start, end))) => (
            start,
            KeyScope::Range {
                end: Some(end.as_bytes().to_vec()),
            },
        ),
        (None, None) => (key, KeyScope::Key),
    };
    let target = match target {
        "value" => CompareTarget::Value(value.as_bytes().to_vec()),
        "version" => CompareTarget::Version(parse_u(value)?),
        "create" => CompareTarget::CreateRevision(parse_u(value)?),
        "mod" => CompareTarget::ModRevision(parse_u(value)?),
        "exists" => CompareTarget::Exists(value == "true"),
        "lease" => CompareTarget::Lease((value != "-").then(|| value.to_string())),
        other => return Err(format!("unknown compare target {other}")),
    };
    Ok(Compare {
        key: key.as_bytes().to_vec(),
        scope,
        target,
        op,
    })
}

/// A key range from its START and END words (END `-`: no end).
fn key_range(start: Option<&&str>, end: Option<&&str>) -> Result<KeyRange, String> {
    let start = start.ok_or("a range needs a start")?.as_bytes().to_vec();
    Ok(match *end.ok_or("a range needs an end (or -)")? {
        "-" => KeyRange::from_key(start),
        end => KeyRange::new(start, end.as_bytes().to_vec()),
    })
}

fn number(word: Option<&&str>) -> Result<u64, String> {
    parse_u(word.ok_or("missing number")?)
}

fn parse_u(word: &str) -> Result<u64, String> {
    word.parse()
        .map_err(|e| format!("bad number {word:?}: {e}"))
}

fn options<'a>(words: &[&'a str]) -> Result<BTreeMap<&'a str, &'a str>, String> {
    words
        .iter()
        .map(|w| {
            w.split_once('=')
                .ok_or_else(|| format!("expected k=v, got {w}"))
        })
        .collect()
}

fn bytes(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) if !text.is_empty() && !text.contains(char::is_whitespace) => text.to_string(),
        _ => format!("{value:?}"),
    }
}

fn maybe(value: &Option<Vec<u8>>) -> String {
    value.as_deref().map_or_else(|| "-".to_string(), bytes)
}

fn render_reply(reply: &Reply) -> String {
    match reply {
        Reply::SessionOpened {
            session,
            ttl_ms,
            window,
            ..
        } => {
            format!(
                "session-opened id={} ttl={ttl_ms} window={window}",
                session.0
            )
        }
        Reply::SessionKeptAlive { ttl_ms } => format!("kept-alive ttl={ttl_ms}"),
        Reply::SessionClosed => "closed".into(),
        Reply::Ticked => "ticked".into(),
        Reply::Put { previous } => format!("put previous={}", maybe(previous)),
        Reply::Get { value, meta } => match meta {
            Some(m) => format!(
                "get value={} @{}/{}/{}",
                maybe(value),
                m.create_revision,
                m.mod_revision,
                m.version
            ),
            None => format!("get value={}", maybe(value)),
        },
        Reply::Delete { previous } => format!("del previous={}", maybe(previous)),
        Reply::Append { length } => format!("append length={length}"),
        Reply::Incr { value } => format!("incr value={value}"),
        Reply::Cas { swapped, current } => {
            format!("cas swapped={swapped} current={}", maybe(current))
        }
        Reply::Scan { entries, more } => {
            let mut out = String::from("scan");
            for kv in entries {
                let _ = write!(out, " {}={}", bytes(&kv.key), bytes(&kv.value));
            }
            let _ = write!(out, " more={more}");
            out
        }
        Reply::Range {
            entries,
            more,
            count,
        } => {
            let mut out = String::from("range");
            for kv in entries {
                let _ = write!(out, " {}={}", bytes(&kv.key), bytes(&kv.value));
            }
            let _ = write!(out, " more={more} count={count}");
            out
        }
        Reply::LeaseGranted {
            name,
            ttl_ms,
            expires_at,
        } => {
            format!("lease-granted {name} ttl={ttl_ms} expires={}", expires_at.0)
        }
        Reply::LeaseKeptAlive { name, expires_at } => {
            format!("lease-kept-alive {name} expires={}", expires_at.0)
        }
        Reply::LeaseRevoked { name, keys_deleted } => {
            format!("lease-revoked {name} keys_deleted={keys_deleted}")
        }
        Reply::Leases { leases } => {
            let mut out = String::from("leases");
            for lease in leases {
                let _ = write!(
                    out,
                    " {}(keys={},expires={})",
                    lease.name, lease.keys, lease.expires_at.0
                );
            }
            out
        }
        Reply::Rejected(rejection) => format!("rejected: {rejection}"),
        Reply::AlarmDisarmed { was_raised } => format!("alarm-disarmed was_raised={was_raised}"),
        Reply::AlarmSet { changed } => format!("alarm-set changed={changed}"),
        Reply::AuthChanged => "auth-changed".into(),
        Reply::UserPurged { sessions, keys } => {
            format!("user-purged sessions={sessions} keys={keys}")
        }
        Reply::Txn { succeeded, results } => {
            let results: Vec<String> = results.iter().map(render_reply).collect();
            format!("txn succeeded={succeeded} [{}]", results.join("; "))
        }
        Reply::DeletePrefix { deleted } => format!("delp deleted={deleted}"),
        Reply::Compacted { revision } => format!("compacted revision={revision}"),
        Reply::Auth(view) => {
            let mut out = format!("auth enabled={}", view.enabled);
            for user in &view.users {
                let _ = write!(out, " user:{}({})", user.name, user.roles.join(","));
            }
            for (role, permissions) in &view.roles {
                let _ = write!(out, " role:{role}(");
                for (i, p) in permissions.iter().enumerate() {
                    let star = if p.prefix { "*" } else { "" };
                    let sep = if i == 0 { "" } else { "," };
                    let _ = write!(out, "{sep}{} {}{star}", p.access, bytes(&p.key));
                }
                out.push(')');
            }
            for serial in &view.revoked_certificates {
                let _ = write!(out, " revoked:{}", serial_hex(serial));
            }
            out
        }
    }
}

fn render(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Applied(reply) => format!("applied {}", render_reply(reply)),
        Outcome::Replayed {
            reply,
            applied_index,
        } => {
            format!("replayed@{} {}", applied_index.0, render_reply(reply))
        }
        Outcome::SessionExpired => "session-expired".into(),
        Outcome::Unauthorized => "unauthorized".into(),
        Outcome::Stale { floor } => format!("stale floor={}", floor.0),
        Outcome::RequestMismatch => "request-mismatch".into(),
        Outcome::SequenceGap { expected } => format!("sequence-gap expected={}", expected.0),
        Outcome::Malformed(why) => format!("malformed: {why}"),
        Outcome::Overloaded(why) => format!("overloaded {}: {why}", why.name()),
        Outcome::PermissionDenied { reason } => format!("permission-denied: {reason}"),
    }
}

fn run_script(path: &Path, update: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut runner = Runner::new();
    let mut rewritten = String::new();
    let mut failures = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let (input, expected) = match line.split_once("=>") {
            Some((input, expected)) => (input.trim_end(), Some(expected.trim())),
            None => (line.trim_end(), None),
        };
        let code = input.split('#').next().unwrap_or("").trim();
        let actual = runner
            .run(code)
            .map_err(|e| format!("{}:{}: {e}", path.display(), number + 1))?;
        match actual {
            Some(actual) => {
                if expected != Some(actual.as_str()) {
                    failures.push(format!(
                        "{}:{}: {code}\n  expected: {}\n  actual:   {actual}",
                        path.display(),
                        number + 1,
                        expected.unwrap_or("(nothing)")
                    ));
                }
                let _ = writeln!(rewritten, "{input} => {actual}");
            }
            None => {
                let _ = writeln!(rewritten, "{input}");
            }
        }
    }
    if update {
        std::fs::write(path, rewritten).map_err(|e| e.to_string())?;
        return Ok(());
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

#[test]
fn scripts() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts");
    let update = std::env::var_os("ONCEKV_UPDATE_SCRIPTS").is_some();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/scripts exists")
        .map(|entry| entry.expect("readable directory").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 5,
        "expected the script files under {}",
        dir.display()
    );
    let errors: Vec<String> = paths
        .iter()
        .filter_map(|p| run_script(p, update).err())
        .collect();
    assert!(errors.is_empty(), "script failures:\n{}", errors.join("\n"));
}
