//! A replica's 1F1B makespan: its packs' times on every stage, in the order `schedule-pipeline`
//! gives them, with the dependencies the simulator enforces.
//!
//! The e-graph's cost (`sum + (pp - 1) x max` per direction) is what extraction can compose
//! bottom-up; this is what the pass ranks replicas by and accepts a result by. Per stage `s`
//! of `pp`, the order is `schedule-pipeline`'s own ([`stage_order`], with a warm-up of
//! `pp - 1 - s` forwards; packs weigh 1 when the two directions' packs are the same, tokens
//! otherwise, as that pass weighs them). A forward on stage `s` waits
//! for itself on `s - 1`, a backward on `s` for itself on `s + 1`, and a backward on the last
//! stage for the forwards holding its slices there. Left out: pipeline sends (small next to
//! the packs, and the same for any regrouping of a replica's tokens) and the warm-ups
//! `schedule-pipeline` shortens where memory is short.

use slimpack_ir::step::Direction;

use super::cost::PackTimer;
use super::language::Span;
use crate::schedule_pipeline::{stage_order, StageOp as Op};

/// The makespan of one replica's step (its forward and backward packs, in run order).
pub fn makespan(timer: &mut PackTimer, forward: &[Vec<Span>], backward: &[Vec<Span>]) -> f64 {
    let stages = timer.stages() as usize;
    let times = |timer: &mut PackTimer, direction, packs: &[Vec<Span>]| -> Vec<Vec<f64>> {
        packs
            .iter()
            .map(|pack| timer.stage_seconds(direction, pack))
            .collect()
    };
    let forward_times = times(timer, Direction::Forward, forward);
    let backward_times = times(timer, Direction::Backward, backward);
    let need = forwards_needed(forward, backward);
    let symmetric = forward.len() == backward.len()
        && forward.iter().zip(backward).all(|(f, b)| same_tokens(f, b));
    let weights = |packs: &[Vec<Span>]| -> Vec<u64> {
        packs
            .iter()
            .map(|pack| {
                if symmetric {
                    1
                } else {
                    pack.iter().map(|s| u64::from(s.len)).sum()
                }
            })
            .collect()
    };
    let (forward_weights, backward_weights) = (weights(forward), weights(backward));
    let orders: Vec<Vec<Op>> = (0..stages)
        .map(|stage| {
            stage_order(
                &need,
                &forward_weights,
                &backward_weights,
                stages - 1 - stage,
            )
        })
        .collect();
    // Finish times, filled as the stages' orders advance.
    let mut forward_done = vec![vec![f64::NAN; stages]; forward.len()];
    let mut backward_done = vec![vec![f64::NAN; stages]; backward.len()];
    let mut next = vec![0usize; stages];
    let mut clock = vec![0.0f64; stages];
    let total: usize = orders.iter().map(Vec::len).sum();
    let mut done = 0;
    while done < total {
        let before = done;
        for stage in 0..stages {
            while let Some(&op) = orders[stage].get(next[stage]) {
                let ready = match op {
                    Op::Forward(_) if stage == 0 => 0.0,
                    Op::Forward(i) => forward_done[i][stage - 1],
                    Op::Backward(j) if stage + 1 < stages => backward_done[j][stage + 1],
                    Op::Backward(j) => match need[j] {
                        0 => 0.0,
                        n => forward_done[n - 1][stage],
                    },
                };
                if ready.is_nan() {
                    break;
                }
                let start = clock[stage].max(ready);
                clock[stage] = match op {
                    Op::Forward(i) => start + forward_times[i][stage],
                    Op::Backward(j) => start + backward_times[j][stage],
                };
                match op {
                    Op::Forward(i) => forward_done[i][stage] = clock[stage],
                    Op::Backward(j) => backward_done[j][stage] = clock[stage],
                }
                next[stage] += 1;
                done += 1;
            }
        }
        assert!(
            done > before,
            "eqsat: the 1F1B order deadlocks; this is a bug"
        );
    }
    clock.into_iter().fold(0.0, f64::max)
}

/// Whether two packs hold the same tokens (their spans, in canonical order, cut alike).
fn same_tokens(a: &[Span], b: &[Span]) -> bool {
    a == b
}

/// Per backward pack: how many forward packs must have run before it (one past the last
/// forward pack holding one of its tokens).
fn forwards_needed(forward: &[Vec<Span>], backward: &[Vec<Span>]) -> Vec<usize> {
    // (sample, start, end, forward position), sorted: the forward spans of each sample.
    // Bucketed by sample first (linear; a sample has a few pieces), then each bucket sorted:
    // the order a sort of the whole list gives.
    let samples = (forward.iter().flatten())
        .map(|s| s.sample as usize + 1)
        .max()
        .unwrap_or(0);
    let mut bucket = vec![0usize; samples + 1];
    for span in forward.iter().flatten() {
        bucket[span.sample as usize + 1] += 1;
    }
    for sample in 0..samples {
        bucket[sample + 1] += bucket[sample];
    }
    let mut spans = vec![(0u32, 0u32, 0u32, 0usize); bucket[samples]];
    let mut next = bucket.clone();
    for (position, pack) in forward.iter().enumerate() {
        for s in pack {
            let at = &mut next[s.sample as usize];
            spans[*at] = (s.sample, s.start, s.end(), position);
            *at += 1;
        }
    }
    for sample in 0..samples {
        spans[bucket[sample]..bucket[sample + 1]].sort_unstable();
    }
    backward
        .iter()
        .map(|pack| {
            pack.iter()
                .map(|s| {
                    // Every forward span of the sample that overlaps `s`.
                    let first = spans.partition_point(|&(sample, _, end, _)| {
                        (sample, end) <= (s.sample, s.start)
                    });
                    spans[first..]
                        .iter()
                        .take_while(|&&(sample, start, _, _)| sample == s.sample && start < s.end())
                        .map(|&(_, _, _, position)| position + 1)
                        .max()
                        .unwrap_or(0)
                })
                .max()
                .unwrap_or(0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_packs_need_the_forwards_of_their_tokens() {
        let span = |sample, start, len| Span { sample, start, len };
        let forward = vec![
            vec![span(0, 0, 100), span(1, 0, 50)],
            vec![span(0, 100, 100)],
        ];
        let backward = vec![
            vec![span(0, 100, 100)],
            vec![span(0, 0, 100), span(1, 0, 50)],
        ];
        assert_eq!(forwards_needed(&forward, &backward), vec![2, 1]);
        // A backward piece cut finer than the forward still finds its forward.
        let backward = vec![
            vec![span(0, 150, 50)],
            vec![span(0, 0, 150), span(1, 0, 50)],
        ];
        assert_eq!(forwards_needed(&forward, &backward), vec![2, 2]);
    }

    #[test]
    fn one_stage_runs_everything_back_to_back() {
        let spec = slimpack_ir::Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
        let mut timer = PackTimer::new(slimpack_machine::cost::CostModel::new(&spec), vec![0]);
        let span = |sample, start, len| Span { sample, start, len };
        let forward = vec![vec![span(0, 0, 100)], vec![span(1, 0, 300)]];
        let backward = vec![vec![span(1, 0, 300)], vec![span(0, 0, 100)]];
        let mut sum = 0.0;
        for pack in &forward {
            sum += timer.pack_seconds(Direction::Forward, pack);
        }
        for pack in &backward {
            sum += timer.pack_seconds(Direction::Backward, pack);
        }
        let total = makespan(&mut timer, &forward, &backward);
        assert!((total - sum).abs() <= 1e-12 * sum, "{total} vs {sum}");
    }
}
