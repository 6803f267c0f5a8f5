//! The history both linearizability checkers read: what clients asked,
//! what they were told, and when, whatever the operations are.
//!
//! An [`Operation`] names the client that issued it, its call, its output
//! when the client learned the outcome, and the real-time interval it
//! spanned. An operation whose outcome is unknown (the client timed out,
//! crashed, or lost its connection) has no output: it may have taken
//! effect at any time after its invocation, or never. A [`History`] is a
//! validated list of operations of one kind of call ([`HistoryCall`]: the
//! register [`Call`](crate::register::Call) or the
//! [`KvCall`](crate::kv_history::KvCall)). This module owns the generic
//! operation, the container, their invariants and their one error type;
//! the calls are their modules', the search [`crate::linearizability`]'s.

use std::fmt;
use thiserror::Error;

/// A key.
pub type Key = Vec<u8>;

/// A value.
pub type Value = Vec<u8>;

/// Identifies the client (Jepsen: process) that issued an operation. A
/// client has at most one operation in flight at a time.
pub type ClientId = u64;

/// One client operation: its call, its outcome if known, and its interval.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Operation<C, R> {
    /// The client that issued it.
    pub client: ClientId,
    /// What was asked.
    pub call: C,
    /// What the client was told; `None` when the outcome is unknown, in
    /// which case the operation may take effect at any time after
    /// `invoke_ns`, or never.
    pub output: Option<R>,
    /// When the call was issued.
    pub invoke_ns: u64,
    /// When the response arrived. Required when `output` is known; for an
    /// unknown outcome it only records when the client gave up, and the
    /// checker ignores it.
    pub complete_ns: Option<u64>,
}

impl<C, R> Operation<C, R> {
    /// Whether the client learned the outcome.
    pub fn is_complete(&self) -> bool {
        self.output.is_some()
    }

    /// The completion time the search uses: `None` (a return at +∞) unless
    /// the outcome is known.
    pub(crate) fn known_complete_ns(&self) -> Option<u64> {
        self.output.as_ref().and(self.complete_ns)
    }
}

/// `client 2 <call> => <output> [invoke, complete]`, with `unknown` and
/// `[invoke, inf)` for an unknown outcome.
impl<C: fmt::Display, R: fmt::Display> fmt::Display for Operation<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client {} {} => ", self.client, self.call)?;
        match &self.output {
            None => f.write_str("unknown")?,
            Some(output) => write!(f, "{output}")?,
        }
        write!(f, " [{}, ", self.invoke_ns)?;
        match self.known_complete_ns() {
            Some(at) => write!(f, "{at}]"),
            None => f.write_str("inf)"),
        }
    }
}

/// A kind of call a [`History`] holds.
pub trait HistoryCall: fmt::Display + Sized {
    /// What a client is told when such a call completes.
    type Output: fmt::Display;

    /// Whether the call can be checked, and `output`, if known, answers
    /// it; the error names the operation's position, `index`.
    fn check_output(&self, output: Option<&Self::Output>, index: usize)
    -> Result<(), HistoryError>;
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
    /// A transaction reported a different number of results than its
    /// branch has operations.
    #[error("operation {index}: the branch has {expected} operations but {got} results")]
    ResultCount {
        /// Position of the operation in the list.
        index: usize,
        /// Operations in the branch.
        expected: usize,
        /// Results reported.
        got: usize,
    },
    /// A transaction result does not answer its operation.
    #[error("operation {index}: result {position} does not answer its operation")]
    ResultMismatch {
        /// Position of the operation in the list.
        index: usize,
        /// Position of the result in the branch.
        position: usize,
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
    /// A transaction nested in another: the KV model does not replay them
    /// (no workload sends one), so a history holding one is refused rather
    /// than checked wrongly.
    #[error("operation {index}: a transaction nested in a transaction is not modelled")]
    NestedTxn {
        /// Position of the operation in the list.
        index: usize,
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct History<C: HistoryCall> {
    operations: Vec<Operation<C, C::Output>>,
}

impl<C: HistoryCall> Default for History<C> {
    fn default() -> Self {
        Self {
            operations: Vec::new(),
        }
    }
}

impl<C: HistoryCall> History<C> {
    /// The most operations a history may hold.
    pub const MAX_OPERATIONS: usize = (u32::MAX / 4) as usize;

    /// Validates `operations`: there are at most
    /// [`MAX_OPERATIONS`](Self::MAX_OPERATIONS), every output answers its
    /// call ([`HistoryCall::check_output`]), every known outcome has a
    /// completion time, and nothing completes before it is invoked.
    pub fn new(operations: Vec<Operation<C, C::Output>>) -> Result<Self, HistoryError> {
        if operations.len() > Self::MAX_OPERATIONS {
            return Err(HistoryError::TooLong {
                max: Self::MAX_OPERATIONS,
                got: operations.len(),
            });
        }
        for (index, op) in operations.iter().enumerate() {
            op.call.check_output(op.output.as_ref(), index)?;
            match op.complete_ns {
                None if op.is_complete() => {
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

    /// The operations, in the order given to [`History::new`]; verdicts
    /// refer to them by position in this slice.
    pub fn operations(&self) -> &[Operation<C, C::Output>] {
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
    pub fn into_operations(self) -> Vec<Operation<C, C::Output>> {
        self.operations
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::register::{Call, Output, RegisterOperation};

    fn op(
        call: Call,
        output: Option<Output>,
        invoke: u64,
        complete: Option<u64>,
    ) -> RegisterOperation {
        Operation {
            client: 1,
            call,
            output,
            invoke_ns: invoke,
            complete_ns: complete,
        }
    }

    fn read() -> Call {
        Call::Read { key: b"k".to_vec() }
    }

    fn write(value: &[u8]) -> Call {
        Call::Write {
            key: b"k".to_vec(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn accepts_well_formed_operations() {
        let history = History::new(vec![
            op(read(), Some(Output::Read(None)), 0, Some(1)),
            op(write(b"1"), None, 2, None),
            op(write(b"2"), None, 2, Some(9)),
        ]);
        assert!(history.is_ok_and(|h| h.len() == 3));
    }

    #[test]
    fn rejects_mismatched_output() {
        let err = History::new(vec![op(read(), Some(Output::Write), 0, Some(1))]);
        assert_eq!(err, Err(HistoryError::OutputMismatch { index: 0 }));
    }

    #[test]
    fn rejects_missing_or_inverted_completion() {
        let missing = History::new(vec![op(read(), Some(Output::Read(None)), 0, None)]);
        assert_eq!(missing, Err(HistoryError::MissingCompletion { index: 0 }));
        let inverted = History::new(vec![op(read(), Some(Output::Read(None)), 5, Some(4))]);
        assert!(matches!(
            inverted,
            Err(HistoryError::CompletedBeforeInvoked { index: 0, .. })
        ));
    }
}
