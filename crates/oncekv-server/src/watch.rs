//! Watches: [`WatchHub`] carries every applied change from the apply loop
//! to the node's watchers, and [`start`] serves one watcher: the history
//! from its start revision, then live changes, in revision order, whole
//! revisions per message, with progress notices while idle.
//!
//! A watcher first catches up from the history, a message at a time under
//! the applied state's lock, each sent once its queue has room; once it
//! has read the history up to the applied index it subscribes to the hub
//! under that same lock, so it misses nothing and sees nothing twice. The
//! hub is a bounded broadcast channel fed under the lock, which each live
//! watcher drains at once into its own queue ([`queue`]).
//!
//! What a watcher may hold, and when it ends:
//!
//! - **Unsent bytes.** Each watcher's queue counts the bytes of the
//!   events in it (keys, values, previous values when asked for, and an
//!   overhead per event and message), towards the watcher's stream
//!   ([`WATCH_STREAM_BYTES_MAX`]), towards its user (all the user's
//!   streams on this node: [`WatchBounds::user_bytes_max`], its share of
//!   the node's) and towards the node (every client's streams:
//!   [`WatchBounds::bytes_max`], of which only admins' streams take the
//!   reserve: [`WatchBounds::node_bytes_max`]). A live change that would
//!   pass any, while the queue still holds something, cancels the
//!   watcher: its queue is emptied (the memory freed) and it is told why,
//!   naming the bound and its number, and the revision to resume from. A
//!   queue that is empty always takes the next message, so a reader that
//!   keeps up is never cancelled, whatever one revision weighs. The
//!   history it catches up from is sent as the queue drains.
//! - **How many.** A node serves at most [`WatchBounds::watchers_max`]
//!   watchers (of which only admins take the reserve:
//!   [`WatchBounds::node_watchers_max`]), a user at most its share of them
//!   ([`WatchBounds::user_watchers_max`]; with authentication off: the
//!   clients of one source address), one connection at most
//!   [`WATCHERS_PER_CONNECTION_MAX`] and one etcd watch stream at most
//!   [`WATCHES_PER_STREAM_MAX`]. One more is refused ([`WatchCap`], naming
//!   the cap), never served by dropping another.
//! - **Shares.** The node's bounds are [`WatchBounds`] (`oncekv serve
//!   --watchers-max`, default [`WATCHERS_MAX_DEFAULT`], and
//!   `--watch-bytes-max`, default [`WATCH_BYTES_MAX_DEFAULT`]); a user's
//!   share of them and the admins' reserve are those of the replicated
//!   budgets ([`UserQuotas`]: `--user-share-percent`, default 25, and
//!   `--admin-reserve-percent`, default 10). By default a user holds at
//!   most 1024 watchers and 64 MiB of unsent events on a node, and a
//!   tenth of each is kept for admins. The reserve holds while
//!   authentication is enforced (with it off, anyone is an admin).
//! - **The right to read.** A client's watcher keeps the credentials it
//!   started with ([`Rights`]) and checks them again, against the applied
//!   state, whenever the users and roles change (the hub counts the
//!   applied auth changes: [`WatchHub::auth_changed`]) and once its token
//!   expires (in cluster time). A password change, a deleted user, an
//!   expired token, enforcement switched on, or a revoked role or
//!   permission that no longer covers the watched keys ends it with the
//!   refusal a call would get (`Unauthenticated` or `PermissionDenied`),
//!   before any later change is sent.
//! - **Falling behind.** A watcher whose task falls the hub's whole length
//!   behind is cancelled with a reason; so is every watcher when the
//!   replica installs a snapshot (the history jumps).
//!
//! The client resumes from the revision the reason names (its next).

use crate::raft::write_error::WriteError;
use crate::sync::lock;
use oncekv_state::{ClusterTime, Event, KeyScope, StateMachine, StoredValue, UserQuotas};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{Notify, broadcast, mpsc};

/// Notices a watcher may be behind by before it is cancelled.
pub const WATCH_BACKLOG_NOTICES: usize = 4096;
/// Most watchers one node serves at once by default
/// ([`WatchBounds::watchers_max`]); one more is refused (told to retry
/// later or elsewhere), never served by dropping another.
pub const WATCHERS_MAX_DEFAULT: usize = 4096;
/// Most native watchers on one client connection: of the 256 calls a
/// connection carries at once (`--streams-per-connection-max`), the rest
/// stay free for its other calls.
pub const WATCHERS_PER_CONNECTION_MAX: usize = 200;
/// Most watches one etcd watch stream multiplexes.
pub const WATCHES_PER_STREAM_MAX: usize = 1024;
/// Most bytes of events queued unsent on one watch stream (a native
/// watch, or an etcd stream with all its watches): 4 MiB.
pub const WATCH_STREAM_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Most bytes of events queued unsent on all the clients' watch streams
/// of one node by default ([`WatchBounds::bytes_max`]): 256 MiB, so that
/// many users (or, with authentication off, many source addresses)
/// cannot together take a node's memory.
pub const WATCH_BYTES_MAX_DEFAULT: usize = 256 * 1024 * 1024;
/// The shortest progress interval a watcher may ask for.
pub const PROGRESS_INTERVAL_MIN: Duration = Duration::from_millis(100);
/// How often an idle watcher hears the revision it is up to, by default.
pub const PROGRESS_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
/// What a message or an event weighs besides its keys and values.
pub const MESSAGE_OVERHEAD_BYTES: usize = 64;
/// Messages buffered towards the consumer of a watch inside the node
/// ([`watch`]).
const INTERNAL_OUTBOX_MESSAGES: usize = 64;
/// Events of history sent in one message, about (whole revisions).
const EVENTS_PER_MESSAGE: usize = 1024;
/// Bytes of history sent in one message, about (whole revisions).
const HISTORY_MESSAGE_BYTES: usize = 1024 * 1024;

/// The bounds on one node's watchers and on the events their streams hold
/// unsent, and the shares of them a user may hold: a user's (with
/// authentication off, a source address's) watchers and unsent bytes are
/// its share of the node's ([`UserQuotas::user_share`]), and all users
/// without the admin role together fill the node's only up to what the
/// admin reserve leaves ([`UserQuotas::without_reserve`]). The default is
/// 4096 watchers and 256 MiB per node, 1024 watchers and 64 MiB per user,
/// a tenth of each kept for admins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchBounds {
    /// Most watchers the node serves at once (`oncekv serve
    /// --watchers-max`).
    pub watchers_max: usize,
    /// Most bytes of events queued unsent on all the clients' watch
    /// streams of the node (`oncekv serve --watch-bytes-max`).
    pub bytes_max: usize,
    /// A user's share of both, and the admins' reserve.
    pub quotas: UserQuotas,
}

impl Default for WatchBounds {
    fn default() -> Self {
        WatchBounds {
            watchers_max: WATCHERS_MAX_DEFAULT,
            bytes_max: WATCH_BYTES_MAX_DEFAULT,
            quotas: UserQuotas::default(),
        }
    }
}

impl WatchBounds {
    /// Most watchers of one user on the node (with authentication off: of
    /// the clients at one source address).
    pub fn user_watchers_max(&self) -> usize {
        of(self.watchers_max, |max| self.quotas.user_share(max))
    }

    /// Most watchers the node serves, for an admin (`admin`) or, less the
    /// reserve, for anyone else.
    pub fn node_watchers_max(&self, admin: bool) -> usize {
        if admin {
            self.watchers_max
        } else {
            of(self.watchers_max, |max| self.quotas.without_reserve(max))
        }
    }

    /// Most bytes of events queued unsent on all of one user's watch
    /// streams on the node.
    pub fn user_bytes_max(&self) -> usize {
        of(self.bytes_max, |max| self.quotas.user_share(max))
    }

    /// Most bytes of events queued unsent on the node's streams, for an
    /// admin's stream (`admin`) or, less the reserve, anyone else's.
    pub fn node_bytes_max(&self, admin: bool) -> usize {
        if admin {
            self.bytes_max
        } else {
            of(self.bytes_max, |max| self.quotas.without_reserve(max))
        }
    }
}

/// `bound` (counted in `u64`, as the budgets are) of `max`.
fn of(max: usize, bound: impl Fn(u64) -> u64) -> usize {
    let bound = bound(u64::try_from(max).unwrap_or(u64::MAX));
    usize::try_from(bound).unwrap_or(max)
}

/// What the apply loop tells watchers.
#[derive(Clone, Debug)]
pub enum Notice {
    /// Entry `revision` was applied with these changes (possibly none).
    Applied {
        /// The entry's index.
        revision: u64,
        /// Its changes, in order.
        events: Arc<[Event]>,
        /// The cluster time after it.
        time: ClusterTime,
        /// How many auth changes were applied up to it.
        auth: u64,
    },
    /// The replica's state was replaced by a snapshot at `revision`.
    Reset {
        /// The snapshot's last index.
        revision: u64,
    },
}

/// The sending side, held with the applied state.
#[derive(Clone, Debug)]
pub struct WatchHub {
    sender: broadcast::Sender<Notice>,
    /// Auth changes applied since the replica started.
    auth: u64,
    registry: Arc<Mutex<Registry>>,
}

impl Default for WatchHub {
    fn default() -> Self {
        WatchHub::new(WatchBounds::default())
    }
}

impl WatchHub {
    /// A hub whose watchers are held to `bounds`.
    pub fn new(bounds: WatchBounds) -> WatchHub {
        WatchHub::with_capacity_and_bounds(WATCH_BACKLOG_NOTICES, bounds)
    }

    /// A hub whose watchers may fall `notices` behind, under the default
    /// bounds.
    pub fn with_capacity(notices: usize) -> WatchHub {
        WatchHub::with_capacity_and_bounds(notices, WatchBounds::default())
    }

    /// A hub whose watchers may fall `notices` behind, held to `bounds`.
    pub fn with_capacity_and_bounds(notices: usize, bounds: WatchBounds) -> WatchHub {
        WatchHub {
            sender: broadcast::channel(notices.max(1)).0,
            auth: 0,
            registry: Arc::new(Mutex::new(Registry::new(bounds))),
        }
    }

    /// The bounds its watchers are held to.
    pub fn bounds(&self) -> WatchBounds {
        lock(&self.registry).bounds
    }

    /// After `machine` applied entry `revision`: tells watchers, if any,
    /// its changes. Call under the applied state's lock.
    pub fn applied(&self, machine: &StateMachine, revision: u64) {
        if self.sender.receiver_count() == 0 {
            return;
        }
        let history = machine.kv().history();
        let events: Arc<[Event]> = if machine.kv().revision() == revision {
            match history.since(revision) {
                Ok(events) => events.cloned().collect(),
                // The change alone passed the history's bounds: watchers
                // cannot be given it, and are told so.
                Err(_) => {
                    let _ = self.sender.send(Notice::Reset { revision });
                    return;
                }
            }
        } else {
            Arc::from(Vec::new())
        };
        let _ = self.sender.send(Notice::Applied {
            revision,
            events,
            time: machine.cluster_time(),
            auth: self.auth,
        });
    }

    /// Before the entry applied next is told of ([`applied`](Self::applied)):
    /// it changed users, roles or enforcement, so every watcher checks its
    /// right again. Call under the applied state's lock.
    pub fn auth_changed(&mut self) {
        self.auth = self.auth.wrapping_add(1);
    }

    /// After the state was replaced by a snapshot at `revision`.
    pub fn reset(&self, revision: u64) {
        let _ = self.sender.send(Notice::Reset { revision });
    }

    /// The accounts of `user` and `channel`, for a client's watches
    /// ([`WatchOwner`]).
    pub fn owner(&self, user: Option<Holder>, channel: Option<Holder>) -> WatchOwner {
        let mut registry = lock(&self.registry);
        WatchOwner {
            user: user.map(|holder| registry.account(holder)),
            channel: channel.map(|holder| registry.account(holder)),
        }
    }

    /// How many watchers this node serves.
    pub fn watchers(&self) -> usize {
        lock(&self.registry).watchers
    }

    /// Takes a place for one more watcher of `owner`, if every cap allows.
    /// A watcher's slot, within the caps; `admin`: the owner may take the
    /// node's reserve too.
    fn take_slot(&self, owner: &WatchOwner, admin: bool) -> Result<Slot, WatchCap> {
        let mut registry = lock(&self.registry);
        let node_max = registry.bounds.node_watchers_max(admin);
        if registry.watchers >= node_max {
            return Err(WatchCap {
                holder: None,
                max: node_max,
            });
        }
        let accounts: Vec<Arc<Account>> = [&owner.channel, &owner.user]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        for account in &accounts {
            let max = account.holder.cap(&registry.bounds);
            if account.watchers.load(Ordering::Relaxed) >= max {
                return Err(WatchCap {
                    holder: Some(account.holder.clone()),
                    max,
                });
            }
        }
        for account in &accounts {
            account.watchers.fetch_add(1, Ordering::Relaxed);
            account.admin.store(admin, Ordering::Relaxed);
        }
        registry.watchers += 1;
        metrics::gauge!("oncekv_watchers").set(registry.watchers as f64);
        Ok(Slot {
            registry: Arc::clone(&self.registry),
            accounts,
        })
    }
}

/// A look at the applied state and its hub, run under the state's lock.
pub type Visit<'a> = &'a mut dyn FnMut(&StateMachine, &WatchHub);

/// Whom a client's watchers are counted against.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    /// A user, while authentication is enforced.
    User(String),
    /// The clients at one source address, while it is not.
    Address(IpAddr),
    /// One client connection (native watches).
    Connection(SocketAddr),
    /// One etcd watch stream (its number on this node).
    Stream(u64),
}

impl Holder {
    /// How many watchers it may hold under `bounds`.
    fn cap(&self, bounds: &WatchBounds) -> usize {
        match self {
            Holder::User(_) | Holder::Address(_) => bounds.user_watchers_max(),
            Holder::Connection(_) => WATCHERS_PER_CONNECTION_MAX,
            Holder::Stream(_) => WATCHES_PER_STREAM_MAX,
        }
    }
}

/// One holder's watchers and unsent bytes.
#[derive(Debug)]
pub struct Account {
    holder: Holder,
    watchers: AtomicUsize,
    bytes: AtomicUsize,
    /// Whether its last watcher started as an admin's (a user's role
    /// changes rarely; a watch that loses its right ends anyway).
    admin: AtomicBool,
    /// The unsent bytes of every client's streams on the node.
    node_bytes: Arc<AtomicUsize>,
    /// The node's bounds.
    bounds: WatchBounds,
}

impl Account {
    /// Bytes of events its queues hold unsent.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Counts `bytes` queued (`added`) or taken out, towards this holder
    /// and the node.
    fn count(&self, bytes: usize, added: bool) {
        for counter in [&self.bytes, &*self.node_bytes] {
            if added {
                counter.fetch_add(bytes, Ordering::Relaxed);
            } else {
                counter.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
    }
}

/// The node's watchers and the accounts of their holders (each kept while
/// anything holds it).
#[derive(Debug)]
struct Registry {
    /// The bounds they are held to.
    bounds: WatchBounds,
    watchers: usize,
    /// The unsent bytes of every client's streams
    /// ([`WatchBounds::bytes_max`]).
    node_bytes: Arc<AtomicUsize>,
    accounts: HashMap<Holder, Weak<Account>>,
    /// Accounts kept after the last sweep of the dead ones.
    kept: usize,
}

impl Registry {
    fn new(bounds: WatchBounds) -> Registry {
        Registry {
            bounds,
            watchers: 0,
            node_bytes: Arc::default(),
            accounts: HashMap::new(),
            kept: 0,
        }
    }

    fn account(&mut self, holder: Holder) -> Arc<Account> {
        if let Some(account) = self.accounts.get(&holder).and_then(Weak::upgrade) {
            return account;
        }
        if self.accounts.len() >= 2 * self.kept.max(32) {
            self.accounts
                .retain(|_, account| account.strong_count() > 0);
            self.kept = self.accounts.len();
        }
        let account = Arc::new(Account {
            holder: holder.clone(),
            watchers: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            admin: AtomicBool::new(false),
            node_bytes: Arc::clone(&self.node_bytes),
            bounds: self.bounds,
        });
        self.accounts.insert(holder, Arc::downgrade(&account));
        account
    }
}

/// A watcher's place, given back when it ends.
#[derive(Debug)]
struct Slot {
    registry: Arc<Mutex<Registry>>,
    accounts: Vec<Arc<Account>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut registry = lock(&self.registry);
        registry.watchers = registry.watchers.saturating_sub(1);
        metrics::gauge!("oncekv_watchers").set(registry.watchers as f64);
        for account in &self.accounts {
            account.watchers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Whom a client's watches count against: its user (or source address)
/// and its connection or stream. [`WatchHub::owner`] makes it.
#[derive(Clone, Debug, Default)]
pub struct WatchOwner {
    /// The user's account, when known.
    pub user: Option<Arc<Account>>,
    /// The connection's or stream's account, when known.
    pub channel: Option<Arc<Account>>,
}

/// A watcher refused because a cap is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchCap {
    /// Whose cap (`None`: the node's).
    pub holder: Option<Holder>,
    /// The cap.
    pub max: usize,
}

impl WatchCap {
    /// Whether the node as a whole is full (another node may serve it),
    /// rather than the caller's own share.
    pub fn is_node(&self) -> bool {
        self.holder.is_none()
    }

    /// What is full, as the overloaded metadata names it.
    pub fn what(&self) -> &'static str {
        match self.holder {
            None => "watchers",
            Some(Holder::User(_) | Holder::Address(_)) => "watchers-per-user",
            Some(Holder::Connection(_)) => "watchers-per-connection",
            Some(Holder::Stream(_)) => "watches-per-stream",
        }
    }
}

impl std::fmt::Display for WatchCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let max = self.max;
        match &self.holder {
            None => write!(
                f,
                "this node serves its maximum of {max} watchers; retry later or on another node"
            ),
            Some(Holder::User(user)) => write!(
                f,
                "user {user:?} holds its maximum of {max} watchers on this node \
                 (the cap per user, its share of the node's); end one first"
            ),
            Some(Holder::Address(address)) => write!(
                f,
                "the clients at {address} hold their maximum of {max} watchers on this node \
                 (the cap per user, its share of the node's; with authentication off, per \
                 source address); end one first"
            ),
            Some(Holder::Connection(_)) => write!(
                f,
                "this connection holds its maximum of {max} watchers (the cap per connection); \
                 end one first, or watch on another connection"
            ),
            Some(Holder::Stream(_)) => write!(
                f,
                "this watch stream holds its maximum of {max} watches (the cap per stream); \
                 cancel one first, or open another stream"
            ),
        }
    }
}

/// Why a watch did not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchError {
    /// The caller has no valid credentials, or may not read the keys.
    Refused(WriteError),
    /// A cap on watchers is reached.
    Capped(WatchCap),
}

/// Checks, against the applied state, that a watcher may still read what
/// it watches.
pub type Check = Arc<dyn Fn(&StateMachine) -> Result<(), WriteError> + Send + Sync>;

/// A watcher's right to go on: checked at its start, whenever an auth
/// change is applied, and once its token's expiry passes.
#[derive(Clone)]
pub struct Rights {
    check: Check,
    /// When its token expires (cluster time), while that is still ahead.
    expires: Option<ClusterTime>,
    /// The hub's auth count when it was last checked.
    checked_at: u64,
}

impl std::fmt::Debug for Rights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rights")
            .field("expires", &self.expires)
            .field("checked_at", &self.checked_at)
            .finish_non_exhaustive()
    }
}

impl Rights {
    /// Rights checked by `check`, on a token expiring at `expires` (if
    /// any).
    pub fn new(check: Check, expires: Option<ClusterTime>) -> Rights {
        Rights {
            check,
            expires,
            checked_at: 0,
        }
    }

    /// Whether they must be checked again: an auth change applied since,
    /// or the token's expiry passed.
    fn due(&self, auth: u64, time: ClusterTime) -> bool {
        auth != self.checked_at || self.expires.is_some_and(|expires| time > expires)
    }

    /// Checks them against `machine`, with the hub's auth count `auth`.
    fn check(&mut self, machine: &StateMachine, auth: u64) -> Result<(), WriteError> {
        self.checked_at = auth;
        // Past the expiry, the check itself refuses the token whenever
        // authentication is enforced; an auth change checks again.
        if self
            .expires
            .is_some_and(|expires| machine.cluster_time() > expires)
        {
            self.expires = None;
        }
        (self.check)(machine)
    }
}

/// What a watcher asks for.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    /// The key, the prefix, or the range's start, as `scope` says.
    pub key: Vec<u8>,
    /// Which keys: `key` alone, every key under it, or a range from it.
    pub scope: KeyScope,
    /// The first revision to send (0: after now).
    pub start_revision: u64,
    /// Whether to send previous values.
    pub previous: bool,
    /// How often to send progress while idle.
    pub progress_interval: Duration,
}

impl WatchSpec {
    fn matches(&self, key: &[u8]) -> bool {
        self.scope.contains(&self.key, key)
    }
}

/// A message to one watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchMessage {
    /// The watch runs; every change after `revision` will follow.
    Started {
        /// The revision it starts after.
        revision: u64,
    },
    /// Changes of whole revisions, in order.
    Events(Vec<Event>),
    /// Every change up to this revision was sent.
    Progress(u64),
    /// The watch ended.
    Canceled {
        /// Why.
        reason: String,
        /// The compacted revision, when the cause is compaction.
        compacted: u64,
        /// The refusal a call would now get, when the watcher lost the
        /// right to it (`Unauthenticated` or `PermissionDenied`).
        denied: Option<WriteError>,
    },
}

/// What one event weighs in a queue: its key, its value and lease, its
/// previous value when it is sent, and an overhead.
pub fn event_bytes(event: &Event, previous: bool) -> usize {
    let stored = |stored: &Option<Arc<StoredValue>>| {
        stored.as_ref().map_or(0, |stored| {
            stored.value.len() + stored.lease.as_ref().map_or(0, String::len)
        })
    };
    let previous = if previous { stored(&event.previous) } else { 0 };
    MESSAGE_OVERHEAD_BYTES + event.key.len() + stored(&event.value) + previous
}

/// What a message weighs in a queue.
fn message_bytes(message: &WatchMessage, previous: bool) -> usize {
    match message {
        WatchMessage::Events(events) => {
            MESSAGE_OVERHEAD_BYTES
                + events
                    .iter()
                    .map(|event| event_bytes(event, previous))
                    .sum::<usize>()
        }
        WatchMessage::Canceled { reason, .. } => MESSAGE_OVERHEAD_BYTES + reason.len(),
        WatchMessage::Started { .. } | WatchMessage::Progress(_) => MESSAGE_OVERHEAD_BYTES,
    }
}

/// Which bound a queue reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The stream's (a client's: [`WATCH_STREAM_BYTES_MAX`]).
    Stream {
        /// The bytes it held.
        held: usize,
        /// The bound.
        max: usize,
    },
    /// The user's, over all its streams on the node
    /// ([`WatchBounds::user_bytes_max`]).
    User {
        /// The bytes its streams held.
        held: usize,
        /// The bound.
        max: usize,
    },
    /// The node's, over every client's streams
    /// ([`WatchBounds::node_bytes_max`]: less the admin reserve for a
    /// user without the admin role).
    Node {
        /// The bytes the node's streams held.
        held: usize,
        /// The bound that applied.
        max: usize,
    },
}

impl Bound {
    /// Why a watch was cancelled, for a reason that goes on with "resume
    /// from revision N".
    pub fn reason(&self) -> String {
        match self {
            Bound::Stream { held, max } => format!(
                "watch canceled: {held} bytes of events were waiting unsent on its stream, \
                 the bound is {max} bytes per stream (the client does not read them fast \
                 enough)"
            ),
            Bound::User { held, max } => format!(
                "watch canceled: its user's watch streams held {held} bytes of events unsent \
                 on this node, the bound is {max} bytes per user, its share of the node's \
                 (its clients do not read them fast enough)"
            ),
            Bound::Node { held, max } => format!(
                "watch canceled: the node's watch streams held {held} bytes of events unsent, \
                 the bound is {max} bytes (its clients do not read them fast enough)"
            ),
        }
    }
}

/// Why a message was not queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The reader went away.
    Gone,
    /// A bound is reached while the queue holds something.
    Full(Bound),
}

struct QueueState<T> {
    items: VecDeque<(T, usize)>,
    bytes: usize,
    senders: usize,
    reader: bool,
}

struct Shared<T> {
    state: Mutex<QueueState<T>>,
    bytes_max: usize,
    account: Option<Arc<Account>>,
    /// Something was queued, or the last sender left.
    readable: Notify,
    /// Something was taken, or the reader left.
    writable: Notify,
}

impl<T> Shared<T> {
    /// Forgets `bytes` taken out of the queue.
    fn uncount(&self, state: &mut QueueState<T>, bytes: usize) {
        state.bytes = state.bytes.saturating_sub(bytes);
        if let Some(account) = &self.account {
            account.count(bytes, false);
        }
    }

    /// Whether a message of `bytes` may be queued now, and if not which
    /// bound stops it.
    fn fits(&self, state: &QueueState<T>, bytes: usize) -> Result<(), Bound> {
        if state.items.is_empty() {
            return Ok(());
        }
        if state.bytes.saturating_add(bytes) > self.bytes_max {
            return Err(Bound::Stream {
                held: state.bytes,
                max: self.bytes_max,
            });
        }
        if let Some(account) = &self.account {
            let held = account.bytes.load(Ordering::Relaxed);
            let max = account.bounds.user_bytes_max();
            if held.saturating_add(bytes) > max {
                return Err(Bound::User { held, max });
            }
            let held = account.node_bytes.load(Ordering::Relaxed);
            let max = account
                .bounds
                .node_bytes_max(account.admin.load(Ordering::Relaxed));
            if held.saturating_add(bytes) > max {
                return Err(Bound::Node { held, max });
            }
        }
        Ok(())
    }

    fn push(&self, state: &mut QueueState<T>, item: T, bytes: usize) {
        state.items.push_back((item, bytes));
        state.bytes = state.bytes.saturating_add(bytes);
        if let Some(account) = &self.account {
            account.count(bytes, true);
        }
        self.readable.notify_one();
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(account) = &self.account {
            account.count(state.bytes, false);
        }
    }
}

/// The sending side of a watch stream's queue.
pub struct Outbox<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving side of a watch stream's queue.
pub struct Inbox<T> {
    shared: Arc<Shared<T>>,
}

impl<T> std::fmt::Debug for Outbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox").finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for Inbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

/// A watch stream's queue, holding at most `bytes_max` bytes unsent (and
/// counting them towards `account`, whose streams together hold at most
/// [`WatchBounds::user_bytes_max`], and the node's, which hold at most
/// [`WatchBounds::node_bytes_max`]); an empty queue takes any one message.
pub fn queue<T>(bytes_max: usize, account: Option<Arc<Account>>) -> (Outbox<T>, Inbox<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(QueueState {
            items: VecDeque::new(),
            bytes: 0,
            senders: 1,
            reader: true,
        }),
        bytes_max,
        account,
        readable: Notify::new(),
        writable: Notify::new(),
    });
    (
        Outbox {
            shared: Arc::clone(&shared),
        },
        Inbox { shared },
    )
}

impl<T> Clone for Outbox<T> {
    fn clone(&self) -> Self {
        lock(&self.shared.state).senders += 1;
        Outbox {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Outbox<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        state.senders = state.senders.saturating_sub(1);
        if state.senders == 0 {
            self.shared.readable.notify_one();
        }
    }
}

impl<T> Outbox<T> {
    /// Queues `item` of `bytes` if it fits now ([`Refused::Full`] names
    /// the bound otherwise).
    pub fn try_send(&self, item: T, bytes: usize) -> Result<(), Refused> {
        let mut state = lock(&self.shared.state);
        if !state.reader {
            return Err(Refused::Gone);
        }
        self.shared.fits(&state, bytes).map_err(Refused::Full)?;
        self.shared.push(&mut state, item, bytes);
        Ok(())
    }

    /// Queues `item` of `bytes` once it fits; `Err` if the reader goes
    /// away first.
    pub async fn send(&self, item: T, bytes: usize) -> Result<(), Refused> {
        let mut item = Some(item);
        loop {
            let taken = self.shared.writable.notified();
            tokio::pin!(taken);
            taken.as_mut().enable();
            {
                let mut state = lock(&self.shared.state);
                if !state.reader {
                    return Err(Refused::Gone);
                }
                if self.shared.fits(&state, bytes).is_ok()
                    && let Some(item) = item.take()
                {
                    self.shared.push(&mut state, item, bytes);
                    return Ok(());
                }
            }
            taken.await;
        }
    }

    /// Queues `item` of `bytes` whatever the bounds: a stream's last
    /// words, after [`take_all`](Self::take_all) freed what it held.
    pub fn force(&self, item: T, bytes: usize) -> Result<(), Refused> {
        let mut state = lock(&self.shared.state);
        if !state.reader {
            return Err(Refused::Gone);
        }
        self.shared.push(&mut state, item, bytes);
        Ok(())
    }

    /// Takes out of the queue, unsent, every item `which` picks, in order.
    pub fn take_where(&self, which: impl Fn(&T) -> bool) -> Vec<T> {
        let mut state = lock(&self.shared.state);
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(state.items.len());
        let mut freed = 0;
        for (item, bytes) in std::mem::take(&mut state.items) {
            if which(&item) {
                freed += bytes;
                taken.push(item);
            } else {
                kept.push_back((item, bytes));
            }
        }
        state.items = kept;
        self.shared.uncount(&mut state, freed);
        drop(state);
        self.shared.writable.notify_waiters();
        taken
    }

    /// Takes everything out of the queue, unsent.
    pub fn take_all(&self) -> Vec<T> {
        self.take_where(|_| true)
    }

    /// Bytes queued unsent.
    pub fn bytes(&self) -> usize {
        lock(&self.shared.state).bytes
    }

    /// Waits until the reader goes away.
    pub async fn closed(&self) {
        loop {
            let changed = self.shared.writable.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !lock(&self.shared.state).reader {
                return;
            }
            changed.await;
        }
    }
}

impl<T> Inbox<T> {
    /// The next item; `None` once every sender is gone and the queue is
    /// empty.
    pub async fn recv(&mut self) -> Option<T> {
        loop {
            {
                let mut state = lock(&self.shared.state);
                if let Some((item, bytes)) = state.items.pop_front() {
                    self.shared.uncount(&mut state, bytes);
                    drop(state);
                    self.shared.writable.notify_waiters();
                    return Some(item);
                }
                if state.senders == 0 {
                    return None;
                }
            }
            self.shared.readable.notified().await;
        }
    }

    /// The items as a stream.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = T> + Send + 'static
    where
        T: Send + 'static,
    {
        futures_util::stream::unfold(self, |mut inbox| async move {
            inbox.recv().await.map(|item| (item, inbox))
        })
    }
}

impl<T> Drop for Inbox<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        state.reader = false;
        let freed = state.bytes;
        state.items.clear();
        self.shared.uncount(&mut state, freed);
        drop(state);
        self.shared.writable.notify_waiters();
    }
}

/// The messages of one watcher.
pub type WatchInbox = Inbox<WatchMessage>;

/// One step of catching up from the history.
#[derive(Debug)]
enum Step {
    /// Events of whole revisions (possibly none) examined up to `through`.
    Chunk { events: Vec<Event>, through: u64 },
    /// Caught up: every change up to `sent` was examined; live from here.
    Live {
        sent: u64,
        notices: broadcast::Receiver<Notice>,
    },
    /// The history no longer holds revision `from`.
    Compacted { from: u64, compacted: u64 },
}

/// The next step of catching up from revision `next`, under the state's
/// lock: a message's worth of the history, or the subscription once the
/// history is read up to the applied index.
fn catch_up(machine: &StateMachine, hub: &WatchHub, spec: &WatchSpec, next: u64) -> Step {
    let applied = machine.last_applied().map_or(0, |index| index.0);
    if next > applied {
        return Step::Live {
            sent: next.saturating_sub(1),
            notices: hub.sender.subscribe(),
        };
    }
    let history = machine.kv().history();
    let events = match history.since(next) {
        Ok(events) => events,
        Err(_) => {
            return Step::Compacted {
                from: next,
                compacted: history.compacted(),
            };
        }
    };
    let mut chunk: Vec<Event> = Vec::new();
    let mut bytes = 0;
    let mut through = applied;
    for event in events {
        if event.revision > applied {
            break;
        }
        let full = chunk.len() >= EVENTS_PER_MESSAGE || bytes >= HISTORY_MESSAGE_BYTES;
        if full
            && chunk
                .last()
                .is_some_and(|last| last.revision != event.revision)
        {
            through = event.revision.saturating_sub(1);
            break;
        }
        if spec.matches(&event.key) {
            bytes += event_bytes(event, spec.previous);
            chunk.push(event.clone());
        }
    }
    if chunk.is_empty() {
        return Step::Live {
            sent: applied,
            notices: hub.sender.subscribe(),
        };
    }
    Step::Chunk {
        events: chunk,
        through,
    }
}

/// Why a watcher ends.
#[derive(Debug)]
enum Stop {
    /// The reader went away: nothing to say.
    Gone,
    /// Its queue reached a bound; the changes from `next` on were not sent.
    Full { bound: Bound, next: u64 },
    /// The replica's state jumped to `revision`.
    Reset { revision: u64 },
    /// It fell `behind` notices behind the hub.
    Behind { behind: u64 },
    /// The history no longer holds revision `from`.
    Compacted { from: u64, compacted: u64 },
    /// It lost the right to watch.
    Denied(WriteError),
}

/// One watcher being served.
struct Serving<L> {
    /// Given back first when it ends, before its reader hears the end.
    _slot: Slot,
    spec: WatchSpec,
    lock: L,
    outbox: Outbox<WatchMessage>,
    rights: Option<Rights>,
}

/// Starts serving `spec` to `owner` from the state `lock` locks, after
/// checking `rights` (if given) and the caps, and returns the watcher's
/// messages. The stream ends after `Canceled`, or when the watcher goes
/// away; a watch from a compacted revision is `Canceled` at once (with the
/// compacted revision).
pub fn start<L>(
    lock: L,
    spec: WatchSpec,
    owner: &WatchOwner,
    mut rights: Option<Rights>,
) -> Result<WatchInbox, WatchError>
where
    L: Fn(Visit<'_>) + Send + Sync + 'static,
{
    let (outbox, inbox) = queue(WATCH_STREAM_BYTES_MAX, owner.user.clone());
    let mut started = Err(WatchError::Refused(WriteError::Unavailable(
        "the applied state was not read".to_string(),
    )));
    lock(&mut |machine: &StateMachine, hub: &WatchHub| {
        started = (|| {
            if let Some(rights) = &mut rights {
                rights
                    .check(machine, hub.auth)
                    .map_err(WatchError::Refused)?;
            }
            let admin = match owner.user.as_ref().map(|account| &account.holder) {
                Some(Holder::User(name)) => machine
                    .auth()
                    .is_admin(Some(&oncekv_state::Principal(name.clone()))),
                // Anyone is an admin while authentication is off.
                _ => machine.auth().is_admin(None),
            };
            let slot = hub.take_slot(owner, admin).map_err(WatchError::Capped)?;
            let from = if spec.start_revision == 0 {
                machine
                    .last_applied()
                    .map_or(0, |index| index.0)
                    .saturating_add(1)
            } else {
                spec.start_revision
            };
            Ok((slot, from, catch_up(machine, hub, &spec, from)))
        })();
    });
    let (slot, from, first) = started?;
    if let Step::Compacted { from, compacted } = first {
        let message = canceled(Stop::Compacted { from, compacted }, from);
        let bytes = message_bytes(&message, false);
        let _ = outbox.force(message, bytes);
        metrics::counter!("oncekv_watches_canceled_total", "reason" => "compacted").increment(1);
        return Ok(inbox);
    }
    let serving = Serving {
        _slot: slot,
        spec,
        lock,
        outbox,
        rights,
    };
    tokio::spawn(serving.run(from, first));
    Ok(inbox)
}

/// The message that ends a watch for `stop`, whose next unsent change is
/// at revision `next`.
fn canceled(stop: Stop, next: u64) -> WatchMessage {
    let (reason, compacted, denied) = match stop {
        Stop::Gone => (String::new(), 0, None),
        Stop::Full { bound, .. } => (
            format!("{}; resume from revision {next}", bound.reason()),
            0,
            None,
        ),
        Stop::Reset { revision } => (
            format!(
                "this replica's state jumped to revision {revision} (a snapshot was installed, \
                 or one change exceeded the history): resume from revision {next}"
            ),
            0,
            None,
        ),
        Stop::Behind { behind } => (
            format!(
                "watcher too slow: {behind} changes behind the node's buffer; \
                 resume from revision {next}"
            ),
            0,
            None,
        ),
        Stop::Compacted { from, compacted } => (
            format!(
                "revision {from} is compacted (the history starts after revision {compacted}); \
                 read the current state and watch from its revision"
            ),
            compacted,
            None,
        ),
        Stop::Denied(error) => (error.to_string(), 0, Some(error)),
    };
    WatchMessage::Canceled {
        reason,
        compacted,
        denied,
    }
}

impl<L> Serving<L>
where
    L: Fn(Visit<'_>) + Send + Sync + 'static,
{
    /// Serves the watch from revision `from`, `first` being its first step.
    async fn run(mut self, from: u64, first: Step) {
        let stop = self.serve(from, first).await;
        self.finish(stop);
    }

    async fn serve(&mut self, from: u64, first: Step) -> (Stop, u64) {
        let started = WatchMessage::Started {
            revision: from.saturating_sub(1),
        };
        if self
            .outbox
            .send(started, MESSAGE_OVERHEAD_BYTES)
            .await
            .is_err()
        {
            return (Stop::Gone, from);
        }
        // Catching up: a message's worth of history at a time, each sent
        // once the queue has room; nothing is subscribed meanwhile.
        let mut step = first;
        let (mut sent, mut notices) = loop {
            match step {
                Step::Live { sent, notices } => break (sent, notices),
                Step::Compacted { from, compacted } => {
                    return (Stop::Compacted { from, compacted }, from);
                }
                Step::Chunk { events, through } => {
                    let message = WatchMessage::Events(events);
                    let bytes = message_bytes(&message, self.spec.previous);
                    if self.outbox.send(message, bytes).await.is_err() {
                        return (Stop::Gone, through.saturating_add(1));
                    }
                    let next = through.saturating_add(1);
                    match self.catch_up(next) {
                        Ok(next_step) => step = next_step,
                        Err(stop) => return (stop, next),
                    }
                }
            }
        };
        // Live: every notice is taken at once, so none is held for us.
        let mut ticker =
            tokio::time::interval(self.spec.progress_interval.max(PROGRESS_INTERVAL_MIN));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            let result = tokio::select! {
                notice = notices.recv() => match notice {
                    Ok(notice) => self.deliver(notice, &mut sent),
                    Err(broadcast::error::RecvError::Lagged(behind)) => Err(Stop::Behind { behind }),
                    Err(broadcast::error::RecvError::Closed) => Err(Stop::Gone),
                },
                _ = ticker.tick() => self.progress(&mut notices, &mut sent),
                () = self.outbox.closed() => Err(Stop::Gone),
            };
            if let Err(stop) = result {
                let next = match &stop {
                    Stop::Full { next, .. } => *next,
                    _ => sent.saturating_add(1),
                };
                return (stop, next);
            }
        }
    }

    /// The next step of catching up from `next`, after checking the
    /// watcher's right again if an auth change or its token's expiry
    /// calls for it.
    fn catch_up(&mut self, next: u64) -> Result<Step, Stop> {
        let mut step = Err(Stop::Gone);
        let (spec, rights) = (&self.spec, &mut self.rights);
        (self.lock)(&mut |machine: &StateMachine, hub: &WatchHub| {
            step = recheck(rights, machine, hub).map(|()| catch_up(machine, hub, spec, next));
        });
        step
    }

    /// Queues what `notice` holds for this watcher.
    fn deliver(&mut self, notice: Notice, sent: &mut u64) -> Result<(), Stop> {
        let (revision, events, time, auth) = match notice {
            Notice::Applied {
                revision,
                events,
                time,
                auth,
            } => (revision, events, time, auth),
            Notice::Reset { revision } => return Err(Stop::Reset { revision }),
        };
        if self
            .rights
            .as_ref()
            .is_some_and(|rights| rights.due(auth, time))
        {
            let (lock, rights) = (&self.lock, &mut self.rights);
            let mut checked = Ok(());
            lock(&mut |machine: &StateMachine, hub: &WatchHub| {
                checked = recheck(rights, machine, hub);
            });
            checked?;
        }
        if revision <= *sent {
            return Ok(());
        }
        let matching: Vec<Event> = events
            .iter()
            .filter(|event| self.spec.matches(&event.key))
            .cloned()
            .collect();
        let next = sent.saturating_add(1);
        *sent = revision;
        if matching.is_empty() {
            return Ok(());
        }
        let message = WatchMessage::Events(matching);
        let bytes = message_bytes(&message, self.spec.previous);
        match self.outbox.try_send(message, bytes) {
            Ok(()) => Ok(()),
            Err(Refused::Gone) => Err(Stop::Gone),
            Err(Refused::Full(bound)) => Err(Stop::Full { bound, next }),
        }
    }

    /// The ticker: notices up to the applied index now were sent before it
    /// was read (under the same lock), so once they are taken the watcher
    /// has heard of everything up to it; it is told so.
    fn progress(
        &mut self,
        notices: &mut broadcast::Receiver<Notice>,
        sent: &mut u64,
    ) -> Result<(), Stop> {
        let mut now = 0;
        let mut checked = Ok(());
        let (lock, rights) = (&self.lock, &mut self.rights);
        lock(&mut |machine: &StateMachine, hub: &WatchHub| {
            now = machine.last_applied().map_or(0, |index| index.0);
            checked = recheck(rights, machine, hub);
        });
        checked?;
        loop {
            match notices.try_recv() {
                Ok(notice) => self.deliver(notice, sent)?,
                Err(broadcast::error::TryRecvError::Empty) => break,
                Err(broadcast::error::TryRecvError::Lagged(behind)) => {
                    return Err(Stop::Behind { behind });
                }
                Err(broadcast::error::TryRecvError::Closed) => return Err(Stop::Gone),
            }
        }
        *sent = (*sent).max(now);
        match self
            .outbox
            .try_send(WatchMessage::Progress(*sent), MESSAGE_OVERHEAD_BYTES)
        {
            Ok(()) => Ok(()),
            Err(Refused::Gone) => Err(Stop::Gone),
            Err(Refused::Full(bound)) => Err(Stop::Full {
                bound,
                next: sent.saturating_add(1),
            }),
        }
    }

    /// Ends the watch: what its queue held unsent is dropped, and the
    /// watcher told why (and from which revision to resume).
    fn finish(self, (stop, next): (Stop, u64)) {
        let label = match &stop {
            Stop::Gone => return,
            Stop::Full { .. } => "unread",
            Stop::Reset { .. } => "reset",
            Stop::Behind { .. } => "behind",
            Stop::Compacted { .. } => "compacted",
            Stop::Denied(_) => "denied",
        };
        metrics::counter!("oncekv_watches_canceled_total", "reason" => label).increment(1);
        // The changes it holds unsent are dropped (what they weigh is
        // freed); the first it did not get is the oldest of them.
        let dropped = self
            .outbox
            .take_where(|message| matches!(message, WatchMessage::Events(_)));
        let next = dropped
            .iter()
            .find_map(|message| match message {
                WatchMessage::Events(events) => events.first().map(|event| event.revision),
                _ => None,
            })
            .map_or(next, |first| first.min(next));
        let message = canceled(stop, next);
        let bytes = message_bytes(&message, false);
        let _ = self.outbox.force(message, bytes);
    }
}

/// Checks `rights` again when the hub's auth count or the cluster time
/// calls for it.
fn recheck(
    rights: &mut Option<Rights>,
    machine: &StateMachine,
    hub: &WatchHub,
) -> Result<(), Stop> {
    match rights {
        Some(rights) if rights.due(hub.auth, machine.cluster_time()) => {
            rights.check(machine, hub.auth).map_err(Stop::Denied)
        }
        _ => Ok(()),
    }
}

/// [`start`] for a watch inside the node (the lock and election
/// recipes): no caps but the node's, `rights` checked as for a client's;
/// its messages through a channel. A full node is `Canceled` at once.
pub fn watch<L>(
    lock: L,
    spec: WatchSpec,
    rights: Option<Rights>,
) -> Result<mpsc::Receiver<WatchMessage>, WriteError>
where
    L: Fn(Visit<'_>) + Send + Sync + 'static,
{
    let (sender, messages) = mpsc::channel(INTERNAL_OUTBOX_MESSAGES);
    match start(lock, spec, &WatchOwner::default(), rights) {
        Ok(mut inbox) => {
            tokio::spawn(async move {
                loop {
                    let message = tokio::select! {
                        message = inbox.recv() => message,
                        () = sender.closed() => return,
                    };
                    let Some(message) = message else { return };
                    if sender.send(message).await.is_err() {
                        return;
                    }
                }
            });
        }
        Err(WatchError::Capped(cap)) => {
            let _ = sender.try_send(WatchMessage::Canceled {
                reason: cap.to_string(),
                compacted: 0,
                denied: None,
            });
        }
        Err(WatchError::Refused(error)) => return Err(error),
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_state::{
        AuthCommand, ClusterTime, Command, Entry, Limits, LogIndex, Proposal, Request,
    };

    type Shared = Arc<Mutex<(StateMachine, WatchHub)>>;

    fn shared(limits: Limits, hub: WatchHub) -> Shared {
        Arc::new(Mutex::new((StateMachine::new(limits), hub)))
    }

    fn lock(shared: &Shared) -> impl Fn(Visit<'_>) + Send + Sync + 'static {
        let shared = shared.clone();
        move |f| {
            let guard = shared.lock().expect("not poisoned");
            f(&guard.0, &guard.1)
        }
    }

    fn put_value(shared: &Shared, index: u64, key: &str, value: Vec<u8>) {
        let mut guard = shared.lock().expect("not poisoned");
        let (machine, hub) = &mut *guard;
        let command = Command::Put {
            key: key.as_bytes().to_vec(),
            value: value.into(),
            lease: None,
        };
        machine.apply(&Entry {
            index: LogIndex(index),
            proposal: Proposal {
                time: ClusterTime(0),
                principal: None,
                request: Request::plain(command),
            },
        });
        hub.applied(machine, index);
    }

    fn put(shared: &Shared, index: u64, key: &str) {
        put_value(shared, index, key, b"v".to_vec());
    }

    fn spec(start_revision: u64) -> WatchSpec {
        WatchSpec {
            key: b"k".to_vec(),
            scope: KeyScope::Prefix,
            start_revision,
            previous: false,
            progress_interval: Duration::from_secs(60),
        }
    }

    fn watch_of(shared: &Shared, spec: WatchSpec, owner: &WatchOwner) -> WatchInbox {
        start(lock(shared), spec, owner, None).expect("started")
    }

    /// Every message until the stream ends, or panics after 10 s.
    async fn drain(messages: &mut WatchInbox) -> Vec<WatchMessage> {
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(message) = messages.recv().await {
                all.push(message);
            }
        })
        .await
        .expect("the watch ended");
        all
    }

    /// Lets the spawned watchers run until they wait.
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    /// Lets the spawned watchers run until the node serves `watchers`.
    async fn until_watchers(shared: &Shared, watchers: usize) {
        for _ in 0..10_000 {
            if shared.lock().expect("not poisoned").1.watchers() == watchers {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the node never served {watchers} watchers");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_backlog_then_live_changes_each_once_in_order() {
        let shared = shared(Limits::default(), WatchHub::default());
        put(&shared, 1, "k1");
        put(&shared, 2, "other");
        let mut messages = watch_of(&shared, spec(1), &WatchOwner::default());
        put(&shared, 3, "k2");
        let mut revisions = Vec::new();
        while revisions.len() < 2 {
            match messages.recv().await.expect("a message") {
                WatchMessage::Events(events) => {
                    revisions.extend(events.iter().map(|e| e.revision));
                }
                WatchMessage::Started { revision } => assert_eq!(revision, 0),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(revisions, vec![1, 3]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_long_backlog_is_sent_as_the_reader_reads_each_change_once() {
        let shared = shared(Limits::default(), WatchHub::default());
        // 40 changes of 256 KiB: 10 MiB of history, over the stream's
        // bound, sent as it is read.
        let big = vec![b'x'; 256 * 1024];
        for index in 1..=40 {
            put_value(&shared, index, &format!("k{index}"), big.clone());
        }
        let mut messages = watch_of(&shared, spec(1), &WatchOwner::default());
        let mut revisions = Vec::new();
        let mut index = 40;
        while revisions.len() < 45 {
            match messages.recv().await.expect("a message") {
                WatchMessage::Events(events) => {
                    revisions.extend(events.iter().map(|e| e.revision));
                }
                WatchMessage::Started { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
            if index < 45 {
                index += 1;
                put(&shared, index, "k");
            }
        }
        assert_eq!(revisions, (1..=45).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_reader_that_does_not_read_is_cancelled_at_the_byte_bound_and_freed() {
        let shared = shared(Limits::default(), WatchHub::default());
        let owner = {
            let guard = shared.lock().expect("not poisoned");
            guard.1.owner(Some(Holder::User("u".into())), None)
        };
        let mut idle = watch_of(&shared, spec(0), &owner);
        let mut reader = watch_of(&shared, spec(0), &WatchOwner::default());
        settle().await;
        // 32 changes of 256 KiB (8 MiB): twice the stream's bound.
        let big = vec![b'x'; 256 * 1024];
        let mut read = Vec::new();
        for index in 1..=32 {
            put_value(&shared, index, "k", big.clone());
            settle().await;
            while read.len() < index as usize {
                match reader.recv().await.expect("the reader's watch goes on") {
                    WatchMessage::Events(events) => {
                        read.extend(events.iter().map(|e| e.revision));
                    }
                    WatchMessage::Started { .. } => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        assert_eq!(read, (1..=32).collect::<Vec<_>>(), "the reader got all");
        let user = owner.user.as_ref().expect("a user account");
        let messages = drain(&mut idle).await;
        assert_eq!(user.bytes(), 0, "what it held is freed");
        assert!(matches!(messages[0], WatchMessage::Started { .. }));
        // What the queue held was dropped: only the cancellation is left.
        assert_eq!(messages.len(), 2, "{messages:?}");
        match &messages[1] {
            WatchMessage::Canceled {
                reason,
                compacted,
                denied,
            } => {
                assert!(reason.contains("bytes per stream"), "{reason}");
                assert!(
                    reason.contains(&WATCH_STREAM_BYTES_MAX.to_string()),
                    "{reason}"
                );
                assert!(reason.contains("resume from revision 1"), "{reason}");
                assert_eq!((*compacted, denied), (0, &None));
            }
            other => panic!("expected a cancellation, got {other:?}"),
        }
        until_watchers(&shared, 1).await;
    }

    #[test]
    fn the_default_bounds_are_a_quarter_per_user_and_a_tenth_for_admins() {
        let bounds = WatchBounds::default();
        assert_eq!(bounds.watchers_max, 4096);
        assert_eq!(bounds.user_watchers_max(), 1024);
        assert_eq!(bounds.node_watchers_max(true), 4096);
        assert_eq!(bounds.node_watchers_max(false), 4096 - 4096 / 10);
        assert_eq!(bounds.bytes_max, 256 << 20);
        assert_eq!(bounds.user_bytes_max(), 64 << 20);
        assert_eq!(bounds.node_bytes_max(true), 256 << 20);
        assert_eq!(bounds.node_bytes_max(false), (256 << 20) - (256 << 20) / 10);
        assert_eq!(WatchHub::default().bounds(), bounds);
    }

    #[test]
    fn the_users_share_and_the_reserve_follow_the_quotas() {
        let bounds = WatchBounds {
            watchers_max: 10,
            bytes_max: 16 << 20,
            quotas: UserQuotas {
                user_share_percent: 40,
                admin_reserve_percent: 0,
            },
        };
        assert_eq!(bounds.user_watchers_max(), 4);
        assert_eq!(bounds.node_watchers_max(false), 10, "no reserve");
        // 40% of 16 MiB, rounded up.
        assert_eq!(bounds.user_bytes_max(), 6_710_887);
        assert_eq!(bounds.node_bytes_max(false), 16 << 20);
        // A bound that admits anything gives a user at least one.
        let tiny = WatchBounds {
            watchers_max: 1,
            bytes_max: 1,
            quotas: UserQuotas {
                user_share_percent: 1,
                admin_reserve_percent: 90,
            },
        };
        assert_eq!(tiny.user_watchers_max(), 1);
        assert_eq!(tiny.node_watchers_max(false), 1);
        assert_eq!(tiny.user_bytes_max(), 1);
    }

    /// A user's streams together hold its share of the node's bytes
    /// (here half, under 100 bytes a node), each under its stream's own
    /// bound, and the reason says which bound it was, with its number.
    #[test]
    fn a_non_default_share_bounds_a_users_streams_together() {
        let hub = WatchHub::new(WatchBounds {
            watchers_max: 10,
            bytes_max: 100,
            quotas: UserQuotas {
                user_share_percent: 50,
                admin_reserve_percent: 10,
            },
        });
        let user = hub
            .owner(Some(Holder::User("u".into())), None)
            .user
            .expect("an account");
        let (first, _first) = queue::<u32>(40, Some(Arc::clone(&user)));
        let (second, _second) = queue::<u32>(40, Some(Arc::clone(&user)));
        for outbox in [&first, &second] {
            assert_eq!(outbox.try_send(0, 1), Ok(()));
            assert_eq!(outbox.try_send(1, 24), Ok(()));
        }
        // Each stream holds 25 of its 40; the user 50 of its 50.
        let refused = first.try_send(2, 1);
        assert_eq!(
            refused,
            Err(Refused::Full(Bound::User { held: 50, max: 50 }))
        );
        let Err(Refused::Full(bound)) = refused else {
            unreachable!()
        };
        assert!(bound.reason().contains("50 bytes per user"), "{bound:?}");
        // Under the default share, the same streams would go on.
        let default = WatchHub::default()
            .owner(Some(Holder::User("u".into())), None)
            .user
            .expect("an account");
        let (outbox, _inbox) = queue::<u32>(40, Some(default));
        assert_eq!(outbox.try_send(0, 1), Ok(()));
        assert_eq!(outbox.try_send(1, 39), Ok(()));
        assert_eq!(
            outbox.try_send(2, 1),
            Err(Refused::Full(Bound::Stream { held: 40, max: 40 }))
        );
    }

    /// A user holds its share of the node's watchers; another user still
    /// watches.
    #[tokio::test(flavor = "current_thread")]
    async fn a_non_default_share_bounds_a_users_watchers() {
        let bounds = WatchBounds {
            watchers_max: 10,
            bytes_max: WATCH_BYTES_MAX_DEFAULT,
            quotas: UserQuotas {
                user_share_percent: 30,
                admin_reserve_percent: 10,
            },
        };
        let shared = shared(Limits::default(), WatchHub::new(bounds));
        let (alice, bob) = {
            let guard = shared.lock().expect("not poisoned");
            let hub = &guard.1;
            (
                hub.owner(Some(Holder::User("alice".into())), None),
                hub.owner(Some(Holder::User("bob".into())), None),
            )
        };
        let mut held: Vec<_> = (0..3).map(|_| watch_of(&shared, spec(0), &alice)).collect();
        let refused = start(lock(&shared), spec(0), &alice, None).expect_err("over her share");
        let WatchError::Capped(cap) = refused else {
            panic!("{refused:?}")
        };
        assert_eq!((cap.what(), cap.max), ("watchers-per-user", 3));
        assert!(cap.to_string().contains("maximum of 3 watchers"), "{cap}");
        held.push(watch_of(&shared, spec(0), &bob));
        settle().await;
        assert_eq!(shared.lock().expect("not poisoned").1.watchers(), 4);
    }

    #[test]
    fn the_nodes_streams_together_hold_at_most_its_bound_and_admins_keep_a_reserve() {
        let bounds = WatchBounds::default();
        let (user_max, others_max, node_max) = (
            bounds.user_bytes_max(),
            bounds.node_bytes_max(false),
            bounds.node_bytes_max(true),
        );
        let reserve = node_max - others_max;
        let hub = WatchHub::new(bounds);
        let user = |name: &str| {
            hub.owner(Some(Holder::User(name.into())), None)
                .user
                .expect("an account")
        };
        let users: Vec<Arc<Account>> = ["a", "b", "c", "d"].iter().map(|n| user(n)).collect();
        let queues: Vec<_> = users
            .iter()
            .map(|account| queue::<u32>(usize::MAX, Some(Arc::clone(account))))
            .collect();
        // Three users fill their shares; each queue holds one message
        // already, so that the bounds apply.
        for (outbox, _) in &queues[..3] {
            assert_eq!(outbox.try_send(0, 1), Ok(()));
            assert_eq!(outbox.try_send(1, user_max - 1), Ok(()));
        }
        // The fourth, within its own share, reaches the node's bound less
        // the admins' reserve.
        let room = others_max - 3 * user_max;
        let (fourth, _) = &queues[3];
        assert_eq!(fourth.try_send(0, room), Ok(()));
        assert_eq!(
            fourth.try_send(1, 1),
            Err(Refused::Full(Bound::Node {
                held: others_max,
                max: others_max
            }))
        );
        // An admin's stream takes the reserve.
        let admin = user("root");
        admin.admin.store(true, Ordering::Relaxed);
        let (outbox, _inbox) = queue::<u32>(usize::MAX, Some(Arc::clone(&admin)));
        assert_eq!(outbox.try_send(0, 1), Ok(()));
        assert_eq!(outbox.try_send(1, reserve - 1), Ok(()));
        assert_eq!(
            outbox.try_send(2, 1),
            Err(Refused::Full(Bound::Node {
                held: node_max,
                max: node_max
            }))
        );
        // What a stream held is freed with it.
        drop(queues);
        assert_eq!(admin.node_bytes.load(Ordering::Relaxed), reserve);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_queue_holds_its_bound_takes_one_message_when_empty_and_counts_its_user() {
        let account = WatchHub::default().owner(Some(Holder::User("u".into())), None);
        let user = account.user.expect("an account");
        let user_max = WatchBounds::default().user_bytes_max();
        let (outbox, mut inbox) = queue::<u32>(100, Some(Arc::clone(&user)));
        // An empty queue takes a message over the bound.
        assert_eq!(outbox.try_send(1, 150), Ok(()));
        assert_eq!(
            outbox.try_send(2, 1),
            Err(Refused::Full(Bound::Stream {
                held: 150,
                max: 100
            }))
        );
        assert_eq!(user.bytes(), 150);
        assert_eq!(inbox.recv().await, Some(1));
        assert_eq!(user.bytes(), 0);
        assert_eq!(outbox.try_send(3, 60), Ok(()));
        assert_eq!(outbox.try_send(4, 40), Ok(()));
        assert_eq!(
            outbox.try_send(5, 1),
            Err(Refused::Full(Bound::Stream {
                held: 100,
                max: 100
            }))
        );
        assert_eq!(outbox.bytes(), 100);
        // The user's bound counts every stream of the user.
        let (other, _other_inbox) = queue::<u32>(usize::MAX, Some(Arc::clone(&user)));
        assert_eq!(other.try_send(6, user_max - 100), Ok(()));
        assert_eq!(
            other.try_send(7, 1),
            Err(Refused::Full(Bound::User {
                held: user_max,
                max: user_max
            }))
        );
        // Taken out unsent: freed.
        assert_eq!(outbox.take_all(), vec![3, 4]);
        assert_eq!(user.bytes(), user_max - 100);
        drop(_other_inbox);
        assert_eq!(user.bytes(), 0, "a reader gone frees its queue");
        assert_eq!(other.try_send(8, 1), Err(Refused::Gone));
        // A sender waiting for room gets it once the reader reads.
        assert_eq!(outbox.try_send(9, 100), Ok(()));
        {
            let waiting = outbox.send(10, 50);
            tokio::pin!(waiting);
            assert!(
                futures_util::poll!(waiting.as_mut()).is_pending(),
                "no room yet"
            );
            assert_eq!(inbox.recv().await, Some(9));
            assert_eq!(waiting.await, Ok(()));
        }
        drop(outbox);
        assert_eq!(inbox.recv().await, Some(10));
        assert_eq!(inbox.recv().await, None, "every sender gone");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_watcher_that_falls_behind_is_cancelled_not_buffered() {
        let shared = shared(Limits::default(), WatchHub::with_capacity(4));
        let mut messages = watch_of(&shared, spec(0), &WatchOwner::default());
        // The watcher subscribed at its start; ten changes before its task
        // runs at all: it is more than the hub's four notices behind.
        for index in 1..=10 {
            put(&shared, index, &format!("k{index}"));
        }
        let last = drain(&mut messages).await.pop();
        match last {
            Some(WatchMessage::Canceled {
                reason, compacted, ..
            }) => {
                assert!(reason.contains("too slow"), "{reason}");
                assert!(reason.contains("resume from revision 1"), "{reason}");
                assert_eq!(compacted, 0);
            }
            other => panic!("expected a cancellation, got {other:?}"),
        }
    }

    /// While authentication is enforced, the node's last tenth of
    /// watchers is kept for admins.
    #[tokio::test(flavor = "current_thread")]
    async fn the_node_keeps_a_reserve_of_watchers_for_admins() {
        let shared = shared(Limits::default(), WatchHub::default());
        let (alice, root) = {
            let mut guard = shared.lock().expect("not poisoned");
            let (machine, hub) = &mut *guard;
            let changes = [
                AuthCommand::UserAdd {
                    name: "root".into(),
                    password_hash: None,
                },
                AuthCommand::UserGrantRole {
                    user: "root".into(),
                    role: oncekv_state::ADMIN_ROLE.into(),
                },
                AuthCommand::UserAdd {
                    name: "alice".into(),
                    password_hash: None,
                },
                AuthCommand::Enable {
                    token_key: oncekv_state::TokenKey([1; 32]),
                },
            ];
            for (i, change) in changes.into_iter().enumerate() {
                machine.apply(&Entry {
                    index: LogIndex(i as u64 + 1),
                    proposal: Proposal {
                        time: ClusterTime(0),
                        principal: None,
                        request: Request::plain(Command::Auth(change)),
                    },
                });
            }
            assert!(machine.auth().is_enabled());
            (
                hub.owner(Some(Holder::User("alice".into())), None),
                hub.owner(Some(Holder::User("root".into())), None),
            )
        };
        let bounds = WatchBounds::default();
        let (users_max, node_max) = (
            bounds.node_watchers_max(false),
            bounds.node_watchers_max(true),
        );
        let mut held: Vec<_> = (0..users_max)
            .map(|_| watch_of(&shared, spec(0), &WatchOwner::default()))
            .collect();
        let refused = start(lock(&shared), spec(0), &alice, None).expect_err("users are full");
        assert!(
            matches!(&refused, WatchError::Capped(cap) if cap.is_node() && cap.max == users_max),
            "{refused:?}"
        );
        held.extend((users_max..node_max).map(|_| watch_of(&shared, spec(0), &root)));
        let refused = start(lock(&shared), spec(0), &root, None).expect_err("node full");
        assert!(
            matches!(&refused, WatchError::Capped(cap) if cap.is_node() && cap.max == node_max),
            "{refused:?}"
        );
        settle().await;
        assert_eq!(held.len(), node_max);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn one_watcher_past_a_cap_is_refused_and_the_others_kept() {
        let shared = shared(Limits::default(), WatchHub::default());
        let (alice, bob, stream) = {
            let guard = shared.lock().expect("not poisoned");
            let hub = &guard.1;
            let alice = hub.owner(Some(Holder::User("alice".into())), None);
            let bob = hub.owner(Some(Holder::User("bob".into())), Some(Holder::Stream(7)));
            let stream = hub.owner(None, Some(Holder::Stream(8)));
            (alice, bob, stream)
        };
        let bounds = WatchBounds::default();
        let (per_user, node_max) = (bounds.user_watchers_max(), bounds.watchers_max);
        let mut held: Vec<_> = (0..per_user)
            .map(|_| watch_of(&shared, spec(0), &alice))
            .collect();
        let refused = start(lock(&shared), spec(0), &alice, None).expect_err("over the cap");
        let WatchError::Capped(cap) = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(cap.what(), "watchers-per-user");
        assert!(cap.to_string().contains("alice"), "{cap}");
        assert!(cap.to_string().contains(&per_user.to_string()), "{cap}");
        // Another user still watches, until its stream's cap.
        held.extend((0..WATCHES_PER_STREAM_MAX).map(|_| watch_of(&shared, spec(0), &bob)));
        let refused = start(lock(&shared), spec(0), &bob, None).expect_err("over the cap");
        assert!(
            matches!(&refused, WatchError::Capped(cap) if cap.what() == "watches-per-stream"),
            "{refused:?}"
        );
        // The node's cap.
        let left = node_max - held.len();
        held.extend((0..left).map(|_| watch_of(&shared, spec(0), &WatchOwner::default())));
        let refused = start(lock(&shared), spec(0), &stream, None).expect_err("node full");
        assert!(
            matches!(&refused, WatchError::Capped(cap) if cap.is_node()),
            "{refused:?}"
        );
        settle().await;
        let watchers = shared.lock().expect("not poisoned").1.watchers();
        assert_eq!(watchers, node_max, "no watcher was dropped");
        for messages in &mut held[..per_user] {
            assert!(matches!(
                messages.recv().await,
                Some(WatchMessage::Started { .. })
            ));
        }
        // A place freed is a place to take.
        held.truncate(per_user - 1);
        until_watchers(&shared, per_user - 1).await;
        let mut admitted = watch_of(&shared, spec(0), &alice);
        assert!(matches!(
            admitted.recv().await,
            Some(WatchMessage::Started { .. })
        ));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_compacted_start_is_refused_with_the_compacted_revision() {
        let limits = Limits {
            history_events_max: 1,
            ..Limits::default()
        };
        let shared = shared(limits, WatchHub::default());
        put(&shared, 1, "k1");
        put(&shared, 2, "k2");
        let mut messages = watch_of(&shared, spec(1), &WatchOwner::default());
        match messages.recv().await {
            Some(WatchMessage::Canceled { compacted, .. }) => assert_eq!(compacted, 1),
            other => panic!("expected compacted, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_watcher_that_loses_the_right_ends_before_the_next_change() {
        let shared = shared(Limits::default(), WatchHub::default());
        let allowed = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let check: Check = {
            let allowed = Arc::clone(&allowed);
            Arc::new(move |_: &StateMachine| {
                if allowed.load(Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err(WriteError::PermissionDenied("revoked".into()))
                }
            })
        };
        let rights = Rights::new(check, None);
        let mut messages =
            start(lock(&shared), spec(0), &WatchOwner::default(), Some(rights)).expect("started");
        put(&shared, 1, "k1");
        loop {
            match messages.recv().await.expect("a message") {
                WatchMessage::Events(events) => {
                    assert_eq!(events[0].revision, 1);
                    break;
                }
                WatchMessage::Started { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        // The right goes, then an auth change is applied (with no change
        // to the keys), then a change of a watched key.
        allowed.store(false, Ordering::Relaxed);
        shared.lock().expect("not poisoned").1.auth_changed();
        put(&shared, 2, "other");
        put(&shared, 3, "k3");
        let messages = drain(&mut messages).await;
        let revisions: Vec<u64> = messages
            .iter()
            .filter_map(|message| match message {
                WatchMessage::Events(events) => Some(events.iter().map(|e| e.revision)),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(revisions, Vec::<u64>::new(), "{messages:?}");
        assert!(
            matches!(
                messages.last(),
                Some(WatchMessage::Canceled {
                    denied: Some(WriteError::PermissionDenied(_)),
                    ..
                })
            ),
            "{messages:?}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_token_past_its_expiry_is_checked_again() {
        let shared = shared(Limits::default(), WatchHub::default());
        let checks = Arc::new(AtomicUsize::new(0));
        let check: Check = {
            let checks = Arc::clone(&checks);
            Arc::new(move |machine: &StateMachine| {
                checks.fetch_add(1, Ordering::Relaxed);
                if machine.cluster_time() > ClusterTime(5) {
                    Err(WriteError::Unauthenticated("expired".into()))
                } else {
                    Ok(())
                }
            })
        };
        let rights = Rights::new(check, Some(ClusterTime(5)));
        let mut messages =
            start(lock(&shared), spec(0), &WatchOwner::default(), Some(rights)).expect("started");
        put(&shared, 1, "k1");
        settle().await;
        assert_eq!(
            checks.load(Ordering::Relaxed),
            1,
            "checked at the start only"
        );
        {
            let mut guard = shared.lock().expect("not poisoned");
            let (machine, hub) = &mut *guard;
            machine.apply(&Entry {
                index: LogIndex(2),
                proposal: Proposal {
                    time: ClusterTime(10),
                    principal: None,
                    request: Request::plain(Command::Tick),
                },
            });
            hub.applied(machine, 2);
        }
        let messages = drain(&mut messages).await;
        assert!(
            matches!(
                messages.last(),
                Some(WatchMessage::Canceled {
                    denied: Some(WriteError::Unauthenticated(_)),
                    ..
                })
            ),
            "{messages:?}"
        );
    }

    fn event(revision: u64) -> Event {
        Event {
            revision,
            time: ClusterTime(0),
            key: b"k".to_vec(),
            value: None,
            previous: None,
        }
    }

    #[test]
    fn history_is_sent_in_messages_up_to_the_applied_index_then_live() {
        let mut machine = StateMachine::new(Limits::default());
        let hub = WatchHub::default();
        for index in 1..=3000u64 {
            let key = if index % 3 == 0 { "other" } else { "k" };
            machine.apply(&Entry {
                index: LogIndex(index),
                proposal: Proposal {
                    time: ClusterTime(0),
                    principal: None,
                    request: Request::plain(Command::Put {
                        key: format!("{key}{index}").into_bytes(),
                        value: b"v".to_vec().into(),
                        lease: None,
                    }),
                },
            });
        }
        let mut next = 1;
        let mut seen = Vec::new();
        loop {
            match catch_up(&machine, &hub, &spec(1), next) {
                Step::Chunk { events, through } => {
                    assert!(events.len() <= EVENTS_PER_MESSAGE, "{}", events.len());
                    assert!(
                        events
                            .iter()
                            .all(|e| (next..=through).contains(&e.revision))
                    );
                    seen.extend(events.iter().map(|e| e.revision));
                    next = through + 1;
                }
                Step::Live { sent, .. } => {
                    assert_eq!(sent, 3000);
                    break;
                }
                Step::Compacted { .. } => panic!("compacted"),
            }
        }
        let matching: Vec<u64> = (1..=3000).filter(|index| index % 3 != 0).collect();
        assert_eq!(seen, matching);
        assert_eq!(event_bytes(&event(1), true), MESSAGE_OVERHEAD_BYTES + 1);
    }
}
