//! Write stalls around a run's fault windows ([`of`]): for each window of
//! the record, the longest time the clients went without a write
//! succeeding, and the latency of the writes invoked during it, computed
//! from the recorded history and the fault timeline alone (no clock); and
//! their rendering, the table `oncekv verify` prints ([`to_text`]) and
//! the section its HTML report carries under the timeline ([`to_html`],
//! [`with_html_section`]).
//!
//! Definitions (`docs/verification.md` says the same):
//!
//! * a **write** is every operation but a GET and a transaction whose
//!   operations, in both branches, only read; it **succeeded** when the
//!   client got a reply (`Outcome::Ok`, a deterministic rejection such as
//!   a CAS that did not match included: it went through the log);
//! * the window runs from its start to its end, or to the record's end
//!   if it never ended (`window_open`);
//! * the **longest gap** is the longest of the intervals between
//!   consecutive successful write completions (any client), counting the
//!   window's start as the first point: from the window's start to the
//!   first success after it, between successes within the window, and
//!   from the last success before the window's end to the first at or
//!   after it. A gap already open when the window began counts from the
//!   window's start only. If no write succeeded after the gap began, it
//!   runs to the record's end and is open (`gap_open`);
//! * the **latency** is of the writes invoked in `[start, end)`: their
//!   count, how many succeeded, failed (definitely not applied) or stayed
//!   unknown (never completed included), and the p50, p99 and maximum of
//!   the successful ones' invocation-to-completion time, by nearest rank
//!   (with fewer than 100 writes the p99 is the maximum).
//!
//! A window shorter than [`MARK_NS`] is a mark on the timeline (a step's
//! outcome, started and ended at once, such as what a removed member was
//! seen doing), not a fault: it is measured and flagged (`mark`), and the
//! tables leave it out.

use crate::nemesis::Fault;
use oncekv_check::record::{FaultId, FaultKind, FaultWindow, NodeId, Op, Outcome, Record};
use oncekv_check::report::esc;
use std::fmt::Write as _;

/// Windows shorter than this are marks, not faults.
pub const MARK_NS: u64 = 1_000_000;

/// The longest stretch without a successful write completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    /// When it began: the window's start, or a successful completion.
    pub from_ns: u64,
    /// When it ended: the next successful completion, or the record's
    /// end when there was none (`open`).
    pub to_ns: u64,
    /// No write succeeded after `from_ns`.
    pub open: bool,
}

impl Gap {
    /// Its length.
    pub fn len_ns(&self) -> u64 {
        self.to_ns - self.from_ns
    }
}

/// The writes invoked during a window, and how they ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteLatency {
    /// Writes invoked in the window.
    pub invoked: usize,
    /// Of them, answered with a reply.
    pub ok: usize,
    /// Definitely not applied.
    pub failed: usize,
    /// Not known (never completed included).
    pub unknown: usize,
    /// Median latency of the successful ones.
    pub p50_ns: Option<u64>,
    /// 99th percentile, by nearest rank.
    pub p99_ns: Option<u64>,
    /// The slowest.
    pub max_ns: Option<u64>,
}

/// One fault window and the write stall the clients saw during it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowStall {
    /// The window's fault id.
    pub fault_id: FaultId,
    /// Its kind in the history.
    pub kind: FaultKind,
    /// The `--faults` kind it is a step of, when its detail names one
    /// (every membership step's does: `add-learner: ...`).
    pub change: Option<Fault>,
    /// Which step of the change, when its detail says.
    pub step: Option<&'static str>,
    /// The node it hit.
    pub target: Option<NodeId>,
    /// Its detail.
    pub detail: Option<String>,
    /// When it began.
    pub start_ns: u64,
    /// When it ended (the record's end if it never did).
    pub end_ns: u64,
    /// It never ended.
    pub window_open: bool,
    /// Shorter than [`MARK_NS`]: a mark on the timeline.
    pub mark: bool,
    /// The longest gap between successful writes overlapping it.
    pub longest_gap: Gap,
    /// The writes invoked during it.
    pub writes: WriteLatency,
}

impl WindowStall {
    /// A short name: the change and its step (`add-learner: promote`),
    /// else the history's kind (`kill`, `partition`).
    pub fn label(&self) -> String {
        match (self.change, self.step) {
            (Some(change), Some(step)) => format!("{change}: {step}"),
            (Some(change), None) => change.name().to_owned(),
            (None, _) => self.kind.name().to_owned(),
        }
    }
}

/// Whether `op` may change the store.
pub fn is_write(op: &Op) -> bool {
    match op {
        Op::Get { .. } => false,
        Op::Txn(txn) => !txn
            .success
            .iter()
            .chain(&txn.failure)
            .all(|op| op.is_read()),
        _ => true,
    }
}

/// The `--faults` kind whose name opens `detail` (`transfer: ...`).
fn change_of(detail: &str) -> Option<Fault> {
    Fault::ALL.into_iter().find(|fault| {
        detail
            .strip_prefix(fault.name())
            .is_some_and(|rest| rest.starts_with(':'))
    })
}

/// The step of a membership change a detail describes, by the call it
/// names (the details are `crate::membership`'s).
fn step_of(detail: &str) -> Option<&'static str> {
    let steps = [
        ("(MemberAdd)", "add learner"),
        ("(MemberPromote)", "promote"),
        ("its data wiped", "stop, wipe, remove"),
        ("still runs: watched", "watch removed"),
        ("(SIGTERM)", "restart member"),
    ];
    if let Some((_, step)) = steps.iter().find(|(words, _)| detail.contains(words)) {
        return Some(step);
    }
    if detail.contains("removed (MemberRemove)") {
        return Some(if detail.contains(": leader ") {
            "remove leader"
        } else {
            "remove follower"
        });
    }
    None
}

/// The nearest-rank `percent`th percentile of `sorted` (not empty).
fn percentile(sorted: &[u64], percent: usize) -> u64 {
    let rank = (sorted.len() * percent).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// `gap` if it is longer than `longest` (or there is none yet).
fn longer(longest: Option<Gap>, gap: Gap) -> Option<Gap> {
    match longest {
        Some(longest) if longest.len_ns() >= gap.len_ns() => Some(longest),
        _ => Some(gap),
    }
}

/// The longest gap between `successes` (sorted completion times)
/// overlapping `[start, end)`, counting `start` as the first point; open
/// when it runs to `record_end`.
fn longest_gap(successes: &[u64], start: u64, end: u64, record_end: u64) -> Gap {
    let first = successes.partition_point(|&at| at <= start);
    let mut from = start;
    let mut longest = None;
    for &at in &successes[first..] {
        let gap = Gap {
            from_ns: from,
            to_ns: at,
            open: false,
        };
        longest = longer(longest, gap);
        if at >= end {
            return longest.unwrap_or(gap);
        }
        from = at;
    }
    let open = Gap {
        from_ns: from,
        to_ns: record_end.max(from),
        open: true,
    };
    longer(longest, open).unwrap_or(open)
}

/// The writes of `record` invoked in `[start, end)` and their latency.
fn latency(record: &Record, start: u64, end: u64) -> WriteLatency {
    // The operations are sorted by invocation time.
    let first = record.ops.partition_point(|op| op.invoke_ns < start);
    let mut writes = WriteLatency::default();
    let mut took = Vec::new();
    for op in record.ops[first..]
        .iter()
        .take_while(|op| op.invoke_ns < end)
        .filter(|op| is_write(&op.op))
    {
        writes.invoked += 1;
        match (&op.outcome, op.complete_ns) {
            (Outcome::Ok { .. }, Some(done)) => {
                writes.ok += 1;
                took.push(done - op.invoke_ns);
            }
            (Outcome::Failed { .. }, Some(_)) => writes.failed += 1,
            _ => writes.unknown += 1,
        }
    }
    took.sort_unstable();
    if !took.is_empty() {
        writes.p50_ns = Some(percentile(&took, 50));
        writes.p99_ns = Some(percentile(&took, 99));
        writes.max_ns = took.last().copied();
    }
    writes
}

/// The write stall of every fault window of `record`, in the record's
/// order (by start).
pub fn of(record: &Record) -> Vec<WindowStall> {
    let mut successes: Vec<u64> = record
        .ops
        .iter()
        .filter(|op| is_write(&op.op) && matches!(op.outcome, Outcome::Ok { .. }))
        .filter_map(|op| op.complete_ns)
        .collect();
    successes.sort_unstable();
    let record_end = record.end_ns();
    record
        .faults
        .iter()
        .map(|window| stall_of(window, record, &successes, record_end))
        .collect()
}

fn stall_of(
    window: &FaultWindow,
    record: &Record,
    successes: &[u64],
    record_end: u64,
) -> WindowStall {
    let end = window.end_ns.unwrap_or(record_end).max(window.start_ns);
    let detail = window.detail.as_deref().unwrap_or_default();
    let change = change_of(detail);
    WindowStall {
        fault_id: window.id,
        kind: window.kind,
        change,
        step: change
            .filter(|c| c.changes_membership())
            .and_then(|_| step_of(detail)),
        target: window.target,
        detail: window.detail.clone(),
        start_ns: window.start_ns,
        end_ns: end,
        window_open: window.end_ns.is_none(),
        mark: end - window.start_ns < MARK_NS,
        longest_gap: longest_gap(successes, window.start_ns, end, record_end),
        writes: latency(record, window.start_ns, end),
    }
}

/// Milliseconds, to a tenth.
fn ms(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e6)
}

/// Seconds since the run's start, to a millisecond.
fn secs(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e9)
}

/// The cells of one table row: kind, node, window, gap, p50, p99, max,
/// writes.
fn cells(stall: &WindowStall) -> [String; 8] {
    let open = |open: bool| if open { "+" } else { "" };
    let optional = |ns: Option<u64>| ns.map_or_else(|| "-".to_owned(), ms);
    let w = &stall.writes;
    [
        stall.label(),
        stall
            .target
            .map_or_else(|| "-".to_owned(), |n| n.to_string()),
        format!(
            "{}-{}{}",
            secs(stall.start_ns),
            secs(stall.end_ns),
            open(stall.window_open)
        ),
        format!(
            "{}{}",
            ms(stall.longest_gap.len_ns()),
            open(stall.longest_gap.open)
        ),
        optional(w.p50_ns),
        optional(w.p99_ns),
        optional(w.max_ns),
        format!("{} ({}/{}/{})", w.invoked, w.ok, w.failed, w.unknown),
    ]
}

const HEADERS: [&str; 8] = [
    "kind",
    "node",
    "window s",
    "longest gap ms",
    "p50 ms",
    "p99 ms",
    "max ms",
    "writes (ok/failed/unknown)",
];

/// What the tables say, in a sentence.
const LEGEND: &str = "longest gap: from the window's start, the longest time between successful \
                      write completions (any client) up to the first at or after its end; \
                      p50/p99/max: latency of the successful writes invoked in the window; \
                      +: still open at the record's end";

/// The marks left out of the tables, as a sentence, if any.
fn marks_left_out(stalls: &[WindowStall]) -> Option<String> {
    let marks = stalls.iter().filter(|s| s.mark).count();
    (marks > 0).then(|| format!("{marks} mark(s) on the timeline (windows under 1 ms) left out"))
}

/// The table `oncekv verify` prints: one row per fault window (marks
/// left out); empty when there is no window.
pub fn to_text(stalls: &[WindowStall]) -> String {
    let rows: Vec<[String; 8]> = stalls.iter().filter(|s| !s.mark).map(cells).collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut widths = HEADERS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = format!("write stalls per fault window ({LEGEND})\n");
    let headers = HEADERS.map(str::to_owned);
    for row in std::iter::once(&headers).chain(&rows) {
        let mut line = String::new();
        for (column, (cell, width)) in row.iter().zip(widths).enumerate() {
            if column > 0 {
                line.push_str("  ");
            }
            // The label left, the numbers right.
            if column == 0 {
                let _ = write!(line, "{cell:<width$}");
            } else {
                let _ = write!(line, "{cell:>width$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if let Some(marks) = marks_left_out(stalls) {
        let _ = writeln!(out, "({marks})");
    }
    out
}

/// The HTML section: a heading, the legend and the table (each row's
/// detail as its tooltip); empty when there is no window.
pub fn to_html(stalls: &[WindowStall]) -> String {
    let rows: Vec<&WindowStall> = stalls.iter().filter(|s| !s.mark).collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("<h2>Write stalls</h2>\n");
    let _ = writeln!(out, "<p class=\"meta\">{}.</p>", esc(LEGEND));
    out.push_str("<table class=\"stalls\">\n<tr>");
    for header in HEADERS {
        let _ = write!(out, "<th>{}</th>", esc(header));
    }
    out.push_str("</tr>\n");
    for stall in rows {
        let cells = cells(stall);
        let title = stall.detail.as_deref().unwrap_or_default();
        let _ = write!(
            out,
            "<tr><td title=\"{}\">{}</td>",
            esc(title),
            esc(&cells[0])
        );
        for cell in &cells[1..] {
            let _ = write!(out, "<td class=\"num\">{}</td>", esc(cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    if let Some(marks) = marks_left_out(stalls) {
        let _ = writeln!(out, "<p class=\"meta\">{}.</p>", esc(&marks));
    }
    out
}

/// `page` (the report's HTML) with `section` placed under the timeline,
/// before the checkers' table (or at the end of the body).
pub fn with_html_section(page: &str, section: &str) -> String {
    let at = page
        .find("<h2>Checkers</h2>")
        .or_else(|| page.rfind("</body>"))
        .unwrap_or(page.len());
    let mut out = String::with_capacity(page.len() + section.len());
    out.push_str(&page[..at]);
    out.push_str(section);
    out.push_str(&page[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_check::record::{
        Event, FailReason, FaultEnd, FaultStart, Invocation, OpRecord, Reply, RequestIdentity, Txn,
        TxnOp,
    };

    const MS: u64 = 1_000_000;

    fn put() -> Op {
        Op::Put {
            key: "k".into(),
            value: "v".into(),
        }
    }

    fn ok() -> Outcome {
        Outcome::Ok {
            reply: Reply::Put { previous: None },
            canonical: None,
        }
    }

    fn read() -> Outcome {
        Outcome::Ok {
            reply: Reply::Get { value: None },
            canonical: None,
        }
    }

    /// An operation by `client`, invoked and completed at the given
    /// milliseconds (`None`: never completed).
    fn op(
        id: u64,
        client: u64,
        op: Op,
        invoke: u64,
        complete: Option<u64>,
        outcome: Outcome,
    ) -> OpRecord {
        OpRecord {
            id,
            client,
            op,
            request: RequestIdentity::plain(),
            invoke_ns: invoke * MS,
            complete_ns: complete.map(|at| at * MS),
            attempts: 1,
            outcome,
        }
    }

    fn window(id: u64, kind: FaultKind, detail: &str, start: u64, end: Option<u64>) -> FaultWindow {
        FaultWindow {
            id,
            kind,
            target: Some(2),
            detail: Some(detail.to_owned()),
            start_ns: start * MS,
            end_ns: end.map(|at| at * MS),
        }
    }

    fn record(ops: Vec<OpRecord>, faults: Vec<FaultWindow>) -> Record {
        let mut record = Record {
            ops,
            faults,
            ..Record::default()
        };
        record.ops.sort_by_key(|op| (op.invoke_ns, op.id));
        // Folded back from its events, as a run's record is.
        Record::from_events(record.to_events()).expect("a consistent record")
    }

    #[test]
    fn the_longest_gap_counts_from_the_window_s_start_to_the_first_success_after_its_end() {
        // Successes complete at 10, 40, 45 and 200 ms; a read completes at
        // 100 (not a write), a failed write at 120.
        let ops = vec![
            op(1, 1, put(), 0, Some(10), ok()),
            op(2, 2, put(), 5, Some(40), ok()),
            op(3, 3, put(), 30, Some(45), ok()),
            op(4, 4, Op::Get { key: "k".into() }, 50, Some(100), read()),
            op(
                5,
                5,
                put(),
                60,
                Some(120),
                Outcome::Failed {
                    reason: FailReason::NotLeader,
                    detail: None,
                },
            ),
            op(6, 1, put(), 70, Some(200), ok()),
        ];
        let faults = vec![window(1, FaultKind::Kill, "node 2 killed", 20, Some(80))];
        let stalls = of(&record(ops, faults));
        assert_eq!(stalls.len(), 1);
        let stall = &stalls[0];
        // 20 -> 40 (from the start, not from 10), 40 -> 45, 45 -> 200.
        assert_eq!(
            stall.longest_gap,
            Gap {
                from_ns: 45 * MS,
                to_ns: 200 * MS,
                open: false
            }
        );
        // Invoked in [20, 80): ops 3 (15 ms), 5 (failed), 6 (130 ms).
        assert_eq!(
            stall.writes,
            WriteLatency {
                invoked: 3,
                ok: 2,
                failed: 1,
                unknown: 0,
                p50_ns: Some(15 * MS),
                p99_ns: Some(130 * MS),
                max_ns: Some(130 * MS),
            }
        );
        assert!(!stall.mark && !stall.window_open);
        assert_eq!(stall.label(), "kill");
    }

    #[test]
    fn a_window_without_a_write_spans_to_the_first_success_after_it() {
        let ops = vec![
            op(1, 1, put(), 0, Some(10), ok()),
            op(2, 1, put(), 10, Some(500), ok()),
        ];
        let faults = vec![window(1, FaultKind::Pause, "", 100, Some(300))];
        let stall = &of(&record(ops, faults))[0];
        assert_eq!(
            stall.longest_gap,
            Gap {
                from_ns: 100 * MS,
                to_ns: 500 * MS,
                open: false
            }
        );
        assert_eq!(stall.writes, WriteLatency::default());
        let text = to_text(std::slice::from_ref(stall));
        assert!(text.contains("400.0"), "{text}");
        assert!(text.contains("0 (0/0/0)"), "{text}");
    }

    #[test]
    fn no_success_after_the_gap_began_leaves_it_open_to_the_record_s_end() {
        let ops = vec![
            op(1, 1, put(), 0, Some(10), ok()),
            // Never completed: unknown, and the record ends at 900 (its
            // invocation) unless something later.
            op(2, 2, put(), 150, None, Outcome::Unknown { detail: None }),
            op(3, 3, Op::Get { key: "k".into() }, 160, Some(900), read()),
        ];
        let faults = vec![window(1, FaultKind::Partition, "split", 100, None)];
        let stall = &of(&record(ops, faults))[0];
        assert!(stall.window_open);
        assert_eq!(stall.end_ns, 900 * MS);
        assert_eq!(
            stall.longest_gap,
            Gap {
                from_ns: 100 * MS,
                to_ns: 900 * MS,
                open: true
            }
        );
        assert_eq!(stall.writes.invoked, 1);
        assert_eq!(stall.writes.unknown, 1);
        assert_eq!(stall.writes.p99_ns, None);
        let text = to_text(std::slice::from_ref(stall));
        assert!(text.contains("800.0+"), "{text}");
    }

    #[test]
    fn overlapping_completions_of_many_clients_make_short_gaps() {
        // Eight clients whose writes overlap (each takes 9 ms), completing
        // 1 ms apart from 100 ms on, but two at 114 ms and none at 115.
        let mut ops = Vec::new();
        for i in 0..40u64 {
            let done = 100 + i - u64::from(i == 15);
            ops.push(op(i + 1, i % 8, put(), done - 9, Some(done), ok()));
        }
        let faults = vec![
            window(1, FaultKind::Delay, "", 110, Some(130)),
            // Overlapping windows are measured each on its own.
            window(2, FaultKind::Reset, "", 120, Some(125)),
        ];
        let stalls = of(&record(ops, faults));
        assert_eq!(stalls.len(), 2);
        assert_eq!(
            stalls[0].longest_gap,
            Gap {
                from_ns: 114 * MS,
                to_ns: 116 * MS,
                open: false
            }
        );
        assert_eq!(stalls[1].longest_gap.len_ns(), MS);
        for stall in &stalls {
            assert_eq!(stall.writes.p50_ns, Some(9 * MS));
            assert_eq!(stall.writes.max_ns, Some(9 * MS));
        }
        // Invoked in [110, 130): those completing from 119 to 138 ms;
        // in [120, 125): from 129 to 133 ms.
        assert_eq!(stalls[0].writes.invoked, 20);
        assert_eq!(stalls[1].writes.invoked, 5);
    }

    #[test]
    fn percentiles_are_by_nearest_rank() {
        let sorted: Vec<u64> = (1..=200).collect();
        assert_eq!(percentile(&sorted, 50), 100);
        assert_eq!(percentile(&sorted, 99), 198);
        assert_eq!(percentile(&[7], 50), 7);
        assert_eq!(percentile(&[3, 9], 50), 3);
        assert_eq!(percentile(&[3, 9], 99), 9);
    }

    #[test]
    fn reads_and_read_only_transactions_are_not_writes() {
        let read = TxnOp::Get { key: "a".into() };
        let write = TxnOp::Put {
            key: "a".into(),
            value: "1".into(),
        };
        let txn = |success: Vec<TxnOp>, failure: Vec<TxnOp>| {
            Op::Txn(Txn {
                compares: Vec::new(),
                success,
                failure,
            })
        };
        assert!(!is_write(&Op::Get { key: "a".into() }));
        assert!(!is_write(&txn(vec![read.clone()], vec![read.clone()])));
        assert!(is_write(&txn(vec![read.clone()], vec![write.clone()])));
        assert!(is_write(&txn(vec![write], Vec::new())));
        assert!(is_write(&Op::Incr {
            key: "c".into(),
            by: 1
        }));
        assert!(is_write(&Op::LeaseRevoke { name: "l".into() }));
    }

    #[test]
    fn membership_steps_are_named_from_their_details_and_marks_left_out() {
        let details = [
            (
                FaultKind::LeaderTransfer,
                "transfer: leadership from node 1 to node 2 (MoveLeader)",
                "transfer",
            ),
            (
                FaultKind::Other,
                "add-learner: a learner added at 127.0.0.1:1 (MemberAdd), started, catching up \
                 from the leader's log",
                "add-learner: add learner",
            ),
            (
                FaultKind::Other,
                "grow-shrink: learner 9 caught up (holding no snapshot), promoted to voter \
                 (MemberPromote)",
                "grow-shrink: promote",
            ),
            (
                FaultKind::Other,
                "remove-follower: follower 3 removed (MemberRemove), cut off from [1, 2] first \
                 so it misses its removal",
                "remove-follower: remove follower",
            ),
            (
                FaultKind::Other,
                "remove-leader: leader 1 removed (MemberRemove), another elected",
                "remove-leader: remove leader",
            ),
            (
                FaultKind::Other,
                "replace: node 2 stopped (SIGKILL), its data wiped, removed (MemberRemove)",
                "replace: stop, wipe, remove",
            ),
            (
                FaultKind::Other,
                "remove-leader: removed node 1 still runs: watched for 8 election timeouts (no \
                 member may follow it, it may not lead), then stopped",
                "remove-leader: watch removed",
            ),
            (
                FaultKind::Restart,
                "rolling-restart: node 3 stopped (SIGTERM), started again on its data, caught up",
                "rolling-restart: restart member",
            ),
            (FaultKind::Partition, "link of node 4 down", "partition"),
        ];
        let mut faults = Vec::new();
        for (id, (kind, detail, _)) in (1..).zip(details) {
            faults.push(window(id, kind, detail, id * 100, Some(id * 100 + 50)));
        }
        // A mark: started and ended within the same microseconds.
        let mut mark = window(
            99,
            FaultKind::Other,
            "remove-leader: watched 30 times",
            2000,
            None,
        );
        mark.end_ns = Some(mark.start_ns + 3_000);
        faults.push(mark);
        let ops = vec![op(1, 1, put(), 0, Some(5), ok())];
        let stalls = of(&record(ops, faults));
        for (stall, (_, _, label)) in stalls.iter().zip(details) {
            assert_eq!(stall.label(), label);
            assert!(!stall.mark);
        }
        let mark = stalls.last().expect("the mark");
        assert!(mark.mark);
        assert_eq!(mark.label(), "remove-leader");
        let text = to_text(&stalls);
        assert_eq!(text.lines().count(), 1 + 1 + details.len() + 1, "{text}");
        assert!(text.contains("1 mark(s)"), "{text}");
        let html = to_html(&stalls);
        assert_eq!(html.matches("<tr>").count(), 1 + details.len(), "{html}");
        assert!(html.contains("title=\"link of node 4 down\""), "{html}");
    }

    #[test]
    fn the_section_goes_under_the_timeline_and_nothing_without_windows() {
        let page = "<body><h2>Timeline</h2><svg/><h2>Checkers</h2></body>";
        assert_eq!(
            with_html_section(page, "<h2>Write stalls</h2>"),
            "<body><h2>Timeline</h2><svg/><h2>Write stalls</h2><h2>Checkers</h2></body>"
        );
        assert_eq!(with_html_section("<body></body>", "S"), "<body>S</body>");
        assert_eq!(to_text(&[]), "");
        assert_eq!(to_html(&[]), "");
        // The record's own events fold with no window at all.
        let events = vec![
            Event::Invoke(Invocation {
                at_ns: 0,
                client: 1,
                op_id: 1,
                request: RequestIdentity::plain(),
                op: put(),
            }),
            Event::FaultStarted(FaultStart {
                at_ns: 1,
                fault_id: 1,
                kind: FaultKind::Kill,
                target: None,
                detail: None,
            }),
            Event::FaultEnded(FaultEnd {
                at_ns: 2,
                fault_id: 1,
            }),
        ];
        let stalls = of(&Record::from_events(events).expect("fold"));
        assert!(stalls[0].mark);
        assert_eq!(to_text(&stalls), "");
    }
}
