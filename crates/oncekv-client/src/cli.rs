//! The flags of a command-line client (feature `cli`): how the `oncekv`
//! commands and `oncekv-bench` reach a cluster, and what they print.
//! Plaintext TCP, or TLS with `--cacert` (and a client certificate with
//! `--cert` and `--key`, for a cluster that requires one). An endpoint
//! written `https://host:port` means TLS too, and needs `--cacert`.

use crate::{ClientOptions, Connector, Credentials, TcpConnector, TlsConnector, TlsFiles};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Short human text.
    Text,
    /// One JSON object.
    Json,
}

/// Flags every client command takes.
#[derive(Debug, Args)]
pub struct Connection {
    /// Client addresses of cluster nodes, comma-separated.
    #[arg(
        long,
        global = true,
        env = "ONCEKV_ENDPOINTS",
        default_value = "127.0.0.1:7379",
        value_delimiter = ','
    )]
    pub endpoints: Vec<String>,

    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,

    /// Give up (outcome unknown, for a write) after this long.
    #[arg(long, global = true, default_value = "15s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    #[command(flatten)]
    pub tls: TlsArgs,

    /// Log in as USER (when the cluster enforces authentication), with
    /// USER:PASSWORD or the password in ONCEKV_PASSWORD.
    #[arg(
        id = "login",
        long = "user",
        global = true,
        env = "ONCEKV_USER",
        value_name = "USER[:PASSWORD]"
    )]
    pub login: Option<String>,
}

/// Flags that do not make a client: what is wrong with them, to be
/// printed as it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(String);

impl Connection {
    /// What every client of these flags uses: the deadline, the transport
    /// (TLS with `--cacert`) and the credentials (`--user`).
    pub fn client_options(&self) -> Result<ClientOptions, FlagError> {
        Ok(ClientOptions {
            deadline: self.timeout,
            connector: self.tls.connector(&self.endpoints)?,
            credentials: self.credentials()?,
            ..ClientOptions::default()
        })
    }

    /// The credentials `--user` gives, if any.
    fn credentials(&self) -> Result<Option<Credentials>, FlagError> {
        let Some(user) = &self.login else {
            return Ok(None);
        };
        if user.contains(':') {
            return Credentials::parse_user(user)
                .map(Some)
                .map_err(|e| FlagError(format!("--user: {e}")));
        }
        let password = std::env::var("ONCEKV_PASSWORD").map_err(|_| {
            FlagError(format!(
                "--user {user}: give the password as --user {user}:PASSWORD or in ONCEKV_PASSWORD"
            ))
        })?;
        Ok(Some(Credentials::Password {
            user: user.clone(),
            password,
        }))
    }
}

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
    /// The connector for `endpoints`: TLS with `--cacert` or an
    /// `https://` endpoint, plaintext TCP otherwise.
    pub fn connector(&self, endpoints: &[String]) -> Result<Arc<dyn Connector>, FlagError> {
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        let Some(ca) = &self.cacert else {
            if https {
                return Err(FlagError(
                    "an https:// endpoint needs --cacert FILE (the CA of the nodes' certificates)"
                        .into(),
                ));
            }
            if self.cert.is_some() || self.key.is_some() {
                return Err(FlagError(
                    "--cert and --key need --cacert FILE (the CA of the nodes' certificates)"
                        .into(),
                ));
            }
            return Ok(Arc::new(TcpConnector));
        };
        let files = TlsFiles {
            ca: ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        };
        let connector =
            TlsConnector::new(&files).map_err(|error| FlagError(format!("TLS: {error}")))?;
        Ok(Arc::new(connector))
    }
}
