//! The order of a leader's messages to one follower: an `AppendEntries`
//! that carries no entries (it tells the follower that the commit index
//! moved, or probes where the follower's log matches) goes after the
//! tasks already ready to run on this worker. A heartbeat, openraft's
//! stream of one request, goes at once: its stream ends behind it.
//!
//! When an entry commits, openraft applies it and, at the same moment,
//! tells each follower the new commit index in a message of its own. On a
//! node with one worker thread those sends (encoding, HTTP/2, a socket
//! write per follower) ran before the answer to the client whose entry
//! had just committed, on the path of every sequential write. Held back
//! by one turn of the worker's queue, they follow that answer instead;
//! nothing waits on them but the followers' own apply, a few
//! microseconds later. A request that openraft produces meanwhile
//! replaces the held one: it starts where the held one does (an
//! entry-less request advances nothing) and carries the same or a later
//! commit index, so its reply acknowledges both. Dropping an
//! `AppendEntries` is always safe in Raft (messages may be lost); here it
//! loses nothing, and the lease openraft derives from the reply is that
//! of the later request, the more cautious one.

use super::type_config::TypeConfig;
use futures_util::Stream;
use openraft::raft::AppendEntriesRequest;
use std::pin::Pin;
use std::task::{Context, Poll};

/// `requests` with each entry-less request sent once the tasks ready
/// before it have run (see the module doc).
#[derive(Debug)]
pub struct CommitNoticesLast<S> {
    requests: S,
    /// An entry-less request waiting for its turn, and whether this
    /// stream's task has already queued itself behind the ready ones.
    held: Option<(AppendEntriesRequest<TypeConfig>, bool)>,
    ended: bool,
}

impl<S> CommitNoticesLast<S> {
    /// Wraps `requests`, the leader's requests to one follower.
    pub fn new(requests: S) -> Self {
        CommitNoticesLast {
            requests,
            held: None,
            ended: false,
        }
    }
}

impl<S> Stream for CommitNoticesLast<S>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    type Item = AppendEntriesRequest<TypeConfig>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        while !this.ended {
            match Pin::new(&mut this.requests).poll_next(cx) {
                Poll::Ready(Some(request)) if request.entries.is_empty() => {
                    // A newer one replaces what is held, and waits its turn.
                    this.held = Some((request, false));
                }
                Poll::Ready(Some(request)) => {
                    this.held = None;
                    return Poll::Ready(Some(request));
                }
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => {
                    return match this.held.take() {
                        None => Poll::Pending,
                        Some((request, true)) => Poll::Ready(Some(request)),
                        Some((request, false)) => {
                            this.held = Some((request, true));
                            // Woken while it runs, the task is queued
                            // behind those already ready on this worker.
                            cx.waker().wake_by_ref();
                            Poll::Pending
                        }
                    };
                }
            }
        }
        Poll::Ready(this.held.take().map(|(request, _)| request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use openraft::alias::{EntryOf, LogIdOf, VoteOf};
    use openraft::entry::RaftEntry;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    fn log_id(index: u64) -> LogIdOf<TypeConfig> {
        openraft::testing::log_id::<TypeConfig>(1, 1, index)
    }

    /// A request after `prev` carrying `entries` (none: a commit notice)
    /// and the commit index `commit`.
    fn request(prev: u64, entries: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: VoteOf::<TypeConfig>::new_committed(1, 1),
            prev_log_id: Some(log_id(prev)),
            entries: (prev + 1..=prev + entries)
                .map(|index| EntryOf::<TypeConfig>::new_blank(log_id(index)))
                .collect(),
            leader_commit: Some(log_id(commit)),
        }
    }

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// What the tests look at in a request: where it starts, how many
    /// entries it carries, the commit index it tells.
    type Seen = (Option<u64>, usize, Option<u64>);

    struct Polled {
        sender: Option<mpsc::UnboundedSender<AppendEntriesRequest<TypeConfig>>>,
        stream: CommitNoticesLast<UnboundedReceiverStream<AppendEntriesRequest<TypeConfig>>>,
        wakes: Arc<Wakes>,
    }

    impl Polled {
        fn new() -> Self {
            let (sender, receiver) = mpsc::unbounded_channel();
            Polled {
                sender: Some(sender),
                stream: CommitNoticesLast::new(UnboundedReceiverStream::new(receiver)),
                wakes: Arc::default(),
            }
        }

        fn send(&self, request: AppendEntriesRequest<TypeConfig>) {
            let sender = self.sender.as_ref().expect("open");
            sender.send(request).expect("open");
        }

        /// Polls once: the request it yields, `Some(None)` at the end,
        /// `None` while pending.
        fn poll(&mut self) -> Option<Option<Seen>> {
            let waker = Waker::from(Arc::clone(&self.wakes));
            let mut cx = Context::from_waker(&waker);
            match self.stream.poll_next_unpin(&mut cx) {
                Poll::Ready(item) => Some(item.map(|request| {
                    (
                        request.prev_log_id.map(|id| id.index),
                        request.entries.len(),
                        request.leader_commit.map(|id| id.index),
                    )
                })),
                Poll::Pending => None,
            }
        }

        fn wakes(&self) -> usize {
            self.wakes.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn entries_go_at_once_and_a_commit_notice_one_turn_later() {
        let mut polled = Polled::new();
        polled.send(request(0, 2, 0));
        assert_eq!(polled.poll(), Some(Some((Some(0), 2, Some(0)))));
        assert_eq!(polled.poll(), None, "nothing more to send");
        polled.send(request(2, 0, 2));
        let before = polled.wakes();
        assert_eq!(polled.poll(), None, "a commit notice waits a turn");
        assert_eq!(
            polled.wakes() - before,
            1,
            "and queues its task behind the ready ones"
        );
        assert_eq!(polled.poll(), Some(Some((Some(2), 0, Some(2)))));
        let before = polled.wakes();
        assert_eq!(polled.poll(), None);
        assert_eq!(polled.wakes(), before, "no wake-up without a notice held");
    }

    #[test]
    fn a_newer_request_replaces_a_held_notice() {
        let mut polled = Polled::new();
        polled.send(request(2, 0, 1));
        assert_eq!(polled.poll(), None);
        // Entries came meanwhile: they go, carrying the later commit.
        polled.send(request(2, 1, 2));
        assert_eq!(polled.poll(), Some(Some((Some(2), 1, Some(2)))));
        assert_eq!(polled.poll(), None, "the replaced notice is not sent");
        // A newer notice replaces an older one, and waits a turn of its own.
        polled.send(request(3, 0, 2));
        assert_eq!(polled.poll(), None);
        polled.send(request(3, 0, 3));
        assert_eq!(polled.poll(), None);
        assert_eq!(polled.poll(), Some(Some((Some(3), 0, Some(3)))));
        assert_eq!(polled.poll(), None);
    }

    #[test]
    fn a_heartbeat_goes_at_once() {
        let mut polled = Polled::new();
        polled.send(request(5, 0, 5));
        polled.sender = None;
        assert_eq!(polled.poll(), Some(Some((Some(5), 0, Some(5)))));
        assert_eq!(polled.poll(), Some(None));
    }

    #[test]
    fn the_end_of_the_requests_sends_the_held_notice_first() {
        let mut polled = Polled::new();
        polled.send(request(4, 0, 4));
        assert_eq!(polled.poll(), None);
        polled.sender = None;
        assert_eq!(polled.poll(), Some(Some((Some(4), 0, Some(4)))));
        assert_eq!(polled.poll(), Some(None));
    }
}
