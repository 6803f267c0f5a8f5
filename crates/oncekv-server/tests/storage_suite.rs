//! openraft's own storage test suite, run against oncekv's durable
//! segment log and its state-machine store.

use oncekv_server::raft::segment_log::SegmentLog;
use oncekv_server::raft::state_machine_store::StateMachineStore;
use oncekv_server::raft::type_config::TypeConfig;
use oncekv_state::Limits;
use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};

struct Builder;

impl StoreBuilder<TypeConfig, SegmentLog, StateMachineStore, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, SegmentLog, StateMachineStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = SegmentLog::open(&dir.path().join("log")).expect("open log");
        let state = StateMachineStore::open(&dir.path().join("state"), Limits::default())
            .expect("open state machine store");
        Ok((dir, log, state))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder).await
}
