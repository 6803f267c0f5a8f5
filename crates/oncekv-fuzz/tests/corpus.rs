//! The seed corpus in `corpus/<target>/`: valid inputs that reach deep
//! into each target (requests on live sessions, restorable snapshots, real
//! log segments, Raft messages a peer would send, batches up to and past
//! their cap, etcd requests of every kind the adapter converts), plus edge
//! cases and random bytes.
//!
//! Regenerate with
//! `cargo test -p oncekv-fuzz --test corpus -- --ignored`; the output is
//! deterministic, so an unchanged generator leaves the files unchanged.

use oncekv_fuzz::client_request::SESSION_SECRET;
use oncekv_fuzz::etcd_request::kind_of;
use oncekv_fuzz::segment_recovery::SEGMENT_MAGIC;
use oncekv_fuzz::small_limits;
use oncekv_fuzz::snapshot_restore::body;
use oncekv_proto::convert;
use oncekv_proto::etcd::authpb::{Permission as EtcdPermission, UserAddOptions};
use oncekv_proto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use oncekv_proto::etcd::etcdserverpb::range_request::{SortOrder, SortTarget};
use oncekv_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcd::etcdserverpb::{
    AlarmRequest, AlarmType, AuthRoleAddRequest, AuthRoleDeleteRequest,
    AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserDeleteRequest, AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest, AuthenticateRequest, CompactionRequest, Compare as EtcdCompare,
    DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    MemberAddRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCancelRequest,
    WatchCreateRequest, WatchProgressRequest, WatchRequest, alarm_request, request_op,
};
use oncekv_proto::v1::{ExecuteBatchRequest, ExecuteRequest, RaftPayload, SnapshotChunk};
use oncekv_server::grpc::etcd::fuzzing::EtcdRequest;
use oncekv_server::raft::segment_log::SegmentLog;
use oncekv_server::raft::type_config::TypeConfig;
use oncekv_state::{
    ClusterTime, Command, Entry, IdempotencyKey, Limits, LogIndex, Origin, Proposal, Query,
    Request, RequestHeader, RequestId, Secret, Seq, SessionId, StateMachine,
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
        value: value.to_vec().into(),
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
                value: b"1".to_vec().into(),
                lease: Some("a".into()),
            },
        ),
        (
            1,
            Origin::Plain,
            Command::Put {
                key: b"y".to_vec(),
                value: b"2".to_vec().into(),
                lease: Some("b".into()),
            },
        ),
        (
            1,
            Origin::Plain,
            Command::Put {
                key: b"x".to_vec(),
                value: b"3".to_vec().into(),
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
            proposal: Proposal {
                time: ClusterTime(time),
                principal: None,
                request: Request {
                    origin: origin.clone(),
                    command: command.clone(),
                },
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
        payload: EntryPayload::Normal(std::sync::Arc::new(Proposal {
            time: ClusterTime(index * 10),
            principal: None,
            request: Request::plain(command),
        })),
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
        proposal: Proposal {
            time: ClusterTime(1_000),
            principal: None,
            request: Request::plain(put(b"snapshot", b"installed")),
        },
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
                payload: EntryPayload::Normal(std::sync::Arc::new(Proposal {
                    time: ClusterTime(5),
                    principal: None,
                    request: Request::plain(put(b"from", b"another leader")),
                })),
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

// ---- batch requests ---------------------------------------------------

/// The wire form of client requests.
fn wire_requests(requests: &[(u8, Origin, Command)]) -> Vec<ExecuteRequest> {
    requests
        .iter()
        .map(|(_, origin, command)| {
            convert::request_to_wire(&Request {
                origin: origin.clone(),
                command: command.clone(),
            })
            .expect("request goes on the wire")
        })
        .collect()
}

fn batch(requests: Vec<ExecuteRequest>) -> Vec<u8> {
    ExecuteBatchRequest { requests }.encode_to_vec()
}

/// `count` empty requests, two bytes each.
fn empty_requests(count: usize) -> Vec<u8> {
    [0x0a, 0x00].repeat(count)
}

/// `count` puts of distinct keys.
fn puts(count: usize) -> Vec<ExecuteRequest> {
    let requests: Vec<_> = (0..count)
        .map(|n| (0, Origin::Plain, put(format!("k{n}").as_bytes(), b"v")))
        .collect();
    wire_requests(&requests)
}

#[test]
#[ignore = "regenerates the checked-in seed corpus"]
fn generate_batch_request_corpus() {
    let cap = oncekv_proto::BATCH_REQUESTS_MAX;
    let one = batch(puts(1));
    let mut unknown_fields = one.clone();
    // Field 2, a varint; field 3, length-delimited.
    unknown_fields.extend([0x10, 0x05, 0x1a, 0x02, 0xff, 0xff]);
    let mut past_cap_broken = empty_requests(cap);
    past_cap_broken.extend([0x0a, 0x7f, 0x01]);
    past_cap_broken.extend(empty_requests(10));
    let mut broken_before_cap = empty_requests(3);
    broken_before_cap.extend([0x0a, 0x7f, 0x01]);
    broken_before_cap.extend(empty_requests(cap));
    let interleaved = [0x10, 0x01, 0x0a, 0x00].repeat(cap + 1);
    // One request whose encoding is cut by a byte inside a length that
    // says so: the outer frame is whole, the request is not.
    let request = puts(1).remove(0).encode_to_vec();
    let inner = &request[..request.len() - 1];
    let mut nested_cut_short = vec![0x0a, u8::try_from(inner.len()).expect("short")];
    nested_cut_short.extend_from_slice(inner);
    let mut huge_length = vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f];
    huge_length.extend(empty_requests(2));
    let mut overlong_varint = vec![0x0a];
    overlong_varint.extend([0xff; 10]);
    overlong_varint.push(0x01);
    // A group (field 2) holding what reads as a request key, skipped whole,
    // then one request.
    let group_then_request = vec![0x13, 0x0a, 0x00, 0x14, 0x0a, 0x00];
    write_corpus(
        "batch_request",
        vec![
            ("empty", Vec::new()),
            ("one-put", one),
            ("sessions", batch(wire_requests(&session_requests()))),
            ("leases", batch(wire_requests(&lease_requests()))),
            ("at-cap", empty_requests(cap)),
            ("at-cap-puts", batch(puts(cap))),
            ("cap-plus-one", empty_requests(cap + 1)),
            ("cap-plus-one-puts", batch(puts(cap + 1))),
            ("past-cap-broken", past_cap_broken),
            ("broken-before-cap", broken_before_cap),
            ("interleaved-unknown-past-cap", interleaved),
            ("unknown-fields", unknown_fields),
            ("nested-cut-short", nested_cut_short),
            ("truncated-length-varint", vec![0x0a, 0xff]),
            ("truncated-key-varint", vec![0x8a]),
            ("huge-length", huge_length),
            ("overlong-varint", overlong_varint),
            ("group-then-request", group_then_request),
            ("wrong-wire-type", vec![0x08, 0x01]),
            ("end-group-alone", vec![0x0c]),
            ("random-1", noise(9, 256)),
            ("random-2", noise(10, 64)),
        ],
    );
}

// ---- etcd requests ----------------------------------------------------

/// The protobuf encoding of `request`'s message.
fn etcd_message(request: &EtcdRequest) -> Vec<u8> {
    match request {
        EtcdRequest::Range(m) => m.encode_to_vec(),
        EtcdRequest::Put(m) => m.encode_to_vec(),
        EtcdRequest::DeleteRange(m) => m.encode_to_vec(),
        EtcdRequest::Txn(m) => m.encode_to_vec(),
        EtcdRequest::Compaction(m) => m.encode_to_vec(),
        EtcdRequest::LeaseGrant(m) => m.encode_to_vec(),
        EtcdRequest::LeaseRevoke(m) => m.encode_to_vec(),
        EtcdRequest::LeaseKeepAlive(m) => m.encode_to_vec(),
        EtcdRequest::Watch(m) => m.encode_to_vec(),
        EtcdRequest::Alarm(m) => m.encode_to_vec(),
        EtcdRequest::MemberAdd(m) => m.encode_to_vec(),
        EtcdRequest::Authenticate(m) => m.encode_to_vec(),
        EtcdRequest::UserAdd(m) => m.encode_to_vec(),
        EtcdRequest::UserDelete(m) => m.encode_to_vec(),
        EtcdRequest::UserChangePassword(m) => m.encode_to_vec(),
        EtcdRequest::UserGrantRole(m) => m.encode_to_vec(),
        EtcdRequest::UserRevokeRole(m) => m.encode_to_vec(),
        EtcdRequest::RoleAdd(m) => m.encode_to_vec(),
        EtcdRequest::RoleDelete(m) => m.encode_to_vec(),
        EtcdRequest::RoleGrantPermission(m) => m.encode_to_vec(),
        EtcdRequest::RoleRevokePermission(m) => m.encode_to_vec(),
    }
}

/// One `etcd_request` message: `[kind][step][length u16][bytes]`.
fn etcd_frame(kind: u8, step: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![kind, step];
    out.extend(
        u16::try_from(bytes.len())
            .expect("a short message")
            .to_le_bytes(),
    );
    out.extend_from_slice(bytes);
    out
}

/// An `etcd_request` input: each request `step * 32` ms after the last.
fn etcd_input(requests: &[(u8, EtcdRequest)]) -> Vec<u8> {
    requests
        .iter()
        .flat_map(|(step, request)| etcd_frame(kind_of(request), *step, &etcd_message(request)))
        .collect()
}

fn etcd_put(key: &[u8], value: &[u8]) -> PutRequest {
    PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..PutRequest::default()
    }
}

fn etcd_range(key: &[u8], range_end: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        ..RangeRequest::default()
    }
}

fn op_put(put: PutRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(put)),
    }
}

fn op_range(range: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(range)),
    }
}

fn op_delete(key: &[u8], range_end: &[u8], prev_kv: bool) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.to_vec(),
                range_end: range_end.to_vec(),
                prev_kv,
            },
        )),
    }
}

fn compare(key: &[u8], target: CompareTarget, union: Option<TargetUnion>) -> EtcdCompare {
    EtcdCompare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: key.to_vec(),
        target_union: union,
        range_end: Vec::new(),
    }
}

fn kv_requests() -> Vec<(u8, EtcdRequest)> {
    let with_prev = PutRequest {
        prev_kv: true,
        ..etcd_put(b"b", b"2")
    };
    let sorted = RangeRequest {
        sort_order: SortOrder::Descend as i32,
        sort_target: SortTarget::Value as i32,
        limit: 2,
        ..etcd_range(b"\0", b"\0")
    };
    let filtered = RangeRequest {
        min_mod_revision: 2,
        count_only: true,
        ..etcd_range(b"a", b"c")
    };
    let keep_value = PutRequest {
        ignore_value: true,
        ..etcd_put(b"a", b"")
    };
    let keep_missing = PutRequest {
        ignore_lease: true,
        ..etcd_put(b"nope", b"x")
    };
    let txn = TxnRequest {
        compare: vec![compare(
            b"a",
            CompareTarget::Value,
            Some(TargetUnion::Value(b"1".to_vec())),
        )],
        success: vec![
            op_put(etcd_put(b"c", b"3")),
            op_range(etcd_range(b"a", b"")),
        ],
        failure: vec![op_delete(b"a", b"", true)],
    };
    vec![
        (1, EtcdRequest::Put(etcd_put(b"a", b"1"))),
        (1, EtcdRequest::Put(with_prev.clone())),
        (1, EtcdRequest::Put(with_prev)),
        (0, EtcdRequest::Range(etcd_range(b"a", b""))),
        (0, EtcdRequest::Range(etcd_range(b"\0", b"\0"))),
        (0, EtcdRequest::Range(etcd_range(b"a", b"b"))),
        (0, EtcdRequest::Range(sorted)),
        (0, EtcdRequest::Range(filtered)),
        (1, EtcdRequest::Txn(txn.clone())),
        (1, EtcdRequest::Put(keep_value)),
        (1, EtcdRequest::Put(keep_missing)),
        (1, EtcdRequest::Txn(txn)),
        (
            0,
            EtcdRequest::Range(RangeRequest {
                revision: 2,
                ..etcd_range(b"a", b"")
            }),
        ),
        (
            1,
            EtcdRequest::DeleteRange(DeleteRangeRequest {
                key: b"a".to_vec(),
                range_end: b"\0".to_vec(),
                prev_kv: true,
            }),
        ),
        (
            1,
            EtcdRequest::Compaction(CompactionRequest {
                revision: 3,
                physical: false,
            }),
        ),
        (
            0,
            EtcdRequest::Range(RangeRequest {
                revision: 1,
                ..etcd_range(b"a", b"")
            }),
        ),
        (
            0,
            EtcdRequest::Range(RangeRequest {
                revision: 1000,
                ..etcd_range(b"a", b"")
            }),
        ),
    ]
}

fn nested_txn_requests() -> Vec<(u8, EtcdRequest)> {
    let nested = TxnRequest {
        compare: vec![compare(
            b"a",
            CompareTarget::Version,
            Some(TargetUnion::Version(0)),
        )],
        success: vec![op_put(PutRequest {
            prev_kv: true,
            ..etcd_put(b"b", b"v")
        })],
        failure: vec![op_delete(b"c", b"d", false)],
    };
    let outer = TxnRequest {
        compare: vec![compare(b"z", CompareTarget::Mod, None)],
        success: vec![
            op_put(etcd_put(b"a", b"v")),
            RequestOp {
                request: Some(request_op::Request::RequestTxn(nested.clone())),
            },
        ],
        failure: vec![op_range(etcd_range(b"a", b"b"))],
    };
    let other_branch = TxnRequest {
        compare: vec![compare(
            b"a",
            CompareTarget::Version,
            Some(TargetUnion::Version(9)),
        )],
        failure: vec![RequestOp {
            request: Some(request_op::Request::RequestTxn(nested)),
        }],
        ..TxnRequest::default()
    };
    // Nested as deep as the node's operation bound lets it, and deeper.
    let nest = |depth| {
        let mut txn = TxnRequest {
            success: vec![op_put(etcd_put(b"deep", b"v"))],
            ..TxnRequest::default()
        };
        for _ in 0..depth {
            txn = TxnRequest {
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestTxn(txn)),
                }],
                ..TxnRequest::default()
            };
        }
        txn
    };
    let lease_compare = TxnRequest {
        compare: vec![
            compare(b"a", CompareTarget::Lease, Some(TargetUnion::Lease(7))),
            compare(
                b"a",
                CompareTarget::Create,
                Some(TargetUnion::CreateRevision(1)),
            ),
        ],
        success: vec![op_range(etcd_range(b"a", b"\0"))],
        failure: vec![op_delete(b"a", b"b", false)],
    };
    vec![
        (1, EtcdRequest::Txn(outer.clone())),
        (1, EtcdRequest::Txn(outer)),
        (1, EtcdRequest::Txn(other_branch)),
        (1, EtcdRequest::Txn(nest(2))),
        (1, EtcdRequest::Txn(nest(6))),
        (1, EtcdRequest::Txn(lease_compare)),
        (1, EtcdRequest::Txn(TxnRequest::default())),
    ]
}

fn lease_requests_etcd() -> Vec<(u8, EtcdRequest)> {
    let grant = |id, ttl| EtcdRequest::LeaseGrant(LeaseGrantRequest { ttl, id });
    vec![
        (1, grant(7, 5)),
        (
            1,
            EtcdRequest::Put(PutRequest {
                lease: 7,
                ..etcd_put(b"l", b"leased")
            }),
        ),
        (
            1,
            EtcdRequest::LeaseKeepAlive(LeaseKeepAliveRequest { id: 7 }),
        ),
        (1, grant(0, 1)),
        (1, grant(7, 5)),
        (1, grant(8, 100)),
        (1, grant(-1, 5)),
        (
            1,
            EtcdRequest::Put(PutRequest {
                lease: 9,
                ..etcd_put(b"m", b"no such lease")
            }),
        ),
        (
            1,
            EtcdRequest::Put(PutRequest {
                ignore_lease: true,
                ..etcd_put(b"l", b"kept lease")
            }),
        ),
        (1, EtcdRequest::LeaseRevoke(LeaseRevokeRequest { id: 7 })),
        (1, EtcdRequest::LeaseRevoke(LeaseRevokeRequest { id: 7 })),
        (
            1,
            EtcdRequest::LeaseKeepAlive(LeaseKeepAliveRequest { id: 1 }),
        ),
        (
            200,
            EtcdRequest::LeaseKeepAlive(LeaseKeepAliveRequest { id: 1 }),
        ),
        (0, EtcdRequest::Range(etcd_range(b"l", b""))),
    ]
}

fn watch(create: WatchCreateRequest) -> EtcdRequest {
    EtcdRequest::Watch(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(create)),
    })
}

fn watch_requests() -> Vec<(u8, EtcdRequest)> {
    let create = |key: &[u8], range_end: &[u8]| WatchCreateRequest {
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        ..WatchCreateRequest::default()
    };
    vec![
        (0, watch(create(b"a", b""))),
        (0, watch(create(b"a", b"b"))),
        (0, watch(create(b"", b""))),
        (0, watch(create(b"\0", b"\0"))),
        (0, watch(create(b"b", b"a"))),
        (
            0,
            watch(WatchCreateRequest {
                start_revision: 5,
                prev_kv: true,
                progress_notify: true,
                ..create(b"a", b"\0")
            }),
        ),
        (
            0,
            EtcdRequest::Watch(WatchRequest {
                request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest {
                    watch_id: 1,
                })),
            }),
        ),
        (
            0,
            EtcdRequest::Watch(WatchRequest {
                request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
            }),
        ),
        (0, EtcdRequest::Watch(WatchRequest::default())),
    ]
}

fn auth_requests() -> Vec<(u8, EtcdRequest)> {
    let user_add = |name: &str, password: &str, no_password| {
        EtcdRequest::UserAdd(AuthUserAddRequest {
            name: name.into(),
            password: password.into(),
            options: Some(UserAddOptions { no_password }),
            hashed_password: String::new(),
        })
    };
    let permission = |key: &[u8], range_end: &[u8]| EtcdPermission {
        perm_type: 2,
        key: key.to_vec(),
        range_end: range_end.to_vec(),
    };
    let grant_role = |user: &str, role: &str| {
        EtcdRequest::UserGrantRole(AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        })
    };
    vec![
        (1, user_add("root", "secret", false)),
        (1, user_add("cert", "", true)),
        (1, user_add("", "x", false)),
        (1, user_add("empty", "", false)),
        (
            1,
            EtcdRequest::RoleAdd(AuthRoleAddRequest { name: "r".into() }),
        ),
        (
            1,
            EtcdRequest::RoleAdd(AuthRoleAddRequest {
                name: "root".into(),
            }),
        ),
        (
            1,
            EtcdRequest::RoleGrantPermission(AuthRoleGrantPermissionRequest {
                name: "r".into(),
                perm: Some(permission(b"a", b"b")),
            }),
        ),
        (
            1,
            EtcdRequest::RoleGrantPermission(AuthRoleGrantPermissionRequest {
                name: "r".into(),
                perm: Some(permission(b"a", b"c")),
            }),
        ),
        (1, grant_role("root", "root")),
        (1, grant_role("cert", "r")),
        (1, grant_role("nobody", "r")),
        (
            1,
            EtcdRequest::RoleRevokePermission(AuthRoleRevokePermissionRequest {
                role: "r".into(),
                key: b"a".to_vec(),
                range_end: b"b".to_vec(),
            }),
        ),
        (
            1,
            EtcdRequest::UserRevokeRole(AuthUserRevokeRoleRequest {
                name: "cert".into(),
                role: "r".into(),
            }),
        ),
        (
            1,
            EtcdRequest::UserChangePassword(AuthUserChangePasswordRequest {
                name: "root".into(),
                password: "another".into(),
                hashed_password: String::new(),
            }),
        ),
        (
            1,
            EtcdRequest::Authenticate(AuthenticateRequest {
                name: "root".into(),
                password: "another".into(),
            }),
        ),
        (
            1,
            EtcdRequest::RoleDelete(AuthRoleDeleteRequest { role: "r".into() }),
        ),
        (
            1,
            EtcdRequest::RoleDelete(AuthRoleDeleteRequest {
                role: "root".into(),
            }),
        ),
        (
            1,
            EtcdRequest::UserDelete(AuthUserDeleteRequest {
                name: "cert".into(),
            }),
        ),
    ]
}

fn cluster_requests() -> Vec<(u8, EtcdRequest)> {
    let add = |urls: &[&str]| {
        EtcdRequest::MemberAdd(MemberAddRequest {
            peer_ur_ls: urls.iter().map(|url| url.to_string()).collect(),
            is_learner: false,
        })
    };
    let alarm = |action: alarm_request::AlarmAction, alarm: AlarmType| {
        EtcdRequest::Alarm(AlarmRequest {
            action: action as i32,
            member_id: 0,
            alarm: alarm as i32,
        })
    };
    vec![
        (0, add(&["http://10.0.0.2:2380", "http://10.0.0.2:2379"])),
        (
            0,
            add(&["https://[::1]:2380", "https://node-3.example:2379"]),
        ),
        (0, add(&["http://10.0.0.2:2380"])),
        (0, add(&["unix://socket:1", "http://a:1"])),
        (0, add(&["http://a:0", "http://a:1"])),
        (0, add(&[])),
        (0, alarm(alarm_request::AlarmAction::Get, AlarmType::None)),
        (
            1,
            alarm(alarm_request::AlarmAction::Deactivate, AlarmType::Nospace),
        ),
        (
            0,
            alarm(alarm_request::AlarmAction::Activate, AlarmType::Nospace),
        ),
    ]
}

fn invalid_etcd_requests() -> Vec<(u8, EtcdRequest)> {
    let many_ops = TxnRequest {
        compare: Vec::new(),
        success: (0..6u8)
            .map(|n| op_put(etcd_put(&[b'k', n], b"v")))
            .collect(),
        failure: Vec::new(),
    };
    let same_key_twice = TxnRequest {
        compare: Vec::new(),
        success: vec![op_put(etcd_put(b"k", b"1")), op_put(etcd_put(b"k", b"2"))],
        failure: Vec::new(),
    };
    let wrong_union = TxnRequest {
        compare: vec![compare(
            b"a",
            CompareTarget::Version,
            Some(TargetUnion::Value(b"x".to_vec())),
        )],
        ..TxnRequest::default()
    };
    let negative_version = TxnRequest {
        compare: vec![compare(
            b"a",
            CompareTarget::Version,
            Some(TargetUnion::Version(-3)),
        )],
        ..TxnRequest::default()
    };
    let past_in_txn = TxnRequest {
        success: vec![op_range(RangeRequest {
            revision: 1,
            ..etcd_range(b"a", b"")
        })],
        ..TxnRequest::default()
    };
    let empty_op = TxnRequest {
        success: vec![RequestOp { request: None }],
        ..TxnRequest::default()
    };
    vec![
        (1, EtcdRequest::Put(etcd_put(b"", b"1"))),
        (1, EtcdRequest::Put(etcd_put(&[b'k'; 17], b"1"))),
        (1, EtcdRequest::Put(etcd_put(b"k", &[b'v'; 65]))),
        (
            1,
            EtcdRequest::Put(PutRequest {
                lease: -1,
                ..etcd_put(b"k", b"1")
            }),
        ),
        (
            1,
            EtcdRequest::Put(PutRequest {
                ignore_value: true,
                ..etcd_put(b"k", b"1")
            }),
        ),
        (0, EtcdRequest::Range(etcd_range(b"", b""))),
        (0, EtcdRequest::Range(etcd_range(&[b'k'; 40], b""))),
        (1, EtcdRequest::Txn(many_ops)),
        (1, EtcdRequest::Txn(same_key_twice)),
        (1, EtcdRequest::Txn(wrong_union)),
        (1, EtcdRequest::Txn(negative_version)),
        (1, EtcdRequest::Txn(past_in_txn)),
        (1, EtcdRequest::Txn(empty_op)),
        (1, EtcdRequest::DeleteRange(DeleteRangeRequest::default())),
        (
            1,
            EtcdRequest::Compaction(CompactionRequest {
                revision: -5,
                physical: true,
            }),
        ),
        (
            1,
            EtcdRequest::LeaseGrant(LeaseGrantRequest {
                ttl: i64::MAX,
                id: i64::MAX,
            }),
        ),
    ]
}

/// A message whose bytes are cut or whose lengths lie, of each of a few
/// kinds; then one that decodes, so the input goes on past them.
fn broken_etcd_messages() -> Vec<u8> {
    let mut out = Vec::new();
    // A Put whose key's length runs far past the message.
    out.extend(etcd_frame(
        1,
        1,
        &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, b'k'],
    ));
    // A Range whose key's length varint is cut.
    out.extend(etcd_frame(0, 0, &[0x0a, 0x80]));
    // A Txn whose success operation is cut inside its put.
    let mut txn = TxnRequest {
        success: vec![op_put(etcd_put(b"key", b"value"))],
        ..TxnRequest::default()
    }
    .encode_to_vec();
    txn.pop();
    out.extend(etcd_frame(3, 1, &txn));
    // An overlong varint for a lease grant's TTL.
    let mut grant = vec![0x08];
    grant.extend([0xff; 10]);
    grant.push(0x01);
    out.extend(etcd_frame(5, 1, &grant));
    // A name that is not UTF-8.
    out.extend(etcd_frame(12, 1, &[0x0a, 0x02, 0xff, 0xfe]));
    out.extend(etcd_frame(
        1,
        1,
        &etcd_put(b"after", b"all").encode_to_vec(),
    ));
    out
}

/// A transaction nested past prost's recursion limit (refused by the
/// decoding).
fn too_deep_txn() -> Vec<u8> {
    let mut deep = TxnRequest::default();
    for _ in 0..120 {
        deep = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(deep)),
            }],
            ..TxnRequest::default()
        };
    }
    etcd_frame(3, 1, &deep.encode_to_vec())
}

#[test]
#[ignore = "regenerates the checked-in seed corpus"]
fn generate_etcd_request_corpus() {
    write_corpus(
        "etcd_request",
        vec![
            ("kv", etcd_input(&kv_requests())),
            ("nested-txn", etcd_input(&nested_txn_requests())),
            ("leases", etcd_input(&lease_requests_etcd())),
            ("watch", etcd_input(&watch_requests())),
            ("auth", etcd_input(&auth_requests())),
            ("cluster-alarm", etcd_input(&cluster_requests())),
            ("invalid", etcd_input(&invalid_etcd_requests())),
            ("broken-messages", broken_etcd_messages()),
            ("too-deep-txn", too_deep_txn()),
            ("random-1", noise(11, 256)),
            ("random-2", noise(12, 64)),
        ],
    );
}
