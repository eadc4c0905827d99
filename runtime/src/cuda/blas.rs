//! Row-major GEMMs on cuBLAS — fp32 (SGEMM), or bf16 operands with fp32 accumulation and
//! result (`cublasGemmEx`, [`Precision::Bf16`]) — which is column-major: a row-major `[r, c]` matrix with row
//! stride `ld` is the column-major `[c, r]` matrix with leading dimension `ld`, so
//! `C = op(A)·op(B)` in row-major is `Cᵀ = op(B)ᵀ·op(A)ᵀ` in column-major — the same call with
//! the operands swapped and no data moved. Column blocks (one head of a `[rows, heads·d]`
//! tensor) are a pointer offset with the full row stride.

use std::ffi::c_void;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};

use super::device::{Gpu, OpClass};
use super::error::Result;
use super::memory::DeviceVec;
use super::precision::{operand_extent, Precision};

/// A row-major matrix operand: `rows × cols` as used (after `transposed`), stored with row
/// stride `ld` (of the stored, untransposed layout).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mat {
    pub ptr: u64,
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
    pub transposed: bool,
}

impl Mat {
    /// A dense row-major `[rows, cols]` matrix.
    pub fn new(ptr: u64, rows: usize, cols: usize) -> Mat {
        Mat {
            ptr,
            rows,
            cols,
            ld: cols,
            transposed: false,
        }
    }

    /// Its transpose (no data moved).
    pub fn t(self) -> Mat {
        Mat {
            rows: self.cols,
            cols: self.rows,
            transposed: !self.transposed,
            ..self
        }
    }
}

impl Gpu {
    /// `c = alpha · a · b + beta · c` with `c` a dense row-major `[a.rows, b.cols]` at `c`.
    pub fn gemm(&self, alpha: f32, a: Mat, b: Mat, beta: f32, c: u64) -> Result<()> {
        assert_eq!(a.cols, b.rows, "bug: GEMM shapes {a:?} · {b:?}");
        let (m, n, k) = (a.rows, b.cols, a.cols);
        if m == 0 || n == 0 {
            return Ok(());
        }
        let op = |mat: &Mat| match mat.transposed {
            false => cublasOperation_t::CUBLAS_OP_N,
            true => cublasOperation_t::CUBLAS_OP_T,
        };
        let ops = (op(&b), op(&a));
        self.profiled(OpClass::Gemm, || match self.precision {
            Precision::Fp32 => self.sgemm(ops, (n, m, k), alpha, (b, a), beta, c),
            Precision::Bf16 => self.gemm_bf16(ops, (n, m, k), alpha, (b, a), beta, c),
        })
    }

    /// [`Gpu::sgemm`] with the operands rounded to bf16 (temporaries on the worker's stream)
    /// and cuBLAS's `cublasGemmEx`: bf16 inputs, fp32 accumulation, fp32 `c`.
    fn gemm_bf16(
        &self,
        (op_b, op_a): (cublasOperation_t, cublasOperation_t),
        (n, m, k): (usize, usize, usize),
        alpha: f32,
        (b, a): (Mat, Mat),
        beta: f32,
        c: u64,
    ) -> Result<()> {
        let b16 = self.operand_to_bf16(&b)?;
        let a16 = self.operand_to_bf16(&a)?;
        // SAFETY: as `sgemm`'s; the bf16 copies have the operands' layout (same `ld`), and
        // alpha and beta are fp32 as `CUBLAS_COMPUTE_32F` requires.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                op_b,
                op_a,
                n as i32,
                m as i32,
                k as i32,
                (&alpha as *const f32).cast::<c_void>(),
                b16.ptr() as *const c_void,
                cudaDataType::CUDA_R_16BF,
                b.ld as i32,
                a16.ptr() as *const c_void,
                cudaDataType::CUDA_R_16BF,
                a.ld as i32,
                (&beta as *const f32).cast::<c_void>(),
                c as *mut c_void,
                cudaDataType::CUDA_R_32F,
                n as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }?;
        Ok(())
    }

    /// A bf16 copy of the values `mat` spans (its stored layout, same row stride).
    fn operand_to_bf16(&self, mat: &Mat) -> Result<DeviceVec<u16>> {
        let (stored_rows, stored_cols) = match mat.transposed {
            false => (mat.rows, mat.cols),
            true => (mat.cols, mat.rows),
        };
        let len = operand_extent(stored_rows, stored_cols, mat.ld);
        let copy = DeviceVec::<u16>::zeros(&self.stream, &self.meter, len)?;
        self.to_bf16(mat.ptr, copy.ptr(), len)?;
        Ok(copy)
    }

    /// cuBLAS's column-major SGEMM on this worker's stream: `c (n × m) = op_b(b) · op_a(a)`.
    fn sgemm(
        &self,
        (op_b, op_a): (cublasOperation_t, cublasOperation_t),
        (n, m, k): (usize, usize, usize),
        alpha: f32,
        (b, a): (Mat, Mat),
        beta: f32,
        c: u64,
    ) -> Result<()> {
        // SAFETY: the pointers address buffers of the shapes given (the callers' contract),
        // and the handle is bound to this worker's stream.
        unsafe {
            cudarc::cublas::result::sgemm(
                *self.blas.handle(),
                op_b,
                op_a,
                n as i32,
                m as i32,
                k as i32,
                &alpha,
                b.ptr as *const f32,
                b.ld as i32,
                a.ptr as *const f32,
                a.ld as i32,
                &beta,
                c as *mut f32,
                n as i32,
            )
        }?;
        Ok(())
    }

    /// `y = x · w` for rows `x: [rows, inp]` and `w: [inp, out]` (a projection), into `y`.
    pub fn linear(
        &self,
        x: u64,
        w: u64,
        rows: usize,
        inp: usize,
        out: usize,
        y: u64,
    ) -> Result<()> {
        self.gemm(1.0, Mat::new(x, rows, inp), Mat::new(w, inp, out), 0.0, y)
    }

    /// `dw += xᵀ · dy`: a projection's weight gradient.
    pub fn linear_weight_grad(
        &self,
        x: u64,
        dy: u64,
        rows: usize,
        inp: usize,
        out: usize,
        dw: u64,
    ) -> Result<()> {
        self.gemm(
            1.0,
            Mat::new(x, rows, inp).t(),
            Mat::new(dy, rows, out),
            1.0,
            dw,
        )
    }

    /// `dx += dy · wᵀ` (`beta` 0 to overwrite): a projection's input gradient.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_input_grad(
        &self,
        dy: u64,
        w: u64,
        rows: usize,
        inp: usize,
        out: usize,
        beta: f32,
        dx: u64,
    ) -> Result<()> {
        self.gemm(
            1.0,
            Mat::new(dy, rows, out),
            Mat::new(w, inp, out).t(),
            beta,
            dx,
        )
    }
}
