//! A request delivered to a node whose connection then breaks, or that then
//! dies, is never reported "not applied": a scripted transport lets the
//! node answer a batch and then fails the connection the way a dying node
//! does (the client sees a transport error, after the node applied), and
//! refuses every later connection; the requests must end unknown, a
//! resend that cannot connect must stay unknown, and a resend that gets
//! through must be replayed, not applied again. The same against a real
//! node killed right after it answered, whose restart replays them from
//! disk.

mod support;

use hyper_util::rt::TokioIo;
use oncekv_client::{
    Client, ClientError, ClientOptions, Command, Completed, Connector, EarlierSends, Reply,
    Session, SessionOptions,
};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use support::{Cluster, FAST, exclusive};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// What the scripted transport does, shared by its connections.
#[derive(Debug, Default)]
struct Script {
    /// Calls still to complete before the cut; 0: no cut planned.
    calls_before_cut: AtomicU32,
    /// Whether new connections are refused (before a byte is written).
    refusing: AtomicBool,
}

impl Script {
    /// Lets `calls` more calls complete, then breaks the connection as
    /// the next one's answer arrives, and refuses connections from then on.
    fn cut_after(&self, calls: u32) {
        self.calls_before_cut.store(calls + 1, Ordering::SeqCst);
    }

    /// One call's answer ended; whether this is the one to cut.
    fn call_answered(&self) -> bool {
        let cut = self
            .calls_before_cut
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok_and(|left| left == 1);
        if cut {
            self.refusing.store(true, Ordering::SeqCst);
        }
        cut
    }
}

/// Dials TCP to a node through a [`Scripted`] stream.
#[derive(Debug, Clone, Default)]
struct ScriptedConnector {
    script: Arc<Script>,
}

impl Connector for ScriptedConnector {
    fn channel(&self, address: &str) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("bad address {address:?}: {e}"))?
            .connect_timeout(Duration::from_secs(1));
        let script = Arc::clone(&self.script);
        Ok(
            endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
                let script = Arc::clone(&script);
                async move {
                    if script.refusing.load(Ordering::SeqCst) {
                        return Err(io::Error::new(
                            io::ErrorKind::ConnectionRefused,
                            "the script refuses connections",
                        ));
                    }
                    let host = uri.host().unwrap_or_default().to_string();
                    let port = uri.port_u16().unwrap_or(80);
                    let stream = TcpStream::connect((host.as_str(), port)).await?;
                    Ok::<_, io::Error>(TokioIo::new(Scripted {
                        stream,
                        script,
                        frames: FrameReader::default(),
                        broken: false,
                    }))
                }
            })),
        )
    }
}

/// Follows the HTTP/2 frames a node sends, to see where each call's
/// answer ends: a HEADERS frame with END_STREAM (the trailers, sent after
/// the node handled the call).
#[derive(Debug, Default)]
struct FrameReader {
    header: Vec<u8>,
    payload_left: usize,
}

impl FrameReader {
    /// Reads `bytes`; how many call answers ended in them.
    fn answers_ended(&mut self, mut bytes: &[u8]) -> u32 {
        const HEADERS: u8 = 0x1;
        const END_STREAM: u8 = 0x1;
        let mut ended = 0;
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let skipped = self.payload_left.min(bytes.len());
                self.payload_left -= skipped;
                bytes = &bytes[skipped..];
                continue;
            }
            let wanted = 9 - self.header.len();
            let taken = wanted.min(bytes.len());
            self.header.extend_from_slice(&bytes[..taken]);
            bytes = &bytes[taken..];
            if self.header.len() == 9 {
                let length = usize::from(self.header[0]) << 16
                    | usize::from(self.header[1]) << 8
                    | usize::from(self.header[2]);
                if self.header[3] == HEADERS && self.header[4] & END_STREAM != 0 {
                    ended += 1;
                }
                self.payload_left = length;
                self.header.clear();
            }
        }
        ended
    }
}

/// A TCP stream that breaks, as a dying node's would, when the script's
/// cut comes: the bytes of the cut answer are never handed to the client.
struct Scripted {
    stream: TcpStream,
    script: Arc<Script>,
    frames: FrameReader,
    broken: bool,
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.broken {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let ended = this.frames.answers_ended(&buf.filled()[before..]);
                if (0..ended).any(|_| this.script.call_answered()) {
                    this.broken = true;
                    buf.set_filled(before);
                    return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Scripted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.broken {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        Pin::new(&mut self.stream).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

fn incr() -> Command {
    Command::Incr {
        key: b"n".to_vec(),
        by: 1,
    }
}

/// A client of `cluster` through `connector`, batching behind any call in
/// flight and giving up on a call after a few seconds.
async fn scripted_session(cluster: &Cluster, connector: &ScriptedConnector) -> (Client, Session) {
    let options = ClientOptions {
        deadline: Duration::from_secs(3),
        attempt_timeout: Duration::from_secs(2),
        batch_after_calls: 1,
        connector: Arc::new(connector.clone()),
        ..ClientOptions::default()
    };
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client.clone()).collect();
    let client = Client::connect(endpoints, options).expect("a client");
    let session = client
        .open_session(SessionOptions {
            window: 16,
            keep_alive: false,
            ..SessionOptions::default()
        })
        .await
        .expect("a session");
    (client, session)
}

/// Sends three increments at once (the first alone, the others batched
/// behind it) with the connection cut as the second call's answer
/// arrives; returns each one's sequence number and first result.
async fn three_increments_cut(session: &Session) -> Vec<(u64, Result<Completed, ClientError>)> {
    let first = session.next_seq();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let session = session.clone();
            tokio::spawn(async move { session.execute_completed(incr()).await })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("the task"));
    }
    // Numbers were taken in spawn order or not: each result names its own
    // when unknown, and the answered ones are matched by elimination.
    let mut seqs: Vec<u64> = (first..first + 3).collect();
    let mut named = Vec::new();
    for result in &results {
        if let Err(ClientError::OutcomeUnknown {
            request_id: Some(id),
            ..
        }) = result
        {
            seqs.retain(|seq| *seq != id.seq.0);
            named.push(Some(id.seq.0));
        } else {
            named.push(None);
        }
    }
    results
        .into_iter()
        .zip(named)
        .map(|(result, seq)| (seq.unwrap_or_else(|| seqs.remove(0)), result))
        .collect()
}

/// The unknown ones of `results`, after checking the rest: applied, or
/// never sent (the connection was refused before a byte left).
fn unknown_seqs(results: &[(u64, Result<Completed, ClientError>)]) -> Vec<u64> {
    let mut unknown = Vec::new();
    for (seq, result) in results {
        match result {
            Ok(done) => assert!(!done.replayed, "{done:?}"),
            Err(ClientError::OutcomeUnknown { .. }) => unknown.push(*seq),
            Err(ClientError::Unreachable(_)) => {}
            Err(other) => panic!("seq {seq}: {other}"),
        }
    }
    assert!(
        !unknown.is_empty(),
        "the cut answer's requests must end unknown: {results:?}"
    );
    unknown
}

/// Resends each of `unknown` to a cluster that cannot be reached, saying
/// an earlier send may have been delivered: each must stay unknown.
async fn resends_stay_unknown(session: &Session, unknown: &[u64]) {
    for seq in unknown {
        let resent = session
            .execute_seq(*seq, Some(*seq), incr(), EarlierSends::MaybeDelivered)
            .await;
        assert!(
            matches!(resent, Err(ClientError::OutcomeUnknown { .. })),
            "seq {seq}: a resend that could not connect must stay unknown, got {resent:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_answered_then_cut_off_is_unknown_until_a_resend_gets_through() {
    let _one = exclusive().await;
    let cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let connector = ScriptedConnector::default();
    let (client, session) = scripted_session(&cluster, &connector).await;
    connector.script.cut_after(1);
    let results = three_increments_cut(&session).await;
    let unknown = unknown_seqs(&results);

    // The cluster cannot be reached: a resend knows that an earlier send
    // may have been delivered, so it stays unknown.
    resends_stay_unknown(&session, &unknown).await;

    // Connections work again: every request applied exactly once, and
    // the unknown ones are replayed from their completion records.
    connector.script.refusing.store(false, Ordering::SeqCst);
    // Nothing below the lowest is acknowledged, so every record is kept
    // whatever order the resends go in.
    let lowest = results.iter().map(|(seq, _)| *seq).min();
    for (seq, first) in &results {
        let earlier = if unknown.contains(seq) {
            EarlierSends::MaybeDelivered
        } else {
            EarlierSends::None
        };
        let resent = session
            .execute_seq(*seq, lowest, incr(), earlier)
            .await
            .expect("a resend that gets through is answered");
        let was_sent = !matches!(first, Err(ClientError::Unreachable(_)));
        assert_eq!(
            resent.replayed, was_sent,
            "seq {seq}: {first:?} then {resent:?}"
        );
    }
    assert_eq!(client.get("n").await, Ok(Some(b"3".to_vec())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_answered_by_a_node_killed_right_after_is_unknown_then_replayed() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let connector = ScriptedConnector::default();
    let (client, session) = scripted_session(&cluster, &connector).await;
    connector.script.cut_after(1);
    let results = three_increments_cut(&session).await;
    let unknown = unknown_seqs(&results);

    // The node dies; real connections are refused by its port.
    cluster.node(1).kill();
    connector.script.refusing.store(false, Ordering::SeqCst);
    resends_stay_unknown(&session, &unknown).await;

    // The node restarts from its disk: what it answered was durable.
    cluster.node(1).spawn();
    cluster.leader(Duration::from_secs(15)).await;
    let lowest = results.iter().map(|(seq, _)| *seq).min();
    for seq in &unknown {
        let resent = session
            .execute_seq(*seq, lowest, incr(), EarlierSends::MaybeDelivered)
            .await
            .expect("a resend after the restart is answered");
        assert!(resent.replayed, "seq {seq}: {resent:?}");
        assert!(matches!(resent.reply, Reply::Incr { .. }), "{resent:?}");
    }
    let answered = results.iter().filter(|(_, first)| first.is_ok()).count();
    let applied = (answered + unknown.len()).to_string().into_bytes();
    assert_eq!(client.get("n").await, Ok(Some(applied)));
}
