//! Peer-link partitions through TCP proxies. Each node advertises a proxy
//! as its peer address, so all Raft traffic to it passes through
//! [`PeerProxy`]; each node makes its outgoing peer connections from a
//! source address of its own (`oncekv serve --peer-source-ip`), so the
//! proxy knows which node is calling. [`Partitions`] holds the pairs of
//! nodes that cannot talk: a proxy refuses new connections between such a
//! pair and cuts the ones open when the partition starts; no byte crosses
//! a cut link once [`Partitions::split`] has returned (each chunk is
//! checked against the partitions as it is written). A proxy stands for
//! a place (an address) rather than a node: when membership changes put
//! another node there ([`PeerProxy::run_as`]), partitions follow the node
//! now behind it, and callers are known by their source address whatever
//! their id.

use oncekv_check::record::NodeId;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

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

/// The pairs of nodes currently cut off from each other.
#[derive(Debug, Clone)]
pub struct Partitions {
    blocked: Arc<watch::Sender<BTreeSet<(NodeId, NodeId)>>>,
}

impl Default for Partitions {
    fn default() -> Self {
        Partitions {
            blocked: Arc::new(watch::channel(BTreeSet::new()).0),
        }
    }
}

fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

impl Partitions {
    /// Cuts every node of `side` off from every node of `other`.
    pub fn split(&self, side: &[NodeId], other: &[NodeId]) {
        let pairs: BTreeSet<_> = side
            .iter()
            .flat_map(|&a| other.iter().map(move |&b| pair(a, b)))
            .filter(|(a, b)| a != b)
            .collect();
        self.blocked.send_replace(pairs);
    }

    /// Heals every partition.
    pub fn heal(&self) {
        self.blocked.send_replace(BTreeSet::new());
    }

    fn is_blocked(blocked: &BTreeSet<(NodeId, NodeId)>, a: NodeId, b: NodeId) -> bool {
        blocked.contains(&pair(a, b))
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

    fn serve(
        listener: TcpListener,
        node: Arc<AtomicU64>,
        upstream: SocketAddr,
        caller_of: impl Fn(IpAddr) -> Option<NodeId> + Send + 'static,
        partitions: Partitions,
    ) {
        tokio::spawn(async move {
            loop {
                let Ok((socket, from)) = listener.accept().await else {
                    continue;
                };
                let caller = caller_of(from.ip());
                let mut blocked = partitions.blocked.subscribe();
                let node = node.clone();
                let cut = move |set: &BTreeSet<_>| {
                    let node = node.load(Ordering::Relaxed);
                    node != 0 && caller.is_some_and(|c| Partitions::is_blocked(set, c, node))
                };
                if cut(&blocked.borrow_and_update()) {
                    let _ = socket.set_zero_linger();
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        let _ = socket.set_zero_linger();
                        return;
                    };
                    // Closed by a partition, a link ends with RST, as a
                    // real cut would show.
                    for stream in [&socket, &server] {
                        let _ = stream.set_nodelay(true);
                        let _ = stream.set_zero_linger();
                    }
                    let mut socket = socket;
                    let (mut client_read, mut client_write) = socket.split();
                    let (mut server_read, mut server_write) = server.split();
                    let mut to_server = vec![0u8; 16 * 1024];
                    let mut to_client = vec![0u8; 16 * 1024];
                    // Each chunk crosses only if the link is not cut at the
                    // moment it is written: once `split` returns, no byte
                    // crosses, however late this task notices the change.
                    loop {
                        tokio::select! {
                            read = client_read.read(&mut to_server) => {
                                let Ok(n @ 1..) = read else { return };
                                if cut(&blocked.borrow())
                                    || server_write.write_all(&to_server[..n]).await.is_err()
                                {
                                    return;
                                }
                            }
                            read = server_read.read(&mut to_client) => {
                                let Ok(n @ 1..) = read else { return };
                                if cut(&blocked.borrow())
                                    || client_write.write_all(&to_client[..n]).await.is_err()
                                {
                                    return;
                                }
                            }
                            changed = blocked.changed() => {
                                if changed.is_err() || cut(&blocked.borrow_and_update()) {
                                    return;
                                }
                            }
                        }
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

    #[tokio::test]
    async fn a_partition_cuts_open_links_and_refuses_new_ones_until_healed() {
        let upstream = echo_server().await;
        let (proxy, listener) = PeerProxy::bind().await.unwrap();
        let partitions = Partitions::default();
        PeerProxy::run(
            listener,
            1,
            upstream,
            Arc::new(vec![1, 2, 3]),
            partitions.clone(),
        );
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
}
