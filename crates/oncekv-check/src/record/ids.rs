//! Identifiers of a run (operations, nodes, faults) and [`Bytes`], the
//! byte strings of keys, values, tokens and replies, written as JSON
//! strings when UTF-8 and as `{"hex": "..."}` otherwise.

use super::*;

/// Identifies one operation within a run (unique per record).
pub type OpId = u64;

/// Identifies a cluster node.
pub type NodeId = u64;

/// Identifies one injected fault within a run (unique per record).
pub type FaultId = u64;

/// A byte string: a key, a value, a token or a reply's encoding.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Bytes {
    fn from(text: &str) -> Self {
        Self(text.as_bytes().to_vec())
    }
}

impl From<String> for Bytes {
    fn from(text: String) -> Self {
        Self(text.into_bytes())
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
}

impl From<&[u8]> for Bytes {
    fn from(bytes: &[u8]) -> Self {
        Self(bytes.to_vec())
    }
}

impl fmt::Display for Bytes {
    /// UTF-8 text as is; anything else as `0x` and hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(text) => f.write_str(text),
            Err(_) => {
                f.write_str("0x")?;
                self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(text) => write!(f, "{text:?}"),
            Err(_) => write!(f, "{self}"),
        }
    }
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
        })
        .collect()
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match std::str::from_utf8(&self.0) {
            Ok(text) => serializer.serialize_str(text),
            Err(_) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("hex", &to_hex(&self.0))?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BytesVisitor;

        impl<'de> Visitor<'de> for BytesVisitor {
            type Value = Bytes;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a UTF-8 string or {\"hex\": \"<hex digits>\"}")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Bytes, E> {
                Ok(Bytes::from(text))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Bytes, E> {
                Ok(Bytes::from(text))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Bytes, A::Error> {
                let mut bytes = None;
                while let Some(field) = map.next_key::<String>()? {
                    if field != "hex" {
                        return Err(de::Error::unknown_field(&field, &["hex"]));
                    }
                    if bytes.is_some() {
                        return Err(de::Error::duplicate_field("hex"));
                    }
                    let digits: String = map.next_value()?;
                    let decoded = from_hex(&digits).ok_or_else(|| {
                        de::Error::invalid_value(de::Unexpected::Str(&digits), &"hex digits")
                    })?;
                    bytes = Some(Bytes(decoded));
                }
                bytes.ok_or_else(|| de::Error::missing_field("hex"))
            }
        }

        deserializer.deserialize_any(BytesVisitor)
    }
}
