//! TLS on a node's two ports (rustls through tonic, the `ring` provider).
//!
//! - The client port ([`ServerTls`]): the node's certificate and key, and
//!   optionally a client CA: then every client must present a
//!   certificate issued by it (mutual TLS), and
//!   [`client_certificate_name`] gives a handler the Common Name of the
//!   verified client certificate.
//! - The peer port ([`PeerTls`]): always mutual. The node presents its
//!   certificate both as a server and when it dials a peer, and verifies
//!   the other side against the peer CA. A node's certificate carries the
//!   DNS name [`node_name`]`(id)` = `node-<id>`: a node dialling node N
//!   verifies the server for the name `node-N`, and the peer service
//!   serves a message only if the caller's certificate is valid for
//!   `node-<sender>`, the sender id inside the message
//!   ([`certificate_is_for`]).
//!
//! Files are read and checked once, when the configuration is loaded, so a
//! wrong path or a certificate without the expected name stops `oncekv
//! serve` before it starts rather than at the first connection.

use crate::raft::type_config::NodeId;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The longest a TLS handshake may take, on either port and when dialling
/// a peer; a connection that has not finished its handshake by then is
/// closed (it holds one of the listener's connection slots meanwhile).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The files of one port's TLS configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain this node presents (PEM, leaf first).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA whose certificates the other side must present (PEM); for
    /// the client port, `None` means clients need no certificate.
    pub ca: Option<PathBuf>,
}

/// Why a TLS configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {what} {path}: {source}")]
    Read {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file holds no PEM block of the kind expected, or one that does
    /// not parse.
    #[error("{path} holds no usable {what}: {reason}")]
    Unusable {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The peer port needs a CA: peers are always verified.
    #[error("peer TLS needs a CA file (--peer-ca-file): peers always present certificates")]
    NoPeerCa,
    /// The node's peer certificate does not carry its name, so every other
    /// node would refuse it.
    #[error(
        "the peer certificate {path} is not for node {id}: it must carry the DNS name {expected} (it names {names:?}; `oncekv certs create-node --id {id}` makes one)"
    )]
    NotThisNode {
        /// The certificate file.
        path: PathBuf,
        /// This node's id.
        id: NodeId,
        /// The name it must carry.
        expected: String,
        /// The DNS names it carries.
        names: Vec<String>,
    },
    /// rustls refused the certificate and key together.
    #[error("TLS configuration from {cert} and {key} refused: {reason}")]
    Refused {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        reason: String,
    },
}

/// The name a node's certificate carries, as a DNS name: `node-<id>`.
pub fn node_name(id: NodeId) -> String {
    format!("node-{id}")
}

/// PEM text read from a file.
#[derive(Clone)]
struct PemFile {
    path: PathBuf,
    text: Vec<u8>,
}

fn read(path: &Path, what: &'static str) -> Result<PemFile, TlsError> {
    let text = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    Ok(PemFile {
        path: path.to_path_buf(),
        text,
    })
}

/// The DER certificates of a PEM file, checked to parse.
fn certificates(file: &PemFile, what: &'static str) -> Result<Vec<Vec<u8>>, TlsError> {
    let unusable = |reason: String| TlsError::Unusable {
        what,
        path: file.path.clone(),
        reason,
    };
    let mut found = Vec::new();
    for pem in x509_parser::pem::Pem::iter_from_buffer(&file.text) {
        let pem = pem.map_err(|error| unusable(error.to_string()))?;
        if pem.label != "CERTIFICATE" {
            continue;
        }
        X509Certificate::from_der(&pem.contents)
            .map_err(|error| unusable(format!("a certificate does not parse: {error}")))?;
        found.push(pem.contents);
    }
    if found.is_empty() {
        return Err(unusable("no CERTIFICATE block".to_string()));
    }
    Ok(found)
}

fn check_key(file: &PemFile) -> Result<(), TlsError> {
    let has_key = x509_parser::pem::Pem::iter_from_buffer(&file.text)
        .filter_map(Result::ok)
        .any(|pem| pem.label.ends_with("PRIVATE KEY"));
    if has_key {
        Ok(())
    } else {
        Err(TlsError::Unusable {
            what: "private key",
            path: file.path.clone(),
            reason: "no PRIVATE KEY block".to_string(),
        })
    }
}

/// The DNS names (subject alternative names) of a DER certificate; empty
/// if it does not parse.
pub fn certificate_dns_names(der: &[u8]) -> Vec<String> {
    let Ok((_, certificate)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let Ok(Some(names)) = certificate.subject_alternative_name() else {
        return Vec::new();
    };
    names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(name) => Some(name.to_string()),
            _ => None,
        })
        .collect()
}

/// The subject Common Name of a DER certificate, if it has one.
pub fn certificate_common_name(der: &[u8]) -> Option<String> {
    let (_, certificate) = X509Certificate::from_der(der).ok()?;
    let common_name = certificate.subject().iter_common_name().next()?;
    common_name.as_str().ok().map(str::to_string)
}

/// The serial number of a DER certificate, as the cluster's revocation
/// list files it: its big-endian bytes without leading zero bytes (as
/// `openssl x509 -serial` prints it).
pub fn certificate_serial(der: &[u8]) -> Option<Vec<u8>> {
    let (_, certificate) = X509Certificate::from_der(der).ok()?;
    Some(normalized_serial(certificate.raw_serial()))
}

/// The serial number of the (first) certificate in the PEM file at
/// `path`, as [`certificate_serial`] files it.
pub fn certificate_file_serial(path: &Path) -> Result<Vec<u8>, TlsError> {
    let file = read(path, "certificate")?;
    let first = certificates(&file, "certificate")?.remove(0);
    certificate_serial(&first).ok_or_else(|| TlsError::Unusable {
        what: "certificate",
        path: path.to_path_buf(),
        reason: "its serial number does not parse".to_string(),
    })
}

/// A serial number written in hex, as `openssl x509 -noout -serial`
/// prints it (`serial=0A1B2C`), with or without colons, in either case;
/// `None` if it is not hex.
pub fn serial_from_hex(text: &str) -> Option<Vec<u8>> {
    let digits: String = text
        .trim()
        .trim_start_matches("serial=")
        .chars()
        .filter(|c| *c != ':')
        .collect();
    if digits.is_empty() {
        return None;
    }
    let padded = if digits.len() % 2 == 1 {
        format!("0{digits}")
    } else {
        digits
    };
    hex::decode(padded)
        .ok()
        .map(|bytes| normalized_serial(&bytes))
}

/// A serial number's bytes without leading zero bytes (one zero byte for
/// the serial 0).
pub fn normalized_serial(bytes: &[u8]) -> Vec<u8> {
    let first = bytes
        .iter()
        .position(|byte| *byte != 0)
        .unwrap_or(bytes.len().saturating_sub(1));
    bytes[first..].to_vec()
}

/// The serial number of the client certificate verified on `request`'s
/// connection; `None` without TLS or without a client certificate.
pub fn client_certificate_serial<T>(request: &tonic::Request<T>) -> Option<Vec<u8>> {
    let certificates = verified_certificates(request)?;
    certificate_serial(certificates.first()?.as_ref())
}

/// The certificates the other side of `request`'s connection presented
/// and TLS verified (leaf first); `None` without TLS or without a client
/// certificate.
fn verified_certificates<T>(
    request: &tonic::Request<T>,
) -> Option<std::sync::Arc<Vec<tonic::transport::CertificateDer<'static>>>> {
    request
        .peer_certs()
        .filter(|certificates| !certificates.is_empty())
}

/// The Common Name of the client certificate verified on `request`'s
/// connection: `None` without TLS, without a client CA on the port (no
/// certificate is asked for), or if the certificate has no Common Name.
/// The certificate was verified against the port's client CA during the
/// handshake, so the name can be trusted to map to a user.
pub fn client_certificate_name<T>(request: &tonic::Request<T>) -> Option<String> {
    let certificates = verified_certificates(request)?;
    certificate_common_name(certificates.first()?.as_ref())
}

/// The DNS names of the certificate verified on `request`'s connection;
/// `None` without TLS or without a client certificate.
pub fn verified_dns_names<T>(request: &tonic::Request<T>) -> Option<Vec<String>> {
    let certificates = verified_certificates(request)?;
    Some(certificate_dns_names(certificates.first()?.as_ref()))
}

/// Whether the certificate verified on `request`'s connection is valid for
/// the DNS name `name` (a subject alternative name equal to it, ignoring
/// ASCII case). False without TLS or without a client certificate.
pub fn certificate_is_for<T>(request: &tonic::Request<T>, name: &str) -> bool {
    verified_dns_names(request)
        .is_some_and(|names| names.iter().any(|each| each.eq_ignore_ascii_case(name)))
}

/// The client port's TLS: the node's certificate and key, and optionally
/// the CA client certificates must come from.
#[derive(Clone)]
pub struct ServerTls {
    cert: PemFile,
    key: PemFile,
    client_ca: Option<PemFile>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ServerTls")
            .field("cert", &self.cert.path)
            .field("key", &self.key.path)
            .field("client_ca", &self.client_ca.as_ref().map(|ca| &ca.path))
            .finish()
    }
}

impl ServerTls {
    /// Reads and checks `files` (`files.ca`: the client CA, if clients
    /// must present certificates).
    pub fn load(files: &TlsFiles) -> Result<ServerTls, TlsError> {
        let cert = read(&files.cert, "certificate")?;
        certificates(&cert, "certificate")?;
        let key = read(&files.key, "private key")?;
        check_key(&key)?;
        let client_ca = match &files.ca {
            None => None,
            Some(path) => {
                let ca = read(path, "CA certificate")?;
                certificates(&ca, "CA certificate")?;
                Some(ca)
            }
        };
        let tls = ServerTls {
            cert,
            key,
            client_ca,
        };
        tonic::transport::Server::builder()
            .tls_config(tls.server_config())
            .map_err(|error| tls.refused(&error))?;
        Ok(tls)
    }

    /// Whether clients must present a certificate from the client CA.
    pub fn requires_client_certificate(&self) -> bool {
        self.client_ca.is_some()
    }

    fn refused(&self, error: &dyn std::error::Error) -> TlsError {
        TlsError::Refused {
            cert: self.cert.path.clone(),
            key: self.key.path.clone(),
            reason: error_chain(error),
        }
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert.text, &self.key.text)
    }

    /// tonic's server configuration of this port.
    pub fn server_config(&self) -> ServerTlsConfig {
        let config = ServerTlsConfig::new()
            .identity(self.identity())
            .timeout(HANDSHAKE_TIMEOUT);
        match &self.client_ca {
            Some(ca) => config.client_ca_root(Certificate::from_pem(&ca.text)),
            None => config,
        }
    }
}

/// The peer port's TLS, both ways: this node's certificate (valid for
/// `node-<id>`), its key, and the CA every peer's certificate comes from.
#[derive(Clone)]
pub struct PeerTls {
    tls: ServerTls,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls").field("tls", &self.tls).finish()
    }
}

impl PeerTls {
    /// Reads and checks `files` for node `id`: the CA is required, and the
    /// certificate must carry the DNS name `node-<id>`.
    pub fn load(id: NodeId, files: &TlsFiles) -> Result<PeerTls, TlsError> {
        if files.ca.is_none() {
            return Err(TlsError::NoPeerCa);
        }
        let tls = ServerTls::load(files)?;
        let expected = node_name(id);
        let leaf = certificates(&tls.cert, "certificate")?
            .into_iter()
            .next()
            .unwrap_or_default();
        let names = certificate_dns_names(&leaf);
        if !names
            .iter()
            .any(|name| name.eq_ignore_ascii_case(&expected))
        {
            return Err(TlsError::NotThisNode {
                path: tls.cert.path.clone(),
                id,
                expected,
                names,
            });
        }
        let peer = PeerTls { tls };
        tonic::transport::Endpoint::from_static("https://node-1:1")
            .tls_config(peer.client_config(1))
            .map_err(|error| peer.tls.refused(&error))?;
        Ok(peer)
    }

    /// tonic's server configuration of the peer port: a certificate from
    /// the peer CA is required.
    pub fn server_config(&self) -> ServerTlsConfig {
        self.tls.server_config()
    }

    /// tonic's client configuration for dialling node `target`: its
    /// certificate is verified against the peer CA for the name
    /// `node-<target>`, and this node presents its own.
    pub fn client_config(&self, target: NodeId) -> ClientTlsConfig {
        let config = ClientTlsConfig::new()
            .identity(self.tls.identity())
            .domain_name(node_name(target))
            .timeout(HANDSHAKE_TIMEOUT);
        match &self.tls.client_ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(&ca.text)),
            None => config,
        }
    }
}

impl PeerTls {
    /// Completes a TLS handshake with the node at `address` as this node
    /// would dial it as `node-<id>`: it must present a certificate of the
    /// peer CA valid for that name. `Err` says why it did not.
    pub async fn probe(&self, id: NodeId, address: &str) -> Result<(), String> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{address}"))
            .map_err(|e| format!("bad peer address {address:?}: {e}"))?
            .tls_config(self.client_config(id))
            .map_err(|e| error_chain(&e))?
            .connect_timeout(HANDSHAKE_TIMEOUT);
        match endpoint.connect().await {
            Ok(_) => Ok(()),
            Err(error) => Err(format!(
                "the TLS handshake with {address} as {} failed: {}",
                node_name(id),
                error_chain(&error)
            )),
        }
    }
}

/// An error and its sources, in one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_numbers_are_read_as_openssl_prints_them() {
        let expected = Some(vec![0x0a, 0x1b, 0x2c]);
        assert_eq!(serial_from_hex("serial=0A1B2C"), expected);
        assert_eq!(serial_from_hex("0a:1b:2c"), expected);
        assert_eq!(serial_from_hex(" A1B2C "), expected);
        assert_eq!(serial_from_hex("000A1B2C"), expected);
        assert_eq!(serial_from_hex("00"), Some(vec![0]));
        assert_eq!(serial_from_hex(""), None);
        assert_eq!(serial_from_hex("serial="), None);
        assert_eq!(serial_from_hex("0x12"), None);
        assert_eq!(normalized_serial(&[]), Vec::<u8>::new());
    }

    #[test]
    fn a_missing_file_is_named() {
        let files = TlsFiles {
            cert: PathBuf::from("/nonexistent/cert.pem"),
            key: PathBuf::from("/nonexistent/key.pem"),
            ca: None,
        };
        let error = ServerTls::load(&files).expect_err("no such file");
        assert!(
            error.to_string().contains("/nonexistent/cert.pem"),
            "{error}"
        );
    }

    #[test]
    fn a_file_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "not a certificate").expect("write");
        let files = TlsFiles {
            cert: cert.clone(),
            key: cert,
            ca: None,
        };
        let error = ServerTls::load(&files).expect_err("no certificate");
        assert!(matches!(error, TlsError::Unusable { .. }), "{error}");
        assert!(
            matches!(
                PeerTls::load(1, &files).expect_err("no CA"),
                TlsError::NoPeerCa
            ),
            "the peer port needs a CA"
        );
    }

    #[test]
    fn node_names_follow_the_convention() {
        assert_eq!(node_name(3), "node-3");
    }
}
