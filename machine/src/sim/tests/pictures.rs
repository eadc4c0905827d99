//! The Chrome trace and the SVG timeline.

use serde_json::Value;

use super::super::{svg, trace};
use super::{plain, run, spec};

#[test]
fn chrome_trace_has_named_processes_threads_and_pack_events() {
    let (_, _, result) = run(
        spec("llama-7b", "h100-sxm", "tp=8,pp=2,dp=2"),
        &plain(&[vec![vec![4096], vec![1024, 512]], vec![vec![2048]]]),
    );
    let json = trace::chrome_trace(&result);
    assert_eq!(json, trace::chrome_trace(&result), "deterministic");
    let trace: Value = serde_json::from_str(&json).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let named = |name: &'static str| events.iter().filter(move |e| e["name"] == name);
    // Four device groups (2 DP ranks x 2 stages), each with a compute and a comm thread.
    assert_eq!(named("process_name").count(), 4);
    assert_eq!(named("thread_name").count(), 8);
    let process = named("process_name").find(|e| e["pid"] == 3).unwrap();
    assert_eq!(process["args"]["name"], "st1 dp1 · devices 24–31");
    // %f1 holds 1024 + 512 tokens; its forward runs on both stages of DP rank 0.
    let forward: Vec<&Value> = named("F %f1").collect();
    assert_eq!(forward.len(), 2);
    assert_eq!(forward[0]["args"]["tokens"], 1536);
    assert_eq!(forward[0]["args"]["slices"], 2);
    assert_eq!(forward[0]["tid"], 0);
    assert_eq!(named("send %f1").count(), 1);
    assert_eq!(named("recv %f1").count(), 1);
    assert_eq!(
        named("send %b0").next().unwrap()["pid"],
        2,
        "backward sends leave stage 1"
    );
    assert_eq!(named("dp-sync").count(), 4);
    let dp_sync = named("dp-sync").next().unwrap();
    assert_eq!(dp_sync["tid"], 1);
    assert!(dp_sync["dur"].as_f64().unwrap() > 0.0);
}

#[test]
fn svg_folds_identical_groups_and_has_legend_tooltips_and_ticks() {
    let same = vec![vec![4096], vec![4096]];
    let (_, _, result) = run(
        spec("llama-7b", "h100-sxm", "tp=8,pp=2,dp=4"),
        &plain(&[same.clone(), same.clone(), same.clone(), same]),
    );
    let picture = svg::timeline(&result);
    assert_eq!(picture, svg::timeline(&result), "deterministic");
    assert!(picture.starts_with("<svg "));
    assert!(picture.trim_end().ends_with("</svg>"));
    // The four identical DP ranks of a stage fold into one row per stage.
    assert!(
        picture.contains(">st0 dp0–3 · dev 0–31</text>"),
        "{}",
        &picture[..2000]
    );
    assert!(picture.contains(">st1 dp0–3 · dev 32–63</text>"));
    for legend in ["forward", "backward", "idle", "pipeline send/recv"] {
        assert!(picture.contains(&format!(">{legend}</text>")), "{legend}");
    }
    assert!(picture.contains("<title>F %f0 · replica %r0 · 4096 tokens in 1 slice · stage 0"));
    assert!(picture.contains(" ms</text>"));
    assert!(picture.contains(">where the step goes</text>"));
    assert!(picture.contains("<title>useful compute: "));
    assert!(picture.contains(">pipeline idle warmup "));
}

#[test]
fn svg_of_a_big_layout_stays_within_one_screen() {
    let packs: Vec<Vec<Vec<u32>>> = (0..64u32)
        .map(|rank| vec![vec![1000 + rank * 50]; 2])
        .collect();
    let (_, _, result) = run(
        spec("llama-7b", "h100-sxm", "tp=1,pp=4,dp=64"),
        &plain(&packs),
    );
    let picture = svg::timeline(&result);
    let height: f64 = picture
        .split("height=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .parse()
        .unwrap();
    // 256 rows fit a 1000-pixel screen.
    assert!(height <= 1000.0, "{height}");
}
