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
//! ```no_run
//! # async fn example() -> Result<(), oncekv_client::ClientError> {
//! use oncekv_client::{Client, ClientOptions, Command};
//!
//! let client = Client::connect(["127.0.0.1:7379"], ClientOptions::default())?;
//! let session = client.open_session(Default::default()).await?;
//! let reply = session.execute(Command::Incr { key: b"balance".to_vec(), by: 10 }).await?;
//! println!("{reply:?}");
//! session.close().await?;
//! # Ok(())
//! # }
//! ```

mod client;
mod connector;
mod error;
mod lease;
mod random;
mod retry;
mod session;

pub use client::{Client, ClientOptions, Completed};
pub use connector::{Connector, TcpConnector};
pub use error::ClientError;
pub use lease::LeaseKeeper;
pub use oncekv_state::{Command, Outcome, Query, Rejection, Reply, RequestId};
pub use random::{OsRandom, RandomSource};
pub use retry::Backoff;
pub use session::{Session, SessionOptions};
