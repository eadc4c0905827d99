//! Dense projections `y = x · W` over a block of token rows, with their backward.

use super::gemm::{gemm, Mat, MatMut};

/// `x · w` for `x: [rows, in_dim]`, `w: [in_dim, out_dim]`.
pub(crate) fn linear(x: &[f32], w: &[f32], in_dim: usize, out_dim: usize) -> Vec<f32> {
    let rows = x.len() / in_dim;
    let mut y = vec![0.0; rows * out_dim];
    gemm(
        1.0,
        Mat::new(x, rows, in_dim),
        Mat::new(w, in_dim, out_dim),
        0.0,
        MatMut::new(&mut y, rows, out_dim),
    );
    y
}

/// `dx += dy · wᵀ` (the input gradient; accumulating lets several projections of one input add up).
pub(crate) fn linear_input_grad_add(
    dy: &[f32],
    w: &[f32],
    in_dim: usize,
    out_dim: usize,
    dx: &mut [f32],
) {
    let rows = dy.len() / out_dim;
    gemm(
        1.0,
        Mat::new(dy, rows, out_dim),
        Mat::new(w, in_dim, out_dim).t(),
        1.0,
        MatMut::new(dx, rows, in_dim),
    );
}

/// `dw += xᵀ · dy`.
pub(crate) fn linear_weight_grad(
    x: &[f32],
    dy: &[f32],
    in_dim: usize,
    out_dim: usize,
    dw: &mut [f32],
) {
    let rows = x.len() / in_dim;
    gemm(
        1.0,
        Mat::new(x, rows, in_dim).t(),
        Mat::new(dy, rows, out_dim),
        1.0,
        MatMut::new(dw, in_dim, out_dim),
    );
}
