//! [`Connector`]: how the client reaches a node. The default dials TCP;
//! simulations inject their own transport.

use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Opens gRPC channels to node addresses.
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// A channel to `address` (`host:port`), connected lazily.
    fn channel(&self, address: &str) -> Result<Channel, String>;
}

/// Plain TCP with HTTP/2 keep-alives (so a dead connection is noticed) and
/// a connect timeout.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    fn channel(&self, address: &str) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("bad address {address:?}: {e}"))?
            .connect_timeout(Duration::from_millis(1000))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(2))
            .keep_alive_timeout(Duration::from_secs(3))
            .keep_alive_while_idle(true);
        Ok(endpoint.connect_lazy())
    }
}
