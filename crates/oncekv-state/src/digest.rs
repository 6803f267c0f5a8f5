//! Hashes that must be the same on every replica, platform and build: the
//! command digest kept with each completion record (over the command's
//! canonical postcard encoding), the FNV-1a digest of the state, and the
//! checksum of a snapshot's body ([`BodyChecksum`]).

use crate::command::Command;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A word-at-a-time hasher that postcard can serialise into without
/// allocating: bytes are packed into 64-bit words, each mixed in with a
/// multiply-rotate step, and the result finalised with the SplitMix64
/// avalanche. Stable by construction (no std `Hasher`, whose output may
/// change between Rust releases).
#[derive(Debug, Default)]
pub(crate) struct CommandHasher {
    state: u64,
    word: u64,
    filled: u32,
    length: u64,
}

const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

impl CommandHasher {
    fn mix(&mut self, word: u64) {
        self.state = (self.state.rotate_left(23) ^ word).wrapping_mul(MIX);
    }

    fn push(&mut self, byte: u8) {
        self.word |= u64::from(byte) << (8 * self.filled);
        self.filled += 1;
        self.length += 1;
        if self.filled == 8 {
            let word = self.word;
            self.mix(word);
            self.word = 0;
            self.filled = 0;
        }
    }

    pub(crate) fn finish(mut self) -> u64 {
        let (word, length) = (self.word, self.length);
        self.mix(word);
        self.mix(length);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Postcard serialises into the hasher directly; a run of bytes (a key,
/// a value) is taken a word at a time, which gives the digest a byte at a
/// time would.
impl postcard::ser_flavors::Flavor for CommandHasher {
    type Output = u64;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.push(byte);
        Ok(())
    }

    fn try_extend(&mut self, mut bytes: &[u8]) -> postcard::Result<()> {
        while self.filled != 0 {
            let Some((first, rest)) = bytes.split_first() else {
                return Ok(());
            };
            self.push(*first);
            bytes = rest;
        }
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut le = [0u8; 8];
            le.copy_from_slice(word);
            self.mix(u64::from_le_bytes(le));
            self.length += 8;
        }
        for byte in words.remainder() {
            self.push(*byte);
        }
        Ok(())
    }

    fn finalize(self) -> postcard::Result<u64> {
        Ok(self.finish())
    }
}

/// FNV-1a 64 of `bytes` (the snapshot checksum).
#[cfg(test)]
pub(crate) fn fnv64(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv64::default();
    hasher.extend(bytes);
    hasher.finish()
}

/// FNV-1a 64 as a sink that postcard can serialise into.
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

/// The checksum of a snapshot's body: CRC-32 (IEEE, as `crc32fast`
/// computes it, many bytes a step) from snapshot format 8, FNV-1a 64 (a
/// byte a step: a second and more on a body of a gigabyte) before. Kept
/// in the header's eight bytes either way.
#[derive(Debug)]
pub(crate) enum BodyChecksum {
    /// FNV-1a 64 (formats up to 7).
    Fnv(Fnv64),
    /// CRC-32 (format 8 on).
    Crc(crc32fast::Hasher),
}

impl BodyChecksum {
    /// The checksum formats from 8 on use.
    pub(crate) fn crc() -> BodyChecksum {
        BodyChecksum::Crc(crc32fast::Hasher::new())
    }

    /// The checksum formats up to 7 use.
    pub(crate) fn fnv() -> BodyChecksum {
        BodyChecksum::Fnv(Fnv64::default())
    }

    /// Counts `bytes` in.
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        match self {
            BodyChecksum::Fnv(hash) => hash.extend(bytes),
            BodyChecksum::Crc(hash) => hash.update(bytes),
        }
    }

    /// The checksum of every byte counted, as the header holds it.
    pub(crate) fn finish(self) -> u64 {
        match self {
            BodyChecksum::Fnv(hash) => hash.finish(),
            BodyChecksum::Crc(hash) => u64::from(hash.finalize()),
        }
    }
}

/// The digest of a command: what tells a retry from another request under
/// the same dedup key. A session's secret is drawn by the leader for each
/// attempt to open it, so it is left out: a retried open under one
/// idempotency key is the same request, and gets the session it opened.
/// So is the token key the leader draws into an auth enable.
pub fn command_digest(command: &Command) -> u64 {
    let without_secret;
    let command = match command {
        Command::OpenSession { ttl_ms, window, .. } => {
            without_secret = Command::OpenSession {
                ttl_ms: *ttl_ms,
                window: *window,
                secret: crate::ids::Secret(0),
            };
            &without_secret
        }
        Command::Auth(crate::auth::AuthCommand::Enable { .. }) => {
            without_secret = Command::Auth(crate::auth::AuthCommand::Enable {
                token_key: crate::ids::TokenKey([0; 32]),
            });
            &without_secret
        }
        other => other,
    };
    // Encoding plain data into a growable sink cannot fail; a failure would
    // mean the command type itself is broken, which no replica may ignore.
    postcard::serialize_with_flavor(command, CommandHasher::default())
        .expect("a command always encodes")
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED_PUT_DIGEST: u64 = 14_662_863_549_818_470_299;

    #[test]
    fn fnv_matches_the_published_vectors() {
        assert_eq!(fnv64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// Runs of bytes taken a word at a time, from any alignment, hash as
    /// the same bytes pushed one by one.
    #[test]
    fn word_steps_hash_as_byte_steps() {
        use postcard::ser_flavors::Flavor as _;
        let bytes: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for first in [0, 1, 3, 7, 8, 9, 50] {
            for second in [0, 1, 5, 8, 16, 23] {
                let second = (first + second).min(bytes.len());
                let mut runs = CommandHasher::default();
                runs.try_extend(&bytes[..first]).expect("hashing");
                runs.try_push(0xff).expect("hashing");
                runs.try_extend(&bytes[first..second]).expect("hashing");
                runs.try_extend(&bytes[second..]).expect("hashing");
                let mut pushed = CommandHasher::default();
                for byte in bytes[..first].iter().chain([&0xff]).chain(&bytes[first..]) {
                    pushed.push(*byte);
                }
                assert_eq!(runs.finish(), pushed.finish(), "split at {first}, {second}");
            }
        }
    }

    #[test]
    fn digest_is_pinned() {
        // A change here changes which retries replay on a mixed-version
        // cluster: it must come with a snapshot format bump.
        let command = Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec().into(),
            lease: None,
        };
        assert_eq!(command_digest(&command), PINNED_PUT_DIGEST);
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

    #[test]
    fn an_open_differs_by_ttl_and_window_but_not_by_its_drawn_secret() {
        let open = |ttl_ms, window, secret| Command::OpenSession {
            ttl_ms,
            window,
            secret: crate::ids::Secret(secret),
        };
        assert_eq!(
            command_digest(&open(1000, 4, 1)),
            command_digest(&open(1000, 4, 2))
        );
        assert_ne!(
            command_digest(&open(1000, 4, 1)),
            command_digest(&open(1001, 4, 1))
        );
        assert_ne!(
            command_digest(&open(1000, 4, 1)),
            command_digest(&open(1000, 5, 1))
        );
    }
}
