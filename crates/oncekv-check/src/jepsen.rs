//! Reads the Jepsen etcd register log format into a [`History`].
//!
//! Each event line looks like
//!
//! ```text
//! INFO  jepsen.util - 3  :invoke  :cas  [1 2]
//! ```
//!
//! that is, whatever the logger prints, then ` - `, then the process number,
//! the event type (`:invoke`, `:ok`, `:fail`, `:info`), the function
//! (`:read`, `:write`, `:cas`) and its value (`nil`, an integer, or
//! `[expected new]`), separated by tabs or spaces. The whole log is one
//! register, [`REGISTER_KEY`]. Line order is the real-time order: the `i`-th
//! event happens at time `i`.
//!
//! How events map onto operations:
//!
//! * `:ok` completes the process's pending operation with a known outcome.
//! * `:fail` means the operation definitely did not take effect; it is
//!   dropped, as it constrains nothing.
//! * `:info` means the outcome is unknown: a write or compare-and-set stays
//!   in the history with no output (it may take effect at any time after its
//!   invocation, or never); a read is dropped.
//! * An operation still pending when the log ends is treated like `:info`.
//! * Lines of the `:nemesis` process and blank lines are skipped.
//!
//! Malformed input is reported as a [`JepsenError`] naming the line.

use crate::history::{ClientId, History, HistoryError, Operation, Value};
use crate::register::{Call, Output};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The key every operation of a Jepsen register log is given.
pub const REGISTER_KEY: &[u8] = b"register";

/// Why a Jepsen log could not be read.
#[derive(Debug, Error)]
pub enum JepsenError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying failure.
        source: std::io::Error,
    },
    /// A line is not a well-formed event, or does not fit the events
    /// before it.
    #[error("line {line}: {kind}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        kind: LineError,
    },
    /// The operations do not form a valid history.
    #[error("invalid history: {0}")]
    History(#[from] HistoryError),
}

/// What is wrong with one line of a Jepsen log.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum LineError {
    /// The line lacks the ` - <process> <type> <function>` part.
    #[error("not an event of the form `... - <process> <type> <function> <value>`")]
    Malformed,
    /// The process is neither a number nor `:nemesis`.
    #[error("process {0:?} is not a number")]
    BadProcess(String),
    /// The event type is not `:invoke`, `:ok`, `:fail` or `:info`.
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    /// The function is not `:read`, `:write` or `:cas`.
    #[error("unknown function {0:?}")]
    UnknownFunction(String),
    /// The value does not suit the function.
    #[error("bad value {value:?} for {function}")]
    BadValue {
        /// The function, as written.
        function: String,
        /// The value, as written.
        value: String,
    },
    /// A process invoked while it already had an operation pending.
    #[error("process {process} invoked while its operation from line {pending_line} is pending")]
    AlreadyPending {
        /// The process.
        process: ClientId,
        /// Where its pending operation was invoked.
        pending_line: usize,
    },
    /// A process completed an operation it had not invoked.
    #[error("process {process} completed an operation it never invoked")]
    NotPending {
        /// The process.
        process: ClientId,
    },
    /// A completion names another function or other arguments than its
    /// invocation.
    #[error("completion does not match the invocation on line {invoke_line}")]
    Mismatch {
        /// Where the operation was invoked.
        invoke_line: usize,
    },
    /// The log has more events than a history can hold.
    #[error("too many events")]
    TooLong,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Invoke,
    Ok,
    Fail,
    Info,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Function {
    Read,
    Write,
    Cas,
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => ":read",
            Self::Write => ":write",
            Self::Cas => ":cas",
        })
    }
}

struct Pending {
    line: usize,
    time: u64,
    call: Call,
}

/// Reads a Jepsen etcd register log from `path`.
pub fn parse_log_file(path: &Path) -> Result<History<Call>, JepsenError> {
    let text = std::fs::read_to_string(path).map_err(|source| JepsenError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_log(&text)
}

/// Reads a Jepsen etcd register log.
pub fn parse_log(text: &str) -> Result<History<Call>, JepsenError> {
    let mut pending: HashMap<ClientId, Pending> = HashMap::new();
    let mut operations = Vec::new();
    let mut time: u64 = 0;

    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let at = |kind| JepsenError::Line { line, kind };
        if raw.trim().is_empty() {
            continue;
        }
        let Some(event) = parse_line(raw).map_err(at)? else {
            continue;
        };
        let now = time;
        time = time.checked_add(1).ok_or(at(LineError::TooLong))?;

        match event.kind {
            EventType::Invoke => {
                let call = parse_call(event.function, event.value).map_err(at)?;
                if let Some(previous) = pending.get(&event.process) {
                    return Err(at(LineError::AlreadyPending {
                        process: event.process,
                        pending_line: previous.line,
                    }));
                }
                pending.insert(
                    event.process,
                    Pending {
                        line,
                        time: now,
                        call,
                    },
                );
            }
            EventType::Ok | EventType::Fail | EventType::Info => {
                let Some(invoked) = pending.remove(&event.process) else {
                    return Err(at(LineError::NotPending {
                        process: event.process,
                    }));
                };
                let mismatch = LineError::Mismatch {
                    invoke_line: invoked.line,
                };
                if function_of(&invoked.call) != event.function {
                    return Err(at(mismatch));
                }
                let output = match event.kind {
                    EventType::Ok => Some(
                        completion_output(&invoked.call, event.function, event.value)
                            .map_err(at)?
                            .ok_or(at(mismatch))?,
                    ),
                    EventType::Info if !matches!(invoked.call, Call::Read { .. }) => None,
                    // Failed operations did not happen; reads of unknown
                    // outcome say nothing.
                    _ => continue,
                };
                operations.push(Operation {
                    client: event.process,
                    call: invoked.call,
                    output,
                    invoke_ns: invoked.time,
                    complete_ns: Some(now),
                });
            }
        }
    }

    // Operations never completed have unknown outcomes.
    let mut leftover: Vec<(ClientId, Pending)> = pending.into_iter().collect();
    leftover.sort_by_key(|(_, p)| p.line);
    for (process, invoked) in leftover {
        if matches!(invoked.call, Call::Read { .. }) {
            continue;
        }
        operations.push(Operation {
            client: process,
            call: invoked.call,
            output: None,
            invoke_ns: invoked.time,
            complete_ns: None,
        });
    }
    Ok(History::new(operations)?)
}

struct Event<'a> {
    process: ClientId,
    kind: EventType,
    function: Function,
    value: &'a str,
}

/// Splits one line; `Ok(None)` for a line to skip.
fn parse_line(line: &str) -> Result<Option<Event<'_>>, LineError> {
    let (_, rest) = line.split_once(" - ").ok_or(LineError::Malformed)?;
    let rest = rest.trim();
    let (process, rest) = split_token(rest).ok_or(LineError::Malformed)?;
    if process == ":nemesis" {
        return Ok(None);
    }
    let process: ClientId = process
        .parse()
        .map_err(|_| LineError::BadProcess(process.to_owned()))?;
    let (kind, rest) = split_token(rest).ok_or(LineError::Malformed)?;
    let kind = match kind {
        ":invoke" => EventType::Invoke,
        ":ok" => EventType::Ok,
        ":fail" => EventType::Fail,
        ":info" => EventType::Info,
        other => return Err(LineError::UnknownType(other.to_owned())),
    };
    let (function, value) = split_token(rest).ok_or(LineError::Malformed)?;
    let function = match function {
        ":read" => Function::Read,
        ":write" => Function::Write,
        ":cas" => Function::Cas,
        other => return Err(LineError::UnknownFunction(other.to_owned())),
    };
    Ok(Some(Event {
        process,
        kind,
        function,
        value: value.trim(),
    }))
}

/// The first whitespace-separated token and the rest, or `None` when empty.
fn split_token(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start();
    if text.is_empty() {
        return None;
    }
    Some(text.split_once(char::is_whitespace).unwrap_or((text, "")))
}

fn function_of(call: &Call) -> Function {
    match call {
        Call::Read { .. } => Function::Read,
        Call::Write { .. } => Function::Write,
        Call::Cas { .. } => Function::Cas,
    }
}

fn bad_value(function: Function, value: &str) -> LineError {
    LineError::BadValue {
        function: function.to_string(),
        value: value.to_owned(),
    }
}

/// An integer value in canonical decimal form.
fn parse_int(text: &str) -> Option<Value> {
    text.parse::<i64>().ok().map(|n| n.to_string().into_bytes())
}

/// `nil` or an integer.
fn parse_optional_int(text: &str) -> Option<Option<Value>> {
    if text == "nil" {
        Some(None)
    } else {
        parse_int(text).map(Some)
    }
}

/// `[expected new]`, where `expected` may be `nil`.
fn parse_pair(text: &str) -> Option<(Option<Value>, Value)> {
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    let mut parts = inner.split_whitespace();
    let expected = parse_optional_int(parts.next()?)?;
    let new = parse_int(parts.next()?)?;
    if parts.next().is_some() {
        return None;
    }
    Some((expected, new))
}

fn parse_call(function: Function, value: &str) -> Result<Call, LineError> {
    let key = REGISTER_KEY.to_vec();
    match function {
        Function::Read => Ok(Call::Read { key }),
        Function::Write => parse_int(value)
            .map(|value| Call::Write { key, value })
            .ok_or_else(|| bad_value(function, value)),
        Function::Cas => parse_pair(value)
            .map(|(expected, new)| Call::Cas { key, expected, new })
            .ok_or_else(|| bad_value(function, value)),
    }
}

/// The output of an `:ok` event, or `Ok(None)` when its arguments differ
/// from the invocation's.
fn completion_output(
    invoked: &Call,
    function: Function,
    value: &str,
) -> Result<Option<Output>, LineError> {
    match invoked {
        Call::Read { .. } => parse_optional_int(value)
            .map(|read| Some(Output::Read(read)))
            .ok_or_else(|| bad_value(function, value)),
        Call::Write { .. } | Call::Cas { .. } => {
            let echoed = parse_call(function, value)?;
            Ok((&echoed == invoked).then_some(match echoed {
                Call::Cas { .. } => Output::Cas { swapped: true },
                _ => Output::Write,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_error(text: &str) -> (usize, LineError) {
        match parse_log(text) {
            Err(JepsenError::Line { line, kind }) => (line, kind),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn parses_every_event_kind() {
        let log = "\
INFO  jepsen.util - 0\t:invoke\t:read\tnil
INFO  jepsen.util - 1\t:invoke\t:write\t4
INFO  jepsen.util - 2\t:invoke\t:cas\t[4 2]
INFO  jepsen.util - 3   :invoke :cas    [nil 1]
INFO  jepsen.util - 0\t:ok\t:read\tnil
INFO  jepsen.util - 1\t:ok\t:write\t4
INFO  jepsen.util - 2\t:ok\t:cas\t[4 2]
INFO  jepsen.util - 3   :fail   :cas    [nil 1]
INFO  jepsen.util - 0\t:invoke\t:read\tnil
INFO  jepsen.util - 0\t:fail\t:read\t:timed-out
INFO  jepsen.util - 1\t:invoke\t:write\t3
INFO  jepsen.util - 1\t:info\t:write\t:timed-out
INFO  jepsen.util - :nemesis\t:info\t:start\tnil

INFO  jepsen.util - 5\t:invoke\t:cas\t[3 0]
INFO  jepsen.util - 6\t:invoke\t:read\tnil
";
        let history = parse_log(log).expect("parses");
        let ops = history.operations();
        let key = REGISTER_KEY.to_vec();
        let expected = vec![
            Operation {
                client: 0,
                call: Call::Read { key: key.clone() },
                output: Some(Output::Read(None)),
                invoke_ns: 0,
                complete_ns: Some(4),
            },
            Operation {
                client: 1,
                call: Call::Write {
                    key: key.clone(),
                    value: b"4".to_vec(),
                },
                output: Some(Output::Write),
                invoke_ns: 1,
                complete_ns: Some(5),
            },
            Operation {
                client: 2,
                call: Call::Cas {
                    key: key.clone(),
                    expected: Some(b"4".to_vec()),
                    new: b"2".to_vec(),
                },
                output: Some(Output::Cas { swapped: true }),
                invoke_ns: 2,
                complete_ns: Some(6),
            },
            Operation {
                client: 1,
                call: Call::Write {
                    key: key.clone(),
                    value: b"3".to_vec(),
                },
                output: None,
                invoke_ns: 10,
                complete_ns: Some(11),
            },
            Operation {
                client: 5,
                call: Call::Cas {
                    key,
                    expected: Some(b"3".to_vec()),
                    new: b"0".to_vec(),
                },
                output: None,
                invoke_ns: 12,
                complete_ns: None,
            },
        ];
        assert_eq!(ops, expected.as_slice());
    }

    #[test]
    fn empty_log_is_an_empty_history() {
        assert!(parse_log("").is_ok_and(|h| h.is_empty()));
    }

    #[test]
    fn rejects_malformed_lines() {
        assert_eq!(line_error("hello"), (1, LineError::Malformed));
        assert_eq!(line_error("INFO x - 1 :invoke"), (1, LineError::Malformed));
        assert_eq!(
            line_error("INFO x - p1 :invoke :read nil"),
            (1, LineError::BadProcess("p1".into()))
        );
        assert_eq!(
            line_error("INFO x - 1 :start :read nil"),
            (1, LineError::UnknownType(":start".into()))
        );
        assert_eq!(
            line_error("INFO x - 1 :invoke :append 3"),
            (1, LineError::UnknownFunction(":append".into()))
        );
        for bad in ["x", "", "nil", "[1 2]"] {
            let (line, kind) = line_error(&format!("INFO x - 1 :invoke :write {bad}"));
            assert_eq!(line, 1);
            assert!(matches!(kind, LineError::BadValue { .. }), "{bad}: {kind}");
        }
        for bad in ["[1]", "[1 2 3]", "1 2", "[1 nil]", "[a b]", "[1 2"] {
            let (_, kind) = line_error(&format!("INFO x - 1 :invoke :cas {bad}"));
            assert!(matches!(kind, LineError::BadValue { .. }), "{bad}: {kind}");
        }
        let (_, kind) = line_error("INFO x - 1 :invoke :read nil\nINFO x - 1 :ok :read three");
        assert!(matches!(kind, LineError::BadValue { .. }));
    }

    #[test]
    fn rejects_events_out_of_sequence() {
        assert_eq!(
            line_error("INFO x - 1 :ok :read nil"),
            (1, LineError::NotPending { process: 1 })
        );
        assert_eq!(
            line_error("INFO x - 1 :invoke :read nil\nINFO x - 1 :invoke :read nil"),
            (
                2,
                LineError::AlreadyPending {
                    process: 1,
                    pending_line: 1
                }
            )
        );
        assert_eq!(
            line_error("INFO x - 1 :invoke :read nil\nINFO x - 1 :ok :write 1"),
            (2, LineError::Mismatch { invoke_line: 1 })
        );
        assert_eq!(
            line_error("INFO x - 1 :invoke :write 2\nINFO x - 1 :ok :write 1"),
            (2, LineError::Mismatch { invoke_line: 1 })
        );
        assert_eq!(
            line_error("INFO x - 1 :invoke :cas [1 2]\n\nINFO x - 1 :ok :cas [2 1]"),
            (3, LineError::Mismatch { invoke_line: 1 })
        );
    }

    #[test]
    fn reports_missing_files() {
        let missing = Path::new("/nonexistent/oncekv/history.log");
        assert!(matches!(
            parse_log_file(missing),
            Err(JepsenError::Io { .. })
        ));
    }
}
