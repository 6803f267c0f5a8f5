//! What a key holds: its value, the lease it is attached to and its
//! revisions ([`StoredValue`], [`KeyMeta`]), shared by the store and the
//! history of its changes.

use serde::{Deserialize, Serialize};

/// A key's revisions (as etcd's): all log indexes, so equal on every
/// replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyMeta {
    /// The revision that created the key (since it was last absent).
    pub create_revision: u64,
    /// The revision of its last change.
    pub mod_revision: u64,
    /// How many times it was written since it was created (1 after the
    /// write that created it).
    pub version: u64,
}

/// A stored value, its revisions and the lease it is attached to, if any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredValue {
    /// The bytes.
    pub value: Vec<u8>,
    /// The lease that owns the key, if any.
    pub lease: Option<String>,
    /// Its revisions.
    pub meta: KeyMeta,
}
