//! Softmax cross-entropy of logits against next-token targets.
//!
//! Rows without a target (a sample's last token) contribute neither loss nor gradient.

/// Sum over rows with a target of `logsumexp(z) − z[target]`, accumulated in f64.
pub(crate) fn cross_entropy_sum(logits: &[f32], vocab: usize, targets: &[Option<u32>]) -> f64 {
    let mut total = 0.0f64;
    for (row, target) in logits.chunks_exact(vocab).zip(targets) {
        if let Some(target) = target {
            total += f64::from(logsumexp(row) - row[*target as usize]);
        }
    }
    total
}

/// Turns `logits` in place into `d(scale · Σ loss)/d logits = scale · (softmax(z) − onehot)`,
/// and zero on rows without a target.
pub(crate) fn cross_entropy_backward(
    logits: &mut [f32],
    vocab: usize,
    targets: &[Option<u32>],
    scale: f32,
) {
    for (row, target) in logits.chunks_exact_mut(vocab).zip(targets) {
        let Some(target) = target else {
            row.fill(0.0);
            continue;
        };
        let lse = logsumexp(row);
        for value in row.iter_mut() {
            *value = scale * (*value - lse).exp();
        }
        row[*target as usize] -= scale;
    }
}

fn logsumexp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + row.iter().map(|&z| (z - max).exp()).sum::<f32>().ln()
}
