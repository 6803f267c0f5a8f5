//! Snapshot encoding of a [`StateMachine`]: deterministic bytes (the same
//! state gives the same bytes on every replica), a magic and format version,
//! a checksum, and a restore that checks everything it reads.
//!
//! Both directions stream in bounded memory (pieces of
//! [`crate::stream::CHUNK_BYTES`]): [`StateMachine::write_snapshot`] encodes
//! to any `Write + Seek` (the checksum is computed as the body goes out and
//! filled into the header after it), and [`StateMachine::restore_from`]
//! decodes from any `Read`, checksumming as it reads and judging the
//! checksum before the decoded state. [`StateMachine::snapshot`] and
//! [`StateMachine::restore`] are the same over bytes in memory.
//!
//! Layout: `b"OKVSNAP\0"`, format version (u32 LE), the checksum of what
//! follows (u64 LE: CRC-32 from format 8, FNV-1a 64 before), then the body
//! in postcard, then, once the cluster's id is recorded, that id (a
//! postcard `u64`). A snapshot without the id (one
//! taken before it was recorded, or by an earlier release) restores with
//! none. Derived indexes are not stored; they are rebuilt on restore.
//!
//! Format 8 (written now) is format 7 checksummed by CRC-32, which is
//! computed many bytes a step where FNV-1a takes one (over a body of a
//! gigabyte, a second and more of each snapshot written and restored);
//! format 7 is still read. Format 7 ends the body with the members'
//! `NOSPACE` alarms raised by hand; format 6 ends it with the per-user quotas
//! ([`UserQuotas`], a part of the limits) and the serial numbers of the
//! revoked client certificates (a part of the [`AuthTable`]). Format 5
//! (the same without them) is still read, with the default quotas and
//! nothing revoked; so is format 4, whose
//! leases have no owners: they restore without one, so they stay
//! anyone's to use, as every lease was when it was written.

use crate::auth::AuthTable;
use crate::digest::{BodyChecksum, Fnv64};
use crate::idempotency::{IdempotencyKeys, KeyRecord};
use crate::ids::{ClusterTime, LogIndex};
use crate::invariant::{BrokenInvariant, Table};
use crate::kv::KvStore;
use crate::lease::{Lease, Leases};
use crate::limits::Limits;
use crate::machine::StateMachine;
use crate::quota::UserQuotas;
use crate::session::{Session, SessionTable};
use crate::stream::{CHUNK_BYTES, Sink, Source};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"OKVSNAP\0";
/// The snapshot format this build writes (it reads this one, format 7
/// checksummed by FNV-1a, format 6 without the alarms raised by hand,
/// format 5 without the quotas and format 4 whose leases have no owners).
pub const FORMAT_VERSION: u32 = 8;
/// An earlier format this build still reads: the same body, checksummed
/// by FNV-1a 64 (as every format before it).
pub const FORMAT_VERSION_FNV: u32 = 7;
/// An earlier format this build still reads: without the alarms raised
/// by hand.
pub const FORMAT_VERSION_NO_ALARMS: u32 = 6;
/// An earlier format this build still reads: without the quotas.
pub const FORMAT_VERSION_NO_QUOTAS: u32 = 5;
/// The earliest format this build still reads: leases without owners.
pub const FORMAT_VERSION_NO_OWNERS: u32 = 4;
const HEADER_BYTES: usize = 8 + 4 + 8;

/// Why snapshot bytes could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes do not start with the snapshot magic.
    #[error("not an oncekv snapshot (bad magic)")]
    BadMagic,
    /// Written by a format this build does not read.
    #[error(
        "snapshot format {found} is not supported (this build reads {FORMAT_VERSION_NO_OWNERS} to {FORMAT_VERSION})"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// The body does not match its checksum.
    #[error("snapshot checksum mismatch: corrupt or truncated")]
    ChecksumMismatch,
    /// The body does not decode.
    #[error("snapshot body does not decode: {0}")]
    Decode(#[from] postcard::Error),
    /// Bytes follow the body and the cluster's id.
    #[error("snapshot has bytes after its body and cluster id")]
    TrailingBytes,
    /// The snapshot was taken with other limits than this node's.
    #[error("snapshot limits differ from this node's configured limits")]
    LimitsMismatch,
    /// The decoded state breaks an invariant.
    #[error("snapshot state is inconsistent: {0}")]
    Inconsistent(#[from] crate::invariant::BrokenInvariant),
    /// The snapshot could not be read.
    #[error("reading the snapshot: {0}")]
    Io(#[from] io::Error),
}

/// The body as written: borrowed from the machine, so taking a snapshot or
/// a digest copies nothing but the encoding. Encodes as [`Body`] followed
/// by the quotas and the revoked certificates.
#[derive(Serialize)]
struct BodyRef<'a> {
    limits: &'a Limits,
    clock: ClusterTime,
    last_applied: Option<LogIndex>,
    kv: &'a KvStore,
    sessions: Vec<&'a Session>,
    keys: Vec<&'a KeyRecord>,
    leases: Vec<&'a Lease>,
    no_space_alarm: bool,
    auth: &'a AuthTable,
    quotas: &'a UserQuotas,
    revoked_certificates: &'a BTreeSet<Vec<u8>>,
    alarmed_members: &'a BTreeSet<u64>,
}

/// The body as read.
#[derive(Deserialize)]
struct Body {
    limits: Limits,
    clock: ClusterTime,
    last_applied: Option<LogIndex>,
    kv: KvStore,
    sessions: Vec<Session>,
    keys: Vec<KeyRecord>,
    leases: Vec<Lease>,
    no_space_alarm: bool,
    auth: AuthTable,
    /// Written from format 7 on (after the quotas and revoked
    /// certificates).
    #[serde(skip)]
    alarmed_members: BTreeSet<u64>,
}

/// The body of format 4: [`Body`] with leases that have no owner.
#[derive(Deserialize)]
struct BodyNoOwners {
    limits: Limits,
    clock: ClusterTime,
    last_applied: Option<LogIndex>,
    kv: KvStore,
    sessions: Vec<Session>,
    keys: Vec<KeyRecord>,
    leases: Vec<LeaseNoOwner>,
    no_space_alarm: bool,
    auth: AuthTable,
}

/// A lease as format 4 wrote it.
#[derive(Deserialize)]
struct LeaseNoOwner {
    name: String,
    ttl_ms: u64,
    expires_at: ClusterTime,
    granted_index: LogIndex,
}

impl From<BodyNoOwners> for Body {
    fn from(body: BodyNoOwners) -> Body {
        let leases = body
            .leases
            .into_iter()
            .map(|lease| Lease {
                name: lease.name,
                ttl_ms: lease.ttl_ms,
                expires_at: lease.expires_at,
                granted_index: lease.granted_index,
                owner: None,
                keys: Default::default(),
            })
            .collect();
        Body {
            limits: body.limits,
            clock: body.clock,
            last_applied: body.last_applied,
            kv: body.kv,
            sessions: body.sessions,
            keys: body.keys,
            leases,
            no_space_alarm: body.no_space_alarm,
            auth: body.auth,
            alarmed_members: BTreeSet::new(),
        }
    }
}

/// Decodes a body of format `version` from `source`.
fn take_body<R: Read>(version: u32, source: &mut Source<R>) -> Result<Body, SnapshotError> {
    if version == FORMAT_VERSION_NO_OWNERS {
        return Ok(source.decode::<BodyNoOwners>()?.into());
    }
    let mut body: Body = source.decode()?;
    if version == FORMAT_VERSION_NO_QUOTAS {
        return Ok(body);
    }
    let (quotas, revoked): (UserQuotas, BTreeSet<Vec<u8>>) = source.decode()?;
    body.limits.quotas = quotas;
    body.auth = body.auth.with_revoked(revoked);
    if version == FORMAT_VERSION_NO_ALARMS {
        return Ok(body);
    }
    body.alarmed_members = source.decode()?;
    Ok(body)
}

/// What follows the body: nothing, or the cluster's id and nothing more.
fn take_cluster_id<R: Read>(source: &mut Source<R>) -> Result<Option<u64>, SnapshotError> {
    if source.at_end() {
        return Ok(None);
    }
    let id = source.decode::<u64>()?;
    if !source.at_end() {
        return Err(SnapshotError::TrailingBytes);
    }
    Ok(Some(id))
}

/// A snapshot read through: its body, and its cluster id (or why what
/// follows the body is refused).
struct Decoded {
    body: Body,
    cluster_id: Result<Option<u64>, SnapshotError>,
}

/// Reads a snapshot from `input` in pieces of [`CHUNK_BYTES`], checking
/// its magic and format, then decoding while checksumming. The checksum
/// is judged before anything decoded is: whatever the decoding met, the
/// rest of the input is read through, and bytes that do not match their
/// checksum are [`SnapshotError::ChecksumMismatch`] (corrupt or
/// truncated), as when the whole snapshot was checked up front.
fn read_snapshot(input: impl Read) -> Result<Decoded, SnapshotError> {
    let mut input = BufReader::with_capacity(CHUNK_BYTES, input);
    let mut header = [0u8; HEADER_BYTES];
    match input.read_exact(&mut header) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(SnapshotError::BadMagic);
        }
        Err(error) => return Err(SnapshotError::Io(error)),
    }
    if &header[..8] != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if ![
        FORMAT_VERSION,
        FORMAT_VERSION_FNV,
        FORMAT_VERSION_NO_ALARMS,
        FORMAT_VERSION_NO_QUOTAS,
        FORMAT_VERSION_NO_OWNERS,
    ]
    .contains(&version)
    {
        return Err(SnapshotError::UnsupportedVersion { found: version });
    }
    let mut checksum = [0u8; 8];
    checksum.copy_from_slice(&header[12..HEADER_BYTES]);
    let checksum_of = if version == FORMAT_VERSION {
        BodyChecksum::crc()
    } else {
        BodyChecksum::fnv()
    };
    let mut source = Source::new(input, checksum_of);
    let decoded = take_body(version, &mut source).map(|body| Decoded {
        cluster_id: take_cluster_id(&mut source),
        body,
    });
    source.drain();
    if source.finish()? != u64::from_le_bytes(checksum) {
        return Err(SnapshotError::ChecksumMismatch);
    }
    decoded
}

impl StateMachine {
    fn body(&self) -> BodyRef<'_> {
        BodyRef {
            limits: &self.limits,
            clock: self.clock,
            last_applied: self.last_applied,
            kv: &self.kv,
            sessions: self.sessions.iter().collect(),
            keys: self.keys.iter().collect(),
            leases: self.leases.iter().collect(),
            no_space_alarm: self.no_space_alarm,
            auth: &self.auth,
            quotas: &self.limits.quotas,
            revoked_certificates: self.auth.revoked_certificates(),
            alarmed_members: &self.alarmed_members,
        }
    }

    /// Writes the state as snapshot bytes to `out` in pieces of
    /// 64 KiB (never a buffer as large as the state): the header
    /// with room for the checksum, then the body, checksummed as it goes
    /// out, then back to fill in the checksum, and on to the end. Starts
    /// at `out`'s position, leaves it after the snapshot, and says how many
    /// bytes that is. The bytes are [`StateMachine::snapshot`]'s.
    pub fn write_snapshot<W: Write + Seek>(&self, mut out: W) -> io::Result<u64> {
        let start = out.stream_position()?;
        let mut header = [0u8; HEADER_BYTES];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.write_all(&header)?;
        let mut sink = Sink::new(BufWriter::with_capacity(CHUNK_BYTES, &mut out));
        sink.encode(&self.body())?;
        if let Some(id) = self.cluster_id {
            sink.encode(&id)?;
        }
        let (checksum, body_bytes) = sink.finish()?;
        out.seek(SeekFrom::Start(start.saturating_add(12)))?;
        out.write_all(&checksum.to_le_bytes())?;
        let length = (HEADER_BYTES as u64).saturating_add(body_bytes);
        out.seek(SeekFrom::Start(start.saturating_add(length)))?;
        Ok(length)
    }

    /// The state as snapshot bytes, in memory ([`StateMachine::write_snapshot`]
    /// into a buffer sized first, so it is not grown as it fills).
    pub fn snapshot(&self) -> Vec<u8> {
        let size = postcard::experimental::serialized_size(&self.body())
            .expect("the state always encodes");
        // The cluster's id after it takes at most 10 bytes.
        let bytes = Vec::with_capacity(HEADER_BYTES.saturating_add(size).saturating_add(10));
        let mut cursor = io::Cursor::new(bytes);
        self.write_snapshot(&mut cursor)
            .expect("writing to memory cannot fail");
        cursor.into_inner()
    }

    /// A digest of the state (FNV-1a 64 of the snapshot body, streamed
    /// without building it): equal on replicas that applied the same
    /// entries.
    pub fn state_digest(&self) -> u64 {
        postcard::to_extend(&self.body(), Fnv64::default())
            .expect("the state always encodes")
            .finish()
    }

    /// The limits snapshot bytes were taken under (after checking their
    /// magic, format and checksum), so a new node can be started with them.
    pub fn snapshot_limits(bytes: &[u8]) -> Result<Limits, SnapshotError> {
        StateMachine::snapshot_limits_from(bytes)
    }

    /// [`StateMachine::snapshot_limits`] of a snapshot read from `input`
    /// in bounded pieces.
    pub fn snapshot_limits_from(input: impl Read) -> Result<Limits, SnapshotError> {
        Ok(read_snapshot(input)?.body.limits)
    }

    /// Restores a state machine from snapshot bytes taken under `limits`.
    pub fn restore(limits: &Limits, bytes: &[u8]) -> Result<StateMachine, SnapshotError> {
        StateMachine::restore_from(limits, bytes)
    }

    /// Restores a state machine from a snapshot taken under `limits`, read
    /// from `input` in pieces of 64 KiB (never whole in memory):
    /// the checksum is computed as the bytes are read and checked at the
    /// end, before the decoded state is judged; a truncated, corrupt or
    /// unreadable input is an error.
    pub fn restore_from(limits: &Limits, input: impl Read) -> Result<StateMachine, SnapshotError> {
        let Decoded { body, cluster_id } = read_snapshot(input)?;
        let cluster_id = cluster_id?;
        if body.limits != *limits {
            return Err(SnapshotError::LimitsMismatch);
        }
        let mut leases = Leases::from_leases(body.leases);
        let mut kv = body.kv;
        kv.recount();
        for (key, stored) in kv.iter() {
            if let Some(name) = &stored.lease {
                if leases.get(name).is_none() {
                    return Err(SnapshotError::Inconsistent(BrokenInvariant::new(
                        Table::Leases,
                        format!("key {key:?} attached to unknown lease {name:?}"),
                    )));
                }
                leases.attach(name, key);
            }
        }
        let machine = StateMachine {
            limits: body.limits,
            clock: body.clock,
            last_applied: body.last_applied,
            kv,
            sessions: SessionTable::from_sessions(body.sessions),
            keys: IdempotencyKeys::from_records(body.keys),
            leases,
            no_space_alarm: body.no_space_alarm,
            alarmed_members: body.alarmed_members,
            auth: Arc::new(body.auth),
            dedup: true,
            cluster_id,
        };
        machine
            .check_invariants()
            .map_err(SnapshotError::Inconsistent)?;
        Ok(machine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Entry, Proposal, Request};
    use crate::digest::fnv64;
    use crate::{Outcome, Overload, Rejection, Reply};

    fn machine() -> StateMachine {
        let mut machine = StateMachine::new(Limits::default());
        machine.apply(&Entry {
            index: LogIndex(1),
            proposal: Proposal {
                time: ClusterTime(5),
                principal: None,
                request: Request::plain(Command::Put {
                    key: b"k".to_vec(),
                    value: b"v".to_vec().into(),
                    lease: None,
                }),
            },
        });
        machine
    }

    /// Re-checksums `bytes` (of this format) after their body was changed.
    fn resealed(mut bytes: Vec<u8>) -> Vec<u8> {
        let checksum = u64::from(crc32fast::hash(&bytes[HEADER_BYTES..]));
        bytes[HEADER_BYTES - 8..HEADER_BYTES].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    #[test]
    fn the_cluster_id_is_kept_after_the_body_and_outside_the_digest() {
        let without = machine();
        let mut with = without.clone();
        with.record_cluster_id(0xfeed_beef);
        // Without an id, nothing follows the body.
        let plain = without.snapshot();
        let marked = with.snapshot();
        assert_eq!(&marked[HEADER_BYTES..plain.len()], &plain[HEADER_BYTES..]);
        assert!(marked.len() > plain.len());
        assert_eq!(with.state_digest(), without.state_digest());
        let limits = Limits::default();
        let restored = StateMachine::restore(&limits, &marked).unwrap();
        assert_eq!(restored.cluster_id(), Some(0xfeed_beef));
        assert_eq!(restored, with);
        assert_eq!(
            StateMachine::restore(&limits, &plain).unwrap().cluster_id(),
            None
        );
        // An earlier release reads the body and stops there.
        assert_eq!(StateMachine::snapshot_limits(&marked).unwrap(), limits);
        // Anything after the id is refused.
        let mut extra = marked.clone();
        extra.push(0);
        assert!(matches!(
            StateMachine::restore(&limits, &resealed(extra)),
            Err(SnapshotError::TrailingBytes)
        ));
    }

    /// Snapshot bytes of format 4, as the release before lease owners
    /// wrote them: leases "jobs" (with key "jobs/a" attached) and "idle"
    /// granted while authentication was off, a key "plain", and cluster
    /// id 0x0123456789abcdef after the body.
    const FORMAT_4: &str = "4f4b56534e41500004000000e68282765f9025c6802080804080ade2048080808002e80780808001a08d06808080048080804080086480b89929c0843d80808040c0cf24a08d0680026480b89929a08d068080802080dddb018001ec07010402066a6f62732f61013101046a6f627303030105706c61696e013200040401040203eb07066a6f62732f6101013101046a6f62730303010004ec0705706c61696e0101320004040100000000020469646c65b0ea019af20102046a6f6273e0d403c9dc03010000000000ef9bafcdf8acd19101";

    fn unhex(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    fn apply(
        machine: &mut StateMachine,
        index: u64,
        principal: Option<&str>,
        command: Command,
    ) -> Outcome {
        machine.apply(&Entry {
            index: LogIndex(index),
            proposal: Proposal {
                time: ClusterTime(1000 + index),
                principal: principal.map(|p| crate::ids::Principal(p.to_string())),
                request: Request::plain(command),
            },
        })
    }

    #[test]
    fn a_copy_of_the_state_shares_the_auth_table_until_one_changes_it() {
        let mut machine = StateMachine::new(Limits::default());
        let add = |name: &str| {
            Command::Auth(crate::auth::AuthCommand::UserAdd {
                name: name.to_string(),
                password_hash: None,
            })
        };
        apply(&mut machine, 1, None, add("alice"));
        let copy = machine.clone();
        // A read's copy: the table is shared, not copied.
        assert!(Arc::ptr_eq(&copy.auth, &machine.auth));
        // A change while the copy lives changes the state alone.
        apply(&mut machine, 2, None, add("bob"));
        assert!(machine.auth().user("bob").is_some());
        assert!(copy.auth().user("bob").is_none());
        assert!(copy.auth().user("alice").is_some());
    }

    #[test]
    fn a_format_4_snapshot_restores_with_leases_that_have_no_owner() {
        let limits = Limits::default();
        let bytes = unhex(FORMAT_4);
        assert_eq!(StateMachine::snapshot_limits(&bytes).unwrap(), limits);
        let restored = StateMachine::restore(&limits, &bytes).unwrap();
        assert_eq!(restored.cluster_id(), Some(0x0123_4567_89ab_cdef));
        let jobs = restored.leases().get("jobs").expect("lease jobs");
        assert_eq!(jobs.owner, None);
        assert_eq!(jobs.ttl_ms, 60_000);
        assert!(jobs.keys.contains(b"jobs/a".as_slice()));
        assert_eq!(restored.leases().get("idle").unwrap().owner, None);
        assert_eq!(
            restored.kv().get(b"plain").map(|s| s.value.to_vec()),
            Some(b"2".to_vec())
        );
        // The same state, built by this release, is the same machine.
        let mut built = StateMachine::new(limits.clone());
        let lease = |name: &str, ttl_ms| Command::LeaseGrant {
            name: name.into(),
            ttl_ms,
        };
        apply(&mut built, 1, None, lease("jobs", 60_000));
        apply(&mut built, 2, None, lease("idle", 30_000));
        let put = |key: &[u8], value: &[u8], lease: Option<&str>| Command::Put {
            key: key.to_vec(),
            value: value.to_vec().into(),
            lease: lease.map(str::to_string),
        };
        apply(&mut built, 3, None, put(b"jobs/a", b"1", Some("jobs")));
        apply(&mut built, 4, None, put(b"plain", b"2", None));
        built.record_cluster_id(0x0123_4567_89ab_cdef);
        assert_eq!(restored, built);
        // Taken again, it is written in this release's format.
        let again = restored.snapshot();
        assert_eq!(&again[8..12], &FORMAT_VERSION.to_le_bytes());
        assert_eq!(StateMachine::restore(&limits, &again).unwrap(), built);
    }

    /// Snapshot bytes of format 5, as the release before the per-user
    /// quotas wrote them: key "k" = "v" put at index 1 and a session
    /// (ttl 60 s, window 4, secret 9) opened at index 2, both at time 5,
    /// while authentication was off; no cluster id.
    const FORMAT_5: &str = "4f4b56534e41500005000000f456ee9a507acac3802080804080ade2048080808002e80780808001a08d06808080048080804080086480b89929c0843d80808040c0cf24a08d0680026480b89929a08d068080802080dddb01800105010201016b01760001010101010105016b0101760001010100000102c03983e8c8370764ebfb8573c8128473fe5bb0c1c419c32f4953e02b6cd93ddd00e0d403040501010000000000000000";

    #[test]
    fn a_format_5_snapshot_restores_with_the_default_quotas() {
        let limits = Limits::default();
        let bytes = unhex(FORMAT_5);
        assert_eq!(StateMachine::snapshot_limits(&bytes).unwrap(), limits);
        let restored = StateMachine::restore(&limits, &bytes).unwrap();
        let mut built = StateMachine::new(limits.clone());
        let at_5 = |machine: &mut StateMachine, index, command| {
            machine.apply(&Entry {
                index: LogIndex(index),
                proposal: Proposal {
                    time: ClusterTime(5),
                    principal: None,
                    request: Request::plain(command),
                },
            })
        };
        let put = Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec().into(),
            lease: None,
        };
        at_5(&mut built, 1, put);
        let open = Command::OpenSession {
            ttl_ms: 60_000,
            window: 4,
            secret: crate::ids::Secret(9),
        };
        at_5(&mut built, 2, open);
        assert_eq!(restored, built);
        let again = restored.snapshot();
        assert_eq!(&again[8..12], &FORMAT_VERSION.to_le_bytes());
        assert_eq!(again, built.snapshot());
    }

    /// Snapshot bytes of format 6, as the release before the alarms
    /// raised by hand wrote them: key "k" = "v" put at index 1, time 5.
    const FORMAT_6: &str = "4f4b56534e4150000600000035a9a04a48eb0e5f802080804080ade2048080808002e80780808001a08d06808080048080804080086480b89929c0843d80808040c0cf24a08d0680026480b89929a08d068080802080dddb01800105010101016b01760001010101010105016b0101760001010100000000000000000000190a00";

    #[test]
    fn a_format_6_snapshot_restores_with_no_alarm_raised_by_hand() {
        let limits = Limits::default();
        let restored = StateMachine::restore(&limits, &unhex(FORMAT_6)).unwrap();
        let built = machine();
        assert_eq!(restored, built);
        assert!(restored.alarmed_members.is_empty());
        let again = restored.snapshot();
        assert_eq!(&again[8..12], &FORMAT_VERSION.to_le_bytes());
        assert_eq!(again, built.snapshot());
    }

    /// Snapshot bytes of format 7, as the release before the CRC-32
    /// checksum wrote them (FNV-1a 64): key "k" = "v" put at index 1,
    /// time 5.
    const FORMAT_7: &str = "4f4b56534e415000070000000f85ffced6000327802080804080ade2048080808002e80780808001a08d06808080048080804080086480b89929c0843d80808040c0cf24a08d0680026480b89929a08d068080802080dddb01800105010101016b01760001010101010105016b0101760001010100000000000000000000190a0000";

    #[test]
    fn a_format_7_snapshot_restores_and_is_written_again_checksummed_by_crc() {
        let limits = Limits::default();
        let old = unhex(FORMAT_7);
        let restored = StateMachine::restore(&limits, &old).unwrap();
        let built = machine();
        assert_eq!(restored, built);
        let again = restored.snapshot();
        assert_eq!(&again[8..12], &FORMAT_VERSION.to_le_bytes());
        // The same body; only the version and the checksum differ.
        assert_eq!(again[HEADER_BYTES..], old[HEADER_BYTES..]);
        let crc = u64::from(crc32fast::hash(&again[HEADER_BYTES..]));
        assert_eq!(again[12..HEADER_BYTES], crc.to_le_bytes());
        // A format 7 body whose FNV checksum does not match is refused.
        let mut corrupt = old;
        let last = corrupt.len() - 3;
        corrupt[last] ^= 1;
        assert!(matches!(
            StateMachine::restore(&limits, &corrupt),
            Err(SnapshotError::ChecksumMismatch)
        ));
    }

    #[test]
    fn alarms_raised_by_hand_survive_a_snapshot_and_hold_writes_until_cleared() {
        let limits = Limits::default();
        let mut machine = StateMachine::new(limits.clone());
        let raise = |member| Command::AlarmSet {
            member,
            raise: true,
        };
        apply(&mut machine, 1, None, raise(0));
        apply(&mut machine, 2, None, raise(7));
        let restored = StateMachine::restore(&limits, &machine.snapshot()).unwrap();
        assert_eq!(restored, machine);
        assert_eq!(
            restored
                .alarmed_members()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            vec![0, 7]
        );
        let mut machine = restored;
        let put = Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec().into(),
            lease: None,
        };
        let refused = apply(&mut machine, 3, None, put.clone());
        assert!(
            matches!(refused, Outcome::Overloaded(Overload::NoSpace { .. })),
            "{refused:?}"
        );
        let clear = |member| Command::AlarmSet {
            member,
            raise: false,
        };
        assert_eq!(
            apply(&mut machine, 4, None, clear(0)),
            Outcome::Applied(Reply::AlarmSet { changed: true })
        );
        assert_eq!(
            apply(&mut machine, 5, None, clear(0)),
            Outcome::Applied(Reply::AlarmSet { changed: false })
        );
        // Member 7's alarm still holds writes.
        let refused = apply(&mut machine, 6, None, put.clone());
        assert!(matches!(refused, Outcome::Overloaded(_)), "{refused:?}");
        apply(&mut machine, 7, None, clear(7));
        let put_reply = apply(&mut machine, 8, None, put);
        assert!(
            matches!(put_reply, Outcome::Applied(Reply::Put { .. })),
            "{put_reply:?}"
        );
    }

    #[test]
    fn alarms_are_raised_for_at_most_alarmed_members_max_members() {
        let limits = Limits::default();
        let mut machine = StateMachine::new(limits.clone());
        let set = |member, raise| Command::AlarmSet { member, raise };
        let mut index = 0;
        let mut next = || {
            index += 1;
            index
        };
        for member in 0..crate::ALARMED_MEMBERS_MAX {
            let member = member * 1_000_003;
            assert_eq!(
                apply(&mut machine, next(), None, set(member, true)),
                Outcome::Applied(Reply::AlarmSet { changed: true })
            );
        }
        let refused = Outcome::Applied(Reply::Rejected(Rejection::TooManyAlarms {
            max: crate::ALARMED_MEMBERS_MAX,
        }));
        assert_eq!(
            apply(&mut machine, next(), None, set(u64::MAX, true)),
            refused
        );
        // One raised already may be raised again; a cleared one frees a place.
        assert_eq!(
            apply(&mut machine, next(), None, set(0, true)),
            Outcome::Applied(Reply::AlarmSet { changed: false })
        );
        assert_eq!(
            apply(&mut machine, next(), None, set(0, false)),
            Outcome::Applied(Reply::AlarmSet { changed: true })
        );
        assert_eq!(
            apply(&mut machine, next(), None, set(u64::MAX, true)),
            Outcome::Applied(Reply::AlarmSet { changed: true })
        );
        let restored = StateMachine::restore(&limits, &machine.snapshot()).unwrap();
        assert_eq!(
            restored.alarmed_members().len() as u64,
            crate::ALARMED_MEMBERS_MAX
        );
        assert_eq!(restored, machine);
    }

    #[test]
    fn quotas_and_revoked_certificates_survive_a_snapshot_and_quotas_must_match_on_restore() {
        let limits = Limits {
            quotas: UserQuotas {
                user_share_percent: 50,
                admin_reserve_percent: 0,
            },
            ..Limits::default()
        };
        let mut machine = StateMachine::new(limits.clone());
        let revoke = crate::auth::AuthCommand::CertificateRevoke {
            serial: vec![0x0a, 0x1b],
        };
        apply(&mut machine, 1, None, Command::Auth(revoke));
        assert!(machine.auth().is_revoked(&[0x0a, 0x1b]));
        let bytes = machine.snapshot();
        assert_eq!(StateMachine::snapshot_limits(&bytes).unwrap(), limits);
        assert_eq!(StateMachine::restore(&limits, &bytes).unwrap(), machine);
        assert!(matches!(
            StateMachine::restore(&Limits::default(), &bytes),
            Err(SnapshotError::LimitsMismatch)
        ));
        assert!(
            StateMachine::restore(&limits, &bytes)
                .unwrap()
                .auth()
                .is_revoked(&[0x0a, 0x1b])
        );
        let mut default = StateMachine::new(Limits::default());
        apply(
            &mut default,
            1,
            None,
            Command::Auth(crate::auth::AuthCommand::Disable),
        );
        let mut unrevoked = StateMachine::new(limits.clone());
        apply(
            &mut unrevoked,
            1,
            None,
            Command::Auth(crate::auth::AuthCommand::Disable),
        );
        assert_ne!(unrevoked.state_digest(), default.state_digest());
        assert_ne!(unrevoked.state_digest(), machine.state_digest());
    }

    #[test]
    fn lease_owners_survive_a_snapshot_and_count_in_the_digest() {
        let limits = Limits::default();
        let grant = Command::LeaseGrant {
            name: "l".into(),
            ttl_ms: 60_000,
        };
        let mut owned = StateMachine::new(limits.clone());
        apply(&mut owned, 1, Some("alice"), grant.clone());
        let mut unowned = StateMachine::new(limits.clone());
        apply(&mut unowned, 1, None, grant);
        assert_eq!(
            owned.leases().get("l").unwrap().owner,
            Some(crate::ids::Principal("alice".into()))
        );
        assert_ne!(owned.state_digest(), unowned.state_digest());
        let restored = StateMachine::restore(&limits, &owned.snapshot()).unwrap();
        assert_eq!(restored, owned);
        assert_eq!(restored.state_digest(), owned.state_digest());
        // Any other format is refused, typed.
        let mut other = owned.snapshot();
        other[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            StateMachine::restore(&limits, &other),
            Err(SnapshotError::UnsupportedVersion { found: 3 })
        ));
    }

    /// A state with something in every table: keys (one on a lease),
    /// a session with a completion record, an idempotency key, a user, a
    /// revoked certificate, an alarm raised by hand and the cluster's id.
    fn rich_machine() -> StateMachine {
        let mut machine = StateMachine::new(Limits::default());
        let mut index = 0;
        let mut next = |machine: &mut StateMachine, origin: crate::command::Origin, command| {
            index += 1;
            machine.apply(&Entry {
                index: LogIndex(index),
                proposal: Proposal {
                    time: ClusterTime(1000 + index),
                    principal: None,
                    request: Request { origin, command },
                },
            })
        };
        use crate::command::Origin;
        let plain = || Origin::Plain;
        next(
            &mut machine,
            plain(),
            Command::LeaseGrant {
                name: "lease".into(),
                ttl_ms: 60_000,
            },
        );
        for key in 0..200u32 {
            let lease = (key % 7 == 0).then(|| "lease".to_string());
            let put = Command::Put {
                key: format!("key/{key:05}").into_bytes(),
                value: (vec![key as u8; 100 + key as usize]).into(),
                lease,
            };
            next(&mut machine, plain(), put);
        }
        let opened = next(
            &mut machine,
            plain(),
            Command::OpenSession {
                ttl_ms: 60_000,
                window: 4,
                secret: crate::ids::Secret(9),
            },
        );
        let Outcome::Applied(Reply::SessionOpened { session, .. }) = opened else {
            panic!("no session: {opened:?}");
        };
        let header = crate::command::RequestHeader {
            id: crate::ids::RequestId {
                session,
                seq: crate::ids::Seq(1),
            },
            secret: crate::ids::Secret(9),
            first_incomplete: crate::ids::Seq(1),
            attempt: 1,
        };
        let incr = Command::Incr {
            key: b"n".to_vec(),
            by: 3,
        };
        next(&mut machine, Origin::Session(header), incr);
        let append = Command::Append {
            key: b"k".to_vec(),
            value: b"x".to_vec(),
        };
        let once = Origin::Key(crate::ids::IdempotencyKey(b"once-key".to_vec()));
        next(&mut machine, once, append);
        let user = crate::auth::AuthCommand::UserAdd {
            name: "alice".into(),
            password_hash: Some("$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".into()),
        };
        next(&mut machine, plain(), Command::Auth(user));
        let revoke = crate::auth::AuthCommand::CertificateRevoke {
            serial: vec![1, 2, 3],
        };
        next(&mut machine, plain(), Command::Auth(revoke));
        next(
            &mut machine,
            plain(),
            Command::AlarmSet {
                member: 3,
                raise: true,
            },
        );
        machine.record_cluster_id(0xfeed_beef);
        machine
    }

    /// The bytes as `snapshot()` made them before it streamed: the whole
    /// body in one buffer, then its checksum filled in.
    fn snapshot_in_one_buffer(machine: &StateMachine) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&[0; 8]);
        let mut bytes = postcard::to_extend(&machine.body(), bytes).unwrap();
        if let Some(id) = machine.cluster_id {
            bytes = postcard::to_extend(&id, bytes).unwrap();
        }
        resealed(bytes)
    }

    #[test]
    fn streaming_writes_the_same_bytes_as_one_buffer_did() {
        let machine = rich_machine();
        let bytes = snapshot_in_one_buffer(&machine);
        assert!(bytes.len() > crate::stream::CHUNK_BYTES, "{}", bytes.len());
        assert_eq!(machine.snapshot(), bytes);
        // Written after other bytes, it starts where the writer was and
        // leaves it after the snapshot.
        let mut out = io::Cursor::new(b"prefix".to_vec());
        out.set_position(6);
        let length = machine.write_snapshot(&mut out).unwrap();
        assert_eq!(length, bytes.len() as u64);
        assert_eq!(out.position(), 6 + length);
        out.write_all(b"suffix").unwrap();
        let written = out.into_inner();
        assert_eq!(&written[..6], b"prefix");
        assert_eq!(&written[6..6 + bytes.len()], bytes.as_slice());
        assert_eq!(&written[6 + bytes.len()..], b"suffix");
        // And the state digest is still the checksum of the body less the id.
        let plain = {
            let mut plain = machine.clone();
            plain.cluster_id = None;
            plain.snapshot()
        };
        assert_eq!(machine.state_digest(), fnv64(&plain[HEADER_BYTES..]));
    }

    /// Hands out at most one byte per read.
    struct OneByte<'a>(&'a [u8]);

    impl Read for OneByte<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Some((first, rest)) = self.0.split_first() else {
                return Ok(0);
            };
            let Some(slot) = buf.first_mut() else {
                return Ok(0);
            };
            *slot = *first;
            self.0 = rest;
            Ok(1)
        }
    }

    #[test]
    fn restoring_from_a_reader_equals_restoring_from_bytes_even_a_byte_at_a_time() {
        let machine = rich_machine();
        let limits = Limits::default();
        let bytes = machine.snapshot();
        let from_bytes = StateMachine::restore(&limits, &bytes).unwrap();
        assert_eq!(from_bytes, machine);
        let from_reader =
            StateMachine::restore_from(&limits, io::BufReader::new(bytes.as_slice())).unwrap();
        assert_eq!(from_reader, from_bytes);
        let byte_at_a_time = StateMachine::restore_from(&limits, OneByte(&bytes)).unwrap();
        assert_eq!(byte_at_a_time, from_bytes);
        assert_eq!(byte_at_a_time.snapshot(), bytes);
        assert_eq!(
            StateMachine::snapshot_limits_from(OneByte(&bytes)).unwrap(),
            limits
        );
        // The formats before still restore through a reader.
        for old in [FORMAT_4, FORMAT_5, FORMAT_6] {
            let old = unhex(old);
            assert_eq!(
                StateMachine::restore_from(&limits, OneByte(&old)).unwrap(),
                StateMachine::restore(&limits, &old).unwrap()
            );
        }
    }

    #[test]
    fn a_truncated_or_corrupted_stream_is_refused_with_an_error() {
        let machine = rich_machine();
        let limits = Limits::default();
        let bytes = machine.snapshot();
        // Cut anywhere (every byte of the head, then every 389th; some a
        // byte at a time).
        let cuts = (0..bytes.len())
            .filter(|at| *at < 64 || at % 389 == 0)
            .chain([bytes.len() - 1]);
        for at in cuts {
            let refused = if at % 7 == 0 {
                StateMachine::restore_from(&limits, OneByte(&bytes[..at]))
            } else {
                StateMachine::restore_from(&limits, &bytes[..at])
            };
            match refused {
                Err(SnapshotError::BadMagic) => assert!(at < HEADER_BYTES),
                Err(SnapshotError::ChecksumMismatch) => assert!(at >= HEADER_BYTES),
                other => panic!("cut at {at}: {other:?}"),
            }
        }
        // A byte changed anywhere after the magic and format.
        for at in (12..bytes.len()).step_by(353) {
            let mut corrupt = bytes.clone();
            corrupt[at] ^= 0x24;
            let refused = StateMachine::restore_from(&limits, corrupt.as_slice());
            assert!(
                matches!(refused, Err(SnapshotError::ChecksumMismatch)),
                "changed at {at}: {refused:?}"
            );
        }
        // A byte too many.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            StateMachine::restore_from(&limits, longer.as_slice()),
            Err(SnapshotError::ChecksumMismatch)
        ));
    }

    /// Reads `good` bytes, then fails.
    struct FailsAfter<'a>(&'a [u8]);

    impl Read for FailsAfter<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Err(io::Error::other("the disk is gone"));
            }
            self.0.read(buf)
        }
    }

    /// Takes `room` bytes, then fails.
    struct FullAfter(usize, io::Cursor<Vec<u8>>);

    impl Write for FullAfter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let room = self.0.saturating_sub(self.1.get_ref().len());
            if room == 0 {
                return Err(io::Error::other("no space left"));
            }
            self.1.write(&buf[..buf.len().min(room)])
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Seek for FullAfter {
        fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
            self.1.seek(to)
        }
    }

    #[test]
    fn a_failing_reader_or_writer_is_an_error_not_a_panic() {
        let machine = rich_machine();
        let bytes = machine.snapshot();
        for at in [5, HEADER_BYTES, bytes.len() / 2, bytes.len()] {
            let refused = StateMachine::restore_from(&Limits::default(), FailsAfter(&bytes[..at]));
            assert!(
                matches!(&refused, Err(SnapshotError::Io(error)) if error.to_string() == "the disk is gone"),
                "failed at {at}: {refused:?}"
            );
        }
        for room in [3, HEADER_BYTES + 1, bytes.len() / 2] {
            let failed = machine.write_snapshot(FullAfter(room, io::Cursor::new(Vec::new())));
            assert_eq!(
                failed.map_err(|error| error.to_string()),
                Err("no space left".to_string())
            );
        }
    }
}
