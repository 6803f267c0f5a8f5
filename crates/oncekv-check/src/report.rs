//! The report of a fault run: a summary table for the terminal and a
//! self-contained HTML page with a timeline.
//!
//! A [`Report`] gathers what a person needs to judge a run: operations by
//! kind and outcome, faults injected by kind, retries, replays, each
//! checker's verdict with its explanation, the coverage counts against
//! their requirements, the overall verdict and the seed that reproduces
//! the run. [`Report::to_text`] renders it as plain-text tables;
//! [`Report::to_html`] as one HTML file with inline CSS and an inline SVG
//! timeline (one row per client, each operation a bar from invocation to
//! completion coloured by outcome, fault windows shaded, leader changes,
//! dropped replies, replays and session expiries marked, every mark with a
//! tooltip), which opens in a browser with no network and no script.

use crate::checkers::{CheckerSummary, Status};
use crate::coverage::{Assessment, Coverage, CoverageRequirements, RunVerdict, assess};
use crate::record::{FaultKind, NodeId, OutcomeClass, Record};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

mod timeline;

use timeline::timeline_svg;

/// The summary of one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The seed that reproduces the run, if recorded.
    pub seed: Option<u64>,
    /// The run's description, if recorded.
    pub description: String,
    /// The cluster's nodes, if recorded.
    pub nodes: Vec<NodeId>,
    /// The latest time stamp in the record.
    pub duration_ns: u64,
    /// Distinct clients.
    pub clients: usize,
    /// Operations by kind, then by outcome.
    pub operations: BTreeMap<String, BTreeMap<OutcomeClass, u64>>,
    /// What the run exercised.
    pub coverage: Coverage,
    /// What it had to exercise.
    pub requirements: CoverageRequirements,
    /// Each checker's verdict.
    pub checks: Vec<CheckerSummary>,
    /// The overall verdict.
    pub assessment: Assessment,
}

/// How the HTML timeline is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HtmlOptions {
    /// Width of the plotting area in pixels.
    pub width_px: u32,
    /// Most operations drawn (the earliest invoked); the rest are counted.
    pub max_ops: usize,
    /// Most bar lanes per client (pipelined operations overlap beyond).
    pub max_lanes: usize,
}

impl Default for HtmlOptions {
    /// 1200 pixels, 20 000 operations, 4 lanes.
    fn default() -> Self {
        Self {
            width_px: 1200,
            max_ops: 20_000,
            max_lanes: 4,
        }
    }
}

impl Report {
    /// Summarises `record` with the checkers' verdicts, counting coverage
    /// against `requirements` for the overall verdict.
    pub fn new(
        record: &Record,
        checks: Vec<CheckerSummary>,
        requirements: &CoverageRequirements,
    ) -> Self {
        let coverage = Coverage::of(record);
        let assessment = assess(&checks, &coverage, requirements);
        let mut operations: BTreeMap<String, BTreeMap<OutcomeClass, u64>> = BTreeMap::new();
        for op in &record.ops {
            *operations
                .entry(op.op.name().to_owned())
                .or_default()
                .entry(op.outcome.class())
                .or_default() += 1;
        }
        let clients = record
            .ops
            .iter()
            .map(|op| op.client)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        Self {
            seed: record.seed(),
            description: record
                .run
                .as_ref()
                .map(|run| run.description.clone())
                .unwrap_or_default(),
            nodes: record
                .run
                .as_ref()
                .map(|run| run.nodes.clone())
                .unwrap_or_default(),
            duration_ns: record.end_ns(),
            clients,
            operations,
            coverage,
            requirements: requirements.clone(),
            checks,
            assessment,
        }
    }

    /// The overall verdict.
    pub fn verdict(&self) -> RunVerdict {
        self.assessment.verdict
    }

    fn seed_text(&self) -> String {
        self.seed
            .map_or_else(|| "not recorded".to_owned(), |seed| seed.to_string())
    }

    fn coverage_rows(&self) -> Vec<(String, u64, u64)> {
        let c = &self.coverage;
        let r = &self.requirements;
        let mut rows = vec![
            (
                "acknowledged operations".to_owned(),
                c.outcome(OutcomeClass::Ok),
                r.min_acknowledged,
            ),
            (
                "replies dropped after commit".to_owned(),
                c.replies_dropped_after_commit,
                r.min_replies_dropped_after_commit,
            ),
            (
                "attempts in a batch".to_owned(),
                c.batched_attempts,
                r.min_batched_attempts,
            ),
            (
                "batch replies dropped after commit".to_owned(),
                c.batch_replies_dropped_after_commit,
                r.min_batch_replies_dropped_after_commit,
            ),
            (
                "retries answered Replayed".to_owned(),
                c.replayed,
                r.min_replayed,
            ),
            (
                "leader changes".to_owned(),
                c.leader_changes,
                r.min_leader_changes,
            ),
            (
                "session expiries".to_owned(),
                c.session_expiries,
                r.min_session_expiries,
            ),
        ];
        let mut kinds: Vec<FaultKind> = c.faults.keys().copied().collect();
        kinds.extend(r.min_faults.keys().copied());
        kinds.sort();
        kinds.dedup();
        for kind in kinds {
            rows.push((
                format!("{kind} faults"),
                c.faults_of(kind),
                r.min_faults.get(&kind).copied().unwrap_or(0),
            ));
        }
        rows
    }

    /// Plain-text tables for a terminal.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let nodes = if self.nodes.is_empty() {
            String::new()
        } else {
            format!(", {} nodes", self.nodes.len())
        };
        let _ = writeln!(
            out,
            "oncekv fault run: seed {}{nodes}, {} clients, {}",
            self.seed_text(),
            self.clients,
            fmt_ns(self.duration_ns)
        );
        if !self.description.is_empty() {
            let _ = writeln!(out, "{}", self.description);
        }

        out.push('\n');
        let mut table = Table::new(&["operation", "ok", "rejected", "failed", "unknown", "total"]);
        let mut totals = [0u64; 5];
        for (kind, by) in &self.operations {
            let counts: Vec<u64> = OutcomeClass::ALL
                .iter()
                .map(|class| by.get(class).copied().unwrap_or(0))
                .collect();
            let total: u64 = counts.iter().sum();
            for (slot, n) in totals.iter_mut().zip(counts.iter().chain([&total])) {
                *slot += n;
            }
            let mut row = vec![kind.clone()];
            row.extend(counts.iter().chain([&total]).map(ToString::to_string));
            table.row(row);
        }
        let mut row = vec!["all".to_owned()];
        row.extend(totals.iter().map(ToString::to_string));
        table.row(row);
        out.push_str(&table.render());

        out.push('\n');
        let c = &self.coverage;
        let _ = writeln!(
            out,
            "retries: {} operation(s) retried, {} extra send(s); replays observed: {}; replies dropped after commit: {}",
            c.retried_operations, c.retries, c.replayed, c.replies_dropped_after_commit
        );
        let _ = writeln!(
            out,
            "leader changes: {}; session expiries: {}",
            c.leader_changes, c.session_expiries
        );
        if c.faults.is_empty() {
            let _ = writeln!(out, "faults injected: none");
        } else {
            let faults: Vec<String> = c
                .faults
                .iter()
                .map(|(kind, n)| format!("{kind} {n}"))
                .collect();
            let _ = writeln!(out, "faults injected: {}", faults.join(", "));
        }

        out.push('\n');
        let mut table = Table::new(&["checker", "status", "summary"]);
        for check in &self.checks {
            table.row(vec![
                check.checker.clone(),
                check.status.name().to_owned(),
                check.headline.clone(),
            ]);
        }
        out.push_str(&table.render());
        for check in self.checks.iter().filter(|c| !c.details.is_empty()) {
            let _ = writeln!(out, "{}:", check.checker);
            for line in &check.details {
                let _ = writeln!(out, "  {line}");
            }
        }

        out.push('\n');
        let mut table = Table::new(&["coverage", "observed", "required", ""]);
        for (what, observed, required) in self.coverage_rows() {
            let mark = if observed < required { "SHORT" } else { "ok" };
            table.row(vec![
                what,
                observed.to_string(),
                required.to_string(),
                mark.to_owned(),
            ]);
        }
        out.push_str(&table.render());

        out.push('\n');
        let _ = writeln!(
            out,
            "VERDICT: {} (seed {})",
            self.verdict(),
            self.seed_text()
        );
        for reason in &self.assessment.reasons {
            let _ = writeln!(out, "  {reason}");
        }
        out
    }

    /// A self-contained HTML page: the tables and the timeline of
    /// `record` (the record this report was made from).
    pub fn to_html(&self, record: &Record, options: &HtmlOptions) -> String {
        let mut out = String::new();
        let verdict_class = match self.verdict() {
            RunVerdict::Pass => "pass",
            RunVerdict::Fail => "fail",
            RunVerdict::Inconclusive => "inconclusive",
        };
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>oncekv fault run, seed {seed}: {verdict}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
            seed = esc(&self.seed_text()),
            verdict = self.verdict(),
        );
        let _ = writeln!(
            out,
            "<h1>oncekv fault run <span class=\"verdict {verdict_class}\">{}</span></h1>",
            self.verdict()
        );
        let _ = writeln!(
            out,
            "<p class=\"meta\">seed <b>{}</b> &middot; {} node(s) &middot; {} client(s) &middot; {}</p>",
            esc(&self.seed_text()),
            self.nodes.len(),
            self.clients,
            esc(&fmt_ns(self.duration_ns))
        );
        if !self.description.is_empty() {
            let _ = writeln!(out, "<p>{}</p>", esc(&self.description));
        }
        if !self.assessment.reasons.is_empty() {
            out.push_str("<ul class=\"reasons\">\n");
            for reason in &self.assessment.reasons {
                let _ = writeln!(out, "<li>{}</li>", esc(reason));
            }
            out.push_str("</ul>\n");
        }

        out.push_str("<h2>Timeline</h2>\n");
        out.push_str(&timeline_svg(record, options));

        out.push_str("<h2>Checkers</h2>\n<table class=\"checks\">\n<tr><th>checker</th><th>status</th><th>summary</th></tr>\n");
        for check in &self.checks {
            let class = match check.status {
                Status::Pass => "pass",
                Status::Fail => "fail",
                Status::Undecided => "inconclusive",
            };
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"{class}\">{}</td><td>{}",
                esc(&check.checker),
                esc(check.status.name()),
                esc(&check.headline)
            );
            if !check.details.is_empty() {
                let _ = write!(
                    out,
                    "<details><summary>{} detail line(s)</summary><pre>",
                    check.details.len()
                );
                for line in &check.details {
                    let _ = writeln!(out, "{}", esc(line));
                }
                out.push_str("</pre></details>");
            }
            out.push_str("</td></tr>\n");
        }
        out.push_str("</table>\n");

        out.push_str("<h2>Operations</h2>\n<table>\n<tr><th>operation</th>");
        for class in OutcomeClass::ALL {
            let _ = write!(out, "<th>{class}</th>");
        }
        out.push_str("<th>total</th></tr>\n");
        for (kind, by) in &self.operations {
            let _ = write!(out, "<tr><td>{}</td>", esc(kind));
            let mut total = 0;
            for class in OutcomeClass::ALL {
                let n = by.get(&class).copied().unwrap_or(0);
                total += n;
                let _ = write!(out, "<td class=\"num\">{n}</td>");
            }
            let _ = writeln!(out, "<td class=\"num\">{total}</td></tr>");
        }
        out.push_str("</table>\n");
        let c = &self.coverage;
        let _ = writeln!(
            out,
            "<p>{} operation(s) retried ({} extra send(s)), {} replay(s) observed, {} repl(ies) dropped after commit.</p>",
            c.retried_operations, c.retries, c.replayed, c.replies_dropped_after_commit
        );

        out.push_str("<h2>Coverage</h2>\n<table>\n<tr><th>path</th><th>observed</th><th>required</th></tr>\n");
        for (what, observed, required) in self.coverage_rows() {
            let class = if observed < required { "fail" } else { "pass" };
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"num {class}\">{observed}</td><td class=\"num\">{required}</td></tr>",
                esc(&what)
            );
        }
        out.push_str("</table>\n");
        let _ = writeln!(
            out,
            "<p class=\"meta\">Reproduce with seed {}.</p>\n</body>\n</html>",
            esc(&self.seed_text())
        );
        out
    }

    /// Writes [`Report::to_html`] to `path`.
    pub fn write_html(
        &self,
        record: &Record,
        options: &HtmlOptions,
        path: &Path,
    ) -> std::io::Result<()> {
        std::fs::write(path, self.to_html(record, options))
    }
}

const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.5em; }
.meta { color: #555; }
.verdict { padding: 0.1em 0.5em; border-radius: 0.3em; color: #fff; }
.verdict.pass { background: #2e8b57; } .verdict.fail { background: #c0392b; }
.verdict.inconclusive { background: #b8860b; }
td.pass { color: #2e8b57; font-weight: bold; } td.fail { color: #c0392b; font-weight: bold; }
td.inconclusive { color: #b8860b; font-weight: bold; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { margin: 0.3em 0; white-space: pre-wrap; font-size: 0.85em; }
ul.reasons { color: #7a4b00; }
svg { border: 1px solid #ddd; background: #fff; }
svg text { font-family: system-ui, sans-serif; font-size: 11px; fill: #333; }
";

/// Escapes text for HTML and SVG (also for the harness's own tables
/// beside the timeline).
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// A duration for people.
pub fn fmt_ns(ns: u64) -> String {
    let ns_f = ns as f64;
    if ns >= 1_000_000_000 {
        format!("{:.3} s", ns_f / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.3} ms", ns_f / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1} µs", ns_f / 1e3)
    } else {
        format!("{ns} ns")
    }
}

/// A plain-text table with columns padded to their widest cell.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| {
                self.rows
                    .iter()
                    .filter_map(|row| row.get(i))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for (index, row) in self.rows.iter().enumerate() {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                let width = widths.get(i).copied().unwrap_or(0);
                let last = i + 1 == row.len();
                if last {
                    line.push_str(cell);
                } else {
                    let pad = width.saturating_sub(cell.chars().count());
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
            if index == 0 {
                let rule: usize = widths.iter().sum::<usize>() + 2 * columns.saturating_sub(1);
                out.push_str(&"-".repeat(rule));
                out.push('\n');
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::timeline::tick_step;
    use super::*;
    use crate::checkers::CheckerSummary;
    use crate::record::{
        Answer, AttemptResponse, ExpiryReport, FaultWindow, LeaderChange, Op, OpRecord, Outcome,
        Reply, RequestIdentity, RunInfo,
    };

    pub(crate) fn sample_record() -> Record {
        let op = |id: u64, client: u64, times: (u64, Option<u64>), outcome: Outcome| OpRecord {
            id,
            client,
            op: Op::Append {
                key: "k".into(),
                token: format!("t{id}").into(),
            },
            request: RequestIdentity::session(client, id),
            invoke_ns: times.0,
            complete_ns: times.1,
            attempts: 2,
            outcome,
        };
        Record {
            run: Some(RunInfo {
                at_ns: 0,
                seed: 1234,
                nodes: vec![1, 2, 3],
                description: "appends <under> kill & partition".to_owned(),
            }),
            ops: vec![
                op(
                    1,
                    1,
                    (0, Some(40_000_000)),
                    Outcome::Ok {
                        reply: Reply::Append { length: 3 },
                        canonical: None,
                    },
                ),
                op(2, 2, (10_000_000, None), Outcome::Unknown { detail: None }),
                op(
                    3,
                    1,
                    (50_000_000, Some(60_000_000)),
                    Outcome::Failed {
                        reason: crate::record::FailReason::SessionExpired,
                        detail: None,
                    },
                ),
            ],
            responses: vec![AttemptResponse {
                at_ns: 20_000_000,
                client: 1,
                op_id: Some(1),
                request: RequestIdentity::session(1, 1),
                attempt: 2,
                node: Some(2),
                answer: Answer::Replayed {
                    reply: Reply::Append { length: 3 },
                    canonical: None,
                    applied_index: Some(4),
                },
                dropped_after_commit: true,
                batch: 1,
            }],
            expiries: vec![ExpiryReport {
                at_ns: 61_000_000,
                client: 1,
                session: 1,
            }],
            faults: vec![
                FaultWindow {
                    id: 1,
                    kind: FaultKind::Kill,
                    target: Some(1),
                    detail: Some("SIGKILL".to_owned()),
                    start_ns: 5_000_000,
                    end_ns: Some(30_000_000),
                },
                FaultWindow {
                    id: 2,
                    kind: FaultKind::Partition,
                    target: Some(3),
                    detail: None,
                    start_ns: 20_000_000,
                    end_ns: None,
                },
            ],
            leader_changes: vec![LeaderChange {
                at_ns: 25_000_000,
                leader: Some(2),
                term: Some(3),
                observer: Some(1),
            }],
            final_values: BTreeMap::new(),
            watches: BTreeMap::new(),
        }
    }

    fn checks() -> Vec<CheckerSummary> {
        vec![
            CheckerSummary {
                checker: "exactly_once".to_owned(),
                status: Status::Pass,
                headline: "fine".to_owned(),
                details: vec![],
            },
            CheckerSummary {
                checker: "counters".to_owned(),
                status: Status::Fail,
                headline: "1 violation".to_owned(),
                details: vec!["counter c <lost> one".to_owned()],
            },
        ]
    }

    #[test]
    fn text_report_has_the_tables_and_the_verdict() {
        let record = sample_record();
        let report = Report::new(&record, checks(), &CoverageRequirements::default());
        assert_eq!(report.verdict(), RunVerdict::Fail);
        let text = report.to_text();
        for needle in [
            "seed 1234",
            "operation  ok",
            "append",
            "kill 1, partition 1",
            "replays observed: 1",
            "exactly_once",
            "counter c <lost> one",
            "VERDICT: FAIL (seed 1234)",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        let line = |start: &str, rest: &str| {
            let rest: Vec<&str> = rest.split_whitespace().collect();
            text.lines().any(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                l.starts_with(start) && words.ends_with(&rest)
            })
        };
        assert!(line("counters", "FAIL 1 violation"), "{text}");
        assert!(line("replies dropped after commit", "1 1 ok"), "{text}");
        assert!(line("session expiries", "1 1 ok"), "{text}");
        assert!(line("leader changes", "0 1 SHORT"), "{text}");
    }

    #[test]
    fn html_report_is_self_contained_with_a_timeline() {
        let record = sample_record();
        let report = Report::new(&record, checks(), &CoverageRequirements::default());
        let html = report.to_html(&record, &HtmlOptions::default());
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.trim_end().ends_with("</html>"));
        for needle in [
            "<svg",
            "</svg>",
            "class=\"op ok\"",
            "class=\"op unknown pending\"",
            "class=\"op failed\"",
            "class=\"fault\"",
            "class=\"leader\"",
            "class=\"dropped\"",
            "class=\"replayed\"",
            "class=\"expiry\"",
            "client 1",
            "client 2",
            "kill n1",
            "partition n3",
            "appends &lt;under&gt; kill &amp; partition",
            "counter c &lt;lost&gt; one",
            "verdict fail",
        ] {
            assert!(html.contains(needle), "missing {needle:?}");
        }
        assert!(!html.contains("<under>"));
        // Nothing is fetched from anywhere.
        assert!(!html.contains("src="));
        assert!(!html.contains("href="));
        assert!(!html.contains("<script"));
        let opens = html.matches("<rect").count();
        assert!(opens >= 3 + 2 * 2 + 2, "{opens}");
    }

    #[test]
    fn html_bounds_the_operations_drawn() {
        let record = sample_record();
        let report = Report::new(&record, checks(), &CoverageRequirements::none());
        let options = HtmlOptions {
            max_ops: 1,
            ..HtmlOptions::default()
        };
        let html = report.to_html(&record, &options);
        assert_eq!(html.matches("class=\"op ").count(), 1);
        assert!(html.contains("Showing the first 1 of 3 operations."));
    }

    #[test]
    fn empty_records_render() {
        let record = Record::default();
        let report = Report::new(&record, Vec::new(), &CoverageRequirements::default());
        assert_eq!(report.verdict(), RunVerdict::Inconclusive);
        assert!(report.to_text().contains("seed not recorded"));
        assert!(
            report
                .to_html(&record, &HtmlOptions::default())
                .contains("</svg>")
        );
    }

    #[test]
    fn helpers() {
        assert_eq!(fmt_ns(500), "500 ns");
        assert_eq!(fmt_ns(1_500), "1.5 µs");
        assert_eq!(fmt_ns(2_000_000), "2.000 ms");
        assert_eq!(fmt_ns(3_250_000_000), "3.250 s");
        assert_eq!(tick_step(1000, 10), 100);
        assert_eq!(tick_step(1700, 10), 200);
        assert_eq!(tick_step(4000, 10), 500);
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
        let mut table = Table::new(&["a", "bb"]);
        table.row(vec!["ccc".to_owned(), "d".to_owned()]);
        assert_eq!(table.render(), "a    bb\n-------\nccc  d\n");
    }
}
