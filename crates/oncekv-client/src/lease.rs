//! Leases from the client: grant, keep alive in the background, revoke.
//! Each call is a one-shot request under an idempotency key, so a retried
//! grant returns the original grant instead of `LeaseExists`.
//!
//! A lease is its granter's: while the cluster enforces authentication,
//! renewing, revoking, listing or attaching keys to another user's lease
//! is refused ([`ClientError::PermissionDenied`]), and so is granting a
//! name another user holds; an admin may use any lease.

use crate::client::Client;
use crate::error::ClientError;
use oncekv_state::{Command, Reply};
use std::time::Duration;

/// Keeps a lease alive until dropped.
#[derive(Debug)]
pub struct LeaseKeeper {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

impl Client {
    /// Grants lease `name` for `ttl`.
    pub async fn lease_grant(&self, name: &str, ttl: Duration) -> Result<Reply, ClientError> {
        let command = Command::LeaseGrant {
            name: name.to_string(),
            ttl_ms: ttl_ms(ttl),
        };
        Ok(self.execute_once(command, None).await?.reply)
    }

    /// Renews lease `name` once.
    pub async fn lease_keep_alive(&self, name: &str) -> Result<Reply, ClientError> {
        let command = Command::LeaseKeepAlive {
            name: name.to_string(),
        };
        Ok(self.execute_once(command, None).await?.reply)
    }

    /// Revokes lease `name`, deleting its keys.
    pub async fn lease_revoke(&self, name: &str) -> Result<Reply, ClientError> {
        let command = Command::LeaseRevoke {
            name: name.to_string(),
        };
        Ok(self.execute_once(command, None).await?.reply)
    }

    /// Renews lease `name` every `ttl / 4` in the background until the
    /// returned keeper is dropped, or the lease is gone or not this
    /// user's.
    pub fn keep_lease_alive(&self, name: &str, ttl: Duration) -> LeaseKeeper {
        let client = self.clone();
        let name = name.to_string();
        let period = (ttl / 4).max(Duration::from_millis(20));
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                match client.lease_keep_alive(&name).await {
                    Err(ClientError::Rejected(_) | ClientError::PermissionDenied(_)) => return,
                    Err(error) => tracing::debug!(%error, lease = %name, "lease keep-alive failed"),
                    Ok(_) => {}
                }
            }
        });
        LeaseKeeper { task }
    }
}
