//! `slimpack bench --planning`: how planning time grows with the batch. For each batch size
//! (1K, 10K, 100K and 1M samples by default; sizes past the dataset stop at the whole
//! dataset) and each strategy, one step is planned as `compile --strategy` plans it — every
//! candidate compiled, verified and simulated, the chosen one lowered — and its wall time is
//! printed with its growth over the previous size, so the scaling is visible in one run.
//!
//! A cell is planned up to `repeats` times, fewer once its runs have taken [`CELL_BUDGET_S`]
//! (a million samples plan once), and its wall time is the median of its runs: on a shared
//! machine a single short run can take twice its usual time, and one such run would make a
//! growth figure of that noise. The runs go in rounds over all cells (every size and
//! strategy once, then again), so that the sizes a growth compares are timed side by side.

use serde::Serialize;
use std::time::Instant;

use slimpack::compile::lower;
use slimpack::tune::autotune::{self, TuneOptions};
use slimpack::tune::strategy::{Choices, StrategyInfo, StrategyState};
use slimpack_ir::batch::{Batch, BatchOptions, Dataset};
use slimpack_ir::Spec;
use slimpack_passes::ManagerOptions;

use super::compile::ReportFormat;

/// Sample counts of the default table.
pub const DEFAULT_SIZES: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// Runs of each cell unless --planning-repeats says.
pub const DEFAULT_REPEATS: usize = 3;

/// Wall seconds after which a cell stops repeating.
pub const CELL_BUDGET_S: f64 = 10.0;

/// One strategy planning one batch size.
#[derive(Debug, Serialize)]
pub struct Measurement {
    samples: usize,
    tokens: u64,
    strategy: &'static str,
    candidates: usize,
    /// The median wall time of the cell's runs.
    wall_ms: f64,
    /// The fastest and slowest run.
    min_ms: f64,
    max_ms: f64,
    runs: usize,
    /// Wall time over the previous size's (None for the first size).
    growth: Option<f64>,
    step_time_s: f64,
}

/// Plans one step per size and strategy, `repeats` times each (fewer past the cell's budget).
pub fn measure(
    spec: &Spec,
    dataset: &Dataset,
    options: &BatchOptions,
    sizes: &[usize],
    repeats: usize,
    strategies: &[&'static StrategyInfo],
    choices: &Choices,
) -> anyhow::Result<Vec<Measurement>> {
    let mut batches: Vec<Batch> = Vec::new();
    for &size in sizes {
        let batch = dataset.global_batch(&BatchOptions {
            global_batch: Some(size),
            global_batch_tokens: None,
            ..*options
        })?;
        // A size past the dataset plans the whole dataset, once: the next would time it again.
        if batches
            .last()
            .is_some_and(|last| batch.samples.len() <= last.samples.len())
        {
            eprintln!(
                "note: --planning-sizes {size}: the dataset holds {} samples, planned at the \
                 previous size; skipped",
                batch.samples.len()
            );
            continue;
        }
        batches.push(batch);
    }
    let cells: Vec<(&Batch, &'static StrategyInfo)> = (batches.iter())
        .flat_map(|batch| strategies.iter().map(move |&strategy| (batch, strategy)))
        .collect();
    // Rounds over every cell, so that a size's runs and the next size's see the same machine
    // (a shared machine slows down and speeds up over a run: repeating one cell after another
    // would put that drift into the growth).
    let mut walls: Vec<Vec<f64>> = vec![Vec::new(); cells.len()];
    let mut planned: Vec<Option<(usize, f64)>> = vec![None; cells.len()];
    for _ in 0..repeats {
        for (cell, &(batch, strategy)) in cells.iter().enumerate() {
            let runs = &mut walls[cell];
            if runs.len() >= repeats || runs.iter().sum::<f64>() >= CELL_BUDGET_S * 1e3 {
                continue;
            }
            let start = Instant::now();
            let step = plan_one(strategy, spec, batch, choices)?;
            runs.push(start.elapsed().as_secs_f64() * 1e3);
            planned[cell] = Some(step);
        }
    }
    let mut rows: Vec<Measurement> = Vec::new();
    for (cell, &(batch, strategy)) in cells.iter().enumerate() {
        let (candidates, step_time_s) = planned[cell].expect("repeats >= 1: a cell runs once");
        let walls = &mut walls[cell];
        walls.sort_by(f64::total_cmp);
        let wall_ms = median(walls);
        let growth = rows
            .iter()
            .rev()
            .find(|row| row.strategy == strategy.name)
            .map(|previous| wall_ms / previous.wall_ms);
        rows.push(Measurement {
            samples: batch.samples.len(),
            tokens: batch.tokens(),
            strategy: strategy.name,
            candidates,
            wall_ms,
            min_ms: walls[0],
            max_ms: walls[walls.len() - 1],
            runs: walls.len(),
            growth,
            step_time_s,
        });
    }
    Ok(rows)
}

/// Prints the measurements as a table (or one JSON object), and writes the JSON to `json`.
pub fn report(
    spec: &Spec,
    rows: &[Measurement],
    report: ReportFormat,
    json: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let report_json = || {
        serde_json::to_string_pretty(&serde_json::json!({
            "model": spec.model.name,
            "cluster": spec.cluster.name,
            "parallel": spec.parallel.to_string(),
            "devices": spec.parallel.world(),
            "rows": rows,
        }))
    };
    if let Some(path) = json {
        super::output::write(Some(path), &(report_json()? + "\n"))?;
    }
    match report {
        ReportFormat::Json => println!("{}", report_json()?),
        ReportFormat::Text => print!("{}", table(spec, rows)),
    }
    Ok(())
}

/// Plans one step as `compile --strategy` does; returns the candidates offered and the chosen
/// step's time.
fn plan_one(
    strategy: &'static StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    choices: &Choices,
) -> anyhow::Result<(usize, f64)> {
    let mut state = StrategyState::default();
    let admitted = autotune::admit(strategy, &mut state, spec, batch);
    let choice = autotune::choose_with(
        strategy,
        spec,
        &admitted,
        &state,
        choices,
        &TuneOptions {
            per_family: false,
            ..TuneOptions::default()
        },
    )?;
    let candidates = choice.candidates_offered();
    let step_time_s = choice.best().metrics.step_time_s;
    let mut compiled = choice.compiled;
    lower(
        &mut compiled,
        &ManagerOptions::default(),
        &mut std::io::sink(),
    )?;
    Ok((candidates, step_time_s))
}

/// The median of sorted, non-empty values.
fn median(sorted: &[f64]) -> f64 {
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

fn table(spec: &Spec, rows: &[Measurement]) -> String {
    let mut text = format!(
        "planning one step (tune, compile, verify, simulate, lower; median wall time): {} on {} ({}, {} devices)\n",
        spec.model.name,
        spec.cluster.name,
        spec.parallel,
        spec.parallel.world()
    );
    text.push_str(&format!(
        "{:>10} {:>14} {:>12} {:>10} {:>12} {:>21} {:>8}\n",
        "samples", "tokens", "strategy", "candidates", "wall ms", "runs (min-max ms)", "growth"
    ));
    for row in rows {
        text.push_str(&format!(
            "{:>10} {:>14} {:>12} {:>10} {:>12.1} {:>21} {:>8}\n",
            row.samples,
            row.tokens,
            row.strategy,
            row.candidates,
            row.wall_ms,
            format!("{} ({:.0}-{:.0})", row.runs, row.min_ms, row.max_ms),
            row.growth.map_or("-".to_string(), |g| format!("{g:.1}x"))
        ));
    }
    text
}
