//! RMSNorm: `y = x / sqrt(mean(x²) + eps) · gain`, per row.

/// Normalises each row of `x` (rows of `gain.len()` values); returns `(y, inv_rms)` where
/// `inv_rms[r] = 1 / sqrt(mean(x[r]²) + eps)` is what the backward needs besides `x`.
pub fn rmsnorm_forward(x: &[f32], gain: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let width = gain.len();
    let mut y = vec![0.0; x.len()];
    let mut inv_rms = Vec::with_capacity(x.len() / width);
    for (row, out) in x.chunks_exact(width).zip(y.chunks_exact_mut(width)) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
        let inv = 1.0 / (mean_square + eps).sqrt();
        for ((o, &v), &g) in out.iter_mut().zip(row).zip(gain) {
            *o = v * inv * g;
        }
        inv_rms.push(inv);
    }
    (y, inv_rms)
}

/// Backward of [`rmsnorm_forward`]: returns `dx`, adds the gain's gradient into `d_gain`.
///
/// With `x̂ = x · inv_rms`: `d_gain += Σ_rows dy ∘ x̂` and
/// `dx = inv_rms · (dx̂ − x̂ · mean(dx̂ ∘ x̂))` where `dx̂ = dy ∘ gain`. The sum over rows runs in
/// f64: it spans every token of a pack (or a sample), and an f32 running sum over tens of
/// thousands of rows would drift by more than the differential tests' tolerance.
pub fn rmsnorm_backward(
    x: &[f32],
    gain: &[f32],
    inv_rms: &[f32],
    dy: &[f32],
    d_gain: &mut [f32],
) -> Vec<f32> {
    let width = gain.len();
    let mut dx = vec![0.0; x.len()];
    let mut gain_sum = vec![0.0f64; width];
    let rows = x.chunks_exact(width).zip(dy.chunks_exact(width));
    for (((row, d_row), out), &inv) in rows.zip(dx.chunks_exact_mut(width)).zip(inv_rms) {
        let mut dot = 0.0;
        for i in 0..width {
            let x_hat = row[i] * inv;
            gain_sum[i] += f64::from(d_row[i] * x_hat);
            dot += d_row[i] * gain[i] * x_hat;
        }
        let mean_dot = dot / width as f32;
        for i in 0..width {
            out[i] = inv * (d_row[i] * gain[i] - row[i] * inv * mean_dot);
        }
    }
    for (d, sum) in d_gain.iter_mut().zip(gain_sum) {
        *d += sum as f32;
    }
    dx
}
