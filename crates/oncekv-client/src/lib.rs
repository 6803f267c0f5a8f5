//! The oncekv client: exactly-once from the caller's side.
//!
//! A [`Client`] finds the leader (following `NotLeader` hints, falling back
//! to the endpoints in turn) and retries with jittered exponential backoff
//! under a deadline. A [`Session`] registers through the replicated log,
//! keeps itself alive, numbers requests and retries each with the same
//! sequence number, so every request applies once and a retry returns the
//! original response. One-shot calls use an idempotency key instead.
//!
//! [`Lock`] and [`Election`] are etcd's concurrency recipes on leases,
//! revisions and watches: a lock with a fencing token, and leader
//! elections that can be observed.
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
//! use oncekv_client::{Client, ClientOptions, Compare, CompareOp, SessionOptions, Txn, TxnOp};
//! use std::time::Duration;
//!
//! // `address` is a node's client address, such as "127.0.0.1:7379".
//! let options = ClientOptions::default().with_deadline(Duration::from_secs(10));
//! let client = Client::connect([address], options)?;
//!
//! // One-shot calls: each applies once (under a fresh idempotency key).
//! let put = client.put("greeting", "hello").await?;
//! assert_eq!(put.value, None);
//! assert_eq!(client.get_kv("greeting", None).await?.expect("set").meta.mod_revision, put.revision);
//! assert_eq!(client.get("greeting").await?, Some(b"hello".to_vec()));
//! let swapped = client.cas("greeting", Some(b"hello"), "hi").await?;
//! assert!(swapped.value.swapped);
//! assert_eq!(client.delete("greeting").await?.value, Some(b"hi".to_vec()));
//! assert_eq!(client.incr("visits", 1).await?.value, 1);
//!
//! // A session numbers its requests: a retry returns the original reply.
//! let session = client.open_session(SessionOptions::default().with_window(8)).await?;
//! assert_eq!(session.incr("balance", 10).await?.value, 10);
//! assert_eq!(session.append("log", "a;").await?.value, 2);
//! let page = session.scan("bal", 0).await?;
//! assert_eq!((page.entries[0].key.as_slice(), page.entries[0].value.as_slice()), (&b"balance"[..], &b"10"[..]));
//!
//! // A transaction changes several keys at one revision, exactly once.
//! let transfer = Txn::new()
//!     .compare(Compare::value("balance", CompareOp::Equal, "10"))
//!     .on_success(TxnOp::incr("balance", -3))
//!     .on_success(TxnOp::incr("savings", 3));
//! let done = session.txn(transfer).await?;
//! assert!(done.succeeded);
//! let savings = client.get_kv("savings", None).await?.expect("savings");
//! assert_eq!((savings.value.as_slice(), savings.meta.mod_revision), (&b"3"[..], done.revision));
//!
//! // An error says whether the request may still have applied.
//! let too_long = client.put(vec![b'k'; 100_000], "v").await.unwrap_err();
//! assert!(too_long.not_applied(), "{too_long}");
//! session.close().await?;
//! # Ok(())
//! # }
//! ```

mod auth;
mod batch;
#[cfg(feature = "cli")]
pub mod cli;
mod client;
mod concurrency;
mod connector;
mod error;
mod kv;
mod lease;
mod random;
mod retry;
mod session;
mod watch;

pub use auth::{AuthInterceptor, Credentials};
pub use client::{Client, ClientOptions, Completed, SavedSnapshot};
pub use concurrency::{DEFAULT_TTL, Election, ElectionObserver, Leader, Lock, Ownership};
pub use connector::{
    Connector, TcpConnector, TlsConfigError, TlsConnectError, TlsConnector, TlsFiles,
    explain_tls_error, strip_scheme,
};
pub use error::ClientError;
pub use kv::{CasOutcome, ScanPage, TxnOutcome, Written};
pub use lease::LeaseKeeper;
pub use oncekv_state::{
    Command, Compare, CompareOp, CompareTarget, KeyMeta, KeyRange, KeyScope, KeyValue, Outcome,
    Overload, Query, Rejection, Reply, RequestId, Txn, TxnOp, Update,
};
pub use random::{OsRandom, RandomSource};
pub use retry::{Backoff, EarlierSends};
pub use session::{Session, SessionOptions};
pub use watch::{Event, EventKind, WatchOptions, WatchUpdate, Watcher};
