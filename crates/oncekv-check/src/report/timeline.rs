//! The inline SVG timeline of a fault run's HTML report: one row per
//! client with each operation a bar from invocation to completion coloured
//! by outcome, fault windows in lanes of their own and shaded over the
//! rows, and marks for dropped replies, replays, session expiries and
//! leader changes, each with a tooltip. [`Layout`] places everything
//! first; [`Timeline`] then draws one layer per method.

use super::{HtmlOptions, esc, fmt_ns};
use crate::record::{Answer, ClientId, FaultKind, FaultWindow, OpRecord, OutcomeClass, Record};
use std::collections::BTreeMap;
use std::fmt::Write as _;

const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const LANE: f64 = 12.0;
const ROW_GAP: f64 = 6.0;
const FAULT_LANE: f64 = 16.0;
const AXIS: f64 = 24.0;
const LEGEND: f64 = 26.0;
const PENDING_PX: f64 = 6.0;

pub(super) fn outcome_colour(class: OutcomeClass) -> &'static str {
    match class {
        OutcomeClass::Ok => "#2e8b57",
        OutcomeClass::Rejected => "#5b8fd6",
        OutcomeClass::Failed => "#e07b24",
        OutcomeClass::Unknown => "#9b59b6",
    }
}

fn fault_colour(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::Kill => "#c0392b",
        FaultKind::Pause => "#d4a017",
        FaultKind::Restart => "#16a085",
        FaultKind::Partition => "#8e44ad",
        FaultKind::DropReplies => "#e67e22",
        FaultKind::Delay => "#7f8c8d",
        FaultKind::LeaderTransfer => "#2980b9",
        FaultKind::Reset => "#34495e",
        FaultKind::FsyncFailure => "#6d214f",
        FaultKind::MessageLoss => "#27ae60",
        FaultKind::Flood => "#b33771",
        FaultKind::Other => "#95a5a6",
    }
}

/// Picks a tick step of 1, 2 or 5 times a power of ten giving about
/// `target` ticks over `span`.
pub(super) fn tick_step(span: u64, target: u64) -> u64 {
    let raw = (span / target.max(1)).max(1);
    let mut power = 1u64;
    while power.saturating_mul(10) <= raw {
        power = power.saturating_mul(10);
    }
    for factor in [1, 2, 5] {
        if power.saturating_mul(factor) >= raw {
            return power.saturating_mul(factor);
        }
    }
    power.saturating_mul(10)
}

fn op_tooltip(op: &OpRecord) -> String {
    let outcome = match &op.outcome {
        crate::record::Outcome::Ok { reply, .. } => format!("ok: {reply}"),
        crate::record::Outcome::Failed { reason, detail } => match detail {
            Some(detail) => format!("failed ({reason}): {detail}"),
            None => format!("failed ({reason})"),
        },
        crate::record::Outcome::Unknown { detail } => match detail {
            Some(detail) => format!("unknown: {detail}"),
            None => "unknown".to_owned(),
        },
    };
    let completed = op.complete_ns.map_or_else(|| "never".to_owned(), fmt_ns);
    format!(
        "op #{} client {}: {}\n{}\n{}, {} attempt(s)\ninvoked {}, completed {}",
        op.id,
        op.client,
        op.op,
        outcome,
        op.request,
        op.attempts,
        fmt_ns(op.invoke_ns),
        completed
    )
}

/// Where everything goes: the time scale, each operation's lane in its
/// client's row, each fault's lane, and each row's top and height.
struct Layout<'a> {
    end: u64,
    plot: f64,
    /// The operations drawn (at most `max_ops`), with their lanes.
    placed: Vec<(&'a OpRecord, usize)>,
    /// The faults, with their lanes.
    faults: Vec<(&'a FaultWindow, usize)>,
    /// Each client row's top and height.
    rows: BTreeMap<ClientId, (f64, f64)>,
    rows_top: f64,
    rows_bottom: f64,
}

impl<'a> Layout<'a> {
    fn new(record: &'a Record, options: &HtmlOptions) -> Layout<'a> {
        let end = record.end_ns().max(1);
        let plot = f64::from(options.width_px.max(100));
        let pending_ns = ((PENDING_PX / plot) * end as f64) as u64;
        let (placed, mut clients) = place_operations(record, options, pending_ns);
        for marker_client in record
            .expiries
            .iter()
            .map(|e| e.client)
            .chain(record.responses.iter().map(|r| r.client))
        {
            clients.entry(marker_client).or_insert(1);
        }
        let (faults, fault_lanes) = place_faults(record, end);
        let rows_top = LEGEND + fault_lanes as f64 * FAULT_LANE + 8.0;
        let mut rows = BTreeMap::new();
        let mut y = rows_top;
        for (&client, &lanes) in &clients {
            let height = lanes.max(1) as f64 * LANE;
            rows.insert(client, (y, height));
            y += height + ROW_GAP;
        }
        Layout {
            end,
            plot,
            placed,
            faults,
            rows,
            rows_top,
            rows_bottom: y,
        }
    }

    /// The x coordinate of a time.
    fn x(&self, ns: u64) -> f64 {
        LEFT + (ns.min(self.end) as f64 / self.end as f64) * self.plot
    }
}

/// Each drawn operation's lane within its client's row (greedy: the first
/// lane free at its invocation, at most `max_lanes`), and how many lanes
/// each client uses. A pending operation holds its lane only for its short
/// block.
fn place_operations<'a>(
    record: &'a Record,
    options: &HtmlOptions,
    pending_ns: u64,
) -> (Vec<(&'a OpRecord, usize)>, BTreeMap<ClientId, usize>) {
    let max_lanes = options.max_lanes.max(1);
    let mut busy: BTreeMap<ClientId, Vec<u64>> = BTreeMap::new();
    let mut placed = Vec::new();
    for op in record.ops.iter().take(options.max_ops) {
        let lanes = busy.entry(op.client).or_default();
        let finish = op
            .complete_ns
            .unwrap_or_else(|| op.invoke_ns.saturating_add(pending_ns))
            .max(op.invoke_ns);
        let lane = match lanes
            .iter()
            .position(|&busy_until| busy_until < op.invoke_ns)
        {
            Some(free) => free,
            None if lanes.len() < max_lanes => {
                lanes.push(0);
                lanes.len() - 1
            }
            None => lanes.len() - 1,
        };
        if let Some(slot) = lanes.get_mut(lane) {
            *slot = (*slot).max(finish);
        }
        placed.push((op, lane));
    }
    let counts = busy
        .into_iter()
        .map(|(c, lanes)| (c, lanes.len()))
        .collect();
    (placed, counts)
}

/// Each fault's lane (greedy interval colouring) and the number of lanes.
fn place_faults(record: &Record, end: u64) -> (Vec<(&FaultWindow, usize)>, usize) {
    let mut lanes: Vec<u64> = Vec::new();
    let mut placed = Vec::with_capacity(record.faults.len());
    for fault in &record.faults {
        let finish = fault.end_ns.unwrap_or(end);
        let lane = match lanes.iter().position(|&busy| busy < fault.start_ns) {
            Some(free) => free,
            None => {
                lanes.push(0);
                lanes.len() - 1
            }
        };
        if let Some(slot) = lanes.get_mut(lane) {
            *slot = finish;
        }
        placed.push((fault, lane));
    }
    (placed, lanes.len())
}

/// The SVG being drawn over a layout.
struct Timeline<'a> {
    record: &'a Record,
    layout: Layout<'a>,
    svg: String,
}

/// The SVG timeline of `record` (followed by a note when not every
/// operation is drawn).
pub(super) fn timeline_svg(record: &Record, options: &HtmlOptions) -> String {
    let layout = Layout::new(record, options);
    let drawn = layout.placed.len();
    let mut timeline = Timeline {
        record,
        layout,
        svg: String::new(),
    };
    timeline.open();
    timeline.legend();
    timeline.client_rows();
    timeline.fault_windows();
    timeline.operations();
    timeline.attempt_markers();
    timeline.expiries();
    timeline.leader_changes();
    timeline.axis();
    let mut svg = timeline.svg;
    svg.push_str("</svg>\n");
    if record.ops.len() > drawn {
        let _ = writeln!(
            svg,
            "<p class=\"meta\">Showing the first {} of {} operations.</p>",
            drawn,
            record.ops.len()
        );
    }
    svg
}

impl Timeline<'_> {
    fn open(&mut self) {
        let height = self.layout.rows_bottom + AXIS;
        let width = LEFT + self.layout.plot + RIGHT;
        let _ = writeln!(
            self.svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" role=\"img\" aria-label=\"timeline\">"
        );
    }

    fn legend(&mut self) {
        let svg = &mut self.svg;
        let mut lx = LEFT;
        for class in OutcomeClass::ALL {
            let _ = writeln!(
                svg,
                "<rect x=\"{lx:.1}\" y=\"6\" width=\"12\" height=\"10\" fill=\"{}\"/><text x=\"{:.1}\" y=\"15\">{class}</text>",
                outcome_colour(class),
                lx + 16.0
            );
            lx += 90.0;
        }
        let _ = writeln!(
            svg,
            "<line x1=\"{lx:.1}\" y1=\"4\" x2=\"{lx:.1}\" y2=\"18\" stroke=\"#1f4e9c\" stroke-dasharray=\"3,2\"/><text x=\"{:.1}\" y=\"15\">leader change</text>",
            lx + 5.0
        );
        lx += 105.0;
        let _ = writeln!(
            svg,
            "<path d=\"M{:.1},6 l4,8 l-8,0 z\" fill=\"#c0392b\"/><text x=\"{:.1}\" y=\"15\">reply dropped after commit</text>",
            lx + 4.0,
            lx + 12.0
        );
        lx += 185.0;
        let _ = writeln!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"11\" r=\"3.5\" fill=\"#1f4e9c\"/><text x=\"{:.1}\" y=\"15\">replayed</text>",
            lx + 4.0,
            lx + 12.0
        );
        lx += 80.0;
        let _ = writeln!(
            svg,
            "<text x=\"{lx:.1}\" y=\"15\" font-weight=\"bold\">&#x2715;</text><text x=\"{:.1}\" y=\"15\">session expired</text>",
            lx + 12.0
        );
    }

    fn client_rows(&mut self) {
        let (svg, plot) = (&mut self.svg, self.layout.plot);
        for (&client, &(top, h)) in &self.layout.rows {
            let _ = writeln!(
                svg,
                "<rect x=\"{LEFT:.1}\" y=\"{top:.1}\" width=\"{plot:.1}\" height=\"{h:.1}\" fill=\"#f4f4f4\"/><text x=\"6\" y=\"{:.1}\">client {client}</text>",
                top + h / 2.0 + 4.0
            );
        }
    }

    fn fault_windows(&mut self) {
        let layout = &self.layout;
        let (svg, end) = (&mut self.svg, layout.end);
        let (faults_top, rows_top, rows_bottom) = (LEGEND, layout.rows_top, layout.rows_bottom);
        let x = |ns| layout.x(ns);
        for &(fault, lane) in &layout.faults {
            let x0 = x(fault.start_ns);
            let x1 = x(fault.end_ns.unwrap_or(end)).max(x0 + 1.0);
            let colour = fault_colour(fault.kind);
            let target = fault
                .target
                .map_or_else(String::new, |node| format!(" n{node}"));
            let label = format!("{}{target}", fault.kind);
            let mut tip = format!(
                "fault #{}: {label}\n{} to {}",
                fault.id,
                fmt_ns(fault.start_ns),
                fault.end_ns.map_or_else(|| "end of run".to_owned(), fmt_ns)
            );
            if let Some(detail) = &fault.detail {
                tip.push('\n');
                tip.push_str(detail);
            }
            let fy = faults_top + lane as f64 * FAULT_LANE;
            let _ = writeln!(
                svg,
                "<g class=\"fault\"><title>{}</title><rect x=\"{x0:.1}\" y=\"{rows_top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\" fill-opacity=\"0.13\"/><rect x=\"{x0:.1}\" y=\"{fy:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\" fill-opacity=\"0.45\" stroke=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#111\">{}</text></g>",
                esc(&tip),
                x1 - x0,
                rows_bottom - rows_top,
                x1 - x0,
                FAULT_LANE - 3.0,
                x0 + 3.0,
                fy + FAULT_LANE - 6.0,
                esc(&label)
            );
        }
    }

    fn operations(&mut self) {
        let layout = &self.layout;
        let (svg, end) = (&mut self.svg, layout.end);
        let x = |ns| layout.x(ns);
        for &(op, lane) in &layout.placed {
            let Some(&(top, _)) = layout.rows.get(&op.client) else {
                continue;
            };
            let x0 = x(op.invoke_ns);
            let class = op.outcome.class();
            let colour = outcome_colour(class);
            let y0 = top + lane as f64 * LANE + 1.0;
            let tip = esc(&op_tooltip(op));
            match op.complete_ns {
                Some(finish) => {
                    let x1 = x(finish).max(x0 + 1.0);
                    let _ = writeln!(
                        svg,
                        "<rect class=\"op {class}\" x=\"{x0:.1}\" y=\"{y0:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\"><title>{tip}</title></rect>",
                        x1 - x0,
                        LANE - 2.0,
                    );
                }
                None => {
                    let mid = y0 + (LANE - 2.0) / 2.0;
                    let _ = writeln!(
                        svg,
                        "<g class=\"op {class} pending\"><title>{tip}</title><line x1=\"{x0:.1}\" y1=\"{mid:.1}\" x2=\"{:.1}\" y2=\"{mid:.1}\" stroke=\"{colour}\" stroke-width=\"1\" stroke-dasharray=\"2,3\"/><rect x=\"{x0:.1}\" y=\"{y0:.1}\" width=\"{PENDING_PX:.1}\" height=\"{:.1}\" fill=\"{colour}\"/></g>",
                        x(end),
                        LANE - 2.0,
                    );
                }
            }
        }
    }

    fn attempt_markers(&mut self) {
        let layout = &self.layout;
        let (svg, record) = (&mut self.svg, self.record);
        let x = |ns| layout.x(ns);
        for response in &record.responses {
            let Some(&(top, _)) = layout.rows.get(&response.client) else {
                continue;
            };
            let cx = x(response.at_ns);
            let op = response
                .op_id
                .map_or_else(String::new, |id| format!("op #{id} "));
            if response.dropped_after_commit {
                let _ = writeln!(
                    svg,
                    "<path class=\"dropped\" d=\"M{cx:.1},{:.1} l4,8 l-8,0 z\" fill=\"#c0392b\"><title>{}</title></path>",
                    top,
                    esc(&format!(
                        "{op}attempt {} ({}): reply dropped after commit at {}",
                        response.attempt,
                        response.request,
                        fmt_ns(response.at_ns)
                    ))
                );
            }
            if matches!(response.answer, Answer::Replayed { .. }) {
                let _ = writeln!(
                    svg,
                    "<circle class=\"replayed\" cx=\"{cx:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"#1f4e9c\"><title>{}</title></circle>",
                    top + LANE / 2.0,
                    esc(&format!(
                        "{op}attempt {} ({}): answered Replayed at {}",
                        response.attempt,
                        response.request,
                        fmt_ns(response.at_ns)
                    ))
                );
            }
        }
    }

    fn expiries(&mut self) {
        let layout = &self.layout;
        let (svg, record) = (&mut self.svg, self.record);
        let x = |ns| layout.x(ns);
        for expiry in &record.expiries {
            let Some(&(top, h)) = layout.rows.get(&expiry.client) else {
                continue;
            };
            let ex = x(expiry.at_ns);
            let _ = writeln!(
                svg,
                "<g class=\"expiry\"><title>{}</title><line x1=\"{ex:.1}\" y1=\"{top:.1}\" x2=\"{ex:.1}\" y2=\"{:.1}\" stroke=\"#000\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\" font-weight=\"bold\" font-size=\"13\" fill=\"#000\">&#x2715;</text></g>",
                esc(&format!(
                    "client {}: session {} reported expired at {}",
                    expiry.client,
                    expiry.session,
                    fmt_ns(expiry.at_ns)
                )),
                top + h,
                ex + 3.0,
                top + h / 2.0 + 4.0,
            );
        }
    }

    fn leader_changes(&mut self) {
        let layout = &self.layout;
        let (svg, record) = (&mut self.svg, self.record);
        let (rows_top, rows_bottom) = (layout.rows_top, layout.rows_bottom);
        let x = |ns| layout.x(ns);
        for change in &record.leader_changes {
            let lx = x(change.at_ns);
            let leader = change
                .leader
                .map_or_else(|| "none".to_owned(), |n| format!("n{n}"));
            let term = change
                .term
                .map_or_else(String::new, |t| format!(" (term {t})"));
            let _ = writeln!(
                svg,
                "<g class=\"leader\"><title>{}</title><line x1=\"{lx:.1}\" y1=\"{:.1}\" x2=\"{lx:.1}\" y2=\"{rows_bottom:.1}\" stroke=\"#1f4e9c\" stroke-width=\"1.2\" stroke-dasharray=\"3,2\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#1f4e9c\">{}</text></g>",
                esc(&format!(
                    "leader {leader}{term} observed at {}",
                    fmt_ns(change.at_ns)
                )),
                rows_top - 6.0,
                lx + 2.0,
                rows_top - 1.0,
                esc(&leader)
            );
        }
    }

    fn axis(&mut self) {
        let layout = &self.layout;
        let (svg, end, plot, rows_bottom) =
            (&mut self.svg, layout.end, layout.plot, layout.rows_bottom);
        let x = |ns| layout.x(ns);
        let step = tick_step(end, 10);
        let _ = writeln!(
            svg,
            "<line x1=\"{LEFT:.1}\" y1=\"{rows_bottom:.1}\" x2=\"{:.1}\" y2=\"{rows_bottom:.1}\" stroke=\"#888\"/>",
            LEFT + plot
        );
        let mut tick = 0u64;
        while tick <= end {
            let tx = x(tick);
            let _ = writeln!(
                svg,
                "<line x1=\"{tx:.1}\" y1=\"{rows_bottom:.1}\" x2=\"{tx:.1}\" y2=\"{:.1}\" stroke=\"#888\"/><text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                rows_bottom + 4.0,
                rows_bottom + 16.0,
                esc(&fmt_ns(tick))
            );
            match tick.checked_add(step) {
                Some(next) => tick = next,
                None => break,
            }
        }
    }
}
