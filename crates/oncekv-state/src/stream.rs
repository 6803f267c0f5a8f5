//! The byte streams of a snapshot, in bounded memory: [`Sink`], which
//! postcard encodes into and which checksums the bytes (CRC-32, the
//! current format's) on their way to any `std::io::Write`, and [`Source`],
//! a postcard deserializer flavor that decodes from any `std::io::Read`
//! through a buffer of [`CHUNK_BYTES`], checksumming each byte it takes
//! (by the checksum of the format it reads). Neither
//! holds more than a chunk and the largest single string of the state, so
//! a snapshot is never one buffer as large as the state.
//!
//! A length read from the stream is only a hint here as in `decode`: a
//! string's bytes are gathered as they arrive, never reserved ahead, and
//! the flavor tells postcard it knows no bytes left, so no sequence is
//! reserved at its announced length either. A forged length costs at most
//! the bytes that really follow it, then ends in an error.

use crate::digest::BodyChecksum;
use std::io::{self, BufRead, BufReader, Read, Write};

/// Snapshots are written and read in pieces of this size.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Where postcard encodes a snapshot's body: counted, checksummed and
/// written through to `out` (which buffers). The first write error is
/// kept (postcard's own error cannot carry it).
pub(crate) struct Sink<W: Write> {
    out: W,
    hash: BodyChecksum,
    written: u64,
    error: Option<io::Error>,
}

impl<W: Write> Sink<W> {
    pub(crate) fn new(out: W) -> Self {
        Sink {
            out,
            hash: BodyChecksum::crc(),
            written: 0,
            error: None,
        }
    }

    /// Encodes `value` after what was encoded before.
    pub(crate) fn encode<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> io::Result<()> {
        match postcard::serialize_with_flavor(value, &mut *self) {
            Ok(()) => Ok(()),
            Err(error) => Err(self.error.take().unwrap_or_else(|| io::Error::other(error))),
        }
    }

    /// Flushes what is buffered; the checksum of all that was encoded and
    /// its length.
    pub(crate) fn finish(mut self) -> io::Result<(u64, u64)> {
        self.out.flush()?;
        Ok((self.hash.finish(), self.written))
    }
}

impl<W: Write> postcard::ser_flavors::Flavor for &mut Sink<W> {
    type Output = ();

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.hash.update(data);
        self.written = self.written.saturating_add(data.len() as u64);
        self.out.write_all(data).map_err(|error| {
            self.error = Some(error);
            postcard::Error::SerializeBufferFull
        })
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.try_extend(&[data])
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Where postcard decodes a snapshot's body from: a reader behind a
/// buffer of [`CHUNK_BYTES`], every byte taken checksummed. The first read
/// error is kept (postcard's own error cannot carry it).
pub(crate) struct Source<R: Read> {
    input: BufReader<R>,
    hash: BodyChecksum,
    /// A string's bytes, gathered as they arrive.
    scratch: Vec<u8>,
    error: Option<io::Error>,
}

impl<R: Read> Source<R> {
    /// A source reading on from `input`, whose bytes taken before are not
    /// checksummed, checksumming those it takes by `hash`.
    pub(crate) fn new(input: BufReader<R>, hash: BodyChecksum) -> Self {
        Source {
            input,
            hash,
            scratch: Vec::new(),
            error: None,
        }
    }

    /// Decodes the next value.
    pub(crate) fn decode<T: serde::de::DeserializeOwned>(&mut self) -> postcard::Result<T> {
        let mut deserializer = postcard::Deserializer::from_flavor(&mut *self);
        let value = T::deserialize(&mut deserializer)?;
        deserializer.finalize()?;
        Ok(value)
    }

    /// How many bytes are buffered, reading more if none are; 0 at the
    /// end of the input. A read error is kept and reads as the end.
    fn fill(&mut self) -> usize {
        if self.error.is_some() {
            return 0;
        }
        loop {
            match self.input.fill_buf() {
                Ok(buffered) => return buffered.len(),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    self.error = Some(error);
                    return 0;
                }
            }
        }
    }

    fn take(&mut self, count: usize) {
        self.hash.update(&self.input.buffer()[..count]);
        self.input.consume(count);
    }

    /// Whether the input is at its end (or failed).
    pub(crate) fn at_end(&mut self) -> bool {
        self.fill() == 0
    }

    /// Reads (and checksums) the rest of the input.
    pub(crate) fn drain(&mut self) {
        loop {
            let count = self.fill();
            if count == 0 {
                return;
            }
            self.take(count);
        }
    }

    /// The checksum of the bytes taken, and the read error that cut the
    /// input short, if one did.
    pub(crate) fn finish(self) -> Result<u64, io::Error> {
        match self.error {
            Some(error) => Err(error),
            None => Ok(self.hash.finish()),
        }
    }
}

impl<'de, R: Read + 'de> postcard::de_flavors::Flavor<'de> for &'de mut Source<R> {
    type Remainder = ();
    type Source = ();

    fn pop(&mut self) -> postcard::Result<u8> {
        if self.fill() == 0 {
            return Err(postcard::Error::DeserializeUnexpectedEnd);
        }
        let byte = self.input.buffer()[0];
        self.take(1);
        Ok(byte)
    }

    /// Unknown, said as none: postcard then hints no length to serde, so
    /// no collection is reserved at a length the stream announces.
    fn size_hint(&self) -> Option<usize> {
        Some(0)
    }

    /// The state owns its bytes: nothing borrows from a snapshot, so this
    /// is never asked of a snapshot this crate wrote.
    fn try_take_n(&mut self, _count: usize) -> postcard::Result<&'de [u8]> {
        Err(postcard::Error::DeserializeUnexpectedEnd)
    }

    fn try_take_n_temp<'a>(&'a mut self, count: usize) -> postcard::Result<&'a [u8]>
    where
        'de: 'a,
    {
        self.scratch.clear();
        while self.scratch.len() < count {
            let available = self.fill();
            if available == 0 {
                return Err(postcard::Error::DeserializeUnexpectedEnd);
            }
            let piece = (count - self.scratch.len()).min(available);
            self.scratch
                .extend_from_slice(&self.input.buffer()[..piece]);
            self.take(piece);
        }
        Ok(&self.scratch)
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}
