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
    /// The bytes (encoded as one byte string, not byte by byte: the same
    /// bytes in postcard, read and written at once).
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// The lease that owns the key, if any.
    pub lease: Option<String>,
    /// Its revisions.
    pub meta: KeyMeta,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`StoredValue`] as it was declared before its value became a byte
    /// string: serde's sequence of bytes.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct AsSequence {
        value: Vec<u8>,
        lease: Option<String>,
        meta: KeyMeta,
    }

    #[test]
    fn a_value_as_a_byte_string_is_the_same_bytes_as_the_sequence_it_was() {
        for value in [Vec::new(), b"v".to_vec(), vec![0xff; 300], vec![7; 70_000]] {
            let meta = KeyMeta {
                create_revision: 3,
                mod_revision: 900,
                version: 2,
            };
            let stored = StoredValue {
                value: value.clone(),
                lease: Some("l".to_string()),
                meta,
            };
            let before = AsSequence {
                value,
                lease: Some("l".to_string()),
                meta,
            };
            let bytes = postcard::to_allocvec(&stored).expect("encodes");
            assert_eq!(bytes, postcard::to_allocvec(&before).expect("encodes"));
            let read: AsSequence = postcard::from_bytes(&bytes).expect("decodes as before");
            assert_eq!(read, before);
            let read: StoredValue = postcard::from_bytes(&bytes).expect("decodes");
            assert_eq!(read, stored);
        }
    }
}
