//! [`Batcher`]: the requests ready for one node go out as one
//! `ExecuteBatch` message. A request that finds fewer than
//! [`ClientOptions::batch_after_calls`](crate::ClientOptions) calls in
//! flight to its node goes at once, as an `Execute` call of its own (no
//! added latency when it is alone). Otherwise it queues, and the next call
//! to that node that finishes sends everything queued (at most
//! [`BATCH_REQUESTS_MAX`] requests within the message limit) as one
//! batch. A queued request waits for that at most an eighth of a call's
//! smoothed round trip (at least a millisecond): when no call finished by
//! then, what is queued goes as a batch of its own, an extra call, so over
//! a slow link a request waits out a fraction of a round trip rather than
//! a whole one. The node handles each request of a batch as if it came alone:
//! checked, deduplicated and cached on its own, so a retry may come in
//! another batch than its original. Each request keeps its own attempt
//! timeout; a batch's transport failure is the failure of each request in
//! it. A node that does not know `ExecuteBatch` answers UNIMPLEMENTED
//! (nothing was handled: the requests are retried) and gets one request
//! per call from then on.

use crate::client::{Rpc, lock};
use oncekv_proto::v1;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::Status;

use oncekv_proto::BATCH_REQUESTS_MAX;

/// What one request's call answered.
type Answer = Result<v1::ExecuteResponse, Status>;

/// A request waiting for the next batch to its node.
struct Queued {
    request: v1::ExecuteRequest,
    bytes: usize,
    timeout: Duration,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    in_flight: usize,
    /// Counts the times the queue was emptied: a wait for a finished call
    /// that began before the last emptying is over.
    emptied: u64,
    /// The smoothed duration of a call (`None` before the first).
    call_time: Option<Duration>,
}

/// The shortest time a queued request waits for a call to finish before
/// it goes in a call of its own.
const LINGER_MIN: Duration = Duration::from_millis(1);

impl State {
    /// How long a request queued now waits for a call to finish.
    fn linger(&self) -> Duration {
        self.call_time
            .map_or(LINGER_MIN, |call| (call / 8).max(LINGER_MIN))
    }

    /// Folds a call's duration into the smoothed one (weight 1/8).
    fn observe(&mut self, call: Duration) {
        self.call_time = Some(match self.call_time {
            None => call,
            Some(smoothed) => smoothed.saturating_mul(7).saturating_add(call) / 8,
        });
    }
}

/// The calls to one node: how many are in flight, and what waits for the
/// next batch.
pub(crate) struct Batcher {
    state: Mutex<State>,
    calls_alone: usize,
    bytes_max: usize,
    /// The node answered a batch UNIMPLEMENTED: send one request per call.
    unbatched: Arc<AtomicBool>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("Batcher")
            .field("in_flight", &state.in_flight)
            .field("queued", &state.queue.len())
            .finish()
    }
}

/// Bytes a request adds to a batch message: its own, its field tag and its
/// length prefix.
fn bytes_in_batch(request: &v1::ExecuteRequest) -> usize {
    let bytes = prost::Message::encoded_len(request);
    bytes.saturating_add(1 + prost::length_delimiter_len(bytes))
}

impl Batcher {
    /// Calls to one node: a request goes alone while fewer than
    /// `calls_alone` calls are in flight (at least one), and a batch
    /// message holds at most `bytes_max` bytes.
    pub(crate) fn new(calls_alone: usize, bytes_max: usize) -> Batcher {
        Batcher {
            state: Mutex::new(State::default()),
            calls_alone: calls_alone.max(1),
            bytes_max,
            unbatched: Arc::default(),
        }
    }

    /// Sends `request` through `rpc`, alone or in the next batch, and
    /// waits at most `timeout` for its answer.
    pub(crate) async fn execute(
        self: &Arc<Self>,
        rpc: Rpc,
        request: v1::ExecuteRequest,
        timeout: Duration,
    ) -> Answer {
        let (answer, receiver) = oneshot::channel();
        let queued = Queued {
            bytes: bytes_in_batch(&request),
            request,
            timeout,
            answer,
        };
        let (alone, linger) = {
            let mut state = lock(&self.state);
            if state.in_flight < self.calls_alone {
                state.in_flight += 1;
                (Some(queued), None)
            } else {
                // The first to queue times the wait for a finished call.
                let first = state.queue.is_empty();
                state.queue.push_back(queued);
                (None, first.then(|| (state.linger(), state.emptied)))
            }
        };
        if let Some(queued) = alone {
            // Given back when the call ends, even if the caller stops
            // waiting for it.
            let _slot = Slot {
                batcher: Arc::clone(self),
                rpc: Some(rpc.clone()),
            };
            let started = tokio::time::Instant::now();
            let answer = call_alone(rpc, queued.request, timeout).await;
            lock(&self.state).observe(started.elapsed());
            return answer;
        }
        if let Some((linger, emptied)) = linger {
            self.send_if_still_queued(rpc, linger, emptied);
        }
        match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(answer)) => answer,
            // The batch was dropped with the runtime: it may have left.
            Ok(Err(_)) => Err(Status::unavailable(
                "the call carrying the request was dropped",
            )),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
        }
    }

    /// A call finished: if requests queued meanwhile, a task sends them
    /// (batch after batch while more queue) in place of the finished call.
    fn finished(self: &Arc<Self>, rpc: Rpc) {
        let Some(batch) = self.next_batch() else {
            return;
        };
        self.send_batches(rpc, batch);
    }

    /// After `linger`, unless the queue was emptied since the count
    /// `emptied`, sends what is queued as an extra call (a call slot more
    /// in flight) instead of waiting on for a call to finish.
    fn send_if_still_queued(self: &Arc<Self>, rpc: Rpc, linger: Duration, emptied: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let batcher = Arc::clone(self);
        runtime.spawn(async move {
            tokio::time::sleep(linger).await;
            {
                let mut state = lock(&batcher.state);
                if state.emptied != emptied || state.queue.is_empty() {
                    return;
                }
                state.in_flight += 1;
            }
            if let Some(batch) = batcher.next_batch() {
                batcher.send_batches(rpc, batch);
            }
        });
    }

    /// A task sends `batch`, then the batches that queued meanwhile, one
    /// after another in one call slot, which it gives back when the queue
    /// is empty.
    fn send_batches(self: &Arc<Self>, rpc: Rpc, batch: Vec<Queued>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime left to send on (it is shutting down): the callers
            // learn that their requests were dropped.
            let mut state = lock(&self.state);
            state.in_flight = state.in_flight.saturating_sub(1);
            return;
        };
        let batcher = Arc::clone(self);
        runtime.spawn(async move {
            let mut batch = batch;
            loop {
                let started = tokio::time::Instant::now();
                send_batch(rpc.clone(), batch, &batcher.unbatched).await;
                lock(&batcher.state).observe(started.elapsed());
                match batcher.next_batch() {
                    Some(next) => batch = next,
                    None => return,
                }
            }
        });
    }

    /// Takes the next batch off the queue, skipping requests whose caller
    /// gave up; with nothing queued, the call slot is given back.
    fn next_batch(&self) -> Option<Vec<Queued>> {
        let mut state = lock(&self.state);
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        let most = if self.unbatched.load(Ordering::Relaxed) {
            1
        } else {
            BATCH_REQUESTS_MAX
        };
        while let Some(next) = state.queue.front() {
            if next.answer.is_closed() {
                state.queue.pop_front();
                continue;
            }
            let fits = bytes.saturating_add(next.bytes) <= self.bytes_max;
            if batch.len() >= most || (!batch.is_empty() && !fits) {
                break;
            }
            bytes = bytes.saturating_add(next.bytes);
            batch.extend(state.queue.pop_front());
        }
        if state.queue.is_empty() {
            state.emptied = state.emptied.wrapping_add(1);
        }
        if batch.is_empty() {
            state.in_flight = state.in_flight.saturating_sub(1);
            return None;
        }
        Some(batch)
    }
}

/// A call slot taken by a request sent alone.
struct Slot {
    batcher: Arc<Batcher>,
    rpc: Option<Rpc>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(rpc) = self.rpc.take() {
            self.batcher.finished(rpc);
        }
    }
}

/// One request as a call of its own.
async fn call_alone(mut rpc: Rpc, request: v1::ExecuteRequest, timeout: Duration) -> Answer {
    let mut message = tonic::Request::new(request);
    message.set_timeout(timeout);
    rpc.execute(message).await.map(tonic::Response::into_inner)
}

/// Sends `batch` and hands each caller its answer.
async fn send_batch(mut rpc: Rpc, mut batch: Vec<Queued>, unbatched: &AtomicBool) {
    if batch.len() == 1 {
        if let Some(queued) = batch.pop() {
            let answer = call_alone(rpc, queued.request, queued.timeout).await;
            let _ = queued.answer.send(answer);
        }
        return;
    }
    let timeout = batch.iter().map(|q| q.timeout).max().unwrap_or_default();
    let (requests, waiting): (Vec<_>, Vec<_>) =
        batch.into_iter().map(|q| (q.request, q.answer)).unzip();
    let mut message = tonic::Request::new(v1::ExecuteBatchRequest { requests });
    message.set_timeout(timeout);
    let answers: Vec<Answer> = match rpc.execute_batch(message).await {
        Ok(response) => {
            let responses = response.into_inner().responses;
            if responses.len() == waiting.len() {
                responses.into_iter().map(Ok).collect()
            } else {
                let status = Status::internal(format!(
                    "the node answered {} of {} requests in a batch",
                    responses.len(),
                    waiting.len()
                ));
                vec![Err(status); waiting.len()]
            }
        }
        Err(status) => {
            if status.code() == tonic::Code::Unimplemented {
                unbatched.store(true, Ordering::Relaxed);
            }
            vec![Err(status); waiting.len()]
        }
    };
    for (answer, waiter) in answers.into_iter().zip(waiting) {
        let _ = waiter.send(answer);
    }
}
