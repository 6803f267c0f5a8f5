//! Distributed locks and leader elections, built the way etcd's
//! concurrency recipes are: on leases, revisions and watches.
//!
//! A contender for `NAME` holds a lease (kept alive in the background
//! while it contends) and one key, `NAME/<owner id>`, attached to it. The
//! key is created by one transaction on a [`Session`]: *if the key's create
//! revision is 0, put it (with the lease), else get it*; so a retried
//! acquire (a retried request, or a second call on the same session)
//! answers the same key and the same revision: the same ownership. The
//! owner is the key under `NAME/` with the lowest create revision; every
//! other contender watches the deletion of its predecessor (the key with
//! the next-lower create revision) and then looks again. The owner's
//! **fencing token** is its key's create revision: it grows with every new
//! owner, so a resource that remembers the highest token it has seen can
//! refuse a stale owner.
//!
//! [`Lock::unlock`] and [`Election::resign`] delete the key and revoke the
//! lease. A contender whose process dies stops keeping its lease alive:
//! the cluster ends the lease after its TTL, deleting the key, and the
//! next contender takes over.
//!
//! The owner id defaults to the session's id (unique in the cluster: the
//! log index that opened it), so the contenders of one session for one
//! name share a key, as etcd's do for one session; give each its own
//! owner id ([`Lock::with_owner`]) to have them exclude each other.
//!
//! A contender uses only a lease it owns, and checks that before acting.
//! The lease's name is derived from the session's secret and the key
//! ([`lease_name`]), so no one without the secret can know it before it is
//! granted (another user cannot grant it first, with a short TTL, and have
//! the holder's key freed early); the grant must answer that it granted the
//! lease, or that this session's lease of that name exists (a second
//! contender of the session for the same key); a grant refused because
//! another user holds the name ends the acquire with that refusal, never
//! uses the lease. A key found existing must be attached to the
//! contender's own lease (compared, with its create revision, in a
//! transaction of its own), else the acquire ends with an error: a key on
//! a lease the contender does not keep alive is freed whenever that lease
//! ends, and two holders would run at once. Releasing deletes the key only
//! while it is on the contender's lease.

use crate::client::Client;
use crate::error::ClientError;
use crate::lease::LeaseKeeper;
use crate::session::Session;
use crate::watch::{EventKind, WatchOptions, WatchUpdate};
use oncekv_state::{
    Command, Compare, CompareOp, CompareTarget, KeyScope, KeyValue, Rejection, Reply, Txn, TxnOp,
};
use sha2::{Digest as _, Sha256};
use std::time::Duration;

/// The TTL of a contender's lease unless given.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// What a contender holds once its key is created: its key and that key's
/// create revision (the fencing token once it owns the lock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ownership {
    /// The contender's key, `NAME/<owner id>`.
    pub key: Vec<u8>,
    /// The key's create revision: the fencing token.
    pub revision: u64,
}

/// The leader of an election: the key with the lowest create revision
/// under `NAME/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's key.
    pub key: Vec<u8>,
    /// The value it campaigned (or last proclaimed) with.
    pub value: Vec<u8>,
    /// Its key's create revision (the leadership's fencing token).
    pub revision: u64,
}

impl From<KeyValue> for Leader {
    fn from(kv: KeyValue) -> Leader {
        Leader {
            key: kv.key,
            value: kv.value,
            revision: kv.meta.create_revision,
        }
    }
}

/// The prefix of `name`'s contenders' keys.
fn prefix_of(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The name of the lease a contender holding `key` on a session with
/// `secret` uses: `contend-` and 128 bits of a SHA-256 of both, in hex.
/// The same for every contender of the session for the key, and not
/// known to anyone without the session's secret until it is granted.
fn lease_name(secret: oncekv_state::Secret, key: &[u8]) -> String {
    let digest = Sha256::new()
        .chain_update(b"oncekv contender lease\0")
        .chain_update(secret.0.to_le_bytes())
        .chain_update(key)
        .finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("contend-{hex}")
}

/// The contenders under `prefix`, oldest (lowest create revision) first.
async fn contenders(client: &Client, prefix: &[u8]) -> Result<Vec<KeyValue>, ClientError> {
    let page = client.scan(prefix.to_vec(), 0).await?;
    if page.more {
        return Err(ClientError::Invalid(format!(
            "more contenders under {:?} than one scan returns",
            String::from_utf8_lossy(prefix)
        )));
    }
    let mut entries = page.entries;
    entries.sort_by_key(|kv| kv.meta.create_revision);
    Ok(entries)
}

/// The error of a contender whose key is gone (its lease ended).
fn lost(lease: &str) -> ClientError {
    ClientError::Rejected(Rejection::LeaseNotFound {
        name: lease.to_string(),
    })
}

/// One contender: the part locks and elections share.
#[derive(Debug)]
struct Contender {
    session: Session,
    prefix: Vec<u8>,
    key: Vec<u8>,
    lease: String,
    ttl: Duration,
    keeper: Option<LeaseKeeper>,
    held: Option<Ownership>,
}

impl Contender {
    fn new(session: &Session, name: &[u8], ttl: Duration) -> Contender {
        let prefix = prefix_of(name);
        let mut contender = Contender {
            session: session.clone(),
            key: Vec::new(),
            lease: String::new(),
            prefix,
            ttl,
            keeper: None,
            held: None,
        };
        contender.set_owner(&format!("{:016x}", session.id().0));
        contender
    }

    fn set_owner(&mut self, owner: &str) {
        self.key = [self.prefix.as_slice(), owner.as_bytes()].concat();
        self.lease = lease_name(self.session.secret(), &self.key);
    }

    fn client(&self) -> &Client {
        self.session.client()
    }

    /// Grants the lease and keeps it alive. Once: an existing lease of
    /// this name is this session's (its name follows from the session's
    /// secret), granted by another contender of the session for the same
    /// key; one another user holds is refused by the cluster, and that
    /// refusal ends the acquire.
    async fn grant(&mut self) -> Result<(), ClientError> {
        if self.keeper.is_some() {
            return Ok(());
        }
        let command = Command::LeaseGrant {
            name: self.lease.clone(),
            ttl_ms: u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX),
        };
        match self.session.execute(command).await {
            // An existing lease of this name is this session's own (the
            // cluster refuses another user's, below).
            Ok(Reply::LeaseGranted { .. })
            | Ok(Reply::Rejected(Rejection::LeaseExists { .. }))
            | Err(ClientError::Rejected(Rejection::LeaseExists { .. })) => {}
            Err(ClientError::PermissionDenied(why)) => {
                return Err(ClientError::PermissionDenied(format!(
                    "lease {} of contender {:?} is another user's, not used: {why}",
                    self.lease,
                    String::from_utf8_lossy(&self.key)
                )));
            }
            Ok(Reply::Rejected(rejection)) => return Err(ClientError::Rejected(rejection)),
            Ok(other) => {
                return Err(ClientError::Invalid(format!(
                    "unexpected reply to a lease grant: {other:?}"
                )));
            }
            Err(error) => return Err(error),
        }
        self.keeper = Some(self.client().keep_lease_alive(&self.lease, self.ttl));
        Ok(())
    }

    /// Creates the key (with `value`) unless it exists; either way answers
    /// its create revision. A key that exists attached to another lease
    /// than this contender's is not its to hold: an error.
    async fn queue(&mut self, value: &[u8]) -> Result<Ownership, ClientError> {
        self.grant().await?;
        let txn = Txn {
            compare: vec![Compare {
                key: self.key.clone(),
                scope: KeyScope::Key,
                target: CompareTarget::CreateRevision(0),
                op: CompareOp::Equal,
            }],
            success: vec![
                TxnOp::Put {
                    key: self.key.clone(),
                    value: value.to_vec(),
                    lease: Some(self.lease.clone()),
                },
                TxnOp::Get {
                    key: self.key.clone(),
                },
            ],
            failure: vec![TxnOp::Get {
                key: self.key.clone(),
            }],
        };
        let outcome = self.session.txn(txn).await?;
        let revision = match outcome.results.last() {
            Some(Reply::Get {
                meta: Some(meta), ..
            }) => meta.create_revision,
            Some(Reply::Rejected(rejection)) => {
                return Err(ClientError::Rejected(rejection.clone()));
            }
            other => {
                return Err(ClientError::Invalid(format!(
                    "unexpected transaction result: {other:?}"
                )));
            }
        };
        if !outcome.succeeded {
            self.check_attached(revision).await?;
        }
        Ok(Ownership {
            key: self.key.clone(),
            revision,
        })
    }

    /// Checks that the key, created at `revision`, is attached to this
    /// contender's lease (one read-only transaction).
    async fn check_attached(&self, revision: u64) -> Result<(), ClientError> {
        let compare = |target| Compare {
            key: self.key.clone(),
            scope: KeyScope::Key,
            target,
            op: CompareOp::Equal,
        };
        let txn = Txn {
            compare: vec![
                compare(CompareTarget::CreateRevision(revision)),
                compare(CompareTarget::Lease(Some(self.lease.clone()))),
            ],
            success: Vec::new(),
            failure: Vec::new(),
        };
        if self.session.txn(txn).await?.succeeded {
            return Ok(());
        }
        Err(ClientError::Invalid(format!(
            "key {:?} exists attached to another lease than this contender's ({}): \
             another contender holds it, not this one",
            String::from_utf8_lossy(&self.key),
            self.lease
        )))
    }

    /// Waits until `mine` is the oldest contender.
    async fn wait_turn(&self, mine: &Ownership) -> Result<(), ClientError> {
        loop {
            let all = contenders(self.client(), &self.prefix).await?;
            if !all
                .iter()
                .any(|kv| kv.key == mine.key && kv.meta.create_revision == mine.revision)
            {
                return Err(lost(&self.lease));
            }
            let Some(predecessor) = all
                .iter()
                .rev()
                .find(|kv| kv.meta.create_revision < mine.revision)
            else {
                return Ok(());
            };
            match wait_deleted(self.client(), predecessor).await {
                Ok(()) | Err(ClientError::Rejected(Rejection::Compacted { .. })) => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// Queues and waits to own.
    async fn acquire(&mut self, value: &[u8]) -> Result<Ownership, ClientError> {
        let mine = self.queue(value).await?;
        self.wait_turn(&mine).await?;
        self.held = Some(mine.clone());
        Ok(mine)
    }

    /// Deletes the key (if it is on the contender's lease) and revokes
    /// the lease.
    async fn release(&mut self) -> Result<(), ClientError> {
        self.keeper = None;
        self.held = None;
        // Only while the key is on this contender's lease: a key of its
        // name on another lease is not its to delete.
        let delete = Txn {
            compare: vec![Compare {
                key: self.key.clone(),
                scope: KeyScope::Key,
                target: CompareTarget::Lease(Some(self.lease.clone())),
                op: CompareOp::Equal,
            }],
            success: vec![TxnOp::Delete {
                key: self.key.clone(),
            }],
            failure: Vec::new(),
        };
        self.session.txn(delete).await?;
        let revoke = Command::LeaseRevoke {
            name: self.lease.clone(),
        };
        match self.session.execute(revoke).await {
            Ok(Reply::LeaseRevoked { .. })
            | Ok(Reply::Rejected(Rejection::LeaseNotFound { .. }))
            | Err(ClientError::Rejected(Rejection::LeaseNotFound { .. })) => Ok(()),
            Ok(Reply::Rejected(rejection)) => Err(ClientError::Rejected(rejection)),
            Ok(other) => Err(ClientError::Invalid(format!(
                "unexpected reply to a lease revoke: {other:?}"
            ))),
            Err(error) => Err(error),
        }
    }

    /// Returns when the held key is gone (its lease ended, or someone
    /// deleted it): ownership is lost.
    async fn lost(&self) -> Result<(), ClientError> {
        let Some(mine) = &self.held else {
            return Ok(());
        };
        loop {
            match self.client().get_kv(mine.key.clone(), None).await? {
                Some(kv) if kv.meta.create_revision == mine.revision => {
                    match wait_deleted(self.client(), &kv).await {
                        Ok(()) => return Ok(()),
                        Err(ClientError::Rejected(Rejection::Compacted { .. })) => {}
                        Err(error) => return Err(error),
                    }
                }
                _ => return Ok(()),
            }
        }
    }
}

/// Returns once `kv`'s key is deleted (watching from after its last
/// change, so a deletion before the watch starts is seen too).
async fn wait_deleted(client: &Client, kv: &KeyValue) -> Result<(), ClientError> {
    let options = WatchOptions::default().from_revision(kv.meta.mod_revision.saturating_add(1));
    let mut watcher = client.watch(kv.key.clone(), options);
    loop {
        if let WatchUpdate::Changes { events, .. } = watcher.next().await?
            && events
                .iter()
                .any(|event| event.key == kv.key && event.kind == EventKind::Delete)
        {
            return Ok(());
        }
    }
}

/// A distributed lock (etcd's mutex recipe).
///
/// A contender keeps a lease alive and holds one key, `NAME/<owner id>`,
/// attached to it, created on its [`Session`] by one transaction (*if the
/// key's create revision is 0, put it, else get it*): a retried acquire
/// answers the same key and revision, the same ownership. The owner is
/// the key with the lowest create revision; the others each watch for the
/// deletion of the key just older than their own. The fencing token is the
/// key's create revision. [`Lock::unlock`] deletes the key and revokes the
/// lease; a holder that dies frees the lock when its lease ends, `ttl`
/// after its last renewal. The owner id is the session's id unless given
/// ([`Lock::with_owner`]): two `Lock`s of one session for one name share a
/// key.
#[derive(Debug)]
pub struct Lock {
    contender: Contender,
}

impl Lock {
    /// A lock `name` for `session`, whose lease lives `ttl` unless kept
    /// alive (so a holder that dies frees the lock within `ttl`).
    pub fn new(session: &Session, name: impl AsRef<[u8]>, ttl: Duration) -> Lock {
        Lock {
            contender: Contender::new(session, name.as_ref(), ttl),
        }
    }

    /// With owner id `owner` instead of the session's id: the key is
    /// `NAME/<owner>`.
    pub fn with_owner(mut self, owner: &str) -> Lock {
        self.contender.set_owner(owner);
        self
    }

    /// This contender's key, `NAME/<owner id>`.
    pub fn key(&self) -> &[u8] {
        &self.contender.key
    }

    /// The lease the key is attached to.
    pub fn lease(&self) -> &str {
        &self.contender.lease
    }

    /// Queues for the lock without waiting: creates the key unless it
    /// exists, and answers it with its create revision. Again on the same
    /// session (or retried), the same key and revision.
    pub async fn queue(&mut self) -> Result<Ownership, ClientError> {
        self.contender.queue(b"").await
    }

    /// Waits until the lock is held; answers the key and the fencing
    /// revision. A retried acquire answers the same ownership. A key whose
    /// lease ended while waiting is `Rejected(LeaseNotFound)`.
    pub async fn acquire(&mut self) -> Result<Ownership, ClientError> {
        self.contender.acquire(b"").await
    }

    /// The ownership held, if acquired and not released.
    pub fn held(&self) -> Option<&Ownership> {
        self.contender.held.as_ref()
    }

    /// Returns when a held lock is lost (its lease ended): at once if none
    /// is held.
    pub async fn lost(&self) -> Result<(), ClientError> {
        self.contender.lost().await
    }

    /// Releases the lock (or leaves the queue): deletes the key and
    /// revokes the lease.
    pub async fn unlock(&mut self) -> Result<(), ClientError> {
        self.contender.release().await
    }
}

/// A leader election (etcd's election recipe): campaigners contend as for
/// a [`Lock`], with a value; the leader is the oldest, and
/// [`Client::observe_election`] follows its changes.
#[derive(Debug)]
pub struct Election {
    contender: Contender,
    name: Vec<u8>,
}

impl Election {
    /// An election `name` for `session`; a campaigner's lease lives `ttl`
    /// unless kept alive.
    pub fn new(session: &Session, name: impl AsRef<[u8]>, ttl: Duration) -> Election {
        Election {
            contender: Contender::new(session, name.as_ref(), ttl),
            name: name.as_ref().to_vec(),
        }
    }

    /// With owner id `owner` instead of the session's id.
    pub fn with_owner(mut self, owner: &str) -> Election {
        self.contender.set_owner(owner);
        self
    }

    /// This campaigner's key.
    pub fn key(&self) -> &[u8] {
        &self.contender.key
    }

    /// Campaigns with `value`: waits until elected; answers the key and
    /// the leadership's revision. A retried campaign answers the same
    /// leadership (with the value first campaigned).
    pub async fn campaign(&mut self, value: impl AsRef<[u8]>) -> Result<Ownership, ClientError> {
        self.contender.acquire(value.as_ref()).await
    }

    /// Sets a new value while leader, keeping the leadership.
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<(), ClientError> {
        let Some(mine) = &self.contender.held else {
            return Err(ClientError::Invalid("not the leader".into()));
        };
        let txn = Txn {
            compare: vec![Compare {
                key: mine.key.clone(),
                scope: KeyScope::Key,
                target: CompareTarget::CreateRevision(mine.revision),
                op: CompareOp::Equal,
            }],
            success: vec![TxnOp::Put {
                key: mine.key.clone(),
                value: value.as_ref().to_vec(),
                lease: Some(self.contender.lease.clone()),
            }],
            failure: Vec::new(),
        };
        if self.contender.session.txn(txn).await?.succeeded {
            Ok(())
        } else {
            Err(lost(&self.contender.lease))
        }
    }

    /// The leadership held, if elected and not resigned.
    pub fn held(&self) -> Option<&Ownership> {
        self.contender.held.as_ref()
    }

    /// Returns when a held leadership is lost (its lease ended).
    pub async fn lost(&self) -> Result<(), ClientError> {
        self.contender.lost().await
    }

    /// Gives up the leadership (or the campaign): deletes the key and
    /// revokes the lease.
    pub async fn resign(&mut self) -> Result<(), ClientError> {
        self.contender.release().await
    }

    /// The current leader.
    pub async fn leader(&self) -> Result<Option<Leader>, ClientError> {
        self.contender.client().election_leader(&self.name).await
    }
}

impl Client {
    /// The current leader of election `name`, if any (a linearizable
    /// read).
    pub async fn election_leader(
        &self,
        name: impl AsRef<[u8]>,
    ) -> Result<Option<Leader>, ClientError> {
        let all = contenders(self, &prefix_of(name.as_ref())).await?;
        Ok(all.into_iter().next().map(Leader::from))
    }

    /// Every change of leader of election `name`, from its leader now on.
    pub fn observe_election(&self, name: impl AsRef<[u8]>) -> ElectionObserver {
        let prefix = prefix_of(name.as_ref());
        let options = WatchOptions::default()
            .with_prefix()
            .with_progress_interval(Duration::from_secs(1));
        ElectionObserver {
            client: self.clone(),
            watcher: self.watch(prefix.clone(), options),
            prefix,
            last: None,
            live: false,
        }
    }
}

/// The leaders of an election, as they change
/// ([`Client::observe_election`]).
#[derive(Debug)]
pub struct ElectionObserver {
    client: Client,
    prefix: Vec<u8>,
    watcher: crate::watch::Watcher,
    /// The leader last answered (`None` before the first).
    last: Option<Option<Leader>>,
    /// Whether the watch has delivered since it started (so every change
    /// after the last look is delivered).
    live: bool,
}

impl ElectionObserver {
    /// The next leader (`None`: no leader): the current one first, then
    /// each change (of key, or of value by a proclaim).
    pub async fn next(&mut self) -> Result<Option<Leader>, ClientError> {
        if self.last.is_none() {
            let leader = self.look().await?;
            self.last = Some(leader.clone());
            return Ok(leader);
        }
        loop {
            let update = self.watcher.next().await?;
            // Look again on every change, and on the first word from the
            // watch (a change between the first look and the start of the
            // watch would otherwise go unseen).
            if !self.live || matches!(update, WatchUpdate::Changes { .. }) {
                self.live = true;
                let leader = self.look().await?;
                if self.last.as_ref() != Some(&leader) {
                    self.last = Some(leader.clone());
                    return Ok(leader);
                }
            }
        }
    }

    async fn look(&self) -> Result<Option<Leader>, ClientError> {
        Ok(contenders(&self.client, &self.prefix)
            .await?
            .into_iter()
            .next()
            .map(Leader::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_keys() {
        use oncekv_state::Secret;
        assert_eq!(prefix_of(b"jobs"), b"jobs/");
        let name = lease_name(Secret(7), b"jobs/1");
        assert!(name.starts_with("contend-"), "{name}");
        assert_eq!(name.len(), "contend-".len() + 32);
        // The same for the same session and key; else unrelated.
        assert_eq!(name, lease_name(Secret(7), b"jobs/1"));
        assert_ne!(name, lease_name(Secret(8), b"jobs/1"));
        assert_ne!(name, lease_name(Secret(7), b"jobs/2"));
    }
}
