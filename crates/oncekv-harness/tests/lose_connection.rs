//! The client proxy's lost connection ([`ReplyFault::LoseConnection`]):
//! the node answers, the proxy forwards nothing and breaks the client's
//! connection instead. The client's call must end at once with a transport
//! error (not a timeout), for one request and for a batch, over the
//! proxy's own TCP splice (`start`: a reset) and over a transport it is
//! handed (`serve`: the connection dropped); the answers are recorded as
//! dropped after commit; and the client's next call dials again and gets
//! through.

use oncekv_check::record::{Bytes, Event, Op, RequestIdentity};
use oncekv_harness::client_proxy::{ClientProxy, ProxyListener, ReplyFault};
use oncekv_harness::recorder::Recorder;
use oncekv_proto::v1::kv_client::KvClient;
use oncekv_proto::v1::kv_server::{Kv, KvServer};
use oncekv_proto::v1::{
    self, AddMemberRequest, AuthenticateRequest, AuthenticateResponse, ExecuteBatchRequest,
    ExecuteBatchResponse, ExecuteRequest, ExecuteResponse, MembershipResponse, ReadRequest,
    ReadResponse, RemoveMemberRequest, SaveSnapshotChunk, SaveSnapshotRequest, StateDigestRequest,
    StateDigestResponse, StatusRequest, StatusResponse, WatchRequest, WatchResponse,
};
use oncekv_state::{Outcome, Reply};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// Longer than any wait here: a call still running then was not cut short.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the client may take to see its connection fail.
const PROMPTLY: Duration = Duration::from_secs(5);

/// A node that applies every request it is sent (each a PUT, answered
/// `Applied` at the next log index) and counts them.
#[derive(Default)]
struct Node {
    applied: Arc<AtomicU64>,
}

impl Node {
    fn apply(&self) -> ExecuteResponse {
        let index = self.applied.fetch_add(1, Ordering::SeqCst) + 1;
        let outcome = Outcome::Applied(Reply::Put { previous: None });
        ExecuteResponse {
            result: Some(v1::execute_response::Result::Outcome(
                oncekv_proto::convert::outcome_to_wire(&outcome),
            )),
            log_index: index,
        }
    }
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Kv for Node {
    async fn execute(
        &self,
        _: Request<ExecuteRequest>,
    ) -> Result<Response<ExecuteResponse>, Status> {
        Ok(Response::new(self.apply()))
    }

    async fn execute_batch(
        &self,
        request: Request<ExecuteBatchRequest>,
    ) -> Result<Response<ExecuteBatchResponse>, Status> {
        let responses = request
            .into_inner()
            .requests
            .iter()
            .map(|_| self.apply())
            .collect();
        Ok(Response::new(ExecuteBatchResponse { responses }))
    }

    async fn read(&self, _: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        Err(Status::unimplemented("read"))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Err(Status::unimplemented("status"))
    }

    async fn add_member(
        &self,
        _: Request<AddMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        Err(Status::unimplemented("add_member"))
    }

    async fn remove_member(
        &self,
        _: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        Err(Status::unimplemented("remove_member"))
    }

    async fn state_digest(
        &self,
        _: Request<StateDigestRequest>,
    ) -> Result<Response<StateDigestResponse>, Status> {
        Err(Status::unimplemented("state_digest"))
    }

    async fn authenticate(
        &self,
        _: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        Err(Status::unimplemented("authenticate"))
    }

    type SaveSnapshotStream = Stream<SaveSnapshotChunk>;

    async fn save_snapshot(
        &self,
        _: Request<SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        Err(Status::unimplemented("save_snapshot"))
    }

    type WatchStream = Stream<WatchResponse>;

    async fn watch(&self, _: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("watch"))
    }
}

/// Starts a node on a loopback port; returns its address and its count of
/// applied requests.
async fn start_node() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind node");
    let address = listener.local_addr().expect("node address").to_string();
    let node = Node::default();
    let applied = node.applied.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(KvServer::new(node))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (address, applied)
}

/// How the proxy takes its client connections.
#[derive(Clone, Copy, Debug)]
enum Transport {
    /// Its own loopback listener, spliced (`ClientProxy::start`).
    Splice,
    /// Connections handed to it (`ClientProxy::serve`).
    Handed,
}

async fn start_proxy(transport: Transport, upstream: &str, recorder: Arc<Recorder>) -> ClientProxy {
    let hints = Arc::new(HashMap::new());
    match transport {
        Transport::Splice => {
            let listener = ProxyListener::bind().await.expect("bind proxy");
            ClientProxy::start(listener, Some(1), upstream, hints, recorder, 7).expect("proxy")
        }
        Transport::Handed => {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
            let address: SocketAddr = listener.local_addr().expect("proxy address");
            let channel = Endpoint::from_shared(format!("http://{upstream}"))
                .expect("upstream")
                .connect_lazy();
            ClientProxy::serve(
                address,
                TcpListenerStream::new(listener),
                Some(1),
                channel,
                hints,
                recorder,
                7,
            )
        }
    }
}

fn session_request(session: u64, seq: u64) -> ExecuteRequest {
    ExecuteRequest {
        origin: Some(v1::execute_request::Origin::Session(v1::RequestHeader {
            session_id: session,
            secret: vec![0; 16],
            seq,
            first_incomplete: seq,
            attempt: 1,
        })),
        command: Some(v1::Command {
            kind: Some(v1::command::Kind::Put(v1::Put {
                key: format!("key-{seq}").into_bytes(),
                value: b"value".to_vec(),
                lease: None,
            })),
        }),
    }
}

/// Registers the operations of `seqs` on session 1, so the proxy's
/// answers to them are recorded.
fn invoke(recorder: &Recorder, seqs: &[u64]) {
    for seq in seqs {
        recorder.invoke(
            1,
            RequestIdentity::session(1, *seq),
            Op::Put {
                key: Bytes::from(format!("key-{seq}")),
                value: Bytes::from("value"),
            },
        );
    }
}

/// Whether a failed connect (the call never left the client) is in
/// `status`'s sources.
fn never_connected(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Checks that `status` is a connection-level failure, not a timeout.
fn assert_connection_lost(status: &Status) {
    assert_ne!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(!never_connected(status), "{status:?}");
}

/// The attempts recorded for session 1, as (seq, dropped after commit).
fn recorded(recorder: &Recorder) -> Vec<(RequestIdentity, bool)> {
    recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            Event::Response(response) => Some((response.request, response.dropped_after_commit)),
            _ => None,
        })
        .collect()
}

async fn client_of(proxy: &ClientProxy) -> KvClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{}", proxy.address()))
        .expect("proxy endpoint")
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to the proxy");
    KvClient::new(channel)
}

fn timed<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(CALL_TIMEOUT);
    request
}

async fn a_lost_connection_ends_the_call_at_once(transport: Transport, batch: bool) {
    let (node, applied) = start_node().await;
    let recorder = Arc::new(Recorder::new());
    let proxy = start_proxy(transport, &node, recorder.clone()).await;
    let mut client = client_of(&proxy).await;
    let seqs: Vec<u64> = if batch { vec![1, 2, 3] } else { vec![1] };
    invoke(&recorder, &seqs);
    proxy.set_fault(ReplyFault::LoseConnection { probability: 1.0 });

    let call = async {
        if batch {
            let requests = seqs.iter().map(|seq| session_request(1, *seq)).collect();
            client
                .execute_batch(timed(ExecuteBatchRequest { requests }))
                .await
                .map(|_| ())
        } else {
            client
                .execute(timed(session_request(1, 1)))
                .await
                .map(|_| ())
        }
    };
    let status = match tokio::time::timeout(PROMPTLY, call).await {
        Ok(Ok(())) => panic!("{transport:?}: the reply got through a lost connection"),
        Ok(Err(status)) => status,
        Err(_) => panic!("{transport:?}: the call did not end within {PROMPTLY:?}"),
    };
    assert_connection_lost(&status);
    assert_eq!(
        applied.load(Ordering::SeqCst),
        seqs.len() as u64,
        "{transport:?}: the node applied the call"
    );
    assert_eq!(proxy.connections_lost(), 1);
    let answers = recorded(&recorder);
    assert_eq!(answers.len(), seqs.len(), "{answers:?}");
    assert!(
        answers.iter().all(|(_, dropped)| *dropped),
        "{transport:?}: recorded as dropped after commit: {answers:?}"
    );

    // The next call dials again and is answered.
    proxy.set_fault(ReplyFault::None);
    let again = tokio::time::timeout(PROMPTLY, client.execute(timed(session_request(1, 9))))
        .await
        .expect("the next call ends promptly");
    assert!(again.is_ok(), "{transport:?}: {again:?}");
}

#[tokio::test]
async fn a_lost_connection_fails_a_call_through_the_splice() {
    a_lost_connection_ends_the_call_at_once(Transport::Splice, false).await;
}

#[tokio::test]
async fn a_lost_connection_fails_a_batch_through_the_splice() {
    a_lost_connection_ends_the_call_at_once(Transport::Splice, true).await;
}

#[tokio::test]
async fn a_lost_connection_fails_a_call_on_a_handed_transport() {
    a_lost_connection_ends_the_call_at_once(Transport::Handed, false).await;
}

#[tokio::test]
async fn a_lost_connection_fails_a_batch_on_a_handed_transport() {
    a_lost_connection_ends_the_call_at_once(Transport::Handed, true).await;
}

/// Every call on the connection fails with it, promptly: none waits for
/// a reply that can no longer come.
#[tokio::test]
async fn every_call_on_a_lost_connection_fails() {
    let (node, _) = start_node().await;
    let recorder = Arc::new(Recorder::new());
    let proxy = start_proxy(Transport::Splice, &node, recorder.clone()).await;
    let client = client_of(&proxy).await;
    proxy.set_fault(ReplyFault::LoseConnection { probability: 1.0 });
    let calls: Vec<_> = (1..=4)
        .map(|seq| {
            let mut client = client.clone();
            tokio::spawn(async move { client.execute(timed(session_request(1, seq))).await })
        })
        .collect();
    let results = tokio::time::timeout(PROMPTLY, async {
        let mut results = Vec::new();
        for call in calls {
            results.push(call.await.expect("call task"));
        }
        results
    })
    .await
    .expect("every call ends promptly");
    for result in &results {
        match result {
            Ok(response) => panic!("a reply got through: {response:?}"),
            Err(status) => assert_connection_lost(status),
        }
    }
    assert!(proxy.connections_lost() >= 1);
}
