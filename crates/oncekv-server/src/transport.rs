//! Real TCP for the injected listeners of [`crate::server::serve`]:
//! accepted connections with Nagle's algorithm off (Raft and client
//! messages are small and latency-bound).

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::{Stream, StreamExt};

/// The connections accepted on `listener`.
pub fn tcp_incoming(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}
