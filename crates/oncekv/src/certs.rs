//! `oncekv certs`: makes the certificates of a TLS cluster (a CA, one
//! certificate per node, client certificates) as PEM files in a
//! directory, and the shared peer token of a cluster
//! (`create-token`, for `oncekv serve --peer-token-file`), with the one
//! implementation in `oncekv_server::certs`.

use crate::exit;
use clap::{Args, Subcommand};
use oncekv_server::certs::{
    CA_DAYS_DEFAULT, CertError, CertFiles, LEAF_DAYS_DEFAULT, create_ca, create_client,
    create_node, create_token,
};
use std::path::PathBuf;
use std::process::ExitCode;

const AFTER_HELP: &str = "\
A three-node cluster on one machine (see docs/security.md):
  oncekv certs create-ca --dir certs
  oncekv certs create-node --dir certs --id 1     (and --id 2, --id 3)
  oncekv certs create-client --dir certs --user alice
  oncekv serve --id 1 --cert-file certs/node-1.pem --key-file certs/node-1-key.pem \\
      --peer-cert-file certs/node-1.pem --peer-key-file certs/node-1-key.pem \\
      --peer-ca-file certs/ca.pem ...
  oncekv --cacert certs/ca.pem --endpoints https://127.0.0.1:7379 status

Files: ca.pem, ca-key.pem, node-N.pem, node-N-key.pem, client-NAME.pem,
client-NAME-key.pem. Key files are written mode 0600; keep ca-key.pem off
the nodes. No file is ever overwritten: an existing one is an error.

Or, or as well, a shared cluster secret that every peer message carries:
  oncekv certs create-token --out peer-token
  oncekv serve --id 1 --peer-token-file peer-token ...   (the same file on every node)
The token is 32 random bytes in hex, mode 0600; copy it to every node over
a channel you trust. Without TLS it crosses the network in clear: on a
network others can watch, use it with peer TLS.";

/// Flags of `oncekv certs`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

// The subcommands are named as typed: `create-ca`, `create-node`, ...
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Make a certificate authority: DIR/ca.pem and DIR/ca-key.pem.
    CreateCa {
        /// Directory to write to (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// Days the CA is valid.
        #[arg(long, default_value_t = CA_DAYS_DEFAULT)]
        days: u32,
    },
    /// Make node N's certificate, signed by DIR's CA: DNS name node-N (what
    /// peers verify) and the hosts it serves on; usable for the client
    /// port, the peer port and dialling peers.
    CreateNode {
        /// Directory holding the CA, and to write to.
        #[arg(long)]
        dir: PathBuf,
        /// The node's id (as in `oncekv serve --id`).
        #[arg(long)]
        id: u64,
        /// A host name or IP address clients and peers use to reach the
        /// node (repeat for several) [default: 127.0.0.1 and localhost].
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = LEAF_DAYS_DEFAULT)]
        days: u32,
    },
    /// Make a client certificate for the user given with --user NAME (its
    /// Common Name: a cluster enforcing users takes it as that user),
    /// signed by DIR's CA, for a cluster serving with --client-ca-file.
    CreateClient {
        /// Directory holding the CA, and to write to.
        #[arg(long)]
        dir: PathBuf,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = LEAF_DAYS_DEFAULT)]
        days: u32,
    },
    /// Make a cluster's shared peer secret for `oncekv serve
    /// --peer-token-file`: 32 random bytes, hex-encoded, in a file of mode
    /// 0600. Give every node of the cluster the same file.
    CreateToken {
        /// The file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Replace the file if it exists (a new secret: every node must be
        /// restarted with it).
        #[arg(long)]
        force: bool,
    },
}

/// Runs `oncekv certs`; returns the documented exit code. `user` is the
/// global `--user` flag (`USER[:PASSWORD]`; only USER is used), the user
/// of `create-client`.
pub fn run(args: CertsArgs, user: Option<&str>) -> ExitCode {
    let pair = |files: CertFiles| vec![files.cert, files.key];
    let result: Result<Vec<PathBuf>, CertError> = match &args.command {
        CertsCommand::CreateCa { dir, days } => create_ca(dir, *days).map(pair),
        CertsCommand::CreateNode {
            dir,
            id,
            hosts,
            days,
        } => create_node(dir, *id, hosts, *days).map(pair),
        CertsCommand::CreateClient { dir, days } => {
            let Some(user) = user.and_then(|user| user.split(':').next()) else {
                eprintln!("error: create-client needs --user NAME (the certificate's Common Name)");
                return exit::code(exit::USAGE);
            };
            create_client(dir, user, *days).map(pair)
        }
        CertsCommand::CreateToken { out, force } => {
            create_token(out, *force).map(|()| vec![out.clone()])
        }
    };
    match result {
        Ok(files) => {
            for file in files {
                sayln!("{}", file.display());
            }
            ExitCode::SUCCESS
        }
        Err(CertError::Exists(path))
            if matches!(args.command, CertsCommand::CreateToken { .. }) =>
        {
            eprintln!(
                "error: {} exists already: refusing to overwrite it (--force replaces it with a \
                 new token, which every node must then be restarted with)",
                path.display()
            );
            exit::code(exit::ERROR)
        }
        Err(error) => {
            eprintln!("error: {error}");
            match error {
                CertError::BadName(_) => exit::code(exit::USAGE),
                _ => exit::code(exit::ERROR),
            }
        }
    }
}
