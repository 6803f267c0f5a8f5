//! [`Recorder`]: the one place a live run writes its history. Clients,
//! fault proxies and the nemesis all report here; each event is stamped
//! with the time since the run started, under one lock, so the stream is
//! in time order. Operations and faults get their ids here, and the
//! recorder remembers which client and operation own each dedup key, so
//! the fault proxy (which sees only the wire) can attribute every answer.
//! The clock is the monotonic one, or one the caller supplies (simulated
//! time); stamps never go backwards either way.

use oncekv_check::record::{
    Answer, AttemptResponse, Bytes, ClientId, Completion, DedupKey, Event, ExpiryReport, FaultEnd,
    FaultId, FaultKind, FaultStart, FinalValue, Invocation, LeaderChange, NodeId, Op, OpId,
    Outcome, RequestIdentity, RunInfo, WatchEnd, WatchSeen, WatchStart, WatchStop, WatcherId,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Nanoseconds since the run started, from a caller's clock.
pub type ClockFn = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Where stamps come from.
#[derive(Clone)]
enum Clock {
    /// The monotonic clock, from this instant.
    Since(Instant),
    /// The caller's clock.
    Custom(ClockFn),
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Clock::Since(started) => f.debug_tuple("Since").field(started).finish(),
            Clock::Custom(_) => f.write_str("Custom"),
        }
    }
}

/// Collects a run's events.
#[derive(Debug)]
pub struct Recorder {
    clock: Clock,
    /// The last stamp given out (stamps never go backwards).
    last_ns: AtomicU64,
    events: Mutex<Vec<Event>>,
    owners: Mutex<HashMap<DedupKey, (ClientId, OpId)>>,
    next_op: AtomicU64,
    next_fault: AtomicU64,
    completed: AtomicU64,
    faults: AtomicU64,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            clock: Clock::Since(Instant::now()),
            last_ns: AtomicU64::new(0),
            events: Mutex::new(Vec::new()),
            owners: Mutex::new(HashMap::new()),
            next_op: AtomicU64::new(1),
            next_fault: AtomicU64::new(1),
            completed: AtomicU64::new(0),
            faults: AtomicU64::new(0),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// A recorder stamping events with `clock` (nanoseconds since the run
    /// started), e.g. simulated time.
    pub fn with_clock(clock: ClockFn) -> Recorder {
        Recorder {
            clock: Clock::Custom(clock),
            ..Recorder::default()
        }
    }

    /// Nanoseconds since the run started; never less than a stamp given
    /// before.
    pub fn now_ns(&self) -> u64 {
        let now = match &self.clock {
            Clock::Since(started) => {
                u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
            }
            Clock::Custom(clock) => clock(),
        };
        self.last_ns.fetch_max(now, Ordering::Relaxed).max(now)
    }

    fn push(&self, event: impl FnOnce(u64) -> Event) {
        let mut events = lock(&self.events);
        let at_ns = self.now_ns();
        events.push(event(at_ns));
    }

    /// The run's parameters.
    pub fn run_started(&self, seed: u64, nodes: Vec<NodeId>, description: String) {
        self.push(|at_ns| {
            Event::RunStarted(RunInfo {
                at_ns,
                seed,
                nodes,
                description,
            })
        });
    }

    /// A client issues `op` under `request`; returns the operation's id.
    pub fn invoke(&self, client: ClientId, request: RequestIdentity, op: Op) -> OpId {
        let op_id = self.next_op.fetch_add(1, Ordering::Relaxed);
        if let Some(key) = request.dedup_key() {
            lock(&self.owners).insert(key, (client, op_id));
        }
        self.push(|at_ns| {
            Event::Invoke(Invocation {
                at_ns,
                client,
                op_id,
                request,
                op,
            })
        });
        op_id
    }

    /// A client learns an operation's outcome after `attempts` sends.
    pub fn complete(&self, client: ClientId, op_id: OpId, attempts: u32, outcome: Outcome) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        self.push(|at_ns| {
            Event::Complete(Completion {
                at_ns,
                client,
                op_id,
                attempts,
                outcome,
                request: None,
            })
        });
    }

    /// Attributes the answers to `request` to operation `op_id` of
    /// `client`, for an operation made of several requests, each of an
    /// identity of its own (an etcd read-modify-write sends a transaction
    /// per round).
    pub fn attribute(&self, request: RequestIdentity, client: ClientId, op_id: OpId) {
        if let Some(key) = request.dedup_key() {
            lock(&self.owners).insert(key, (client, op_id));
        }
    }

    /// One attempt's answer on the wire, and how many requests its call
    /// held (`batch`). Answers to requests that no recorded operation owns
    /// (plain requests, session control) are not recorded: no checker
    /// could attribute them.
    pub fn response(
        &self,
        request: RequestIdentity,
        attempt: u32,
        node: Option<NodeId>,
        answer: Answer,
        dropped_after_commit: bool,
        batch: u32,
    ) {
        let Some(key) = request.dedup_key() else {
            return;
        };
        let Some((client, op_id)) = lock(&self.owners).get(&key).copied() else {
            return;
        };
        self.push(|at_ns| {
            Event::Response(AttemptResponse {
                at_ns,
                client,
                op_id: Some(op_id),
                request,
                attempt,
                node,
                answer,
                dropped_after_commit,
                batch,
            })
        });
    }

    /// A client was told its session expired.
    pub fn session_expired(&self, client: ClientId, session: u64) {
        self.push(|at_ns| {
            Event::SessionExpired(ExpiryReport {
                at_ns,
                client,
                session,
            })
        });
    }

    /// A fault begins; returns its id for [`Recorder::fault_ended`].
    pub fn fault_started(
        &self,
        kind: FaultKind,
        target: Option<NodeId>,
        detail: Option<String>,
    ) -> FaultId {
        let fault_id = self.next_fault.fetch_add(1, Ordering::Relaxed);
        self.faults.fetch_add(1, Ordering::Relaxed);
        self.push(|at_ns| {
            Event::FaultStarted(FaultStart {
                at_ns,
                fault_id,
                kind,
                target,
                detail,
            })
        });
        fault_id
    }

    /// A fault ends.
    pub fn fault_ended(&self, fault_id: FaultId) {
        self.push(|at_ns| Event::FaultEnded(FaultEnd { at_ns, fault_id }));
    }

    /// A leader observed in `term`.
    pub fn leader(&self, leader: Option<NodeId>, term: Option<u64>) {
        self.push(|at_ns| {
            Event::LeaderChanged(LeaderChange {
                at_ns,
                leader,
                term,
                observer: None,
            })
        });
    }

    /// A key's value after the run.
    pub fn final_value(&self, key: Bytes, value: Option<Bytes>) {
        self.push(|at_ns| Event::FinalValue(FinalValue { at_ns, key, value }));
    }

    /// A watcher began.
    pub fn watch_started(
        &self,
        watcher: WatcherId,
        prefix: Bytes,
        start_revision: u64,
        reference: bool,
    ) {
        self.push(|at_ns| {
            Event::WatchStarted(WatchStart {
                at_ns,
                watcher,
                prefix,
                start_revision,
                reference,
            })
        });
    }

    /// A watcher was given a change (`value` is `None` for a delete).
    pub fn watched(&self, watcher: WatcherId, revision: u64, key: Bytes, value: Option<Bytes>) {
        let kind = if value.is_some() {
            oncekv_check::record::WatchKind::Put
        } else {
            oncekv_check::record::WatchKind::Delete
        };
        self.push(|at_ns| {
            Event::Watched(WatchSeen {
                at_ns,
                watcher,
                revision,
                key,
                kind,
                value,
            })
        });
    }

    /// A watcher stopped, given every change through `delivered_through`.
    pub fn watch_stopped(&self, watcher: WatcherId, delivered_through: u64, end: WatchEnd) {
        self.push(|at_ns| {
            Event::WatchStopped(WatchStop {
                at_ns,
                watcher,
                delivered_through,
                end,
            })
        });
    }

    /// Operations completed so far.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    /// Faults injected so far.
    pub fn faults(&self) -> u64 {
        self.faults.load(Ordering::Relaxed)
    }

    /// Every event so far, in time order.
    pub fn events(&self) -> Vec<Event> {
        lock(&self.events).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_check::record::{Record, Reply};

    #[test]
    fn events_fold_into_a_record_with_attributed_answers() {
        let recorder = Recorder::new();
        recorder.run_started(7, vec![1, 2, 3], "test".into());
        let op = Op::Append {
            key: "k".into(),
            token: "t1".into(),
        };
        let request = RequestIdentity::session(5, 1);
        let op_id = recorder.invoke(3, request.clone(), op);
        let reply = Reply::Append { length: 3 };
        let answer = Answer::Applied {
            reply: reply.clone(),
            canonical: None,
            log_index: Some(9),
        };
        recorder.response(request, 1, Some(2), answer, true, 1);
        recorder.response(
            RequestIdentity::plain(),
            1,
            Some(2),
            Answer::Transient {
                detail: "ignored".into(),
            },
            false,
            1,
        );
        recorder.complete(
            3,
            op_id,
            2,
            Outcome::Ok {
                reply,
                canonical: None,
            },
        );
        recorder.final_value("k".into(), Some("t1;".into()));
        let record = Record::from_events(recorder.events()).expect("a consistent record");
        assert_eq!(record.ops.len(), 1);
        assert_eq!(record.responses.len(), 1);
        assert_eq!(record.responses[0].client, 3);
        assert!(record.responses[0].dropped_after_commit);
        assert_eq!(recorder.completed(), 1);
    }
}
