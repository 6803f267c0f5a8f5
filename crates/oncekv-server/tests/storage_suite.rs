//! openraft's own storage test suite, run against oncekv's durable
//! segment log and its state-machine store: with the writer thread, and
//! with disk writes on the calling task (as under simulation).

use oncekv_server::raft::segment_log::SegmentLog;
use oncekv_server::raft::state_machine_store::StateMachineStore;
use oncekv_server::raft::type_config::TypeConfig;
use oncekv_state::Limits;
use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};

/// Builds a fresh log and store in a temp dir; `inline` picks the mode.
struct Builder {
    inline: bool,
}

impl StoreBuilder<TypeConfig, SegmentLog, StateMachineStore, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, SegmentLog, StateMachineStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log_dir = dir.path().join("log");
        let log = if self.inline {
            SegmentLog::open_inline(&log_dir)
        } else {
            SegmentLog::open(&log_dir)
        }
        .expect("open log");
        let mut state = StateMachineStore::open(&dir.path().join("state"), Limits::default())
            .expect("open state machine store");
        if self.inline {
            state = state.with_inline_io();
        }
        Ok((dir, log, state))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder { inline: false }).await
}

#[tokio::test(flavor = "current_thread")]
async fn openraft_storage_suite_passes_with_inline_disk_writes()
-> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder { inline: true }).await
}
