//! [`ClientProxy`]: a fault-injecting gRPC proxy in front of one node's
//! client port, for oncekv's API and etcd's KV service (`etcd`, which
//! also fronts a real etcd). Clients talk to the proxy; it forwards every
//! call to the node and, while a [`ReplyFault`] is set, **drops the reply after the
//! node answered** (the server committed, the client never hears: it times
//! out and retries), **loses the connection instead of the reply** (the
//! server committed, then the client's connection breaks as when a node
//! dies: its attempt ends at once with a transport error), or delays it.
//! [`ClientProxy::reset_connections`] resets every open client connection.
//!
//! Every client connection is served through a `Breakable` stream: once
//! broken, the gRPC server's reads and writes on it fail, so nothing more
//! reaches the client and the server drops the connection; over loopback
//! TCP ([`ClientProxy::start`]) the client's socket is also closed with
//! linger 0, which sends RST. A connection served from another transport
//! ([`ClientProxy::serve`], such as a simulated network) is closed by
//! dropping it. Either way the client sees the connection fail in the
//! middle of its call, never a refused connect.
//!
//! The proxy sees every attempt of every request, so it records each
//! answer ([`Recorder::response`]), marking those it dropped after commit
//! (a reply not forwarded, or one whose connection broke before it could
//! be). Leader hints name the nodes' real client addresses; the proxy
//! rewrites them to the matching proxies, so clients never go around the
//! faults. A write the proxy could not deliver because its node refused
//! the connection is answered as the node answers when it knows no
//! leader (typed "nothing proposed"), so a client can still tell it from
//! a request that may have been delivered.

mod etcd;

use crate::convert;
use crate::recorder::Recorder;
use oncekv_check::record::{Answer, NodeId, RequestIdentity};
use oncekv_proto::convert::CallFailure;
use oncekv_proto::etcd::etcdserverpb::kv_client::KvClient as EtcdKvClient;
use oncekv_proto::etcd::etcdserverpb::kv_server::KvServer as EtcdKvServer;
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::kv_server::{Kv, KvServer};
use oncekv_proto::v1::{
    self, AddMemberRequest, AuthenticateRequest, AuthenticateResponse, ExecuteBatchRequest,
    ExecuteBatchResponse, ExecuteRequest, ExecuteResponse, MembershipResponse, ReadRequest,
    ReadResponse, RemoveMemberRequest, SaveSnapshotChunk, SaveSnapshotRequest, StateDigestRequest,
    StateDigestResponse, StatusRequest, StatusResponse, WatchRequest, WatchResponse,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// What the proxy does to replies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReplyFault {
    /// Pass them through.
    None,
    /// Drop each committed reply with this probability: the client gets
    /// nothing until its attempt times out.
    Drop {
        /// Between 0 and 1.
        probability: f64,
    },
    /// With this probability, do not forward a committed reply but break
    /// the client connection it was to go back on: the node applied the
    /// request, and the client's attempt (and every other call on that
    /// connection) ends at once with a transport error, as when a node
    /// dies after answering. The client dials again for its next attempt.
    LoseConnection {
        /// Between 0 and 1.
        probability: f64,
    },
    /// Hold each reply for a random time in this range.
    Delay {
        /// Shortest delay.
        min: Duration,
        /// Longest delay.
        max: Duration,
    },
}

/// How long a dropped reply is held: longer than any client attempt
/// timeout, so the client gives up on the attempt first.
const DROPPED_REPLY_HOLD: Duration = Duration::from_secs(30);

/// How long the proxy waits for the node.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);

struct Shared {
    /// The node behind the proxy now (0: none known); membership changes
    /// put one node after another at the same address.
    node: AtomicU64,
    upstream: KvClient<Channel>,
    /// The same node's etcd API.
    etcd_upstream: EtcdKvClient<Channel>,
    fault: Mutex<ReplyFault>,
    rng: Mutex<StdRng>,
    recorder: Arc<Recorder>,
    /// Node client address → proxy address.
    hints: Arc<HashMap<String, String>>,
    /// Attempts per idempotency key (session requests carry their own).
    key_attempts: Mutex<HashMap<Vec<u8>, u32>>,
    /// Connections broken by [`ReplyFault::LoseConnection`].
    connections_lost: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running proxy.
#[derive(Clone)]
pub struct ClientProxy {
    address: SocketAddr,
    /// The node address it forwards to (empty when given a channel).
    upstream: String,
    shared: Arc<Shared>,
    cut: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for ClientProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientProxy")
            .field("address", &self.address)
            .field("node", &self.shared.node())
            .finish_non_exhaustive()
    }
}

/// A listener bound for a proxy whose upstream is not known yet.
#[derive(Debug)]
pub struct ProxyListener {
    listener: TcpListener,
    address: SocketAddr,
}

impl ProxyListener {
    /// Binds a free loopback port.
    pub async fn bind() -> std::io::Result<ProxyListener> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        Ok(ProxyListener { listener, address })
    }

    /// Its address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl ClientProxy {
    /// Starts proxying `listener` to the node `node` at `upstream`.
    /// `hints` maps nodes' client addresses to their proxies.
    pub fn start(
        listener: ProxyListener,
        node: Option<NodeId>,
        upstream: &str,
        hints: Arc<HashMap<String, String>>,
        recorder: Arc<Recorder>,
        seed: u64,
    ) -> Result<ClientProxy, String> {
        let channel = Endpoint::from_shared(format!("http://{upstream}"))
            .map_err(|e| format!("bad upstream {upstream}: {e}"))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .connect_lazy();
        let mut proxy = ClientProxy::new(listener.address, node, channel, hints, recorder, seed);
        proxy.upstream = upstream.to_string();
        let (accepted, incoming) = mpsc::channel::<std::io::Result<Breakable<DuplexStream>>>(64);
        proxy.spawn_server(tokio_stream::wrappers::ReceiverStream::new(incoming));
        tokio::spawn(accept_loop(listener.listener, accepted, proxy.cut.clone()));
        Ok(proxy)
    }

    /// Proxies the connections of `incoming` (a transport other than
    /// loopback TCP, such as a simulated network) to the node `node`
    /// behind `upstream`; clients reach it at `address`. A broken
    /// connection ([`ReplyFault::LoseConnection`],
    /// [`ClientProxy::reset_connections`]) is dropped by the proxy's
    /// server, which closes it the way that transport closes a dropped
    /// stream.
    pub fn serve<S, IO, E>(
        address: SocketAddr,
        incoming: S,
        node: Option<NodeId>,
        upstream: Channel,
        hints: Arc<HashMap<String, String>>,
        recorder: Arc<Recorder>,
        seed: u64,
    ) -> ClientProxy
    where
        S: tokio_stream::Stream<Item = Result<IO, E>> + Send + 'static,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        use tokio_stream::StreamExt;
        let proxy = ClientProxy::new(address, node, upstream, hints, recorder, seed);
        let resets = proxy.cut.clone();
        proxy.spawn_server(
            incoming
                .map(move |accepted| accepted.map(|io| Breakable::new(io, Breaker::new(&resets)))),
        );
        proxy
    }

    fn new(
        address: SocketAddr,
        node: Option<NodeId>,
        upstream: Channel,
        hints: Arc<HashMap<String, String>>,
        recorder: Arc<Recorder>,
        seed: u64,
    ) -> ClientProxy {
        let shared = Arc::new(Shared {
            node: AtomicU64::new(node.unwrap_or(0)),
            etcd_upstream: EtcdKvClient::new(upstream.clone()),
            upstream: KvClient::new(upstream),
            fault: Mutex::new(ReplyFault::None),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            recorder,
            hints,
            key_attempts: Mutex::new(HashMap::new()),
            connections_lost: AtomicU64::new(0),
        });
        let (cut, _) = watch::channel(0u64);
        ClientProxy {
            address,
            upstream: String::new(),
            shared,
            cut: Arc::new(cut),
        }
    }

    /// Serves the proxy's gRPC service on the connections of `incoming`.
    fn spawn_server<S, IO, E>(&self, incoming: S)
    where
        S: tokio_stream::Stream<Item = Result<Breakable<IO>, E>> + Send + 'static,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let service = KvServer::new(Forwarder(self.shared.clone()));
        let etcd_service = EtcdKvServer::new(etcd::EtcdForwarder(self.shared.clone()));
        tokio::spawn(async move {
            if let Err(error) = tonic::transport::Server::builder()
                .add_service(service)
                .add_service(etcd_service)
                .serve_with_incoming(incoming)
                .await
            {
                eprintln!("client proxy stopped: {error}");
            }
        });
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Sets what happens to replies from now on.
    pub fn set_fault(&self, fault: ReplyFault) {
        *lock(&self.shared.fault) = fault;
    }

    /// The node address it forwards to (empty for a proxy given a
    /// channel, [`ClientProxy::serve`]).
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Names the node now behind the proxy (`None`: none), as membership
    /// changes put another node at its address.
    pub fn set_node(&self, node: Option<NodeId>) {
        self.shared.node.store(node.unwrap_or(0), Ordering::Relaxed);
    }

    /// Resets every open client connection.
    pub fn reset_connections(&self) {
        self.cut.send_modify(|epoch| *epoch += 1);
    }

    /// How many client connections [`ReplyFault::LoseConnection`] has
    /// broken so far (each once, however many of its calls' replies were
    /// lost with it).
    pub fn connections_lost(&self) -> u64 {
        self.shared.connections_lost.load(Ordering::Relaxed)
    }
}

/// Accepts client connections and splices each to an in-memory stream
/// that the gRPC server reads; when the connection is broken (alone, or
/// all of them by a reset) the client's socket is dropped with linger 0,
/// which sends RST.
async fn accept_loop(
    listener: TcpListener,
    accepted: mpsc::Sender<std::io::Result<Breakable<DuplexStream>>>,
    resets: Arc<watch::Sender<u64>>,
) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let _ = socket.set_nodelay(true);
        let (mut outer, inner) = tokio::io::duplex(256 * 1024);
        let breaker = Breaker::new(&resets);
        if accepted
            .send(Ok(Breakable::new(inner, breaker.clone())))
            .await
            .is_err()
        {
            return;
        }
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut socket, &mut outer) => {}
                () = breaker.broken() => {
                    let _ = socket.set_zero_linger();
                }
            }
        });
    }
}

/// The switch of one client connection, which the gRPC server hands to
/// every call on it (its connect info, in the request's extensions): a
/// call can break the connection it came in on. A reset of the whole
/// proxy breaks every connection open at the time.
#[derive(Clone, Debug)]
struct Breaker {
    /// Set once, when this connection is broken.
    broken: Arc<watch::Sender<bool>>,
    /// The proxy's reset epoch, as of the connection's start.
    resets: watch::Receiver<u64>,
}

impl Breaker {
    fn new(resets: &watch::Sender<u64>) -> Breaker {
        Breaker {
            broken: Arc::new(watch::channel(false).0),
            resets: resets.subscribe(),
        }
    }

    /// Breaks the connection; whether it was whole until now.
    fn break_now(&self) -> bool {
        !self.broken.send_replace(true)
    }

    /// Whether the connection is broken.
    fn is_broken(&self) -> bool {
        *self.broken.borrow() || self.resets.has_changed().unwrap_or(false)
    }

    /// Completes when the connection is broken.
    async fn broken(self) {
        let mut broken = self.broken.subscribe();
        let mut resets = self.resets;
        tokio::select! {
            _ = broken.wait_for(|broken| *broken) => {}
            Ok(()) = resets.changed() => {}
        }
    }
}

/// A client connection as the gRPC server sees it: the transport's stream
/// until its [`Breaker`] breaks it, then an error on every read and write
/// (the server gives the connection up, and nothing more is sent on it).
struct Breakable<IO> {
    io: IO,
    breaker: Breaker,
    broken: Pin<Box<dyn Future<Output = ()> + Send>>,
    is_broken: bool,
}

impl<IO> Breakable<IO> {
    fn new(io: IO, breaker: Breaker) -> Breakable<IO> {
        Breakable {
            io,
            broken: Box::pin(breaker.clone().broken()),
            breaker,
            is_broken: false,
        }
    }

    /// An error once the connection is broken; else registers for the
    /// wake-up when it is.
    fn check(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        if !self.is_broken && self.broken.as_mut().poll(cx).is_ready() {
            self.is_broken = true;
        }
        if self.is_broken {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "connection broken by the proxy",
            ));
        }
        Ok(())
    }
}

impl<IO> Connected for Breakable<IO> {
    type ConnectInfo = Breaker;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.breaker.clone()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Breakable<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(error) = this.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Breakable<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if let Err(error) = this.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(error) = this.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(error) = this.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

struct Forwarder(Arc<Shared>);

/// The node's transport failure as the client should see it: a failed
/// connect stays "could not connect" (the request never reached the
/// node), in the same words on every transport (a simulated one names
/// neither the failed connect nor the refusal in its messages); anything
/// else keeps its code.
/// Whether the proxy's call to its node failed to connect (a
/// [`tonic::ConnectError`] in the chain): the request never left the proxy.
fn node_not_reached(status: &Status) -> bool {
    std::iter::successors(
        Some(status as &(dyn std::error::Error + 'static)),
        |error| error.source(),
    )
    .any(|error| error.is::<tonic::ConnectError>())
}

fn upstream_status(status: Status) -> Status {
    let (mut connect_failed, mut refused) = (false, false);
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&status);
    while let Some(error) = source {
        connect_failed |= error.is::<tonic::ConnectError>();
        refused |= error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        source = error.source();
    }
    let text = format!("{status:?}").to_lowercase();
    refused |= status.code() == tonic::Code::Unavailable && text.contains("connection refused");
    if refused {
        return Status::unavailable("node unreachable: tcp connect error: connection refused");
    }
    if connect_failed {
        return Status::unavailable(format!(
            "node unreachable: tcp connect error: {}",
            status.message()
        ));
    }
    Status::new(status.code(), format!("via proxy: {}", status.message()))
}

fn with_timeout<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(UPSTREAM_TIMEOUT);
    request
}

impl Shared {
    /// The node behind the proxy now, if known.
    fn node(&self) -> Option<NodeId> {
        Some(self.node.load(Ordering::Relaxed)).filter(|&id| id != 0)
    }

    fn rewrite(&self, address: &mut String) {
        if let Some(proxy) = self.hints.get(address.as_str()) {
            address.clone_from(proxy);
        }
    }

    /// Points a leader hint in a failure at the leader's proxy.
    fn rewrite_hint(&self, failure: &mut v1::Failure) {
        if let Some(v1::failure::Kind::NotLeader(hint)) = &mut failure.kind {
            self.rewrite(&mut hint.leader_client_address);
        }
    }

    fn identity(&self, request: &ExecuteRequest) -> (RequestIdentity, u32) {
        use v1::execute_request::Origin;
        match &request.origin {
            Some(Origin::Session(header)) => (
                RequestIdentity::session(header.session_id, header.seq),
                header.attempt.max(1),
            ),
            Some(Origin::IdempotencyKey(key)) => self.keyed(key.clone()),
            None => (RequestIdentity::plain(), 1),
        }
    }

    /// The identity of a request under the idempotency key `key`, and
    /// which attempt of it this is (counted here: nothing on the wire
    /// says).
    fn keyed(&self, key: Vec<u8>) -> (RequestIdentity, u32) {
        let mut attempts = lock(&self.key_attempts);
        let attempt = attempts.entry(key.clone()).or_insert(0);
        *attempt += 1;
        (RequestIdentity::idempotent(key), *attempt)
    }
}

impl Shared {
    /// The node's answers to forwarded requests, their leader hints
    /// pointed at the proxies; a transport failure is recorded for each.
    fn forwarded(
        &self,
        identities: &[(RequestIdentity, u32)],
        upstream: Result<Vec<ExecuteResponse>, Status>,
    ) -> Result<Vec<ExecuteResponse>, Status> {
        let mut responses = match upstream {
            Ok(responses) if responses.len() == identities.len() => responses,
            Ok(responses) => {
                let status = Status::internal(format!(
                    "{} answers to {} requests",
                    responses.len(),
                    identities.len()
                ));
                return Err(self.record_failure(identities, status));
            }
            Err(status) if node_not_reached(&status) => {
                // The node was never reached, so nothing was proposed:
                // the typed answer that says so, as the node itself gives
                // when it knows no leader (the client then moves on to
                // the next node).
                let reason = format!(
                    "via proxy: node unreachable, nothing sent: {}",
                    status.message()
                );
                let _ = self.record_failure(identities, status);
                let failure = oncekv_proto::convert::failure_to_wire(CallFailure::NoLeader(reason));
                return Ok(identities
                    .iter()
                    .map(|_| ExecuteResponse {
                        result: Some(v1::execute_response::Result::Failure(failure.clone())),
                        log_index: 0,
                    })
                    .collect());
            }
            Err(status) => return Err(self.record_failure(identities, status)),
        };
        for response in &mut responses {
            if let Some(v1::execute_response::Result::Failure(failure)) = &mut response.result {
                self.rewrite_hint(failure);
            }
        }
        Ok(responses)
    }

    fn record_failure(&self, identities: &[(RequestIdentity, u32)], status: Status) -> Status {
        let batch = u32::try_from(identities.len()).unwrap_or(u32::MAX);
        for (identity, attempt) in identities {
            let answer = Answer::Transient {
                detail: status.message().to_string(),
            };
            self.recorder.response(
                identity.clone(),
                *attempt,
                self.node(),
                answer,
                false,
                batch,
            );
        }
        upstream_status(status)
    }

    /// Applies the reply fault to one call's answers (a whole batch is
    /// dropped, lost with its connection or delayed as one) and records
    /// each answer. `connection` is the client connection the call came
    /// in on.
    async fn reply_fault(
        &self,
        identities: &[(RequestIdentity, u32)],
        responses: &mut [ExecuteResponse],
        connection: Option<&Breaker>,
    ) -> Result<(), Status> {
        let answers: Vec<_> = responses.iter().map(convert::answer).collect();
        self.answer_fault(identities, &answers, connection).await
    }

    /// Applies the reply fault to one call's answers, each with whether
    /// it shows the request committed, and records them.
    async fn answer_fault(
        &self,
        identities: &[(RequestIdentity, u32)],
        answers: &[(Answer, bool)],
        connection: Option<&Breaker>,
    ) -> Result<(), Status> {
        let committed = answers.iter().any(|(_, committed)| *committed);
        let fault = *lock(&self.fault);
        let batch = u32::try_from(identities.len()).unwrap_or(u32::MAX);
        let record = |dropped: bool| {
            for ((identity, attempt), (answer, _)) in identities.iter().zip(answers) {
                self.recorder.response(
                    identity.clone(),
                    *attempt,
                    self.node(),
                    answer.clone(),
                    dropped,
                    batch,
                );
            }
        };
        let draw = |probability: f64| lock(&self.rng).random_bool(probability.clamp(0.0, 1.0));
        match fault {
            ReplyFault::Drop { probability } if committed && draw(probability) => {
                record(true);
                tokio::time::sleep(DROPPED_REPLY_HOLD).await;
                return Err(Status::deadline_exceeded("reply dropped"));
            }
            ReplyFault::LoseConnection { probability }
                if committed && connection.is_some() && draw(probability) =>
            {
                record(true);
                if connection.is_some_and(Breaker::break_now) {
                    self.connections_lost.fetch_add(1, Ordering::Relaxed);
                }
                // Nothing can be sent on the broken connection; the server
                // drops this call with it.
                tokio::time::sleep(DROPPED_REPLY_HOLD).await;
                return Err(Status::unavailable("connection lost"));
            }
            ReplyFault::Delay { min, max } => {
                let delay = if max > min {
                    lock(&self.rng).random_range(min..max)
                } else {
                    min
                };
                tokio::time::sleep(delay).await;
            }
            _ => {}
        }
        // A reply whose connection broke meanwhile (another call lost it,
        // or a reset) cannot reach the client.
        if connection.is_some_and(Breaker::is_broken) {
            record(committed);
            return Err(Status::unavailable("connection lost"));
        }
        record(false);
        Ok(())
    }
}

#[tonic::async_trait]
impl Kv for Forwarder {
    async fn execute(
        &self,
        request: Request<ExecuteRequest>,
    ) -> Result<Response<ExecuteResponse>, Status> {
        let shared = &self.0;
        let connection = request.extensions().get::<Breaker>().cloned();
        let message = request.into_inner();
        let identities = [shared.identity(&message)];
        let mut upstream = shared.upstream.clone();
        let upstream = upstream.execute(with_timeout(message)).await;
        let mut responses =
            shared.forwarded(&identities, upstream.map(|r| vec![r.into_inner()]))?;
        shared
            .reply_fault(&identities, &mut responses, connection.as_ref())
            .await?;
        let response = responses
            .pop()
            .ok_or_else(|| Status::internal("no response"))?;
        Ok(Response::new(response))
    }

    async fn execute_batch(
        &self,
        request: Request<ExecuteBatchRequest>,
    ) -> Result<Response<ExecuteBatchResponse>, Status> {
        let shared = &self.0;
        let connection = request.extensions().get::<Breaker>().cloned();
        let message = request.into_inner();
        let identities: Vec<_> = message
            .requests
            .iter()
            .map(|r| shared.identity(r))
            .collect();
        let mut upstream = shared.upstream.clone();
        let upstream = upstream.execute_batch(with_timeout(message)).await;
        let mut responses =
            shared.forwarded(&identities, upstream.map(|r| r.into_inner().responses))?;
        shared
            .reply_fault(&identities, &mut responses, connection.as_ref())
            .await?;
        Ok(Response::new(ExecuteBatchResponse { responses }))
    }

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        let mut upstream = self.0.upstream.clone();
        let mut response = upstream
            .read(with_timeout(request.into_inner()))
            .await
            .map_err(upstream_status)?
            .into_inner();
        if let Some(v1::read_response::Result::Failure(failure)) = &mut response.result {
            self.0.rewrite_hint(failure);
        }
        Ok(Response::new(response))
    }

    async fn state_digest(
        &self,
        request: Request<StateDigestRequest>,
    ) -> Result<Response<StateDigestResponse>, Status> {
        let mut upstream = self.0.upstream.clone();
        let response = upstream
            .state_digest(with_timeout(request.into_inner()))
            .await
            .map_err(upstream_status)?;
        Ok(response)
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let mut upstream = self.0.upstream.clone();
        let mut response = upstream
            .status(with_timeout(request.into_inner()))
            .await
            .map_err(upstream_status)?
            .into_inner();
        self.0.rewrite(&mut response.leader_client_address);
        Ok(Response::new(response))
    }

    async fn add_member(
        &self,
        request: Request<AddMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let mut upstream = self.0.upstream.clone();
        upstream
            .add_member(with_timeout(request.into_inner()))
            .await
            .map_err(upstream_status)
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let mut upstream = self.0.upstream.clone();
        upstream
            .remove_member(with_timeout(request.into_inner()))
            .await
            .map_err(upstream_status)
    }

    type SaveSnapshotStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<SaveSnapshotChunk, Status>> + Send>,
    >;

    async fn save_snapshot(
        &self,
        request: Request<SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        let mut upstream = self.0.upstream.clone();
        let stream = upstream
            .save_snapshot(request.into_inner())
            .await
            .map_err(upstream_status)?
            .into_inner();
        Ok(Response::new(Box::pin(stream)))
    }

    type WatchStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<WatchResponse, Status>> + Send>>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let mut upstream = self.0.upstream.clone();
        let stream = upstream
            .watch(request.into_inner())
            .await
            .map_err(upstream_status)?
            .into_inner();
        Ok(Response::new(Box::pin(stream)))
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let mut upstream = self.0.upstream.clone();
        upstream
            .authenticate(with_timeout(request.into_inner()))
            .await
            .map_err(upstream_status)
    }
}
