//! Strided single-precision GEMM: the one place the CPU backend multiplies matrices.
//!
//! A bounds-checked wrapper over `matrixmultiply::sgemm`. Operands are views ([`Mat`], [`MatMut`])
//! of buffers with explicit row and column strides, so transposes and per-head column blocks are
//! expressed without copies. `matrixmultiply` runs single-threaded here (its `threading` feature
//! is off), so results are deterministic.

/// A read-only strided matrix view.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

/// A mutable strided matrix view.
pub(crate) struct MatMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

/// Last index touched by a `rows x cols` view with the given strides, plus one.
fn extent(rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * row_stride + (cols - 1) * col_stride + 1
    }
}

impl<'a> Mat<'a> {
    /// The dense row-major `rows x cols` matrix `data`.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "bug: matrix buffer of the wrong size"
        );
        Self::strided(data, rows, cols, cols, 1)
    }

    /// Columns `[first_col, first_col + cols)` of a row-major matrix whose rows are `width` long.
    pub fn columns(data: &'a [f32], width: usize, first_col: usize, cols: usize) -> Self {
        assert!(
            first_col + cols <= width,
            "bug: column block outside the matrix"
        );
        let rows = data.len() / width;
        Self::strided(&data[first_col..], rows, cols, width, 1)
    }

    fn strided(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        assert!(
            extent(rows, cols, row_stride, col_stride) <= data.len(),
            "bug: matrix view outside its buffer"
        );
        Mat {
            data,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// The transposed view.
    pub fn t(self) -> Self {
        Mat {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }
}

impl<'a> MatMut<'a> {
    /// The dense row-major `rows x cols` matrix `data`.
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "bug: matrix buffer of the wrong size"
        );
        MatMut {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// Columns `[first_col, first_col + cols)` of a row-major matrix whose rows are `width` long.
    pub fn columns(data: &'a mut [f32], width: usize, first_col: usize, cols: usize) -> Self {
        assert!(
            first_col + cols <= width,
            "bug: column block outside the matrix"
        );
        let rows = data.len() / width;
        let data = &mut data[first_col..];
        assert!(
            extent(rows, cols, width, 1) <= data.len(),
            "bug: matrix view outside its buffer"
        );
        MatMut {
            data,
            rows,
            cols,
            row_stride: width,
            col_stride: 1,
        }
    }
}

/// `c = alpha · a · b + beta · c` (with `beta == 0`, `c`'s old contents are ignored).
pub(crate) fn gemm(alpha: f32, a: Mat<'_>, b: Mat<'_>, beta: f32, c: MatMut<'_>) {
    let _timer = crate::cpu::profile::gemm_scope();
    assert!(
        a.cols == b.rows && a.rows == c.rows && b.cols == c.cols,
        "bug: gemm shapes {}x{} · {}x{} -> {}x{}",
        a.rows,
        a.cols,
        b.rows,
        b.cols,
        c.rows,
        c.cols
    );
    if c.rows == 0 || c.cols == 0 {
        return;
    }
    if a.cols == 0 {
        // Nothing to contract: only the beta scaling remains, which sgemm may skip.
        for row in 0..c.rows {
            for col in 0..c.cols {
                let value = &mut c.data[row * c.row_stride + col * c.col_stride];
                *value = if beta == 0.0 { 0.0 } else { beta * *value };
            }
        }
        return;
    }
    // SAFETY: the constructors checked that every index each view can touch lies inside its
    // buffer; `c` is borrowed mutably, so it cannot alias `a` or `b`.
    unsafe {
        matrixmultiply::sgemm(
            a.rows,
            a.cols,
            b.cols,
            alpha,
            a.data.as_ptr(),
            a.row_stride as isize,
            a.col_stride as isize,
            b.data.as_ptr(),
            b.row_stride as isize,
            b.col_stride as isize,
            beta,
            c.data.as_mut_ptr(),
            c.row_stride as isize,
            c.col_stride as isize,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_and_column_block_views_multiply_like_loops() {
        // a is 2x3; b is 3x4 and its columns 1..3 form a 3x2 matrix; c starts at 100.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [
            1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0,
        ];
        let mut c = [100.0; 4];
        gemm(
            1.0,
            Mat::new(&a, 2, 3),
            Mat::columns(&b, 4, 1, 2),
            1.0,
            MatMut::new(&mut c, 2, 2),
        );
        // Row 0: 1·2+2·6+3·10 = 44, 1·3+2·7+3·11 = 50; row 1: 4·2+5·6+6·10 = 98, 4·3+5·7+6·11 = 113.
        assert_eq!(c, [144.0, 150.0, 198.0, 213.0]);
        let mut d = [0.0; 9];
        gemm(
            1.0,
            Mat::new(&a, 2, 3).t(),
            Mat::new(&a, 2, 3),
            0.0,
            MatMut::new(&mut d, 3, 3),
        );
        // aᵀa, entry (0, 2) = 1·3 + 4·6.
        assert_eq!(d[2], 27.0);
        assert_eq!(d[6], 27.0);
    }
}
