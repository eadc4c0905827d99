//! The simulated step as a Chrome-trace / Perfetto timeline (JSON, open it in `ui.perfetto.dev`
//! or `chrome://tracing`).
//!
//! One process per device group (`st1 dp3 · devices 24–31`: the `tp × cp` devices of one DP
//! rank on one stage, which run identical timelines), sorted by stage then DP rank; threads
//! `compute`, `comm` and, when a DP-Merge group exchanges K/V, `cp`. Complete events (`"ph":
//! "X"`, microseconds) are named `F %f3`, `B %b7`, `send %f3` (`recv %f3` on the receiving
//! group), `cp-kv %f3`, `dp-sync`, `optimizer`, `param-gather`; pack events carry the pack,
//! its replica, stage, tokens and slices in `args`. Zero-length tasks (a DP sync with one
//! replica) are left out. The output is deterministic.

use serde::Serialize;
use serde_json::{json, Value};

use super::layout::GroupId;
use super::result::SimResult;
use super::task::{Stream, Task, TaskKind};

const COMPUTE_THREAD: u32 = 0;
const COMM_THREAD: u32 = 1;
const CP_THREAD: u32 = 2;

#[derive(Serialize)]
struct Event {
    name: String,
    cat: &'static str,
    ph: &'static str,
    pid: u32,
    tid: u32,
    ts: f64,
    dur: f64,
    args: Args,
}

#[derive(Clone, Serialize)]
struct Args {
    #[serde(skip_serializing_if = "Option::is_none")]
    pack: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replica: Option<u32>,
    stage: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    slices: Option<u32>,
}

/// The Chrome-trace JSON of a simulated step.
pub fn chrome_trace(result: &SimResult) -> String {
    let mut out: Vec<u8> = Vec::with_capacity(200 * result.graph.tasks.len() + 4096);
    out.extend_from_slice(b"{\"traceEvents\":[");
    let mut first = true;
    let has_cp = result.graph.tasks.iter().any(|t| t.cp_exchange_s > 0.0);
    for group in 0..result.layout.groups() as u32 {
        for event in metadata(result, GroupId(group), has_cp) {
            push(&mut out, &mut first, &event);
        }
    }
    for (task, span) in result.tasks() {
        if span.duration_s() <= 0.0 {
            continue;
        }
        let (name, category) = label(result, task);
        let args = args(result, task);
        let groups = result.task_groups(task);
        let thread = match task.kind.stream() {
            Stream::Compute => COMPUTE_THREAD,
            Stream::Comm => COMM_THREAD,
        };
        for (position, &group) in groups.iter().enumerate() {
            // A send's group list holds the senders, then as many receivers.
            let receiving = matches!(task.kind, TaskKind::Send(_)) && position >= groups.len() / 2;
            let name = if receiving {
                name.replacen("send", "recv", 1)
            } else {
                name.clone()
            };
            let event = complete(
                name,
                category,
                group,
                thread,
                span.start_s,
                span.duration_s(),
                &args,
            );
            push(&mut out, &mut first, &event);
            if task.cp_exchange_s > 0.0 {
                let name = format!("cp-kv {}", args.pack.as_deref().unwrap_or(""));
                let event = complete(
                    name,
                    "cp",
                    group,
                    CP_THREAD,
                    span.start_s,
                    task.cp_exchange_s,
                    &args,
                );
                push(&mut out, &mut first, &event);
            }
        }
    }
    out.extend_from_slice(b"],\"displayTimeUnit\":\"ms\",\"otherData\":");
    let other = json!({
        "step_time_s": result.metrics.step_time_s,
        "devices": result.layout.devices(),
    });
    serde_json::to_writer(&mut out, &other).expect("trace data always serializes (bug)");
    out.push(b'}');
    String::from_utf8(out).expect("serde_json writes UTF-8 (bug)")
}

/// Appends one event to the `traceEvents` array.
fn push<T: Serialize>(out: &mut Vec<u8>, first: &mut bool, event: &T) {
    if !std::mem::take(first) {
        out.push(b',');
    }
    serde_json::to_writer(out, event).expect("a trace event always serializes (bug)");
}

fn metadata(result: &SimResult, group: GroupId, has_cp: bool) -> Vec<Value> {
    let mut events = Vec::with_capacity(8);
    let layout = &result.layout;
    let devices = layout.device_range(group);
    let name = format!(
        "st{} dp{} · devices {}–{}",
        layout.stage_of(group),
        layout.rank_of(group),
        devices.start,
        devices.end - 1
    );
    let pid = group.0;
    events.push(json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}));
    events.push(
        json!({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}),
    );
    let mut threads = vec![(COMPUTE_THREAD, "compute"), (COMM_THREAD, "comm")];
    if has_cp {
        threads.push((CP_THREAD, "cp"));
    }
    for (tid, thread) in threads {
        events.push(json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}}));
        events.push(json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}));
    }
    events
}

fn label(result: &SimResult, task: &Task) -> (String, &'static str) {
    let category = match task.kind {
        TaskKind::Forward => "forward",
        TaskKind::Backward => "backward",
        TaskKind::WeightGrad => "weight-grad",
        TaskKind::Send(_) => "pipeline",
        TaskKind::GradReduceScatter | TaskKind::ParamAllGather => "dp",
        TaskKind::Optimizer => "optimizer",
    };
    (result.task_label(task), category)
}

fn args(result: &SimResult, task: &Task) -> Args {
    let pack = task.pack.map(|p| result.pack(p));
    Args {
        pack: pack.map(|p| p.name()),
        replica: task.replica,
        stage: task.stage,
        tokens: pack.map(|p| p.tokens),
        slices: pack.map(|p| p.slices),
    }
}

fn complete(
    name: String,
    cat: &'static str,
    group: GroupId,
    tid: u32,
    start_s: f64,
    duration_s: f64,
    args: &Args,
) -> Event {
    Event {
        name,
        cat,
        ph: "X",
        pid: group.0,
        tid,
        ts: start_s * 1e6,
        dur: duration_s * 1e6,
        args: args.clone(),
    }
}
