//! The seed corpus in `corpus/<target>/`: valid inputs that reach deep
//! into each target (requests on live sessions, restorable snapshots, real
//! log segments, Raft messages a peer would send), plus random bytes.
//!
//! Regenerate with
//! `cargo test -p oncekv-fuzz --test corpus -- --ignored`; the output is
//! deterministic, so an unchanged generator leaves the files unchanged.

use oncekv_fuzz::client_request::SESSION_SECRET;
use oncekv_fuzz::segment_recovery::SEGMENT_MAGIC;
use oncekv_fuzz::small_limits;
use oncekv_fuzz::snapshot_restore::body;
use oncekv_proto::convert;
use oncekv_proto::v1::{RaftPayload, SnapshotChunk};
use oncekv_server::raft::segment_log::SegmentLog;
use oncekv_server::raft::type_config::{Proposal, TypeConfig};
use oncekv_state::{
    ClusterTime, Command, Entry, IdempotencyKey, Limits, LogIndex, Origin, Query, Request,
    RequestHeader, RequestId, Secret, Seq, SessionId, StateMachine,
};
use openraft::alias::{EntryOf, LogIdOf, OneshotOf, SnapshotMetaOf, StoredMembershipOf, VoteOf};
use openraft::async_runtime::Oneshot;
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::testing::{blank_ent, log_id, membership_ent};
use openraft::{EntryPayload, Membership};
use prost::Message;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// Replaces the seeds of `target` with `seeds` (name, bytes).
fn write_corpus(target: &str, seeds: Vec<(&str, Vec<u8>)>) {
    let dir = corpus_dir(target);
    if dir.exists() {
        for entry in std::fs::read_dir(&dir).expect("corpus dir") {
            let path = entry.expect("corpus entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            // Crash reproducers are kept.
            if !name.starts_with("crash-") {
                std::fs::remove_file(&path).expect("remove an old seed");
            }
        }
    }
    std::fs::create_dir_all(&dir).expect("corpus dir");
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).expect("write a seed");
    }
}

/// Pseudo-random bytes (xorshift), the same for the same seed.
fn noise(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

// ---- client requests -------------------------------------------------

fn on(session: u64, seq: u64, first_incomplete: u64) -> Origin {
    Origin::Session(RequestHeader {
        id: RequestId {
            session: SessionId(session),
            seq: Seq(seq),
        },
        secret: SESSION_SECRET,
        first_incomplete: Seq(first_incomplete),
        attempt: 1,
    })
}

fn key(name: &[u8]) -> Origin {
    Origin::Key(IdempotencyKey(name.to_vec()))
}

fn put(key: &[u8], value: &[u8]) -> Command {
    Command::Put {
        key: key.to_vec(),
        value: value.to_vec(),
        lease: None,
    }
}

fn open(ttl_ms: u64, window: u32) -> Command {
    Command::OpenSession {
        ttl_ms,
        window,
        secret: SESSION_SECRET,
    }
}

/// A `client_request` input: each request after `step * 32` ms.
fn client_input(requests: &[(u8, Origin, Command)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (step, origin, command) in requests {
        let request = Request {
            origin: origin.clone(),
            command: command.clone(),
        };
        let wire = convert::request_to_wire(&request).expect("request goes on the wire");
        let bytes = wire.encode_to_vec();
        out.push(*step);
        out.push(u8::try_from(bytes.len()).expect("a seed message under 256 bytes"));
        out.extend_from_slice(&bytes);
    }
    out
}

fn session_requests() -> Vec<(u8, Origin, Command)> {
    vec![
        (1, Origin::Plain, open(1000, 4)),
        (1, on(1, 1, 1), put(b"a", b"1")),
        (
            1,
            on(1, 2, 1),
            Command::Append {
                key: b"a".to_vec(),
                value: b"2".to_vec(),
            },
        ),
        (
            1,
            on(1, 3, 1),
            Command::Incr {
                key: b"n".to_vec(),
                by: 5,
            },
        ),
        (
            1,
            on(1, 2, 1),
            Command::Append {
                key: b"a".to_vec(),
                value: b"2".to_vec(),
            },
        ),
        (1, on(1, 2, 1), put(b"a", b"other")),
        (
            1,
            on(1, 4, 2),
            Command::Read(Query::Get { key: b"a".to_vec() }),
        ),
        (1, on(1, 9, 4), put(b"gap", b"x")),
        (1, on(1, 1, 1), put(b"a", b"1")),
        (
            2,
            Origin::Plain,
            Command::KeepAlive {
                session: SessionId(1),
                secret: SESSION_SECRET,
            },
        ),
        (
            1,
            on(1, 5, 5),
            Command::Cas {
                key: b"a".to_vec(),
                expected: Some(b"12".to_vec()),
                new: b"3".to_vec(),
            },
        ),
        (
            1,
            Origin::Plain,
            Command::CloseSession {
                session: SessionId(1),
                secret: SESSION_SECRET,
            },
        ),
        (1, on(1, 6, 6), put(b"a", b"closed")),
        (1, Origin::Plain, open(100, 1)),
        (40, on(15, 1, 1), put(b"late", b"expired")),
    ]
}

fn budget_requests() -> Vec<(u8, Origin, Command)> {
    let value = [b'v'; 64];
    let mut requests = vec![(1, Origin::Plain, open(5000, 4))];
    for seq in 1..=4u64 {
        requests.push((
            0,
            on(1, seq, 1),
            Command::Read(Query::Scan {
                prefix: Vec::new(),
                limit: 0,
            }),
        ));
    }
    for seq in 5..=12u64 {
        let key = [b'k', seq as u8];
        requests.push((0, on(1, seq, seq - 3), put(&key, &value)));
    }
    for n in 0..6u8 {
        requests.push((0, key(&[b'i', n]), put(&[b'p', n], &value)));
    }
    requests.push((0, key(b"i\x00"), put(b"p\x00", &value)));
    requests.push((0, key(b"i\x00"), put(b"p\x00", b"mismatch")));
    for n in 0..14u8 {
        requests.push((0, Origin::Plain, put(&[b'q', n], &value)));
    }
    requests.push((0, Origin::Plain, Command::AlarmDisarm));
    requests.push((
        0,
        Origin::Plain,
        Command::Delete {
            key: b"q\x00".to_vec(),
        },
    ));
    requests.push((200, key(b"i\x07"), put(b"after", b"expiry")));
    requests
}

fn lease_requests() -> Vec<(u8, Origin, Command)> {
    let grant = |name: &str, ttl_ms| Command::LeaseGrant {
        name: name.into(),
        ttl_ms,
    };
    vec![
        (1, Origin::Plain, grant("a", 500)),
        (1, Origin::Plain, grant("b", 9000)),
        (1, Origin::Plain, grant("a", 500)),
        (
            1,
            Origin::Plain,
            Command::Put {
                key: b"x".to_vec(),
                value: b"1".to_vec(),
                lease: Some("a".into()),
            },
        ),
        (
            1,
            Origin::Plain,
            Command::Put {
                key: b"y".to_vec(),
                value: b"2".to_vec(),
                lease: Some("b".into()),
            },
        ),
        (
            1,
            Origin::Plain,
            Command::Put {
                key: b"x".to_vec(),
                value: b"3".to_vec(),
                lease: Some("b".into()),
            },
        ),
        (
            1,
            Origin::Plain,
            Command::LeaseKeepAlive { name: "a".into() },
        ),
        (1, Origin::Plain, Command::Read(Query::LeaseList)),
        (20, Origin::Plain, Command::Read(Query::LeaseList)),
        (1, Origin::Plain, Command::LeaseRevoke { name: "b".into() }),
        (
            1,
            Origin::Plain,
            Command::LeaseRevoke {
                name: "a-lease-name-longer-than-allowed".into(),
            },
        ),
        (1, key(b"L"), grant("c", 100)),
        (1, key(b"L"), grant("c", 100)),
        (
            1,
            Origin::Plain,
            Command::Read(Query::Scan {
                prefix: b"x".to_vec(),
                limit: 2,
            }),
        ),
    ]
}

fn invalid_requests() -> Vec<(u8, Origin, Command)> {
    vec![
        (1, Origin::Plain, open(1000, 4)),
        (1, Origin::Plain, open(1000, 0)),
        (1, Origin::Plain, open(1, 1)),
        (1, on(1, 0, 0), put(b"a", b"1")),
        (1, on(1, 2, 3), put(b"a", b"1")),
        (1, on(1, 1, 1), open(1000, 1)),
        (1, Origin::Plain, put(&[b'k'; 17], b"1")),
        (1, Origin::Plain, put(b"", b"1")),
        (1, Origin::Plain, put(b"k", &[b'v'; 65])),
        (1, key(b""), put(b"k", b"1")),
        (1, key(&[b'i'; 129]), put(b"k", b"1")),
        (
            1,
            Origin::Plain,
            Command::Incr {
                key: b"k".to_vec(),
                by: i64::MAX,
            },
        ),
        (
            1,
            Origin::Plain,
            Command::Incr {
                key: b"k".to_vec(),
                by: i64::MAX,
            },
        ),
        (
            1,
            Origin::Plain,
            Command::KeepAlive {
                session: SessionId(1),
                secret: Secret(2),
            },
        ),
    ]
}

#[test]
#[ignore = "regenerates the checked-in seed corpus"]
fn generate_client_request_corpus() {
    write_corpus(
        "client_request",
        vec![
            ("sessions", client_input(&session_requests())),
            ("budgets", client_input(&budget_requests())),
            ("leases", client_input(&lease_requests())),
            ("invalid", client_input(&invalid_requests())),
            ("random-1", noise(1, 256)),
            ("random-2", noise(2, 64)),
        ],
    );
}

// ---- snapshots --------------------------------------------------------

fn machine_after(limits: Limits, requests: &[(u8, Origin, Command)]) -> StateMachine {
    let mut machine = StateMachine::new(limits);
    let mut time = 0;
    for (index, (step, origin, command)) in requests.iter().enumerate() {
        time += u64::from(*step) * 32;
        machine.apply(&Entry {
            index: LogIndex(index as u64 + 1),
            time: ClusterTime(time),
            principal: None,
            request: Request {
                origin: origin.clone(),
                command: command.clone(),
            },
        });
    }
    machine
}

fn restore_input(flags: u8, machine: &StateMachine) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(body(&machine.snapshot()));
    out
}

#[test]
#[ignore = "regenerates the checked-in seed corpus"]
fn generate_snapshot_restore_corpus() {
    let empty = StateMachine::new(small_limits());
    // Stop before the sessions expire, so they are in the snapshot.
    let sessions = machine_after(small_limits(), &session_requests()[..11]);
    let budgets = machine_after(small_limits(), &budget_requests()[..30]);
    let leases = machine_after(small_limits(), &lease_requests()[..8]);
    let defaults = machine_after(Limits::default(), &session_requests()[..11]);
    write_corpus(
        "snapshot_restore",
        vec![
            ("empty", restore_input(1, &empty)),
            ("sessions", restore_input(1, &sessions)),
            ("budgets", restore_input(1, &budgets)),
            ("leases", restore_input(0, &leases)),
            ("default-limits", restore_input(0, &defaults)),
            ("default-limits-mismatch", restore_input(1, &defaults)),
            ("bad-version", restore_input(5 << 1, &sessions)),
            ("bad-checksum", restore_input(6 << 1, &sessions)),
            ("bad-magic", restore_input(7 << 1, &sessions)),
            ("random-1", noise(3, 200)),
            ("random-2", noise(4, 40)),
        ],
    );
}

// ---- log segments -----------------------------------------------------

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn normal(term: u64, index: u64, command: Command) -> EntryOf<TypeConfig> {
    EntryOf::<TypeConfig> {
        log_id: log_id::<TypeConfig>(term, 1, index),
        payload: EntryPayload::Normal(Proposal {
            time: ClusterTime(index * 10),
            principal: None,
            request: Request::plain(command),
        }),
    }
}

fn voters(ids: &[u64]) -> Vec<BTreeSet<u64>> {
    vec![ids.iter().copied().collect()]
}

async fn append(log: &mut SegmentLog, entries: Vec<EntryOf<TypeConfig>>) {
    let (tx, rx) = <OneshotOf<TypeConfig> as Oneshot>::channel();
    log.append(entries, IOFlushed::signal(tx))
        .await
        .expect("append");
    rx.await.expect("callback").expect("durable");
}

/// Writes a small log through the API: a membership, blanks and normal
/// entries in two terms, a truncation, a purge and a vote.
async fn write_log(dir: &Path, purge: bool) {
    let mut log = SegmentLog::open_inline(dir).expect("open");
    append(
        &mut log,
        vec![membership_ent::<TypeConfig>(0, 1, 0, voters(&[1]))],
    )
    .await;
    append(
        &mut log,
        vec![
            blank_ent::<TypeConfig>(1, 1, 1),
            normal(1, 2, put(b"a", b"1")),
        ],
    )
    .await;
    append(&mut log, vec![normal(1, 3, put(b"b", b"2"))]).await;
    log.truncate_after(Some(log_id::<TypeConfig>(1, 1, 2)))
        .await
        .expect("truncate");
    append(
        &mut log,
        vec![
            blank_ent::<TypeConfig>(2, 1, 3),
            normal(
                2,
                4,
                Command::Incr {
                    key: b"n".to_vec(),
                    by: 1,
                },
            ),
        ],
    )
    .await;
    if purge {
        log.purge(log_id::<TypeConfig>(1, 1, 1))
            .await
            .expect("purge");
    }
    log.save_vote(&VoteOf::<TypeConfig>::new_committed(2, 1))
        .await
        .expect("vote");
}

/// The frames of a segment: their bodies (empty for a seal).
fn frame_bodies(segment: &[u8]) -> Vec<Vec<u8>> {
    // An `oncekvL2` segment's frames follow its magic; an `oncekvL3`
    // segment's follow its 1024-byte header (magic and end records).
    let mut at = if segment.starts_with(SEGMENT_MAGIC) {
        SEGMENT_MAGIC.len()
    } else {
        assert!(segment.starts_with(b"oncekvL3"), "not a log segment");
        1024
    };
    let mut bodies = Vec::new();
    while at + 12 <= segment.len() {
        let length = u32::from_le_bytes(segment[at..at + 4].try_into().expect("4 bytes")) as usize;
        bodies.push(segment[at + 12..at + 12 + length].to_vec());
        at += 12 + length;
    }
    bodies
}

/// Items of a structured `segment_recovery` input.
#[derive(Clone)]
enum Item {
    Frame(Vec<u8>),
    Raw(Vec<u8>),
    Seal,
    NextSegment,
    FlippedBody(u16, Vec<u8>),
    FlippedHeader(u8, Vec<u8>),
    CutShort(u16, Vec<u8>),
    Zeros(u8),
}

fn segment_input(flags: u8, vote: Option<&[u8]>, items: &[Item]) -> Vec<u8> {
    let mut out = vec![flags];
    if let Some(vote) = vote {
        out.push(u8::try_from(vote.len()).expect("a short vote"));
        out.extend_from_slice(vote);
    }
    let length = |body: &Vec<u8>| {
        u16::try_from(body.len())
            .expect("a short body")
            .to_le_bytes()
    };
    for item in items {
        match item {
            Item::Frame(body) if body.is_empty() => out.push(2),
            Item::Frame(body) => {
                out.push(0);
                out.extend(length(body));
                out.extend_from_slice(body);
            }
            Item::Raw(bytes) => {
                out.push(1);
                out.push(u8::try_from(bytes.len()).expect("short raw bytes"));
                out.extend_from_slice(bytes);
            }
            Item::Seal => out.push(2),
            Item::NextSegment => out.push(3),
            Item::FlippedBody(bit, body) => {
                out.push(4);
                out.extend(bit.to_le_bytes());
                out.extend(length(body));
                out.extend_from_slice(body);
            }
            Item::FlippedHeader(bit, body) => {
                out.push(5);
                out.push(*bit);
                out.extend(length(body));
                out.extend_from_slice(body);
            }
            Item::CutShort(kept, body) => {
                out.push(6);
                out.extend(kept.to_le_bytes());
                out.extend(length(body));
                out.extend_from_slice(body);
            }
            Item::Zeros(length) => {
                out.push(7);
                out.push(*length);
            }
        }
    }
    out
}

#[test]
#[ignore = "regenerates the checked-in seed corpus"]
fn generate_segment_recovery_corpus() {
    let runtime = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    runtime.block_on(write_log(&dir.path().join("plain"), false));
    runtime.block_on(write_log(&dir.path().join("purged"), true));
    let read =
        |name: &str, file: &str| std::fs::read(dir.path().join(name).join(file)).expect("log file");
    let segment = read("plain", "0000000000.log");
    let purged = read("purged", "0000000000.log");
    let vote_file = read("plain", "vote");
    let vote = &vote_file[4..];
    let bodies = frame_bodies(&segment);
    let frames: Vec<Item> = bodies.iter().cloned().map(Item::Frame).collect();
    let data: Vec<Vec<u8>> = bodies.iter().filter(|b| !b.is_empty()).cloned().collect();
    let purged_frames: Vec<Item> = frame_bodies(&purged).into_iter().map(Item::Frame).collect();
    let last = data.last().cloned().expect("a data frame");

    // The same frames split over two segments, the second after the
    // second data frame.
    let mut split = Vec::new();
    for (n, body) in data.iter().enumerate() {
        split.push(Item::Frame(body.clone()));
        if n == 1 {
            split.push(Item::NextSegment);
        }
    }
    split.push(Item::Seal);

    let mut flipped_header = frames.clone();
    flipped_header.push(Item::FlippedHeader(3, last.clone()));
    let mut garbage_header = frames.clone();
    garbage_header.push(Item::Raw(b"not a header at all".to_vec()));
    let mut header_then_seal = frames.clone();
    header_then_seal.push(Item::FlippedHeader(40, last.clone()));
    header_then_seal.push(Item::Seal);
    let mut flipped_body = frames.clone();
    flipped_body.insert(2, Item::FlippedBody(17, last.clone()));
    let mut cut_short = frames.clone();
    cut_short.push(Item::CutShort(20, last.clone()));
    let mut zeros = frames.clone();
    zeros.push(Item::Zeros(200));

    let structured = 1 | 2 | 4;
    let mut raw = vec![0u8];
    raw.extend_from_slice(&segment);
    let mut no_magic = vec![2u8];
    no_magic.extend(segment_input(0, None, &frames)[1..].iter());
    write_corpus(
        "segment_recovery",
        vec![
            ("log", segment_input(structured, Some(vote), &frames)),
            ("log-raw", raw),
            ("log-no-magic", no_magic),
            (
                "two-segments",
                segment_input(structured, Some(vote), &split),
            ),
            (
                "purged-first-segment-1",
                segment_input(1 | 2 | (1 << 4), None, &purged_frames),
            ),
            (
                "missing-first-segment",
                segment_input(1 | 2 | (2 << 4), None, &frames),
            ),
            (
                "flipped-header-bit",
                segment_input(3, None, &flipped_header),
            ),
            ("garbage-header", segment_input(3, None, &garbage_header)),
            (
                "bad-header-then-seal",
                segment_input(3, None, &header_then_seal),
            ),
            ("flipped-body-bit", segment_input(3, None, &flipped_body)),
            ("cut-short", segment_input(3, None, &cut_short)),
            ("unwritten-zeros", segment_input(3, None, &zeros)),
            (
                "damaged-vote",
                segment_input(1 | 2 | 4 | 8 | 0x40, Some(vote), &frames),
            ),
            ("random-1", noise(5, 300)),
            ("random-2", noise(6, 50)),
        ],
    );
}

// ---- peer messages ----------------------------------------------------

/// As `VoteKind` in the server's network module: a vote or a pre-vote.
#[derive(serde::Serialize)]
enum VoteKind {
    Vote(VoteRequest<TypeConfig>),
    PreVote(VoteRequest<TypeConfig>),
}

fn encoded<T: serde::Serialize>(message: &T) -> Vec<u8> {
    postcard::to_allocvec(message).expect("encodes")
}

/// One `peer_message` call: `[kind][length u16][bytes]`.
fn call(kind: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend(
        u16::try_from(bytes.len())
            .expect("a short message")
            .to_le_bytes(),
    );
    out.extend_from_slice(bytes);
    out
}

fn unary(kind: u8, data: Vec<u8>) -> Vec<u8> {
    call(kind, &RaftPayload { data }.encode_to_vec())
}

fn vote(kind: VoteKind) -> Vec<u8> {
    unary(1, encoded(&kind))
}

fn append_entries(request: &AppendEntriesRequest<TypeConfig>) -> Vec<u8> {
    unary(0, encoded(request))
}

/// A `StreamAppend` carrying `requests`.
fn stream_append(requests: &[&AppendEntriesRequest<TypeConfig>]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for request in requests {
        RaftPayload {
            data: encoded(request),
        }
        .encode_length_delimited(&mut bytes)
        .expect("a payload encodes");
    }
    call(4, &bytes)
}

fn snapshot(chunks: &[SnapshotChunk]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for chunk in chunks {
        chunk
            .encode_length_delimited(&mut bytes)
            .expect("a chunk encodes");
    }
    call(3, &bytes)
}

fn first_chunk(
    vote: VoteOf<TypeConfig>,
    last: LogIdOf<TypeConfig>,
    data: &[u8],
    total: u64,
) -> SnapshotChunk {
    let meta = SnapshotMetaOf::<TypeConfig> {
        last_log_id: Some(last),
        last_membership: StoredMembershipOf::<TypeConfig>::new(
            Some(last),
            Membership::new_with_defaults(voters(&[1]), []),
        ),
    };
    SnapshotChunk {
        vote: encoded(&vote),
        meta: encoded(&meta),
        data: data.to_vec(),
        total_bytes: total,
    }
}

/// Snapshot data a node restores: a machine with default limits whose
/// last applied entry is `index`.
fn machine_at(index: u64) -> Vec<u8> {
    let mut machine = StateMachine::new(Limits::default());
    machine.apply(&Entry {
        index: LogIndex(index),
        time: ClusterTime(1_000),
        principal: None,
        request: Request::plain(put(b"snapshot", b"installed")),
    });
    machine.snapshot()
}

#[test]
#[ignore = "regenerates the checked-in seed corpus"]
fn generate_peer_message_corpus() {
    let far = log_id::<TypeConfig>(5, 2, 1_000_000);
    let heartbeat = AppendEntriesRequest::<TypeConfig> {
        vote: VoteOf::<TypeConfig>::new_committed(1, 1),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let other_leader = AppendEntriesRequest::<TypeConfig> {
        vote: VoteOf::<TypeConfig>::new_committed(7, 2),
        prev_log_id: Some(log_id::<TypeConfig>(0, 1, 0)),
        entries: vec![
            blank_ent::<TypeConfig>(7, 2, 1),
            EntryOf::<TypeConfig> {
                log_id: log_id::<TypeConfig>(7, 2, 2),
                payload: EntryPayload::Normal(Proposal {
                    time: ClusterTime(5),
                    principal: None,
                    request: Request::plain(put(b"from", b"another leader")),
                }),
            },
            membership_ent::<TypeConfig>(7, 2, 3, voters(&[1, 2])),
        ],
        leader_commit: Some(log_id::<TypeConfig>(7, 2, 3)),
    };
    let resign = encoded(&TransferLeaderRequest::<TypeConfig>::new(
        VoteOf::<TypeConfig>::new_committed(1, 1),
        1,
        None,
    ));
    let installed = machine_at(100_000);
    let snapshot_at = log_id::<TypeConfig>(9, 2, 100_000);
    let snapshot_vote = VoteOf::<TypeConfig>::new_committed(9, 2);
    let next_chunk = |data: &[u8]| SnapshotChunk {
        data: data.to_vec(),
        ..SnapshotChunk::default()
    };
    let (head, tail) = installed.split_at(installed.len() / 2);
    let mut vote_then_append = vote(VoteKind::Vote(VoteRequest::new(
        VoteOf::<TypeConfig>::new(6, 2),
        Some(far),
    )));
    vote_then_append.extend(append_entries(&AppendEntriesRequest::<TypeConfig> {
        vote: VoteOf::<TypeConfig>::new_committed(6, 2),
        prev_log_id: Some(far),
        entries: vec![blank_ent::<TypeConfig>(6, 2, 1_000_001)],
        leader_commit: Some(far),
    }));
    write_corpus(
        "peer_message",
        vec![
            (
                "vote-stale",
                vote(VoteKind::Vote(VoteRequest::new(
                    VoteOf::<TypeConfig>::new(1, 2),
                    None,
                ))),
            ),
            (
                "vote-higher-term",
                vote(VoteKind::Vote(VoteRequest::new(
                    VoteOf::<TypeConfig>::new(5, 2),
                    Some(far),
                ))),
            ),
            (
                "pre-vote",
                vote(VoteKind::PreVote(VoteRequest::new(
                    VoteOf::<TypeConfig>::new(5, 2),
                    Some(far),
                ))),
            ),
            ("heartbeat-own-term", append_entries(&heartbeat)),
            (
                "stream-append",
                stream_append(&[&heartbeat, &other_leader, &heartbeat]),
            ),
            (
                "stream-append-out-of-order",
                stream_append(&[
                    &other_leader,
                    &AppendEntriesRequest::<TypeConfig> {
                        prev_log_id: Some(log_id::<TypeConfig>(7, 2, 5)),
                        ..other_leader.clone()
                    },
                ]),
            ),
            ("another-leader", append_entries(&other_leader)),
            ("vote-then-append", vote_then_append),
            ("transfer-leader", unary(2, resign)),
            (
                "snapshot",
                snapshot(&[
                    first_chunk(snapshot_vote, snapshot_at, head, installed.len() as u64),
                    next_chunk(tail),
                ]),
            ),
            (
                "snapshot-undecodable",
                snapshot(&[first_chunk(
                    VoteOf::<TypeConfig>::new_committed(11, 2),
                    log_id::<TypeConfig>(11, 2, 200_000),
                    b"not a snapshot",
                    14,
                )]),
            ),
            (
                "snapshot-short",
                snapshot(&[first_chunk(snapshot_vote, snapshot_at, head, 1 << 20)]),
            ),
            ("snapshot-empty-stream", call(3, &[])),
            (
                "crash-snapshot-beyond-its-vote",
                snapshot(&[first_chunk(
                    VoteOf::<TypeConfig>::new_committed(12, 2),
                    log_id::<TypeConfig>(13, 2, 300_000),
                    &machine_at(300_000),
                    machine_at(300_000).len() as u64,
                )]),
            ),
            (
                "crash-snapshot-behind-committed",
                snapshot(&[first_chunk(
                    VoteOf::<TypeConfig>::new_committed(14, 2),
                    log_id::<TypeConfig>(14, 2, 1),
                    &machine_at(1),
                    machine_at(1).len() as u64,
                )]),
            ),
            ("random-1", noise(7, 120)),
            ("random-2", noise(8, 30)),
        ],
    );
}
