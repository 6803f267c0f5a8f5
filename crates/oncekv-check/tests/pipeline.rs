//! The proof kit end to end on simulated runs: clients append tokens and
//! increment a counter on a toy in-memory store while a fault proxy drops
//! replies after commit, leaders change and a session expires. The events
//! go through the JSON-lines writer and reader, then every checker.
//!
//! The store deduplicates like oncekv (a completion record per session and
//! seq, refusal after expiry), so the run passes. The negative controls
//! switch one guarantee off and must be caught: a store without dedup
//! applies retried requests twice, and a store that ignores expiry applies
//! requests on an expired session.

mod common;

use common::assert_status;
use oncekv_check::checkers::{CheckerVerdict, Status};
use oncekv_check::coverage::{CoverageRequirements, RunVerdict};
use oncekv_check::record::{
    Answer, AttemptResponse, Bytes, Completion, Event, ExpiryReport, FailReason, FaultEnd,
    FaultKind, FaultStart, FinalValue, Invocation, LeaderChange, Op, Outcome, Record, RecordWriter,
    Reply, RequestIdentity, RunInfo,
};
use oncekv_check::report::HtmlOptions;
use oncekv_check::verify::{VerifyConfig, verify};
use std::collections::BTreeMap;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    Correct,
    NoDedup,
    IgnoresExpiry,
}

struct Toy {
    store: Store,
    values: BTreeMap<Vec<u8>, Vec<u8>>,
    records: BTreeMap<(u64, u64), (Reply, u64)>,
    expired: Vec<u64>,
    index: u64,
}

impl Toy {
    fn apply(&mut self, session: u64, seq: u64, op: &Op) -> Answer {
        if self.expired.contains(&session) && self.store != Store::IgnoresExpiry {
            return Answer::Refused {
                reason: FailReason::SessionExpired,
            };
        }
        if self.store != Store::NoDedup
            && let Some((reply, index)) = self.records.get(&(session, seq))
        {
            return Answer::Replayed {
                reply: reply.clone(),
                canonical: Some(Bytes::from(format!("{reply:?}"))),
                applied_index: Some(*index),
            };
        }
        self.index += 1;
        let reply = match op {
            Op::Append { key, token } => {
                let value = self.values.entry(key.0.clone()).or_default();
                value.extend_from_slice(&token.0);
                value.push(b';');
                Reply::Append {
                    length: value.len() as u64,
                }
            }
            Op::Incr { key, by } => {
                let value = self.values.entry(key.0.clone()).or_default();
                let now = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0)
                    + by;
                *value = now.to_string().into_bytes();
                Reply::Incr { value: now }
            }
            other => panic!("the toy store does not do {other}"),
        };
        self.records
            .insert((session, seq), (reply.clone(), self.index));
        Answer::Applied {
            canonical: Some(Bytes::from(format!("{reply:?}"))),
            reply,
            log_index: Some(self.index),
        }
    }
}

/// SplitMix64, so runs reproduce.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// Runs four clients, one request at a time each, in lock step; returns
/// the events in the order they happened.
fn simulate(store: Store, seed: u64) -> Vec<Event> {
    const CLIENTS: u64 = 4;
    const ROUNDS: u64 = 60;
    const STEP_NS: u64 = 1_000_000;
    let mut rng = Rng(seed);
    let mut toy = Toy {
        store,
        values: BTreeMap::new(),
        records: BTreeMap::new(),
        expired: Vec::new(),
        index: 0,
    };
    let mut events = vec![Event::RunStarted(RunInfo {
        at_ns: 0,
        seed,
        nodes: vec![1, 2, 3],
        description: "toy store, 4 clients".to_owned(),
    })];
    let mut sessions: Vec<(u64, u64)> = (1..=CLIENTS).map(|c| (c * 100, 0)).collect();
    let mut op_id = 0;
    let mut now = 0;
    let mut drop_window = None;
    for round in 0..ROUNDS {
        if round == 10 {
            events.push(Event::FaultStarted(FaultStart {
                at_ns: now,
                fault_id: 1,
                kind: FaultKind::DropReplies,
                target: None,
                detail: Some("drop 1 in 3 replies after commit".to_owned()),
            }));
            drop_window = Some(1);
        }
        if round == 40 {
            events.push(Event::FaultEnded(FaultEnd {
                at_ns: now,
                fault_id: 1,
            }));
            drop_window = None;
        }
        if round == 20 || round == 0 {
            events.push(Event::LeaderChanged(LeaderChange {
                at_ns: now,
                leader: Some(1 + round / 20),
                term: Some(1 + round / 20),
                observer: None,
            }));
        }
        if round == 30 {
            // Client 1's session expires on the servers.
            toy.expired.push(sessions[0].0);
        }
        for client in 1..=CLIENTS {
            let slot = (client - 1) as usize;
            op_id += 1;
            sessions[slot].1 += 1;
            let (session, seq) = sessions[slot];
            let op = if rng.below(2) == 0 {
                Op::Append {
                    key: "log".into(),
                    token: format!("c{client}-{session}-{seq}").into(),
                }
            } else {
                Op::Incr {
                    key: "counter".into(),
                    by: 1,
                }
            };
            let request = RequestIdentity::session(session, seq);
            events.push(Event::Invoke(Invocation {
                at_ns: now,
                client,
                op_id,
                request: request.clone(),
                op: op.clone(),
            }));
            let mut outcome = Outcome::Unknown {
                detail: Some("gave up".to_owned()),
            };
            let mut attempts = 0;
            for attempt in 1..=3 {
                attempts = attempt;
                now += STEP_NS;
                let answer = toy.apply(session, seq, &op);
                let dropped = drop_window.is_some()
                    && answer.reply().is_some()
                    && attempt < 3
                    && rng.below(3) == 0;
                events.push(Event::Response(AttemptResponse {
                    at_ns: now,
                    client,
                    op_id: Some(op_id),
                    request: request.clone(),
                    attempt,
                    node: Some(1),
                    answer: answer.clone(),
                    dropped_after_commit: dropped,
                    batch: 1,
                }));
                if dropped {
                    continue;
                }
                outcome = match answer {
                    Answer::Applied {
                        reply, canonical, ..
                    }
                    | Answer::Replayed {
                        reply, canonical, ..
                    } => Outcome::Ok { reply, canonical },
                    Answer::Refused { reason } => Outcome::Failed {
                        reason,
                        detail: None,
                    },
                    Answer::Transient { detail } => Outcome::Unknown {
                        detail: Some(detail),
                    },
                };
                break;
            }
            now += STEP_NS;
            let expired = matches!(
                outcome,
                Outcome::Failed {
                    reason: FailReason::SessionExpired,
                    ..
                }
            );
            events.push(Event::Complete(Completion {
                at_ns: now,
                client,
                op_id,
                attempts,
                outcome,
                request: None,
            }));
            if expired {
                events.push(Event::SessionExpired(ExpiryReport {
                    at_ns: now,
                    client,
                    session,
                }));
                // A store that honours expiry would make the client open a
                // new session; keep the old one to give a store that
                // ignores expiry its chance to misbehave.
                if store != Store::IgnoresExpiry {
                    sessions[slot] = (client * 100 + 1, 0);
                }
            }
        }
        if store == Store::IgnoresExpiry && round == 30 {
            // The client is told its session expired, yet the store keeps
            // applying its requests.
            events.push(Event::SessionExpired(ExpiryReport {
                at_ns: now,
                client: 1,
                session: sessions[0].0,
            }));
        }
    }
    for (key, value) in &toy.values {
        events.push(Event::FinalValue(FinalValue {
            at_ns: now + STEP_NS,
            key: Bytes(key.clone()),
            value: Some(Bytes(value.clone())),
        }));
    }
    events
}

fn record_through_a_file(events: &[Event], name: &str) -> Record {
    let dir = std::env::temp_dir().join(format!("oncekv-check-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{name}.jsonl"));
    {
        let mut writer = RecordWriter::create(&path).expect("create");
        for event in events {
            writer.write(event).expect("write");
        }
        writer.flush().expect("flush");
    }
    let record = Record::load(&path).expect("load");
    let _ = std::fs::remove_file(&path);
    record
}

#[test]
fn a_correct_store_passes_with_full_coverage() {
    let events = simulate(Store::Correct, 7);
    let record = record_through_a_file(&events, "correct");
    let verification = verify(&record, &VerifyConfig::default());
    let report = &verification.report;
    assert_eq!(report.verdict(), RunVerdict::Pass, "{}", report.to_text());
    assert!(report.coverage.replies_dropped_after_commit > 0);
    assert!(report.coverage.replayed > 0);
    assert_eq!(report.coverage.session_expiries, 1);
    assert_eq!(report.coverage.leader_changes, 1);
    assert!(verification.exactly_once.acknowledged > 0);
    assert!(verification.counters.counters[0].sequence_checked);

    let text = report.to_text();
    assert!(text.contains("VERDICT: PASS (seed 7)"), "{text}");
    let html = report.to_html(&record, &HtmlOptions::default());
    assert!(html.contains("<svg") && html.contains("verdict pass"));
}

#[test]
fn a_store_without_dedup_is_caught() {
    let events = simulate(Store::NoDedup, 7);
    let record = record_through_a_file(&events, "no-dedup");
    let verification = verify(&record, &VerifyConfig::default());
    assert_eq!(
        verification.report.verdict(),
        RunVerdict::Fail,
        "{}",
        verification.report.to_text()
    );
    // A dropped reply's retry ran again: duplicated tokens or an
    // overcounted counter, replies that differ, two log indexes.
    assert_eq!(verification.replies.status(), Status::Fail);
    let appends_or_counters = [
        verification.exactly_once.status(),
        verification.counters.status(),
    ];
    assert!(
        appends_or_counters.contains(&Status::Fail),
        "{}\n{}",
        verification.exactly_once,
        verification.counters
    );
}

#[test]
fn a_store_that_ignores_expiry_is_caught() {
    let events = simulate(Store::IgnoresExpiry, 7);
    let record = record_through_a_file(&events, "ignores-expiry");
    let config = VerifyConfig {
        coverage: CoverageRequirements::none(),
        ..VerifyConfig::default()
    };
    let verification = verify(&record, &config);
    assert_status(&verification.session_expiry, Status::Fail);
    assert_eq!(verification.report.verdict(), RunVerdict::Fail);
}

#[test]
fn an_unexercised_run_is_inconclusive() {
    let events: Vec<Event> = simulate(Store::Correct, 7)
        .into_iter()
        .filter(|event| {
            !matches!(
                event,
                Event::LeaderChanged(_) | Event::FaultStarted(_) | Event::FaultEnded(_)
            )
        })
        .collect();
    let record = record_through_a_file(&events, "quiet");
    let verification = verify(&record, &VerifyConfig::default());
    assert_eq!(verification.report.verdict(), RunVerdict::Inconclusive);
    assert!(
        verification
            .report
            .assessment
            .reasons
            .iter()
            .any(|r| r.contains("leader changes")),
        "{:?}",
        verification.report.assessment.reasons
    );
}
