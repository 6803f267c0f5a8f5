//! Peer-link faults through TCP proxies: partitions, one-way cuts, and
//! each link's delay, jitter and loss. Each node advertises a proxy as
//! its peer address, so all Raft traffic to it passes through
//! [`PeerProxy`], which knows which node is calling by the connection's
//! source address: on loopback each node makes its outgoing peer
//! connections from a source address of its own (`oncekv serve
//! --peer-source-ip`, [`source_ip`]); between hosts of their own
//! ([`crate::netns`]) each node calls from its host's address
//! ([`Hosts`]). A proxy stands for a place (an address) rather than a
//! node: when membership changes put another node there
//! ([`PeerProxy::run_as`]), faults follow the node now behind it.
//!
//! # Cuts
//!
//! [`Partitions`] holds the pairs of nodes that cannot talk: a proxy
//! refuses new connections between such a pair and resets the ones open
//! when the partition starts; no byte crosses a cut link once
//! [`Partitions::split`] has returned (each chunk is checked against the
//! partitions as it is written). It also holds one-way cuts
//! ([`Partitions::cut`]), which are silent, as a path that drops packets
//! is: the bytes a node sends the other are held, unread once the
//! direction's buffer is full (so the sender's TCP window closes), until
//! the cut heals; the other direction flows.
//!
//! # Shaping
//!
//! [`Shaping`] sets each ordered link's (sender node to receiver node)
//! [`LinkShape`]: a one-way delay, a jitter around it (uniform or normal,
//! never below zero) and a loss rate, for every link at once or for one
//! link, changed at any time (a watch: each chunk takes the setting of the
//! moment it is read). A connection's two directions are each shaped by
//! their own link's setting (the caller's link to the node behind the
//! proxy, and back). A TCP proxy cannot drop bytes without breaking the
//! stream, so a lost chunk is what TCP makes of a lost segment: it is
//! released after an extra retransmission timeout
//! ([`RETRANSMISSION_DEFAULT`] unless set). Every chunk (what one read
//! returned, at most [`CHUNK_MAX`] bytes) is stamped with its release
//! time when it is read, never earlier than the chunk before it (the
//! bytes of a connection are never reordered), and written once due: a
//! timer per chunk, no work per byte. Each direction holds at most
//! [`CHUNKS_HELD`] chunks; past that it stops reading, so a slow link
//! pushes back on its sender instead of growing memory. The draws come
//! from a random generator per direction of a connection, seeded from
//! [`Shaping::set_seed`]'s seed, the proxy's upstream port and the
//! connection's number, so a run's choices replay.

use oncekv_check::record::NodeId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The most bytes one read takes from a connection: a chunk.
pub const CHUNK_MAX: usize = 16 * 1024;

/// The chunks each direction of a connection holds at most (read, not yet
/// written): with the one being read and the one being written, a
/// direction holds at most `(CHUNKS_HELD + 2) * CHUNK_MAX` bytes.
pub const CHUNKS_HELD: usize = 64;

/// What a lost chunk waits besides its delay: a retransmission timeout,
/// Linux's least (200 ms).
pub const RETRANSMISSION_DEFAULT: Duration = Duration::from_millis(200);

/// The longest delay, jitter or retransmission timeout a link takes.
pub const SHAPE_DURATION_MAX: Duration = Duration::from_secs(60);

/// The loopback source address node `id` uses for its peer connections:
/// `127.1.H.L` for ids below 65536, then `127.2.H.L` and on (ids a
/// membership change hands out can be large: etcd's MemberAdd numbers a
/// member after the log index).
pub fn source_ip(id: NodeId) -> IpAddr {
    let [_, top, high, low] = u32::try_from(id).unwrap_or(u32::MAX).to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(127, top.saturating_add(1), high, low))
}

/// The node that owns a peer source address, if any.
fn node_of(ip: IpAddr, nodes: &[NodeId]) -> Option<NodeId> {
    nodes.iter().copied().find(|&id| source_ip(id) == ip)
}

/// The node whose source address `ip` is ([`source_ip`]), whatever its
/// id, if it is one.
fn any_node_of(ip: IpAddr) -> Option<NodeId> {
    match ip {
        IpAddr::V4(v4) => match v4.octets() {
            [127, first, high, low] if first >= 1 && (first, high, low) != (1, 0, 0) => {
                Some(NodeId::from(u32::from_be_bytes([0, first - 1, high, low])))
            }
            _ => None,
        },
        IpAddr::V6(_) => None,
    }
}

/// The hosts nodes call from, between hosts of their own: each host's
/// address and the node on it now (0: none), as membership changes put
/// one node after another there.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    by_address: Arc<RwLock<Vec<Host>>>,
}

/// A host's address and the node on it (0: none).
type Host = (IpAddr, Arc<AtomicU64>);

impl Hosts {
    /// The node held by `occupant` calls from `address`.
    pub fn add(&self, address: IpAddr, occupant: Arc<AtomicU64>) {
        let mut hosts = self
            .by_address
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        hosts.retain(|(ip, _)| *ip != address);
        hosts.push((address, occupant));
    }

    /// The node calling from `address` now, if any.
    pub fn node_at(&self, address: IpAddr) -> Option<NodeId> {
        let hosts = self
            .by_address
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let (_, occupant) = hosts.iter().find(|(ip, _)| *ip == address)?;
        Some(occupant.load(Ordering::Relaxed)).filter(|&id| id != 0)
    }
}

/// The cuts of the moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Cuts {
    /// Pairs (lower id first) whose connections are reset and refused.
    reset: BTreeSet<(NodeId, NodeId)>,
    /// One-way cuts, as (from, to): what `from` sends `to` is held.
    held: BTreeSet<(NodeId, NodeId)>,
}

fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

impl Cuts {
    fn resets(&self, (from, to): Ends) -> bool {
        matches!((from, to), (Some(a), Some(b)) if self.reset.contains(&pair(a, b)))
    }

    fn holds(&self, (from, to): Ends) -> bool {
        matches!((from, to), (Some(a), Some(b)) if self.held.contains(&(a, b)))
    }
}

/// The faults of the peer links the proxies carry: the cuts between
/// nodes, and each link's shaping ([`Partitions::shaping`]).
#[derive(Debug, Clone)]
pub struct Partitions {
    cuts: Arc<watch::Sender<Cuts>>,
    shaping: Shaping,
}

impl Default for Partitions {
    fn default() -> Self {
        Partitions {
            cuts: Arc::new(watch::channel(Cuts::default()).0),
            shaping: Shaping::default(),
        }
    }
}

impl Partitions {
    /// Cuts every node of `side` off from every node of `other`, both
    /// ways: their connections are reset, new ones refused (replaces the
    /// split before it).
    pub fn split(&self, side: &[NodeId], other: &[NodeId]) {
        let pairs: BTreeSet<_> = side
            .iter()
            .flat_map(|&a| other.iter().map(move |&b| pair(a, b)))
            .filter(|(a, b)| a != b)
            .collect();
        self.cuts.send_modify(|cuts| cuts.reset = pairs);
    }

    /// Holds what node `from` sends node `to` (one direction, silently)
    /// until [`Partitions::uncut`] or [`Partitions::heal`].
    pub fn cut(&self, from: NodeId, to: NodeId) {
        if from != to {
            self.cuts
                .send_if_modified(|cuts| cuts.held.insert((from, to)));
        }
    }

    /// Lets what `from` sends `to` through again.
    pub fn uncut(&self, from: NodeId, to: NodeId) {
        self.cuts
            .send_if_modified(|cuts| cuts.held.remove(&(from, to)));
    }

    /// Cuts both directions between every node of `side` and every node
    /// of `other`, silently ([`Partitions::cut`]).
    pub fn cut_between(&self, side: &[NodeId], other: &[NodeId]) {
        for &a in side {
            for &b in other {
                self.cut(a, b);
                self.cut(b, a);
            }
        }
    }

    /// The one-way cuts, as (from, to).
    pub fn cuts(&self) -> BTreeSet<(NodeId, NodeId)> {
        self.cuts.borrow().held.clone()
    }

    /// Heals every partition and cut (the shaping stays).
    pub fn heal(&self) {
        self.cuts.send_replace(Cuts::default());
    }

    /// Each link's delay, jitter and loss.
    pub fn shaping(&self) -> &Shaping {
        &self.shaping
    }
}

/// How a link's jitter spreads its delay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Spread {
    /// Uniformly within the jitter either side of the delay.
    #[default]
    Uniform,
    /// Normally, the jitter being the standard deviation.
    Normal,
}

/// A link's setting: a one-way delay, a jitter around it and a loss rate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkShape {
    delay: Duration,
    jitter: Duration,
    spread: Spread,
    loss: f64,
}

/// A [`LinkShape`] that cannot be.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    /// A loss rate outside 0 to 100 percent.
    #[error("a link's loss is a percentage from 0 to 100, not {0}")]
    Loss(f64),
    /// A delay, jitter or retransmission timeout too long.
    #[error("a link's {what} is at most {max:?}, not {value:?}", max = SHAPE_DURATION_MAX)]
    TooLong {
        /// Which setting.
        what: &'static str,
        /// What it was asked to be.
        value: Duration,
    },
}

fn at_most(what: &'static str, value: Duration) -> Result<Duration, ShapeError> {
    if value > SHAPE_DURATION_MAX {
        Err(ShapeError::TooLong { what, value })
    } else {
        Ok(value)
    }
}

impl LinkShape {
    /// A link that delays each chunk by `delay`, give or take `jitter`
    /// (spread as `spread`), and loses `loss_percent` percent of them (each
    /// released a retransmission timeout late).
    pub fn new(
        delay: Duration,
        jitter: Duration,
        spread: Spread,
        loss_percent: f64,
    ) -> Result<LinkShape, ShapeError> {
        if !(0.0..=100.0).contains(&loss_percent) {
            return Err(ShapeError::Loss(loss_percent));
        }
        Ok(LinkShape {
            delay: at_most("delay", delay)?,
            jitter: at_most("jitter", jitter)?,
            spread,
            loss: loss_percent / 100.0,
        })
    }

    /// A link that only delays, by exactly `delay`.
    pub fn delay(delay: Duration) -> Result<LinkShape, ShapeError> {
        LinkShape::new(delay, Duration::ZERO, Spread::Uniform, 0.0)
    }

    /// Its one-way delay.
    pub fn one_way_delay(&self) -> Duration {
        self.delay
    }

    /// Its jitter.
    pub fn jitter(&self) -> Duration {
        self.jitter
    }

    /// Its loss, in percent.
    pub fn loss_percent(&self) -> f64 {
        self.loss * 100.0
    }

    /// Whether it leaves the link as it is.
    pub fn is_none(&self) -> bool {
        self.delay.is_zero() && self.jitter.is_zero() && self.loss <= 0.0
    }

    /// How long a chunk read now waits: the delay moved by the jitter
    /// (never below zero), plus `retransmission` if the chunk is lost.
    fn draw(&self, rng: &mut StdRng, retransmission: Duration) -> Duration {
        let mut wait = self.delay;
        if !self.jitter.is_zero() {
            let spread = match self.spread {
                Spread::Uniform => rng.random_range(-1.0..=1.0),
                Spread::Normal => standard_normal(rng),
            };
            let seconds = self.delay.as_secs_f64() + spread * self.jitter.as_secs_f64();
            wait = Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(self.delay);
        }
        if self.loss > 0.0 && rng.random::<f64>() < self.loss {
            wait = wait.saturating_add(retransmission);
        }
        wait
    }
}

/// A draw of the standard normal distribution (Box-Muller).
fn standard_normal(rng: &mut StdRng) -> f64 {
    // In (0, 1]: the logarithm is finite.
    let u = 1.0 - rng.random::<f64>();
    let v: f64 = rng.random();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// Every link's shaping of the moment.
#[derive(Debug, Clone, PartialEq)]
struct ShapingTable {
    /// Every link's, unless it has one of its own.
    all: LinkShape,
    /// Links with one of their own, as (from, to).
    links: BTreeMap<(NodeId, NodeId), LinkShape>,
    /// What a lost chunk waits besides its delay.
    retransmission: Duration,
    /// Seeds the draws.
    seed: u64,
}

impl Default for ShapingTable {
    fn default() -> Self {
        ShapingTable {
            all: LinkShape::default(),
            links: BTreeMap::new(),
            retransmission: RETRANSMISSION_DEFAULT,
            seed: 0,
        }
    }
}

impl ShapingTable {
    /// The shape of the link from `from` to `to`: its own if both ends are
    /// known and it has one, else every link's.
    fn shape(&self, (from, to): Ends) -> LinkShape {
        match (from, to) {
            (Some(a), Some(b)) => self.links.get(&(a, b)).copied().unwrap_or(self.all),
            _ => self.all,
        }
    }
}

/// Each peer link's delay, jitter and loss, shared by the proxies of a
/// cluster; changes apply to the chunks read after them.
#[derive(Debug, Clone)]
pub struct Shaping {
    table: Arc<watch::Sender<ShapingTable>>,
}

impl Default for Shaping {
    fn default() -> Self {
        Shaping {
            table: Arc::new(watch::channel(ShapingTable::default()).0),
        }
    }
}

impl Shaping {
    /// Every link (but those with a setting of their own) is `shape`.
    pub fn set_all(&self, shape: LinkShape) {
        self.table.send_modify(|table| table.all = shape);
    }

    /// The link from `from` to `to` is `shape`, whatever every link's.
    pub fn set_link(&self, from: NodeId, to: NodeId, shape: LinkShape) {
        self.table.send_modify(|table| {
            table.links.insert((from, to), shape);
        });
    }

    /// The link from `from` to `to` is every link's again.
    pub fn clear_link(&self, from: NodeId, to: NodeId) {
        self.table
            .send_if_modified(|table| table.links.remove(&(from, to)).is_some());
    }

    /// The shape of the link from `from` to `to` now.
    pub fn link(&self, from: NodeId, to: NodeId) -> LinkShape {
        self.table.borrow().shape((Some(from), Some(to)))
    }

    /// Every link's shape (but those with one of their own).
    pub fn all(&self) -> LinkShape {
        self.table.borrow().all
    }

    /// What a lost chunk waits besides its delay (at most
    /// [`SHAPE_DURATION_MAX`]).
    pub fn set_retransmission(&self, timeout: Duration) -> Result<(), ShapeError> {
        let timeout = at_most("retransmission timeout", timeout)?;
        self.table
            .send_modify(|table| table.retransmission = timeout);
        Ok(())
    }

    /// Seeds the draws of the connections opened from now on.
    pub fn set_seed(&self, seed: u64) {
        self.table.send_modify(|table| table.seed = seed);
    }
}

/// A link's ends, as (from, to); `None`: not a known node.
type Ends = (Option<NodeId>, Option<NodeId>);

/// Mixes `values` into a seed (SplitMix64's finalizer, folded).
fn mix(values: &[u64]) -> u64 {
    values.iter().fold(0x9e37_79b9_7f4a_7c15, |state, &value| {
        let mut z = (state ^ value).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// What one direction of a connection carries its bytes by.
struct Carrier {
    shaping: watch::Receiver<ShapingTable>,
    cuts: watch::Receiver<Cuts>,
    rng: StdRng,
}

impl Carrier {
    fn new(partitions: &Partitions, seed: &[u64]) -> Carrier {
        let shaping = partitions.shaping.table.subscribe();
        let table_seed = shaping.borrow().seed;
        let mut values = vec![table_seed];
        values.extend_from_slice(seed);
        Carrier {
            shaping,
            cuts: partitions.cuts.subscribe(),
            rng: StdRng::seed_from_u64(mix(&values)),
        }
    }

    /// Carries bytes from `read` to `write` on the link `ends()` names at
    /// each moment, until `read` ends (once what it sent is written), a
    /// write fails or a partition resets the link.
    async fn carry<R, W>(self, read: R, write: W, ends: impl Fn() -> Ends)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let Carrier {
            shaping,
            cuts,
            mut rng,
        } = self;
        let (chunks, due) = mpsc::channel(CHUNKS_HELD);
        let ends = &ends;
        // Reading stops at the end of `read`, which closes `chunks`: the
        // writer drains them, then the direction ends.
        let reading = async move {
            pump(read, chunks, &shaping, &mut rng, ends).await;
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = release(write, due, cuts, ends) => {}
            () = reading => {}
        }
    }
}

/// Reads chunks from `read`, stamps each with its release time and queues
/// it, waiting for room: the queue's bound is the backpressure.
async fn pump<R: AsyncRead + Unpin>(
    mut read: R,
    chunks: mpsc::Sender<(Instant, Vec<u8>)>,
    shaping: &watch::Receiver<ShapingTable>,
    rng: &mut StdRng,
    ends: &impl Fn() -> Ends,
) {
    let mut buffer = vec![0u8; CHUNK_MAX];
    let mut last = Instant::now();
    loop {
        let Ok(read @ 1..) = read.read(&mut buffer).await else {
            return;
        };
        let now = Instant::now();
        let wait = {
            let table = shaping.borrow();
            table.shape(ends()).draw(rng, table.retransmission)
        };
        // Never before the chunk ahead of it.
        let due = now.checked_add(wait).unwrap_or(last).max(last);
        last = due;
        if chunks.send((due, buffer[..read].to_vec())).await.is_err() {
            return;
        }
    }
}

/// Writes each queued chunk to `write` once due and once no cut holds its
/// link; ends when the queue ends, a write fails or the link is reset.
async fn release<W: AsyncWrite + Unpin>(
    mut write: W,
    mut due: mpsc::Receiver<(Instant, Vec<u8>)>,
    mut cuts: watch::Receiver<Cuts>,
    ends: &impl Fn() -> Ends,
) {
    while let Some((at, bytes)) = due.recv().await {
        if at > Instant::now() {
            tokio::time::sleep_until(at).await;
        }
        // Checked as the chunk is written: once a cut is made, no byte
        // crosses it, however long the chunk waited.
        loop {
            {
                let now = cuts.borrow_and_update();
                if now.resets(ends()) {
                    return;
                }
                if !now.holds(ends()) {
                    break;
                }
            }
            if cuts.changed().await.is_err() {
                return;
            }
        }
        if write.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

/// A proxy in front of one node's peer port.
#[derive(Debug)]
pub struct PeerProxy {
    address: SocketAddr,
}

impl PeerProxy {
    /// Binds a free loopback port; call [`PeerProxy::run`] once the node's
    /// real peer address is known.
    pub async fn bind() -> std::io::Result<(PeerProxy, TcpListener)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        Ok((PeerProxy { address }, listener))
    }

    /// Where other nodes reach this node.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Forwards connections for node `node` to `upstream` until the runtime
    /// stops, honouring `partitions` between the `nodes`.
    pub fn run(
        listener: TcpListener,
        node: NodeId,
        upstream: SocketAddr,
        nodes: Arc<Vec<NodeId>>,
        partitions: Partitions,
    ) {
        let caller = move |ip: IpAddr| node_of(ip, &nodes);
        PeerProxy::serve(
            listener,
            Arc::new(AtomicU64::new(node)),
            upstream,
            caller,
            partitions,
        );
    }

    /// As [`PeerProxy::run`], for whichever node `node` holds at the time
    /// (0: none), as membership changes put one node after another at
    /// `upstream`; any node calling from its [`source_ip`] is known.
    pub fn run_as(
        listener: TcpListener,
        node: Arc<AtomicU64>,
        upstream: SocketAddr,
        partitions: Partitions,
    ) {
        PeerProxy::serve(listener, node, upstream, any_node_of, partitions);
    }

    /// As [`PeerProxy::run_as`], between hosts of their own: a caller is
    /// the node on the host whose address it calls from ([`Hosts`]).
    pub fn run_between_hosts(
        listener: TcpListener,
        node: Arc<AtomicU64>,
        upstream: SocketAddr,
        hosts: Hosts,
        partitions: Partitions,
    ) {
        let caller = move |ip: IpAddr| hosts.node_at(ip);
        PeerProxy::serve(listener, node, upstream, caller, partitions);
    }

    fn serve(
        listener: TcpListener,
        node: Arc<AtomicU64>,
        upstream: SocketAddr,
        caller_of: impl Fn(IpAddr) -> Option<NodeId> + Send + 'static,
        partitions: Partitions,
    ) {
        tokio::spawn(async move {
            let mut connections = 0u64;
            loop {
                let Ok((socket, from)) = listener.accept().await else {
                    continue;
                };
                connections = connections.wrapping_add(1);
                let caller = caller_of(from.ip());
                let node = node.clone();
                let behind = move || Some(node.load(Ordering::Relaxed)).filter(|&id| id != 0);
                let mut resets = partitions.cuts.subscribe();
                if resets.borrow_and_update().resets((caller, behind())) {
                    let _ = socket.set_zero_linger();
                    continue;
                }
                let seed = [u64::from(upstream.port()), connections];
                let inbound = Carrier::new(&partitions, &[seed[0], seed[1], 0]);
                let outbound = Carrier::new(&partitions, &[seed[0], seed[1], 1]);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        let _ = socket.set_zero_linger();
                        return;
                    };
                    // Closed by a partition, a link ends with RST, as a
                    // real cut would show.
                    for stream in [&socket, &server] {
                        let _ = stream.set_nodelay(true);
                        let _ = stream.set_zero_linger();
                    }
                    let (client_read, client_write) = socket.into_split();
                    let (server_read, server_write) = server.into_split();
                    let toward = || (caller, behind());
                    let back = || (behind(), caller);
                    tokio::select! {
                        () = inbound.carry(client_read, server_write, toward) => {}
                        () = outbound.carry(server_read, client_write, back) => {}
                        () = async {
                            while resets.changed().await.is_ok() {
                                if resets.borrow_and_update().resets(toward()) {
                                    return;
                                }
                            }
                        } => {}
                    }
                });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn source_addresses_are_loopback_and_distinct() {
        let ips: BTreeSet<_> = (1..=5).map(source_ip).collect();
        assert_eq!(ips.len(), 5);
        assert!(ips.iter().all(IpAddr::is_loopback));
        assert_eq!(node_of(source_ip(3), &[1, 2, 3]), Some(3));
        assert_eq!(node_of("127.0.0.1".parse().unwrap(), &[1, 2, 3]), None);
        for id in [1, 2345, 70_000, 1_000_000] {
            assert_eq!(any_node_of(source_ip(id)), Some(id));
        }
        assert_eq!(any_node_of("127.0.0.1".parse().unwrap()), None);
        assert_eq!(any_node_of("127.1.0.0".parse().unwrap()), None);
    }

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        address
    }

    async fn connect_from(id: NodeId, to: SocketAddr) -> std::io::Result<TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(source_ip(id), 0))?;
        socket.connect(to).await
    }

    async fn echoes(stream: &mut TcpStream) -> bool {
        let mut buf = [0u8; 4];
        stream.write_all(b"ping").await.is_ok()
            && matches!(
                tokio::time::timeout(
                    std::time::Duration::from_secs(2),
                    stream.read_exact(&mut buf)
                )
                .await,
                Ok(Ok(_))
            )
    }

    /// A proxy for node 1 (of 1, 2 and 3), in front of an echo server.
    async fn echo_node_1(partitions: &Partitions) -> PeerProxy {
        let upstream = echo_server().await;
        let (proxy, listener) = PeerProxy::bind().await.unwrap();
        PeerProxy::run(
            listener,
            1,
            upstream,
            Arc::new(vec![1, 2, 3]),
            partitions.clone(),
        );
        proxy
    }

    #[tokio::test]
    async fn a_partition_cuts_open_links_and_refuses_new_ones_until_healed() {
        let partitions = Partitions::default();
        let proxy = echo_node_1(&partitions).await;
        let mut from2 = connect_from(2, proxy.address()).await.unwrap();
        let mut from3 = connect_from(3, proxy.address()).await.unwrap();
        assert!(echoes(&mut from2).await && echoes(&mut from3).await);

        partitions.split(&[1], &[2, 3]);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(
            !echoes(&mut from2).await,
            "open link survived the partition"
        );
        let mut again = connect_from(2, proxy.address()).await.unwrap();
        assert!(!echoes(&mut again).await, "new link crossed the partition");

        partitions.heal();
        let mut healed = connect_from(2, proxy.address()).await.unwrap();
        assert!(echoes(&mut healed).await);
    }

    /// A direction of a connection from node 2 to node 1, carried between
    /// in-memory streams: what is written to the first comes out of the
    /// second.
    fn shaped(partitions: &Partitions) -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
        let (sender, proxy_in) = tokio::io::duplex(CHUNK_MAX);
        let (proxy_out, receiver) = tokio::io::duplex(CHUNK_MAX);
        let carrier = Carrier::new(partitions, &[7]);
        tokio::spawn(carrier.carry(proxy_in, proxy_out, || (Some(2), Some(1))));
        (sender, receiver)
    }

    /// Writes `bytes` as a chunk of its own (the proxy reads it before the
    /// next is written).
    async fn send(sender: &mut tokio::io::DuplexStream, bytes: &[u8]) {
        sender.write_all(bytes).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    /// Reads `len` bytes; when they were all there.
    async fn receive(receiver: &mut tokio::io::DuplexStream, len: usize) -> (Vec<u8>, Instant) {
        let mut buf = vec![0u8; len];
        receiver.read_exact(&mut buf).await.unwrap();
        (buf, Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn a_chunk_waits_its_link_s_delay_and_a_lost_one_a_retransmission_more() {
        let partitions = Partitions::default();
        let shaping = partitions.shaping();
        shaping.set_link(2, 1, LinkShape::delay(Duration::from_millis(50)).unwrap());
        // Another link's setting is not this one's.
        shaping.set_link(1, 2, LinkShape::delay(Duration::from_secs(5)).unwrap());
        let (mut sender, mut receiver) = shaped(&partitions);
        let sent = Instant::now();
        sender.write_all(b"ping").await.unwrap();
        let (bytes, at) = receive(&mut receiver, 4).await;
        assert_eq!(bytes, b"ping");
        assert!(at - sent >= Duration::from_millis(50), "{:?}", at - sent);
        assert!(at - sent < Duration::from_millis(60), "{:?}", at - sent);

        let lossy = LinkShape::new(
            Duration::from_millis(10),
            Duration::ZERO,
            Spread::Uniform,
            100.0,
        );
        shaping.set_link(2, 1, lossy.unwrap());
        shaping
            .set_retransmission(Duration::from_millis(300))
            .unwrap();
        let sent = Instant::now();
        sender.write_all(b"lost").await.unwrap();
        let (bytes, at) = receive(&mut receiver, 4).await;
        assert_eq!(bytes, b"lost");
        assert!(at - sent >= Duration::from_millis(310), "{:?}", at - sent);
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_never_reorders_the_bytes_of_a_connection() {
        let partitions = Partitions::default();
        let jittery = LinkShape::new(
            Duration::from_millis(20),
            Duration::from_millis(20),
            Spread::Normal,
            30.0,
        );
        partitions.shaping().set_all(jittery.unwrap());
        let (mut sender, mut receiver) = shaped(&partitions);
        let sent = Instant::now();
        let chunks: Vec<u8> = (0..100).collect();
        for chunk in &chunks {
            send(&mut sender, &[*chunk]).await;
        }
        let (bytes, at) = receive(&mut receiver, chunks.len()).await;
        assert_eq!(bytes, chunks, "in order");
        assert!(at - sent >= Duration::from_millis(100), "{:?}", at - sent);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_applies_to_the_chunks_read_after_it_never_before_those_ahead() {
        let partitions = Partitions::default();
        let shaping = partitions.shaping();
        shaping.set_all(LinkShape::delay(Duration::from_millis(200)).unwrap());
        let (mut sender, mut receiver) = shaped(&partitions);
        let sent = Instant::now();
        send(&mut sender, b"a").await;
        shaping.set_all(LinkShape::default());
        send(&mut sender, b"b").await;
        // The second waits for the first, though its own delay is none.
        let (bytes, at) = receive(&mut receiver, 2).await;
        assert_eq!(bytes, b"ab");
        assert!(at - sent >= Duration::from_millis(200), "{:?}", at - sent);
        let sent = Instant::now();
        send(&mut sender, b"c").await;
        let (_, at) = receive(&mut receiver, 1).await;
        assert!(at - sent <= Duration::from_millis(1), "{:?}", at - sent);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_link_pushes_back_on_its_sender_with_bounded_buffers() {
        let partitions = Partitions::default();
        partitions
            .shaping()
            .set_all(LinkShape::delay(SHAPE_DURATION_MAX).unwrap());
        let (mut sender, receiver) = shaped(&partitions);
        let piece = vec![7u8; 4096];
        let mut written = 0usize;
        // Nobody reads: the sender stops once the buffers are full.
        while tokio::time::timeout(SHAPE_DURATION_MAX * 3, sender.write_all(&piece))
            .await
            .is_ok()
        {
            written += piece.len();
            assert!(written < 64 * 1024 * 1024, "no backpressure");
        }
        // Two in-memory streams of CHUNK_MAX, and the proxy's own.
        let bound = (CHUNKS_HELD + 2 + 2) * CHUNK_MAX + piece.len();
        assert!(written <= bound, "{written} bytes taken, at most {bound}");
        assert!(written > 2 * CHUNK_MAX, "the proxy held nothing: {written}");
        drop(receiver);
    }

    #[test]
    fn draws_stay_around_the_delay_never_below_zero_and_replay_from_the_seed() {
        let uniform = LinkShape::new(
            Duration::from_millis(10),
            Duration::from_millis(4),
            Spread::Uniform,
            0.0,
        )
        .unwrap();
        let normal = LinkShape::new(
            Duration::from_millis(1),
            Duration::from_millis(10),
            Spread::Normal,
            0.0,
        )
        .unwrap();
        let draws = |shape: LinkShape, seed: u64| -> Vec<Duration> {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..2000)
                .map(|_| shape.draw(&mut rng, RETRANSMISSION_DEFAULT))
                .collect()
        };
        let spread = draws(uniform, 1);
        assert!(
            spread
                .iter()
                .all(|d| (Duration::from_millis(6)..=Duration::from_millis(14)).contains(d))
        );
        assert_eq!(spread, draws(uniform, 1), "a seed replays");
        assert_ne!(spread, draws(uniform, 2));
        let wide = draws(normal, 3);
        // Half the draws would be negative: they are zero instead.
        assert!(wide.iter().filter(|d| d.is_zero()).count() > 500);
        assert!(wide.iter().any(|d| *d > Duration::from_millis(15)));
    }

    #[test]
    fn nonsense_shapes_are_refused() {
        let shape = |loss| LinkShape::new(Duration::ZERO, Duration::ZERO, Spread::Uniform, loss);
        assert_eq!(shape(100.5), Err(ShapeError::Loss(100.5)));
        assert_eq!(shape(-1.0), Err(ShapeError::Loss(-1.0)));
        assert!(shape(f64::NAN).is_err());
        assert!((shape(2.5).unwrap().loss_percent() - 2.5).abs() < 1e-9);
        let long = SHAPE_DURATION_MAX + Duration::from_millis(1);
        assert!(matches!(
            LinkShape::delay(long),
            Err(ShapeError::TooLong { what: "delay", .. })
        ));
        assert!(Shaping::default().set_retransmission(long).is_err());
        assert!(shape(0.0).unwrap().is_none());
    }

    /// How long an echo through the proxy takes, if it comes.
    async fn echo_time(stream: &mut TcpStream) -> Option<Duration> {
        let sent = std::time::Instant::now();
        echoes(stream).await.then(|| sent.elapsed())
    }

    #[tokio::test]
    async fn a_link_s_setting_and_a_one_way_cut_touch_that_link_only() {
        let partitions = Partitions::default();
        let proxy = echo_node_1(&partitions).await;
        let slow = Duration::from_millis(300);
        partitions
            .shaping()
            .set_link(2, 1, LinkShape::delay(slow).unwrap());
        let mut from2 = connect_from(2, proxy.address()).await.unwrap();
        let mut from3 = connect_from(3, proxy.address()).await.unwrap();
        let two = echo_time(&mut from2).await.expect("an echo");
        let three = echo_time(&mut from3).await.expect("an echo");
        assert!(two >= slow, "{two:?}");
        assert!(three < slow, "{three:?}");

        // What 1 sends 3 is held: 3's pings reach 1, the echoes do not
        // come back until the cut heals; 2's link is untouched.
        partitions.cut(1, 3);
        assert_eq!(partitions.cuts(), BTreeSet::from([(1, 3)]));
        from3.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        let held =
            tokio::time::timeout(Duration::from_millis(300), from3.read_exact(&mut buf)).await;
        assert!(held.is_err(), "an echo crossed a cut");
        assert!(echo_time(&mut from2).await.is_some());
        partitions.uncut(1, 3);
        tokio::time::timeout(Duration::from_secs(2), from3.read_exact(&mut buf))
            .await
            .expect("the held echo, once healed")
            .unwrap();
        assert_eq!(&buf, b"ping");
    }
}
