//! Target `snapshot_restore`: `StateMachine::restore` of arbitrary snapshot
//! bodies. The body is wrapped in a valid header (magic `OKVSNAP\0`, format
//! version, FNV-1a 64 of the body; `crates/oncekv-state/src/snapshot.rs`),
//! so the fuzzer gets past the checksum to the decoding and the consistency
//! checks. `restore` is the streaming `restore_from` over the bytes, so
//! this fuzzes the decoder that reads snapshot files in bounded pieces.
//!
//! Input: `[flags u8][body]`. Bit 0 of `flags` picks the limits to restore
//! under: clear, the limits the body itself names (its first field and
//! the quotas after the state), so a
//! body is not refused for its limits alone; set,
//! [`small_limits`](crate::small_limits). Bits 1-3 at 5, 6 or 7 break the
//! header instead (version, checksum, magic), which must be refused with
//! that typed error.
//!
//! Checked:
//!
//! - `restore` returns `Ok` or a typed [`SnapshotError`], never panics;
//! - a restored machine holds `check_invariants()`, its snapshot restores
//!   to an equal machine with the same bytes (also when read a few bytes
//!   at a time, and when written through `write_snapshot`), and its state
//!   digest is the checksum of those bytes;
//! - commands built from the restored state (requests on its sessions with
//!   their secrets, replays, keep-alives, closes, its leases and keys,
//!   new sessions, idempotency keys, ticks that expire everything up to the
//!   end of time) apply without a panic, the invariants hold after each,
//!   and the machine they leave snapshots and restores too.

use oncekv_state::{
    ClusterTime, Command, Entry, FORMAT_VERSION, IdempotencyKey, KeyRange, Limits, LogIndex,
    Origin, Outcome, Proposal, Query, Request, RequestHeader, RequestId, Secret, Seq, Session,
    SessionId, SnapshotError, StateMachine, Txn, TxnOp, Update,
};

const MAGIC: &[u8; 8] = b"OKVSNAP\0";
const HEADER_BYTES: usize = 8 + 4 + 8;

/// FNV-1a 64, the state digest (and the snapshot body's checksum before
/// format 8).
pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Snapshot bytes for `body`: a valid header, then the body.
pub fn wrap(body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&u64::from(crc32fast::hash(body)).to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// The body of snapshot bytes (after the header).
pub fn body(snapshot: &[u8]) -> &[u8] {
    snapshot.get(HEADER_BYTES..).unwrap_or_default()
}

/// Runs one input; panics when a property breaks.
pub fn snapshot_restore(data: &[u8]) {
    restores(data);
}

/// Runs one input and returns whether its body restored; panics when a
/// property breaks.
pub fn restores(data: &[u8]) -> bool {
    let Some((&flags, body)) = data.split_first() else {
        return false;
    };
    let mut bytes = wrap(body);
    // The limits the body names: its first field, and the quotas after
    // the state (`snapshot_limits` reads both).
    let limits = if flags & 1 == 0 {
        StateMachine::snapshot_limits(&bytes).unwrap_or_else(|_| crate::small_limits())
    } else {
        crate::small_limits()
    };
    match (flags >> 1) & 7 {
        5 => {
            bytes[8..12].copy_from_slice(&FORMAT_VERSION.wrapping_add(1).to_le_bytes());
            let refused = StateMachine::restore(&limits, &bytes);
            assert!(
                matches!(refused, Err(SnapshotError::UnsupportedVersion { .. })),
                "another format version: {refused:?}"
            );
            false
        }
        6 => {
            bytes[12] ^= 1;
            let refused = StateMachine::restore(&limits, &bytes);
            assert!(
                matches!(refused, Err(SnapshotError::ChecksumMismatch)),
                "a wrong checksum: {refused:?}"
            );
            false
        }
        7 => {
            bytes[0] ^= 0x80;
            let refused = StateMachine::restore(&limits, &bytes);
            assert!(
                matches!(refused, Err(SnapshotError::BadMagic)),
                "a wrong magic: {refused:?}"
            );
            false
        }
        _ => match StateMachine::restore(&limits, &bytes) {
            Ok(machine) => {
                check_restored(&machine);
                exercise(machine);
                true
            }
            Err(_) => false,
        },
    }
}

/// A restored machine holds its invariants and survives its own snapshot.
fn check_restored(machine: &StateMachine) {
    if let Err(broken) = machine.check_invariants() {
        panic!("restore returned a machine that breaks an invariant: {broken}");
    }
    let bytes = machine.snapshot();
    let again = StateMachine::restore(machine.limits(), &bytes)
        .unwrap_or_else(|e| panic!("the snapshot of a restored machine does not restore: {e}"));
    assert!(
        again == *machine,
        "a snapshot restores to another machine than it was taken from"
    );
    assert!(
        again.snapshot() == bytes,
        "the same state gives other snapshot bytes"
    );
    let mut written = std::io::Cursor::new(Vec::new());
    machine
        .write_snapshot(&mut written)
        .unwrap_or_else(|e| panic!("a snapshot does not write to memory: {e}"));
    assert!(
        written.into_inner() == bytes,
        "write_snapshot writes other bytes than snapshot"
    );
    let in_pieces = StateMachine::restore_from(machine.limits(), SmallReads(&bytes))
        .unwrap_or_else(|e| panic!("a snapshot read in small pieces does not restore: {e}"));
    assert!(
        in_pieces == again,
        "a snapshot read in small pieces restores to another machine"
    );
    assert_eq!(
        machine.state_digest(),
        fnv64(body(&bytes)),
        "the state digest is not the FNV-1a digest of the snapshot body"
    );
}

/// Hands out at most 7 bytes per read.
struct SmallReads<'a>(&'a [u8]);

impl std::io::Read for SmallReads<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let count = buf.len().min(self.0.len()).min(7);
        buf[..count].copy_from_slice(&self.0[..count]);
        self.0 = &self.0[count..];
        Ok(count)
    }
}

/// A session's secret. Not exposed by `Session`; its encoding starts with
/// its id and then its secret (postcard writes fields in order), which is
/// checked against the id.
fn session_secret(session: &Session) -> Option<Secret> {
    let bytes = postcard::to_allocvec(session).ok()?;
    let ((id, secret), _) = postcard::take_from_bytes::<(SessionId, Secret)>(&bytes).ok()?;
    (id == session.id()).then_some(secret)
}

/// Applies entries after a restored state, checking invariants after each.
struct Driver {
    machine: StateMachine,
    /// The last index applied.
    index: u64,
    /// The cluster time of the last entry.
    time: u64,
}

impl Driver {
    /// Applies `command` from `origin`, `advance_ms` after the last entry;
    /// `None` once the log index cannot grow.
    fn apply(&mut self, origin: Origin, command: Command, advance_ms: u64) -> Option<Outcome> {
        self.index = self.index.checked_add(1)?;
        self.time = self.time.saturating_add(advance_ms);
        let entry = Entry {
            index: LogIndex(self.index),
            proposal: Proposal {
                time: ClusterTime(self.time),
                principal: None,
                request: Request { origin, command },
            },
        };
        let outcome = self.machine.apply(&entry);
        if let Err(broken) = self.machine.check_invariants() {
            panic!("invariant broken after {entry:?} on a restored machine: {broken}");
        }
        Some(outcome)
    }

    fn plain(&mut self, command: Command) -> Option<Outcome> {
        self.apply(Origin::Plain, command, 1)
    }
}

/// Commands built from the restored state, applied in turn.
fn exercise(machine: StateMachine) {
    let limits = machine.limits().clone();
    let mut driver = Driver {
        index: machine.last_applied().map_or(0, |index| index.0),
        time: machine.cluster_time().0,
        machine,
    };
    // Stops at the end of the log's index space.
    let _ = run_script(&mut driver, &limits);
    check_restored(&driver.machine);
}

fn run_script(driver: &mut Driver, limits: &Limits) -> Option<()> {
    let sessions: Vec<_> = driver
        .machine
        .sessions()
        .iter()
        .take(4)
        .map(|s| (s.id(), session_secret(s), s.floor(), s.lowest_unexecuted()))
        .collect();
    for (id, secret, floor, lowest) in &sessions {
        let secret = secret.unwrap_or(Secret(0));
        let header = |seq: Seq, first_incomplete: Seq, secret: Secret| RequestHeader {
            id: RequestId { session: *id, seq },
            secret,
            first_incomplete,
            attempt: 1,
        };
        let put = Command::Put {
            key: b"s".to_vec(),
            value: id.0.to_le_bytes().to_vec().into(),
            lease: None,
        };
        let on_session = Origin::Session(header(*lowest, *floor, secret));
        driver.apply(on_session.clone(), put.clone(), 1)?;
        driver.apply(on_session, put.clone(), 1)?;
        let read = Command::Read(Query::Get { key: b"s".to_vec() });
        driver.apply(Origin::Session(header(*floor, *floor, secret)), read, 1)?;
        let ahead = Seq(lowest.0.saturating_add(1));
        driver.apply(
            Origin::Session(header(ahead, ahead, secret)),
            put.clone(),
            1,
        )?;
        let wrong = Secret(secret.0 ^ 1);
        driver.apply(Origin::Session(header(*lowest, *floor, wrong)), put, 1)?;
        driver.plain(Command::KeepAlive {
            session: *id,
            secret,
        })?;
    }
    if let Some((id, secret, ..)) = sessions.first() {
        driver.plain(Command::CloseSession {
            session: *id,
            secret: secret.unwrap_or(Secret(0)),
        })?;
    }

    let leases: Vec<String> = driver
        .machine
        .leases()
        .iter()
        .take(3)
        .map(|lease| lease.name.clone())
        .collect();
    for name in &leases {
        driver.plain(Command::LeaseKeepAlive { name: name.clone() })?;
        driver.plain(Command::Put {
            key: b"l".to_vec(),
            value: b"leased".to_vec().into(),
            lease: Some(name.clone()),
        })?;
    }
    if let Some(name) = leases.first() {
        driver.plain(Command::LeaseRevoke { name: name.clone() })?;
    }

    let keys: Vec<(Vec<u8>, Vec<u8>)> = driver
        .machine
        .kv()
        .iter()
        .take(3)
        .map(|(key, stored)| (key.clone(), stored.value.to_vec()))
        .collect();
    for (key, value) in &keys {
        driver.plain(Command::Read(Query::Get { key: key.clone() }))?;
        driver.plain(Command::Append {
            key: key.clone(),
            value: b"+".to_vec(),
        })?;
        driver.plain(Command::Incr {
            key: key.clone(),
            by: 1,
        })?;
        driver.plain(Command::Cas {
            key: key.clone(),
            expected: Some(value.clone()),
            new: b"swapped".to_vec(),
        })?;
        driver.plain(Command::Read(Query::Scan {
            prefix: key.get(..1).unwrap_or_default().to_vec(),
            limit: 0,
        }))?;
        driver.plain(Command::Read(Query::Range {
            range: KeyRange::from_key(key.clone()),
            limit: 1,
        }))?;
    }
    if let (Some((first, _)), Some((last, _))) = (keys.first(), keys.last()) {
        let txn = Txn::new()
            .on_success(TxnOp::PutExisting {
                key: last.clone(),
                value: Update::Keep,
                lease: Update::Keep,
            })
            .on_success(TxnOp::DeleteRange {
                range: KeyRange::new(first.clone(), last.clone()),
            });
        driver.plain(Command::Txn(txn))?;
    }
    if let Some((key, _)) = keys.last() {
        driver.plain(Command::Delete { key: key.clone() })?;
    }

    let opened = driver.plain(Command::OpenSession {
        ttl_ms: limits.session_ttl_ms_min,
        window: 1,
        secret: Secret(7),
    })?;
    if let Outcome::Applied(oncekv_state::Reply::SessionOpened { session, .. }) = opened {
        let header = RequestHeader {
            id: RequestId {
                session,
                seq: Seq(1),
            },
            secret: Secret(7),
            first_incomplete: Seq(1),
            attempt: 1,
        };
        let incr = Command::Incr {
            key: b"n".to_vec(),
            by: 1,
        };
        driver.apply(Origin::Session(header), incr, 1)?;
    }
    let key = Origin::Key(IdempotencyKey(b"once".to_vec()));
    let append = Command::Append {
        key: b"k".to_vec(),
        value: b"x".to_vec(),
    };
    driver.apply(key.clone(), append.clone(), 1)?;
    driver.apply(key, append, 1)?;
    driver.plain(Command::LeaseGrant {
        name: "g".into(),
        ttl_ms: limits.lease_ttl_ms_min,
    })?;
    driver.plain(Command::AlarmDisarm)?;
    driver.plain(Command::Read(Query::LeaseList))?;

    // Past every time-to-live the limits allow, then the end of time.
    let longest = limits
        .session_ttl_ms_max
        .max(limits.lease_ttl_ms_max)
        .max(limits.idempotency_key_ttl_ms);
    driver.apply(Origin::Plain, Command::Tick, longest.saturating_add(1))?;
    driver.apply(Origin::Plain, Command::Tick, u64::MAX)?;
    driver.plain(Command::Put {
        key: b"end".to_vec(),
        value: b"of time".to_vec().into(),
        lease: None,
    })?;
    driver.plain(Command::OpenSession {
        ttl_ms: limits.session_ttl_ms_max,
        window: 1,
        secret: Secret(9),
    })?;
    Some(())
}
