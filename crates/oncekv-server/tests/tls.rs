//! `oncekv_server::tls` over real connections in this process: the Common
//! Name of a verified client certificate reaches a handler
//! (`client_certificate_name`), a port without a client CA asks for none,
//! and a node certificate loads as peer TLS only for its own id.

use oncekv_proto::v1::raft_peer_client::RaftPeerClient;
use oncekv_proto::v1::raft_peer_server::{RaftPeer, RaftPeerServer};
use oncekv_proto::v1::{RaftPayload, SnapshotChunk};
use oncekv_server::certs;
use oncekv_server::tls::{PeerTls, ServerTls, TlsError, TlsFiles, client_certificate_name};
use oncekv_server::transport::tcp_incoming;
use std::path::Path;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Response, Status, Streaming};

/// Answers every vote with the Common Name of the caller's certificate.
struct WhoCalls;

fn name_of<T>(request: &Request<T>) -> Result<Response<RaftPayload>, Status> {
    let name = client_certificate_name(request).unwrap_or_else(|| "(none)".to_string());
    Ok(Response::new(RaftPayload {
        data: name.into_bytes(),
    }))
}

#[tonic::async_trait]
impl RaftPeer for WhoCalls {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        name_of(&request)
    }

    type StreamAppendStream = tokio_stream::Empty<Result<RaftPayload, Status>>;

    async fn stream_append(
        &self,
        _request: Request<Streaming<RaftPayload>>,
    ) -> Result<Response<Self::StreamAppendStream>, Status> {
        Err(Status::unimplemented("not this peer"))
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        name_of(&request)
    }

    async fn transfer_leader(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        name_of(&request)
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftPayload>, Status> {
        name_of(&request)
    }
}

/// Serves [`WhoCalls`] with `tls` on a free port; gives its address.
async fn serve(tls: &ServerTls) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let server = tonic::transport::Server::builder()
        .tls_config(tls.server_config())
        .expect("TLS configuration")
        .add_service(RaftPeerServer::new(WhoCalls))
        .serve_with_incoming(tcp_incoming(listener));
    tokio::spawn(server);
    address
}

async fn call(address: &str, ca: &Path, identity: Option<&certs::CertFiles>) -> String {
    let read = |path: &Path| std::fs::read(path).expect("a certificate file");
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca)))
        .domain_name("node-1");
    if let Some(files) = identity {
        tls = tls.identity(Identity::from_pem(read(&files.cert), read(&files.key)));
    }
    let channel = Endpoint::from_shared(format!("https://{address}"))
        .expect("address")
        .tls_config(tls)
        .expect("client TLS")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connected");
    let reply = RaftPeerClient::new(channel)
        .vote(RaftPayload::default())
        .await
        .expect("answered");
    String::from_utf8(reply.into_inner().data).expect("text")
}

#[tokio::test]
async fn a_verified_client_certificate_names_its_user() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = certs::create_ca(dir.path(), certs::CA_DAYS_DEFAULT).expect("CA");
    let node = certs::create_node(dir.path(), 1, &[], certs::LEAF_DAYS_DEFAULT).expect("node");
    let alice =
        certs::create_client(dir.path(), "alice", certs::LEAF_DAYS_DEFAULT).expect("client");

    let mutual = ServerTls::load(&TlsFiles {
        cert: node.cert.clone(),
        key: node.key.clone(),
        ca: Some(ca.cert.clone()),
    })
    .expect("server TLS with a client CA");
    assert!(mutual.requires_client_certificate());
    let address = serve(&mutual).await;
    assert_eq!(call(&address, &ca.cert, Some(&alice)).await, "alice");

    // Without a client CA no certificate is asked for: no name.
    let plain = ServerTls::load(&TlsFiles {
        cert: node.cert.clone(),
        key: node.key.clone(),
        ca: None,
    })
    .expect("server TLS");
    let address = serve(&plain).await;
    assert_eq!(call(&address, &ca.cert, None).await, "(none)");

    // A node certificate is peer TLS for its own id only.
    let files = TlsFiles {
        cert: node.cert,
        key: node.key,
        ca: Some(ca.cert),
    };
    PeerTls::load(1, &files).expect("node 1's certificate");
    assert!(matches!(
        PeerTls::load(2, &files),
        Err(TlsError::NotThisNode { id: 2, .. })
    ));
}
