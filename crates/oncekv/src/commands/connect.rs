//! How client commands reach the cluster: plaintext TCP, or TLS with
//! `--cacert` (and a client certificate with `--cert` and `--key`, for a
//! cluster that requires one). An endpoint written `https://host:port`
//! means TLS too, and needs `--cacert`.

use anyhow::{anyhow, bail};
use clap::Args;
use oncekv_client::{Connector, TcpConnector, TlsConnector, TlsFiles};
use std::path::PathBuf;
use std::sync::Arc;

/// TLS flags of every client command.
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// Connect with TLS, trusting the CA in FILE (PEM) for the nodes'
    /// certificates. Endpoints may then be written host:port or
    /// https://host:port.
    #[arg(
        long = "cacert",
        id = "tls_cacert",
        global = true,
        env = "ONCEKV_CACERT",
        value_name = "FILE"
    )]
    pub cacert: Option<PathBuf>,

    /// With --cacert: present this client certificate (PEM), for a cluster
    /// serving with --client-ca-file.
    #[arg(
        long = "cert",
        id = "tls_client_cert",
        global = true,
        env = "ONCEKV_CERT",
        value_name = "FILE"
    )]
    pub cert: Option<PathBuf>,

    /// The private key of --cert (PEM).
    #[arg(
        long = "key",
        id = "tls_client_key",
        global = true,
        env = "ONCEKV_KEY",
        value_name = "FILE"
    )]
    pub key: Option<PathBuf>,
}

impl TlsArgs {
    /// The same TLS settings for etcd's client (`oncekv bench --target
    /// etcd` against an etcd serving TLS): `None` without `--cacert`.
    #[cfg(feature = "etcd")]
    pub fn etcd_options(&self) -> anyhow::Result<Option<etcd_client::TlsOptions>> {
        let Some(ca) = &self.cacert else {
            return Ok(None);
        };
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| anyhow!("reading {}: {e}", path.display()))
        };
        let mut tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(Some(tls))
    }

    /// The connector for `endpoints`: TLS with `--cacert` or an
    /// `https://` endpoint, plaintext TCP otherwise.
    pub fn connector(&self, endpoints: &[String]) -> anyhow::Result<Arc<dyn Connector>> {
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        let Some(ca) = &self.cacert else {
            if https {
                bail!(
                    "an https:// endpoint needs --cacert FILE (the CA of the nodes' certificates)"
                );
            }
            if self.cert.is_some() || self.key.is_some() {
                bail!("--cert and --key need --cacert FILE (the CA of the nodes' certificates)");
            }
            return Ok(Arc::new(TcpConnector));
        };
        let files = TlsFiles {
            ca: ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        };
        let connector = TlsConnector::new(&files).map_err(|error| anyhow!("TLS: {error}"))?;
        Ok(Arc::new(connector))
    }
}
