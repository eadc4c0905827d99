//! Softmax cross-entropy of logits against next-token targets.
//!
//! Rows without a target (a sample's last token) contribute neither loss nor gradient. The
//! forward turns the logits into their softmax in place, and the backward keeps that softmax for
//! its gradient (as Megatron-LM's cross-entropy does: the fp32 softmax is the loss's saved
//! tensor), so the logits are computed once.

use super::exp::{exp, exp_shifted};

/// Sum over rows with a target of `logsumexp(z) − z[target]` (accumulated in f64), turning
/// `logits` into `softmax(logits)` row by row.
pub fn cross_entropy_softmax(logits: &mut [f32], vocab: usize, targets: &[Option<u32>]) -> f64 {
    let mut total = 0.0f64;
    for (row, target) in logits.chunks_exact_mut(vocab).zip(targets) {
        let lse = logsumexp(row);
        if let Some(target) = target {
            total += f64::from(lse - row[*target as usize]);
        }
        exp_shifted(row, lse);
    }
    total
}

/// Turns the softmax `probs` in place into `d(scale · Σ loss)/d logits = scale · (probs −
/// onehot)`, and zero on rows without a target.
pub fn cross_entropy_backward(
    probs: &mut [f32],
    vocab: usize,
    targets: &[Option<u32>],
    scale: f32,
) {
    for (row, target) in probs.chunks_exact_mut(vocab).zip(targets) {
        let Some(target) = target else {
            row.fill(0.0);
            continue;
        };
        row.iter_mut().for_each(|p| *p *= scale);
        row[*target as usize] -= scale;
    }
}

fn logsumexp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + row.iter().map(|&z| exp(z - max)).sum::<f32>().ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_softmax_and_gradient_by_hand() {
        // Row 0: logits (0, ln 3), target 1: softmax (1/4, 3/4), loss ln(4/3).
        let mut values = [0.0, 3.0f32.ln(), 5.0, 5.0];
        let targets = [Some(1), None];
        let loss = cross_entropy_softmax(&mut values, 2, &targets);
        assert!((loss - (4.0f64 / 3.0).ln()).abs() < 1e-6, "{loss}");
        assert!((values[0] - 0.25).abs() < 1e-6 && (values[1] - 0.75).abs() < 1e-6);
        cross_entropy_backward(&mut values, 2, &targets, 2.0);
        assert!((values[0] - 0.5).abs() < 1e-6 && (values[1] + 0.5).abs() < 1e-6);
        assert_eq!(&values[2..], &[0.0, 0.0]);
    }
}
