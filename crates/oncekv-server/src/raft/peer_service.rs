//! The peer network, server side: the `RaftPeer` gRPC service, handing
//! other nodes' Raft messages to this node's consensus.
//!
//! An incoming snapshot goes through the node's [`SnapshotSpool`]. A stream
//! announcing more than its cap is refused at once (RESOURCE_EXHAUSTED,
//! logged); one snapshot is received at a time (another is refused with
//! RESOURCE_EXHAUSTED and `oncekv-overloaded: snapshot`); its first message
//! is admitted like any other peer message (its sender a member, its vote
//! and last log id through [`peer_checks`]) before the spool file is
//! created, so a refused sender costs no disk; then the chunks are
//! written to a file in the spool directory (`<data dir>/snapshot-incoming/`)
//! as they arrive, not held in memory; and a stream that ends short of, or
//! runs past, the size it announced is refused (INVALID_ARGUMENT). The
//! complete spool file is handed to openraft as it is (our `SnapshotData`
//! is a [`SnapshotFile`], a handle on the file), never read into one
//! buffer: receiving needs no memory for the snapshot, and the bytes are
//! decoded from the file in bounded pieces. Before it is handed to
//! consensus, the snapshot must restore (under this node's limits, to the
//! index it claims): consensus treats a failed install as a storage
//! failure and stops the node, so bytes that do not restore are refused
//! here (INVALID_ARGUMENT, logged) instead. The state they restored to
//! rides along to the install, which takes it instead of decoding again:
//! the node holds one restored copy beside its current state, never two. The spool file is removed whatever happens:
//! on a refusal, when the sender goes away (the handler is dropped), and
//! after the install. Leftovers of a crash are removed when the spool
//! opens.
//!
//! `StreamAppend` carries many `AppendEntries` on one call (the leader's
//! pipeline): each is admitted like a unary one as it is read, handed to
//! openraft in order, and answered in order; the first one refused ends the
//! call with its status after the replies to those before it.
//!
//! Before this service sees a call, with a peer token
//! (`--peer-token-file`), the call's headers must carry it: the server
//! wraps this service in [`super::peer_token::PeerTokenCheck`], which
//! answers UNAUTHENTICATED before any message of the call is read. Then
//! every message is admitted ([`PeerService`]'s `admit`): with peer TLS,
//! the caller's verified certificate must be valid for `node-<sender>`,
//! the sender id inside the message; the message must pass
//! [`peer_checks`] (its term judged against the term this node stores);
//! and its sender must be a member of this node's cluster. A refusal is
//! answered PERMISSION_DENIED (who may send) or INVALID_ARGUMENT (what was
//! sent) and logged, never more: a refused message reaches neither
//! openraft nor the disk.

use super::network::{VoteKind, decode, encode};
use super::peer_checks::{self, PeerMessageRefused, PeerNotAllowed};
use super::snapshot_file::SnapshotFile;
use super::state_machine_store::Raft;
use super::type_config::{NodeId, TypeConfig};
use crate::transport::{is_malformed_message, overloaded};
use futures_util::StreamExt;
use oncekv_proto::v1::raft_peer_server::RaftPeer;
use oncekv_proto::v1::{RaftPayload, SnapshotChunk};
use oncekv_state::{Limits, LogIndex, StateMachine};
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, VoteOf};
use openraft::raft::AppendEntriesRequest;
use serde::Serialize;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Response, Status, Streaming};

/// What was full when a snapshot is refused because another is being
/// received.
const SNAPSHOT_BUSY: &str = "snapshot";

/// Where incoming snapshots are spooled, how large one may be, and the
/// limits it must restore under.
#[derive(Debug)]
pub struct SnapshotSpool {
    dir: PathBuf,
    bytes_max: u64,
    limits: Limits,
    /// Whether files are written on the calling task rather than on a
    /// blocking thread (deterministic simulation).
    inline_io: bool,
    /// One snapshot received (and installed) at a time.
    receiving: Arc<Semaphore>,
    next_file: AtomicU64,
}

impl SnapshotSpool {
    /// A spool in `dir` (created if missing, emptied of what a crash left)
    /// for snapshots of at most `bytes_max` bytes that restore under
    /// `limits` (this node's). With `inline_io`, files are written and
    /// snapshots checked on the calling task (deterministic simulation).
    pub fn open(
        dir: &Path,
        bytes_max: u64,
        limits: Limits,
        inline_io: bool,
    ) -> io::Result<SnapshotSpool> {
        crate::private_fs::create_dir(dir)?;
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_file() {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(SnapshotSpool {
            dir: dir.to_path_buf(),
            bytes_max,
            limits,
            inline_io,
            receiving: Arc::new(Semaphore::new(1)),
            next_file: AtomicU64::new(0),
        })
    }

    /// Checks that `data` restores under this node's limits to the index
    /// `meta` claims (decoding it from its file in bounded pieces), off the
    /// async task unless `inline_io`; gives the data back with the state it
    /// restored to, for the install.
    async fn check(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
        data: SnapshotFile,
    ) -> Result<SnapshotFile, SnapshotRefused> {
        let limits = self.limits.clone();
        let claimed = meta.last_log_id.as_ref().map(|id| LogIndex(id.index));
        let check = move || {
            let verdict = match StateMachine::restore_from(&limits, data.reader()) {
                Err(error) => Err(format!("does not restore: {error}")),
                Ok(machine) if machine.last_applied() != claimed => Err(format!(
                    "restores to index {:?}, not the {:?} it claims",
                    machine.last_applied().map(|index| index.0),
                    claimed.map(|index| index.0)
                )),
                Ok(machine) => Ok(machine),
            };
            (verdict, data)
        };
        let (verdict, data) = if self.inline_io {
            check()
        } else {
            tokio::task::spawn_blocking(check)
                .await
                .map_err(|error| SnapshotRefused::Spool(io::Error::other(error)))?
        };
        match verdict {
            Ok(machine) => Ok(data.with_restored(machine)),
            Err(reason) => {
                let refused = SnapshotRefused::Invalid(reason);
                tracing::warn!("{refused}");
                Err(refused)
            }
        }
    }

    fn create(&self) -> io::Result<SpoolFile> {
        let number = self.next_file.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("snapshot-{number}.part"));
        let file = crate::private_fs::create(&path)?;
        Ok(SpoolFile {
            path,
            file: Some(file),
            inline_io: self.inline_io,
        })
    }
}

/// One snapshot being received: its file, removed when this is dropped.
struct SpoolFile {
    path: PathBuf,
    file: Option<std::fs::File>,
    inline_io: bool,
}

impl SpoolFile {
    /// Appends `data`, off the async task unless `inline_io`.
    async fn append(&mut self, data: Vec<u8>) -> io::Result<()> {
        let mut file = self
            .file
            .take()
            .ok_or_else(|| io::Error::other("an earlier write to the spool file failed"))?;
        if self.inline_io {
            file.write_all(&data)?;
        } else {
            file = tokio::task::spawn_blocking(move || file.write_all(&data).map(|()| file))
                .await
                .map_err(io::Error::other)??;
        }
        self.file = Some(file);
        Ok(())
    }

    /// The bytes received, as a handle on the file (which stays readable
    /// through it after this is dropped and the file removed). The store
    /// installing them may move the file into place: dropped after that,
    /// this finds nothing to remove.
    fn snapshot(&mut self) -> io::Result<SnapshotFile> {
        drop(self.file.take());
        SnapshotFile::movable(&self.path)
    }
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        drop(self.file.take());
        if let Err(error) = std::fs::remove_file(&self.path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove a snapshot spool file");
        }
    }
}

/// Why an incoming snapshot was refused.
#[derive(Debug, thiserror::Error)]
enum SnapshotRefused {
    #[error("this node receives no snapshots (no spool directory)")]
    NoSpool,
    #[error("a snapshot is already being received; retry later")]
    Busy,
    #[error("empty snapshot stream")]
    Empty,
    #[error(
        "the snapshot announces {announced} bytes, over this node's limit of {max} bytes (--max-snapshot-bytes)"
    )]
    TooLarge { announced: u64, max: u64 },
    #[error("undecodable snapshot {what}: {source}")]
    Undecodable {
        what: &'static str,
        source: postcard::Error,
    },
    #[error("snapshot stream carries more than the {total} bytes it announced")]
    Overrun { total: u64 },
    #[error("snapshot stream ended after {received} of {total} bytes")]
    Short { received: u64, total: u64 },
    #[error("a received snapshot is refused: it {0}")]
    Invalid(String),
    #[error("spooling the snapshot: {0}")]
    Spool(#[source] io::Error),
    #[error("receiving the snapshot: {0}")]
    Stream(Status),
    #[error("{}", .0.message())]
    NotAdmitted(Status),
}

impl From<SnapshotRefused> for Status {
    fn from(refused: SnapshotRefused) -> Status {
        let message = refused.to_string();
        match refused {
            SnapshotRefused::NoSpool => Status::unavailable(message),
            SnapshotRefused::Busy => overloaded(SNAPSHOT_BUSY, message),
            SnapshotRefused::TooLarge { .. } => Status::resource_exhausted(message),
            SnapshotRefused::Empty
            | SnapshotRefused::Undecodable { .. }
            | SnapshotRefused::Overrun { .. }
            | SnapshotRefused::Short { .. }
            | SnapshotRefused::Invalid(_) => Status::invalid_argument(message),
            SnapshotRefused::Spool(error) => {
                let mut status = Status::internal(message);
                status.set_source(Arc::new(error));
                status
            }
            SnapshotRefused::Stream(status) if is_malformed_message(&status) => {
                Status::invalid_argument(format!("malformed snapshot chunk: {}", status.message()))
            }
            SnapshotRefused::Stream(status) | SnapshotRefused::NotAdmitted(status) => status,
        }
    }
}

/// A snapshot received whole into its spool file.
struct Received {
    vote: VoteOf<TypeConfig>,
    meta: SnapshotMetaOf<TypeConfig>,
    /// Dropped (removed) before the slot below is given back.
    file: SpoolFile,
    /// The spool's one slot, held until the install is over: one received
    /// state restored at most.
    slot: OwnedSemaphorePermit,
}

/// The length of a chunk, for the running total.
fn length(data: &[u8]) -> u64 {
    u64::try_from(data.len()).unwrap_or(u64::MAX)
}

/// Receives a snapshot stream into a spool file, checking it against the
/// spool's cap (before anything else), `admit` (its sender and what its
/// first message claims, before it may take the spool's one slot or
/// create a file), the spool's one slot, and the size it announced.
async fn receive(
    spool: &SnapshotSpool,
    chunks: &mut Streaming<SnapshotChunk>,
    admit: impl FnOnce(&VoteOf<TypeConfig>, &SnapshotMetaOf<TypeConfig>) -> Result<(), Status>,
) -> Result<Received, SnapshotRefused> {
    let first = chunks
        .message()
        .await
        .map_err(SnapshotRefused::Stream)?
        .ok_or(SnapshotRefused::Empty)?;
    let total = first.total_bytes;
    if total > spool.bytes_max {
        let refused = SnapshotRefused::TooLarge {
            announced: total,
            max: spool.bytes_max,
        };
        tracing::warn!(announced = total, limit = spool.bytes_max, "{refused}");
        return Err(refused);
    }
    let undecodable = |what| move |source| SnapshotRefused::Undecodable { what, source };
    let vote: VoteOf<TypeConfig> = decode(&first.vote).map_err(undecodable("vote"))?;
    let meta: SnapshotMetaOf<TypeConfig> = decode(&first.meta).map_err(undecodable("meta"))?;
    admit(&vote, &meta).map_err(SnapshotRefused::NotAdmitted)?;
    let receiving = Arc::clone(&spool.receiving)
        .try_acquire_owned()
        .map_err(|_| {
            metrics::counter!(
                "oncekv_requests_shed_total",
                "listener" => "peer",
                "limit" => SNAPSHOT_BUSY
            )
            .increment(1);
            SnapshotRefused::Busy
        })?;
    let mut file = spool.create().map_err(SnapshotRefused::Spool)?;
    let mut received = 0u64;
    let mut next = Some(first.data);
    while let Some(data) = next {
        received = received
            .checked_add(length(&data))
            .filter(|received| *received <= total)
            .ok_or(SnapshotRefused::Overrun { total })?;
        if !data.is_empty() {
            file.append(data).await.map_err(SnapshotRefused::Spool)?;
        }
        next = chunks
            .message()
            .await
            .map_err(SnapshotRefused::Stream)?
            .map(|chunk| chunk.data);
    }
    if received != total {
        return Err(SnapshotRefused::Short { received, total });
    }
    Ok(Received {
        vote,
        meta,
        file,
        slot: receiving,
    })
}

/// When this node last heard from the leader it follows: an append
/// (heartbeats are appends) or a snapshot under a vote at least the one
/// this node stores (its leader's, or a newer leader's it is about to
/// follow). openraft, with pre-vote, keeps naming the leader of that vote
/// for as long as no election succeeds, even one that stopped long ago;
/// what this says lets the node tell a leader it follows from one it only
/// remembers ([`super::consensus::Consensus::status`]).
#[derive(Clone, Debug)]
pub struct LeaderContact {
    start: tokio::time::Instant,
    /// Milliseconds from `start` to the last contact plus one; 0: none yet.
    last: Arc<AtomicU64>,
}

impl Default for LeaderContact {
    fn default() -> Self {
        LeaderContact {
            start: tokio::time::Instant::now(),
            last: Arc::default(),
        }
    }
}

impl LeaderContact {
    /// Notes a message from the leader now.
    pub fn heard(&self) {
        let since = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last
            .fetch_max(since.saturating_add(1), Ordering::Relaxed);
    }

    /// Whether the leader was heard from within `window` before now.
    pub fn heard_within(&self, window: std::time::Duration) -> bool {
        match self.last.load(Ordering::Relaxed) {
            0 => false,
            last => {
                let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
                let window = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
                now.saturating_sub(last - 1) <= window
            }
        }
    }
}

/// Serves Raft messages from peers.
#[derive(Clone)]
pub struct PeerService {
    raft: Raft,
    spool: Option<Arc<SnapshotSpool>>,
    /// Whether callers must present a certificate valid for the node
    /// they send as (peer TLS).
    peer_certificates: bool,
    /// Before this instant the node refuses votes and pre-votes (it
    /// restarted and keeps the leader lease it may have promised).
    votes_from: Option<tokio::time::Instant>,
    /// Turns true when the node stops: open `StreamAppend` calls end then,
    /// so the server's graceful shutdown does not wait for the leader to
    /// close them.
    stopping: Option<tokio::sync::watch::Receiver<bool>>,
    /// Noted on every append or snapshot from the leader this node follows.
    contact: LeaderContact,
    /// The greatest log id the appends admitted so far, on any call,
    /// commit ([`peer_checks::committed_by`]): appends are admitted before
    /// openraft takes them (the earlier ones of a stream, a concurrent
    /// call's), so the node's committed log id may not count them yet.
    admitted_commit: Arc<std::sync::Mutex<Option<LogIdOf<TypeConfig>>>>,
    /// Held by a unary append from its admission until openraft answered
    /// it: one at a time, so none is admitted before an earlier one that
    /// openraft takes after it.
    unary_appends: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for PeerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerService")
            .field("spool", &self.spool)
            .field("peer_certificates", &self.peer_certificates)
            .finish_non_exhaustive()
    }
}

impl PeerService {
    /// A service over this node's Raft. It refuses snapshots until it is
    /// given a spool ([`PeerService::with_snapshot_spool`]).
    pub fn new(raft: Raft) -> PeerService {
        PeerService {
            raft,
            spool: None,
            peer_certificates: false,
            votes_from: None,
            stopping: None,
            contact: LeaderContact::default(),
            admitted_commit: Arc::default(),
            unary_appends: Arc::default(),
        }
    }

    /// Notes messages from the leader this node follows in `contact`.
    pub fn with_leader_contact(mut self, contact: LeaderContact) -> PeerService {
        self.contact = contact;
        self
    }

    /// Ends every open `StreamAppend` call once `stopping` turns true.
    pub fn with_stop_signal(mut self, stopping: tokio::sync::watch::Receiver<bool>) -> PeerService {
        self.stopping = Some(stopping);
        self
    }

    /// Refuses votes and pre-votes before `instant`.
    pub fn with_votes_from(mut self, instant: tokio::time::Instant) -> PeerService {
        self.votes_from = Some(instant);
        self
    }

    /// With `required` (peer TLS on), serves a message only if the
    /// caller's verified certificate is valid for `node-<sender>`.
    pub fn with_peer_certificates(mut self, required: bool) -> PeerService {
        self.peer_certificates = required;
        self
    }

    /// Receives snapshots through `spool`.
    pub fn with_snapshot_spool(mut self, spool: SnapshotSpool) -> PeerService {
        self.spool = Some(Arc::new(spool));
        self
    }
}

fn reply<T: Serialize>(result: &T) -> Result<Response<RaftPayload>, Status> {
    match encode(result) {
        Ok(data) => Ok(Response::new(RaftPayload { data })),
        Err(error) => {
            // Our failure, not the sender's: INTERNAL, with its cause.
            let mut status = Status::internal(format!("encoding reply: {error}"));
            status.set_source(Arc::new(error));
            Err(status)
        }
    }
}

fn bad_message(error: postcard::Error) -> Status {
    Status::invalid_argument(format!("undecodable raft message: {error}"))
}

/// A message refused before openraft sees it: logged, and INVALID_ARGUMENT
/// to the sender.
fn refused(refusal: PeerMessageRefused) -> Status {
    tracing::warn!(%refusal, "peer message refused");
    metrics::counter!("oncekv_peer_messages_refused_total").increment(1);
    Status::invalid_argument(format!("refused raft message: {refusal}"))
}

/// A sender refused before its message is read further: logged, and
/// PERMISSION_DENIED to the caller.
fn not_allowed(refusal: PeerNotAllowed) -> Status {
    tracing::warn!(%refusal, "peer message refused");
    metrics::counter!("oncekv_peer_messages_refused_total").increment(1);
    Status::permission_denied(format!("refused raft message: {refusal}"))
}

/// Who called, as TLS verified it: the DNS names of the caller's
/// certificate (`None`: no verified certificate).
struct Caller {
    names: Option<Vec<String>>,
}

impl Caller {
    fn of<T>(request: &Request<T>) -> Caller {
        Caller {
            names: crate::tls::verified_dns_names(request),
        }
    }
}

impl PeerService {
    fn metrics(&self) -> openraft::RaftMetrics<TypeConfig> {
        let metrics = self.raft.metrics();
        openraft::async_runtime::WatchReceiver::borrow_watched(&metrics).clone()
    }

    /// With peer TLS, the caller's certificate must be valid for
    /// `node-<sender>`.
    fn authenticate(&self, caller: &Caller, sender: NodeId) -> Result<(), Status> {
        if !self.peer_certificates {
            return Ok(());
        }
        let expected = crate::tls::node_name(sender);
        match &caller.names {
            None => Err(not_allowed(PeerNotAllowed::NoCertificate { sender })),
            Some(names)
                if names
                    .iter()
                    .any(|name| name.eq_ignore_ascii_case(&expected)) =>
            {
                Ok(())
            }
            Some(names) => Err(not_allowed(PeerNotAllowed::WrongCertificate {
                sender,
                expected,
                names: names.clone(),
            })),
        }
    }

    /// The sender must be a member of this node's cluster (or this node
    /// knows none yet).
    fn member(
        &self,
        sender: NodeId,
        metrics: &openraft::RaftMetrics<TypeConfig>,
    ) -> Result<(), Status> {
        peer_checks::check_member(sender, &metrics.membership_config).map_err(not_allowed)
    }

    /// Admits a snapshot sent under `vote` and described by `meta`: the
    /// caller speaks for the sender (peer TLS), the snapshot passes
    /// [`peer_checks::check_snapshot`], and the sender is a member or a
    /// leader of at least this node's vote ([`peer_checks::check_leader`]).
    /// Cheap: called on the stream's first message, before anything is
    /// spooled.
    fn admit_snapshot(
        &self,
        caller: &Caller,
        vote: &VoteOf<TypeConfig>,
        meta: &SnapshotMetaOf<TypeConfig>,
    ) -> Result<(), Status> {
        let sender = peer_checks::sender(vote);
        self.authenticate(caller, sender)?;
        let metrics = self.metrics();
        peer_checks::check_snapshot(vote, meta.last_log_id.as_ref(), metrics.id, &metrics)
            .map_err(refused)?;
        peer_checks::check_leader(sender, vote, &metrics).map_err(not_allowed)?;
        if *vote >= metrics.vote {
            self.contact.heard();
        }
        Ok(())
    }

    /// Decodes and admits one `AppendEntries`, unary or streamed; one
    /// under a vote at least this node's is noted as its leader's contact.
    ///
    /// It is checked against the greater of this node's committed log id
    /// and what the appends admitted before it commit, which openraft may
    /// not have taken yet (`admitted_commit`); checked and counted at once,
    /// so concurrent calls see each other's.
    fn admit_append(
        &self,
        caller: &Caller,
        data: &[u8],
    ) -> Result<AppendEntriesRequest<TypeConfig>, Status> {
        let request = self.authenticated_append(caller, data)?;
        self.admit_authenticated(request)
    }

    /// Decodes an `AppendEntries` whose caller speaks for its sender
    /// (peer TLS); the first half of [`admit_append`](Self::admit_append).
    fn authenticated_append(
        &self,
        caller: &Caller,
        data: &[u8],
    ) -> Result<AppendEntriesRequest<TypeConfig>, Status> {
        let request: AppendEntriesRequest<TypeConfig> = decode(data).map_err(bad_message)?;
        self.authenticate(caller, peer_checks::sender(&request.vote))?;
        Ok(request)
    }

    /// The second half of [`admit_append`](Self::admit_append): the
    /// checks against this node's state and what was admitted before.
    fn admit_authenticated(
        &self,
        request: AppendEntriesRequest<TypeConfig>,
    ) -> Result<AppendEntriesRequest<TypeConfig>, Status> {
        let sender = peer_checks::sender(&request.vote);
        let metrics = self.metrics();
        let mut admitted_commit = self
            .admitted_commit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let committed = metrics.local_committed.max(*admitted_commit);
        peer_checks::check_append(
            &request,
            metrics.id,
            peer_checks::known_term(&metrics),
            committed.as_ref(),
        )
        .map_err(refused)?;
        peer_checks::check_leader(sender, &request.vote, &metrics).map_err(not_allowed)?;
        *admitted_commit = (*admitted_commit).max(peer_checks::committed_by(&request));
        drop(admitted_commit);
        if request.vote >= metrics.vote {
            self.contact.heard();
        }
        Ok(request)
    }
}

/// The replies of a `StreamAppend` call.
type AppendReplyStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<RaftPayload, Status>> + Send>>;

/// The first refusal of a `StreamAppend` call, answered after the replies
/// to the requests admitted before it.
type Refusal = Arc<std::sync::Mutex<Option<Status>>>;

fn refuse_later(refusal: &Refusal, status: Status) {
    *refusal
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(status);
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let caller = Caller::of(&request);
        // Only a caller that speaks for its sender waits for its turn.
        let request = self.authenticated_append(&caller, &request.into_inner().data)?;
        let _one_at_a_time = self.unary_appends.lock().await;
        let request = self.admit_authenticated(request)?;
        metrics::counter!("oncekv_peer_appends_received_total", "call" => "unary").increment(1);
        reply(&self.raft.append_entries(request).await)
    }

    type StreamAppendStream = AppendReplyStream;

    async fn stream_append(
        &self,
        request: Request<Streaming<RaftPayload>>,
    ) -> Result<Response<AppendReplyStream>, Status> {
        let caller = Caller::of(&request);
        let incoming = request.into_inner();
        let refusal: Refusal = Arc::default();
        // Each request is admitted as it is read; the first one refused
        // ends the requests openraft sees.
        let admitted = futures_util::stream::unfold(
            (incoming, self.clone(), caller, Arc::clone(&refusal)),
            |(mut incoming, service, caller, refusal)| async move {
                let status = match incoming.message().await {
                    Ok(Some(payload)) => match service.admit_append(&caller, &payload.data) {
                        Ok(request) => {
                            metrics::counter!(
                                "oncekv_peer_appends_received_total",
                                "call" => "stream"
                            )
                            .increment(1);
                            return Some((request, (incoming, service, caller, refusal)));
                        }
                        Err(status) => status,
                    },
                    Ok(None) => return None,
                    Err(status) if is_malformed_message(&status) => Status::invalid_argument(
                        format!("malformed raft message: {}", status.message()),
                    ),
                    Err(status) => status,
                };
                refuse_later(&refusal, status);
                None
            },
        );
        let stopping = self.stopping.clone();
        let stopped = async move {
            match stopping {
                Some(mut stopping) => {
                    // An error means the sender is gone: stopped too.
                    let _ = stopping.wait_for(|stop| *stop).await;
                }
                None => std::future::pending().await,
            }
        };
        let replies = self
            .raft
            .stream_append(admitted)
            .map(|result| reply(&result).map(Response::into_inner))
            .take_until(stopped);
        let refused = futures_util::stream::once(async move {
            refusal
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
        })
        .filter_map(|status| std::future::ready(status.map(Err)));
        Ok(Response::new(Box::pin(replies.chain(refused))))
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let caller = Caller::of(&request);
        let kind: VoteKind = decode(&request.into_inner().data).map_err(bad_message)?;
        let (VoteKind::Vote(vote) | VoteKind::PreVote(vote)) = &kind;
        let sender = peer_checks::sender(&vote.vote);
        self.authenticate(&caller, sender)?;
        let metrics = self.metrics();
        peer_checks::check_term(&vote.vote, peer_checks::known_term(&metrics)).map_err(refused)?;
        self.member(sender, &metrics)?;
        if self
            .votes_from
            .is_some_and(|from| tokio::time::Instant::now() < from)
        {
            return Err(Status::unavailable(
                "restarted less than an election timeout ago: votes nobody yet",
            ));
        }
        let result = match kind {
            VoteKind::Vote(vote) => self.raft.vote(vote).await,
            VoteKind::PreVote(vote) => self.raft.pre_vote(vote).await,
        };
        reply(&result)
    }

    async fn transfer_leader(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let caller = Caller::of(&request);
        let request: openraft::raft::TransferLeaderRequest<TypeConfig> =
            decode(&request.into_inner().data).map_err(bad_message)?;
        let sender = peer_checks::sender(request.from_leader());
        self.authenticate(&caller, sender)?;
        let metrics = self.metrics();
        peer_checks::check_term(request.from_leader(), peer_checks::known_term(&metrics))
            .map_err(refused)?;
        self.member(sender, &metrics)?;
        reply(&self.raft.handle_transfer_leader(request).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftPayload>, Status> {
        let spool = self.spool.as_ref().ok_or(SnapshotRefused::NoSpool)?;
        let caller = Caller::of(&request);
        let mut chunks = request.into_inner();
        // Nothing is spooled unless the first message passes every check
        // it can: the caller's certificate speaks for the sender, the
        // sender is a member (or a leader of at least this node's vote),
        // and its vote and the snapshot's last log id pass the message
        // checks (a plausible term, a committed vote of another node,
        // nothing beyond the vote or contradicting the committed log). The
        // bytes are judged once they are all there.
        let admit = |vote: &VoteOf<TypeConfig>, meta: &SnapshotMetaOf<TypeConfig>| {
            self.admit_snapshot(&caller, vote, meta)
        };
        let mut received = receive(spool, &mut chunks, admit).await?;
        // Judged again: the membership or the committed log may have
        // changed while the bytes came.
        self.admit_snapshot(&caller, &received.vote, &received.meta)?;
        let data = received.file.snapshot().map_err(SnapshotRefused::Spool)?;
        let data = spool.check(&received.meta, data).await?;
        let snapshot = SnapshotOf::<TypeConfig, SnapshotFile> {
            meta: received.meta,
            snapshot: data,
        };
        let result = self
            .raft
            .install_full_snapshot(received.vote, snapshot)
            .await;
        drop(received.file);
        drop(received.slot);
        reply(&result)
    }
}

#[cfg(test)]
mod tests {
    use super::LeaderContact;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_leader_counts_as_heard_for_the_window_after_its_last_message() {
        let contact = LeaderContact::default();
        let window = Duration::from_millis(400);
        assert!(!contact.heard_within(window), "nothing heard yet");
        tokio::time::advance(Duration::from_millis(1_000)).await;
        contact.heard();
        assert!(contact.heard_within(window));
        tokio::time::advance(Duration::from_millis(400)).await;
        assert!(contact.heard_within(window), "at the window's end");
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(!contact.heard_within(window), "past it");
        contact.clone().heard();
        assert!(contact.heard_within(window), "a clone notes for all");
    }
}
