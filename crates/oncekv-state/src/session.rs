//! [`SessionTable`]: live sessions, their [`CompletionRecord`]s and the
//! dedup decision ([`SessionTable::admit`]), in its order: unknown or expired,
//! wrong secret, malformed header, stale, mismatch, replay, gap, execute.
//! Expiry is a function of replicated state only; a full table refuses a
//! new session and never evicts a live one, and a session's records are
//! bounded in count (its window) and in bytes (its budget and the table's).

use crate::command::RequestHeader;
use crate::ids::{ClusterTime, LogIndex, Principal, Secret, SecretHash, Seq, SessionId};
use crate::invariant::{BrokenInvariant, Table};
use crate::outcome::{Outcome, Reply};
use crate::overhead::ENTRY_OVERHEAD_BYTES;
use crate::quota::UsageByOwner;
use crate::refusal::{Malformed, Overload};
use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;

/// Slots a session's record ring keeps when it shrinks.
const RING_SLOTS_KEPT: usize = 4;

/// The remembered response of an executed request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionRecord {
    /// The original reply; `None` for a read, whose value is not kept: a
    /// retried read is answered from the current state, which is as
    /// linearizable and keeps large values out of the records.
    pub reply: Option<Reply>,
    /// Where the request was applied.
    pub applied_index: LogIndex,
    /// Digest of the command, to tell a retry from a different request that
    /// reuses the dedup key.
    pub digest: u64,
}

impl CompletionRecord {
    /// The bytes the record holds, as the byte budgets count them.
    pub fn weight_bytes(&self) -> u64 {
        self.reply
            .as_ref()
            .map_or(ENTRY_OVERHEAD_BYTES, Reply::weight_bytes)
    }
}

/// Why a request on a session is not executed now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotExecuted {
    /// It ran before: answer from this record.
    Replay(CompletionRecord),
    /// Refused, with this outcome (never cached).
    Refused(Outcome),
}

impl From<Outcome> for NotExecuted {
    fn from(outcome: Outcome) -> NotExecuted {
        NotExecuted::Refused(outcome)
    }
}

/// The byte budgets of completion records a request is admitted under.
#[derive(Clone, Copy, Debug)]
pub struct RecordBudget {
    /// Most bytes one session's records may hold.
    pub session_bytes_max: u64,
    /// Most bytes all sessions' records may hold (for a non-admin, less
    /// the admin reserve).
    pub total_bytes_max: u64,
    /// Most bytes the records of all sessions of the session's owner may
    /// hold (`None` for an admin, or while authentication is off).
    pub user_bytes_max: Option<u64>,
}

/// The bounds on live sessions a session is opened under.
#[derive(Clone, Copy, Debug)]
pub struct SessionBudget {
    /// Most live sessions (for a non-admin, less the admin reserve).
    pub total_max: u64,
    /// Most live sessions of the opener (`None` for an admin, or while
    /// authentication is off).
    pub user_max: Option<u64>,
}

/// One client session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Session {
    id: SessionId,
    /// The hash of its secret: the state never keeps the secret itself.
    secret_hash: SecretHash,
    /// Who opened it (while authentication is enforced, only they may use
    /// it).
    owner: Option<Principal>,
    ttl_ms: u64,
    window: u32,
    last_active: ClusterTime,
    /// Every seq below it is acknowledged and its record freed.
    floor: Seq,
    /// The lowest seq at or above `floor` without a completion record.
    lowest_unexecuted: Seq,
    /// Position `i` holds the record of seq `floor + i`; never longer than
    /// the window.
    records: VecDeque<Option<CompletionRecord>>,
    /// How many positions of `records` hold a record (derived).
    #[serde(skip)]
    held: usize,
    /// The bytes those records hold (derived).
    #[serde(skip)]
    held_bytes: u64,
    /// The key under which the table's index files this session (derived;
    /// never later than the real deadline).
    #[serde(skip)]
    indexed_expiry: ClusterTime,
}

impl PartialEq for Session {
    /// Equal replicated state; where the lazy indexes file it does not count.
    fn eq(&self, other: &Session) -> bool {
        self.id == other.id
            && self.secret_hash == other.secret_hash
            && self.owner == other.owner
            && self.ttl_ms == other.ttl_ms
            && self.window == other.window
            && self.last_active == other.last_active
            && self.floor == other.floor
            && self.lowest_unexecuted == other.lowest_unexecuted
            && self.records == other.records
    }
}

impl Eq for Session {}

impl Session {
    /// The session's id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// Who opened it.
    pub fn owner(&self) -> Option<&Principal> {
        self.owner.as_ref()
    }

    /// Its idle time-to-live.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// Its in-flight window.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// When it last saw an authenticated request.
    pub fn last_active(&self) -> ClusterTime {
        self.last_active
    }

    /// Its acknowledged watermark.
    pub fn floor(&self) -> Seq {
        self.floor
    }

    /// The lowest sequence number not yet executed.
    pub fn lowest_unexecuted(&self) -> Seq {
        self.lowest_unexecuted
    }

    /// How many completion records it holds.
    pub fn records_held(&self) -> usize {
        self.held
    }

    /// The bytes its completion records hold.
    pub fn records_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// The completion record of `seq`, if held.
    pub fn record(&self, seq: Seq) -> Option<&CompletionRecord> {
        let offset = seq.0.checked_sub(self.floor.0)?;
        self.records.get(usize::try_from(offset).ok()?)?.as_ref()
    }

    fn expires_at(&self) -> ClusterTime {
        self.last_active.plus_ms(self.ttl_ms)
    }

    fn advance_floor(&mut self, first_incomplete: Seq) {
        if first_incomplete > self.floor {
            let freed = first_incomplete.0 - self.floor.0;
            let freed = usize::try_from(freed)
                .unwrap_or(usize::MAX)
                .min(self.records.len());
            for record in self.records.drain(..freed).flatten() {
                self.held -= 1;
                self.held_bytes -= record.weight_bytes();
            }
            self.floor = first_incomplete;
            // The ring's memory follows what it holds: a session that once
            // had its whole window in flight does not keep that capacity
            // (the byte budgets count records, not slots).
            let wanted = self.records.len().max(RING_SLOTS_KEPT);
            if self.records.capacity() > 4 * wanted {
                self.records.shrink_to(wanted);
            }
        }
        if self.lowest_unexecuted < self.floor {
            self.lowest_unexecuted = self.floor;
        }
        while self.record(self.lowest_unexecuted).is_some() {
            self.lowest_unexecuted = self.lowest_unexecuted.next();
        }
    }

    /// Stores the record of `seq`, which admission placed within
    /// `floor..floor + window`.
    fn insert_record(&mut self, seq: Seq, record: CompletionRecord) {
        let offset = usize::try_from(seq.0 - self.floor.0).expect("admitted within the window");
        assert!(
            offset < self.window as usize,
            "record {} beyond the window",
            seq.0
        );
        if offset >= self.records.len() {
            self.records.resize_with(offset + 1, || None);
        }
        self.held_bytes += record.weight_bytes();
        match self.records[offset].replace(record) {
            Some(old) => self.held_bytes -= old.weight_bytes(),
            None => self.held += 1,
        }
    }

    /// The bytes of the records below `seq` (freed once `seq` is the
    /// acknowledged watermark).
    fn bytes_below(&self, seq: Seq) -> u64 {
        let count = seq.0.saturating_sub(self.floor.0);
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        self.records
            .iter()
            .take(count)
            .flatten()
            .map(CompletionRecord::weight_bytes)
            .sum()
    }

    fn check(&self) -> Result<(), BrokenInvariant> {
        let id = self.id.0;
        if !(1..=crate::limits::WINDOW_MAX_ABSOLUTE).contains(&self.window) {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                format!("session {id}: window {} out of range", self.window),
            ));
        }
        if self.records.len() > self.window as usize {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                format!(
                    "session {id}: {} record slots beyond the window",
                    self.records.len()
                ),
            ));
        }
        if self.records.back().is_some_and(Option::is_none) {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                format!("session {id}: trailing empty record slot"),
            ));
        }
        if self.records.iter().flatten().count() != self.held {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                format!("session {id}: held count out of step"),
            ));
        }
        let bytes: u64 = self
            .records
            .iter()
            .flatten()
            .map(CompletionRecord::weight_bytes)
            .sum();
        if bytes != self.held_bytes {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                format!("session {id}: held bytes out of step"),
            ));
        }
        if self.lowest_unexecuted < self.floor || self.record(self.lowest_unexecuted).is_some() {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                format!("session {id}: lowest_unexecuted misplaced"),
            ));
        }
        let mut seq = self.floor;
        while seq < self.lowest_unexecuted {
            if self.record(seq).is_none() {
                return Err(BrokenInvariant::new(
                    Table::Sessions,
                    format!(
                        "session {id}: seq {} missing below lowest_unexecuted",
                        seq.0
                    ),
                ));
            }
            seq = seq.next();
        }
        if self.indexed_expiry > self.expires_at() {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                format!("session {id}: indexed later than it is"),
            ));
        }
        Ok(())
    }
}

/// All live sessions, with a lazy index by expiry deadline. Each session is
/// filed once in the index under a key never later than its real one, so
/// touching a session costs nothing; a sweep that meets an outdated entry
/// re-files it. The index is derived and rebuilt on restore, and decisions
/// never depend on how outdated it is.
///
/// The maps share structure and each session is shared ([`Arc`]), so a
/// copy of the table (for a snapshot, taken under the state lock) costs
/// the same whatever its size; a change made while a copy is alive copies
/// only the path to the session and the session itself.
#[derive(Clone, Debug, Default)]
pub struct SessionTable {
    sessions: OrdMap<SessionId, Arc<Session>>,
    by_expiry: OrdSet<(ClusterTime, SessionId)>,
    records_held: u64,
    records_bytes: u64,
    /// Sessions and record bytes per owner (derived).
    owners: UsageByOwner,
}

impl PartialEq for SessionTable {
    fn eq(&self, other: &SessionTable) -> bool {
        self.sessions == other.sessions
    }
}

impl Eq for SessionTable {}

impl SessionTable {
    /// Rebuilds a table (and its indexes) from its sessions.
    pub fn from_sessions(sessions: impl IntoIterator<Item = Session>) -> SessionTable {
        let mut table = SessionTable::default();
        for mut session in sessions {
            session.held = session.records.iter().flatten().count();
            session.held_bytes = session
                .records
                .iter()
                .flatten()
                .map(CompletionRecord::weight_bytes)
                .sum();
            table.insert(session);
        }
        table
    }

    /// Every session, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values().map(|session| &**session)
    }

    /// How many sessions are live.
    pub fn len(&self) -> u64 {
        self.sessions.len() as u64
    }

    /// The earliest expiry deadline the index holds: never later than any
    /// session's real one (keep-alives move deadlines without re-filing),
    /// so time past it may expire a session, and re-files the rest.
    pub fn next_deadline(&self) -> Option<ClusterTime> {
        self.by_expiry.get_min().map(|&(deadline, _)| deadline)
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// How many completion records all sessions hold.
    pub fn records_held(&self) -> u64 {
        self.records_held
    }

    /// How many bytes all sessions' completion records hold.
    pub fn records_bytes(&self) -> u64 {
        self.records_bytes
    }

    /// What each owner holds: its live sessions (`count`) and their
    /// records' bytes.
    pub fn usage(&self) -> &UsageByOwner {
        &self.owners
    }

    /// The ids of the live sessions `owner` opened.
    pub fn owned_by(&self, owner: &Principal) -> Vec<SessionId> {
        self.sessions
            .values()
            .filter(|session| session.owner.as_ref() == Some(owner))
            .map(|session| session.id)
            .collect()
    }

    /// The session with this id, if live.
    pub fn get(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id).map(|session| &**session)
    }

    /// The session with this id, to change (copied first if a copy of the
    /// table shares it).
    fn get_mut(&mut self, id: SessionId) -> Option<&mut Session> {
        self.sessions.get_mut(&id).map(Arc::make_mut)
    }

    fn insert(&mut self, mut session: Session) {
        session.indexed_expiry = session.expires_at();
        self.by_expiry.insert((session.indexed_expiry, session.id));
        self.records_held += session.held as u64;
        self.records_bytes += session.held_bytes;
        self.owners
            .add(session.owner.as_ref(), 1, session.held_bytes);
        self.sessions.insert(session.id, Arc::new(session));
    }

    fn remove(&mut self, id: SessionId) -> Option<Arc<Session>> {
        let session = self.sessions.remove(&id)?;
        self.by_expiry.remove(&(session.indexed_expiry, id));
        self.records_held -= session.held as u64;
        self.records_bytes -= session.held_bytes;
        self.owners
            .sub(session.owner.as_ref(), 1, session.held_bytes);
        Some(session)
    }

    /// Opens session `id` for `owner` at `now`, unless the budget's
    /// sessions are live (all, or the owner's): then nothing changes and
    /// the refusal is returned. No live session is ever evicted to make
    /// room.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &mut self,
        id: SessionId,
        secret: Secret,
        owner: Option<Principal>,
        ttl_ms: u64,
        window: u32,
        now: ClusterTime,
        budget: SessionBudget,
    ) -> Result<(), Overload> {
        if let (Some(max), Some(owner)) = (budget.user_max, &owner)
            && self.owners.of(owner).count >= max
        {
            return Err(Overload::UserSessions { max });
        }
        if self.len() >= budget.total_max {
            return Err(Overload::Sessions {
                max: budget.total_max,
            });
        }
        self.insert(Session {
            id,
            secret_hash: secret.hash(),
            owner,
            ttl_ms,
            window,
            last_active: now,
            floor: Seq(1),
            lowest_unexecuted: Seq(1),
            records: VecDeque::new(),
            held: 0,
            held_bytes: 0,
            indexed_expiry: now,
        });
        Ok(())
    }

    /// Authenticates `(id, secret)` and marks the session active at `now`.
    pub fn authenticate(
        &mut self,
        id: SessionId,
        secret: Secret,
        now: ClusterTime,
    ) -> Result<&mut Session, Outcome> {
        let Some(session) = self.get_mut(id) else {
            return Err(Outcome::SessionExpired);
        };
        if session.secret_hash != secret.hash() {
            return Err(Outcome::Unauthorized);
        }
        session.last_active = session.last_active.max(now);
        Ok(session)
    }

    /// Ends a session, freeing its records.
    pub fn close(&mut self, id: SessionId) -> bool {
        self.remove(id).is_some()
    }

    /// Removes every session idle for longer than its ttl at `now`
    /// (`now - last_active > ttl`) and returns their ids.
    pub fn expire(&mut self, now: ClusterTime) -> Vec<SessionId> {
        let mut expired = Vec::new();
        while let Some(&(indexed, id)) = self.by_expiry.get_min() {
            if indexed >= now {
                break;
            }
            let Some(session) = self.sessions.get_mut(&id).map(Arc::make_mut) else {
                self.by_expiry.remove(&(indexed, id));
                continue;
            };
            let deadline = session.expires_at();
            if deadline < now {
                self.remove(id);
                expired.push(id);
            } else {
                self.by_expiry.remove(&(indexed, id));
                session.indexed_expiry = deadline;
                self.by_expiry.insert((deadline, id));
            }
        }
        expired
    }

    /// Decides what to do with a request on a session. `Ok(())` means
    /// "execute it now, then call [`SessionTable::complete`]"; `Err` says
    /// what to answer instead (a replay or a refusal).
    ///
    /// After the window, the byte budgets: a request is refused
    /// (`Overloaded`) while the records its session would still hold once
    /// its acknowledgement is applied fill the session's budget, unless it
    /// is the lowest request the client awaits (whose completion is what
    /// lets the watermark move, so refusing it could never end), while
    /// the records of all its owner's sessions fill the owner's share (the
    /// owner frees them by acknowledging or closing its own sessions), or
    /// while all sessions' records fill the table's budget. Each budget is
    /// passed by at most a record or two, never without bound.
    pub fn admit(
        &mut self,
        header: &RequestHeader,
        digest: u64,
        now: ClusterTime,
        budget: RecordBudget,
    ) -> Result<(), NotExecuted> {
        let seq = header.id.seq;
        let first_incomplete = header.first_incomplete;
        let session = self.authenticate(header.id.session, header.secret, now)?;
        if seq.0 == 0 {
            return Err(Outcome::Malformed(Malformed::SeqZero).into());
        }
        if first_incomplete > seq {
            return Err(Outcome::Malformed(Malformed::FirstIncompleteAhead {
                seq: seq.0,
                first_incomplete: first_incomplete.0,
            })
            .into());
        }
        if seq < session.floor {
            return Err(Outcome::Stale {
                floor: session.floor,
            }
            .into());
        }
        if let Some(record) = session.record(seq) {
            if record.digest != digest {
                return Err(Outcome::RequestMismatch.into());
            }
            let replay = NotExecuted::Replay(record.clone());
            let (held, bytes) = (session.held, session.held_bytes);
            session.advance_floor(first_incomplete);
            let freed = ((held - session.held) as u64, bytes - session.held_bytes);
            let owner = session.owner.clone();
            self.records_held -= freed.0;
            self.records_bytes -= freed.1;
            self.owners.sub(owner.as_ref(), 0, freed.1);
            return Err(replay);
        }
        let window = u64::from(session.window);
        let beyond_unexecuted = seq.0 >= session.lowest_unexecuted.0.saturating_add(window);
        let beyond_acknowledged =
            seq.0 >= session.floor.max(first_incomplete).0.saturating_add(window);
        if beyond_unexecuted || beyond_acknowledged {
            return Err(Outcome::SequenceGap {
                expected: session.lowest_unexecuted,
            }
            .into());
        }
        let watermark = session.floor.max(first_incomplete);
        let freed = session.bytes_below(watermark);
        let session_bytes = session.held_bytes - freed;
        if seq != watermark && session_bytes >= budget.session_bytes_max {
            return Err(Outcome::Overloaded(Overload::SessionRecordBytes {
                max: budget.session_bytes_max,
            })
            .into());
        }
        let owner = budget.user_bytes_max.and_then(|_| session.owner.clone());
        if let (Some(max), Some(owner)) = (budget.user_bytes_max, owner)
            && self.owners.of(&owner).bytes - freed >= max
        {
            return Err(Outcome::Overloaded(Overload::UserRecordBytes { max }).into());
        }
        if self.records_bytes - freed >= budget.total_bytes_max {
            return Err(Outcome::Overloaded(Overload::RecordBytes {
                max: budget.total_bytes_max,
            })
            .into());
        }
        Ok(())
    }

    /// Records the reply of a request that [`SessionTable::admit`] let
    /// through, and moves the watermark.
    ///
    /// # Panics
    ///
    /// If the session is not live: admission just found it, and nothing
    /// between admission and completion removes a session.
    pub fn complete(&mut self, header: &RequestHeader, record: CompletionRecord) {
        let session = self
            .sessions
            .get_mut(&header.id.session)
            .map(Arc::make_mut)
            .expect("a session admitted a request and is gone before its completion");
        let (held, bytes) = (session.held, session.held_bytes);
        session.advance_floor(header.first_incomplete);
        session.insert_record(header.id.seq, record);
        session.advance_floor(session.floor);
        self.records_held = self.records_held + session.held as u64 - held as u64;
        self.records_bytes = self.records_bytes + session.held_bytes - bytes;
        let owner = session.owner.as_ref();
        if session.held_bytes >= bytes {
            self.owners.add(owner, 0, session.held_bytes - bytes);
        } else {
            self.owners.sub(owner, 0, bytes - session.held_bytes);
        }
    }

    /// Checks the table's invariants.
    pub fn check_invariants(
        &self,
        now: ClusterTime,
        sessions_max: u64,
    ) -> Result<(), BrokenInvariant> {
        if self.len() > sessions_max {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                format!("{} sessions exceed the limit {sessions_max}", self.len()),
            ));
        }
        if self.by_expiry.len() != self.sessions.len() {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                "session index out of step",
            ));
        }
        let mut records = 0;
        let mut bytes = 0;
        let mut owners = UsageByOwner::default();
        for (id, session) in &self.sessions {
            if *id != session.id {
                return Err(BrokenInvariant::new(
                    Table::Sessions,
                    format!("session {} filed under {}", session.id.0, id.0),
                ));
            }
            if !self
                .by_expiry
                .contains(&(session.indexed_expiry, session.id))
            {
                return Err(BrokenInvariant::new(
                    Table::Sessions,
                    format!("session {} missing from an index", id.0),
                ));
            }
            if session.last_active > now {
                return Err(BrokenInvariant::new(
                    Table::Sessions,
                    format!("session {} active in the future", id.0),
                ));
            }
            if session.expires_at() < now {
                return Err(BrokenInvariant::new(
                    Table::Sessions,
                    format!("session {} outlived its ttl", id.0),
                ));
            }
            session.check()?;
            records += session.held as u64;
            bytes += session.held_bytes;
            owners.add(session.owner.as_ref(), 1, session.held_bytes);
        }
        if owners != self.owners {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                "sessions or record bytes per owner out of step",
            ));
        }
        if records != self.records_held || bytes != self.records_bytes {
            return Err(BrokenInvariant::new(
                Table::Sessions,
                "completion record count or bytes out of step",
            ));
        }
        Ok(())
    }
}
