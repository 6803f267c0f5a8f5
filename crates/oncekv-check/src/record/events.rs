//! The events of a recorded run, one JSON line each ([`Event`]), and why
//! a record cannot be read or folded ([`RecordError`], [`Inconsistency`]).

use super::*;

/// The run's parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Nanoseconds since the run started (normally 0).
    pub at_ns: u64,
    /// The seed that reproduces the run's schedule.
    pub seed: u64,
    /// The cluster's nodes.
    #[serde(default)]
    pub nodes: Vec<NodeId>,
    /// Free text: the workload, the nemesis, the build.
    #[serde(default)]
    pub description: String,
}

/// A client issuing an operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invocation {
    /// When.
    pub at_ns: u64,
    /// Which client.
    pub client: ClientId,
    /// The operation's id in this run.
    pub op_id: OpId,
    /// The request's identity, as far as known at invocation.
    #[serde(default)]
    pub request: RequestIdentity,
    /// What was asked.
    pub op: Op,
}

/// A client learning an operation's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// When.
    pub at_ns: u64,
    /// Which client.
    pub client: ClientId,
    /// The operation.
    pub op_id: OpId,
    /// How many times the request was sent.
    pub attempts: u32,
    /// What the client was told.
    pub outcome: Outcome,
    /// Identity fields learned after invocation (a seq assigned at send,
    /// say); they must agree with the invocation's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestIdentity>,
}

/// One attempt's answer, as the client or the fault proxy saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptResponse {
    /// When the answer arrived (or was dropped).
    pub at_ns: u64,
    /// The client the request came from.
    pub client: ClientId,
    /// The operation, when the recorder knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_id: Option<OpId>,
    /// The request's identity.
    #[serde(default)]
    pub request: RequestIdentity,
    /// Which attempt (1-based).
    pub attempt: u32,
    /// The node that answered, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeId>,
    /// The answer.
    pub answer: Answer,
    /// Set by the fault proxy when it dropped this reply after the server
    /// had committed the request: the client never saw it.
    #[serde(default)]
    pub dropped_after_commit: bool,
    /// How many requests the call carrying this attempt held: 1 alone,
    /// more in a batch (0: not known).
    #[serde(default)]
    pub batch: u32,
}

/// A client being told its session expired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiryReport {
    /// When.
    pub at_ns: u64,
    /// The client told.
    pub client: ClientId,
    /// The session.
    pub session: u64,
}

/// A fault beginning.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultStart {
    /// When.
    pub at_ns: u64,
    /// The fault's id in this run.
    pub fault_id: FaultId,
    /// What kind of fault.
    pub kind: FaultKind,
    /// The node it hit, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<NodeId>,
    /// Free text: the partition's sides, the delay, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A fault ending (healed, resumed, restarted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultEnd {
    /// When.
    pub at_ns: u64,
    /// The fault's id.
    pub fault_id: FaultId,
}

/// A leader observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderChange {
    /// When.
    pub at_ns: u64,
    /// The new leader, if known (`None`: no leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<NodeId>,
    /// Its term, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// The client that observed it, if a client did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observer: Option<ClientId>,
}

/// A key's value read after the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalValue {
    /// When it was read.
    pub at_ns: u64,
    /// The key.
    pub key: Bytes,
    /// Its value (`None`: absent).
    #[serde(default)]
    pub value: Option<Bytes>,
}

/// One line of a recorded run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The run's parameters.
    RunStarted(RunInfo),
    /// An operation issued.
    Invoke(Invocation),
    /// An operation's outcome learned.
    Complete(Completion),
    /// One attempt's answer.
    Response(AttemptResponse),
    /// A session expiry reported to a client.
    SessionExpired(ExpiryReport),
    /// A fault began.
    FaultStarted(FaultStart),
    /// A fault ended.
    FaultEnded(FaultEnd),
    /// A leader observed.
    LeaderChanged(LeaderChange),
    /// A key's final value.
    FinalValue(FinalValue),
    /// A watcher began.
    WatchStarted(WatchStart),
    /// A watcher was given a change.
    Watched(WatchSeen),
    /// A watcher stopped.
    WatchStopped(WatchStop),
}

impl Event {
    /// The event's time stamp.
    pub fn at_ns(&self) -> u64 {
        match self {
            Self::RunStarted(e) => e.at_ns,
            Self::Invoke(e) => e.at_ns,
            Self::Complete(e) => e.at_ns,
            Self::Response(e) => e.at_ns,
            Self::SessionExpired(e) => e.at_ns,
            Self::FaultStarted(e) => e.at_ns,
            Self::FaultEnded(e) => e.at_ns,
            Self::LeaderChanged(e) => e.at_ns,
            Self::FinalValue(e) => e.at_ns,
            Self::WatchStarted(e) => e.at_ns,
            Self::Watched(e) => e.at_ns,
            Self::WatchStopped(e) => e.at_ns,
        }
    }
}

/// Why a record could not be read, written or folded.
#[derive(Debug, Error)]
pub enum RecordError {
    /// A file could not be opened or created.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The underlying failure.
        source: io::Error,
    },
    /// Reading or writing the stream failed.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// A line is not a valid event.
    #[error("line {line}: {source}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What serde_json said.
        source: serde_json::Error,
    },
    /// An event could not be encoded.
    #[error("encoding an event: {0}")]
    Encode(serde_json::Error),
    /// The events do not form a consistent run.
    #[error("event {index}: {problem}")]
    Inconsistent {
        /// 0-based position of the offending event in the stream.
        index: usize,
        /// What is wrong.
        problem: Inconsistency,
    },
}

/// How a stream of events contradicts itself.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Inconsistency {
    /// Two invocations share an operation id.
    #[error("operation {0} invoked twice")]
    DuplicateOp(OpId),
    /// A completion names no invoked operation.
    #[error("operation {0} completed but never invoked")]
    CompletedNotInvoked(OpId),
    /// Two completions for one operation.
    #[error("operation {0} completed twice")]
    CompletedTwice(OpId),
    /// A completion precedes its invocation.
    #[error("operation {op_id} completed at {complete_ns} before its invocation at {invoke_ns}")]
    CompletedBeforeInvoked {
        /// The operation.
        op_id: OpId,
        /// Its invocation time.
        invoke_ns: u64,
        /// Its completion time.
        complete_ns: u64,
    },
    /// A completion names another client than the invocation.
    #[error(
        "operation {op_id} invoked by client {invoked_by} but completed by client {completed_by}"
    )]
    ClientMismatch {
        /// The operation.
        op_id: OpId,
        /// The invoking client.
        invoked_by: ClientId,
        /// The completing client.
        completed_by: ClientId,
    },
    /// A completion's request identity contradicts the invocation's.
    #[error("operation {op_id}: the completion's {field} differs from the invocation's")]
    RequestMismatch {
        /// The operation.
        op_id: OpId,
        /// The field that differs.
        field: &'static str,
    },
    /// A request identity that makes no sense.
    #[error("request identity with {0}")]
    BadRequestIdentity(&'static str),
    /// An `Ok` outcome whose reply does not answer the operation.
    #[error("operation {op_id}: a {op} cannot reply {reply}")]
    ReplyMismatch {
        /// The operation.
        op_id: OpId,
        /// The operation's kind.
        op: &'static str,
        /// The reply.
        reply: String,
    },
    /// Two faults share an id.
    #[error("fault {0} started twice")]
    DuplicateFault(FaultId),
    /// A fault's end names no started fault, or ends it twice.
    #[error("fault {0} ended but not running")]
    FaultNotRunning(FaultId),
    /// A fault ended before it started.
    #[error("fault {fault_id} ended at {end_ns} before it started at {start_ns}")]
    FaultEndedBeforeStart {
        /// The fault.
        fault_id: FaultId,
        /// Its start.
        start_ns: u64,
        /// Its end.
        end_ns: u64,
    },
    /// Two `RunStarted` events.
    #[error("the run started twice")]
    RunStartedTwice,
    /// Two different final values for one key.
    #[error("two different final values for key {0}")]
    ConflictingFinalValue(Bytes),
    /// Two starts of one watcher.
    #[error("watcher {0} started twice")]
    WatcherStartedTwice(WatcherId),
    /// A watcher's change or stop before its start.
    #[error("watcher {0} reported before it started")]
    WatcherNotStarted(WatcherId),
    /// Two stops of one watcher.
    #[error("watcher {0} stopped twice")]
    WatcherStoppedTwice(WatcherId),
}
