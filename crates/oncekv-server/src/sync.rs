//! The node's one policy for a panic and for the locks it poisons: a panic
//! anywhere in a node process is a crash ([`abort_on_panic`], installed by
//! the binaries: a replica that lost a task or half-applied an entry must
//! stop, not serve on), so no lock is ever seen poisoned in a running
//! node, and these helpers take the data of a poisoned lock as it is (in
//! an in-process test, the panic that poisoned it fails the test anyway).

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `mutex`.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Locks `lock` for reading.
pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Locks `lock` for writing.
pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Makes any panic, on any thread, end the process after the panic is
/// reported: a task that panics must not leave the node running without
/// it. For binaries; call once, early in `main`.
pub fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
}
