//! The kernels a worker launches: codegen's PTX module (loaded once per context from a
//! [`KernelSource`], whose table gives every kernel's parameters and grid) and the AdamW kernel
//! (CUDA C, compiled by NVRTC at load time), each behind a typed launcher ([`KernelCalls`], on
//! anything that can [`Launch`]: the [`Gpu`]).
//!
//! A launcher names its arguments; the [`Gpu`]'s [`Launch::launch_named`] checks them against
//! the kernel's entry in the table (names and types, in order — a codegen whose kernel changed
//! is a one-line error, not a silent misread) and takes the launch shape from the entry's grid;
//! [`check_launchers`] runs every launcher against a table without a GPU (on load, and in the
//! tests). Launch shapes: a block of
//! [`ROW_BLOCK`] threads per row for row kernels (a multiple of 32, as their block reductions
//! need), or [`STRIDE_BLOCK`]-thread blocks covering the work items, at most [`MAX_BLOCKS`], for
//! grid-stride kernels (whose results do not depend on the grid).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::device::{require_nvrtc, Gpu, OpClass};
use super::error::{CudaError, Result};
use super::{KernelGrid, KernelSignature, KernelSource, ParamKind};

/// Threads per block of a row kernel.
const ROW_BLOCK: u32 = 128;
/// Threads per block of a grid-stride kernel.
const STRIDE_BLOCK: u32 = 256;
/// Most blocks of a grid-stride kernel.
const MAX_BLOCKS: u64 = 65_535;

/// AdamW over a contiguous range of one tensor, as `crate::cpu::AdamW` computes it (the same
/// operations in the same order, in fp32): decay, moments, bias-corrected step.
const ADAMW_SOURCE: &str = r#"
extern "C" __global__ void slimpack_adamw(float *p, const float *g, float *m, float *v,
                                          long long n, float decay, float beta1, float beta2,
                                          float eps, float step_size, float sqrt_bias2) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float gi = g[i];
        float pi = p[i] * decay;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        pi -= step_size * mi / (sqrtf(vi) / sqrt_bias2 + eps);
        p[i] = pi; m[i] = mi; v[i] = vi;
    }
}
"#;

/// fp32 → bf16 (as its 16 bits; no CUDA header needed) for the bf16 GEMMs' operands: round to
/// nearest even, a NaN stays a quiet NaN — `super::precision::f32_to_bf16_bits`'s integer steps.
const TO_BF16_SOURCE: &str = r#"
extern "C" __global__ void slimpack_f32_to_bf16(const float *x, unsigned short *y, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned int bits = __float_as_uint(x[i]);
        if ((bits & 0x7fffffffu) > 0x7f800000u) {
            y[i] = (unsigned short)((bits >> 16) | 0x40u);
        } else {
            y[i] = (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
        }
    }
}
"#;

/// One kernel argument.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    /// A device `float*`.
    F32Ptr(u64),
    /// A device `int32_t*`.
    I32Ptr(u64),
    I64(i64),
    F32(f32),
}

impl Arg {
    fn kind(&self) -> ParamKind {
        match self {
            Arg::F32Ptr(_) => ParamKind::F32Ptr,
            Arg::I32Ptr(_) => ParamKind::I32Ptr,
            Arg::I64(_) => ParamKind::I64,
            Arg::F32(_) => ParamKind::F32,
        }
    }
}

/// The loaded kernels of one context.
pub(crate) struct Kernels {
    functions: HashMap<&'static str, (CudaFunction, KernelSignature)>,
    adamw: CudaFunction,
    to_bf16: CudaFunction,
}

impl Kernels {
    /// Loads `source`'s PTX into `context` (after checking its table has every kernel
    /// launched) and compiles AdamW and the bf16 conversion with NVRTC.
    pub fn load(context: &Arc<CudaContext>, source: &KernelSource) -> Result<Kernels> {
        source.check()?;
        check_launchers(source)?;
        let module = context.load_module(Ptx::from_src(source.ptx.clone()))?;
        let mut functions = HashMap::new();
        for &name in super::REQUIRED_KERNELS {
            let function = module
                .load_function(name)
                .map_err(|_| CudaError::MissingKernel {
                    name: name.to_string(),
                })?;
            let signature = source.signature(name).expect("checked above").clone();
            functions.insert(name, (function, signature));
        }
        require_nvrtc()?;
        let nvrtc_ptx = cudarc::nvrtc::compile_ptx(format!("{ADAMW_SOURCE}{TO_BF16_SOURCE}"))
            .map_err(|e| CudaError::Api {
                api: "NVRTC",
                message: e.to_string(),
            })?;
        let nvrtc_module = context.load_module(nvrtc_ptx)?;
        let adamw = nvrtc_module.load_function("slimpack_adamw")?;
        let to_bf16 = nvrtc_module.load_function("slimpack_f32_to_bf16")?;
        Ok(Kernels {
            functions,
            adamw,
            to_bf16,
        })
    }
}

/// Fails unless `args` are `signature`'s parameters, by name and type, in order.
fn check_args(signature: &KernelSignature, args: &[(&str, Arg)]) -> Result<()> {
    let same = signature.params.len() == args.len()
        && signature
            .params
            .iter()
            .zip(args)
            .all(|((name, kind), (arg_name, arg))| name == arg_name && *kind == arg.kind());
    if same {
        return Ok(());
    }
    let list = |items: Vec<String>| items.join(", ");
    Err(CudaError::KernelSignature {
        name: signature.name.clone(),
        table: list(
            signature
                .params
                .iter()
                .map(|(n, k)| format!("{n}: {k:?}"))
                .collect(),
        ),
        passed: list(
            args.iter()
                .map(|(n, a)| format!("{n}: {:?}", a.kind()))
                .collect(),
        ),
    })
}

/// The launch shape of `signature`'s grid for these arguments.
fn launch_config(signature: &KernelSignature, args: &[(&str, Arg)]) -> LaunchConfig {
    let value_of = |wanted: &str| {
        args.iter()
            .find_map(|(name, arg)| match (name == &wanted, arg) {
                (true, Arg::I64(value)) => Some((*value).max(0) as u64),
                _ => None,
            })
            .unwrap_or_else(|| panic!("bug: {} has no integer parameter {wanted}", signature.name))
    };
    let (grid, block) = match &signature.grid {
        KernelGrid::BlockPerRow { rows } => (value_of(rows), ROW_BLOCK),
        KernelGrid::GridStride { items, divisor } => {
            let count = items.iter().map(|n| value_of(n)).product::<u64>() / divisor.max(&1);
            let blocks = count.div_ceil(u64::from(STRIDE_BLOCK)).min(MAX_BLOCKS);
            (blocks, STRIDE_BLOCK)
        }
    };
    stride_or_rows(grid, block)
}

fn stride_or_rows(grid: u64, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid as u32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches codegen's kernels by name with named arguments: the GPU, or [`check_launchers`]'s
/// check of the launchers against a kernel table.
pub(crate) trait Launch {
    /// Launches kernel `name` with `args`, which must be its parameters in the table (by name
    /// and type, in order).
    fn launch_named(&self, name: &'static str, args: &[(&str, Arg)]) -> Result<()>;
}

impl Gpu {
    /// Launches `function` on the compute stream with `args` (nothing when the grid is empty:
    /// no rows or items).
    fn launch(&self, function: &CudaFunction, config: LaunchConfig, args: &[Arg]) -> Result<()> {
        if config.grid_dim.0 == 0 {
            return Ok(());
        }
        let mut launch = self.stream.launch_builder(function);
        for arg in args {
            match arg {
                Arg::F32Ptr(ptr) | Arg::I32Ptr(ptr) => launch.arg(ptr),
                Arg::I64(value) => launch.arg(value),
                Arg::F32(value) => launch.arg(value),
            };
        }
        // SAFETY: the arguments match the kernel's parameters in the PTX's table (checked by
        // the caller), and every launcher passes pointers to buffers of the sizes its kernel's
        // contract states.
        unsafe { launch.launch(config) }?;
        Ok(())
    }

    /// AdamW over `n` values of one tensor (`decay`: `1 − lr·wd` for a matrix, 1 for a gain).
    #[allow(clippy::too_many_arguments)]
    pub fn adamw(
        &self,
        p: u64,
        g: u64,
        m: u64,
        v: u64,
        n: usize,
        decay: f32,
        config: &crate::cpu::AdamWConfig,
        rates: &crate::cpu::StepRates,
    ) -> Result<()> {
        let args = [
            Arg::F32Ptr(p),
            Arg::F32Ptr(g),
            Arg::F32Ptr(m),
            Arg::F32Ptr(v),
            Arg::I64(n as i64),
            Arg::F32(decay),
            Arg::F32(config.beta1),
            Arg::F32(config.beta2),
            Arg::F32(config.eps),
            Arg::F32(rates.step_size),
            Arg::F32(rates.sqrt_bias2),
        ];
        let blocks = (n as u64).div_ceil(u64::from(STRIDE_BLOCK)).min(MAX_BLOCKS);
        self.launch(
            &self.kernels.adamw,
            stride_or_rows(blocks, STRIDE_BLOCK),
            &args,
        )
    }
}

impl Gpu {
    /// `y[i] = bf16(x[i])` for `n` values (`y` holds bf16 bits).
    pub fn to_bf16(&self, x: u64, y: u64, n: usize) -> Result<()> {
        let blocks = (n as u64).div_ceil(u64::from(STRIDE_BLOCK)).min(MAX_BLOCKS);
        if blocks == 0 {
            return Ok(());
        }
        let n = n as i64;
        let mut launch = self.stream.launch_builder(&self.kernels.to_bf16);
        launch.arg(&x).arg(&y).arg(&n);
        // SAFETY: `slimpack_f32_to_bf16(const float*, unsigned short*, long long)`; the caller
        // passes `n` floats at `x` and room for `n` bf16 values at `y`.
        unsafe { launch.launch(stride_or_rows(blocks, STRIDE_BLOCK)) }?;
        Ok(())
    }
}

impl Launch for Gpu {
    fn launch_named(&self, name: &'static str, args: &[(&str, Arg)]) -> Result<()> {
        let (function, signature) =
            self.kernels.functions.get(name).unwrap_or_else(|| {
                panic!("bug: kernel {name} launched but not in REQUIRED_KERNELS")
            });
        check_args(signature, args)?;
        let values: Vec<Arg> = args.iter().map(|&(_, arg)| arg).collect();
        let class = match name.starts_with("slimpack_attention") {
            true => OpClass::Attention,
            false => OpClass::Elementwise,
        };
        self.profiled(class, || {
            self.launch(function, launch_config(signature, args), &values)
        })
    }
}

/// The typed launchers of codegen's kernels, each following its kernel's contract (the
/// kernel family's file in `codegen/src/llvm/kernels/`).
pub(crate) trait KernelCalls: Launch {
    /// `y = x · inv_rms · gain` per row, `inv_rms[r] = 1 / sqrt(mean(x[r]²) + eps)`.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_fwd(
        &self,
        x: u64,
        gain: u64,
        y: u64,
        inv_rms: u64,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        self.launch_named(
            "slimpack_rmsnorm_fwd",
            &[
                ("x", Arg::F32Ptr(x)),
                ("gain", Arg::F32Ptr(gain)),
                ("y", Arg::F32Ptr(y)),
                ("inv_rms", Arg::F32Ptr(inv_rms)),
                ("rows", Arg::I64(rows as i64)),
                ("cols", Arg::I64(cols as i64)),
                ("eps", Arg::F32(eps)),
            ],
        )
    }

    /// RMSNorm's input gradient `dx` (written), then its gain's (`d_gain +=`).
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_bwd(
        &self,
        x: u64,
        gain: u64,
        inv_rms: u64,
        dy: u64,
        dx: u64,
        d_gain: u64,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let (r, c) = (Arg::I64(rows as i64), Arg::I64(cols as i64));
        self.launch_named(
            "slimpack_rmsnorm_bwd",
            &[
                ("x", Arg::F32Ptr(x)),
                ("gain", Arg::F32Ptr(gain)),
                ("inv_rms", Arg::F32Ptr(inv_rms)),
                ("dy", Arg::F32Ptr(dy)),
                ("dx", Arg::F32Ptr(dx)),
                ("rows", r),
                ("cols", c),
            ],
        )?;
        self.launch_named(
            "slimpack_rmsnorm_bwd_gain",
            &[
                ("x", Arg::F32Ptr(x)),
                ("inv_rms", Arg::F32Ptr(inv_rms)),
                ("dy", Arg::F32Ptr(dy)),
                ("d_gain", Arg::F32Ptr(d_gain)),
                ("rows", r),
                ("cols", c),
            ],
        )
    }

    /// RoPE of `tokens` rows of `heads` heads in place (forward, or its transpose for
    /// `backward`); `positions` are int32, `cos`/`sin` the host-filled tables.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        backward: bool,
        x: u64,
        cos: u64,
        sin: u64,
        positions: u64,
        tokens: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        // Both kernels name their parameters as the forward does (`x` is `dy` backward).
        let name = match backward {
            false => "slimpack_rope_fwd",
            true => "slimpack_rope_bwd",
        };
        self.launch_named(
            name,
            &[
                ("x", Arg::F32Ptr(x)),
                ("y", Arg::F32Ptr(x)),
                ("cos", Arg::F32Ptr(cos)),
                ("sin", Arg::F32Ptr(sin)),
                ("positions", Arg::I32Ptr(positions)),
                ("tokens", Arg::I64(tokens as i64)),
                ("heads", Arg::I64(heads as i64)),
                ("head_dim", Arg::I64(head_dim as i64)),
            ],
        )
    }

    /// `y = silu(gate) ∘ up` over `n` values.
    fn swiglu_fwd(&self, gate: u64, up: u64, y: u64, n: usize) -> Result<()> {
        self.launch_named(
            "slimpack_swiglu_fwd",
            &[
                ("gate", Arg::F32Ptr(gate)),
                ("up", Arg::F32Ptr(up)),
                ("y", Arg::F32Ptr(y)),
                ("n", Arg::I64(n as i64)),
            ],
        )
    }

    /// SwiGLU's gradients `d_gate`, `d_up` from `dy`.
    fn swiglu_bwd(
        &self,
        gate: u64,
        up: u64,
        dy: u64,
        d_gate: u64,
        d_up: u64,
        n: usize,
    ) -> Result<()> {
        self.launch_named(
            "slimpack_swiglu_bwd",
            &[
                ("gate", Arg::F32Ptr(gate)),
                ("up", Arg::F32Ptr(up)),
                ("dy", Arg::F32Ptr(dy)),
                ("d_gate", Arg::F32Ptr(d_gate)),
                ("d_up", Arg::F32Ptr(d_up)),
                ("n", Arg::I64(n as i64)),
            ],
        )
    }

    /// Per row the unscaled loss and, in place of the logits, their gradient times
    /// `grad_scale` (a row whose int32 target is negative gets neither).
    fn softmax_xent(
        &self,
        logits: u64,
        targets: u64,
        loss: u64,
        rows: usize,
        vocab: usize,
        grad_scale: f32,
    ) -> Result<()> {
        self.launch_named(
            "slimpack_softmax_xent",
            &[
                ("logits", Arg::F32Ptr(logits)),
                ("targets", Arg::I32Ptr(targets)),
                ("loss", Arg::F32Ptr(loss)),
                ("d_logits", Arg::F32Ptr(logits)),
                ("rows", Arg::I64(rows as i64)),
                ("vocab", Arg::I64(vocab as i64)),
                ("grad_scale", Arg::F32(grad_scale)),
            ],
        )
    }

    /// `out = a + b` over `n` values (`out` may be `a` or `b`).
    fn add(&self, a: u64, b: u64, out: u64, n: usize) -> Result<()> {
        self.launch_named(
            "slimpack_add",
            &[
                ("a", Arg::F32Ptr(a)),
                ("b", Arg::F32Ptr(b)),
                ("out", Arg::F32Ptr(out)),
                ("n", Arg::I64(n as i64)),
            ],
        )
    }

    /// The varlen causal attention of `slices` (see [`AttentionSlices`]): writes `out` and the
    /// per-head log-sum-exp `lse`.
    fn attention_fwd(&self, slices: &AttentionSlices) -> Result<()> {
        let mut args = slices.operands();
        args.extend(slices.shape_args(false));
        self.launch_named("slimpack_attention_fwd", &args)
    }

    /// The backward of [`KernelCalls::attention_fwd`]: writes `dq` (`bwd_dq`), and adds into
    /// `d_keys` and `d_values` at every pool row a query sees (`bwd_dkv`: the sample's dK/dV
    /// accumulators, prefix included).
    fn attention_bwd(&self, slices: &AttentionSlices, grads: &AttentionGrads) -> Result<()> {
        let mut args = slices.operands();
        args.extend([
            ("d_out", Arg::F32Ptr(grads.d_out)),
            ("dq", Arg::F32Ptr(grads.dq)),
        ]);
        args.extend(slices.shape_args(false));
        self.launch_named("slimpack_attention_bwd_dq", &args)?;
        let mut args = slices.operands();
        args.extend([
            ("d_out", Arg::F32Ptr(grads.d_out)),
            ("dk", Arg::F32Ptr(grads.d_keys)),
            ("dv", Arg::F32Ptr(grads.d_values)),
        ]);
        args.extend(slices.shape_args(true));
        self.launch_named("slimpack_attention_bwd_dkv", &args)
    }
}

impl<T: Launch> KernelCalls for T {}

/// A [`Launch`] that launches nothing: it checks each call against the table.
struct TableCheck<'a>(&'a KernelSource);

impl Launch for TableCheck<'_> {
    fn launch_named(&self, name: &'static str, args: &[(&str, Arg)]) -> Result<()> {
        let signature = self
            .0
            .signature(name)
            .ok_or_else(|| CudaError::MissingKernel {
                name: name.to_string(),
            })?;
        check_args(signature, args)?;
        launch_config(signature, args);
        Ok(())
    }
}

/// Fails unless every launcher passes its kernel's parameters as `source`'s table lists them
/// (checked once when the kernels are loaded, and by the tests without a GPU).
pub fn check_launchers(source: &KernelSource) -> Result<()> {
    let check = TableCheck(source);
    check.rmsnorm_fwd(0, 0, 0, 0, 1, 32, 1e-5)?;
    check.rmsnorm_bwd(0, 0, 0, 0, 0, 0, 1, 32)?;
    check.rope(false, 0, 0, 0, 0, 1, 1, 2)?;
    check.rope(true, 0, 0, 0, 0, 1, 1, 2)?;
    check.swiglu_fwd(0, 0, 0, 1)?;
    check.swiglu_bwd(0, 0, 0, 0, 0, 1)?;
    check.softmax_xent(0, 0, 0, 1, 2, 1.0)?;
    check.add(0, 0, 0, 1)?;
    let slices = AttentionSlices {
        q: 0,
        keys: 0,
        values: 0,
        out: 0,
        lse: 0,
        positions: 0,
        cu_seqlens_q: 0,
        kv_starts: 0,
        slices: 1,
        total_q: 1,
        kv_rows: 1,
        heads: 1,
        kv_heads: 1,
        head_dim: 2,
    };
    check.attention_fwd(&slices)?;
    let grads = AttentionGrads {
        d_out: 0,
        dq: 0,
        d_keys: 0,
        d_values: 0,
    };
    check.attention_bwd(&slices, &grads)
}

/// Slices of one sample-contiguous K/V pool for one attention launch (device pointers,
/// row-major), as codegen's attention kernels take them: `q`/`out` `[total_q, heads·head_dim]`
/// slice after slice as `cu_seqlens_q` (int32, `slices + 1`) delimits them, `positions`
/// (int32, `total_q`) each query's position in its sample, `keys`/`values` pools of `kv_rows`
/// rows where slice `s`'s sample's position `p` is row `kv_starts[s] + p` (int32), `lse`
/// `[total_q, heads]`.
pub(crate) struct AttentionSlices {
    pub q: u64,
    pub keys: u64,
    pub values: u64,
    pub out: u64,
    pub lse: u64,
    pub positions: u64,
    pub cu_seqlens_q: u64,
    pub kv_starts: u64,
    pub slices: usize,
    pub total_q: usize,
    /// Rows of the K/V pools.
    pub kv_rows: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// The gradients of [`AttentionSlices`]: `d_out` and `dq` shaped like `q`, `d_keys` and
/// `d_values` like the pools.
pub(crate) struct AttentionGrads {
    pub d_out: u64,
    pub dq: u64,
    pub d_keys: u64,
    pub d_values: u64,
}

impl AttentionSlices {
    /// `q`, `k`, `v`, `out`, `lse`: the operands every attention kernel starts with.
    fn operands(&self) -> Vec<(&'static str, Arg)> {
        vec![
            ("q", Arg::F32Ptr(self.q)),
            ("k", Arg::F32Ptr(self.keys)),
            ("v", Arg::F32Ptr(self.values)),
            ("out", Arg::F32Ptr(self.out)),
            ("lse", Arg::F32Ptr(self.lse)),
        ]
    }

    /// The layout and shape arguments that follow the buffers (`kv_rows` for `bwd_dkv`, whose
    /// work items are the pool's rows).
    fn shape_args(&self, with_kv_rows: bool) -> Vec<(&'static str, Arg)> {
        let mut args = vec![
            ("positions", Arg::I32Ptr(self.positions)),
            ("cu_seqlens_q", Arg::I32Ptr(self.cu_seqlens_q)),
            ("kv_starts", Arg::I32Ptr(self.kv_starts)),
            ("slices", Arg::I64(self.slices as i64)),
            ("total_q", Arg::I64(self.total_q as i64)),
        ];
        if with_kv_rows {
            args.push(("kv_rows", Arg::I64(self.kv_rows as i64)));
        }
        args.extend([
            ("heads", Arg::I64(self.heads as i64)),
            ("kv_heads", Arg::I64(self.kv_heads as i64)),
            ("head_dim", Arg::I64(self.head_dim as i64)),
            ("scale", Arg::F32(1.0 / (self.head_dim as f32).sqrt())),
        ]);
        args
    }
}
