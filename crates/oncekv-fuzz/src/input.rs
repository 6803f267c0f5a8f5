//! [`Input`]: reads a fuzzer's bytes front to back. Every read is total:
//! past the end it yields what is left (or nothing), never a panic.

/// The unread part of an input.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Input<'a> {
        Input { rest: bytes }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// The next byte, if any.
    pub(crate) fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(first)
    }

    /// The next two bytes as a little-endian `u16`; one byte left reads as
    /// that byte.
    pub(crate) fn u16(&mut self) -> Option<u16> {
        let low = self.byte()?;
        let high = self.byte().unwrap_or(0);
        Some(u16::from_le_bytes([low, high]))
    }

    /// The next `length` bytes, or all that is left if fewer.
    pub(crate) fn take(&mut self, length: usize) -> &'a [u8] {
        let (taken, rest) = self.rest.split_at(length.min(self.rest.len()));
        self.rest = rest;
        taken
    }

    /// Everything left.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        self.take(self.rest.len())
    }
}
