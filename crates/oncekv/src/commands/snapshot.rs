//! `snapshot save` and `snapshot restore`: a backup of the whole replicated
//! state (data, sessions, completion records, leases, users) taken on the
//! leader, and a new cluster started from it, as `etcdctl snapshot
//! save/restore` do. A retry of a request answered before the backup is
//! still answered from its record after the restore.

use super::output::Printer;
use super::{EXIT_ERROR, EXIT_OK};
use anyhow::Context as _;
use clap::Subcommand;
use oncekv_client::{Client, SavedSnapshot};
use oncekv_server::backup::Backup;
use oncekv_state::LogIndex;
use serde_json::{Map, json};
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
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

/// Runs a `snapshot` command.
pub(super) async fn snapshot(
    client: &Client,
    printer: &Printer,
    command: SnapshotCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        SnapshotCommand::Save { file } => {
            if file.exists() {
                anyhow::bail!("{} exists: choose a new file", file.display());
            }
            // Written as it arrives into FILE.part, its header last, then
            // checked from disk and renamed: never the whole state in memory
            // but for the check's restore.
            let tmp = file.with_extension("part");
            let out = oncekv_server::private_fs::create(&tmp)
                .with_context(|| format!("creating {}", tmp.display()))?;
            let mut write_failed: Option<std::io::Error> = None;
            let saved = client
                .save_snapshot_with(|at, data| {
                    if write_failed.is_none()
                        && let Err(error) =
                            out.write_all_at(data, Backup::HEADER_BYTES.saturating_add(at))
                    {
                        write_failed = Some(error);
                    }
                })
                .await;
            let finish = |saved: &SavedSnapshot| -> anyhow::Result<()> {
                if let Some(error) = write_failed {
                    return Err(error).with_context(|| format!("writing {}", tmp.display()));
                }
                let header = Backup::header(LogIndex(saved.applied_index), &saved.sha256);
                out.set_len(Backup::HEADER_BYTES.saturating_add(saved.bytes))
                    .and_then(|()| out.write_all_at(&header, 0))
                    .and_then(|()| out.sync_all())
                    .with_context(|| format!("writing {}", tmp.display()))?;
                Backup::check_file(&tmp).context("the received state does not restore")?;
                std::fs::rename(&tmp, &file)
                    .with_context(|| format!("renaming to {}", file.display()))
            };
            let saved = match saved {
                Ok(saved) => match finish(&saved) {
                    Ok(()) => saved,
                    Err(error) => {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(error);
                    }
                },
                Err(error) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Ok(printer.error(&error));
                }
            };
            let sha256: String = saved.sha256.iter().map(|b| format!("{b:02x}")).collect();
            let mut fields = Map::new();
            fields.insert("outcome".into(), json!("ok"));
            fields.insert("file".into(), json!(file.display().to_string()));
            fields.insert("applied_index".into(), json!(saved.applied_index));
            fields.insert("bytes".into(), json!(saved.bytes));
            fields.insert("sha256".into(), json!(sha256));
            printer.emit(
                fields,
                format!(
                    "saved {} (index {}, {} bytes, sha256 {sha256})",
                    file.display(),
                    saved.applied_index,
                    saved.bytes,
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
