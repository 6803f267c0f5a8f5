//! What a key holds: its value, the lease it is attached to and its
//! revisions ([`StoredValue`], [`KeyMeta`]), shared by the store and the
//! history of its changes; and a value's bytes ([`SharedBytes`]), shared
//! by the store and the log entry that wrote them.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A value's bytes, immutable and shared: a PUT's entry in the log and the
/// store that applies it hold one copy between them (a clone counts a
/// reference). Encoded as one byte string: the same bytes, in postcard, as
/// a `Vec<u8>` (a length, then the bytes).
///
/// The bytes stay a `Vec` of their own, apart from the count: a count in
/// front of them (`Arc<[u8]>`) would make a 1 KiB value a 1,040-byte
/// allocation, which the allocator rounds up to its next size class
/// (1,280 bytes); measured on a node holding 1,000,000 such values, that
/// cost more memory than sharing saved.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedBytes(Arc<Vec<u8>>);

impl SharedBytes {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(bytes: Vec<u8>) -> SharedBytes {
        SharedBytes(Arc::new(bytes))
    }
}

impl From<&[u8]> for SharedBytes {
    fn from(bytes: &[u8]) -> SharedBytes {
        SharedBytes(Arc::new(bytes.to_vec()))
    }
}

impl<const N: usize> From<&[u8; N]> for SharedBytes {
    fn from(bytes: &[u8; N]) -> SharedBytes {
        SharedBytes(Arc::new(bytes.to_vec()))
    }
}

impl From<SharedBytes> for Vec<u8> {
    fn from(bytes: SharedBytes) -> Vec<u8> {
        Arc::unwrap_or_clone(bytes.0)
    }
}

impl PartialEq<[u8]> for SharedBytes {
    fn eq(&self, other: &[u8]) -> bool {
        self.0.as_slice() == other
    }
}

impl PartialEq<Vec<u8>> for SharedBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        *self.0 == *other
    }
}

impl Serialize for SharedBytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for SharedBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SharedBytes, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = SharedBytes;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte string")
            }

            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<SharedBytes, E> {
                Ok(SharedBytes::from(bytes))
            }

            fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<SharedBytes, E> {
                Ok(SharedBytes::from(bytes))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<SharedBytes, A::Error> {
                // A length hint comes from the input: bounded, not trusted.
                let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(byte) = seq.next_element()? {
                    bytes.push(byte);
                }
                Ok(SharedBytes::from(bytes))
            }
        }
        deserializer.deserialize_byte_buf(Visitor)
    }
}

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
    /// bytes in postcard, read and written at once), shared with the log
    /// entry that wrote them while it is kept.
    pub value: SharedBytes,
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
    fn shared_bytes_are_encoded_as_a_vec_of_bytes_was_and_read_from_either_form() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Before(Vec<u8>, #[serde(with = "serde_bytes")] Vec<u8>);
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct After(SharedBytes, SharedBytes);
        for value in [Vec::new(), b"v".to_vec(), vec![0xff; 300], vec![7; 70_000]] {
            let before = Before(value.clone(), value.clone());
            let after = After(value.clone().into(), value.as_slice().into());
            let bytes = postcard::to_allocvec(&after).expect("encodes");
            assert_eq!(bytes, postcard::to_allocvec(&before).expect("encodes"));
            assert_eq!(
                postcard::from_bytes::<After>(&bytes).expect("decodes"),
                after
            );
            assert_eq!(
                postcard::from_bytes::<Before>(&bytes).expect("decodes"),
                before
            );
        }
        // A forged length is an error, not an allocation.
        assert!(postcard::from_bytes::<SharedBytes>(&[0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }

    #[test]
    fn an_applied_put_shares_its_value_with_the_entry_that_wrote_it() {
        use crate::{
            ClusterTime, Command, Entry, Limits, LogIndex, Proposal, Request, StateMachine,
        };
        let value = SharedBytes::from(vec![3; 1024]);
        let entry = Entry {
            index: LogIndex(1),
            proposal: Proposal {
                time: ClusterTime(1),
                principal: None,
                request: Request::plain(Command::Put {
                    key: b"k".to_vec(),
                    value: value.clone(),
                    lease: None,
                }),
            },
        };
        let mut machine = StateMachine::new(Limits::default());
        machine.apply(&entry);
        let stored = machine.kv().get(b"k").expect("stored");
        assert_eq!(stored.value, value);
        assert_eq!(
            stored.value.as_ptr(),
            value.as_ptr(),
            "one copy of the bytes"
        );
    }

    #[test]
    fn a_clone_shares_the_bytes() {
        let value = SharedBytes::from(b"shared".to_vec());
        let clone = value.clone();
        assert_eq!(value.as_ptr(), clone.as_ptr());
        assert_eq!(clone, b"shared".to_vec());
        assert_eq!(format!("{clone:?}"), format!("{:?}", b"shared".to_vec()));
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
                value: value.clone().into(),
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
