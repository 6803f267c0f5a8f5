//! [`Session`]: a client session of the replicated log. It numbers
//! requests, sends the lowest sequence number still awaited as the
//! acknowledgement watermark, keeps up to `window` requests in flight from
//! any number of tasks, retries each with its own sequence number until it
//! completes or its deadline passes, keeps itself alive every `ttl/4`, and
//! closes itself when its last handle is dropped. Its keep-alive and close
//! share one body (`about_itself`); its key-value calls are `kv.rs`'s,
//! shared with [`Client`].

use crate::client::{Client, Completed, completed};
use crate::error::ClientError;
use crate::random::key_hex;
use crate::retry::EarlierSends;
use oncekv_state::{
    Command, IdempotencyKey, Origin, Outcome, Reply, Request, RequestHeader, RequestId, Secret,
    Seq, SessionId, WINDOW_DEFAULT,
};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// How a session is opened.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// Idle time after which the cluster expires the session.
    pub ttl: Duration,
    /// Most requests in flight at once (1..=1024).
    pub window: u32,
    /// Whether to keep the session alive in the background.
    pub keep_alive: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: Duration::from_secs(60),
            window: WINDOW_DEFAULT,
            keep_alive: true,
        }
    }
}

struct Inner {
    client: Client,
    id: SessionId,
    secret: Secret,
    ttl: Duration,
    window: u32,
    next_seq: AtomicU64,
    /// Sequence numbers sent and not yet answered.
    incomplete: Mutex<BTreeSet<u64>>,
    /// Signalled whenever a request completes (the window may slide).
    slid: Notify,
    expired: AtomicBool,
    /// Closed explicitly (or a handle that must not close on drop).
    closed: AtomicBool,
    keep_alive: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    /// The last handle is gone: stop keeping the session alive and close it
    /// in the background (best effort; an unclosed session expires by TTL).
    fn drop(&mut self) {
        if let Some(task) = crate::client::lock(&self.keep_alive).take() {
            task.abort();
        }
        if self.closed.load(Ordering::SeqCst) || self.expired.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let command = Command::CloseSession {
                session: self.id,
                secret: self.secret,
            };
            runtime.spawn(async move {
                let _ = client.execute_request(Request::plain(command)).await;
            });
        }
    }
}

/// A session: exactly-once requests from any number of tasks.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.id.0)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Opens a session through the replicated log (itself sent under an
    /// idempotency key, so a retried open does not open two).
    pub async fn open_session(&self, options: SessionOptions) -> Result<Session, ClientError> {
        let ttl_ms = u64::try_from(options.ttl.as_millis()).unwrap_or(u64::MAX);
        let key = format!("open-{}", key_hex(self.options().random.as_ref())).into_bytes();
        let request = Request {
            origin: Origin::Key(IdempotencyKey(key)),
            command: Command::OpenSession {
                ttl_ms,
                window: options.window,
                secret: Secret(0),
            },
        };
        let (outcome, index, attempts) = self.execute_request(request).await?;
        let Completed { reply, .. } = completed(outcome, index, attempts)?;
        let Reply::SessionOpened {
            session, secret, ..
        } = reply
        else {
            return Err(ClientError::Invalid(format!(
                "unexpected reply to a session open: {reply:?}"
            )));
        };
        let session = Session::resume(self.clone(), session, secret, options, 1);
        if options.keep_alive {
            session.start_keep_alive();
        }
        Ok(session)
    }
}

impl Session {
    /// A handle on an existing session (for example one saved in a file),
    /// whose next new sequence number is `next_seq`. No keep-alive runs
    /// unless [`Session::start_keep_alive`] is called.
    pub fn resume(
        client: Client,
        id: SessionId,
        secret: Secret,
        options: SessionOptions,
        next_seq: u64,
    ) -> Session {
        let window = options.window.max(1);
        Session {
            inner: Arc::new(Inner {
                client,
                id,
                secret,
                ttl: options.ttl,
                window,
                next_seq: AtomicU64::new(next_seq.max(1)),
                incomplete: Mutex::new(BTreeSet::new()),
                slid: Notify::new(),
                expired: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                keep_alive: Mutex::new(None),
            }),
        }
    }

    /// The client the session sends through.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The session's id.
    pub fn id(&self) -> SessionId {
        self.inner.id
    }

    /// The session's secret.
    pub fn secret(&self) -> Secret {
        self.inner.secret
    }

    /// The next sequence number a new request will take.
    pub fn next_seq(&self) -> u64 {
        self.inner.next_seq.load(Ordering::SeqCst)
    }

    /// Whether the cluster reported the session expired.
    pub fn is_expired(&self) -> bool {
        self.inner.expired.load(Ordering::SeqCst)
    }

    /// Sends keep-alives every `ttl/4` (three lost in a row still leave
    /// it alive) until the session is dropped or reported expired.
    pub fn start_keep_alive(&self) {
        let weak = Arc::downgrade(&self.inner);
        let period = (self.inner.ttl / 4).max(Duration::from_millis(50));
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(inner) = weak.upgrade() else { return };
                let session = Session { inner };
                match session.keep_alive().await {
                    Err(ClientError::SessionExpired) | Err(ClientError::Unauthorized) => return,
                    Err(error) => tracing::debug!(%error, "keep-alive failed; will retry"),
                    Ok(()) => {}
                }
            }
        });
        *crate::client::lock(&self.inner.keep_alive) = Some(task);
    }

    /// Keeps the session alive once.
    pub async fn keep_alive(&self) -> Result<(), ClientError> {
        match self
            .about_itself(|session, secret| Command::KeepAlive { session, secret })
            .await
        {
            Err(ClientError::SessionExpired) => {
                self.inner.expired.store(true, Ordering::SeqCst);
                Err(ClientError::SessionExpired)
            }
            result => result,
        }
    }

    /// Closes the session, freeing its completion records.
    pub async fn close(&self) -> Result<(), ClientError> {
        self.inner.closed.store(true, Ordering::SeqCst);
        if let Some(task) = crate::client::lock(&self.inner.keep_alive).take() {
            task.abort();
        }
        self.about_itself(|session, secret| Command::CloseSession { session, secret })
            .await
    }

    /// Sends a command about the session itself (a keep-alive, a close),
    /// made from its id and secret, as a plain request: it is not one of
    /// the session's numbered requests.
    async fn about_itself(
        &self,
        command: fn(SessionId, Secret) -> Command,
    ) -> Result<(), ClientError> {
        let request = Request::plain(command(self.inner.id, self.inner.secret));
        let (outcome, index, attempts) = self.inner.client.execute_request(request).await?;
        completed(outcome, index, attempts).map(|_| ())
    }

    /// Keeps the session open when the last handle is dropped (for a
    /// session saved elsewhere, such as a session file).
    pub fn detach(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
    }

    /// Runs a command exactly once and returns its reply.
    pub async fn execute(&self, command: Command) -> Result<Reply, ClientError> {
        self.execute_completed(command)
            .await
            .map(|completed| completed.reply)
    }

    /// Runs a command exactly once; says whether the reply was replayed.
    pub async fn execute_completed(&self, command: Command) -> Result<Completed, ClientError> {
        if self.is_expired() {
            return Err(ClientError::SessionExpired);
        }
        let seq = self.take_seq().await;
        let result = self.send(seq, None, command, EarlierSends::None).await;
        // Answered, rejected or given up on: no longer awaited.
        self.lock_incomplete().remove(&seq);
        self.inner.slid.notify_waiters();
        result
    }

    /// Sends sequence number `seq` exactly, with `first_incomplete`
    /// (default: `seq`): to retry a specific request by hand. `earlier`
    /// says what earlier sends of that number may have done: after one
    /// that may have been delivered (an unknown outcome), this call ends
    /// with the request's reply or [`ClientError::OutcomeUnknown`], never
    /// with "not applied" (see [`EarlierSends`]).
    pub async fn execute_seq(
        &self,
        seq: u64,
        first_incomplete: Option<u64>,
        command: Command,
        earlier: EarlierSends,
    ) -> Result<Completed, ClientError> {
        self.send(seq, Some(first_incomplete.unwrap_or(seq)), command, earlier)
            .await
    }

    /// Waits until the window has room and takes the next sequence
    /// number. The window slides on the lowest number still awaited: a new
    /// number must stay below `first_incomplete + window`, as the cluster
    /// requires, however many requests are in flight.
    async fn take_seq(&self) -> u64 {
        loop {
            let slid = self.inner.slid.notified();
            {
                let mut incomplete = self.lock_incomplete();
                let next = self.inner.next_seq.load(Ordering::SeqCst);
                let lowest = incomplete.first().copied().unwrap_or(next);
                if next < lowest + u64::from(self.inner.window) {
                    self.inner.next_seq.store(next + 1, Ordering::SeqCst);
                    incomplete.insert(next);
                    return next;
                }
            }
            slid.await;
        }
    }

    fn lock_incomplete(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        crate::client::lock(&self.inner.incomplete)
    }

    async fn send(
        &self,
        seq: u64,
        first_incomplete: Option<u64>,
        command: Command,
        earlier: EarlierSends,
    ) -> Result<Completed, ClientError> {
        let first_incomplete = first_incomplete.unwrap_or_else(|| {
            self.lock_incomplete()
                .first()
                .copied()
                .unwrap_or(seq)
                .min(seq)
        });
        let request = Request {
            origin: Origin::Session(RequestHeader {
                id: RequestId {
                    session: self.inner.id,
                    seq: Seq(seq),
                },
                secret: self.inner.secret,
                first_incomplete: Seq(first_incomplete),
                attempt: 1,
            }),
            command,
        };
        let (outcome, index, attempts) = self
            .inner
            .client
            .execute_request_after(request, earlier)
            .await
            .inspect_err(|error| {
                if let ClientError::OutcomeUnknown {
                    last_answer: Some(answer),
                    ..
                } = error
                    && **answer == ClientError::SessionExpired
                {
                    self.inner.expired.store(true, Ordering::SeqCst);
                }
            })?;
        if matches!(outcome, Outcome::SessionExpired) {
            self.inner.expired.store(true, Ordering::SeqCst);
        }
        completed(outcome, index, attempts)
    }

    /// The in-flight window.
    pub fn window(&self) -> u32 {
        self.inner.window
    }
}
