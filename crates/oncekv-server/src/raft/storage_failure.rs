//! [`StorageFailure`]: why a store stopped accepting writes. The durable
//! log and the state-machine store record the kind of their first failed
//! write or sync here, so the node can say why it stopped (a full disk
//! above all) from the error itself, not from openraft's text of it.

use std::io;
use std::sync::{Arc, Mutex};

/// The kind of a store's first failed write or sync, shared with whoever
/// reports the node's exit.
#[derive(Clone, Debug, Default)]
pub struct StorageFailure(Arc<Mutex<Option<io::ErrorKind>>>);

impl StorageFailure {
    /// The kind of the first failed write or sync, if one failed.
    pub fn kind(&self) -> Option<io::ErrorKind> {
        *crate::sync::lock(&self.0)
    }

    /// Records a failed write or sync (the first one counts).
    pub fn record(&self, error: &io::Error) {
        // ENOSPC is StorageFull; naming it by its code too keeps that true
        // for errors built from a raw OS error on any platform mapping.
        let kind = match error.raw_os_error() {
            Some(28) => io::ErrorKind::StorageFull,
            _ => error.kind(),
        };
        crate::sync::lock(&self.0).get_or_insert(kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_kept_and_a_full_disk_is_named_by_its_code() {
        let failure = StorageFailure::default();
        assert_eq!(failure.kind(), None);
        failure.record(&io::Error::from_raw_os_error(28));
        failure.record(&io::Error::other("later"));
        assert_eq!(failure.kind(), Some(io::ErrorKind::StorageFull));
        assert_eq!(failure.clone().kind(), Some(io::ErrorKind::StorageFull));
    }
}
