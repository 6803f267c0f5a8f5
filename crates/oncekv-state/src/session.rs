//! [`SessionTable`]: live sessions, their [`CompletionRecord`]s and the
//! dedup decision of DESIGN.md section 1, in its order: unknown or expired,
//! wrong secret, malformed header, stale, mismatch, replay, gap, execute.
//! Expiry and eviction are functions of replicated state only.

use crate::command::RequestHeader;
use crate::ids::{ClusterTime, LogIndex, Secret, Seq, SessionId};
use crate::outcome::{Malformed, Outcome, Reply};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The remembered response of an executed request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionRecord {
    /// The original reply.
    pub reply: Reply,
    /// Where the request was applied.
    pub applied_index: LogIndex,
    /// Digest of the command, to tell a retry from a different request that
    /// reuses the dedup key.
    pub digest: u64,
}

/// One client session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Session {
    id: SessionId,
    secret: Secret,
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
    /// The keys under which the table's indexes file this session (derived;
    /// never later than the real values).
    #[serde(skip)]
    indexed_activity: ClusterTime,
    #[serde(skip)]
    indexed_expiry: ClusterTime,
}

impl PartialEq for Session {
    /// Equal replicated state; where the lazy indexes file it does not count.
    fn eq(&self, other: &Session) -> bool {
        self.id == other.id
            && self.secret == other.secret
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
            for record in self.records.drain(..freed) {
                if record.is_some() {
                    self.held -= 1;
                }
            }
            self.floor = first_incomplete;
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
        if self.records[offset].replace(record).is_none() {
            self.held += 1;
        }
    }

    fn check(&self) -> Result<(), String> {
        let id = self.id.0;
        if !(1..=crate::limits::WINDOW_MAX_ABSOLUTE).contains(&self.window) {
            return Err(format!("session {id}: window {} out of range", self.window));
        }
        if self.records.len() > self.window as usize {
            return Err(format!(
                "session {id}: {} record slots beyond the window",
                self.records.len()
            ));
        }
        if self.records.back().is_some_and(Option::is_none) {
            return Err(format!("session {id}: trailing empty record slot"));
        }
        if self.records.iter().flatten().count() != self.held {
            return Err(format!("session {id}: held count out of step"));
        }
        if self.lowest_unexecuted < self.floor || self.record(self.lowest_unexecuted).is_some() {
            return Err(format!("session {id}: lowest_unexecuted misplaced"));
        }
        let mut seq = self.floor;
        while seq < self.lowest_unexecuted {
            if self.record(seq).is_none() {
                return Err(format!(
                    "session {id}: seq {} missing below lowest_unexecuted",
                    seq.0
                ));
            }
            seq = seq.next();
        }
        if self.indexed_activity > self.last_active || self.indexed_expiry > self.expires_at() {
            return Err(format!("session {id}: indexed later than it is"));
        }
        Ok(())
    }
}

/// All live sessions, with lazy indexes by activity (for eviction) and by
/// expiry deadline. Each session is filed once in each index under a key
/// never later than its real one, so touching a session costs nothing; a
/// sweep that meets an outdated entry re-files it. The indexes are derived
/// and rebuilt on restore, and decisions never depend on how outdated they
/// are.
#[derive(Clone, Debug, Default)]
pub struct SessionTable {
    sessions: BTreeMap<SessionId, Session>,
    by_activity: BTreeSet<(ClusterTime, SessionId)>,
    by_expiry: BTreeSet<(ClusterTime, SessionId)>,
    records_held: u64,
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
            table.insert(session);
        }
        table
    }

    /// Every session, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values()
    }

    /// How many sessions are live.
    pub fn len(&self) -> u64 {
        self.sessions.len() as u64
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// How many completion records all sessions hold.
    pub fn records_held(&self) -> u64 {
        self.records_held
    }

    /// The session with this id, if live.
    pub fn get(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id)
    }

    fn insert(&mut self, mut session: Session) {
        session.indexed_activity = session.last_active;
        session.indexed_expiry = session.expires_at();
        self.by_activity
            .insert((session.indexed_activity, session.id));
        self.by_expiry.insert((session.indexed_expiry, session.id));
        self.records_held += session.held as u64;
        self.sessions.insert(session.id, session);
    }

    fn remove(&mut self, id: SessionId) -> Option<Session> {
        let session = self.sessions.remove(&id)?;
        self.by_activity.remove(&(session.indexed_activity, id));
        self.by_expiry.remove(&(session.indexed_expiry, id));
        self.records_held -= session.held as u64;
        Some(session)
    }

    /// The least recently active session (ties by id).
    fn least_recently_active(&mut self) -> Option<SessionId> {
        while let Some(&(indexed, id)) = self.by_activity.first() {
            let session = self.sessions.get_mut(&id)?;
            if session.last_active == indexed {
                return Some(id);
            }
            self.by_activity.remove(&(indexed, id));
            session.indexed_activity = session.last_active;
            self.by_activity.insert((session.last_active, id));
        }
        None
    }

    /// Opens session `id` at `now`. When `sessions_max` are live, the least
    /// recently active (ties by id) is evicted first; it is returned.
    pub fn open(
        &mut self,
        id: SessionId,
        secret: Secret,
        ttl_ms: u64,
        window: u32,
        now: ClusterTime,
        sessions_max: u64,
    ) -> Option<SessionId> {
        let mut evicted = None;
        if self.len() >= sessions_max
            && let Some(victim) = self.least_recently_active()
        {
            self.remove(victim);
            evicted = Some(victim);
        }
        self.insert(Session {
            id,
            secret,
            ttl_ms,
            window,
            last_active: now,
            floor: Seq(1),
            lowest_unexecuted: Seq(1),
            records: VecDeque::new(),
            held: 0,
            indexed_activity: now,
            indexed_expiry: now,
        });
        evicted
    }

    /// Authenticates `(id, secret)` and marks the session active at `now`.
    pub fn authenticate(
        &mut self,
        id: SessionId,
        secret: Secret,
        now: ClusterTime,
    ) -> Result<&mut Session, Outcome> {
        let Some(session) = self.sessions.get_mut(&id) else {
            return Err(Outcome::SessionExpired);
        };
        if session.secret != secret {
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
        while let Some(&(indexed, id)) = self.by_expiry.first() {
            if indexed >= now {
                break;
            }
            let Some(session) = self.sessions.get_mut(&id) else {
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
    /// "execute it now, then call [`SessionTable::complete`]"; `Err` carries
    /// the outcome to return instead (a replay or a refusal).
    pub fn admit(
        &mut self,
        header: &RequestHeader,
        digest: u64,
        now: ClusterTime,
    ) -> Result<(), Outcome> {
        let seq = header.id.seq;
        let first_incomplete = header.first_incomplete;
        let session = self.authenticate(header.id.session, header.secret, now)?;
        if seq.0 == 0 {
            return Err(Outcome::Malformed(Malformed::SeqZero));
        }
        if first_incomplete > seq {
            return Err(Outcome::Malformed(Malformed::FirstIncompleteAhead {
                seq: seq.0,
                first_incomplete: first_incomplete.0,
            }));
        }
        if seq < session.floor {
            return Err(Outcome::Stale {
                floor: session.floor,
            });
        }
        if let Some(record) = session.record(seq) {
            if record.digest != digest {
                return Err(Outcome::RequestMismatch);
            }
            let replay = Outcome::Replayed {
                reply: record.reply.clone(),
                applied_index: record.applied_index,
            };
            let before = session.held;
            session.advance_floor(first_incomplete);
            self.records_held -= (before - session.held) as u64;
            return Err(replay);
        }
        let window = u64::from(session.window);
        let beyond_unexecuted = seq.0 >= session.lowest_unexecuted.0.saturating_add(window);
        let beyond_acknowledged =
            seq.0 >= session.floor.max(first_incomplete).0.saturating_add(window);
        if beyond_unexecuted || beyond_acknowledged {
            return Err(Outcome::SequenceGap {
                expected: session.lowest_unexecuted,
            });
        }
        Ok(())
    }

    /// Records the reply of a request that [`SessionTable::admit`] let
    /// through, and moves the watermark.
    pub fn complete(&mut self, header: &RequestHeader, record: CompletionRecord) {
        let Some(session) = self.sessions.get_mut(&header.id.session) else {
            return;
        };
        let before = session.held;
        session.advance_floor(header.first_incomplete);
        session.insert_record(header.id.seq, record);
        session.advance_floor(session.floor);
        self.records_held = self.records_held + session.held as u64 - before as u64;
    }

    /// Checks the table's invariants.
    pub fn check_invariants(&self, now: ClusterTime, sessions_max: u64) -> Result<(), String> {
        if self.len() > sessions_max {
            return Err(format!(
                "{} sessions exceed the limit {sessions_max}",
                self.len()
            ));
        }
        if self.by_activity.len() != self.sessions.len()
            || self.by_expiry.len() != self.sessions.len()
        {
            return Err("session indexes out of step".into());
        }
        let mut records = 0;
        for (id, session) in &self.sessions {
            if *id != session.id {
                return Err(format!("session {} filed under {}", session.id.0, id.0));
            }
            if !self
                .by_activity
                .contains(&(session.indexed_activity, session.id))
                || !self
                    .by_expiry
                    .contains(&(session.indexed_expiry, session.id))
            {
                return Err(format!("session {} missing from an index", id.0));
            }
            if session.last_active > now {
                return Err(format!("session {} active in the future", id.0));
            }
            if session.expires_at() < now {
                return Err(format!("session {} outlived its ttl", id.0));
            }
            session.check()?;
            records += session.held as u64;
        }
        if records != self.records_held {
            return Err("completion record count out of step".into());
        }
        Ok(())
    }
}
