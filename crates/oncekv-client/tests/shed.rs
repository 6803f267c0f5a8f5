//! A call or a watch start that a node sheds (RESOURCE_EXHAUSTED with the
//! overloaded metadata: turned away unhandled) is tried again on the same
//! node, over the same connection, after a pause: never moved to the next
//! endpoint, whose connection and role (a follower after a leader) differ.
//!
//! Two in-process `Kv` nodes on free loopback ports: the first sheds the
//! first calls of each method, then answers; the second answers anything
//! but must never be asked. A watch start that a node keeps shedding (a
//! node at its cap on watchers) goes to the next node after
//! [`SHEDS_BEFORE_ANOTHER_NODE`] in a row.

use oncekv_client::{
    Backoff, Client, ClientOptions, KeyMeta, Outcome, Reply, WatchOptions, WatchUpdate,
};
use oncekv_proto::convert;
use oncekv_proto::v1::{self, kv_server};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::codegen::tokio_stream::{self, StreamExt as _};
use tonic::{Request, Response, Status};

/// How many calls of each method the shedding node turns away first.
const SHED: usize = 3;

/// Sheds in a row after which a watch goes to another node (the
/// client's own constant).
const SHEDS_BEFORE_ANOTHER_NODE: usize = 8;

/// A node that sheds the first `shed` calls of each method and records
/// every call with the connection it came on.
#[derive(Default)]
struct Node {
    shed: usize,
    calls: Mutex<Vec<(&'static str, Option<SocketAddr>)>>,
}

impl Node {
    /// Records a call of `method`; `Err` (shed) for the first `shed`.
    fn arrive<T>(&self, method: &'static str, request: &Request<T>) -> Result<(), Status> {
        let mut calls = self.calls.lock().expect("calls");
        calls.push((method, request.remote_addr()));
        let seen = calls.iter().filter(|(m, _)| *m == method).count();
        if seen <= self.shed {
            let mut status = Status::resource_exhausted("server overloaded");
            status.metadata_mut().insert(
                oncekv_proto::OVERLOADED_METADATA,
                tonic::metadata::MetadataValue::from_static("in-flight"),
            );
            return Err(status);
        }
        Ok(())
    }

    /// The calls of `method`: the connection each came on.
    fn calls_of(&self, method: &str) -> Vec<Option<SocketAddr>> {
        let calls = self.calls.lock().expect("calls");
        calls
            .iter()
            .filter(|(m, _)| *m == method)
            .map(|(_, peer)| *peer)
            .collect()
    }

    fn all_calls(&self) -> Vec<(&'static str, Option<SocketAddr>)> {
        self.calls.lock().expect("calls").clone()
    }
}

struct Service(Arc<Node>);

type Stream<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl kv_server::Kv for Service {
    async fn execute(
        &self,
        request: Request<v1::ExecuteRequest>,
    ) -> Result<Response<v1::ExecuteResponse>, Status> {
        self.0.arrive("execute", &request)?;
        let outcome = Outcome::Applied(Reply::Put { previous: None });
        Ok(Response::new(v1::ExecuteResponse {
            result: Some(v1::execute_response::Result::Outcome(
                convert::outcome_to_wire(&outcome),
            )),
            log_index: 7,
        }))
    }

    async fn execute_batch(
        &self,
        request: Request<v1::ExecuteBatchRequest>,
    ) -> Result<Response<v1::ExecuteBatchResponse>, Status> {
        self.0.arrive("execute_batch", &request)?;
        Err(Status::unimplemented("not in this test"))
    }

    async fn read(
        &self,
        request: Request<v1::ReadRequest>,
    ) -> Result<Response<v1::ReadResponse>, Status> {
        self.0.arrive("read", &request)?;
        let reply = Reply::Get {
            value: Some(b"v".to_vec()),
            meta: Some(KeyMeta::default()),
        };
        Ok(Response::new(v1::ReadResponse {
            result: Some(v1::read_response::Result::Reply(convert::reply_to_wire(
                &reply,
            ))),
            revision: 1,
        }))
    }

    async fn status(
        &self,
        request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        self.0.arrive("status", &request)?;
        Ok(Response::new(v1::StatusResponse {
            id: 1,
            ..v1::StatusResponse::default()
        }))
    }

    async fn add_member(
        &self,
        request: Request<v1::AddMemberRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.0.arrive("add_member", &request)?;
        Err(Status::unimplemented("not in this test"))
    }

    async fn remove_member(
        &self,
        request: Request<v1::RemoveMemberRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.0.arrive("remove_member", &request)?;
        Err(Status::unimplemented("not in this test"))
    }

    async fn state_digest(
        &self,
        request: Request<v1::StateDigestRequest>,
    ) -> Result<Response<v1::StateDigestResponse>, Status> {
        self.0.arrive("state_digest", &request)?;
        Err(Status::unimplemented("not in this test"))
    }

    async fn authenticate(
        &self,
        request: Request<v1::AuthenticateRequest>,
    ) -> Result<Response<v1::AuthenticateResponse>, Status> {
        self.0.arrive("authenticate", &request)?;
        Err(Status::unimplemented("not in this test"))
    }

    type SaveSnapshotStream = Stream<v1::SaveSnapshotChunk>;

    async fn save_snapshot(
        &self,
        request: Request<v1::SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        self.0.arrive("save_snapshot", &request)?;
        Err(Status::unimplemented("not in this test"))
    }

    type WatchStream = Stream<v1::WatchResponse>;

    /// Started after revision 4, then one put at revision 5; then the
    /// stream stays open.
    async fn watch(
        &self,
        request: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        use v1::watch_response::Kind;
        self.0.arrive("watch", &request)?;
        let key = request.into_inner().key;
        let messages = [
            Kind::Started(v1::WatchStarted { revision: 4 }),
            Kind::Events(v1::WatchEvents {
                events: vec![v1::Event {
                    r#type: v1::EventType::Put as i32,
                    key,
                    value: b"v".to_vec(),
                    meta: None,
                    previous: None,
                    revision: 5,
                }],
            }),
        ]
        .map(|kind| Ok(v1::WatchResponse { kind: Some(kind) }));
        let stream = tokio_stream::iter(messages).chain(tokio_stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Serves `node` on a free loopback port; returns its address.
async fn serve(node: Arc<Node>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    let address = listener.local_addr().expect("its address").to_string();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(kv_server::KvServer::new(Service(node)))
            .serve_with_incoming(incoming),
    );
    address
}

/// A shedding node first, an answering one second, and a client of both
/// with short pauses.
async fn cluster() -> (Arc<Node>, Arc<Node>, Client) {
    cluster_shedding(SHED).await
}

/// [`cluster`] whose first node sheds the first `shed` calls of each
/// method.
async fn cluster_shedding(shed: usize) -> (Arc<Node>, Arc<Node>, Client) {
    let shedding = Arc::new(Node {
        shed,
        ..Node::default()
    });
    let other = Arc::new(Node::default());
    let endpoints = [serve(shedding.clone()).await, serve(other.clone()).await];
    let options = ClientOptions {
        backoff: Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(5),
        },
        ..ClientOptions::default()
    }
    .with_deadline(Duration::from_secs(20));
    let client = Client::connect(endpoints, options).expect("a client");
    (shedding, other, client)
}

/// `method` reached the shedding node `SHED + 1` times, all over one
/// connection, and the other node never.
fn retried_in_place(shedding: &Node, other: &Node, method: &str) {
    let calls = shedding.calls_of(method);
    assert_eq!(calls.len(), SHED + 1, "{method}: {calls:?}");
    assert!(calls[0].is_some(), "the peer address is known");
    assert!(
        calls.iter().all(|peer| *peer == calls[0]),
        "{method}: a shed call is retried over the same connection: {calls:?}"
    );
    assert!(
        other.all_calls().is_empty(),
        "{method}: a shed call stays on its node: {:?}",
        other.all_calls()
    );
}

#[tokio::test]
async fn a_shed_read_is_retried_on_the_same_node_and_connection() {
    let (shedding, other, client) = cluster().await;
    let value = client.get("k").await.expect("read after the sheds");
    assert_eq!(value, Some(b"v".to_vec()));
    retried_in_place(&shedding, &other, "read");
}

#[tokio::test]
async fn a_shed_write_is_retried_on_the_same_node_and_connection() {
    let (shedding, other, client) = cluster().await;
    let written = client.put("k", "v").await.expect("written after the sheds");
    assert_eq!((written.value, written.revision), (None, 7));
    retried_in_place(&shedding, &other, "execute");
}

#[tokio::test]
async fn a_shed_status_is_retried_on_the_same_node_and_connection() {
    let (shedding, other, client) = cluster().await;
    let status = client.status(None).await.expect("status after the sheds");
    assert_eq!(status.id, 1);
    retried_in_place(&shedding, &other, "status");
}

#[tokio::test]
async fn a_shed_watch_start_is_retried_on_the_same_node_and_connection() {
    let (shedding, other, client) = cluster().await;
    let mut watcher = client.watch("k", WatchOptions::default());
    let update = tokio::time::timeout(Duration::from_secs(20), watcher.next())
        .await
        .expect("an update in time")
        .expect("the watch starts after the sheds");
    match update {
        WatchUpdate::Changes { revision, events } => {
            assert_eq!(revision, 5);
            assert_eq!(events.len(), 1, "{events:?}");
        }
        other => panic!("expected the change at 5, got {other:?}"),
    }
    assert_eq!(watcher.next_revision(), 6);
    retried_in_place(&shedding, &other, "watch");
}

#[tokio::test]
async fn a_watch_start_a_node_keeps_shedding_goes_to_another_node() {
    let (shedding, other, client) = cluster_shedding(usize::MAX).await;
    let mut watcher = client.watch("k", WatchOptions::default());
    let update = tokio::time::timeout(Duration::from_secs(20), watcher.next())
        .await
        .expect("an update in time")
        .expect("the watch starts on the other node");
    assert!(
        matches!(update, WatchUpdate::Changes { revision: 5, .. }),
        "{update:?}"
    );
    assert_eq!(
        shedding.calls_of("watch").len(),
        SHEDS_BEFORE_ANOTHER_NODE,
        "the full node is tried that many times in a row"
    );
    assert_eq!(other.calls_of("watch").len(), 1);
}
