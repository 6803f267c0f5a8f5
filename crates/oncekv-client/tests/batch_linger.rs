//! A request queued behind the calls in flight to a node does not wait
//! for one of them to finish: after a short linger it goes as a call of
//! its own, so over a slow link a write waits out a fraction of a round
//! trip, not a whole one.
//!
//! An in-process `Kv` node holds the first write's call until another
//! request reaches it (or 20 s pass). The client sends a write alone only
//! while no call is in flight (`batch_after_calls: 1`), so the writes after
//! the first queue: only the linger can send them while the first is held.

use oncekv_client::{Client, ClientOptions, Outcome, Reply};
use oncekv_proto::convert;
use oncekv_proto::v1::{self, kv_server};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tonic::codegen::tokio_stream;
use tonic::{Request, Response, Status};

/// How long the node holds the first write at most.
const HOLD: Duration = Duration::from_secs(20);

#[derive(Default)]
struct Node {
    /// Requests that arrived, in calls of one or in batches.
    requests: AtomicUsize,
    /// Notified when a request arrives after the first.
    later_arrived: Notify,
    /// Whether the first write was let go by a later request (not by
    /// the end of its hold).
    released_early: std::sync::Mutex<Option<bool>>,
}

impl Node {
    /// Counts `count` arriving requests; the first is held until another
    /// arrives.
    async fn arrive(&self, count: usize) {
        let before = self.requests.fetch_add(count, Ordering::SeqCst);
        if before > 0 {
            self.later_arrived.notify_one();
            return;
        }
        let released = tokio::time::timeout(HOLD, self.later_arrived.notified())
            .await
            .is_ok();
        *self.released_early.lock().expect("lock") = Some(released);
    }
}

fn applied() -> v1::ExecuteResponse {
    v1::ExecuteResponse {
        result: Some(v1::execute_response::Result::Outcome(
            convert::outcome_to_wire(&Outcome::Applied(Reply::Put { previous: None })),
        )),
        log_index: 7,
    }
}

struct Service(Arc<Node>);

type Stream<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send + 'static>>;

fn not_here<T>() -> Result<T, Status> {
    Err(Status::unimplemented("not in this test"))
}

#[tonic::async_trait]
impl kv_server::Kv for Service {
    async fn execute(
        &self,
        _request: Request<v1::ExecuteRequest>,
    ) -> Result<Response<v1::ExecuteResponse>, Status> {
        self.0.arrive(1).await;
        Ok(Response::new(applied()))
    }

    async fn execute_batch(
        &self,
        request: Request<v1::ExecuteBatchRequest>,
    ) -> Result<Response<v1::ExecuteBatchResponse>, Status> {
        let count = request.get_ref().requests.len();
        self.0.arrive(count).await;
        Ok(Response::new(v1::ExecuteBatchResponse {
            responses: (0..count).map(|_| applied()).collect(),
        }))
    }

    async fn read(
        &self,
        _: Request<v1::ReadRequest>,
    ) -> Result<Response<v1::ReadResponse>, Status> {
        not_here()
    }

    async fn status(
        &self,
        _: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        not_here()
    }

    async fn add_member(
        &self,
        _: Request<v1::AddMemberRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        not_here()
    }

    async fn remove_member(
        &self,
        _: Request<v1::RemoveMemberRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        not_here()
    }

    async fn state_digest(
        &self,
        _: Request<v1::StateDigestRequest>,
    ) -> Result<Response<v1::StateDigestResponse>, Status> {
        not_here()
    }

    async fn authenticate(
        &self,
        _: Request<v1::AuthenticateRequest>,
    ) -> Result<Response<v1::AuthenticateResponse>, Status> {
        not_here()
    }

    type SaveSnapshotStream = Stream<v1::SaveSnapshotChunk>;

    async fn save_snapshot(
        &self,
        _: Request<v1::SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        not_here()
    }

    type WatchStream = Stream<v1::WatchResponse>;

    async fn watch(
        &self,
        _: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        not_here()
    }
}

#[tokio::test]
async fn writes_queued_behind_a_held_call_go_before_it_finishes() {
    let node = Arc::new(Node::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    let address = listener.local_addr().expect("its address").to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(kv_server::KvServer::new(Service(Arc::clone(&node))))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let options = ClientOptions {
        batch_after_calls: 1,
        attempt_timeout: HOLD * 2,
        ..ClientOptions::default()
    }
    .with_deadline(HOLD * 3);
    let client = Client::connect([address], options).expect("a client");

    let first = tokio::spawn({
        let client = client.clone();
        async move { client.put("first", "v").await }
    });
    // The first write is in flight (held) before the others are sent.
    tokio::time::timeout(HOLD, async {
        while node.requests.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the first write reaches the node");
    let (second, third) = tokio::join!(client.put("second", "v"), client.put("third", "v"));
    second.expect("the second write");
    third.expect("the third write");
    first
        .await
        .expect("the first write's task")
        .expect("the first write");
    assert_eq!(
        *node.released_early.lock().expect("lock"),
        Some(true),
        "the queued writes reached the node while the first was held"
    );
    assert_eq!(node.requests.load(Ordering::SeqCst), 3);
}
