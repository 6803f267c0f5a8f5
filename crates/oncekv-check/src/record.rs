//! The recorded client history of a fault run, and its JSON-lines file.
//!
//! A run is written as a stream of [`Event`]s, one JSON object per line,
//! each stamped with `at_ns`, nanoseconds since the run started:
//!
//! * [`Event::RunStarted`]: the seed and the nodes;
//! * [`Event::Invoke`] / [`Event::Complete`]: a client operation ([`Op`])
//!   being issued and the client learning its [`Outcome`] (`Ok` with the
//!   reply, `Failed` for a definite "not applied", or `Unknown`), with the
//!   request's identity ([`RequestIdentity`]) and the attempt count;
//! * [`Event::Response`]: one attempt's answer as seen on the wire (every
//!   retry of a request gets one), including replies the fault proxy dropped
//!   after the server committed them;
//! * [`Event::SessionExpired`]: a client being told its session expired;
//! * [`Event::FaultStarted`] / [`Event::FaultEnded`]: the nemesis at work;
//! * [`Event::LeaderChanged`]: a leader observed;
//! * [`Event::WatchStarted`] / [`Event::Watched`] / [`Event::WatchStopped`]:
//!   a watcher's start, each change it was given, its end;
//! * [`Event::FinalValue`]: a key's value read after the run, for the
//!   checkers that compare final state with the history.
//!
//! [`RecordWriter`] writes events, [`RecordReader`] reads them back with
//! line numbers on every error, and [`Record::from_events`] folds them into
//! the [`Record`] the checkers take: one [`OpRecord`] per operation, fault
//! windows, and so on. An operation still pending when the stream ends has
//! an unknown outcome. Malformed input is a [`RecordError`], never a panic.
//!
//! Byte strings ([`Bytes`]) are written as JSON strings when they are UTF-8
//! and as `{"hex": "..."}` otherwise, so files stay readable.

pub use crate::history::ClientId;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry as MapEntry;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

mod events;
mod file;
mod ids;
mod key_variants;
mod model;
mod txn;
mod watch;

pub use events::*;
pub use file::*;
pub use ids::*;
pub use model::*;
pub use txn::*;
pub use watch::*;

/// One operation, folded from its invocation and completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// Its id.
    pub id: OpId,
    /// The client that issued it.
    pub client: ClientId,
    /// What was asked.
    pub op: Op,
    /// The request's identity.
    pub request: RequestIdentity,
    /// When it was issued.
    pub invoke_ns: u64,
    /// When the client learned the outcome; `None` when the run ended
    /// before it did.
    pub complete_ns: Option<u64>,
    /// How many times the request was sent.
    pub attempts: u32,
    /// What the client was told.
    pub outcome: Outcome,
}

/// An injected fault with its time window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultWindow {
    /// Its id.
    pub id: FaultId,
    /// Its kind.
    pub kind: FaultKind,
    /// The node it hit, if one.
    pub target: Option<NodeId>,
    /// Free text.
    pub detail: Option<String>,
    /// When it began.
    pub start_ns: u64,
    /// When it ended; `None` when still active at the end of the record.
    pub end_ns: Option<u64>,
}

/// A recorded run, folded for the checkers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The run's parameters, if recorded.
    pub run: Option<RunInfo>,
    /// The operations, by invocation time (ties by id).
    pub ops: Vec<OpRecord>,
    /// Every attempt's answer, in stream order.
    pub responses: Vec<AttemptResponse>,
    /// Session expiries reported to clients, in stream order.
    pub expiries: Vec<ExpiryReport>,
    /// Faults, by start time (ties by id).
    pub faults: Vec<FaultWindow>,
    /// Leaders observed, in stream order.
    pub leader_changes: Vec<LeaderChange>,
    /// Final values read after the run, by key.
    pub final_values: BTreeMap<Bytes, Option<Bytes>>,
    /// Watchers and what they were given, by number.
    pub watches: BTreeMap<WatcherId, WatchRecord>,
}

impl Record {
    /// Folds a stream of events into a record, checking that it is
    /// consistent. Operations never completed get an unknown outcome.
    pub fn from_events(events: impl IntoIterator<Item = Event>) -> Result<Self, RecordError> {
        let mut record = Record::default();
        let mut ops: BTreeMap<OpId, (OpRecord, bool)> = BTreeMap::new();
        let mut faults: BTreeMap<FaultId, FaultWindow> = BTreeMap::new();
        for (index, event) in events.into_iter().enumerate() {
            let fail = |problem| RecordError::Inconsistent { index, problem };
            match event {
                Event::RunStarted(info) => {
                    if record.run.is_some() {
                        return Err(fail(Inconsistency::RunStartedTwice));
                    }
                    record.run = Some(info);
                }
                Event::Invoke(inv) => {
                    if let Some(problem) = inv.request.problem() {
                        return Err(fail(Inconsistency::BadRequestIdentity(problem)));
                    }
                    let MapEntry::Vacant(slot) = ops.entry(inv.op_id) else {
                        return Err(fail(Inconsistency::DuplicateOp(inv.op_id)));
                    };
                    slot.insert((
                        OpRecord {
                            id: inv.op_id,
                            client: inv.client,
                            op: inv.op,
                            request: inv.request,
                            invoke_ns: inv.at_ns,
                            complete_ns: None,
                            attempts: 0,
                            outcome: Outcome::Unknown {
                                detail: Some("no completion recorded".to_owned()),
                            },
                        },
                        false,
                    ));
                }
                Event::Complete(done) => {
                    let Some((op, completed)) = ops.get_mut(&done.op_id) else {
                        return Err(fail(Inconsistency::CompletedNotInvoked(done.op_id)));
                    };
                    if *completed {
                        return Err(fail(Inconsistency::CompletedTwice(done.op_id)));
                    }
                    if op.client != done.client {
                        return Err(fail(Inconsistency::ClientMismatch {
                            op_id: done.op_id,
                            invoked_by: op.client,
                            completed_by: done.client,
                        }));
                    }
                    if done.at_ns < op.invoke_ns {
                        return Err(fail(Inconsistency::CompletedBeforeInvoked {
                            op_id: done.op_id,
                            invoke_ns: op.invoke_ns,
                            complete_ns: done.at_ns,
                        }));
                    }
                    if let Some(reply) = done.outcome.reply()
                        && !op.op.accepts(reply)
                    {
                        return Err(fail(Inconsistency::ReplyMismatch {
                            op_id: done.op_id,
                            op: op.op.name(),
                            reply: reply.to_string(),
                        }));
                    }
                    if let Some(request) = &done.request {
                        op.request.merge(request).map_err(|field| {
                            fail(Inconsistency::RequestMismatch {
                                op_id: done.op_id,
                                field,
                            })
                        })?;
                        if let Some(problem) = op.request.problem() {
                            return Err(fail(Inconsistency::BadRequestIdentity(problem)));
                        }
                    }
                    op.complete_ns = Some(done.at_ns);
                    op.attempts = done.attempts;
                    op.outcome = done.outcome;
                    *completed = true;
                }
                Event::Response(response) => {
                    if let Some(problem) = response.request.problem() {
                        return Err(fail(Inconsistency::BadRequestIdentity(problem)));
                    }
                    record.responses.push(response);
                }
                Event::SessionExpired(report) => record.expiries.push(report),
                Event::FaultStarted(start) => {
                    let MapEntry::Vacant(slot) = faults.entry(start.fault_id) else {
                        return Err(fail(Inconsistency::DuplicateFault(start.fault_id)));
                    };
                    slot.insert(FaultWindow {
                        id: start.fault_id,
                        kind: start.kind,
                        target: start.target,
                        detail: start.detail,
                        start_ns: start.at_ns,
                        end_ns: None,
                    });
                }
                Event::FaultEnded(end) => {
                    let Some(window) = faults
                        .get_mut(&end.fault_id)
                        .filter(|window| window.end_ns.is_none())
                    else {
                        return Err(fail(Inconsistency::FaultNotRunning(end.fault_id)));
                    };
                    if end.at_ns < window.start_ns {
                        return Err(fail(Inconsistency::FaultEndedBeforeStart {
                            fault_id: end.fault_id,
                            start_ns: window.start_ns,
                            end_ns: end.at_ns,
                        }));
                    }
                    window.end_ns = Some(end.at_ns);
                }
                Event::LeaderChanged(change) => record.leader_changes.push(change),
                Event::WatchStarted(start) => match record.watches.entry(start.watcher) {
                    MapEntry::Vacant(slot) => {
                        slot.insert(WatchRecord::new(&start));
                    }
                    MapEntry::Occupied(_) => {
                        return Err(fail(Inconsistency::WatcherStartedTwice(start.watcher)));
                    }
                },
                Event::Watched(seen) => {
                    let Some(watch) = record.watches.get_mut(&seen.watcher) else {
                        return Err(fail(Inconsistency::WatcherNotStarted(seen.watcher)));
                    };
                    watch.events.push(seen);
                }
                Event::WatchStopped(stop) => {
                    let Some(watch) = record.watches.get_mut(&stop.watcher) else {
                        return Err(fail(Inconsistency::WatcherNotStarted(stop.watcher)));
                    };
                    if watch.end.is_some() {
                        return Err(fail(Inconsistency::WatcherStoppedTwice(stop.watcher)));
                    }
                    watch.delivered_through = stop.delivered_through;
                    watch.end = Some(stop.end);
                    watch.stopped_ns = Some(stop.at_ns);
                }
                Event::FinalValue(fin) => match record.final_values.entry(fin.key) {
                    MapEntry::Vacant(slot) => {
                        slot.insert(fin.value);
                    }
                    MapEntry::Occupied(slot) => {
                        if *slot.get() != fin.value {
                            return Err(fail(Inconsistency::ConflictingFinalValue(
                                slot.key().clone(),
                            )));
                        }
                    }
                },
            }
        }
        record.ops = ops.into_values().map(|(op, _)| op).collect();
        record.ops.sort_by_key(|op| (op.invoke_ns, op.id));
        record.faults = faults.into_values().collect();
        record
            .faults
            .sort_by_key(|fault| (fault.start_ns, fault.id));
        Ok(record)
    }

    /// Unfolds the record into events, grouped by kind (not interleaved
    /// by time); [`Record::from_events`] gives the record back.
    pub fn to_events(&self) -> Vec<Event> {
        let mut events = Vec::new();
        if let Some(run) = &self.run {
            events.push(Event::RunStarted(run.clone()));
        }
        for op in &self.ops {
            events.push(Event::Invoke(Invocation {
                at_ns: op.invoke_ns,
                client: op.client,
                op_id: op.id,
                request: op.request.clone(),
                op: op.op.clone(),
            }));
        }
        for op in &self.ops {
            if let Some(at_ns) = op.complete_ns {
                events.push(Event::Complete(Completion {
                    at_ns,
                    client: op.client,
                    op_id: op.id,
                    attempts: op.attempts,
                    outcome: op.outcome.clone(),
                    request: None,
                }));
            }
        }
        events.extend(self.responses.iter().cloned().map(Event::Response));
        events.extend(self.expiries.iter().cloned().map(Event::SessionExpired));
        for fault in &self.faults {
            events.push(Event::FaultStarted(FaultStart {
                at_ns: fault.start_ns,
                fault_id: fault.id,
                kind: fault.kind,
                target: fault.target,
                detail: fault.detail.clone(),
            }));
            if let Some(at_ns) = fault.end_ns {
                events.push(Event::FaultEnded(FaultEnd {
                    at_ns,
                    fault_id: fault.id,
                }));
            }
        }
        events.extend(
            self.leader_changes
                .iter()
                .cloned()
                .map(Event::LeaderChanged),
        );
        for watch in self.watches.values() {
            events.push(Event::WatchStarted(WatchStart {
                at_ns: watch.started_ns,
                watcher: watch.watcher,
                prefix: watch.prefix.clone(),
                start_revision: watch.start_revision,
                reference: watch.reference,
            }));
            events.extend(watch.events.iter().cloned().map(Event::Watched));
            if let (Some(end), Some(at_ns)) = (&watch.end, watch.stopped_ns) {
                events.push(Event::WatchStopped(WatchStop {
                    at_ns,
                    watcher: watch.watcher,
                    delivered_through: watch.delivered_through,
                    end: end.clone(),
                }));
            }
        }
        let end = self.end_ns();
        for (key, value) in &self.final_values {
            events.push(Event::FinalValue(FinalValue {
                at_ns: end,
                key: key.clone(),
                value: value.clone(),
            }));
        }
        events
    }

    /// Reads and folds a JSON-lines file.
    pub fn load(path: &Path) -> Result<Self, RecordError> {
        let file = File::open(path).map_err(|source| RecordError::File {
            path: path.to_owned(),
            source,
        })?;
        Self::from_events(read_events(BufReader::new(file))?)
    }

    /// Writes the record as a JSON-lines file.
    pub fn save(&self, path: &Path) -> Result<(), RecordError> {
        let mut writer = RecordWriter::create(path)?;
        for event in self.to_events() {
            writer.write(&event)?;
        }
        writer.flush()
    }

    /// The seed of the run, if recorded.
    pub fn seed(&self) -> Option<u64> {
        self.run.as_ref().map(|run| run.seed)
    }

    /// The latest time stamp in the record.
    pub fn end_ns(&self) -> u64 {
        let ops = self
            .ops
            .iter()
            .map(|op| op.complete_ns.unwrap_or(op.invoke_ns));
        let responses = self.responses.iter().map(|r| r.at_ns);
        let expiries = self.expiries.iter().map(|e| e.at_ns);
        let faults = self.faults.iter().map(|f| f.end_ns.unwrap_or(f.start_ns));
        let leaders = self.leader_changes.iter().map(|l| l.at_ns);
        ops.chain(responses)
            .chain(expiries)
            .chain(faults)
            .chain(leaders)
            .max()
            .unwrap_or(0)
    }

    /// The operation with id `id`.
    pub fn op(&self, id: OpId) -> Option<&OpRecord> {
        self.ops.iter().find(|op| op.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::ids::from_hex;
    use super::*;

    fn sample_events() -> Vec<Event> {
        vec![
            Event::RunStarted(RunInfo {
                at_ns: 0,
                seed: 42,
                nodes: vec![1, 2, 3],
                description: "append + incr under kill".to_owned(),
            }),
            Event::Invoke(Invocation {
                at_ns: 10,
                client: 1,
                op_id: 1,
                request: RequestIdentity::session(7, 1),
                op: Op::Append {
                    key: "a".into(),
                    token: "t1".into(),
                },
            }),
            Event::Invoke(Invocation {
                at_ns: 11,
                client: 2,
                op_id: 2,
                request: RequestIdentity::idempotent(vec![0xff, 0x00]),
                op: Op::Cas {
                    key: Bytes(vec![0x80]),
                    expected: None,
                    new: "v".into(),
                },
            }),
            Event::FaultStarted(FaultStart {
                at_ns: 12,
                fault_id: 1,
                kind: FaultKind::DropReplies,
                target: Some(2),
                detail: None,
            }),
            Event::Response(AttemptResponse {
                at_ns: 20,
                client: 1,
                op_id: Some(1),
                request: RequestIdentity::session(7, 1),
                attempt: 1,
                node: Some(1),
                answer: Answer::Applied {
                    reply: Reply::Append { length: 3 },
                    canonical: Some(Bytes(vec![8, 3])),
                    log_index: Some(9),
                },
                dropped_after_commit: true,
                batch: 1,
            }),
            Event::Response(AttemptResponse {
                at_ns: 40,
                client: 1,
                op_id: Some(1),
                request: RequestIdentity::session(7, 1),
                attempt: 2,
                node: Some(1),
                answer: Answer::Replayed {
                    reply: Reply::Append { length: 3 },
                    canonical: Some(Bytes(vec![8, 3])),
                    applied_index: Some(9),
                },
                dropped_after_commit: false,
                batch: 1,
            }),
            Event::Complete(Completion {
                at_ns: 41,
                client: 1,
                op_id: 1,
                attempts: 2,
                outcome: Outcome::Ok {
                    reply: Reply::Append { length: 3 },
                    canonical: Some(Bytes(vec![8, 3])),
                },
                request: None,
            }),
            Event::FaultEnded(FaultEnd {
                at_ns: 50,
                fault_id: 1,
            }),
            Event::LeaderChanged(LeaderChange {
                at_ns: 55,
                leader: Some(3),
                term: Some(2),
                observer: Some(2),
            }),
            Event::SessionExpired(ExpiryReport {
                at_ns: 60,
                client: 1,
                session: 7,
            }),
            Event::Complete(Completion {
                at_ns: 70,
                client: 2,
                op_id: 2,
                attempts: 3,
                outcome: Outcome::Unknown {
                    detail: Some("deadline".to_owned()),
                },
                request: None,
            }),
            Event::WatchStarted(WatchStart {
                at_ns: 61,
                watcher: 1,
                prefix: "acct/".into(),
                start_revision: 1,
                reference: false,
            }),
            Event::Watched(WatchSeen {
                at_ns: 62,
                watcher: 1,
                revision: 9,
                key: "acct/0".into(),
                kind: WatchKind::Put,
                value: Some("-3".into()),
            }),
            Event::WatchStopped(WatchStop {
                at_ns: 63,
                watcher: 1,
                delivered_through: 12,
                end: WatchEnd::Stopped,
            }),
            Event::FinalValue(FinalValue {
                at_ns: 100,
                key: "a".into(),
                value: Some("t1;".into()),
            }),
        ]
    }

    #[test]
    fn events_round_trip_through_json_lines() {
        let events = sample_events();
        let mut out = Vec::new();
        write_events(&mut out, &events).expect("write");
        let text = String::from_utf8(out.clone()).expect("utf-8");
        assert_eq!(text.lines().count(), events.len());
        assert!(text.contains(r#"{"hex":"ff00"}"#), "{text}");
        assert!(text.contains(r#""event":"invoke""#), "{text}");
        let back = read_events(out.as_slice()).expect("read");
        assert_eq!(back, events);
    }

    #[test]
    fn record_round_trips_through_events_and_files() {
        let record = Record::from_events(sample_events()).expect("fold");
        assert_eq!(record.seed(), Some(42));
        assert_eq!(record.ops.len(), 2);
        assert_eq!(record.ops[0].attempts, 2);
        assert_eq!(record.faults[0].end_ns, Some(50));
        assert_eq!(record.end_ns(), 70);
        assert_eq!(record.watches[&1].events.len(), 1);
        assert_eq!(record.watches[&1].delivered_through, 12);
        let again = Record::from_events(record.to_events()).expect("refold");
        assert_eq!(again, record);

        let dir = std::env::temp_dir().join(format!("oncekv-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("run.jsonl");
        record.save(&path).expect("save");
        let loaded = Record::load(&path).expect("load");
        assert_eq!(loaded, record);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn pending_operations_are_unknown() {
        let events = sample_events().into_iter().take(3).collect::<Vec<_>>();
        let record = Record::from_events(events).expect("fold");
        assert!(
            record
                .ops
                .iter()
                .all(|op| matches!(op.outcome, Outcome::Unknown { .. }) && op.complete_ns.is_none())
        );
    }

    #[test]
    fn malformed_lines_are_errors_with_line_numbers() {
        let input = "\n{\"event\":\"fault_ended\",\"at_ns\":1,\"fault_id\":1}\n{not json\n";
        let err = read_events(input.as_bytes()).expect_err("must fail");
        assert!(matches!(err, RecordError::Parse { line: 3, .. }), "{err}");

        let unknown = r#"{"event":"teleport","at_ns":1}"#;
        assert!(matches!(
            read_events(unknown.as_bytes()),
            Err(RecordError::Parse { line: 1, .. })
        ));
        let bad_hex = r#"{"event":"final_value","at_ns":1,"key":{"hex":"zz"}}"#;
        assert!(read_events(bad_hex.as_bytes()).is_err());
        let not_utf8: &[u8] = b"{\"event\":\"final_value\",\"at_ns\":1,\"key\":\"\xff\"}\n";
        assert!(read_events(not_utf8).is_err());
    }

    #[test]
    fn unknown_fault_kinds_and_reasons_are_kept_as_other() {
        let line = r#"{"event":"fault_started","at_ns":1,"fault_id":1,"kind":"solar_flare"}"#;
        let events = read_events(line.as_bytes()).expect("read");
        assert!(matches!(
            &events[0],
            Event::FaultStarted(FaultStart {
                kind: FaultKind::Other,
                ..
            })
        ));
    }

    #[test]
    fn watch_events_out_of_place_are_refused() {
        let start = Event::WatchStarted(WatchStart {
            at_ns: 1,
            watcher: 3,
            prefix: "p/".into(),
            start_revision: 1,
            reference: true,
        });
        let stop = Event::WatchStopped(WatchStop {
            at_ns: 2,
            watcher: 3,
            delivered_through: 0,
            end: WatchEnd::Stopped,
        });
        let refused = |events: Vec<Event>| match Record::from_events(events) {
            Err(RecordError::Inconsistent { problem, .. }) => problem,
            other => panic!("expected an inconsistency, got {other:?}"),
        };
        assert_eq!(
            refused(vec![stop.clone()]),
            Inconsistency::WatcherNotStarted(3)
        );
        assert_eq!(
            refused(vec![start.clone(), start.clone()]),
            Inconsistency::WatcherStartedTwice(3)
        );
        assert_eq!(
            refused(vec![start, stop.clone(), stop]),
            Inconsistency::WatcherStoppedTwice(3)
        );
    }

    #[test]
    fn inconsistent_streams_are_refused() {
        let invoke = |op_id, at_ns| {
            Event::Invoke(Invocation {
                at_ns,
                client: 1,
                op_id,
                request: RequestIdentity::plain(),
                op: Op::Get { key: "k".into() },
            })
        };
        let complete = |op_id, at_ns, outcome| {
            Event::Complete(Completion {
                at_ns,
                client: 1,
                op_id,
                attempts: 1,
                outcome,
                request: None,
            })
        };
        let ok_get = Outcome::Ok {
            reply: Reply::Get { value: None },
            canonical: None,
        };
        let cases = vec![
            (vec![invoke(1, 0), invoke(1, 1)], "invoked twice"),
            (vec![complete(1, 5, ok_get.clone())], "never invoked"),
            (
                vec![invoke(1, 5), complete(1, 4, ok_get.clone())],
                "before its invocation",
            ),
            (
                vec![
                    invoke(1, 0),
                    complete(1, 1, ok_get.clone()),
                    complete(1, 2, ok_get.clone()),
                ],
                "completed twice",
            ),
            (
                vec![
                    invoke(1, 0),
                    complete(
                        1,
                        1,
                        Outcome::Ok {
                            reply: Reply::Incr { value: 1 },
                            canonical: None,
                        },
                    ),
                ],
                "cannot reply",
            ),
            (
                vec![Event::FaultEnded(FaultEnd {
                    at_ns: 1,
                    fault_id: 9,
                })],
                "not running",
            ),
        ];
        for (events, expected) in cases {
            let err = Record::from_events(events).expect_err(expected);
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn completion_fills_in_the_request_identity() {
        let events = vec![
            Event::Invoke(Invocation {
                at_ns: 0,
                client: 1,
                op_id: 1,
                request: RequestIdentity {
                    session: Some(3),
                    ..RequestIdentity::default()
                },
                op: Op::Incr {
                    key: "c".into(),
                    by: 1,
                },
            }),
            Event::Complete(Completion {
                at_ns: 1,
                client: 1,
                op_id: 1,
                attempts: 1,
                outcome: Outcome::Unknown { detail: None },
                request: Some(RequestIdentity::session(3, 5)),
            }),
        ];
        let record = Record::from_events(events.clone()).expect("fold");
        assert_eq!(
            record.ops[0].request.dedup_key(),
            Some(DedupKey::Session { session: 3, seq: 5 })
        );
        let mut conflicting = events;
        if let Event::Complete(done) = &mut conflicting[1] {
            done.request = Some(RequestIdentity::session(4, 5));
        }
        assert!(Record::from_events(conflicting).is_err());
    }

    #[test]
    fn bytes_display_and_hex() {
        assert_eq!(Bytes::from("abc").to_string(), "abc");
        assert_eq!(Bytes(vec![0xff, 1]).to_string(), "0xff01");
        assert_eq!(from_hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("+f"), None);
    }
}
