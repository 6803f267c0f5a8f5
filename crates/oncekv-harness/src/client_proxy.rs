//! [`ClientProxy`]: a fault-injecting gRPC proxy in front of one node's
//! client port. Clients talk to the proxy; it forwards every call to the
//! node and, while a [`ReplyFault`] is set, **drops the reply after the
//! node answered** (the server committed, the client never hears: it times
//! out and retries), or delays it. [`ClientProxy::reset_connections`]
//! resets every open client connection (TCP RST).
//!
//! The proxy sees every attempt of every request, so it records each
//! answer ([`Recorder::response`]), marking those it dropped after commit.
//! Leader hints name the nodes' real client addresses; the proxy rewrites
//! them to the matching proxies, so clients never go around the faults.

use crate::convert;
use crate::recorder::Recorder;
use oncekv_check::record::{Answer, NodeId, RequestIdentity};
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
use std::net::SocketAddr;
use std::pin::Pin;
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
    node: Option<NodeId>,
    upstream: KvClient<Channel>,
    fault: Mutex<ReplyFault>,
    rng: Mutex<StdRng>,
    recorder: Arc<Recorder>,
    /// Node client address → proxy address.
    hints: Arc<HashMap<String, String>>,
    /// Attempts per idempotency key (session requests carry their own).
    key_attempts: Mutex<HashMap<Vec<u8>, u32>>,
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
    shared: Arc<Shared>,
    cut: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for ClientProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientProxy")
            .field("address", &self.address)
            .field("node", &self.shared.node)
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
        let (accepted, incoming) = mpsc::channel::<std::io::Result<Conn>>(64);
        let incoming = tokio_stream::wrappers::ReceiverStream::new(incoming);
        let proxy = ClientProxy::serve(
            listener.address,
            incoming,
            node,
            channel,
            hints,
            recorder,
            seed,
        );
        tokio::spawn(accept_loop(listener.listener, accepted, proxy.cut.clone()));
        Ok(proxy)
    }

    /// Proxies the connections of `incoming` (a transport other than
    /// loopback TCP, such as a simulated network) to the node `node`
    /// behind `upstream`; clients reach it at `address`.
    /// [`ClientProxy::reset_connections`] does nothing for these.
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
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let shared = Arc::new(Shared {
            node,
            upstream: KvClient::new(upstream),
            fault: Mutex::new(ReplyFault::None),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            recorder,
            hints,
            key_attempts: Mutex::new(HashMap::new()),
        });
        let (cut, _) = watch::channel(0u64);
        let proxy = ClientProxy {
            address,
            shared,
            cut: Arc::new(cut),
        };
        let service = KvServer::new(Forwarder(proxy.shared.clone()));
        tokio::spawn(async move {
            if let Err(error) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                eprintln!("client proxy stopped: {error}");
            }
        });
        proxy
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Sets what happens to replies from now on.
    pub fn set_fault(&self, fault: ReplyFault) {
        *lock(&self.shared.fault) = fault;
    }

    /// Resets every open client connection.
    pub fn reset_connections(&self) {
        self.cut.send_modify(|epoch| *epoch += 1);
    }
}

/// Accepts client connections and splices each to an in-memory stream
/// that the gRPC server reads; a reset drops the client's socket with
/// linger 0, which sends RST.
async fn accept_loop(
    listener: TcpListener,
    accepted: mpsc::Sender<std::io::Result<Conn>>,
    cut: Arc<watch::Sender<u64>>,
) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let _ = socket.set_nodelay(true);
        let (mut outer, inner) = tokio::io::duplex(256 * 1024);
        if accepted.send(Ok(Conn(inner))).await.is_err() {
            return;
        }
        let mut cut = cut.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut socket, &mut outer) => {}
                _ = cut.changed() => {
                    let _ = socket.set_zero_linger();
                }
            }
        });
    }
}

/// One spliced client connection, as the gRPC server sees it.
struct Conn(DuplexStream);

impl Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

struct Forwarder(Arc<Shared>);

/// The node's transport failure as the client should see it: a refused
/// connection stays "could not connect" (the request never reached the
/// node); anything else keeps its code.
fn upstream_status(status: Status) -> Status {
    let text = format!("{status:?}").to_lowercase();
    if status.code() == tonic::Code::Unavailable && text.contains("connection refused") {
        return Status::unavailable("node unreachable: tcp connect error: connection refused");
    }
    Status::new(status.code(), format!("via proxy: {}", status.message()))
}

fn with_timeout<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(UPSTREAM_TIMEOUT);
    request
}

impl Shared {
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
            Some(Origin::IdempotencyKey(key)) => {
                let mut attempts = lock(&self.key_attempts);
                let attempt = attempts.entry(key.clone()).or_insert(0);
                *attempt += 1;
                (RequestIdentity::idempotent(key.clone()), *attempt)
            }
            None => (RequestIdentity::plain(), 1),
        }
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
            self.recorder
                .response(identity.clone(), *attempt, self.node, answer, false, batch);
        }
        upstream_status(status)
    }

    /// Applies the reply fault to one call's answers (a whole batch is
    /// dropped or delayed as one) and records each answer.
    async fn reply_fault(
        &self,
        identities: &[(RequestIdentity, u32)],
        responses: &mut [ExecuteResponse],
    ) -> Result<(), Status> {
        let answers: Vec<_> = responses.iter().map(convert::answer).collect();
        let committed = answers.iter().any(|(_, committed)| *committed);
        let fault = *lock(&self.fault);
        let batch = u32::try_from(identities.len()).unwrap_or(u32::MAX);
        let record = |dropped: bool| {
            for ((identity, attempt), (answer, _)) in identities.iter().zip(&answers) {
                self.recorder.response(
                    identity.clone(),
                    *attempt,
                    self.node,
                    answer.clone(),
                    dropped,
                    batch,
                );
            }
        };
        match fault {
            ReplyFault::Drop { probability }
                if committed && lock(&self.rng).random_bool(probability.clamp(0.0, 1.0)) =>
            {
                record(true);
                tokio::time::sleep(DROPPED_REPLY_HOLD).await;
                return Err(Status::deadline_exceeded("reply dropped"));
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
        let message = request.into_inner();
        let identities = [shared.identity(&message)];
        let mut upstream = shared.upstream.clone();
        let upstream = upstream.execute(with_timeout(message)).await;
        let mut responses =
            shared.forwarded(&identities, upstream.map(|r| vec![r.into_inner()]))?;
        shared.reply_fault(&identities, &mut responses).await?;
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
        shared.reply_fault(&identities, &mut responses).await?;
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
