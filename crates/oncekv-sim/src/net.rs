//! The simulated network as the node and the clients see it: turmoil TCP
//! streams as gRPC server connections ([`incoming`]) and as the transport
//! of gRPC channels ([`SimConnector`], for clients and for peers), and the
//! connection losses a run injects ([`LinkLoss`]).
//!
//! Lost messages are modelled as real TCP shows them: a connection either
//! delivers every byte in order or breaks. turmoil's own message loss
//! drops a segment from the middle of a stream and stalls that direction
//! for good while the other goes on (it has no acknowledgements), so a
//! connection kept busy by the far side (a watch) never looks dead to
//! HTTP/2 keep-alives; real TCP stalls both directions and is noticed in
//! seconds. [`LinkLoss`] instead breaks a connection between two hosts on
//! a seeded share of its writes: the write is lost, both ends see the
//! connection end, and the channels dial again.

use futures_util::Stream;
use hyper_util::rt::TokioIo;
use oncekv_server::raft::network::PeerConnector;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};
use turmoil::net::{TcpListener, TcpStream};

/// Which connections between hosts break, and when: while a rate is set,
/// each write on such a connection breaks it with that probability, drawn
/// from a seeded generator (the simulation polls in a fixed order, so the
/// same writes break in every run of a seed). Connections within one host
/// never break.
#[derive(Debug)]
pub struct LinkLoss {
    /// The probability, as `f64` bits (0: no loss).
    rate: AtomicU64,
    rng: Mutex<StdRng>,
    broken: AtomicU64,
}

impl LinkLoss {
    /// No loss until [`LinkLoss::set_rate`]; draws from `seed`.
    pub fn new(seed: u64) -> Arc<LinkLoss> {
        Arc::new(LinkLoss {
            rate: AtomicU64::new(0f64.to_bits()),
            rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0x10_55e5_0000_0003)),
            broken: AtomicU64::new(0),
        })
    }

    /// Breaks each write between hosts with probability `rate` (0 ends
    /// the loss).
    pub fn set_rate(&self, rate: f64) {
        self.rate
            .store(rate.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    /// Connections broken so far.
    pub fn broken(&self) -> u64 {
        self.broken.load(Ordering::Relaxed)
    }

    /// Whether this write breaks its connection.
    fn breaks_now(&self) -> bool {
        let rate = f64::from_bits(self.rate.load(Ordering::Relaxed));
        if rate <= 0.0 {
            return false;
        }
        let breaks = oncekv_server::sync::lock(&self.rng).random_bool(rate);
        if breaks {
            self.broken.fetch_add(1, Ordering::Relaxed);
        }
        breaks
    }
}

/// A simulated connection as the gRPC layers see it: a turmoil stream
/// that [`LinkLoss`] may break. Once broken, the stream is dropped (the
/// far end sees it end) and every read or write here fails.
#[derive(Debug)]
pub struct SimStream {
    stream: Option<TcpStream>,
    /// Set for a connection between two hosts.
    loss: Option<Arc<LinkLoss>>,
}

impl SimStream {
    /// `stream`, on the host whose address is `own`.
    fn new(stream: TcpStream, own: IpAddr, loss: &Arc<LinkLoss>) -> SimStream {
        let between_hosts = stream.peer_addr().is_ok_and(|peer| peer.ip() != own);
        SimStream {
            stream: Some(stream),
            loss: between_hosts.then(|| Arc::clone(loss)),
        }
    }

    fn live(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.stream.as_mut().map(Pin::new).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the connection broke (simulated message loss)",
            )
        })
    }
}

impl Connected for SimStream {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.live() {
            Ok(stream) => stream.poll_read(cx, buf),
            Err(error) => Poll::Ready(Err(error)),
        }
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if !buf.is_empty() && self.loss.as_ref().is_some_and(|loss| loss.breaks_now()) {
            // The write is lost and the connection with it.
            self.stream = None;
        }
        match self.live() {
            Ok(stream) => stream.poll_write(cx, buf),
            Err(error) => Poll::Ready(Err(error)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.live() {
            Ok(stream) => stream.poll_flush(cx),
            Err(error) => Poll::Ready(Err(error)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.live() {
            Ok(stream) => stream.poll_shutdown(cx),
            Err(error) => Poll::Ready(Err(error)),
        }
    }
}

/// The connections accepted on `listener` of the host whose address is
/// `own`, as a server's incoming stream; `loss` may break them.
pub fn incoming(
    listener: TcpListener,
    own: IpAddr,
    loss: Arc<LinkLoss>,
) -> impl Stream<Item = io::Result<SimStream>> + Send {
    futures_util::stream::unfold(listener, move |listener| {
        let loss = Arc::clone(&loss);
        async move {
            let accepted = listener
                .accept()
                .await
                .map(|(stream, _)| SimStream::new(stream, own, &loss));
            Some((accepted, listener))
        }
    })
}

/// Opens gRPC channels over the simulated network, whose connections
/// `loss` may break.
#[derive(Clone, Debug)]
pub struct SimConnector {
    loss: Arc<LinkLoss>,
}

impl SimConnector {
    /// Dials through turmoil, under `loss`.
    pub fn new(loss: Arc<LinkLoss>) -> SimConnector {
        SimConnector { loss }
    }

    /// A channel to `endpoint`, dialled through turmoil when first used.
    pub fn dial(&self, endpoint: Endpoint) -> Channel {
        let loss = Arc::clone(&self.loss);
        endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
            let loss = Arc::clone(&loss);
            async move {
                let host = uri.host().unwrap_or_default().to_string();
                let port = uri.port_u16().unwrap_or(80);
                let stream = TcpStream::connect((host.as_str(), port)).await?;
                let own = stream.local_addr()?.ip();
                Ok::<_, io::Error>(TokioIo::new(SimStream::new(stream, own, &loss)))
            }
        }))
    }

    /// A channel to `address` (`host:port`), with the keep-alives of a
    /// client that wants a dead connection noticed within seconds.
    pub fn channel_to(&self, address: &str) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("bad address {address:?}: {e}"))?
            .connect_timeout(Duration::from_millis(1000))
            .http2_keep_alive_interval(Duration::from_millis(500))
            .keep_alive_timeout(Duration::from_millis(1000))
            .keep_alive_while_idle(true);
        Ok(self.dial(endpoint))
    }
}

impl oncekv_client::Connector for SimConnector {
    fn channel(&self, address: &str) -> Result<Channel, String> {
        self.channel_to(address)
    }
}

impl PeerConnector for SimConnector {
    fn connect_lazy(&self, endpoint: Endpoint) -> Channel {
        self.dial(endpoint)
    }
}
