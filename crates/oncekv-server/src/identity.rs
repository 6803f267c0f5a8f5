//! The data directory's identity: which node id and which initial cluster
//! it was created for. Checked on every start, so a data directory is never
//! reused by another node or joined to another cluster by mistake.

use crate::raft::type_config::{NodeId, NodeInfo};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

const IDENTITY_FILE: &str = "identity";

/// Why the data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The directory cannot be created, written or read.
    #[error("data directory {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The directory belongs to another node.
    #[error(
        "data directory {path} belongs to node {found}, not node {wanted}; use that node's --id or another --data-dir"
    )]
    OtherNode {
        /// The directory.
        path: PathBuf,
        /// The id recorded in it.
        found: NodeId,
        /// The id asked for.
        wanted: NodeId,
    },
    /// The directory was created for another cluster.
    #[error(
        "data directory {path} was created for cluster [{found}], not [{wanted}]; the initial cluster cannot change after first start (use `oncekv member` to change membership)"
    )]
    OtherCluster {
        /// The directory.
        path: PathBuf,
        /// The cluster recorded in it.
        found: String,
        /// The cluster asked for.
        wanted: String,
    },
    /// The identity file is unreadable.
    #[error("data directory {path}: identity file is corrupt: {reason}")]
    Corrupt {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Renders an initial cluster the way it is recorded: `1=peer,2=peer`.
pub fn describe_cluster(members: &BTreeMap<NodeId, NodeInfo>) -> String {
    members
        .iter()
        .map(|(id, info)| format!("{id}={}", info.peer_address))
        .collect::<Vec<_>>()
        .join(",")
}

/// The id of the cluster an initial membership founds: FNV-1a (64 bits) of
/// its description ([`describe_cluster`]), stable across nodes and
/// releases. Every founding member computes it from its configuration,
/// and records it in its state machine when the founding membership
/// entry applies, so members that join later report it too.
pub fn cluster_id(members: &BTreeMap<NodeId, NodeInfo>) -> u64 {
    description_id(&describe_cluster(members))
}

/// The id of the cluster `description` ([`describe_cluster`]) describes.
pub fn description_id(description: &str) -> u64 {
    fnv1a(description.as_bytes())
}

/// FNV-1a, 64 bits: a stable hash (the same on every node and release).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Checks (or, on first start, records) that `dir` belongs to node `id` of
/// the cluster `cluster`. Returns whether this is the first start.
pub fn check_or_record(dir: &Path, id: NodeId, cluster: &str) -> Result<bool, IdentityError> {
    let io = |source| IdentityError::Io {
        path: dir.to_path_buf(),
        source,
    };
    crate::private_fs::create_dir(dir).map_err(io)?;
    let path = dir.join(IDENTITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let corrupt = |reason: &str| IdentityError::Corrupt {
                path: dir.to_path_buf(),
                reason: reason.to_string(),
            };
            let mut found_id = None;
            let mut found_cluster = None;
            for line in text.lines() {
                match line.split_once('=') {
                    Some(("id", value)) => {
                        found_id = Some(value.parse::<NodeId>().map_err(|_| corrupt("bad id"))?)
                    }
                    Some(("cluster", value)) => found_cluster = Some(value.to_string()),
                    _ => {}
                }
            }
            let found_id = found_id.ok_or_else(|| corrupt("no id"))?;
            let found_cluster = found_cluster.ok_or_else(|| corrupt("no cluster"))?;
            if found_id != id {
                return Err(IdentityError::OtherNode {
                    path: dir.to_path_buf(),
                    found: found_id,
                    wanted: id,
                });
            }
            if found_cluster != cluster {
                return Err(IdentityError::OtherCluster {
                    path: dir.to_path_buf(),
                    found: found_cluster,
                    wanted: cluster.to_string(),
                });
            }
            Ok(false)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let tmp = dir.join(format!("{IDENTITY_FILE}.tmp"));
            let io = |source| IdentityError::Io {
                path: tmp.clone(),
                source,
            };
            let mut file = crate::private_fs::create(&tmp).map_err(io)?;
            file.write_all(format!("id={id}\ncluster={cluster}\n").as_bytes())
                .map_err(io)?;
            file.sync_all().map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io)?;
            Ok(true)
        }
        Err(source) => Err(IdentityError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_then_checks() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(check_or_record(dir.path(), 1, "1=a").expect("first"));
        assert!(!check_or_record(dir.path(), 1, "1=a").expect("again"));
        assert!(matches!(
            check_or_record(dir.path(), 2, "1=a"),
            Err(IdentityError::OtherNode { .. })
        ));
        assert!(matches!(
            check_or_record(dir.path(), 1, "1=b"),
            Err(IdentityError::OtherCluster { .. })
        ));
    }
}
