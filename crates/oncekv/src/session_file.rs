//! Session files: a session saved on disk so separate `oncekv` invocations
//! share it. The file holds the secret (created with mode 0600), the next
//! sequence number and the sequence numbers in flight; every change happens
//! under an exclusive file lock, so concurrent invocations never reuse a
//! number.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// What a session file holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionFile {
    /// The session id.
    pub session_id: u64,
    /// The secret, 32 hex digits.
    pub secret: String,
    /// The session's TTL.
    pub ttl_ms: u64,
    /// The session's window.
    pub window: u32,
    /// The next sequence number to use.
    pub next_seq: u64,
    /// Sequence numbers sent and not yet answered.
    #[serde(default)]
    pub pending: BTreeSet<u64>,
}

impl SessionFile {
    /// The secret as a number.
    pub fn secret(&self) -> anyhow::Result<u128> {
        u128::from_str_radix(&self.secret, 16).context("session file: bad secret")
    }

    /// Creates `path` (refusing to overwrite) with mode 0600.
    pub fn create(path: &Path, file: &SessionFile) -> anyhow::Result<()> {
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut handle = options
            .open(path)
            .with_context(|| format!("cannot create session file {}", path.display()))?;
        handle.write_all(serde_json::to_string_pretty(file)?.as_bytes())?;
        handle.sync_all()?;
        Ok(())
    }

    /// Reads `path`, applies `change` under an exclusive lock, and writes
    /// the result back. Returns what `change` returned.
    pub fn update<T>(
        path: &Path,
        change: impl FnOnce(&mut SessionFile) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let mut handle = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("cannot open session file {}", path.display()))?;
        handle
            .lock()
            .with_context(|| format!("cannot lock {}", path.display()))?;
        let mut text = String::new();
        handle.read_to_string(&mut text)?;
        let mut file: SessionFile = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a session file", path.display()))?;
        let result = change(&mut file)?;
        write_back(&mut handle, &file)?;
        handle.unlock()?;
        Ok(result)
    }

    /// Reads `path` without changing it.
    pub fn read(path: &Path) -> anyhow::Result<SessionFile> {
        Self::update(path, |file| Ok(file.clone()))
    }
}

fn write_back(handle: &mut File, file: &SessionFile) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(file)?;
    handle.seek(SeekFrom::Start(0))?;
    handle.set_len(0)?;
    handle.write_all(text.as_bytes())?;
    handle.sync_all()?;
    if text.is_empty() {
        bail!("empty session file");
    }
    Ok(())
}
