//! The history model: what clients asked of a keyed register store, what
//! they were told, and when.
//!
//! A [`History`] is a validated list of [`Operation`]s. Each operation names
//! the client that issued it, the key it touched, its [`Call`] (read, write
//! or compare-and-set), its [`Output`] when the client learned the outcome,
//! and the real-time interval it spanned. An operation whose outcome is
//! unknown (the client timed out, crashed, or lost its connection) has no
//! output: it may have taken effect at any time after its invocation, or
//! never. This module owns the data types and their invariants; the search
//! itself lives in [`crate::linearizability`].

use std::fmt;
use thiserror::Error;

/// A register's key.
pub type Key = Vec<u8>;

/// A register's value.
pub type Value = Vec<u8>;

/// Identifies the client (Jepsen: process) that issued an operation. A
/// client has at most one operation in flight at a time.
pub type ClientId = u64;

/// What a client asked of the register at [`Operation::key`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// Read the current value.
    Read,
    /// Overwrite the value.
    Write(Value),
    /// Compare-and-set: when the current value equals `expected` (`None`:
    /// the key is absent), replace it with `new`.
    Cas {
        /// The value the register must hold for the swap to happen.
        expected: Option<Value>,
        /// The value written when it does.
        new: Value,
    },
}

/// What a client was told when its operation completed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    /// A read returned this value (`None`: the key was absent).
    Read(Option<Value>),
    /// A write was acknowledged.
    Write,
    /// A compare-and-set completed; `swapped` says whether it replaced the
    /// value. A `false` here is a claim that the comparison failed.
    Cas {
        /// Whether the value was replaced.
        swapped: bool,
    },
}

/// One client operation: its call, its outcome if known, and its interval.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Operation {
    /// The client that issued it.
    pub client: ClientId,
    /// The register it touched.
    pub key: Key,
    /// What was asked.
    pub call: Call,
    /// What the client was told; `None` when the outcome is unknown, in
    /// which case the operation may take effect at any time after
    /// `invoke_ns`, or never.
    pub output: Option<Output>,
    /// When the call was issued.
    pub invoke_ns: u64,
    /// When the response arrived. Required when `output` is known; for an
    /// unknown outcome it only records when the client gave up, and the
    /// checker ignores it.
    pub complete_ns: Option<u64>,
}

impl Operation {
    /// Whether the client learned the outcome.
    pub fn is_complete(&self) -> bool {
        self.output.is_some()
    }
}

fn fmt_value(f: &mut fmt::Formatter<'_>, value: Option<&[u8]>) -> fmt::Result {
    match value {
        None => f.write_str("nil"),
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => write!(f, "{text:?}"),
            Err(_) => {
                f.write_str("0x")?;
                bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        },
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client {} ", self.client)?;
        match &self.call {
            Call::Read => f.write_str("read")?,
            Call::Write(value) => {
                f.write_str("write ")?;
                fmt_value(f, Some(value))?;
            }
            Call::Cas { expected, new } => {
                f.write_str("cas ")?;
                fmt_value(f, expected.as_deref())?;
                f.write_str(" -> ")?;
                fmt_value(f, Some(new))?;
            }
        }
        f.write_str(" on ")?;
        fmt_value(f, Some(&self.key))?;
        match &self.output {
            None => f.write_str(" => unknown")?,
            Some(Output::Read(value)) => {
                f.write_str(" => ")?;
                fmt_value(f, value.as_deref())?;
            }
            Some(Output::Write) => f.write_str(" => ok")?,
            Some(Output::Cas { swapped: true }) => f.write_str(" => swapped")?,
            Some(Output::Cas { swapped: false }) => f.write_str(" => not swapped")?,
        }
        write!(f, " [{}, ", self.invoke_ns)?;
        match (&self.output, self.complete_ns) {
            (Some(_), Some(at)) => write!(f, "{at}]"),
            _ => f.write_str("inf)"),
        }
    }
}

/// Why a list of operations is not a valid [`History`].
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum HistoryError {
    /// The output's kind does not answer the call's kind (say, a read that
    /// returned a compare-and-set result).
    #[error("operation {index}: the output does not match the call")]
    OutputMismatch {
        /// Position of the operation in the list.
        index: usize,
    },
    /// An operation with a known output has no completion time.
    #[error("operation {index}: a completed operation needs a completion time")]
    MissingCompletion {
        /// Position of the operation in the list.
        index: usize,
    },
    /// An operation completed before it was invoked.
    #[error("operation {index}: completed at {complete_ns} before its invocation at {invoke_ns}")]
    CompletedBeforeInvoked {
        /// Position of the operation in the list.
        index: usize,
        /// Its invocation time.
        invoke_ns: u64,
        /// Its completion time.
        complete_ns: u64,
    },
    /// The operation count does not fit the checker's 32-bit indices.
    #[error("a history holds at most {max} operations, got {got}")]
    TooLong {
        /// The limit.
        max: usize,
        /// The number given.
        got: usize,
    },
}

/// A validated list of operations, in no particular order; the operations'
/// times give the real-time order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    operations: Vec<Operation>,
}

impl History {
    /// The most operations a history may hold.
    pub const MAX_OPERATIONS: usize = (u32::MAX / 4) as usize;

    /// Validates `operations`: every output answers its call, every known
    /// outcome has a completion time, and no operation completes before it
    /// is invoked.
    pub fn new(operations: Vec<Operation>) -> Result<Self, HistoryError> {
        if operations.len() > Self::MAX_OPERATIONS {
            return Err(HistoryError::TooLong {
                max: Self::MAX_OPERATIONS,
                got: operations.len(),
            });
        }
        for (index, op) in operations.iter().enumerate() {
            let matches = matches!(
                (&op.call, &op.output),
                (_, None)
                    | (Call::Read, Some(Output::Read(_)))
                    | (Call::Write(_), Some(Output::Write))
                    | (Call::Cas { .. }, Some(Output::Cas { .. }))
            );
            if !matches {
                return Err(HistoryError::OutputMismatch { index });
            }
            match op.complete_ns {
                None if op.output.is_some() => {
                    return Err(HistoryError::MissingCompletion { index });
                }
                Some(complete_ns) if complete_ns < op.invoke_ns => {
                    return Err(HistoryError::CompletedBeforeInvoked {
                        index,
                        invoke_ns: op.invoke_ns,
                        complete_ns,
                    });
                }
                _ => {}
            }
        }
        Ok(Self { operations })
    }

    /// The operations, in the order given to [`History::new`]; checker
    /// reports refer to them by position in this slice.
    pub fn operations(&self) -> &[Operation] {
        &self.operations
    }

    /// How many operations the history holds.
    pub fn len(&self) -> usize {
        self.operations.len()
    }

    /// Whether the history holds no operation.
    pub fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }

    /// Gives the operations back.
    pub fn into_operations(self) -> Vec<Operation> {
        self.operations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(call: Call, output: Option<Output>, invoke: u64, complete: Option<u64>) -> Operation {
        Operation {
            client: 1,
            key: b"k".to_vec(),
            call,
            output,
            invoke_ns: invoke,
            complete_ns: complete,
        }
    }

    #[test]
    fn accepts_well_formed_operations() {
        let history = History::new(vec![
            op(Call::Read, Some(Output::Read(None)), 0, Some(1)),
            op(Call::Write(b"1".to_vec()), None, 2, None),
            op(Call::Write(b"2".to_vec()), None, 2, Some(9)),
        ]);
        assert!(history.is_ok_and(|h| h.len() == 3));
    }

    #[test]
    fn rejects_mismatched_output() {
        let err = History::new(vec![op(Call::Read, Some(Output::Write), 0, Some(1))]);
        assert_eq!(err, Err(HistoryError::OutputMismatch { index: 0 }));
    }

    #[test]
    fn rejects_missing_or_inverted_completion() {
        let missing = History::new(vec![op(Call::Read, Some(Output::Read(None)), 0, None)]);
        assert_eq!(missing, Err(HistoryError::MissingCompletion { index: 0 }));
        let inverted = History::new(vec![op(Call::Read, Some(Output::Read(None)), 5, Some(4))]);
        assert!(matches!(
            inverted,
            Err(HistoryError::CompletedBeforeInvoked { index: 0, .. })
        ));
    }

    #[test]
    fn displays_operations() {
        let cas = op(
            Call::Cas {
                expected: None,
                new: b"7".to_vec(),
            },
            Some(Output::Cas { swapped: true }),
            3,
            Some(4),
        );
        assert_eq!(
            cas.to_string(),
            "client 1 cas nil -> \"7\" on \"k\" => swapped [3, 4]"
        );
        let unknown = op(Call::Write(vec![0xff]), None, 3, Some(4));
        assert_eq!(
            unknown.to_string(),
            "client 1 write 0xff on \"k\" => unknown [3, inf)"
        );
    }
}
