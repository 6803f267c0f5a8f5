//! `snapshot save` and `snapshot restore`: a backup of the whole replicated
//! state (data, sessions, completion records, leases, users) taken on the
//! leader, and a new cluster started from it, as `etcdctl snapshot
//! save/restore` do. A retry of a request answered before the backup is
//! still answered from its record after the restore.

use super::output::Printer;
use super::{EXIT_ERROR, EXIT_OK};
use anyhow::Context as _;
use clap::Subcommand;
use oncekv_client::Client;
use oncekv_server::backup::Backup;
use oncekv_state::LogIndex;
use serde_json::{Map, json};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Snapshot commands.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save a consistent copy of the whole state to FILE (mode 0600), taken
    /// on the leader after a read barrier: every acknowledged write is in
    /// it. Prints the index it was taken at and its SHA-256. Admin only
    /// once authentication is enabled.
    Save { file: PathBuf },
    /// Seed a new node's data directory from a saved FILE. Run it once per
    /// member of the new cluster, with the same --initial-cluster, then
    /// start each with `oncekv serve --id ID --data-dir DIR --initial-cluster
    /// ...` (and the same limit flags as the saved cluster, which the
    /// backup prints).
    Restore {
        file: PathBuf,
        /// The new node's data directory (must be empty or absent).
        #[arg(long)]
        data_dir: PathBuf,
        /// The new node's id.
        #[arg(long)]
        id: u64,
        /// The new cluster's members, ID=PEER/CLIENT,...
        #[arg(long)]
        initial_cluster: String,
    },
}

/// Writes `bytes` to `path` atomically, readable by the owner only.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if path.exists() {
        anyhow::bail!("{} exists: choose a new file", path.display());
    }
    let tmp = path.with_extension("part");
    let mut file = oncekv_server::private_fs::create(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Runs a `snapshot` command.
pub(super) async fn snapshot(
    client: &Client,
    printer: &Printer,
    command: SnapshotCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        SnapshotCommand::Save { file } => {
            let saved = match client.save_snapshot().await {
                Ok(saved) => saved,
                Err(error) => return Ok(printer.error(&error)),
            };
            let backup = Backup {
                applied_index: LogIndex(saved.applied_index),
                state: saved.state,
            };
            backup
                .check()
                .context("the received state does not restore")?;
            write_private(&file, &backup.encode())?;
            let mut fields = Map::new();
            fields.insert("outcome".into(), json!("ok"));
            fields.insert("file".into(), json!(file.display().to_string()));
            fields.insert("applied_index".into(), json!(saved.applied_index));
            fields.insert("bytes".into(), json!(backup.state.len()));
            fields.insert("sha256".into(), json!(backup.sha256_hex()));
            printer.emit(
                fields,
                format!(
                    "saved {} (index {}, {} bytes, sha256 {})",
                    file.display(),
                    saved.applied_index,
                    backup.state.len(),
                    backup.sha256_hex()
                ),
            );
            Ok(ExitCode::from(EXIT_OK))
        }
        SnapshotCommand::Restore {
            file,
            data_dir,
            id,
            initial_cluster,
        } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let members =
                crate::serve::parse_cluster(&initial_cluster).context("--initial-cluster")?;
            let backup = match Backup::decode(&bytes) {
                Ok(backup) => backup,
                Err(error) => {
                    eprintln!("error: {}: {error}", file.display());
                    return Ok(ExitCode::from(EXIT_ERROR));
                }
            };
            if let Err(error) =
                oncekv_server::backup::restore(&backup, &data_dir, id, &members).await
            {
                eprintln!("error: {error}");
                return Ok(ExitCode::from(EXIT_ERROR));
            }
            let limits = backup.limits()?;
            let mut fields = Map::new();
            fields.insert("outcome".into(), json!("ok"));
            fields.insert("data_dir".into(), json!(data_dir.display().to_string()));
            fields.insert("applied_index".into(), json!(backup.applied_index.0));
            printer.emit(
                fields,
                format!(
                    "restored index {} into {} for node {id}; start it with the saved cluster's limits \
                     (e.g. --sessions-max {} --store-bytes-max {})",
                    backup.applied_index.0,
                    data_dir.display(),
                    limits.sessions_max,
                    limits.store_bytes_max
                ),
            );
            Ok(ExitCode::from(EXIT_OK))
        }
    }
}
