//! The simulated step as an SVG timeline picture.
//!
//! One row per device group (the `tp × cp` devices of one DP rank on one stage, which run
//! identical timelines), rows grouped by stage; neighbouring groups of one stage whose
//! timelines are identical fold into one row labelled with their range. Each row has a compute
//! lane (forward blue, backward orange, optimizer red, idle grey) and a thinner
//! communication lane below it (pipeline sends green, DP sync purple, CP K/V exchange teal).
//! Every bar carries a `<title>` tooltip (task, pack, tokens, times). Row height shrinks with
//! the number of rows (capped both ways) so that 256 devices still fit one screen; labels thin
//! out when rows get too small to hold them. A time axis with millisecond ticks runs along the
//! top, under a summary line, a legend, and the step's losses ("where the step goes", see
//! [`super::Losses`]) drawn as one stacked bar as wide as the step, with a legend of the
//! non-zero causes and their shares. The output is deterministic.

use std::fmt::Write;

use super::layout::GroupId;
use super::result::SimResult;
use super::task::{Stream, Task, TaskKind};

const WIDTH: f64 = 1600.0;
const LABEL_WIDTH: f64 = 200.0;
const RIGHT_MARGIN: f64 = 24.0;
const HEADER: f64 = 146.0;
const FOOTER: f64 = 16.0;
/// Height the rows share before the per-row caps apply.
const ROWS_HEIGHT: f64 = 770.0;
const MIN_ROW: f64 = 3.0;
const MAX_ROW: f64 = 34.0;
const STAGE_GAP: f64 = 6.0;

const FORWARD: &str = "#4c78a8";
const BACKWARD: &str = "#f58518";
const WEIGHT_GRAD: &str = "#eeca3b";
const OPTIMIZER: &str = "#e45756";
const PIPELINE: &str = "#54a24b";
const DP_SYNC: &str = "#b279a2";
const CP_EXCHANGE: &str = "#72b7b2";
const IDLE: &str = "#e4e4e4";

/// Colours of the losses, in the order of [`super::Losses::entries`]: useful compute,
/// recompute, below saturation, memory bound, launch overhead, exposed TP, CP, PP, pipeline
/// idle warm-up, steady, drain, DP imbalance wait, DP sync and optimizer, padding.
const LOSS_COLOURS: [&str; 14] = [
    "#2ca02c", "#ff7f0e", "#aec7e8", "#9467bd", "#7f7f7f", "#8c564b", "#17becf", "#54a24b",
    "#c7c7c7", "#a0a0a0", "#707070", "#d62728", "#e377c2", "#111111",
];
/// Top of the losses bar and of its legend's first line.
const LOSSES_BAR_Y: f64 = 66.0;
const LOSSES_LEGEND_Y: f64 = 84.0;

/// A row: consecutive groups of one stage with identical timelines.
struct Row {
    first: GroupId,
    last: GroupId,
}

/// The SVG picture of a simulated step.
pub fn timeline(result: &SimResult) -> String {
    let rows = fold_rows(result);
    let stages = result.layout.pp as f64;
    let row_height = ((ROWS_HEIGHT - STAGE_GAP * (stages - 1.0)) / rows.len().max(1) as f64)
        .clamp(MIN_ROW, MAX_ROW)
        .floor();
    let rows_bottom = HEADER + rows.len() as f64 * row_height + STAGE_GAP * (stages - 1.0);
    let height = rows_bottom + FOOTER;
    let step = result.metrics.step_time_s.max(1e-9);
    let scale = (WIDTH - LABEL_WIDTH - RIGHT_MARGIN) / step;
    let mut svg = String::with_capacity(256 * result.graph.tasks.len() + 4096);
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif">"#
    );
    svg.push_str(r#"<rect width="100%" height="100%" fill="white"/>"#);
    header(result, &mut svg);
    losses_bar(result, scale, &mut svg);
    axis(step, scale, rows_bottom, &mut svg);
    let mut row_of_group = vec![0usize; result.layout.groups()];
    let mut row_top = Vec::with_capacity(rows.len());
    let mut y = HEADER;
    for (index, row) in rows.iter().enumerate() {
        if index > 0
            && result.layout.stage_of(row.first) != result.layout.stage_of(rows[index - 1].first)
        {
            y += STAGE_GAP;
        }
        for group in row.first.0..=row.last.0 {
            row_of_group[group as usize] = index;
        }
        row_top.push(y);
        y += row_height;
    }
    rows_background(result, &rows, &row_top, row_height, scale, &mut svg);
    bars(
        result,
        &rows,
        &row_of_group,
        &row_top,
        row_height,
        scale,
        &mut svg,
    );
    labels(result, &rows, &row_top, row_height, &mut svg);
    svg.push_str("</svg>\n");
    svg
}

/// Folds neighbouring groups of a stage whose task lists have identical kinds and spans.
fn fold_rows(result: &SimResult) -> Vec<Row> {
    let layout = &result.layout;
    let mut signatures: Vec<Vec<(u8, u64, u64)>> = vec![Vec::new(); layout.groups()];
    for (task, span) in result.tasks() {
        let kind = kind_code(task.kind);
        for group in result.task_groups(task) {
            signatures[group.index()].push((kind, span.start_s.to_bits(), span.end_s.to_bits()));
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    for group in 0..layout.groups() as u32 {
        let group = GroupId(group);
        if let Some(row) = rows.last_mut() {
            let same_stage = layout.stage_of(row.last) == layout.stage_of(group);
            if same_stage && signatures[row.last.index()] == signatures[group.index()] {
                row.last = group;
                continue;
            }
        }
        rows.push(Row {
            first: group,
            last: group,
        });
    }
    rows
}

fn kind_code(kind: TaskKind) -> u8 {
    match kind {
        TaskKind::Forward => 0,
        TaskKind::Backward => 1,
        TaskKind::Send(_) => 2,
        TaskKind::GradReduceScatter => 3,
        TaskKind::Optimizer => 4,
        TaskKind::ParamAllGather => 5,
        TaskKind::WeightGrad => 6,
    }
}

fn header(result: &SimResult, svg: &mut String) {
    let m = &result.metrics;
    let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
    let oom = match m.oom_device {
        Some(device) => format!(" · OOM on device {device}"),
        None => String::new(),
    };
    let summary = format!(
        "step {:.1} ms · {:.0} tokens/s · MFU {:.1}% · efficiency {:.1}% (useful ideal {:.1} ms) · schedule efficiency {:.1}% (floor {:.1} ms)",
        m.step_time_s * 1e3,
        m.tokens_per_s,
        m.mfu * 100.0,
        m.efficiency * 100.0,
        m.useful_ideal_step_time_s * 1e3,
        m.schedule_efficiency * 100.0,
        m.floor_step_time_s * 1e3,
    );
    let details = format!(
        "executed efficiency {:.1}% (ideal {:.1} ms, recomputation and padding included) · bubbles {:.1}% · DP imbalance {:.2} · PP imbalance {:.2} · peak memory {:.1} of {:.0} GiB{oom}",
        m.executed_efficiency * 100.0,
        m.ideal_step_time_s * 1e3,
        m.bubble_fraction * 100.0,
        m.dp_imbalance,
        m.pp_imbalance,
        gib(m.peak_memory_bytes),
        gib(result.capacity_bytes),
    );
    let layout = &result.layout;
    let _ = write!(
        svg,
        r#"<text x="12" y="20" font-size="14" font-weight="bold">{}</text>"#,
        escape(&format!(
            "{} devices (tp={} cp={} pp={} dp={}) · {}",
            layout.devices(),
            layout.tp,
            layout.cp,
            layout.pp,
            layout.dp,
            summary
        ))
    );
    let _ = write!(
        svg,
        r#"<text x="12" y="36" font-size="12">{}</text>"#,
        escape(&details)
    );
    let legend = [
        (FORWARD, "forward"),
        (BACKWARD, "backward"),
        (WEIGHT_GRAD, "weight gradient"),
        (OPTIMIZER, "optimizer"),
        (IDLE, "idle"),
        (PIPELINE, "pipeline send/recv"),
        (DP_SYNC, "DP gradient sync / param gather"),
        (CP_EXCHANGE, "CP K/V exchange (overlapped)"),
    ];
    let mut x = 12.0;
    for (colour, name) in legend {
        let _ = write!(
            svg,
            r##"<rect x="{x}" y="46" width="14" height="12" fill="{colour}" stroke="#888" stroke-width="0.5"/><text x="{}" y="56" font-size="12">{name}</text>"##,
            x + 18.0
        );
        x += 26.0 + 7.0 * name.len() as f64;
    }
    let _ = write!(
        svg,
        r##"<text x="{}" y="56" font-size="11" fill="#555">upper lane: compute stream · lower lane: communication stream · hover a bar for details</text>"##,
        x + 12.0
    );
}

/// The losses as one stacked bar under the legend, as wide as the step on the time axis, and
/// a legend of the non-zero causes with their shares (wrapping to a second line).
fn losses_bar(result: &SimResult, scale: f64, svg: &mut String) {
    let m = &result.metrics;
    let step = m.step_time_s.max(1e-12);
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" font-size="12" font-weight="bold" text-anchor="end">where the step goes</text>"#,
        LABEL_WIDTH - 6.0,
        LOSSES_BAR_Y + 10.0
    );
    let mut x = LABEL_WIDTH;
    let mut legend_x = 12.0;
    let mut legend_y = LOSSES_LEGEND_Y;
    for ((what, seconds), colour) in m.losses.entries().into_iter().zip(LOSS_COLOURS) {
        if seconds <= 1e-9 * step {
            continue;
        }
        let share = 100.0 * seconds / step;
        let w = seconds * scale;
        let _ = write!(
            svg,
            r#"<rect x="{x:.2}" y="{LOSSES_BAR_Y}" width="{w:.2}" height="12" fill="{colour}"><title>{what}: {:.3} ms ({share:.1}% of the step)</title></rect>"#,
            seconds * 1e3
        );
        x += w;
        let text = format!("{what} {share:.1}%");
        let entry_width = 26.0 + 6.5 * text.len() as f64;
        if legend_x + entry_width > WIDTH - RIGHT_MARGIN {
            legend_x = 12.0;
            legend_y += 16.0;
        }
        let _ = write!(
            svg,
            r##"<rect x="{legend_x}" y="{legend_y}" width="12" height="10" fill="{colour}" stroke="#888" stroke-width="0.5"/><text x="{}" y="{}" font-size="11">{text}</text>"##,
            legend_x + 16.0,
            legend_y + 9.0
        );
        legend_x += entry_width;
    }
}

/// Ticks every 1, 2 or 5 × 10^k ms, about ten across the step.
fn axis(step_s: f64, scale: f64, bottom: f64, svg: &mut String) {
    let step_ms = step_s * 1e3;
    let raw = step_ms / 10.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let tick_ms = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|f| f * magnitude)
        .find(|&t| t >= raw)
        .unwrap_or(10.0 * magnitude);
    let decimals = if tick_ms >= 1.0 {
        0
    } else {
        (-tick_ms.log10().floor()) as usize
    };
    let top = HEADER - 18.0;
    let _ = write!(
        svg,
        r##"<line x1="{LABEL_WIDTH}" y1="{top}" x2="{}" y2="{top}" stroke="#333" stroke-width="1"/>"##,
        LABEL_WIDTH + step_s * scale
    );
    let mut k = 0u32;
    loop {
        let t_ms = f64::from(k) * tick_ms;
        if t_ms > step_ms * 1.0001 {
            break;
        }
        let x = LABEL_WIDTH + t_ms / 1e3 * scale;
        let _ = write!(
            svg,
            r##"<line x1="{x:.2}" y1="{top}" x2="{x:.2}" y2="{bottom}" stroke="#ccc" stroke-width="0.5"/><line x1="{x:.2}" y1="{}" x2="{x:.2}" y2="{top}" stroke="#333"/><text x="{x:.2}" y="{}" font-size="11" text-anchor="middle">{t_ms:.decimals$} ms</text>"##,
            top - 4.0,
            top - 7.0,
        );
        k += 1;
    }
}

/// The compute and communication lanes of a row, `(top, height)` each, on whole pixels so
/// that thin rows stay crisp; rows of 10 pixels or more keep a 2-pixel gap below them.
fn lanes(top: f64, row_height: f64) -> ((f64, f64), (f64, f64)) {
    let gap = if row_height >= 10.0 { 2.0 } else { 0.0 };
    let usable = row_height - gap;
    let compute = (usable * 0.66).round().max(1.0);
    let comm = (usable - compute).max(1.0);
    ((top, compute), (top + compute, comm))
}

fn rows_background(
    result: &SimResult,
    rows: &[Row],
    row_top: &[f64],
    row_height: f64,
    scale: f64,
    svg: &mut String,
) {
    let width = result.metrics.step_time_s * scale;
    for &top in &row_top[..rows.len()] {
        let ((y, h), (cy, ch)) = lanes(top, row_height);
        let _ = write!(
            svg,
            r##"<rect x="{LABEL_WIDTH}" y="{y:.2}" width="{width:.2}" height="{h:.2}" fill="{IDLE}"/><rect x="{LABEL_WIDTH}" y="{cy:.2}" width="{width:.2}" height="{ch:.2}" fill="#f5f5f5"/>"##
        );
    }
}

fn bars(
    result: &SimResult,
    rows: &[Row],
    row_of_group: &[usize],
    row_top: &[f64],
    row_height: f64,
    scale: f64,
    svg: &mut String,
) {
    let mut drawn_in_row = vec![u32::MAX; rows.len()];
    for (index, (task, span)) in result.tasks().enumerate() {
        if span.duration_s() <= 0.0 {
            continue;
        }
        let tooltip = tooltip(result, task, span.start_s, span.end_s);
        for group in result.task_groups(task) {
            let row = row_of_group[group.index()];
            // A task spanning several groups of one folded row is drawn once.
            if drawn_in_row[row] == index as u32 {
                continue;
            }
            drawn_in_row[row] = index as u32;
            let ((y, h), (cy, ch)) = lanes(row_top[row], row_height);
            let x = LABEL_WIDTH + span.start_s * scale;
            let w = (span.duration_s() * scale).max(0.3);
            let (colour, lane_y, lane_h) = match (task.kind.stream(), task.kind) {
                (Stream::Compute, TaskKind::Forward) => (FORWARD, y, h),
                (Stream::Compute, TaskKind::Backward) => (BACKWARD, y, h),
                (Stream::Compute, TaskKind::WeightGrad) => (WEIGHT_GRAD, y, h),
                (Stream::Compute, _) => (OPTIMIZER, y, h),
                (Stream::Comm, TaskKind::Send(_)) => (PIPELINE, cy, ch),
                (Stream::Comm, _) => (DP_SYNC, cy, ch),
            };
            // Wide bars get a hairline border so that neighbouring packs stay apart.
            let border = if w > 3.0 {
                r#" stroke="white" stroke-width="0.6""#
            } else {
                ""
            };
            let _ = write!(
                svg,
                r#"<rect x="{x:.2}" y="{lane_y:.2}" width="{w:.2}" height="{lane_h:.2}" fill="{colour}"{border}><title>{tooltip}</title></rect>"#
            );
            if task.cp_exchange_s > 0.0 {
                let cw = (task.cp_exchange_s * scale).max(0.3);
                let _ = write!(
                    svg,
                    r#"<rect x="{x:.2}" y="{cy:.2}" width="{cw:.2}" height="{ch:.2}" fill="{CP_EXCHANGE}" fill-opacity="0.8"><title>CP K/V exchange · {tooltip}</title></rect>"#
                );
            }
        }
    }
}

fn tooltip(result: &SimResult, task: &Task, start_s: f64, end_s: f64) -> String {
    let mut text = result.task_label(task);
    if let Some(pack) = task.pack {
        let pack = result.pack(pack);
        let _ = write!(
            text,
            " · replica %r{} · {} tokens in {} slice{}",
            pack.replica,
            pack.tokens,
            pack.slices,
            if pack.slices == 1 { "" } else { "s" }
        );
    }
    let _ = write!(
        text,
        " · stage {} · {:.3}–{:.3} ms ({:.3} ms)",
        task.stage,
        start_s * 1e3,
        end_s * 1e3,
        (end_s - start_s) * 1e3
    );
    escape(&text)
}

fn labels(result: &SimResult, rows: &[Row], row_top: &[f64], row_height: f64, svg: &mut String) {
    let layout = &result.layout;
    let font = (row_height * 0.72).clamp(7.0, 12.0);
    // Show every `stride`-th label so that labels never overlap.
    let stride = ((font + 1.0) / row_height).ceil().max(1.0) as usize;
    let mut stage_first_row = 0;
    for (index, (row, &top)) in rows.iter().zip(row_top).enumerate() {
        let stage = layout.stage_of(row.first);
        let first_of_stage = index == 0 || layout.stage_of(rows[index - 1].first) != stage;
        if first_of_stage {
            stage_first_row = index;
        }
        if (index - stage_first_row) % stride != 0 {
            continue;
        }
        let (first_rank, last_rank) = (layout.rank_of(row.first), layout.rank_of(row.last));
        let ranks = if first_rank == last_rank {
            format!("dp{first_rank}")
        } else {
            format!("dp{first_rank}–{last_rank}")
        };
        let devices = (
            layout.device_range(row.first).start,
            layout.device_range(row.last).end - 1,
        );
        let text = if devices.0 == devices.1 {
            format!("st{stage} {ranks} · dev {}", devices.0)
        } else {
            format!("st{stage} {ranks} · dev {}–{}", devices.0, devices.1)
        };
        let y = top + row_height / 2.0 + font * 0.35;
        let weight = if first_of_stage { "bold" } else { "normal" };
        let _ = write!(
            svg,
            r#"<text x="{}" y="{y:.2}" font-size="{font:.1}" font-weight="{weight}" text-anchor="end">{}</text>"#,
            LABEL_WIDTH - 6.0,
            escape(&text)
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
