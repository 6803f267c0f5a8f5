//! [`Connector`]: how the client reaches a node. The default dials TCP;
//! [`TlsConnector`] dials TLS (rustls, verifying the server against a CA,
//! presenting a client certificate if it has one, and putting TLS failures
//! in words: [`explain_tls_error`]); simulations inject their own
//! transport.

use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Channel, Endpoint};

/// Opens gRPC channels to node addresses.
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// A channel to `address` (`host:port`), connected lazily.
    fn channel(&self, address: &str) -> Result<Channel, String>;
}

/// Plain TCP with HTTP/2 keep-alives (so a dead connection is noticed) and
/// a connect timeout.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    fn channel(&self, address: &str) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("bad address {address:?}: {e}"))?
            .connect_timeout(Duration::from_millis(1000))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(2))
            .keep_alive_timeout(Duration::from_secs(3))
            .keep_alive_while_idle(true);
        Ok(endpoint.connect_lazy())
    }
}

/// The files of a TLS client: the CA the servers' certificates must come
/// from, and optionally this client's certificate and key (for a cluster
/// that requires client certificates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate(s) (PEM).
    pub ca: PathBuf,
    /// This client's certificate chain (PEM), if it presents one.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
}

/// Why a TLS client could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// A file could not be read or holds nothing usable.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A certificate without its key, or a key without its certificate.
    #[error("a client certificate needs its key and a key its certificate (--cert and --key)")]
    Incomplete,
    /// rustls refused the configuration.
    #[error("TLS configuration refused: {0}")]
    Refused(#[from] rustls::Error),
}

/// Why a TLS connection to a node failed, in words: its `Display` is what
/// a caller sees (the client's errors carry it as text).
#[derive(Debug, thiserror::Error)]
#[error("{words}")]
pub struct TlsConnectError {
    words: String,
    #[source]
    source: Option<std::io::Error>,
    /// Whether TLS itself refused the connection (a certificate, a name, a
    /// missing client certificate): a setting to fix, not a node to wait
    /// for.
    refused_by_tls: bool,
}

impl TlsConnectError {
    fn new(words: impl Into<String>, source: Option<std::io::Error>) -> TlsConnectError {
        TlsConnectError {
            words: words.into(),
            source,
            refused_by_tls: false,
        }
    }

    /// Whether TLS itself refused the connection (an expired or untrusted
    /// certificate, a host name it does not name, a client certificate
    /// missing or refused): retrying cannot help.
    pub fn refused_by_tls(&self) -> bool {
        self.refused_by_tls
    }
}

/// Walks `error`'s source chain for a rustls error and says what it means
/// for a client: a certificate that expired, one from another CA, one not
/// valid for the host dialled, a client certificate missing or refused,
/// or a server that does not speak TLS. `None` if there is no TLS error
/// in the chain. `host` is the host dialled, for the words.
pub fn explain_tls_error(error: &(dyn std::error::Error + 'static), host: &str) -> Option<String> {
    let mut next = Some(error);
    while let Some(current) = next {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(explain_rustls(tls, host));
        }
        if let Some(io) = current.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(tls) = inner.downcast_ref::<rustls::Error>()
        {
            return Some(explain_rustls(tls, host));
        }
        next = current.source();
    }
    None
}

fn explain_rustls(error: &rustls::Error, host: &str) -> String {
    use rustls::{AlertDescription, CertificateError, Error};
    match error {
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => {
            format!(
                "the server's certificate has expired ({error}): renew the certificate of {host}"
            )
        }
        Error::InvalidCertificate(
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
        ) => format!("the server's certificate is not valid yet ({error}): check the clocks"),
        Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => format!(
            "the server's certificate is not issued by the CA given (--cacert): unknown issuer, wrong CA? ({error})"
        ),
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the server's certificate is not valid for the host name {host:?} (host name mismatch): dial a host the certificate names ({error})"
        ),
        Error::InvalidCertificate(other) => {
            format!("the server's certificate is refused: {other:?}")
        }
        Error::AlertReceived(AlertDescription::CertificateRequired) => format!(
            "the server requires a client certificate and none was presented (give --cert and --key) ({error})"
        ),
        Error::AlertReceived(AlertDescription::CertificateExpired) => {
            format!("the server refused the client certificate: it has expired ({error})")
        }
        Error::AlertReceived(
            AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied
            | AlertDescription::DecryptError,
        ) => format!(
            "the server refused the client certificate (--cert): is it issued by the CA the server trusts? ({error})"
        ),
        Error::InvalidMessage(_) | Error::InappropriateMessage { .. } => format!(
            "the server at {host} does not speak TLS (is its port plaintext? then drop --cacert and https://) ({error})"
        ),
        other => format!("TLS failed: {other}"),
    }
}

/// The host of `host:port` (an IPv6 address without its brackets).
fn host_of(address: &str) -> &str {
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => address,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// `address` without a leading `https://` (or `http://`).
pub fn strip_scheme(address: &str) -> &str {
    address
        .strip_prefix("https://")
        .or_else(|| address.strip_prefix("http://"))
        .unwrap_or(address)
}

/// TLS over TCP (rustls, the `ring` provider), with the same timeouts and
/// keep-alives as [`TcpConnector`]. An address may be given as
/// `https://host:port` or `host:port`: both are dialled with TLS, the
/// server's certificate verified against the CA for `host`. This client
/// presents its certificate if it has one.
///
/// A connection counts as made only once the server has sent its first
/// bytes after the handshake: with TLS 1.3 a server checks the client's
/// certificate after the client considers the handshake done, and refuses
/// it with an alert the client reads only then. Waiting for it turns a
/// refused or missing client certificate into a failed connect (the
/// request was never sent) with words, instead of a broken call.
#[derive(Clone)]
pub struct TlsConnector {
    config: Arc<rustls::ClientConfig>,
    has_certificate: bool,
    /// A deadline for every call on its channels, if any.
    call_timeout: Option<Duration>,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("has_certificate", &self.has_certificate)
            .finish_non_exhaustive()
    }
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsConfigError {
    TlsConfigError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| file_error(path, error))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error(path, error))?;
    if certificates.is_empty() {
        return Err(file_error(path, "no CERTIFICATE block"));
    }
    Ok(certificates)
}

impl TlsConnector {
    /// A connector trusting the CA of `files` and presenting its client
    /// certificate, if any.
    pub fn new(files: &TlsFiles) -> Result<TlsConnector, TlsConfigError> {
        let mut roots = rustls::RootCertStore::empty();
        for certificate in read_certificates(&files.ca)? {
            roots
                .add(certificate)
                .map_err(|error| file_error(&files.ca, error))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let (mut config, has_certificate) = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => {
                let chain = read_certificates(cert)?;
                let key =
                    PrivateKeyDer::from_pem_file(key).map_err(|error| file_error(key, error))?;
                (builder.with_client_auth_cert(chain, key)?, true)
            }
            (None, None) => (builder.with_no_client_auth(), false),
            _ => return Err(TlsConfigError::Incomplete),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsConnector {
            config: Arc::new(config),
            has_certificate,
            call_timeout: None,
        })
    }

    /// Gives every call on its channels a deadline (the client sets its
    /// own per attempt; this is for callers that do not).
    pub fn with_call_timeout(mut self, timeout: Duration) -> TlsConnector {
        self.call_timeout = Some(timeout);
        self
    }

    /// Dials `address` (`host:port`), shakes hands and waits for the
    /// server's first bytes.
    async fn connect(
        config: Arc<rustls::ClientConfig>,
        address: String,
    ) -> Result<TokioIo<Primed<TlsStream<TcpStream>>>, TlsConnectError> {
        let host = host_of(&address).to_string();
        let name = ServerName::try_from(host.clone()).map_err(|error| {
            TlsConnectError::new(
                format!("{host:?} is not a host name TLS can verify: {error}"),
                None,
            )
        })?;
        let tcp = TcpStream::connect(&address).await.map_err(|error| {
            TlsConnectError::new(format!("tcp connect error: {error}"), Some(error))
        })?;
        let _ = tcp.set_nodelay(true);
        let explain = |error: std::io::Error| {
            let explained = explain_tls_error(&error, &host);
            let refused_by_tls = explained.is_some();
            let words = explained
                .unwrap_or_else(|| format!("TLS handshake with {address} failed: {error}"));
            TlsConnectError {
                refused_by_tls,
                ..TlsConnectError::new(words, Some(error))
            }
        };
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(explain)?;
        if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(TlsConnectError::new(
                format!("the server at {address} did not agree to HTTP/2 over TLS (ALPN h2)"),
                None,
            ));
        }
        let mut first = vec![0; 4096];
        let read = tls.read(&mut first).await.map_err(explain)?;
        if read == 0 {
            return Err(TlsConnectError::new(
                format!(
                    "the server at {address} closed the connection after the TLS handshake (it may have refused the client certificate)"
                ),
                None,
            ));
        }
        first.truncate(read);
        Ok(TokioIo::new(Primed {
            first,
            at: 0,
            inner: tls,
        }))
    }
}

impl Connector for TlsConnector {
    fn channel(&self, address: &str) -> Result<Channel, String> {
        let address = strip_scheme(address).to_string();
        // The URI is only HTTP/2's: the connector below does the TLS.
        let mut endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("bad address {address:?}: {e}"))?;
        if let Some(timeout) = self.call_timeout {
            endpoint = endpoint.timeout(timeout);
        }
        let endpoint = endpoint
            .connect_timeout(TLS_CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(2))
            .keep_alive_timeout(Duration::from_secs(3))
            .keep_alive_while_idle(true);
        let config = Arc::clone(&self.config);
        let connect = tower::service_fn(move |_uri: tonic::transport::Uri| {
            TlsConnector::connect(Arc::clone(&config), address.clone())
        });
        Ok(endpoint.connect_with_connector_lazy(connect))
    }
}

/// The longest a TLS connect (TCP, handshake, the server's first bytes)
/// may take.
const TLS_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A stream whose first bytes were read already: they are read again
/// first.
struct Primed<IO> {
    first: Vec<u8>,
    at: usize,
    inner: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Primed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if let Some(rest) = this.first.get(this.at..)
            && !rest.is_empty()
        {
            let take = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..take]);
            this.at = this.at.saturating_add(take);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Primed<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_schemes_are_read_from_addresses() {
        assert_eq!(host_of("127.0.0.1:7379"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7379"), "::1");
        assert_eq!(host_of("node-1"), "node-1");
        assert_eq!(strip_scheme("https://a:1"), "a:1");
        assert_eq!(strip_scheme("a:1"), "a:1");
    }

    #[test]
    fn rustls_errors_are_put_in_words() {
        let wrap =
            |error: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, error);
        let cases = [
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
                "unknown issuer",
            ),
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::Expired),
                "expired",
            ),
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName),
                "host name mismatch",
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
                "none was presented",
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA),
                "refused the client certificate",
            ),
        ];
        for (error, words) in cases {
            let explained = explain_tls_error(&wrap(error), "h").expect("a TLS error");
            assert!(explained.contains(words), "{explained}");
        }
        assert_eq!(explain_tls_error(&std::io::Error::other("x"), "h"), None);
    }
}
