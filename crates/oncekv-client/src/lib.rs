//! The oncekv client: exactly-once from the caller's side.
//!
//! A [`Client`] finds the leader (following `NotLeader` hints, falling back
//! to the endpoints in turn) and retries with jittered exponential backoff
//! under a deadline. A [`Session`] registers through the replicated log,
//! keeps itself alive, numbers requests and retries each with the same
//! sequence number, so every request applies once and a retry returns the
//! original response. One-shot calls use an idempotency key instead.
//!
//! The client tells what is known ([`ClientError`]): a reply, a definite
//! rejection, an expired session, or an unknown outcome. It never reports
//! "failed" for a request that may still apply, and it never retries a
//! plain mutating request after it may have been sent.
//!
//! ```
//! # use oncekv_server::{server, transport};
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // A real one-node cluster in this process, on free loopback ports.
//! # let dir = tempfile::tempdir()?;
//! # let clients = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let peers = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let address = clients.local_addr()?.to_string();
//! # let config =
//! #     server::ServerConfig::single_node(dir.path(), &address, &peers.local_addr()?.to_string());
//! # let incoming = (transport::tcp_incoming(clients), transport::tcp_incoming(peers));
//! # tokio::spawn(server::serve(config, incoming.0, incoming.1, std::future::pending()));
//! use oncekv_client::{Client, ClientOptions, Command, Reply};
//!
//! // `address` is a node's client address, such as "127.0.0.1:7379".
//! let client = Client::connect([address], ClientOptions::default())?;
//! let session = client.open_session(Default::default()).await?;
//! let reply = session.execute(Command::Incr { key: b"balance".to_vec(), by: 10 }).await?;
//! assert_eq!(reply, Reply::Incr { value: 10 });
//! session.close().await?;
//! # Ok(())
//! # }
//! ```

mod auth;
mod client;
mod connector;
mod error;
mod lease;
mod random;
mod retry;
mod session;

pub use auth::{AuthInterceptor, Credentials};
pub use client::{Client, ClientOptions, Completed, SavedSnapshot};
pub use connector::{
    Connector, TcpConnector, TlsConfigError, TlsConnectError, TlsConnector, TlsFiles,
    explain_tls_error, strip_scheme,
};
pub use error::ClientError;
pub use lease::LeaseKeeper;
pub use oncekv_state::{Command, Outcome, Query, Rejection, Reply, RequestId};
pub use random::{OsRandom, RandomSource};
pub use retry::Backoff;
pub use session::{Session, SessionOptions};
