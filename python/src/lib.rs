//! `slimpack._native`: the Rust side of the Python package.
//!
//! Two entry points over the `slimpack` library, both returning schedule JSON documents (the
//! Python side, `slimpack/schedule.py`, turns them into `Schedule` objects):
//! - [`plan`]: one global batch of the caller's lengths, tuned and lowered
//!   ([`slimpack::plan::plan_batch`], what `slimpack compile --strategy` does);
//! - [`EpochPlanner`]: the steps of an epoch ([`slimpack::plan::plan_epoch`], what `slimpack
//!   plan` does), planned on a background thread that stays a bounded number of steps ahead
//!   of the consumer and reuses the configuration tuned on the first step.
//!
//! Planning runs with the GIL released. Bad input raises `ValueError` with the command line's
//! one-line message (`--model: unknown model preset 'x' (valid: ...)`); a failure of the
//! planner itself raises `RuntimeError`.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Mutex;
use std::thread::JoinHandle;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use slimpack::codegen::schedule_json;
use slimpack::ir::batch::{Batch, BatchOptions, Dataset, LoadOptions};
use slimpack::ir::spec::{ClusterSpec, ModelSpec, ParallelSpec, Recompute};
use slimpack::ir::Spec;
use slimpack::plan::{plan_batch, plan_epoch, plan_pipeline, PlanOptions, PlannedStep};
use slimpack::tune::autotune::{TuneOptions, Verify};
use slimpack::tune::strategy::{self, Choices, StrategyInfo};

/// A bad-input error: `ValueError` with `message`.
fn bad_input(message: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(message.to_string())
}

/// The spec of `model`, `cluster`, `parallel` and an optional recompute mode, checked as the
/// command line checks its `--model/--cluster/--parallel/--recompute` flags; `calibration`, a
/// `slimpack calibrate` table of the cluster's device, prices its kernels from then on in this
/// process (`--calibration FILE`).
fn spec_of(
    model: &str,
    cluster: &str,
    parallel: &str,
    recompute: Option<&str>,
    calibration: Option<&str>,
) -> PyResult<Spec> {
    let mut model = ModelSpec::preset(model).map_err(|e| bad_input(format!("--model: {e}")))?;
    let cluster = ClusterSpec::preset(cluster).map_err(|e| bad_input(format!("--cluster: {e}")))?;
    let parallel: ParallelSpec = parallel.parse().map_err(bad_input)?;
    if let Some(mode) = recompute {
        model.recompute = mode
            .parse::<Recompute>()
            .map_err(|e| bad_input(format!("--recompute: {e}")))?;
    }
    let spec = Spec {
        model,
        cluster,
        parallel,
    };
    spec.validate().map_err(bad_input)?;
    if let Some(path) = calibration {
        slimpack::machine::use_calibration_file(std::path::Path::new(path), &spec)
            .map_err(|e| bad_input(format!("calibration {path}: {e}")))?;
    }
    Ok(spec)
}

/// What the tuning may choose among: every recompute mode unless one was fixed, within
/// `memory_limit` (a fraction of device memory in (0, 1]), with model chunks (interleaved 1F1B,
/// which changes how the trainer must split its layers) only where `model_chunks` allows.
fn choices_of(
    spec: &Spec,
    recompute_fixed: bool,
    memory_limit: Option<f64>,
    model_chunks: bool,
) -> PyResult<Choices> {
    // slimpack.torch runs whole backwards and one recomputation mode per step: no zero-bubble
    // or per-stage recomputation candidates.
    let mut choices = match recompute_fixed {
        true => Choices::fixed(spec.model.recompute),
        false => Choices::all(),
    }
    .whole_backwards()
    .one_mode_per_step();
    if !model_chunks {
        choices = choices.one_chunk_per_device();
    }
    if let Some(fraction) = memory_limit {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(bad_input(format!(
                "--memory-limit {fraction}: give a fraction of device memory in (0, 1], e.g. 0.92"
            )));
        }
        choices.memory_limit = fraction;
    }
    Ok(choices)
}

fn strategy_of(name: &str) -> PyResult<&'static StrategyInfo> {
    strategy::lookup(name).map_err(|e| bad_input(format!("--strategy: {e}")))
}

/// The schedule document of a planned step, with the simulator's metrics, as
/// `compile --emit json` writes it.
fn document_json(step: &PlannedStep) -> PyResult<String> {
    let predicted =
        serde_json::to_value(&step.metrics).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let document =
        schedule_json::document(&step.compiled.ir, Some(predicted)).map_err(bad_input)?;
    let mut json = serde_json::to_string_pretty(&document)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    json.push('\n');
    Ok(json)
}

/// Plans one global batch holding one sample per length (cut to `context` when given) with a
/// strategy, or with the explicit pass pipeline `passes`: returns `(schedule_json, candidate,
/// candidates_tried)`.
#[pyfunction]
#[pyo3(signature = (lengths, *, model, cluster, parallel, strategy = "slimpack", context = None,
                    recompute = None, memory_limit = None, tune_budget_ms = None, passes = None,
                    verify = true, model_chunks = false, calibration = None))]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    lengths: Vec<i64>,
    model: &str,
    cluster: &str,
    parallel: &str,
    strategy: &str,
    context: Option<u32>,
    recompute: Option<&str>,
    memory_limit: Option<f64>,
    tune_budget_ms: Option<u64>,
    passes: Option<&str>,
    verify: bool,
    model_chunks: bool,
    calibration: Option<&str>,
) -> PyResult<(String, String, usize)> {
    let spec = spec_of(model, cluster, parallel, recompute, calibration)?;
    let choices = choices_of(&spec, recompute.is_some(), memory_limit, model_chunks)?;
    let strategy = strategy_of(strategy)?;
    let dataset = Dataset::from_lengths("lengths", &lengths).map_err(bad_input)?;
    let options = BatchOptions {
        context,
        ..BatchOptions::default()
    };
    let batch: Batch = dataset.global_batch(&options).map_err(bad_input)?;
    let tune = TuneOptions {
        verify: Verify::from_flags(!verify, false),
        budget: tune_budget_ms.map(std::time::Duration::from_millis),
        ..TuneOptions::default()
    };
    if let Some(pipeline) = passes {
        let planned = py
            .allow_threads(|| plan_pipeline(&spec, &batch, pipeline, verify))
            .map_err(bad_input)?;
        return Ok((document_json(&planned)?, format!("passes={pipeline}"), 1));
    }
    let tuned = py
        .allow_threads(|| plan_batch(&spec, &batch, strategy, &choices, &tune))
        .map_err(bad_input)?;
    let json = document_json(&tuned.planned)?;
    Ok((json, tuned.label, tuned.candidates_tried))
}

/// What the planning thread hands on.
enum Message {
    /// A planned step: its number and its schedule document.
    Step(usize, String),
    /// The epoch is planned: the plan's summary as JSON.
    Done(String),
    /// Planning failed: the one-line message.
    Failed(String),
}

/// The steps of one epoch of a dataset, planned on a background thread (see the module docs).
/// `next()` returns `(step, schedule_json)`, or `None` when the epoch is done.
#[pyclass(module = "slimpack._native")]
struct EpochPlanner {
    steps: Mutex<Receiver<Message>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    summary: Mutex<Option<String>>,
}

#[pymethods]
impl EpochPlanner {
    #[new]
    #[pyo3(signature = (*, lengths = None, path = None, model, cluster, parallel,
                        strategy = "slimpack", context = None, global_batch = None,
                        global_batch_tokens = None, seed = 0, recompute = None,
                        memory_limit = None, max_steps = None, prefetch = 1, verify = true,
                        model_chunks = false, calibration = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        lengths: Option<Vec<i64>>,
        path: Option<String>,
        model: &str,
        cluster: &str,
        parallel: &str,
        strategy: &str,
        context: Option<u32>,
        global_batch: Option<usize>,
        global_batch_tokens: Option<u64>,
        seed: u64,
        recompute: Option<&str>,
        memory_limit: Option<f64>,
        max_steps: Option<usize>,
        prefetch: usize,
        verify: bool,
        model_chunks: bool,
        calibration: Option<&str>,
    ) -> PyResult<EpochPlanner> {
        let spec = spec_of(model, cluster, parallel, recompute, calibration)?;
        let choices = choices_of(&spec, recompute.is_some(), memory_limit, model_chunks)?;
        let strategy = strategy_of(strategy)?;
        let dataset = match (lengths, path) {
            (Some(lengths), None) => Dataset::from_lengths("lengths", &lengths),
            (None, Some(path)) => {
                Dataset::load(std::path::Path::new(&path), &LoadOptions::default())
            }
            _ => return Err(bad_input("give the lengths or the path of a lengths file")),
        }
        .map_err(bad_input)?;
        let options = BatchOptions {
            context,
            global_batch,
            global_batch_tokens,
            seed,
        };
        // The checks the first batch would fail, raised here rather than at the first step.
        dataset.batch_stream(&options).map_err(bad_input)?;
        if max_steps == Some(0) {
            return Err(bad_input(
                "--max-steps: must be a positive number of steps, got 0",
            ));
        }
        if prefetch == 0 {
            return Err(bad_input("prefetch: plan at least one step ahead, got 0"));
        }
        let (sender, receiver) = sync_channel(prefetch - 1);
        let thread = std::thread::spawn(move || {
            let plan = PlanOptions {
                strategy,
                choices: &choices,
                tune: TuneOptions {
                    verify: Verify::from_flags(!verify, false),
                    ..TuneOptions::default()
                },
                max_steps,
                threads: Some(1),
            };
            let mut sink = |step: PlannedStep| {
                let json = document_json(&step).map_err(|e| e.to_string())?;
                sender
                    .send(Message::Step(step.step, json))
                    .map_err(|_| "the consumer is gone".to_string())
            };
            let outcome = plan_epoch(&spec, &dataset, &options, &plan, &mut sink);
            let last = match outcome {
                Ok(summary) => match serde_json::to_string(&summary) {
                    Ok(json) => Message::Done(json),
                    Err(error) => Message::Failed(error.to_string()),
                },
                Err(error) => Message::Failed(error.to_string()),
            };
            // A consumer that stopped early has dropped the receiver: nothing to tell.
            let _ = sender.send(last);
        });
        Ok(EpochPlanner {
            steps: Mutex::new(receiver),
            thread: Mutex::new(Some(thread)),
            summary: Mutex::new(None),
        })
    }

    /// The next planned step `(step, schedule_json)`, waiting (without the GIL) for the
    /// planning thread; `None` once the epoch is done.
    fn next(&self, py: Python<'_>) -> PyResult<Option<(usize, String)>> {
        if self.summary.lock().unwrap().is_some() {
            return Ok(None);
        }
        let message = py.allow_threads(|| self.steps.lock().unwrap().recv());
        match message {
            Ok(Message::Step(step, json)) => Ok(Some((step, json))),
            Ok(Message::Done(summary)) => {
                *self.summary.lock().unwrap() = Some(summary);
                self.join(py);
                Ok(None)
            }
            Ok(Message::Failed(message)) => {
                self.join(py);
                Err(bad_input(message))
            }
            Err(_) => {
                self.join(py);
                Err(PyRuntimeError::new_err(
                    "the planning thread stopped without a result: a bug in slimpack",
                ))
            }
        }
    }

    /// The epoch plan's summary as JSON (`slimpack plan --report json`), once done.
    fn summary(&self) -> Option<String> {
        self.summary.lock().unwrap().clone()
    }
}

impl EpochPlanner {
    fn join(&self, py: Python<'_>) {
        if let Some(thread) = self.thread.lock().unwrap().take() {
            let _ = py.allow_threads(|| thread.join());
        }
    }
}

/// Checks a schedule document as `slimpack simulate` reads one (format, version, every field
/// of the closed schema, every rank group and group index in range); raises `ValueError` with
/// the one-line message otherwise.
#[pyfunction]
fn check_schedule(py: Python<'_>, text: &str) -> PyResult<()> {
    py.allow_threads(|| schedule_json::parse(text).map(drop))
        .map_err(bad_input)
}

/// The names of the strategies `plan` and `Planner` accept.
#[pyfunction]
fn strategies() -> Vec<&'static str> {
    strategy::STRATEGIES.iter().map(|s| s.name).collect()
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(plan, module)?)?;
    module.add_function(wrap_pyfunction!(strategies, module)?)?;
    module.add_function(wrap_pyfunction!(check_schedule, module)?)?;
    module.add_class::<EpochPlanner>()?;
    module.add("SCHEDULE_VERSION", schedule_json::VERSION)?;
    Ok(())
}
