//! SwiGLU's element-wise part: `a = silu(gate) ∘ up`, with `silu(g) = g · σ(g)`.

use super::exp::exp;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `silu(gate) ∘ up`.
pub fn swiglu_forward(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| g * sigmoid(g) * u)
        .collect()
}

/// Backward of [`swiglu_forward`]: returns `(d_gate, d_up)`, using
/// `silu'(g) = σ(g) · (1 + g · (1 − σ(g)))`.
pub fn swiglu_backward(gate: &[f32], up: &[f32], d_out: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut d_gate = Vec::with_capacity(gate.len());
    let mut d_up = Vec::with_capacity(gate.len());
    for ((&g, &u), &d) in gate.iter().zip(up).zip(d_out) {
        let s = sigmoid(g);
        d_gate.push(d * u * s * (1.0 + g * (1.0 - s)));
        d_up.push(d * g * s);
    }
    (d_gate, d_up)
}
