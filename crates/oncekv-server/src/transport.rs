//! The connections and requests the gRPC servers of [`crate::server::serve`]
//! take in, and their bounds:
//!
//! - [`tcp_incoming`]: real TCP for the injected listeners, Nagle's
//!   algorithm off (Raft and client messages are small and latency-bound).
//! - [`limit_connections`]: at most so many open connections per listener,
//!   whatever the transport. An excess connection is refused (a log line,
//!   `oncekv_connections_refused_total{listener}`): [`answer_refused`]
//!   answers its requests with [`overloaded`]`(`[`CONNECTIONS`]`)` for a
//!   moment and closes it, at most [`REFUSALS_ANSWERED_MAX`] at once;
//!   beyond those it is closed at once, unanswered.
//! - [`limit_requests`]: the tower layers of one server: a cap on requests
//!   in flight over all its connections, an excess request shed at once
//!   with [`overloaded`] (never queued; `oncekv_requests_shed_total`),
//!   [`malformed_is_invalid_argument`] on every answer, and the call
//!   timeout ([`CallTimeout`]), which the calls that wait for a turn
//!   ([`UNTIMED_PATHS`]) do not have.
//!
//! - [`InFlightShare`]: a cap of their own for some services of a server,
//!   within its in-flight cap (the peer port's Raft messages, and the
//!   etcd calls followers forward to it).
//!
//! - [`sort_tls`]: on a TLS port, tells a TLS client (its first byte
//!   opens a handshake record) from a plaintext one; [`answer_plaintext`]
//!   answers the plaintext one's requests with [`TLS_REQUIRED`] instead
//!   of a failed handshake it could not read.
//!
//! A request refused as [`overloaded`] never reached a handler: the status
//! is RESOURCE_EXHAUSTED with the ASCII metadata entry
//! [`OVERLOADED_METADATA`]` = <what was full>`, which clients read as
//! "definitely not applied, retry later" without matching any text.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::metadata::MetadataValue;
use tonic::service::Routes;
use tonic::transport::server::Connected;
use tower::ServiceBuilder;
use tower::layer::Layer;
use tower::limit::GlobalConcurrencyLimitLayer;

/// The metadata key marking a request refused because the server was full
/// (the wire contract's): its value names what was full ([`IN_FLIGHT`],
/// [`CONNECTIONS`], or `snapshot` for a peer snapshot while another is
/// received). Such a request was not handled at all.
pub use oncekv_proto::OVERLOADED_METADATA;

/// What was full when a request is shed for the in-flight cap.
pub const IN_FLIGHT: &str = "in-flight";

/// What was full when a request comes on a connection refused for the
/// connection cap.
pub const CONNECTIONS: &str = "connections";

/// What a plaintext client of a TLS port is told, for every request
/// (INVALID_ARGUMENT: the request was not handled, and sending it again
/// the same way cannot help).
pub const TLS_REQUIRED: &str = "this port serves TLS only: connect with TLS (https:// and --cacert FILE, the CA of the nodes' certificates)";

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Plaintext connections to a TLS port answered at once, at most; more
/// are closed unanswered.
pub const PLAINTEXT_ANSWERED_MAX: usize = 16;

/// Refused connections answered at once, at most; more are closed
/// unanswered.
pub const REFUSALS_ANSWERED_MAX: usize = 16;

/// How long a refused connection is kept to answer its requests (then it
/// is closed, and after as long again, dropped).
const REFUSAL_ANSWERED_FOR: Duration = Duration::from_millis(500);

/// Refused connections are logged at most this often (a flood of them
/// would otherwise flood the log); the counter counts every one.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The connections accepted on `listener`.
pub fn tcp_incoming(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}

/// A connection holding a slot (of its listener's cap, or of the refused
/// connections being answered), given back when the server drops it.
#[derive(Debug)]
pub struct Counted<IO> {
    io: IO,
    /// The listener whose `oncekv_connections_open` counts this one, if
    /// it was admitted.
    open_on: Option<&'static str>,
    _slot: OwnedSemaphorePermit,
}

impl<IO> Drop for Counted<IO> {
    fn drop(&mut self) {
        if let Some(listener) = self.open_on {
            metrics::gauge!("oncekv_connections_open", "listener" => listener).decrement(1.0);
        }
    }
}

/// Writes and connection info of a wrapper (a struct with an `io` field)
/// go straight to the stream it wraps.
macro_rules! delegate_write_and_connect_info {
    ($wrapper:ident) => {
        impl<IO: AsyncWrite + Unpin> AsyncWrite for $wrapper<IO> {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                Pin::new(&mut self.io).poll_write(cx, buf)
            }

            fn poll_flush(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.io).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.io).poll_shutdown(cx)
            }

            fn poll_write_vectored(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> Poll<std::io::Result<usize>> {
                Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }
        }

        impl<IO: Connected> Connected for $wrapper<IO> {
            type ConnectInfo = IO::ConnectInfo;

            fn connect_info(&self) -> Self::ConnectInfo {
                self.io.connect_info()
            }
        }
    };
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

delegate_write_and_connect_info!(Counted);

/// Refusals of one listener, for the rate-limited log line.
struct Refusals {
    listener: &'static str,
    max: usize,
    count: AtomicU64,
    logged_at: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Refusals {
    fn refused(&self) {
        metrics::counter!("oncekv_connections_refused_total", "listener" => self.listener)
            .increment(1);
        let count = self.count.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let now = tokio::time::Instant::now();
        let mut logged_at = crate::sync::lock(&self.logged_at);
        if logged_at.is_none_or(|at| now.duration_since(at) >= REFUSAL_LOG_INTERVAL) {
            *logged_at = Some(now);
            tracing::warn!(
                listener = self.listener,
                limit = self.max,
                refused_so_far = count,
                "connection refused: the listener already has its maximum of open connections"
            );
        }
    }
}

/// At most `max` connections of `incoming` open at once. The first stream
/// is the connections admitted; a connection accepted beyond `max` is
/// logged, counted, and sent to the second stream (for [`answer_refused`])
/// if fewer than [`REFUSALS_ANSWERED_MAX`] are there, or else closed at
/// once (dropped before any byte is read). The listener keeps serving the
/// ones it has. `listener` names it in logs and metrics (`client`,
/// `peer`).
#[allow(clippy::type_complexity)]
pub fn limit_connections<IO, E>(
    incoming: impl Stream<Item = Result<IO, E>>,
    max: usize,
    listener: &'static str,
) -> (
    impl Stream<Item = Result<Counted<IO>, E>>,
    impl Stream<Item = Result<Counted<IO>, std::convert::Infallible>>,
) {
    let slots = Arc::new(Semaphore::new(max));
    let answering = Arc::new(Semaphore::new(REFUSALS_ANSWERED_MAX));
    let (refuse, refused) = tokio::sync::mpsc::channel(REFUSALS_ANSWERED_MAX);
    let refusals = Refusals {
        listener,
        max,
        count: AtomicU64::new(0),
        logged_at: std::sync::Mutex::new(None),
    };
    let admitted = incoming.filter_map(move |accepted| match accepted {
        Err(error) => Some(Err(error)),
        Ok(io) => match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => {
                metrics::gauge!("oncekv_connections_open", "listener" => listener).increment(1.0);
                Some(Ok(Counted {
                    io,
                    open_on: Some(listener),
                    _slot: slot,
                }))
            }
            Err(_) => {
                refusals.refused();
                if let Ok(slot) = Arc::clone(&answering).try_acquire_owned() {
                    // Room is reserved by the slot; a full channel only
                    // closes this one unanswered.
                    let _ = refuse.try_send(Ok(Counted {
                        io,
                        open_on: None,
                        _slot: slot,
                    }));
                }
                None
            }
        },
    });
    (
        admitted,
        tokio_stream::wrappers::ReceiverStream::new(refused),
    )
}

/// Serves the connections refused by [`limit_connections`] until
/// `shutdown` (over TLS if the listener has it, `tls`): every request on them is answered with
/// [`overloaded`]`(`[`CONNECTIONS`]`)` (not handled, retry later), and
/// each is closed after a moment, so a client learns that its request did
/// not apply instead of finding its connection cut.
pub async fn answer_refused<IO>(
    refused: impl Stream<Item = Result<Counted<IO>, std::convert::Infallible>>,
    max: usize,
    listener: &'static str,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    let refuse_all = tower::layer::layer_fn(move |_routes: Routes| {
        tower::service_fn(move |_request: http::Request<Body>| async move {
            metrics::counter!(
                "oncekv_requests_shed_total",
                "listener" => listener,
                "limit" => CONNECTIONS
            )
            .increment(1);
            let status = overloaded(
                CONNECTIONS,
                format!(
                    "server overloaded: {max} {listener} connections already open; not handled, retry later"
                ),
            );
            Ok::<_, std::convert::Infallible>(status.into_http::<Body>())
        })
    });
    let server = match tls {
        Some(tls) => tonic::transport::Server::builder().tls_config(tls)?,
        None => tonic::transport::Server::builder(),
    };
    server
        .max_concurrent_streams(8)
        .max_connection_age(REFUSAL_ANSWERED_FOR)
        .max_connection_age_grace(REFUSAL_ANSWERED_FOR)
        .layer(refuse_all)
        .add_routes(Routes::default())
        .serve_with_incoming_shutdown(refused, shutdown)
        .await
}

/// A connection whose first byte was read to tell TLS from plaintext: it
/// is read again first.
#[derive(Debug)]
pub struct Sniffed<IO> {
    first: Option<u8>,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Sniffed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if buf.remaining() > 0
            && let Some(first) = self.first.take()
        {
            buf.put_slice(&[first]);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

delegate_write_and_connect_info!(Sniffed);

/// Sorts the connections of a TLS port until `shutdown`: each one's first
/// byte is read (on a task of its own, within `wait`, so a silent client
/// holds up no other); a TLS handshake goes to the first stream, anything
/// else to the second (for [`answer_plaintext`], at most
/// [`PLAINTEXT_ANSWERED_MAX`] waiting; more, and connections silent for
/// `wait`, are closed). Accept errors go to the first stream.
#[allow(clippy::type_complexity)]
pub fn sort_tls<IO, E>(
    incoming: impl Stream<Item = Result<IO, E>> + Send + 'static,
    wait: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (
    impl Stream<Item = Result<Sniffed<IO>, E>>,
    impl Stream<Item = Result<Sniffed<IO>, std::convert::Infallible>>,
)
where
    IO: AsyncRead + Unpin + Send + 'static,
    E: Send + 'static,
{
    use tokio::io::AsyncReadExt;
    let (tls, tls_incoming) = tokio::sync::mpsc::channel(REFUSALS_ANSWERED_MAX);
    let (plain, plain_incoming) = tokio::sync::mpsc::channel(PLAINTEXT_ANSWERED_MAX);
    tokio::spawn(async move {
        tokio::pin!(incoming);
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => return,
                accepted = incoming.next() => accepted,
            };
            let Some(accepted) = accepted else { return };
            let mut io = match accepted {
                Ok(io) => io,
                Err(error) => {
                    if tls.send(Err(error)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let (tls, plain) = (tls.clone(), plain.clone());
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                let read = tokio::time::timeout(wait, io.read(&mut first)).await;
                let Ok(Ok(1)) = read else { return };
                let sniffed = Sniffed {
                    first: Some(first[0]),
                    io,
                };
                if first[0] == TLS_HANDSHAKE_RECORD {
                    let _ = tls.send(Ok(sniffed)).await;
                } else {
                    metrics::counter!("oncekv_plaintext_connections_refused_total").increment(1);
                    let _ = plain.try_send(Ok(sniffed));
                }
            });
        }
    });
    (
        tokio_stream::wrappers::ReceiverStream::new(tls_incoming),
        tokio_stream::wrappers::ReceiverStream::new(plain_incoming),
    )
}

/// A stream of connections, boxed.
pub type Incoming<T, E> = Pin<Box<dyn Stream<Item = Result<T, E>> + Send>>;

/// [`sort_tls`] if `tls`; else every connection goes to the first stream
/// as it is, and the second is empty.
#[allow(clippy::type_complexity)]
pub fn sort_if_tls<IO, E>(
    incoming: impl Stream<Item = Result<IO, E>> + Send + 'static,
    tls: bool,
    wait: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (
    Incoming<Sniffed<IO>, E>,
    Incoming<Sniffed<IO>, std::convert::Infallible>,
)
where
    IO: AsyncRead + Unpin + Send + 'static,
    E: Send + 'static,
{
    if tls {
        let (tls, plaintext) = sort_tls(incoming, wait, shutdown);
        (Box::pin(tls), Box::pin(plaintext))
    } else {
        let unread = incoming.map(|accepted| accepted.map(|io| Sniffed { first: None, io }));
        (Box::pin(unread), Box::pin(tokio_stream::empty()))
    }
}

/// Serves the plaintext connections [`sort_tls`] found on a TLS port until
/// `shutdown`: every request is answered INVALID_ARGUMENT with
/// [`TLS_REQUIRED`] (not handled), and each connection is closed after a
/// moment.
pub async fn answer_plaintext<IO>(
    plaintext: impl Stream<Item = Result<IO, std::convert::Infallible>>,
    listener: &'static str,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    let refuse_all = tower::layer::layer_fn(move |_routes: Routes| {
        tower::service_fn(move |_request: http::Request<Body>| async move {
            tracing::debug!(listener, "plaintext request on a TLS port refused");
            let status = Status::invalid_argument(TLS_REQUIRED);
            Ok::<_, std::convert::Infallible>(status.into_http::<Body>())
        })
    });
    tonic::transport::Server::builder()
        .max_concurrent_streams(8)
        .max_connection_age(REFUSAL_ANSWERED_FOR)
        .max_connection_age_grace(REFUSAL_ANSWERED_FOR)
        .layer(refuse_all)
        .add_routes(Routes::default())
        .serve_with_incoming_shutdown(plaintext, shutdown)
        .await
}

/// The answer to a request shed because `what` was full: RESOURCE_EXHAUSTED
/// with [`OVERLOADED_METADATA`]` = what`. The request was not handled.
pub fn overloaded(what: &'static str, message: impl Into<String>) -> Status {
    let mut status = Status::resource_exhausted(message);
    status
        .metadata_mut()
        .insert(OVERLOADED_METADATA, MetadataValue::from_static(what));
    status
}

/// Whether tonic refused a request message before any handler ran: a body
/// that does not decode as the method's protobuf message, a frame with a
/// bad compression flag, a frame cut short, or no message at all. tonic
/// answers all of these INTERNAL, with no source error attached, while a
/// broken connection's status carries its h2 or hyper error as the source
/// and our handlers attach the cause of any INTERNAL they answer.
pub fn is_malformed_message(status: &Status) -> bool {
    status.code() == tonic::Code::Internal && std::error::Error::source(status).is_none()
}

/// Answers a malformed request message (see [`is_malformed_message`]) with
/// INVALID_ARGUMENT and tonic's description, instead of INTERNAL: the
/// message was refused, the server did not fail. Any other answer passes
/// unchanged.
pub fn malformed_is_invalid_argument(response: http::Response<Body>) -> http::Response<Body> {
    match response.extensions().get::<Status>() {
        Some(status) if is_malformed_message(status) => {
            Status::invalid_argument(format!("malformed request message: {}", status.message()))
                .into_http()
        }
        _ => response,
    }
}

/// The calls that wait for their turn as long as their caller does (etcd's
/// Lock and an election's Campaign, as etcd serves them): the call timeout
/// does not cut them off; the caller's own deadline (`grpc-timeout`) and
/// the in-flight cap still bound them.
pub const UNTIMED_PATHS: &[&str] = &["/v3lockpb.Lock/Lock", "/v3electionpb.Election/Campaign"];

/// A call that has not answered within `timeout` is cancelled (CANCELLED,
/// "Timeout expired", as tonic's own server timeout answers), unless its
/// path is one of [`UNTIMED_PATHS`]. A streaming call is timed until its
/// response starts, not while it streams.
#[derive(Clone, Debug)]
pub struct CallTimeout<S> {
    inner: S,
    timeout: Duration,
}

impl<S> tower::Service<http::Request<Body>> for CallTimeout<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let untimed = UNTIMED_PATHS.contains(&request.uri().path());
        let answer = self.inner.call(request);
        let timeout = self.timeout;
        Box::pin(async move {
            if untimed {
                return answer.await;
            }
            match tokio::time::timeout(timeout, answer).await {
                Ok(answered) => answered,
                Err(_) => Ok(Status::cancelled("Timeout expired").into_http()),
            }
        })
    }
}

/// The tower layers of one gRPC server (`listener`: `client` or `peer`):
/// at most `in_flight_max` requests being handled at once over all its
/// connections; a request beyond that is refused at once with
/// [`overloaded`]`(`[`IN_FLIGHT`]`)`, never queued. Answers go through
/// [`malformed_is_invalid_argument`]. A call runs at most `call_timeout`
/// ([`CallTimeout`]).
pub fn limit_requests(
    in_flight_max: usize,
    call_timeout: Duration,
    listener: &'static str,
) -> impl Layer<
    Routes,
    Service = impl tower::Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = tower::BoxError,
        Future = impl Send + 'static,
    > + Clone
              + Send
              + 'static,
> + Clone {
    ServiceBuilder::new()
        .map_result(
            move |result: Result<http::Response<Body>, tower::BoxError>| match result {
                Err(error) if error.is::<tower::load_shed::error::Overloaded>() => {
                    metrics::counter!(
                        "oncekv_requests_shed_total",
                        "listener" => listener,
                        "limit" => IN_FLIGHT
                    )
                    .increment(1);
                    tracing::debug!(listener, limit = in_flight_max, "request shed");
                    Ok(overloaded(
                        IN_FLIGHT,
                        format!(
                            "server overloaded: {in_flight_max} requests already in flight; not handled, retry later"
                        ),
                    )
                    .into_http())
                }
                other => other,
            },
        )
        .load_shed()
        .layer(GlobalConcurrencyLimitLayer::new(in_flight_max))
        .map_response(malformed_is_invalid_argument)
        .layer_fn(move |inner| CallTimeout {
            inner,
            timeout: call_timeout,
        })
        .into_inner()
}

/// A service with an in-flight cap of its own, inside its server's
/// ([`limit_requests`]): at most so many of its requests are handled at
/// once (services made with one [`InFlightShare::cap`] share it); one more
/// is refused at once with [`overloaded`]`(`[`IN_FLIGHT`]`)`, never
/// queued. The peer port gives Raft's messages and the etcd calls
/// followers forward a cap each, so neither takes the other's slots.
#[derive(Clone, Debug)]
pub struct InFlightShare<S> {
    inner: S,
    permits: Arc<Semaphore>,
    max: usize,
    listener: &'static str,
}

/// The cap [`InFlightShare`]s share: `max` requests at once.
#[derive(Clone, Debug)]
pub struct InFlightCap {
    permits: Arc<Semaphore>,
    max: usize,
    listener: &'static str,
}

impl InFlightShare<()> {
    /// A cap of `max` requests at once for services of `listener`.
    pub fn cap(max: usize, listener: &'static str) -> InFlightCap {
        InFlightCap {
            permits: Arc::new(Semaphore::new(max)),
            max,
            listener,
        }
    }
}

impl InFlightCap {
    /// `service`, under this cap.
    pub fn limit<S>(&self, service: S) -> InFlightShare<S> {
        InFlightShare {
            inner: service,
            permits: Arc::clone(&self.permits),
            max: self.max,
            listener: self.listener,
        }
    }
}

impl<S, B> tower::Service<http::Request<Body>> for InFlightShare<S>
where
    S: tower::Service<
            http::Request<Body>,
            Response = http::Response<B>,
            Error = std::convert::Infallible,
        >,
    S::Future: Send + 'static,
    B: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            let (listener, max) = (self.listener, self.max);
            metrics::counter!(
                "oncekv_requests_shed_total",
                "listener" => listener,
                "limit" => IN_FLIGHT
            )
            .increment(1);
            tracing::debug!(listener, limit = max, "request shed");
            let refused = overloaded(
                IN_FLIGHT,
                format!(
                    "server overloaded: {max} {listener} requests already in flight; not handled, retry later"
                ),
            );
            return Box::pin(std::future::ready(Ok(refused.into_http())));
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answered = answer.await;
            drop(permit);
            answered.map(|response| response.map(Body::new))
        })
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for InFlightShare<S> {
    const NAME: &'static str = S::NAME;
}

/// Describes the metrics of this module to the exporter.
pub fn describe_metrics() {
    metrics::describe_gauge!(
        "oncekv_connections_open",
        "Open gRPC connections, by listener"
    );
    metrics::describe_counter!(
        "oncekv_connections_refused_total",
        "Connections closed at once because the listener had its maximum open, by listener"
    );
    metrics::describe_counter!(
        "oncekv_requests_shed_total",
        "Requests refused unhandled (RESOURCE_EXHAUSTED, oncekv-overloaded) because a limit was full, by listener and limit"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: Status) -> Status {
        let response = malformed_is_invalid_argument(status.into_http());
        Status::from_header_map(response.headers()).expect("a status in the headers")
    }

    #[test]
    fn a_message_tonic_could_not_read_is_invalid_argument() {
        let refused = answer(Status::internal("failed to decode Protobuf message"));
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(
            refused.message().contains("failed to decode"),
            "{refused:?}"
        );
        // An INTERNAL with its cause is a failure of ours, not the message.
        let mut ours = Status::internal("encoding reply");
        ours.set_source(Arc::new(std::io::Error::other("disk")));
        assert!(!is_malformed_message(&ours));
        assert_eq!(answer(ours).code(), tonic::Code::Internal);
        for other in [
            Status::invalid_argument("x"),
            Status::unavailable("x"),
            overloaded(IN_FLIGHT, "full"),
        ] {
            let code = other.code();
            assert_eq!(answer(other).code(), code);
        }
        // An answer without a status passes as it is.
        let ok = http::Response::new(Body::default());
        assert!(
            malformed_is_invalid_argument(ok)
                .extensions()
                .get::<Status>()
                .is_none()
        );
    }

    #[test]
    fn the_overloaded_refusal_names_what_was_full() {
        let status = overloaded(CONNECTIONS, "full");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        let value = status
            .metadata()
            .get(OVERLOADED_METADATA)
            .expect("metadata");
        assert_eq!(value.to_str().ok(), Some(CONNECTIONS));
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_refused_until_one_closes() {
        let (send, receive) = tokio::sync::mpsc::unbounded_channel();
        let incoming =
            tokio_stream::wrappers::UnboundedReceiverStream::new(receive).map(Ok::<_, String>);
        let (admitted, refused) = limit_connections(incoming, 2, "test");
        tokio::pin!(admitted);
        tokio::pin!(refused);
        let mut peers = Vec::new();
        let mut connect = || {
            let (ours, theirs) = tokio::io::duplex(64);
            peers.push(theirs);
            send.send(ours).expect("listener open");
        };
        connect();
        connect();
        let first = admitted.next().await.expect("admitted").expect("ok");
        let _second = admitted.next().await.expect("admitted").expect("ok");
        // The third is refused: it goes to be answered, not admitted.
        connect();
        connect();
        // One poll takes every connection waiting (the listener's queue is
        // ready) and admits none.
        let polled = std::future::poll_fn(|cx| Poll::Ready(admitted.as_mut().poll_next(cx))).await;
        assert!(
            polled.is_pending(),
            "a connection over the cap was admitted"
        );
        assert!(refused.next().await.is_some());
        assert!(refused.next().await.is_some());
        // Closing one makes room.
        drop(first);
        connect();
        assert!(admitted.next().await.is_some(), "room after a close");
    }
}
