//! Test harness: small models, random schedules, and a minimal pipeline executor.
//!
//! The executor replays a schedule (a sequence of forward and backward packs of one replica)
//! over a list of stages, passing hidden states forward and their gradients back, then sums the
//! tied embedding copies and merges the stages' gradients: what the real schedule executor does,
//! minus workers and timing.

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::cpu::{
    sum_tied_grads, Grads, KvExchange, LayerRange, LocalExchange, ModelConfig, Params, Result,
    SampleId, StageState, ThreadExchange, TokenBatch, TokenSlice,
};

/// Property-test settings: `cases` cases from a fixed seed (the same cases every run), and no
/// regression files written into the source tree (a failure prints its minimal input instead).
pub fn deterministic_config(cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x511e_9ac4),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

/// A model with the `tiny` preset's structure (grouped-query attention, SwiGLU) at test size.
pub fn small_config(layers: usize, tied_embeddings: bool) -> ModelConfig {
    ModelConfig {
        layers,
        hidden: 16,
        heads: 4,
        kv_heads: 2,
        head_dim: 4,
        ffn: 24,
        vocab: 32,
        tied_embeddings,
        norm_eps: ModelConfig::NORM_EPS,
        rope_theta: ModelConfig::ROPE_THETA,
    }
}

/// Weights from `seed` with norm gains spread over [0.5, 1.5], so that the gains' gradients and
/// their effect on other gradients are exercised (a gain of exactly 1 hides some mistakes).
pub fn params_with_random_gains(config: &ModelConfig, seed: u64) -> Params {
    let mut params = Params::init(config, seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9);
    for tensor in params.tensors_mut() {
        if tensor.kind == crate::cpu::TensorKind::NormGain {
            tensor
                .data
                .iter_mut()
                .for_each(|g| *g = rng.random_range(0.5..1.5));
        }
    }
    params
}

/// One unit of a schedule.
#[derive(Debug, Clone, PartialEq)]
pub enum Pack {
    Forward(Vec<TokenSlice>),
    Backward(Vec<TokenSlice>),
}

/// Cuts each sample into random slices (fine and coarse cuts both occur), interleaves the
/// slices' forwards and backwards in a random order that keeps the rules (per sample: forwards
/// increasing; backwards decreasing, after all its forwards), and groups consecutive events of one
/// direction into packs of random size, each shuffled. Forward and backward packs thus form two
/// different partitions of the slices.
pub fn random_schedule(batch: &TokenBatch, seed: u64) -> Vec<Pack> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let slices: Vec<Vec<TokenSlice>> = batch
        .sample_ids()
        .map(|s| random_slices(batch, s, &mut rng))
        .collect();
    let mut next_forward = vec![0; slices.len()];
    let mut next_backward: Vec<usize> = slices.iter().map(Vec::len).collect();
    let mut events = Vec::new();
    loop {
        let mut ready = Vec::new();
        for (sample, sample_slices) in slices.iter().enumerate() {
            if next_forward[sample] < sample_slices.len() {
                ready.push((true, sample));
            } else if next_backward[sample] > 0 {
                ready.push((false, sample));
            }
        }
        let Some(&(forward, sample)) = ready.choose(&mut rng) else {
            break;
        };
        if forward {
            events.push((true, slices[sample][next_forward[sample]]));
            next_forward[sample] += 1;
        } else {
            next_backward[sample] -= 1;
            events.push((false, slices[sample][next_backward[sample]]));
        }
    }
    group_into_packs(events, &mut rng)
}

fn random_slices(batch: &TokenBatch, sample: SampleId, rng: &mut ChaCha8Rng) -> Vec<TokenSlice> {
    let len = batch.tokens(sample).len();
    let cut_probability = [0.0, 0.05, 0.2, 0.5][rng.random_range(0..4)];
    let mut slices = Vec::new();
    let mut start = 0;
    for position in 1..=len {
        if position == len || rng.random_bool(cut_probability) {
            slices.push(TokenSlice {
                sample,
                start,
                len: position - start,
            });
            start = position;
        }
    }
    slices
}

fn group_into_packs(events: Vec<(bool, TokenSlice)>, rng: &mut ChaCha8Rng) -> Vec<Pack> {
    let mut packs = Vec::new();
    let mut current: Vec<TokenSlice> = Vec::new();
    let mut current_forward = true;
    for (forward, slice) in events {
        if !current.is_empty() && (forward != current_forward || rng.random_bool(0.35)) {
            packs.push(make_pack(
                current_forward,
                std::mem::take(&mut current),
                rng,
            ));
        }
        current_forward = forward;
        current.push(slice);
    }
    if !current.is_empty() {
        packs.push(make_pack(current_forward, current, rng));
    }
    packs
}

fn make_pack(forward: bool, mut slices: Vec<TokenSlice>, rng: &mut ChaCha8Rng) -> Pack {
    slices.shuffle(rng);
    if forward {
        Pack::Forward(slices)
    } else {
        Pack::Backward(slices)
    }
}

/// Samples of random tokens of the given lengths.
pub fn batch_of(config: &ModelConfig, lengths: &[usize], seed: u64) -> TokenBatch {
    TokenBatch::synthetic(config, lengths, seed).expect("test lengths are valid")
}

/// Runs `schedule` over `stages` (a partition of the model's layers; one stage is the whole
/// model) and returns the loss and the merged gradients of the whole model.
pub fn run_schedule(
    params: &Params,
    stages: &[LayerRange],
    batch: &TokenBatch,
    schedule: &[Pack],
) -> Result<(f64, Grads)> {
    let exchanges = stages
        .iter()
        .map(|_| Box::new(LocalExchange) as Box<dyn KvExchange>);
    let (loss, grads) = run_worker(params, stages, batch, schedule, exchanges.collect())?;
    Ok((loss, merge_stages(grads)?))
}

/// Runs `schedule` on a DP-Merge group of `size` workers (threads), each with its share of
/// every slice on every stage, and returns the summed loss and gradients of the whole model.
pub fn run_schedule_merged(
    params: &Params,
    stages: &[LayerRange],
    batch: &TokenBatch,
    schedule: &[Pack],
    size: usize,
) -> Result<(f64, Grads)> {
    let abort = Arc::new(AtomicBool::new(false));
    // One group per stage; worker `rank` takes end `rank` of each.
    let mut groups: Vec<Vec<ThreadExchange>> = stages
        .iter()
        .map(|_| ThreadExchange::group(size, Arc::clone(&abort)))
        .collect();
    let mut per_worker: Vec<Vec<Box<dyn KvExchange>>> = (0..size).map(|_| Vec::new()).collect();
    for group in &mut groups {
        for (rank, end) in group.drain(..).enumerate() {
            per_worker[rank].push(Box::new(end));
        }
    }
    let results: Vec<Result<(f64, Vec<Grads>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = per_worker
            .into_iter()
            .map(|exchanges| {
                let abort = Arc::clone(&abort);
                scope.spawn(move || {
                    // A failed worker releases the others from their exchanges.
                    let raise = AbortOnDrop(abort);
                    let result = run_worker(params, stages, batch, schedule, exchanges);
                    if result.is_ok() {
                        std::mem::forget(raise);
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    let mut loss = 0.0;
    let mut total: Option<Vec<Grads>> = None;
    for result in results {
        let (worker_loss, grads) = result?;
        loss += worker_loss;
        match &mut total {
            None => total = Some(grads),
            Some(total) => {
                for (sum, part) in total.iter_mut().zip(&grads) {
                    sum.add_assign(part)?;
                }
            }
        }
    }
    Ok((loss, merge_stages(total.expect("at least one worker"))?))
}

/// Raises the abort flag when dropped (on an error, or while unwinding from a panic).
struct AbortOnDrop(Arc<AtomicBool>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One worker's pass over the schedule: every stage in turn, with one exchange per stage.
fn run_worker(
    params: &Params,
    stages: &[LayerRange],
    batch: &TokenBatch,
    schedule: &[Pack],
    exchanges: Vec<Box<dyn KvExchange>>,
) -> Result<(f64, Vec<Grads>)> {
    let stage_params = params.split(stages)?;
    let mut grads: Vec<Grads> = stage_params.iter().map(Params::zeros_like).collect();
    let config = params.config();
    let mut states: Vec<StageState> = stages
        .iter()
        .zip(exchanges)
        .map(|(&s, exchange)| StageState::with_exchange(config, s, exchange))
        .collect();
    let mut loss = 0.0;
    for pack in schedule {
        match pack {
            Pack::Forward(slices) => {
                let mut hidden = Vec::new();
                for (state, weights) in states.iter_mut().zip(&stage_params) {
                    let output = state.forward_pack(weights, batch, slices, &hidden)?;
                    hidden = output.hidden;
                    loss += output.loss;
                }
            }
            Pack::Backward(slices) => {
                let mut grad = Vec::new();
                for index in (0..stages.len()).rev() {
                    let (state, weights) = (&mut states[index], &stage_params[index]);
                    grad = state.backward_pack(weights, &mut grads[index], batch, slices, &grad)?;
                }
            }
        }
    }
    for state in &states {
        assert!(
            state.is_drained(),
            "stage {} still holds {:?}",
            state.stage(),
            state.live_bytes()
        );
    }
    Ok((loss, grads))
}

/// Sums the tied embedding copies and merges the stages' gradients into the whole model's.
fn merge_stages(mut grads: Vec<Grads>) -> Result<Grads> {
    if grads.len() > 1 {
        let (first, rest) = grads.split_at_mut(1);
        sum_tied_grads(&mut first[0], rest.last_mut().expect("more than one stage"))?;
    }
    Params::merge(grads)
}
