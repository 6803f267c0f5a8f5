//! A transaction as the history records it: [`Txn`] (compares, then the
//! success or the failure branch), its [`Compare`]s and [`TxnOp`]s, and the
//! [`TxnOpResult`] of each operation of the branch that ran. The shape
//! mirrors the state machine's planned `Txn{compare, success, failure}`:
//! keys are bytes; a compare tests a key or every key under a prefix. The
//! variants [`TxnOp`] and [`TxnOpResult`] share with a command's
//! operation and reply are declared in `key_variants`.

use super::key_variants::{key_operation_enum, key_result_enum};
use super::*;

/// An atomic transaction: when every compare holds, the `success`
/// operations run, otherwise the `failure` ones, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Txn {
    /// The conditions, all of which must hold.
    #[serde(default)]
    pub compares: Vec<Compare>,
    /// The operations run when they all hold.
    #[serde(default)]
    pub success: Vec<TxnOp>,
    /// The operations run otherwise.
    #[serde(default)]
    pub failure: Vec<TxnOp>,
}

impl fmt::Display for Txn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("txn if")?;
        for compare in &self.compares {
            write!(f, " [{compare}]")?;
        }
        f.write_str(" then")?;
        for op in &self.success {
            write!(f, " [{op}]")?;
        }
        f.write_str(" else")?;
        for op in &self.failure {
            write!(f, " [{op}]")?;
        }
        Ok(())
    }
}

impl Txn {
    /// The branch taken for `succeeded`.
    pub fn branch(&self, succeeded: bool) -> &[TxnOp] {
        if succeeded {
            &self.success
        } else {
            &self.failure
        }
    }
}

/// What a compare looks at: one key, every key under a prefix, or every
/// key in a range.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyRange {
    /// One key.
    Key(Bytes),
    /// Every key starting with these bytes.
    Prefix(Bytes),
    /// Every key from `start` up to `end` (excluded), or from `start` on.
    Range {
        /// The first key.
        start: Bytes,
        /// The first key after the range; `None`: no end.
        #[serde(default)]
        end: Option<Bytes>,
    },
}

impl KeyRange {
    /// Whether `key` is one it names.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            Self::Key(k) => k.as_slice() == key,
            Self::Prefix(prefix) => key.starts_with(prefix.as_slice()),
            Self::Range { start, end } => in_span(start, end.as_ref(), key),
        }
    }
}

/// Whether `key` is at or after `start` and before `end` (if any).
pub fn in_span(start: &Bytes, end: Option<&Bytes>, key: &[u8]) -> bool {
    key >= start.as_slice() && end.is_none_or(|end| key < end.as_slice())
}

/// A range in words: `[start, end)`, or `[start, ...)` without an end.
fn span_words(start: &Bytes, end: Option<&Bytes>) -> String {
    match end {
        Some(end) => format!("[{start}, {end})"),
        None => format!("[{start}, ...)"),
    }
}

impl fmt::Display for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key(key) => write!(f, "{key}"),
            Self::Prefix(prefix) => write!(f, "{prefix}*"),
            Self::Range { start, end } => f.write_str(&span_words(start, end.as_ref())),
        }
    }
}

/// How a compare relates the key's property to its operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompareOp {
    /// `==`.
    Equal,
    /// `!=`.
    NotEqual,
    /// `<` (bytewise for values).
    Less,
    /// `>` (bytewise for values).
    Greater,
}

impl CompareOp {
    /// Whether `actual` relates to `operand` as this operator says.
    pub fn holds<T: Ord + ?Sized>(self, actual: &T, operand: &T) -> bool {
        match self {
            Self::Equal => actual == operand,
            Self::NotEqual => actual != operand,
            Self::Less => actual < operand,
            Self::Greater => actual > operand,
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            Self::Equal => "==",
            Self::NotEqual => "!=",
            Self::Less => "<",
            Self::Greater => ">",
        }
    }
}

/// The property a compare tests, with its operand.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompareTarget {
    /// The value's bytes.
    Value(Bytes),
    /// How many times the key was written since it was created.
    Version(u64),
    /// The revision that created the key.
    CreateRevision(u64),
    /// The revision that last changed the key.
    ModRevision(u64),
    /// The name of the key's lease (`None`: no lease, below every name).
    Lease(Option<String>),
    /// Whether the key exists (`false < true`).
    Exists(bool),
}

/// One condition of a [`Txn`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Compare {
    /// The key or prefix.
    pub range: KeyRange,
    /// The operator.
    pub op: CompareOp,
    /// The property and operand.
    pub target: CompareTarget,
}

impl fmt::Display for Compare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let symbol = self.op.symbol();
        match &self.target {
            CompareTarget::Value(value) => write!(f, "value({}) {symbol} {value}", self.range),
            CompareTarget::Version(n) => write!(f, "version({}) {symbol} {n}", self.range),
            CompareTarget::CreateRevision(n) => {
                write!(f, "create_revision({}) {symbol} {n}", self.range)
            }
            CompareTarget::ModRevision(n) => write!(f, "mod_revision({}) {symbol} {n}", self.range),
            CompareTarget::Exists(b) => write!(f, "exists({}) {symbol} {b}", self.range),
            CompareTarget::Lease(name) => write!(
                f,
                "lease({}) {symbol} {}",
                self.range,
                name.as_deref().unwrap_or("none")
            ),
        }
    }
}

key_operation_enum! {
    /// One operation inside a [`Txn`] branch.
    #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum TxnOp {
        /// Remove every key under `prefix`.
        DeletePrefix {
            /// The prefix.
            prefix: Bytes,
        },
        /// Read every key under `prefix`.
        GetPrefix {
            /// The prefix.
            prefix: Bytes,
        },
        /// Append `value`'s bytes to `key` (absent counts as empty).
        Append {
            /// The key.
            key: Bytes,
            /// The suffix.
            value: Bytes,
        },
        /// Read every key from `start` up to `end` (or on).
        GetRange {
            /// The first key.
            start: Bytes,
            /// The first key after the range; `None`: no end.
            #[serde(default)]
            end: Option<Bytes>,
        },
        /// Remove every key from `start` up to `end` (or on).
        DeleteRange {
            /// The first key.
            start: Bytes,
            /// The first key after the range; `None`: no end.
            #[serde(default)]
            end: Option<Bytes>,
        },
        /// Set `key`, which must exist (the transaction is refused otherwise),
        /// to `value`, or keep its value (`None`).
        PutExisting {
            /// The key.
            key: Bytes,
            /// The value written; `None`: the key keeps its value.
            #[serde(default)]
            value: Option<Bytes>,
        },
        /// A transaction nested in this branch (etcd's nested transactions):
        /// its compares are evaluated with the enclosing transaction's, before
        /// any operation runs; then its branch's operations run here, in order.
        Txn {
            /// The nested transaction.
            txn: Box<Txn>,
        },
    }
}

impl TxnOp {
    /// Whether `result` is a result this operation can have.
    pub fn accepts(&self, result: &TxnOpResult) -> bool {
        matches!(
            (self, result),
            (Self::Put { .. }, TxnOpResult::Put { .. })
                | (Self::Delete { .. }, TxnOpResult::Delete { .. })
                | (Self::DeletePrefix { .. }, TxnOpResult::DeletePrefix { .. })
                | (Self::Get { .. }, TxnOpResult::Get { .. })
                | (Self::GetPrefix { .. }, TxnOpResult::GetPrefix { .. })
                | (Self::Append { .. }, TxnOpResult::Append { .. })
                | (Self::Incr { .. }, TxnOpResult::Incr { .. })
                | (Self::Cas { .. }, TxnOpResult::Cas { .. })
                | (Self::GetRange { .. }, TxnOpResult::GetPrefix { .. })
                | (Self::DeleteRange { .. }, TxnOpResult::DeletePrefix { .. })
                | (Self::PutExisting { .. }, TxnOpResult::Put { .. })
        ) || match (self, result) {
            (Self::Txn { txn }, TxnOpResult::Txn { succeeded, results }) => {
                let branch = txn.branch(*succeeded);
                branch.len() == results.len()
                    && branch.iter().zip(results).all(|(op, r)| op.accepts(r))
            }
            _ => false,
        }
    }

    /// Whether it only reads (a nested transaction: whether every
    /// operation of both its branches does).
    pub fn is_read(&self) -> bool {
        match self {
            Self::Get { .. } | Self::GetPrefix { .. } | Self::GetRange { .. } => true,
            Self::Txn { txn } => txn.success.iter().chain(&txn.failure).all(Self::is_read),
            _ => false,
        }
    }

    /// Whether it is, or holds, a nested transaction.
    pub fn is_nested_txn(&self) -> bool {
        matches!(self, Self::Txn { .. })
    }
}

impl fmt::Display for TxnOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Put { key, value } => write!(f, "put {key} {value}"),
            Self::Delete { key } => write!(f, "delete {key}"),
            Self::DeletePrefix { prefix } => write!(f, "delete {prefix}*"),
            Self::Get { key } => write!(f, "get {key}"),
            Self::GetPrefix { prefix } => write!(f, "get {prefix}*"),
            Self::Append { key, value } => write!(f, "append {key} {value}"),
            Self::Incr { key, by } => write!(f, "incr {key} {by}"),
            Self::Cas { key, expected, new } => match expected {
                Some(expected) => write!(f, "cas {key} {expected} -> {new}"),
                None => write!(f, "cas {key} absent -> {new}"),
            },
            Self::GetRange { start, end } => write!(f, "get {}", span_words(start, end.as_ref())),
            Self::DeleteRange { start, end } => {
                write!(f, "delete {}", span_words(start, end.as_ref()))
            }
            Self::PutExisting { key, value } => match value {
                Some(value) => write!(f, "put existing {key} {value}"),
                None => write!(f, "put existing {key} (value kept)"),
            },
            Self::Txn { txn } => write!(f, "{txn}"),
        }
    }
}

/// A key and its value, as a prefix read returns them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyValue {
    /// The key.
    pub key: Bytes,
    /// Its value.
    pub value: Bytes,
}

key_result_enum! {
    /// The result of one [`TxnOp`].
    #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum TxnOpResult {
        /// `DeletePrefix` and `DeleteRange`: how many keys were removed.
        DeletePrefix {
            /// The count.
            deleted: u64,
        },
        /// `GetPrefix` and `GetRange`: the keys present there, in key order.
        GetPrefix {
            /// The keys and values.
            #[serde(default)]
            entries: Vec<KeyValue>,
        },
    }
}
