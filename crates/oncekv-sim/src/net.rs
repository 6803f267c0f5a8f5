//! The simulated network as the node and the clients see it: turmoil TCP
//! streams as gRPC server connections ([`incoming`]) and as the transport
//! of gRPC channels ([`SimConnector`], for clients and for peers).

use futures_util::Stream;
use hyper_util::rt::TokioIo;
use oncekv_server::raft::network::PeerConnector;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};
use turmoil::net::{TcpListener, TcpStream};

/// An accepted simulated connection, served by tonic.
#[derive(Debug)]
pub struct SimStream(TcpStream);

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
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The connections accepted on `listener`, as a server's incoming stream.
pub fn incoming(listener: TcpListener) -> impl Stream<Item = io::Result<SimStream>> + Send {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| SimStream(stream));
        Some((accepted, listener))
    })
}

/// Opens gRPC channels over the simulated network.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimConnector;

impl SimConnector {
    /// A channel to `endpoint`, dialled through turmoil when first used.
    pub fn dial(endpoint: Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(tower::service_fn(|uri: Uri| async move {
            let host = uri.host().unwrap_or_default().to_string();
            let port = uri.port_u16().unwrap_or(80);
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            Ok::<_, io::Error>(TokioIo::new(stream))
        }))
    }

    /// A channel to `address` (`host:port`). A simulated TCP stream that
    /// loses a segment stalls for good (there is no retransmission), so
    /// HTTP/2 keep-alives are frequent: a stalled connection is noticed
    /// within a second and a half and redialled.
    pub fn channel_to(address: &str) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("bad address {address:?}: {e}"))?
            .connect_timeout(Duration::from_millis(1000))
            .http2_keep_alive_interval(Duration::from_millis(500))
            .keep_alive_timeout(Duration::from_millis(1000))
            .keep_alive_while_idle(true);
        Ok(Self::dial(endpoint))
    }
}

impl oncekv_client::Connector for SimConnector {
    fn channel(&self, address: &str) -> Result<Channel, String> {
        Self::channel_to(address)
    }
}

impl PeerConnector for SimConnector {
    fn connect_lazy(&self, endpoint: Endpoint) -> Channel {
        Self::dial(endpoint)
    }
}
