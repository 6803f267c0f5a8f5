//! [`KvService`]: maps `Kv` RPCs onto the [`Node`], and the node's answers
//! onto typed responses. Every way a call can fail to be carried out is
//! turned into the one wire `Failure` here ([`KvService::failure`]); a
//! request shed before it was proposed is a gRPC status instead, as load
//! shed by the transport is.
//!
//! # What each answer promises
//!
//! A client takes "not leader", "no leader" and "shed" for *not proposed*
//! (safe to report "not applied", and to send elsewhere), and
//! "unavailable" for *may have been proposed*. So the first three are
//! given only where the node knows nothing reached openraft; wherever it
//! cannot know, the answer is "unavailable".
//!
//! | answer | given when | why it is true |
//! |---|---|---|
//! | `NotLeader` (redirect) / `NoLeader` (no leader known) | `WriteError::NotLeader`: [`Consensus::leading`](crate::raft::consensus::Consensus::leading) found this node not leading, before the request was handed to openraft (`Node::propose`, a whole batch at once; a follower that cannot yet authenticate the caller; a backup; the start of a membership change) | nothing was handed to openraft |
//! | the same | openraft answered `ForwardToLeader` to a write (`client_write_many`, one message for a whole batch) or to `add_learner` | openraft 0.10.0-alpha.37's `RaftCore::write_entries` (and `change_membership`) refuse every entry of the message before `leader_append_entries` gives any a log id; after appending, a lost entry is `LogEntryDiscarded` instead (below) |
//! | `Shed` (`Execute`: RESOURCE_EXHAUSTED with `oncekv-overloaded`; `ExecuteBatch`: `Failure.shed` in that request's place) | `WriteError::Overloaded`: a session open over the node's rate, in `Node::refuse_early` | refused before the request is registered in flight or proposed |
//! | RESOURCE_EXHAUSTED with `oncekv-overloaded: in-flight` or `connections` | the transport's caps ([`crate::transport`]) | the load-shed layer refuses before the service is called; a refused connection is served by a server with no routes |
//! | `Unavailable` | an appended entry discarded by a leader change (`LogEntryDiscarded`); consensus stopping while a request was in flight (shut down, or a failed log write or fsync: the responders are dropped, `Fatal::Stopped`), every request of a batch left unanswered then included; no answer within the propose timeout; the proposer dropping a request's sender; an entry applied without an outcome; consensus already stopped when the request came (`Consensus::leading`: its frozen view of leadership may name this very node); a membership change failing after part of it may be in the log (after the learner's entry, or inside a voter change, whose `ForwardToLeader` may come from its second entry); hashing a user's password failing (before proposing: merely cautious) | it says "may have been proposed", which is never false |
//! | `Invalid`, `Unauthenticated`, `PermissionDenied` | checks before proposing: decoding, `Limits::check_request`, an empty password, credentials, the admin role, a new member failing its TLS probe (`Refused`) | refused before proposing; not retried |
//! | INVALID_ARGUMENT "malformed request message: ... at most 256 requests" | an `ExecuteBatch` message of more requests than the cap: its decoding stops at the first one past it (`oncekv_proto::batch`), before the handler and its credentials | nothing was decoded past the cap, nothing proposed |
//! | RESOURCE_EXHAUSTED "too many failed logins ..., retry after N s" (`Authenticate`) | the user name or the caller's address failed too often lately ([`crate::login_guard`]); with `oncekv-overloaded: logins`, too many logins wait for a password check | refused before the read barrier and the password check |
//!
//! Every request of a batch gets its own answer: refused early at its
//! place, a retry joined to its in-flight twin with what that twin's
//! entry decided (a twin refused as "not leader" was never handed to
//! openraft either), and the rest exactly once each from
//! `Consensus::write_many`, "unavailable" for any left when consensus
//! stops. Reads and logins propose nothing, so their "not leader" is
//! always true.
//!
//! A `Watch` past a cap on watchers ([`crate::watch`]: per connection,
//! per user, per node) is refused RESOURCE_EXHAUSTED naming the cap (the
//! node's with the overloaded metadata: another node may serve it). A
//! running watch whose user loses the right to it ends with the `Failure`
//! a call would get (`Unauthenticated`, `PermissionDenied`); one whose
//! unsent events reach their bound ends `Canceled`, the reason naming the
//! bound and the revision to resume from.

use crate::auth::{Credentials, LoginError};
use crate::login_guard::LoginRefused;
use crate::node::Node;
use crate::raft::consensus::WriteError;
use crate::watch::{
    Holder, PROGRESS_INTERVAL_DEFAULT, WatchCap, WatchError, WatchMessage, WatchSpec,
};
use futures_util::StreamExt;
use oncekv_proto::BATCH_REQUESTS_MAX;
use oncekv_proto::convert::{self, CallFailure, failure_to_wire, outcome_to_wire, reply_to_wire};
use oncekv_proto::v1::kv_server::Kv;
use oncekv_proto::v1::{
    AddMemberRequest, AuthenticateRequest, AuthenticateResponse, ExecuteBatchRequest,
    ExecuteBatchResponse, ExecuteRequest, ExecuteResponse, Failure, Member, Members,
    MembershipResponse, ReadRequest, ReadResponse, RemoveMemberRequest, SaveSnapshotChunk,
    SaveSnapshotRequest, SnapshotInfo, StateDigestRequest, StateDigestResponse, StatusRequest,
    StatusResponse, Token, WatchCanceled, WatchEvents, WatchRequest, WatchResponse, WatchStarted,
    authenticate_response, execute_response, membership_response, read_response,
    save_snapshot_chunk, watch_response,
};
use std::time::Duration;
use tonic::{Request, Response, Status};

/// The client service of one node.
#[derive(Clone, Debug)]
pub struct KvService {
    node: Node,
}

impl KvService {
    /// A service over `node`.
    pub fn new(node: Node) -> KvService {
        KvService { node }
    }

    fn members(&self) -> Vec<Member> {
        self.node
            .status()
            .raft
            .members
            .into_iter()
            .map(|member| Member {
                id: member.id,
                peer_address: member.info.peer_address,
                client_address: member.info.client_address,
                voter: member.voter,
            })
            .collect()
    }

    /// Why a call was not carried out, as the wire says it; a request the
    /// node shed before proposing is a gRPC status instead.
    fn failure(&self, error: WriteError) -> Result<Failure, Status> {
        if let WriteError::Overloaded(what) = error {
            let message = format!("overloaded ({what}): not proposed, retry later");
            return Err(crate::transport::overloaded(what, message));
        }
        Ok(failure_to_wire(self.call_failure(error)))
    }

    /// Why a call was not carried out, in the node's one list of reasons.
    fn call_failure(&self, error: WriteError) -> CallFailure {
        match error {
            WriteError::NotLeader {
                leader_id: None,
                leader: None,
            } => CallFailure::NoLeader(
                "no leader is known: the cluster has lost its quorum or is electing a leader; \
                 nothing was proposed, retry later"
                    .to_string(),
            ),
            WriteError::NotLeader { leader_id, leader } => {
                let leader_client_address = leader
                    .map(|info| info.client_address)
                    .or_else(|| leader_id.and_then(|id| self.node.client_address_of(id)));
                CallFailure::NotLeader {
                    leader_id,
                    leader_client_address,
                }
            }
            WriteError::Unavailable(reason) => CallFailure::Unavailable(reason),
            WriteError::Invalid(why) => CallFailure::Invalid(why.to_string()),
            WriteError::Unauthenticated(why) => CallFailure::Unauthenticated(why),
            WriteError::PermissionDenied(why) => CallFailure::PermissionDenied(why),
            WriteError::Refused(why) => CallFailure::Invalid(why),
            WriteError::Overloaded(what) => CallFailure::Shed {
                what: what.to_string(),
                reason: format!("overloaded ({what}): not proposed, retry later"),
            },
        }
    }

    /// Executes the requests of one call whose credentials gave
    /// `principal`, proposed together ([`Node::execute_many`]); answers
    /// each on its own, in order. A shed request is an error only when
    /// `shed_as_status` (a call of its own: `Execute`), else the response's
    /// `Failure.shed` (in a batch).
    async fn execute_many(
        &self,
        requests: Vec<ExecuteRequest>,
        principal: Result<Option<oncekv_state::Principal>, WriteError>,
        shed_as_status: bool,
    ) -> Result<Vec<ExecuteResponse>, Status> {
        let failed = |error: WriteError| -> Result<execute_response::Result, Status> {
            let failure = if shed_as_status {
                self.failure(error)?
            } else {
                failure_to_wire(self.call_failure(error))
            };
            Ok(execute_response::Result::Failure(failure))
        };
        // Each request that decodes goes to the node; `decoded` keeps
        // every request's place, with why it did not decode.
        let mut admitted = Vec::with_capacity(requests.len());
        let decoded: Vec<_> = requests
            .into_iter()
            .map(|request| {
                convert::request_from_wire(request).map(|request| admitted.push(request))
            })
            .collect();
        let mut executed = match principal {
            Ok(principal) => self.node.execute_many(admitted, principal).await,
            Err(error) => vec![Err(error); admitted.len()],
        }
        .into_iter();
        let mut responses = Vec::with_capacity(decoded.len());
        for request in decoded {
            let (result, log_index) = match request.map(|()| executed.next()) {
                Err(error) => (
                    execute_response::Result::Failure(invalid(error.to_string())),
                    0,
                ),
                Ok(Some(Ok(executed))) => (
                    execute_response::Result::Outcome(outcome_to_wire(&executed.outcome)),
                    executed.index.0,
                ),
                Ok(Some(Err(error))) => (failed(error)?, 0),
                Ok(None) => (
                    failed(WriteError::Unavailable(
                        "no answer; it may still apply".to_string(),
                    ))?,
                    0,
                ),
            };
            responses.push(ExecuteResponse {
                result: Some(result),
                log_index,
            });
        }
        Ok(responses)
    }
}

/// An admin call's refusal, for the calls without a `Failure` field
/// (status, state digest).
fn refused(error: WriteError) -> Status {
    match error {
        WriteError::Unauthenticated(why) => Status::unauthenticated(why),
        WriteError::PermissionDenied(why) => Status::permission_denied(why),
        other => Status::unavailable(other.to_string()),
    }
}

/// A watch refused for a cap on watchers: RESOURCE_EXHAUSTED naming the
/// cap. A full node is load shed (the overloaded metadata: retry later or
/// on another node); the caller's own share is not.
fn watch_cap_status(cap: &WatchCap) -> Status {
    if cap.is_node() {
        crate::transport::overloaded(cap.what(), cap.to_string())
    } else {
        Status::resource_exhausted(cap.to_string())
    }
}

/// A login refused before its password was checked: RESOURCE_EXHAUSTED
/// saying when to retry. Too many logins waiting is load shed (with
/// `oncekv-overloaded: logins`, retried later by clients); too many failed
/// logins is not (a client reports it rather than retrying at once).
fn login_refused(refused: &LoginRefused) -> Status {
    match refused {
        LoginRefused::Busy => crate::transport::overloaded("logins", refused.to_string()),
        LoginRefused::Stopping => Status::unavailable(refused.to_string()),
        LoginRefused::User { .. } | LoginRefused::Source { .. } => {
            Status::resource_exhausted(refused.to_string())
        }
    }
}

/// Checks that a member's address is `host:port` (a name, an IPv4
/// address or a bracketed IPv6 address, and a port from 1 to 65535).
fn check_address(what: &str, address: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "the {what} address {address:?} is not host:port: {why}"
        ))
    };
    let Some((host, port)) = address.rsplit_once(':') else {
        return bad("no port");
    };
    match port.parse::<u16>() {
        Ok(0) | Err(_) => return bad("the port must be 1..=65535"),
        Ok(_) => {}
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        if inner.parse::<std::net::Ipv6Addr>().is_err() {
            return bad("not an IPv6 address in brackets");
        }
        return Ok(());
    }
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
    if host.is_empty() || host.len() > 253 || !host.chars().all(name_char) {
        return bad("the host must be a name or an IP address");
    }
    Ok(())
}

/// A request refused before it reached the node.
fn invalid(reason: impl Into<String>) -> Failure {
    failure_to_wire(CallFailure::Invalid(reason.into()))
}

/// Bytes per `data` chunk of a streamed snapshot.
const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

type WatchStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<WatchResponse, Status>> + Send>>;

type SnapshotStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<SaveSnapshotChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Kv for KvService {
    type SaveSnapshotStream = SnapshotStream;
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        use watch_response::Kind;
        let credentials = Credentials::of(&request);
        // Watchers are counted per connection, and per user (per source
        // address while authentication is off).
        let address = request.remote_addr();
        let request = request.into_inner();
        let interval = match request.progress_interval_ms {
            0 => PROGRESS_INTERVAL_DEFAULT,
            ms => Duration::from_millis(u64::from(ms)),
        };
        let spec = WatchSpec {
            key: request.key,
            scope: oncekv_proto::convert::scope_from_wire(request.prefix, request.range_end),
            start_revision: request.start_revision,
            previous: request.previous,
            progress_interval: interval,
        };
        let previous = spec.previous;
        let started = self
            .node
            .watch_owner(&credentials, address, address.map(Holder::Connection))
            .map_err(WatchError::Refused)
            .and_then(|owner| self.node.watch_as(spec, &credentials, &owner));
        let messages = match started {
            Ok(messages) => messages,
            Err(WatchError::Refused(error)) => {
                let failure = Ok(WatchResponse {
                    kind: Some(Kind::Failure(self.failure(error)?)),
                });
                return Ok(Response::new(Box::pin(futures_util::stream::iter([
                    failure,
                ]))));
            }
            Err(WatchError::Capped(cap)) => return Err(watch_cap_status(&cap)),
        };
        let service = self.clone();
        let stream = messages.into_stream().map(move |message| {
            let kind = match message {
                WatchMessage::Started { revision } => Kind::Started(WatchStarted { revision }),
                WatchMessage::Events(events) => Kind::Events(WatchEvents {
                    events: events
                        .iter()
                        .map(|event| convert::event_to_wire(event, previous))
                        .collect(),
                }),
                WatchMessage::Progress(revision) => Kind::Progress(revision),
                // The right to watch is gone: the refusal a call would get.
                WatchMessage::Canceled {
                    denied: Some(error),
                    ..
                } => Kind::Failure(failure_to_wire(service.call_failure(error))),
                WatchMessage::Canceled {
                    reason, compacted, ..
                } => Kind::Canceled(WatchCanceled { reason, compacted }),
            };
            Ok(WatchResponse { kind: Some(kind) })
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn save_snapshot(
        &self,
        request: Request<SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        use save_snapshot_chunk::Kind;
        let allowed = self
            .node
            .require_admin(&Credentials::of(&request), "saving a snapshot");
        let backup = match allowed {
            Ok(()) => self.node.backup().await,
            Err(error) => Err(error),
        };
        let backup = match backup {
            Ok(backup) => backup,
            Err(error) => {
                let failure = Ok(SaveSnapshotChunk {
                    kind: Some(Kind::Failure(self.failure(error)?)),
                });
                return Ok(Response::new(Box::pin(futures_util::stream::iter([
                    failure,
                ]))));
            }
        };
        let info = SnapshotInfo {
            applied_index: backup.applied_index().0,
            bytes: backup.state_len(),
            sha256: backup.sha256().to_vec(),
        };
        // Read from the backup's file as the pieces are sent: the state is
        // never in memory whole.
        let data = backup
            .into_state_pieces(SNAPSHOT_CHUNK_BYTES)
            .map(|piece| match piece {
                Ok(data) => Ok(SaveSnapshotChunk {
                    kind: Some(Kind::Data(data)),
                }),
                Err(error) => Err(Status::unavailable(format!(
                    "reading the backup failed: {error}"
                ))),
            });
        let first = Ok(SaveSnapshotChunk {
            kind: Some(Kind::Info(info)),
        });
        let messages = std::iter::once(first).chain(data);
        Ok(Response::new(Box::pin(futures_util::stream::iter(
            messages,
        ))))
    }

    async fn execute(
        &self,
        request: Request<ExecuteRequest>,
    ) -> Result<Response<ExecuteResponse>, Status> {
        let principal = self.node.authenticate_at_leader(&Credentials::of(&request));
        let response = self
            .execute_many(vec![request.into_inner()], principal, true)
            .await?
            .pop()
            .ok_or_else(|| Status::internal("no answer to the request"))?;
        Ok(Response::new(response))
    }

    async fn execute_batch(
        &self,
        request: Request<ExecuteBatchRequest>,
    ) -> Result<Response<ExecuteBatchResponse>, Status> {
        // A message of more requests than the cap does not decode
        // (`oncekv_proto::batch`): tonic refuses it before this handler,
        // having decoded no request past the cap. Checked again here, before
        // the credentials, so no path reaches authentication with more.
        let credentials = Credentials::of(&request);
        let requests = request.into_inner().requests;
        if requests.len() > BATCH_REQUESTS_MAX {
            return Err(Status::invalid_argument(format!(
                "a batch holds at most {BATCH_REQUESTS_MAX} requests, this one {}",
                requests.len()
            )));
        }
        let principal = self.node.authenticate_at_leader(&credentials);
        metrics::counter!("oncekv_batched_requests_total").increment(requests.len() as u64);
        metrics::histogram!("oncekv_batch_requests").record(requests.len() as f64);
        let responses = self.execute_many(requests, principal, false).await?;
        Ok(Response::new(ExecuteBatchResponse { responses }))
    }

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        let credentials = Credentials::of(&request);
        let request = request.into_inner();
        let principal = if request.serializable {
            self.node.authenticate(&credentials)
        } else {
            self.node.authenticate_at_leader(&credentials)
        };
        let query = request
            .query
            .ok_or(convert::ConvertError::Missing("query"))
            .and_then(convert::query_from_wire);
        let mut revision = 0;
        let result = match (query, principal) {
            (Err(error), _) => read_response::Result::Failure(invalid(error.to_string())),
            (Ok(_), Err(error)) => read_response::Result::Failure(self.failure(error)?),
            (Ok(query), Ok(principal)) => {
                let read = self
                    .node
                    .read_at(&query, request.serializable, principal.as_ref())
                    .await;
                match read {
                    Ok((reply, applied)) => {
                        revision = applied;
                        read_response::Result::Reply(reply_to_wire(&reply))
                    }
                    Err(error) => read_response::Result::Failure(self.failure(error)?),
                }
            }
        };
        Ok(Response::new(ReadResponse {
            result: Some(result),
            revision,
        }))
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.node
            .require_admin(&Credentials::of(&request), "status")
            .map_err(refused)?;
        let status = self.node.status();
        let raft = &status.raft;
        let leader_client_address = raft
            .leadership
            .leader_id
            .and_then(|id| self.node.client_address_of(id))
            .unwrap_or_default();
        Ok(Response::new(StatusResponse {
            id: raft.id,
            leader_id: raft.leadership.leader_id,
            term: raft.leadership.term,
            is_leader: raft.leadership.is_leader,
            last_log_index: raft.last_log_index,
            commit_index: raft.commit_index,
            applied_index: raft.applied_index,
            snapshot_index: raft.snapshot_index,
            cluster_time_ms: status.state.cluster_time.0,
            members: self.members(),
            sessions: status.state.sessions,
            completion_records: status.state.completion_records,
            idempotency_keys: status.state.idempotency_keys,
            leases: status.state.leases,
            keys: status.state.keys,
            leader_client_address,
            completion_record_bytes: status.state.completion_record_bytes,
            idempotency_bytes: status.state.idempotency_bytes,
            store_bytes: status.state.store_bytes,
            alarms: {
                let by_hand = self
                    .node
                    .consensus()
                    .with_state(|state| !state.alarmed_members().is_empty());
                if status.state.no_space_alarm || by_hand {
                    vec!["NOSPACE".to_string()]
                } else {
                    Vec::new()
                }
            },
        }))
    }

    async fn state_digest(
        &self,
        request: Request<StateDigestRequest>,
    ) -> Result<Response<StateDigestResponse>, Status> {
        self.node
            .require_admin(&Credentials::of(&request), "the state digest")
            .map_err(refused)?;
        let (applied_index, digest) = self.node.state_digest().await;
        Ok(Response::new(StateDigestResponse {
            applied_index: applied_index.map(|index| index.0),
            digest,
        }))
    }

    async fn add_member(
        &self,
        request: Request<AddMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let admin = self
            .node
            .require_admin(&Credentials::of(&request), "changing membership");
        if let Err(error) = admin {
            return Ok(Response::new(self.membership_result(Err(error))?));
        }
        let request = request.into_inner();
        let checked = check_address("peer", &request.peer_address)
            .and_then(|()| check_address("client", &request.client_address));
        if let Err(reason) = checked {
            return Ok(Response::new(MembershipResponse {
                result: Some(membership_response::Result::Failure(invalid(reason))),
            }));
        }
        let info = crate::raft::type_config::NodeInfo {
            peer_address: request.peer_address,
            client_address: request.client_address,
        };
        let result = self.node.add_member(request.id, info).await;
        Ok(Response::new(self.membership_result(result)?))
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipResponse>, Status> {
        let admin = self
            .node
            .require_admin(&Credentials::of(&request), "changing membership");
        if let Err(error) = admin {
            return Ok(Response::new(self.membership_result(Err(error))?));
        }
        let result = self.node.remove_member(request.into_inner().id).await;
        Ok(Response::new(self.membership_result(result)?))
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let source = request.remote_addr().map(|address| address.ip());
        let request = request.into_inner();
        let ttl = self.node.token_ttl();
        let login = self
            .node
            .login(&request.user, &request.password, ttl, source)
            .await;
        let result = match login {
            Ok((token, expires)) => authenticate_response::Result::Token(Token {
                token,
                expires_at_ms: expires.0,
            }),
            Err(LoginError::Refused(refused)) => return Err(login_refused(&refused)),
            Err(LoginError::Failed(error)) => {
                authenticate_response::Result::Failure(self.failure(error)?)
            }
        };
        Ok(Response::new(AuthenticateResponse {
            result: Some(result),
        }))
    }
}

impl KvService {
    fn membership_result(
        &self,
        result: Result<(), WriteError>,
    ) -> Result<MembershipResponse, Status> {
        let result = match result {
            Ok(()) => membership_response::Result::Members(Members {
                members: self.members(),
            }),
            Err(error) => membership_response::Result::Failure(self.failure(error)?),
        };
        Ok(MembershipResponse {
            result: Some(result),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::check_address;

    #[test]
    fn a_member_address_is_host_and_port() {
        for good in [
            "127.0.0.1:7380",
            "node-2.example:1",
            "[::1]:7380",
            "localhost:65535",
        ] {
            assert_eq!(check_address("peer", good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:65536",
            ":7380",
            "a b:1",
            "[zz]:1",
            "http://x:1",
            "host:port",
        ] {
            assert!(check_address("peer", bad).is_err(), "{bad:?}");
        }
    }
}
