//! The compile driver: batch + spec in, compiled step IR and a report out.

use serde::Serialize;
use std::io::Write;
use std::time::Instant;

use slimpack_ir::batch::Batch;
use slimpack_ir::{Spec, StepIr};
use slimpack_machine::sim::Metrics;
use slimpack_passes::{
    parse_pipeline, run_pipeline, run_pipeline_in, ManagerOptions, PassContext, PassRecord,
    PipelineEntry, Result,
};

/// How to compile.
#[derive(Debug, Clone, Default)]
pub struct CompileOptions {
    /// The pass pipeline, as a pipeline string (empty: the logical IR).
    pub pipeline: String,
    pub manager: ManagerOptions,
}

/// The result of a compilation.
#[derive(Debug)]
pub struct Compiled {
    pub ir: StepIr,
    pub passes: Vec<PassRecord>,
    /// Wall time of building the IR and running the pipeline, milliseconds.
    pub compile_ms: f64,
}

/// Compiles one global batch: builds the logical IR and runs the pipeline over it. IR printed
/// by `--print-ir-*` options goes to `print_sink`.
pub fn compile(
    spec: &Spec,
    batch: &Batch,
    options: &CompileOptions,
    print_sink: &mut dyn Write,
) -> Result<Compiled> {
    let pipeline = parse_pipeline(&options.pipeline)?;
    let cx = PassContext::for_spec(spec);
    compile_entries(spec, batch, &pipeline, &cx, &options.manager, print_sink)
}

/// Builds the logical IR of `batch` and runs `pipeline` over it with the context `cx` (built
/// for `spec`), timing both: the one place a step is compiled (the tuner compiles candidates
/// through it too).
pub fn compile_entries(
    spec: &Spec,
    batch: &Batch,
    pipeline: &[PipelineEntry],
    cx: &PassContext,
    manager: &ManagerOptions,
    print_sink: &mut dyn Write,
) -> Result<Compiled> {
    let start = Instant::now();
    let mut ir = StepIr::from_batch(spec.clone(), batch);
    let passes = run_pipeline_in(&mut ir, pipeline, cx, manager, print_sink)?;
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(Compiled {
        ir,
        passes,
        compile_ms,
    })
}

/// Lowers a scheduled step to per-worker op lists (the `lower` pass, recorded with the others
/// and counted in the compile time). Nothing is verified again: every caller hands on a step
/// its pipeline or tuning just verified, and the pass stores the program it derives from that
/// step after proving it executable ([`slimpack_ir::program::lower_into`]), which is all that
/// lowering adds.
pub fn lower(
    compiled: &mut Compiled,
    manager: &ManagerOptions,
    print_sink: &mut dyn Write,
) -> Result<()> {
    let pipeline = parse_pipeline("lower")?;
    let start = Instant::now();
    let unverified = ManagerOptions {
        verify: false,
        ..manager.clone()
    };
    let records = run_pipeline(&mut compiled.ir, &pipeline, &unverified, print_sink)?;
    compiled.compile_ms += start.elapsed().as_secs_f64() * 1e3;
    compiled.passes.extend(records);
    Ok(())
}

/// Compiles a strategy's chosen step again, with `manager`'s IR printing and dumps, and lowers
/// it: the tuner compiles its candidates without them (they would show every candidate), so
/// this is how `compile --strategy ... --dump-dir` shows the passes that made the chosen step.
/// The passes are those `chosen` records, on its spec (the candidate's) and `batch` (the
/// admitted one); they are deterministic, so the replay makes the chosen step again, which is
/// checked: on a difference (a bug) the chosen step is kept, and a note says that the IR
/// shown is not its own.
pub fn replay_shown(
    mut chosen: Compiled,
    batch: &Batch,
    manager: &ManagerOptions,
    print_sink: &mut dyn Write,
) -> Result<Compiled> {
    let entries: Vec<String> = chosen
        .passes
        .iter()
        .map(|record| record.pipeline_entry.clone())
        .chain(["lower".to_string()])
        .collect();
    let pipeline = parse_pipeline(&entries.join(","))?;
    lower(
        &mut chosen,
        &ManagerOptions::default(),
        &mut std::io::sink(),
    )?;
    let spec = &chosen.ir.spec;
    let cx = PassContext::for_spec(spec);
    let replayed = compile_entries(spec, batch, &pipeline, &cx, manager, print_sink)?;
    if slimpack_ir::text::print(&replayed.ir) == slimpack_ir::text::print(&chosen.ir) {
        return Ok(replayed);
    }
    let _ = writeln!(
        print_sink,
        "note: the passes shown made a step other than the chosen one (a bug in slimpack, \
         please report it); the chosen step is the one compiled"
    );
    Ok(chosen)
}

/// The machine-readable summary of a compilation (`compile --report json`).
#[derive(Debug, Serialize)]
pub struct CompileReport<'a> {
    pub model: &'a str,
    pub cluster: &'a str,
    pub parallel: String,
    pub world: u64,
    pub phase: String,
    pub source: &'a str,
    pub context: Option<u32>,
    pub documents: u64,
    pub documents_cut: u64,
    /// Zero-length documents of the source, skipped (as trainers drop them).
    pub documents_empty: u64,
    pub samples: usize,
    pub tokens: u64,
    pub slices: usize,
    pub packs: usize,
    pub replicas: usize,
    /// Samples and tokens a strategy delayed to a later step (wlb's outlier queues); set by
    /// the caller that admitted the batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delayed_samples: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delayed_tokens: Option<u64>,
    pub passes: &'a [PassRecord],
    pub compile_ms: f64,
    /// The simulator's figures (`step_time_s`, `tokens_per_s`, `mfu`, ...) for a scheduled IR.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub simulation: Option<&'a Metrics>,
    /// Wall time of the simulation, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulate_ms: Option<f64>,
}

impl Compiled {
    /// The report of this compilation, with the simulator's figures (and the time they took)
    /// when the IR was simulated.
    pub fn report<'a>(&'a self, simulation: Option<(&'a Metrics, f64)>) -> CompileReport<'a> {
        let ir = &self.ir;
        let (samples, slices, packs, replicas) = ir.counts();
        CompileReport {
            model: &ir.spec.model.name,
            cluster: &ir.spec.cluster.name,
            parallel: ir.spec.parallel.to_string(),
            world: ir.spec.parallel.world(),
            phase: ir.phase().to_string(),
            source: &ir.batch.source,
            context: ir.batch.context,
            documents: ir.batch.documents,
            documents_cut: ir.batch.documents_cut,
            documents_empty: 0,
            samples,
            tokens: ir.tokens(),
            slices,
            packs,
            replicas,
            delayed_samples: None,
            delayed_tokens: None,
            passes: &self.passes,
            compile_ms: self.compile_ms,
            simulation: simulation.map(|(metrics, _)| metrics),
            simulate_ms: simulation.map(|(_, ms)| ms),
        }
    }
}
