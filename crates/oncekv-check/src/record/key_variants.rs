//! The variants a command and an operation of a transaction have in
//! common, each written once so that both enums read and write them the
//! same way: the key operations (put, get, delete, incr, cas) of
//! [`Op`](super::Op) and [`TxnOp`](super::TxnOp), declared by
//! `key_operation_enum!`, and their results with a transaction's, of
//! [`Reply`](super::Reply) and [`TxnOpResult`](super::TxnOpResult), declared
//! by `key_result_enum!`.

/// Declares an enum with the key operations [`Op`](super::Op) and
/// [`TxnOp`](super::TxnOp) share, then the variants written in the call.
macro_rules! key_operation_enum {
    ($(#[$attr:meta])* $vis:vis enum $name:ident { $($variants:tt)* }) => {
        $(#[$attr])*
        $vis enum $name {
            /// Set `key` to `value`.
            Put {
                /// The key.
                key: $crate::record::Bytes,
                /// The value.
                value: $crate::record::Bytes,
            },
            /// Read `key`.
            Get {
                /// The key.
                key: $crate::record::Bytes,
            },
            /// Remove `key`.
            Delete {
                /// The key.
                key: $crate::record::Bytes,
            },
            /// Add `by` to the decimal integer at `key` (absent counts as 0).
            Incr {
                /// The key.
                key: $crate::record::Bytes,
                /// The increment.
                by: i64,
            },
            /// Set `key` to `new` when it holds `expected` (`None`: absent).
            Cas {
                /// The key.
                key: $crate::record::Bytes,
                /// The value it must hold.
                #[serde(default)]
                expected: Option<$crate::record::Bytes>,
                /// The value written.
                new: $crate::record::Bytes,
            },
            $($variants)*
        }
    };
}

pub(super) use key_operation_enum;

/// Declares an enum with the results [`Reply`](super::Reply) and
/// [`TxnOpResult`](super::TxnOpResult) share, then the variants written in
/// the call.
macro_rules! key_result_enum {
    ($(#[$attr:meta])* $vis:vis enum $name:ident { $($variants:tt)* }) => {
        $(#[$attr])*
        $vis enum $name {
            /// `Put` (in a transaction, `PutExisting` too): the previous
            /// value.
            Put {
                /// The value before, if any.
                #[serde(default)]
                previous: Option<$crate::record::Bytes>,
            },
            /// `Get`: the value read.
            Get {
                /// The value, if present.
                #[serde(default)]
                value: Option<$crate::record::Bytes>,
            },
            /// `Delete`: the previous value.
            Delete {
                /// The value before, if any.
                #[serde(default)]
                previous: Option<$crate::record::Bytes>,
            },
            /// `Append`: the value's length after the append.
            Append {
                /// The new length in bytes.
                length: u64,
            },
            /// `Incr`: the counter's new value.
            Incr {
                /// The new value.
                value: i64,
            },
            /// `Cas`: whether it swapped and the value after it.
            Cas {
                /// Whether the value matched and was replaced.
                swapped: bool,
                /// The value after the operation.
                #[serde(default)]
                current: Option<$crate::record::Bytes>,
            },
            /// `Txn` (in a transaction, a nested one): which branch ran and
            /// one result per operation of it.
            Txn {
                /// Whether every compare held (the success branch ran).
                succeeded: bool,
                /// The results of the branch's operations, in order.
                #[serde(default)]
                results: Vec<$crate::record::TxnOpResult>,
            },
            $($variants)*
        }
    };
}

pub(super) use key_result_enum;

#[cfg(test)]
mod tests {
    use super::super::*;

    /// A recorded line of every operation and every reply, a transaction
    /// holding every transaction operation and every result among them, as
    /// the recorder writes them.
    const RECORDED: &str = r#"{"event":"invoke","at_ns":1,"client":1,"op_id":1,"request":{"session":3,"seq":1},"op":{"type":"put","key":"k","value":"v"}}
{"event":"invoke","at_ns":2,"client":1,"op_id":2,"request":{},"op":{"type":"get","key":{"hex":"ff00"}}}
{"event":"invoke","at_ns":3,"client":1,"op_id":3,"request":{},"op":{"type":"delete","key":"k"}}
{"event":"invoke","at_ns":4,"client":1,"op_id":4,"request":{"idempotency_key":"i"},"op":{"type":"append","key":"k","token":"t1"}}
{"event":"invoke","at_ns":5,"client":1,"op_id":5,"request":{},"op":{"type":"incr","key":"c","by":-2}}
{"event":"invoke","at_ns":6,"client":1,"op_id":6,"request":{},"op":{"type":"cas","key":"k","expected":"v","new":"w"}}
{"event":"invoke","at_ns":7,"client":1,"op_id":7,"request":{},"op":{"type":"cas","key":"k","expected":null,"new":"w"}}
{"event":"invoke","at_ns":8,"client":1,"op_id":8,"request":{},"op":{"type":"lease_grant","name":"l","ttl_ms":500}}
{"event":"invoke","at_ns":9,"client":1,"op_id":9,"request":{},"op":{"type":"lease_revoke","name":"l"}}
{"event":"invoke","at_ns":10,"client":1,"op_id":10,"request":{},"op":{"type":"txn","compares":[{"range":{"key":"a"},"op":"greater","target":{"value":"0"}}],"success":[{"type":"put","key":"a","value":"1"},{"type":"delete","key":"b"},{"type":"delete_prefix","prefix":"p/"},{"type":"get","key":"a"},{"type":"get_prefix","prefix":"p/"},{"type":"append","key":"s","value":"x;"},{"type":"incr","key":"c","by":3},{"type":"cas","key":"k","expected":null,"new":"w"},{"type":"get_range","start":"a","end":"c"},{"type":"delete_range","start":"q/","end":null},{"type":"put_existing","key":"a","value":null}],"failure":[{"type":"txn","txn":{"compares":[],"success":[{"type":"get","key":"a"}],"failure":[]}}]}}
{"event":"complete","at_ns":11,"client":1,"op_id":1,"attempts":1,"outcome":{"status":"ok","reply":{"type":"put","previous":null}}}
{"event":"complete","at_ns":12,"client":1,"op_id":2,"attempts":1,"outcome":{"status":"ok","reply":{"type":"get","value":{"hex":"ff"}}}}
{"event":"complete","at_ns":13,"client":1,"op_id":3,"attempts":1,"outcome":{"status":"ok","reply":{"type":"delete","previous":"v"}}}
{"event":"complete","at_ns":14,"client":1,"op_id":4,"attempts":2,"outcome":{"status":"ok","reply":{"type":"append","length":3},"canonical":{"hex":"ff03"}}}
{"event":"complete","at_ns":15,"client":1,"op_id":5,"attempts":1,"outcome":{"status":"ok","reply":{"type":"incr","value":-2}}}
{"event":"complete","at_ns":16,"client":1,"op_id":6,"attempts":1,"outcome":{"status":"ok","reply":{"type":"cas","swapped":true,"current":"w"}}}
{"event":"complete","at_ns":17,"client":1,"op_id":7,"attempts":1,"outcome":{"status":"ok","reply":{"type":"cas","swapped":false,"current":null}}}
{"event":"complete","at_ns":18,"client":1,"op_id":8,"attempts":1,"outcome":{"status":"ok","reply":{"type":"lease_granted","name":"l","ttl_ms":500,"expires_at_ms":1500}}}
{"event":"complete","at_ns":19,"client":1,"op_id":9,"attempts":1,"outcome":{"status":"ok","reply":{"type":"lease_revoked","name":"l","keys_deleted":2}}}
{"event":"complete","at_ns":20,"client":1,"op_id":8,"attempts":1,"outcome":{"status":"ok","reply":{"type":"rejected","reason":"LeaseExists"}}}
{"event":"complete","at_ns":21,"client":1,"op_id":10,"attempts":1,"outcome":{"status":"ok","reply":{"type":"txn","succeeded":true,"results":[{"type":"put","previous":"0"},{"type":"delete","previous":null},{"type":"delete_prefix","deleted":2},{"type":"get","value":"1"},{"type":"get_prefix","entries":[{"key":"p/a","value":"1"}]},{"type":"append","length":2},{"type":"incr","value":3},{"type":"cas","swapped":true,"current":"w"},{"type":"get_prefix","entries":[]},{"type":"delete_prefix","deleted":0},{"type":"put","previous":"1"}]}}}
{"event":"complete","at_ns":22,"client":1,"op_id":10,"attempts":1,"outcome":{"status":"ok","reply":{"type":"txn","succeeded":false,"results":[{"type":"txn","succeeded":true,"results":[{"type":"get","value":null}]}]}}}
{"event":"response","at_ns":23,"client":1,"op_id":1,"request":{"session":3,"seq":1},"attempt":1,"node":2,"answer":{"type":"applied","reply":{"type":"put","previous":null},"log_index":9},"dropped_after_commit":false,"batch":1}
"#;

    #[test]
    fn recorded_lines_of_every_variant_read_and_write_back_unchanged() {
        let events = read_events(RECORDED.as_bytes()).expect("the recorded lines read");
        assert_eq!(events.len(), RECORDED.lines().count());
        let mut written = Vec::new();
        write_events(&mut written, &events).expect("the events write");
        let written = String::from_utf8(written).expect("UTF-8");
        for (recorded, written) in RECORDED.lines().zip(written.lines()) {
            assert_eq!(written, recorded);
        }
        assert_eq!(written, RECORDED);
    }

    #[test]
    fn recorded_variants_without_their_defaulted_fields_still_read() {
        fn read<T: serde::de::DeserializeOwned>(json: &str) -> T {
            serde_json::from_str(json).expect(json)
        }
        assert_eq!(
            read::<Op>(r#"{"type":"cas","key":"k","new":"w"}"#),
            Op::Cas {
                key: "k".into(),
                expected: None,
                new: "w".into(),
            }
        );
        assert_eq!(
            read::<TxnOp>(r#"{"type":"cas","key":"k","new":"w"}"#),
            TxnOp::Cas {
                key: "k".into(),
                expected: None,
                new: "w".into(),
            }
        );
        for (json, reply, result) in [
            (
                r#"{"type":"put"}"#,
                Reply::Put { previous: None },
                TxnOpResult::Put { previous: None },
            ),
            (
                r#"{"type":"get"}"#,
                Reply::Get { value: None },
                TxnOpResult::Get { value: None },
            ),
            (
                r#"{"type":"delete"}"#,
                Reply::Delete { previous: None },
                TxnOpResult::Delete { previous: None },
            ),
            (
                r#"{"type":"cas","swapped":false}"#,
                Reply::Cas {
                    swapped: false,
                    current: None,
                },
                TxnOpResult::Cas {
                    swapped: false,
                    current: None,
                },
            ),
            (
                r#"{"type":"txn","succeeded":true}"#,
                Reply::Txn {
                    succeeded: true,
                    results: vec![],
                },
                TxnOpResult::Txn {
                    succeeded: true,
                    results: vec![],
                },
            ),
        ] {
            assert_eq!(read::<Reply>(json), reply);
            assert_eq!(read::<TxnOpResult>(json), result);
        }
    }
}
