//! Any member accepts every etcd call, as etcd's members do (etcd's
//! clients do no leader discovery): a call only the leader carries out (a
//! write, a linearizable read) that reaches a follower is forwarded to the
//! leader's client port with its metadata (credentials, idempotency key),
//! and the leader's answer is passed back unchanged.
//!
//! A member that knows no leader (an election is on) waits for one, a few
//! election timeouts at most, before it answers "no leader".
//!
//! A forwarded call is marked ([`FORWARDED_METADATA`]) and never forwarded
//! again, so two nodes with stale views of leadership cannot bounce it.
//! What the follower answers when forwarding fails keeps the API's
//! promise: the leader could not be reached at all, nothing was sent
//! ("not leader", UNAVAILABLE); the connection failed after the call was
//! sent, it may apply ("request timed out", UNKNOWN). A node
//! whose client port is on TLS does not forward (it would need a client
//! certificate of its own): it answers "not leader", which etcd's clients
//! retry on another endpoint.

use super::EtcdApi;
use super::errors::{EtcdError, error_of};
use crate::raft::consensus::WriteError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

/// The metadata entry on a call one member forwarded to another.
pub(super) const FORWARDED_METADATA: &str = "oncekv-forwarded-by";

/// The metadata entry naming the source address of a forwarded call's
/// caller, so that the leader bounds what one caller has waiting (with
/// authentication off, callers are told apart by address) by the caller
/// and not by the member that forwarded it.
pub(super) const FORWARDED_FOR_METADATA: &str = "oncekv-forwarded-for";

/// Channels to the members' client ports, by address.
#[derive(Clone, Debug, Default)]
pub(super) struct LeaderChannels {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl LeaderChannels {
    fn channel(&self, address: &str) -> Result<Channel, String> {
        let mut channels = crate::sync::lock(&self.channels);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let channel = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|error| format!("the leader's address {address:?}: {error}"))?
            .connect_timeout(std::time::Duration::from_secs(2))
            // A dead leader connection is noticed and dialled again.
            .http2_keep_alive_interval(std::time::Duration::from_secs(2))
            .keep_alive_timeout(std::time::Duration::from_secs(3))
            .keep_alive_while_idle(true)
            .connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }
}

/// Where a call only the leader carries out is served.
pub(super) enum Route {
    /// Here: this node leads (or cannot tell; the call finds out).
    Here,
    /// At the leader, over this channel.
    Leader(Channel),
}

impl EtcdApi {
    /// Where `request`, which only the leader carries out, is served; an
    /// error when it can be served nowhere from here.
    pub(super) async fn route<T>(&self, request: &tonic::Request<T>) -> Result<Route, Status> {
        let forwarded = request.metadata().contains_key(FORWARDED_METADATA);
        self.route_unless(forwarded).await
    }

    /// Where a call is served that this node, the leader when it came,
    /// handed on by giving leadership away (a member removing itself): at
    /// the new leader, even if the call was forwarded here (one hop more,
    /// to a node that does not hand it back).
    pub(super) async fn route_after_handover(&self) -> Result<Route, Status> {
        self.route_unless(false).await
    }

    async fn route_unless(&self, forwarded: bool) -> Result<Route, Status> {
        let Some(mut error) = self.node.not_leader() else {
            return Ok(Route::Here);
        };
        // In an election no member knows a leader: wait, a few election
        // timeouts at most, for one, as etcd's members hold a proposal
        // until there is a leader to take it, rather than refusing a
        // call that would be served a moment later.
        if matches!(
            error,
            WriteError::NotLeader {
                leader_id: None,
                leader: None
            }
        ) && self.node.consensus().wait_for_a_leader().await
        {
            match self.node.not_leader() {
                None => return Ok(Route::Here),
                Some(now) => error = now,
            }
        }
        let refuse = |error: WriteError| Err(Status::from(error_of(error)));
        if self.client_tls || forwarded {
            return refuse(error);
        }
        let WriteError::NotLeader { leader_id, leader } = &error else {
            return refuse(error);
        };
        let address = leader
            .as_ref()
            .map(|info| info.client_address.clone())
            .or_else(|| leader_id.and_then(|id| self.node.client_address_of(id)));
        let Some(address) = address else {
            return refuse(error);
        };
        match self.leaders.channel(&address) {
            Ok(channel) => Ok(Route::Leader(channel)),
            Err(_) => refuse(error),
        }
    }

    /// `request` as this node sends it on: the same message and metadata,
    /// marked as forwarded, with its caller's source address.
    pub(super) fn forwarded<T>(&self, request: tonic::Request<T>) -> tonic::Request<T> {
        let caller = request.remote_addr();
        let (mut metadata, _, message) = request.into_parts();
        if let Ok(value) = self.node.id().to_string().parse() {
            metadata.insert(FORWARDED_METADATA, value);
        }
        match caller.map(|at| at.ip().to_string().parse()) {
            Some(Ok(value)) => {
                metadata.insert(FORWARDED_FOR_METADATA, value);
            }
            _ => {
                metadata.remove(FORWARDED_FOR_METADATA);
            }
        }
        tonic::Request::from_parts(metadata, tonic::Extensions::default(), message)
    }
}

/// The leader's answer to a forwarded call, or what its failure means.
pub(super) fn answered<T>(result: Result<T, Status>) -> Result<T, Status> {
    result.map_err(|status| {
        let mut sources =
            std::iter::successors(std::error::Error::source(&status), |error| error.source());
        let first = sources.next();
        match first {
            // A status the leader sent.
            None => status,
            Some(error)
                if std::iter::once(error)
                    .chain(sources)
                    .any(|error| error.is::<tonic::ConnectError>()) =>
            {
                // Never sent: the leader could not be reached.
                EtcdError::NotLeader.into()
            }
            Some(_) => EtcdError::Timeout.into(),
        }
    })
}
