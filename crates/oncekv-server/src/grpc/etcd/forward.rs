//! Any member accepts every etcd call, as etcd's members do (etcd's
//! clients do no leader discovery): a call only the leader carries out (a
//! write, a linearizable read, a lease, membership, auth, lock or election
//! call) that reaches a follower is forwarded to the leader's **peer
//! port** with its metadata (credentials, idempotency key), and the
//! leader's answer is passed back unchanged. Whatever the client port
//! uses (plaintext or TLS), the follower dials the leader as it does for
//! Raft ([`PeerDialer`]): with peer TLS it verifies the leader's
//! certificate for `node-<leader id>` and presents its own, with a peer
//! token it sends the token, through the injected connector if there is
//! one (a simulation's network).
//!
//! A member that knows no leader (an election is on) waits for one, a few
//! election timeouts at most, before it answers "no leader".
//!
//! The leader's peer port serves etcd's services (not Watch) only to a
//! member forwarding a call ([`MemberCheck`]): the call must carry the
//! peer token when the cluster has one, name the forwarding node
//! ([`FORWARDED_BY_METADATA`]), that node must be a member, and with peer
//! TLS the caller's certificate must be valid for `node-<that id>`;
//! anything else is refused (UNAUTHENTICATED without the token,
//! PERMISSION_DENIED otherwise) before the call is read. An admitted call
//! carries a [`Forwarded`] in its extensions, and only such a call is
//! treated as forwarded: the `oncekv-forwarded-*` metadata a client puts
//! on its own call to a client port means nothing (its call is forwarded
//! as any other, and the follower replaces those entries with its own).
//!
//! What travels with a forwarded call: the caller's source address
//! ([`FORWARDED_FOR_METADATA`], by which the leader tells callers apart
//! while authentication is off) and, when the caller presented a client
//! certificate the follower verified, its Common Name and serial number
//! ([`FORWARDED_CERTIFICATE_USER_METADATA`],
//! [`FORWARDED_CERTIFICATE_SERIAL_METADATA`]). For a forwarded call the
//! leader takes those as the caller's certificate, never the forwarding
//! node's own peer certificate ([`forwarded_of`], used by
//! `credentials_of`); a login token travels in its own metadata, as sent.
//!
//! A forwarded call is never forwarded again, so two nodes with stale
//! views of leadership cannot bounce it. What the follower answers when
//! forwarding fails keeps the API's promise ([`answered`]): the leader
//! could not be reached at all, nothing was sent ("not leader",
//! UNAVAILABLE); the connection failed after the call was sent, it may
//! apply ("request timed out", UNKNOWN).

use super::EtcdApi;
use super::errors::{EtcdError, error_of};
use crate::node::Node;
use crate::raft::consensus::WriteError;
use crate::raft::network::PeerDialer;
use crate::raft::peer_token::{PEER_TOKEN_METADATA, PeerToken, PeerTokenCheck};
use crate::raft::type_config::NodeId;
pub use oncekv_proto::{
    FORWARDED_BY_METADATA, FORWARDED_CERTIFICATE_SERIAL_METADATA,
    FORWARDED_CERTIFICATE_USER_METADATA, FORWARDED_FOR_METADATA,
};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tonic::Status;
use tonic::metadata::{BinaryMetadataValue, MetadataMap};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Channels to the members' peer ports, by node id and address, dialled
/// as Raft dials them.
#[derive(Clone, Debug, Default)]
pub(super) struct LeaderChannels {
    dialer: PeerDialer,
    channels: Arc<Mutex<HashMap<(NodeId, String), Channel>>>,
}

impl LeaderChannels {
    /// Channels made by `dialer`.
    pub(super) fn new(dialer: PeerDialer) -> LeaderChannels {
        LeaderChannels {
            dialer,
            channels: Arc::default(),
        }
    }

    fn channel(&self, id: NodeId, address: &str) -> Result<Channel, tonic::transport::Error> {
        let mut channels = crate::sync::lock(&self.channels);
        let key = (id, address.to_string());
        if let Some(channel) = channels.get(&key) {
            return Ok(channel.clone());
        }
        let channel = self.dialer.channel(id, address)?;
        channels.insert(key, channel.clone());
        Ok(channel)
    }
}

/// Where a call only the leader carries out is served.
pub(super) enum Route {
    /// Here: this node leads (or cannot tell; the call finds out).
    Here,
    /// At the leader, over this channel to its peer port.
    Leader(Channel),
}

/// A call a member forwarded to this node's peer port, as [`MemberCheck`]
/// admitted it: in the call's extensions, where no client can put it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forwarded {
    /// The member that forwarded it (authenticated as that node).
    pub by: NodeId,
    /// The caller's source address, as the member saw it.
    pub caller: Option<IpAddr>,
    /// The Common Name of the client certificate the member verified on
    /// the caller's connection.
    pub certificate_user: Option<String>,
    /// That certificate's serial number.
    pub certificate_serial: Option<Vec<u8>>,
}

/// The [`Forwarded`] of `request`: `Some` only for a call that came over
/// the peer port from an authenticated member.
pub(super) fn forwarded_of<T>(request: &tonic::Request<T>) -> Option<&Forwarded> {
    request.extensions().get::<Forwarded>()
}

/// The source address of `request`'s caller: for a forwarded call, the
/// one the forwarding member names; else the connection's.
pub(super) fn caller_address<T>(request: &tonic::Request<T>) -> Option<IpAddr> {
    match forwarded_of(request) {
        Some(forwarded) => forwarded.caller,
        None => request.remote_addr().map(|address| address.ip()),
    }
}

/// Why a call to an etcd service on the peer port is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemberCallRefused {
    /// Not marked as forwarded by a member.
    #[error(
        "the peer port serves etcd calls only as forwarded by a member (no {FORWARDED_BY_METADATA}): call a client port"
    )]
    NotForwarded,
    /// The forwarding node is named by something that is not a node id.
    #[error("{FORWARDED_BY_METADATA} is not a node id")]
    BadSender,
    /// The forwarding node is not a member.
    #[error("node {0} is not a member of this cluster")]
    NotAMember(NodeId),
    /// Peer TLS is on, and the caller's certificate is not the forwarding
    /// node's.
    #[error(
        "the call is forwarded by node {sender}, but the caller's certificate is not valid for {expected} (it names {names:?})"
    )]
    WrongCertificate {
        /// The node the call names.
        sender: NodeId,
        /// The name the certificate must carry.
        expected: String,
        /// The DNS names it carries (none: no verified certificate).
        names: Vec<String>,
    },
    /// A forwarded entry that does not decode.
    #[error("the forwarded call's {0} does not decode")]
    Malformed(&'static str),
}

/// The peer port's check of an etcd call, before its body is read: a
/// [`tonic::service::Interceptor`]. It passes only a call forwarded by a
/// member authenticated as the node it names, and puts the call's
/// [`Forwarded`] in its extensions.
#[derive(Clone, Debug)]
pub struct MemberCheck {
    node: Node,
    token: PeerTokenCheck,
    certificates: bool,
}

impl MemberCheck {
    /// Checks calls to `node`'s peer port: against `token` if the cluster
    /// has one, and, when `certificates` (peer TLS), against the caller's
    /// verified certificate.
    pub fn new(node: Node, token: Option<PeerToken>, certificates: bool) -> MemberCheck {
        MemberCheck {
            node,
            token: PeerTokenCheck::new(token),
            certificates,
        }
    }

    /// `service`, served only to calls this check admits.
    pub fn guard<S>(&self, service: S) -> InterceptedService<S, MemberCheck> {
        InterceptedService::new(service, self.clone())
    }

    fn forwarded_call<T>(
        &self,
        request: &tonic::Request<T>,
    ) -> Result<Forwarded, MemberCallRefused> {
        let metadata = request.metadata();
        let by = metadata
            .get(FORWARDED_BY_METADATA)
            .ok_or(MemberCallRefused::NotForwarded)?
            .to_str()
            .ok()
            .and_then(|text| text.parse::<NodeId>().ok())
            .ok_or(MemberCallRefused::BadSender)?;
        if self.certificates {
            let expected = crate::tls::node_name(by);
            if !crate::tls::certificate_is_for(request, &expected) {
                return Err(MemberCallRefused::WrongCertificate {
                    sender: by,
                    expected,
                    names: crate::tls::verified_dns_names(request).unwrap_or_default(),
                });
            }
        }
        if self.node.consensus().member(by).is_none() {
            return Err(MemberCallRefused::NotAMember(by));
        }
        let caller = metadata
            .get(FORWARDED_FOR_METADATA)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse().ok());
        let certificate_user = binary(metadata, FORWARDED_CERTIFICATE_USER_METADATA)?
            .map(|bytes| {
                String::from_utf8(bytes)
                    .map_err(|_| MemberCallRefused::Malformed("certificate user"))
            })
            .transpose()?;
        let certificate_serial = binary(metadata, FORWARDED_CERTIFICATE_SERIAL_METADATA)?;
        Ok(Forwarded {
            by,
            caller,
            certificate_user,
            certificate_serial,
        })
    }
}

/// The bytes of the binary metadata entry `key`; an error if it is there
/// but does not decode.
fn binary(metadata: &MetadataMap, key: &'static str) -> Result<Option<Vec<u8>>, MemberCallRefused> {
    match metadata.get_bin(key) {
        None => Ok(None),
        Some(value) => value
            .to_bytes()
            .map(|bytes| Some(bytes.to_vec()))
            .map_err(|_| MemberCallRefused::Malformed(key)),
    }
}

impl tonic::service::Interceptor for MemberCheck {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        // The peer token first, as for every call of the peer port.
        let mut request = self.token.call(request)?;
        match self.forwarded_call(&request) {
            Ok(forwarded) => {
                request.extensions_mut().insert(forwarded);
                Ok(request)
            }
            Err(refusal) => {
                let caller = request
                    .remote_addr()
                    .map_or_else(|| "unknown".to_string(), |address| address.to_string());
                tracing::warn!(%caller, %refusal, "forwarded etcd call refused");
                metrics::counter!("oncekv_peer_messages_refused_total").increment(1);
                Err(Status::permission_denied(format!(
                    "refused etcd call on the peer port: {refusal}"
                )))
            }
        }
    }
}

impl EtcdApi {
    /// Where `request`, which only the leader carries out, is served; an
    /// error when it can be served nowhere from here.
    pub(super) async fn route<T>(&self, request: &tonic::Request<T>) -> Result<Route, Status> {
        self.route_unless(forwarded_of(request).is_some()).await
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
        ) {
            if self.node.consensus().wait_for_a_leader().await {
                match self.node.not_leader() {
                    None => return Ok(Route::Here),
                    Some(now) => error = now,
                }
            } else if let Some(id) = self.node.consensus().remembered_leader() {
                // None heard from for a while, but the vote this node
                // stores names one: try it (gone, the call fails and the
                // client tries another member, as etcd's clients do).
                error = WriteError::NotLeader {
                    leader_id: Some(id),
                    leader: self.node.consensus().member(id),
                };
            }
        }
        let refuse = |error: WriteError| Err(Status::from(error_of(error)));
        if forwarded {
            return refuse(error);
        }
        let WriteError::NotLeader {
            leader_id: Some(id),
            leader,
        } = &error
        else {
            return refuse(error);
        };
        let address = leader
            .as_ref()
            .map(|info| info.peer_address.clone())
            .or_else(|| self.node.peer_address_of(*id));
        let Some(address) = address else {
            return refuse(error);
        };
        match self.leaders.channel(*id, &address) {
            Ok(channel) => Ok(Route::Leader(channel)),
            Err(cause) => {
                tracing::warn!(leader = id, %address, %cause, "cannot dial the leader's peer port");
                refuse(error)
            }
        }
    }

    /// `request` as this node sends it on to the leader's peer port: the
    /// same message and metadata, less any forwarding marks or peer token
    /// the caller put on it, marked as forwarded by this node, with its
    /// caller's source address and verified client certificate, and this
    /// node's peer token.
    pub(super) fn forwarded<T>(&self, request: tonic::Request<T>) -> tonic::Request<T> {
        let credentials = super::credentials_of(&request);
        let caller = caller_address(&request);
        let (mut metadata, _, message) = request.into_parts();
        for key in [
            FORWARDED_BY_METADATA,
            FORWARDED_FOR_METADATA,
            PEER_TOKEN_METADATA,
        ] {
            metadata.remove(key);
        }
        for key in [
            FORWARDED_CERTIFICATE_USER_METADATA,
            FORWARDED_CERTIFICATE_SERIAL_METADATA,
        ] {
            metadata.remove_bin(key);
        }
        if let Ok(value) = self.node.id().to_string().parse() {
            metadata.insert(FORWARDED_BY_METADATA, value);
        }
        if let Some(Ok(value)) = caller.map(|at| at.to_string().parse()) {
            metadata.insert(FORWARDED_FOR_METADATA, value);
        }
        if let Some(user) = credentials.certificate_user {
            metadata.insert_bin(
                FORWARDED_CERTIFICATE_USER_METADATA,
                BinaryMetadataValue::from_bytes(user.as_bytes()),
            );
        }
        if let Some(serial) = credentials.certificate_serial {
            metadata.insert_bin(
                FORWARDED_CERTIFICATE_SERIAL_METADATA,
                BinaryMetadataValue::from_bytes(&serial),
            );
        }
        let mut request =
            tonic::Request::from_parts(metadata, tonic::Extensions::default(), message);
        self.leaders.dialer.authorize(&mut request);
        request
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
