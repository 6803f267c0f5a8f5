//! What watchers observed, as the history records it: a watcher's start
//! ([`WatchStart`]: its prefix, start revision, and whether it is the
//! run's reference read after the faults healed), every change it was
//! given ([`WatchSeen`]), and how it stopped ([`WatchStop`]), folded into
//! one [`WatchRecord`] per watcher.

use super::*;

/// A watcher's number in the run.
pub type WatcherId = u64;

/// Whether a change set or removed its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    /// The key was set.
    Put,
    /// The key was removed.
    Delete,
}

/// A watcher began.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchStart {
    /// When.
    pub at_ns: u64,
    /// Its number.
    pub watcher: WatcherId,
    /// The prefix it watches.
    pub prefix: Bytes,
    /// The first revision it asked for.
    pub start_revision: u64,
    /// Whether it is the reference: read from a healed cluster after the
    /// run, the committed change sequence the others are judged against.
    #[serde(default)]
    pub reference: bool,
}

/// One change a watcher was given.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WatchSeen {
    /// When.
    pub at_ns: u64,
    /// The watcher.
    pub watcher: WatcherId,
    /// The change's revision.
    pub revision: u64,
    /// The key.
    pub key: Bytes,
    /// Put or delete.
    pub kind: WatchKind,
    /// The value after a put.
    #[serde(default)]
    pub value: Option<Bytes>,
}

/// How a watcher ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchEnd {
    /// Stopped by the run.
    Stopped,
    /// Told its next revision was compacted away.
    Compacted {
        /// The compacted revision it was told.
        compacted: u64,
    },
    /// Failed otherwise.
    Failed {
        /// The error.
        detail: String,
    },
}

/// A watcher stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchStop {
    /// When.
    pub at_ns: u64,
    /// The watcher.
    pub watcher: WatcherId,
    /// The highest revision through which it was given every change (its
    /// last change's or progress notice's revision; 0: none).
    pub delivered_through: u64,
    /// Why it stopped.
    pub end: WatchEnd,
}

/// One watcher, folded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchRecord {
    /// Its number.
    pub watcher: WatcherId,
    /// The prefix it watched.
    pub prefix: Bytes,
    /// The first revision it asked for.
    pub start_revision: u64,
    /// Whether it is the reference.
    pub reference: bool,
    /// When it started.
    pub started_ns: u64,
    /// Every change it was given, in the order given.
    pub events: Vec<WatchSeen>,
    /// The revision through which it was given every change.
    pub delivered_through: u64,
    /// How it ended; `None` if the record ends before it did.
    pub end: Option<WatchEnd>,
    /// When it stopped.
    pub stopped_ns: Option<u64>,
}

impl WatchRecord {
    /// A watcher just started.
    pub fn new(start: &WatchStart) -> WatchRecord {
        WatchRecord {
            watcher: start.watcher,
            prefix: start.prefix.clone(),
            start_revision: start.start_revision,
            reference: start.reference,
            started_ns: start.at_ns,
            events: Vec::new(),
            delivered_through: 0,
            end: None,
            stopped_ns: None,
        }
    }
}
