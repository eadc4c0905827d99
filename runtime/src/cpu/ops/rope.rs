//! Rotary position embedding (RoPE), Llama's "rotate half" convention.
//!
//! In each head of `head_dim` values, pair `(i, i + head_dim/2)` of a token at position `p` is
//! rotated by the angle `p · theta^(-2i/head_dim)`. The angle is computed in f64 from the absolute
//! position, so a token gets the same rotation whichever slice it is computed in. The backward
//! is the rotation by the opposite angle (a rotation's transpose).

/// Rotates every head of every row of `x` (rows of `width = heads · head_dim`) in place;
/// `positions[r]` is row `r`'s position in its sample.
pub fn rope_forward(x: &mut [f32], width: usize, head_dim: usize, positions: &[usize], theta: f64) {
    rotate(x, width, head_dim, positions, theta, 1.0);
}

/// Backward of [`rope_forward`]: turns the gradient of the rotated values into the gradient of
/// the unrotated ones, in place.
pub fn rope_backward(
    dx: &mut [f32],
    width: usize,
    head_dim: usize,
    positions: &[usize],
    theta: f64,
) {
    rotate(dx, width, head_dim, positions, theta, -1.0);
}

fn rotate(
    x: &mut [f32],
    width: usize,
    head_dim: usize,
    positions: &[usize],
    theta: f64,
    sign: f64,
) {
    let half = head_dim / 2;
    let mut cos = vec![0.0f32; half];
    let mut sin = vec![0.0f32; half];
    for (row, &position) in x.chunks_exact_mut(width).zip(positions) {
        for i in 0..half {
            let angle = position as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
            cos[i] = angle.cos() as f32;
            sin[i] = (sign * angle.sin()) as f32;
        }
        for head in row.chunks_exact_mut(head_dim) {
            let (lo, hi) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * cos[i] - b * sin[i];
                hi[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_undoes_forward_and_position_zero_is_identity() {
        let original: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let positions = [0, 37];
        let mut x = original.clone();
        rope_forward(&mut x, 8, 4, &positions, 10_000.0);
        assert_eq!(x[..8], original[..8]);
        assert_ne!(x[8..], original[8..]);
        rope_backward(&mut x, 8, 4, &positions, 10_000.0);
        for (a, b) in x.iter().zip(&original) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}
