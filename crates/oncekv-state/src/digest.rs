//! The command digest kept with each completion record: 64-bit FNV-1a over
//! the command's canonical (postcard) encoding, so it is the same on every
//! replica, platform and build.

use crate::command::Command;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// An FNV-1a hasher that postcard can serialise into without allocating.
#[derive(Debug)]
pub(crate) struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(FNV_OFFSET)
    }
}

impl Fnv64 {
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

impl Extend<u8> for Fnv64 {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, bytes: I) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
        }
    }
}

impl<'a> Extend<&'a u8> for Fnv64 {
    fn extend<I: IntoIterator<Item = &'a u8>>(&mut self, bytes: I) {
        self.extend(bytes.into_iter().copied());
    }
}

/// FNV-1a of `bytes`.
pub(crate) fn fnv64(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv64::default();
    hasher.extend(bytes);
    hasher.finish()
}

/// The digest of a command.
pub fn command_digest(command: &Command) -> u64 {
    // Encoding plain data into a growable sink cannot fail; a failure would
    // mean the command type itself is broken, which no replica may ignore.
    let hasher = postcard::to_extend(command, Fnv64::default()).expect("a command always encodes");
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_published_vectors() {
        assert_eq!(fnv64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn different_commands_have_different_digests() {
        let a = Command::Incr {
            key: b"c".to_vec(),
            by: 1,
        };
        let b = Command::Incr {
            key: b"c".to_vec(),
            by: 2,
        };
        assert_ne!(command_digest(&a), command_digest(&b));
        assert_eq!(command_digest(&a), command_digest(&a.clone()));
    }
}
