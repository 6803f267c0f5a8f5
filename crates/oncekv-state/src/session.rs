//! [`SessionTable`]: live sessions, their [`CompletionRecord`]s and the
//! dedup decision of DESIGN.md section 1, in its order: unknown or expired,
//! wrong secret, malformed header, stale, mismatch, replay, gap, execute.
//! Expiry and eviction are functions of replicated state only.

use crate::command::RequestHeader;
use crate::ids::{ClusterTime, LogIndex, Secret, Seq, SessionId};
use crate::outcome::{Malformed, Outcome, Reply};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    records: BTreeMap<Seq, CompletionRecord>,
}

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
        self.records.len()
    }

    fn expires_at(&self) -> ClusterTime {
        self.last_active.plus_ms(self.ttl_ms)
    }

    fn advance_floor(&mut self, first_incomplete: Seq) {
        if first_incomplete > self.floor {
            self.floor = first_incomplete;
            self.records = self.records.split_off(&first_incomplete);
        }
        if self.lowest_unexecuted < self.floor {
            self.lowest_unexecuted = self.floor;
        }
        while self.records.contains_key(&self.lowest_unexecuted) {
            self.lowest_unexecuted = self.lowest_unexecuted.next();
        }
    }

    fn check(&self) -> Result<(), String> {
        let id = self.id.0;
        if !(1..=crate::limits::WINDOW_MAX_ABSOLUTE).contains(&self.window) {
            return Err(format!("session {id}: window {} out of range", self.window));
        }
        if self.lowest_unexecuted < self.floor {
            return Err(format!("session {id}: lowest_unexecuted below floor"));
        }
        if self.records.contains_key(&self.lowest_unexecuted) {
            return Err(format!("session {id}: lowest_unexecuted has a record"));
        }
        let mut seq = self.floor;
        while seq < self.lowest_unexecuted {
            if !self.records.contains_key(&seq) {
                return Err(format!(
                    "session {id}: seq {} missing below lowest_unexecuted",
                    seq.0
                ));
            }
            seq = seq.next();
        }
        if let Some((first, _)) = self.records.first_key_value()
            && *first < self.floor
        {
            return Err(format!("session {id}: record below floor"));
        }
        if let Some((last, _)) = self.records.last_key_value()
            && last.0 >= self.floor.0.saturating_add(u64::from(self.window))
        {
            return Err(format!(
                "session {id}: record {} beyond floor + window",
                last.0
            ));
        }
        Ok(())
    }
}

/// All live sessions, with indexes by activity (for eviction) and by expiry
/// deadline. The indexes are derived and rebuilt on restore.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionTable {
    sessions: BTreeMap<SessionId, Session>,
    by_activity: BTreeSet<(ClusterTime, SessionId)>,
    by_expiry: BTreeSet<(ClusterTime, SessionId)>,
    records_held: u64,
}

impl SessionTable {
    /// Rebuilds a table (and its indexes) from its sessions.
    pub fn from_sessions(sessions: impl IntoIterator<Item = Session>) -> SessionTable {
        let mut table = SessionTable::default();
        for session in sessions {
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

    fn insert(&mut self, session: Session) {
        self.by_activity.insert((session.last_active, session.id));
        self.by_expiry.insert((session.expires_at(), session.id));
        self.records_held += session.records.len() as u64;
        self.sessions.insert(session.id, session);
    }

    fn remove(&mut self, id: SessionId) -> Option<Session> {
        let session = self.sessions.remove(&id)?;
        self.by_activity.remove(&(session.last_active, id));
        self.by_expiry.remove(&(session.expires_at(), id));
        self.records_held -= session.records.len() as u64;
        Some(session)
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
            && let Some(&(_, victim)) = self.by_activity.first()
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
            records: BTreeMap::new(),
        });
        evicted
    }

    /// Authenticates `(id, secret)` and marks the session active at `now`.
    pub fn authenticate(
        &mut self,
        id: SessionId,
        secret: Secret,
        now: ClusterTime,
    ) -> Result<&Session, Outcome> {
        let Some(session) = self.sessions.get(&id) else {
            return Err(Outcome::SessionExpired);
        };
        if session.secret != secret {
            return Err(Outcome::Unauthorized);
        }
        let mut session = self.remove(id).ok_or(Outcome::SessionExpired)?;
        session.last_active = session.last_active.max(now);
        self.insert(session);
        self.sessions.get(&id).ok_or(Outcome::SessionExpired)
    }

    /// Ends a session, freeing its records.
    pub fn close(&mut self, id: SessionId) -> bool {
        self.remove(id).is_some()
    }

    /// Removes every session idle for longer than its ttl at `now`
    /// (`now - last_active > ttl`) and returns their ids.
    pub fn expire(&mut self, now: ClusterTime) -> Vec<SessionId> {
        let mut expired = Vec::new();
        while let Some(&(deadline, id)) = self.by_expiry.first() {
            if deadline >= now {
                break;
            }
            self.remove(id);
            expired.push(id);
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
        if let Some(record) = session.records.get(&seq) {
            if record.digest != digest {
                return Err(Outcome::RequestMismatch);
            }
            let replay = Outcome::Replayed {
                reply: record.reply.clone(),
                applied_index: record.applied_index,
            };
            self.with_session(header.id.session, |s| s.advance_floor(first_incomplete));
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
        let seq = header.id.seq;
        self.with_session(header.id.session, |session| {
            session.records.insert(seq, record);
            session.advance_floor(header.first_incomplete);
        });
    }

    fn with_session(&mut self, id: SessionId, change: impl FnOnce(&mut Session)) {
        if let Some(session) = self.sessions.get_mut(&id) {
            let before = session.records.len() as u64;
            change(session);
            self.records_held = self.records_held - before + session.records.len() as u64;
        }
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
                .contains(&(session.last_active, session.id))
                || !self.by_expiry.contains(&(session.expires_at(), session.id))
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
            records += session.records.len() as u64;
        }
        if records != self.records_held {
            return Err("completion record count out of step".into());
        }
        Ok(())
    }
}
