//! Decoding the persistent collections of the state from snapshot bytes
//! without trusting the lengths the bytes announce. Snapshot bytes may come
//! from a peer or a damaged file, and a length is only a hint: these
//! visitors allocate as they read elements, never ahead of them, so a
//! forged length of 2^64 is an "unexpected end" error, not an allocation
//! that aborts the process. (`imbl`'s own `Deserialize` reserves the
//! announced length at once; std's collections, through serde, cap it.)
//! Used with `#[serde(deserialize_with = ...)]`; encoding is `imbl`'s.

use imbl::{OrdMap, Vector};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// An ordered map, entry by entry (a repeated key keeps its last value, as
/// a `BTreeMap` decodes).
pub(crate) fn ord_map<'de, D, K, V>(deserializer: D) -> Result<OrdMap<K, V>, D::Error>
where
    D: Deserializer<'de>,
    K: Deserialize<'de> + Ord + Clone,
    V: Deserialize<'de> + Clone,
{
    struct Entries<K, V>(PhantomData<(K, V)>);

    impl<'de, K, V> Visitor<'de> for Entries<K, V>
    where
        K: Deserialize<'de> + Ord + Clone,
        V: Deserialize<'de> + Clone,
    {
        type Value = OrdMap<K, V>;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("a map")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let mut map = OrdMap::new();
            while let Some((key, value)) = access.next_entry()? {
                map.insert(key, value);
            }
            Ok(map)
        }
    }

    deserializer.deserialize_map(Entries(PhantomData))
}

/// A vector, element by element, in order.
pub(crate) fn vector<'de, D, T>(deserializer: D) -> Result<Vector<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Clone,
{
    struct Elements<T>(PhantomData<T>);

    impl<'de, T> Visitor<'de> for Elements<T>
    where
        T: Deserialize<'de> + Clone,
    {
        type Value = Vector<T>;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("a sequence")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let mut vector = Vector::new();
            while let Some(element) = access.next_element()? {
                vector.push_back(element);
            }
            Ok(vector)
        }
    }

    deserializer.deserialize_seq(Elements(PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
    struct Tables {
        #[serde(deserialize_with = "ord_map")]
        map: OrdMap<u32, String>,
        #[serde(deserialize_with = "vector")]
        list: Vector<u64>,
    }

    /// The largest length postcard can announce: a varint of 2^64 - 1.
    const HUGE_LENGTH: [u8; 10] = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];

    #[test]
    fn what_is_encoded_decodes_the_same() {
        let tables = Tables {
            map: OrdMap::from(vec![(3u32, "c".to_string()), (1, "a".to_string())]),
            list: Vector::from(vec![5, 4, 6]),
        };
        let bytes = postcard::to_allocvec(&tables).unwrap();
        assert_eq!(postcard::from_bytes::<Tables>(&bytes).unwrap(), tables);
    }

    #[test]
    fn a_forged_map_length_is_an_error_not_an_allocation() {
        let mut bytes = HUGE_LENGTH.to_vec();
        bytes.extend_from_slice(&[1, 1, b'a']);
        assert!(postcard::from_bytes::<Tables>(&bytes).is_err());
    }

    /// Elements whose count is announced as the largest possible: what a
    /// visitor that reserved the hint would try to allocate. (postcard
    /// itself caps a sequence's hint at the bytes left, so the hint comes
    /// from serde's value deserializer here.)
    struct ForgedLength(std::vec::IntoIter<u64>);

    impl Iterator for ForgedLength {
        type Item = u64;

        fn next(&mut self) -> Option<u64> {
            self.0.next()
        }

        fn size_hint(&self) -> (usize, Option<usize>) {
            (usize::MAX, Some(usize::MAX))
        }
    }

    #[test]
    fn a_forged_vector_length_is_not_reserved() {
        let elements = ForgedLength(vec![5, 4].into_iter());
        let deserializer =
            serde::de::value::SeqDeserializer::<_, serde::de::value::Error>::new(elements);
        assert_eq!(vector(deserializer).unwrap(), Vector::from(vec![5u64, 4]));
    }
}
