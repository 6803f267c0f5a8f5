//! [`KeyRange`]: the keys from a start key up to an end key (excluded), or
//! every key from the start on, as etcd addresses keys by `key` and
//! `range_end`; and [`KeyScope`], which of these forms a compare or a
//! watch names beside its key (the key alone, a prefix, or a range).
//!
//! Keys order bytewise. One key `k` is the range `[k, k\0)`, and a prefix
//! `p` the range `[p, prefix_end(p))`, so every form is a range; the
//! operations that predate ranges keep their own forms (and encodings).

use serde::{Deserialize, Serialize};

/// Every key from `start` (included) up to `end` (excluded), or from
/// `start` on when `end` is `None`. A range whose end is not above its
/// start holds no key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyRange {
    /// The first key of the range.
    pub start: Vec<u8>,
    /// The first key after the range; `None`: every key from `start` on.
    pub end: Option<Vec<u8>>,
}

impl KeyRange {
    /// The keys from `start` up to `end` (excluded).
    pub fn new(start: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) -> KeyRange {
        KeyRange {
            start: start.into(),
            end: Some(end.into()),
        }
    }

    /// Every key from `start` on.
    pub fn from_key(start: impl Into<Vec<u8>>) -> KeyRange {
        KeyRange {
            start: start.into(),
            end: None,
        }
    }

    /// The one key `key`: `[key, key\0)`.
    pub fn one(key: impl Into<Vec<u8>>) -> KeyRange {
        let start = key.into();
        let mut end = start.clone();
        end.push(0);
        KeyRange {
            start,
            end: Some(end),
        }
    }

    /// Every key starting with `prefix`.
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> KeyRange {
        let start = prefix.into();
        let end = prefix_end(&start);
        KeyRange { start, end }
    }

    /// Whether `key` is in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && self.is_below_end(key)
    }

    /// Whether `key` is below the range's end (every key is, without one).
    pub fn is_below_end(&self, key: &[u8]) -> bool {
        self.end.as_deref().is_none_or(|end| key < end)
    }

    /// Whether the range holds no key (its end is not above its start).
    pub fn is_empty(&self) -> bool {
        self.end
            .as_deref()
            .is_some_and(|end| end <= self.start.as_slice())
    }

    /// Whether some key is in both ranges.
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        if self.is_empty() || other.is_empty() {
            return false;
        }
        // Each starts below the other's end.
        other.is_below_end(&self.start) && self.is_below_end(&other.start)
    }

    /// Whether every key of this range is in `other` (an empty range is in
    /// every range).
    pub fn is_within(&self, other: &KeyRange) -> bool {
        if self.is_empty() {
            return true;
        }
        if self.start < other.start {
            return false;
        }
        match (&self.end, &other.end) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(end), Some(other_end)) => end <= other_end,
        }
    }

    /// The bytes of its keys, as a command's payload counts them.
    pub fn payload_bytes(&self) -> usize {
        self.start.len() + self.end.as_ref().map_or(0, Vec::len)
    }
}

/// The first key after every key starting with `prefix` (etcd's prefix
/// end): `prefix` with its last byte below `0xff` incremented and what
/// follows dropped; `None` when there is no such byte (the empty prefix,
/// or one of `0xff` bytes only), for then the keys under it run to the end.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Which keys a compare or a watch addresses beside its key.
///
/// Encoding: the first two forms encode (postcard) exactly as the `bool`
/// that once said "prefix" did (0 and 1), so compares written to the log
/// before ranges existed decode unchanged, to the same digest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KeyScope {
    /// The key alone.
    #[default]
    Key,
    /// Every key starting with the key.
    Prefix,
    /// Every key from the key up to `end` (excluded), or from the key on
    /// when `end` is `None`.
    Range {
        /// The first key after the range.
        end: Option<Vec<u8>>,
    },
}

impl KeyScope {
    /// The keys this scope addresses from `key`, as a range.
    pub fn range_from(&self, key: &[u8]) -> KeyRange {
        match self {
            KeyScope::Key => KeyRange::one(key),
            KeyScope::Prefix => KeyRange::prefix(key),
            KeyScope::Range { end } => KeyRange {
                start: key.to_vec(),
                end: end.clone(),
            },
        }
    }

    /// Whether `candidate` is addressed by this scope from `key`.
    pub fn contains(&self, key: &[u8], candidate: &[u8]) -> bool {
        match self {
            KeyScope::Key => candidate == key,
            KeyScope::Prefix => candidate.starts_with(key),
            KeyScope::Range { end } => {
                candidate >= key && end.as_deref().is_none_or(|end| candidate < end)
            }
        }
    }

    /// The bytes it carries beyond the key.
    pub fn payload_bytes(&self) -> usize {
        match self {
            KeyScope::Range { end: Some(end) } => end.len(),
            KeyScope::Key | KeyScope::Prefix | KeyScope::Range { end: None } => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_are_etcds() {
        assert_eq!(prefix_end(b"abc"), Some(b"abd".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn one_key_and_a_prefix_are_ranges() {
        let one = KeyRange::one(b"k".to_vec());
        assert!(one.contains(b"k"));
        assert!(!one.contains(b"k\0"));
        assert!(!one.contains(b"j\xff"));
        let prefix = KeyRange::prefix(b"a/".to_vec());
        for key in [&b"a/"[..], b"a/x", b"a/\xff\xff"] {
            assert!(prefix.contains(key), "{key:?}");
        }
        for key in [&b"a"[..], b"a0", b"b"] {
            assert!(!prefix.contains(key), "{key:?}");
        }
        let everything = KeyRange::prefix(Vec::new());
        assert!(everything.contains(b"\xff\xff\xff"));
    }

    #[test]
    fn empty_ranges_hold_nothing_and_overlap_nothing() {
        let backwards = KeyRange::new(b"c".to_vec(), b"a".to_vec());
        assert!(backwards.is_empty());
        assert!(!backwards.contains(b"b"));
        assert!(!backwards.overlaps(&KeyRange::from_key(Vec::new())));
        assert!(backwards.is_within(&KeyRange::one(b"z".to_vec())));
        assert!(KeyRange::new(b"a".to_vec(), b"a".to_vec()).is_empty());
    }

    #[test]
    fn overlap_and_containment() {
        let a_c = KeyRange::new(b"a".to_vec(), b"c".to_vec());
        let b_d = KeyRange::new(b"b".to_vec(), b"d".to_vec());
        let c_on = KeyRange::from_key(b"c".to_vec());
        assert!(a_c.overlaps(&b_d));
        assert!(!a_c.overlaps(&c_on));
        assert!(b_d.overlaps(&c_on));
        assert!(KeyRange::prefix(b"b".to_vec()).is_within(&b_d));
        assert!(!b_d.is_within(&a_c));
        assert!(c_on.is_within(&KeyRange::from_key(b"b".to_vec())));
        assert!(!c_on.is_within(&b_d));
    }

    #[test]
    fn scopes_address_what_their_ranges_hold() {
        let keys: [&[u8]; 7] = [b"a", b"a\0", b"ab", b"b", b"b\xff", b"c", b"\xff"];
        let scopes = [
            KeyScope::Key,
            KeyScope::Prefix,
            KeyScope::Range {
                end: Some(b"c".to_vec()),
            },
            KeyScope::Range { end: None },
        ];
        for scope in &scopes {
            for from in [&b"a"[..], b"b", b"\xff"] {
                let range = scope.range_from(from);
                for key in keys {
                    assert_eq!(
                        scope.contains(from, key),
                        range.contains(key),
                        "{scope:?} from {from:?}, {key:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_first_scopes_encode_as_the_bool_they_replace() {
        for (scope, old) in [(KeyScope::Key, false), (KeyScope::Prefix, true)] {
            let new_bytes = postcard::to_allocvec(&scope).unwrap();
            assert_eq!(new_bytes, postcard::to_allocvec(&old).unwrap());
            assert_eq!(postcard::from_bytes::<KeyScope>(&new_bytes).unwrap(), scope);
        }
    }
}
