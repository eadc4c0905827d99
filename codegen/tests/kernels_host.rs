//! Every GPU kernel, built by the same builder for the host and run with the grid turned into
//! loops (`kernels::host`), against the CPU backend's own ops (`slimpack_runtime::cpu::numerics`)
//! on random fp32 inputs.
//!
//! The metric, per output tensor: `max_i |kernel_i − cpu_i| / max_i |cpu_i|` (the largest error
//! relative to the tensor's largest magnitude), which must be at most 1e-6. Tensors the kernels
//! accumulate into (`d_gain`, `dk`, `dv`) start non-zero and are compared as increments
//! (`after − before`), so an overwrite instead of an add fails. Each kernel runs under its
//! default launch and under odd ones (one warp per row, more blocks than rows, a grid-stride
//! grid much smaller than the work). Run with `--nocapture` to see the measured errors.
#![cfg(feature = "llvm")]

use slimpack_codegen::llvm::kernels::host::{with_host_kernels, HostKernels, KernelArg};
use slimpack_codegen::llvm::kernels::{kernel, Grid, LaunchShape};
use slimpack_runtime::cpu::numerics::{
    attention_backward, attention_forward, cross_entropy_backward, cross_entropy_softmax,
    rmsnorm_backward, rmsnorm_forward, rope_backward, rope_forward, swiglu_backward,
    swiglu_forward, SliceAttention,
};
use slimpack_runtime::cpu::ModelConfig;

/// Largest relative error allowed, in the metric of the module comment.
const TOLERANCE: f64 = 1e-6;

/// SplitMix64: a small deterministic generator for the inputs.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self, low: f32, high: f32) -> f32 {
        let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        low + (high - low) * unit
    }

    fn floats(&mut self, n: usize, low: f32, high: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(low, high)).collect()
    }
}

/// `max |actual − expected| / max |expected|`.
fn relative_error(actual: &[f32], expected: &[f32]) -> f64 {
    assert_eq!(actual.len(), expected.len(), "tensors of different sizes");
    let mut largest_error = 0.0f64;
    let mut largest_value = 0.0f64;
    for (&a, &e) in actual.iter().zip(expected) {
        assert!(a.is_finite(), "non-finite kernel output {a}");
        largest_error = largest_error.max((f64::from(a) - f64::from(e)).abs());
        largest_value = largest_value.max(f64::from(e).abs());
    }
    assert!(largest_value > 0.0, "an all-zero reference checks nothing");
    largest_error / largest_value
}

/// Checks `actual` against `expected` within [`TOLERANCE`] and reports the error.
fn check(what: &str, shape: LaunchShape, actual: &[f32], expected: &[f32]) {
    let error = relative_error(actual, expected);
    eprintln!(
        "{what} (grid {} x block {}): max relative error {error:.2e}",
        shape.grid, shape.block
    );
    assert!(error <= TOLERANCE, "{what}: relative error {error:e}");
}

/// `after − before`, elementwise: what a kernel added.
fn increment(after: &[f32], before: &[f32]) -> Vec<f32> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

/// The shapes kernel `name` is checked under: its default launch, and odd ones that must give
/// the same values (one warp per row and a block past the rows; a grid-stride grid of 3 blocks
/// of 32 threads, so every thread loops).
fn shapes(name: &str, value_of: impl Fn(&str) -> u64) -> Vec<LaunchShape> {
    let spec = kernel(name).unwrap();
    let default = spec.default_launch(&value_of);
    let odd = match spec.grid {
        Grid::BlockPerRow { rows } => LaunchShape {
            grid: value_of(rows) as u32 + 1,
            block: 32,
        },
        Grid::GridStride { .. } => LaunchShape { grid: 3, block: 32 },
    };
    let two_warps = LaunchShape {
        block: 64,
        ..default
    };
    match spec.grid {
        Grid::BlockPerRow { .. } => vec![default, two_warps, odd],
        Grid::GridStride { .. } => vec![default, odd],
    }
}

fn launch(kernels: &HostKernels, name: &str, shape: LaunchShape, args: &mut [KernelArg<'_>]) {
    // SAFETY: every test sizes its buffers by the kernel's contract for the counts it passes.
    unsafe { kernels.launch(name, shape, args) }.unwrap();
}

fn run(test: impl FnOnce(&HostKernels)) {
    with_host_kernels(test).unwrap();
}

#[test]
fn rmsnorm_matches_the_cpu_backend() {
    let (rows, cols) = (7usize, 100usize);
    let mut random = Random(1);
    let x = random.floats(rows * cols, -2.0, 2.0);
    let gain = random.floats(cols, 0.5, 1.5);
    let dy = random.floats(rows * cols, -1.0, 1.0);
    let d_gain_before = random.floats(cols, -1.0, 1.0);
    let eps = ModelConfig::NORM_EPS;

    let (y_cpu, inv_rms_cpu) = rmsnorm_forward(&x, &gain, eps);
    let mut d_gain_cpu = d_gain_before.clone();
    let dx_cpu = rmsnorm_backward(&x, &gain, &inv_rms_cpu, &dy, &mut d_gain_cpu);
    let d_gain_added = increment(&d_gain_cpu, &d_gain_before);

    let counts = |name: &str| match name {
        "rows" => rows as u64,
        "cols" => cols as u64,
        _ => unreachable!("{name}"),
    };
    run(|kernels| {
        for shape in shapes("slimpack_rmsnorm_fwd", counts) {
            let (mut y, mut inv_rms) = (vec![0.0; rows * cols], vec![0.0; rows]);
            let mut args = [
                KernelArg::F32s(&x),
                KernelArg::F32s(&gain),
                KernelArg::F32sMut(&mut y),
                KernelArg::F32sMut(&mut inv_rms),
                KernelArg::I64(rows as i64),
                KernelArg::I64(cols as i64),
                KernelArg::F32(eps),
            ];
            launch(kernels, "slimpack_rmsnorm_fwd", shape, &mut args);
            check("rmsnorm_fwd y", shape, &y, &y_cpu);
            check("rmsnorm_fwd inv_rms", shape, &inv_rms, &inv_rms_cpu);
        }
        for shape in shapes("slimpack_rmsnorm_bwd", counts) {
            let mut dx = vec![0.0; rows * cols];
            let mut args = [
                KernelArg::F32s(&x),
                KernelArg::F32s(&gain),
                KernelArg::F32s(&inv_rms_cpu),
                KernelArg::F32s(&dy),
                KernelArg::F32sMut(&mut dx),
                KernelArg::I64(rows as i64),
                KernelArg::I64(cols as i64),
            ];
            launch(kernels, "slimpack_rmsnorm_bwd", shape, &mut args);
            check("rmsnorm_bwd dx", shape, &dx, &dx_cpu);
        }
        for shape in shapes("slimpack_rmsnorm_bwd_gain", counts) {
            let mut d_gain = d_gain_before.clone();
            let mut args = [
                KernelArg::F32s(&x),
                KernelArg::F32s(&inv_rms_cpu),
                KernelArg::F32s(&dy),
                KernelArg::F32sMut(&mut d_gain),
                KernelArg::I64(rows as i64),
                KernelArg::I64(cols as i64),
            ];
            launch(kernels, "slimpack_rmsnorm_bwd_gain", shape, &mut args);
            let added = increment(&d_gain, &d_gain_before);
            check("rmsnorm_bwd_gain d_gain", shape, &added, &d_gain_added);
        }
    });
}

#[test]
fn rope_matches_the_cpu_backend() {
    let (heads, head_dim) = (3usize, 8usize);
    let width = heads * head_dim;
    let half = head_dim / 2;
    // Two slices at other offsets of their samples, and a sample's start.
    let positions: Vec<usize> = (5..9).chain(0..3).chain(40..42).collect();
    let tokens = positions.len();
    let theta = ModelConfig::ROPE_THETA;
    let table_rows = positions.iter().max().unwrap() + 1;
    let angle = |p: usize, i: usize| p as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
    let mut cos = Vec::with_capacity(table_rows * half);
    let mut sin = Vec::with_capacity(table_rows * half);
    for p in 0..table_rows {
        for i in 0..half {
            cos.push(angle(p, i).cos() as f32);
            sin.push(angle(p, i).sin() as f32);
        }
    }
    let positions_i32: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
    let mut random = Random(2);
    let x = random.floats(tokens * width, -2.0, 2.0);

    let counts = |name: &str| match name {
        "tokens" => tokens as u64,
        "heads" => heads as u64,
        "head_dim" => head_dim as u64,
        _ => unreachable!("{name}"),
    };
    run(|kernels| {
        for (name, cpu) in [
            (
                "slimpack_rope_fwd",
                rope_forward as fn(&mut [f32], _, _, &[usize], _),
            ),
            ("slimpack_rope_bwd", rope_backward),
        ] {
            let mut expected = x.clone();
            cpu(&mut expected, width, head_dim, &positions, theta);
            for shape in shapes(name, counts) {
                let mut y = vec![0.0; tokens * width];
                let mut args = [
                    KernelArg::F32s(&x),
                    KernelArg::F32sMut(&mut y),
                    KernelArg::F32s(&cos),
                    KernelArg::F32s(&sin),
                    KernelArg::I32s(&positions_i32),
                    KernelArg::I64(tokens as i64),
                    KernelArg::I64(heads as i64),
                    KernelArg::I64(head_dim as i64),
                ];
                launch(kernels, name, shape, &mut args);
                check(name, shape, &y, &expected);
            }
        }
    });
}

#[test]
fn swiglu_matches_the_cpu_backend() {
    let n = 1000;
    let mut random = Random(3);
    let gate = random.floats(n, -6.0, 6.0);
    let up = random.floats(n, -2.0, 2.0);
    let dy = random.floats(n, -1.0, 1.0);
    let y_cpu = swiglu_forward(&gate, &up);
    let (d_gate_cpu, d_up_cpu) = swiglu_backward(&gate, &up, &dy);

    let counts = |_: &str| n as u64;
    run(|kernels| {
        for shape in shapes("slimpack_swiglu_fwd", counts) {
            let mut y = vec![0.0; n];
            let mut args = [
                KernelArg::F32s(&gate),
                KernelArg::F32s(&up),
                KernelArg::F32sMut(&mut y),
                KernelArg::I64(n as i64),
            ];
            launch(kernels, "slimpack_swiglu_fwd", shape, &mut args);
            check("swiglu_fwd y", shape, &y, &y_cpu);
        }
        for shape in shapes("slimpack_swiglu_bwd", counts) {
            let (mut d_gate, mut d_up) = (vec![0.0; n], vec![0.0; n]);
            let mut args = [
                KernelArg::F32s(&gate),
                KernelArg::F32s(&up),
                KernelArg::F32s(&dy),
                KernelArg::F32sMut(&mut d_gate),
                KernelArg::F32sMut(&mut d_up),
                KernelArg::I64(n as i64),
            ];
            launch(kernels, "slimpack_swiglu_bwd", shape, &mut args);
            check("swiglu_bwd d_gate", shape, &d_gate, &d_gate_cpu);
            check("swiglu_bwd d_up", shape, &d_up, &d_up_cpu);
        }
    });
}

#[test]
fn softmax_cross_entropy_matches_the_cpu_backend() {
    let (rows, vocab) = (6usize, 300usize);
    let mut random = Random(4);
    let logits = random.floats(rows * vocab, -4.0, 4.0);
    // Rows 1 and 5 have no target (a sample's last token).
    let targets: [i32; 6] = [3, -1, 299, 0, 150, -1];
    let grad_scale = 1.0 / 4.0;
    let cpu_targets: Vec<Option<u32>> = targets.iter().map(|&t| u32::try_from(t).ok()).collect();
    let mut d_logits_cpu = logits.clone();
    // Row by row, for each row's loss (the CPU backend returns their sum).
    let mut loss_cpu = Vec::with_capacity(rows);
    for (row, target) in d_logits_cpu.chunks_exact_mut(vocab).zip(&cpu_targets) {
        loss_cpu.push(cross_entropy_softmax(row, vocab, std::slice::from_ref(target)) as f32);
    }
    cross_entropy_backward(&mut d_logits_cpu, vocab, &cpu_targets, grad_scale);

    let counts = |name: &str| match name {
        "rows" => rows as u64,
        _ => unreachable!("{name}"),
    };
    run(|kernels| {
        for shape in shapes("slimpack_softmax_xent", counts) {
            let (mut loss, mut d_logits) = (vec![f32::NAN; rows], vec![0.0; rows * vocab]);
            let mut args = [
                KernelArg::F32s(&logits),
                KernelArg::I32s(&targets),
                KernelArg::F32sMut(&mut loss),
                KernelArg::F32sMut(&mut d_logits),
                KernelArg::I64(rows as i64),
                KernelArg::I64(vocab as i64),
                KernelArg::F32(grad_scale),
            ];
            launch(kernels, "slimpack_softmax_xent", shape, &mut args);
            assert_eq!((loss[1], loss[5]), (0.0, 0.0), "rows without a target");
            check("softmax_xent loss", shape, &loss, &loss_cpu);
            check("softmax_xent d_logits", shape, &d_logits, &d_logits_cpu);
        }
    });
}

#[test]
fn add_and_scale_match_plain_arithmetic() {
    let n = 777;
    let mut random = Random(5);
    let a = random.floats(n, -3.0, 3.0);
    let b = random.floats(n, -3.0, 3.0);
    let alpha = 0.37;
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let scaled: Vec<f32> = a.iter().map(|x| alpha * x).collect();
    let counts = |_: &str| n as u64;
    run(|kernels| {
        for shape in shapes("slimpack_add", counts) {
            let mut out = vec![0.0; n];
            let mut args = [
                KernelArg::F32s(&a),
                KernelArg::F32s(&b),
                KernelArg::F32sMut(&mut out),
                KernelArg::I64(n as i64),
            ];
            launch(kernels, "slimpack_add", shape, &mut args);
            assert_eq!(out, sum, "add");
        }
        for shape in shapes("slimpack_scale", counts) {
            let mut out = vec![0.0; n];
            let mut args = [
                KernelArg::F32s(&a),
                KernelArg::F32sMut(&mut out),
                KernelArg::F32(alpha),
                KernelArg::I64(n as i64),
            ];
            launch(kernels, "slimpack_scale", shape, &mut args);
            assert_eq!(out, scaled, "scale");
        }
    });
}

/// One slice of a pack: `len` tokens of `sample` from position `offset`.
struct Slice {
    sample: usize,
    offset: usize,
    len: usize,
}

/// A pack of slices over samples whose K/V live in one pool, sample after sample.
struct AttentionCase {
    config: ModelConfig,
    slices: Vec<Slice>,
    /// First pool row of each sample.
    sample_starts: Vec<usize>,
    pool_rows: usize,
}

impl AttentionCase {
    fn new(heads: usize, kv_heads: usize, head_dim: usize) -> AttentionCase {
        let config = ModelConfig {
            layers: 1,
            hidden: heads * head_dim,
            heads,
            kv_heads,
            head_dim,
            ffn: 1,
            vocab: 1,
            tied_embeddings: false,
            norm_eps: ModelConfig::NORM_EPS,
            rope_theta: ModelConfig::ROPE_THETA,
        };
        let sample_lengths = [40, 25, 110];
        let mut sample_starts = Vec::new();
        let mut pool_rows = 0;
        for length in sample_lengths {
            sample_starts.push(pool_rows);
            pool_rows += length;
        }
        // Continuation slices (prefix > 0), a whole sample, a slice longer than the CPU
        // backend's query block, and two slices of one sample sharing its K/V rows (the later
        // one sees the earlier one's tokens). Samples 0 and 2 have rows no query sees.
        let slices = vec![
            Slice {
                sample: 0,
                offset: 12,
                len: 9,
            },
            Slice {
                sample: 1,
                offset: 0,
                len: 25,
            },
            Slice {
                sample: 2,
                offset: 30,
                len: 70,
            },
            Slice {
                sample: 0,
                offset: 21,
                len: 6,
            },
        ];
        AttentionCase {
            config,
            slices,
            sample_starts,
            pool_rows,
        }
    }

    fn total_q(&self) -> usize {
        self.slices.iter().map(|slice| slice.len).sum()
    }

    /// Query rows of each slice in the pack.
    fn slice_rows(&self) -> Vec<std::ops::Range<usize>> {
        let mut start = 0;
        self.slices
            .iter()
            .map(|slice| {
                start += slice.len;
                start - slice.len..start
            })
            .collect()
    }

    fn positions(&self) -> Vec<i32> {
        let slices = self.slices.iter();
        slices
            .flat_map(|slice| (slice.offset..slice.offset + slice.len).map(|p| p as i32))
            .collect()
    }

    fn cu_seqlens_q(&self) -> Vec<i32> {
        let mut cu = vec![0];
        cu.extend(self.slice_rows().iter().map(|rows| rows.end as i32));
        cu
    }

    fn kv_starts(&self) -> Vec<i32> {
        let starts = self.slices.iter();
        starts
            .map(|slice| self.sample_starts[slice.sample] as i32)
            .collect()
    }

    /// Pool rows of slice `slice`'s sample from position 0 to its last token.
    fn key_rows(&self, slice: &Slice) -> std::ops::Range<usize> {
        let start = self.sample_starts[slice.sample];
        start..start + slice.offset + slice.len
    }

    fn counts(&self, name: &str) -> u64 {
        match name {
            "total_q" => self.total_q() as u64,
            "heads" => self.config.heads as u64,
            "kv_rows" => self.pool_rows as u64,
            "kv_heads" => self.config.kv_heads as u64,
            _ => unreachable!("{name}"),
        }
    }
}

/// The inputs and the CPU backend's outputs of one attention case.
struct AttentionData {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
    dk_before: Vec<f32>,
    dv_before: Vec<f32>,
    out: Vec<f32>,
    lse: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

impl AttentionData {
    /// Random inputs, and the CPU backend's forward and backward slice by slice.
    fn new(case: &AttentionCase, seed: u64) -> AttentionData {
        let config = &case.config;
        let (qw, kvw, heads) = (config.q_width(), config.kv_width(), config.heads);
        let total_q = case.total_q();
        let mut random = Random(seed);
        let q = random.floats(total_q * qw, -2.0, 2.0);
        let k = random.floats(case.pool_rows * kvw, -2.0, 2.0);
        let v = random.floats(case.pool_rows * kvw, -1.0, 1.0);
        let d_out = random.floats(total_q * qw, -1.0, 1.0);
        let dk_before = random.floats(case.pool_rows * kvw, -1.0, 1.0);
        let dv_before = random.floats(case.pool_rows * kvw, -1.0, 1.0);
        let mut out = vec![0.0; total_q * qw];
        let mut lse = vec![0.0; total_q * heads];
        let mut dq = vec![0.0; total_q * qw];
        let (mut dk, mut dv) = (dk_before.clone(), dv_before.clone());
        for (slice, rows) in case.slices.iter().zip(case.slice_rows()) {
            let positions: Vec<usize> = (slice.offset..slice.offset + slice.len).collect();
            let keys = case.key_rows(slice);
            let kv = keys.start * kvw..keys.end * kvw;
            let (q_range, lse_range) = (
                rows.start * qw..rows.end * qw,
                rows.start * heads..rows.end * heads,
            );
            let input = SliceAttention {
                positions: &positions,
                q: &q[q_range.clone()],
                keys: &k[kv.clone()],
                values: &v[kv.clone()],
            };
            attention_forward(
                config,
                &input,
                &mut out[q_range.clone()],
                &mut lse[lse_range.clone()],
            );
            attention_backward(
                config,
                &input,
                &out[q_range.clone()],
                &lse[lse_range],
                &d_out[q_range.clone()],
                &mut dq[q_range],
                &mut dk[kv.clone()],
                &mut dv[kv],
            );
        }
        AttentionData {
            q,
            k,
            v,
            d_out,
            dk_before,
            dv_before,
            out,
            lse,
            dq,
            dk,
            dv,
        }
    }
}

fn check_attention(heads: usize, kv_heads: usize, head_dim: usize, seed: u64) {
    let case = AttentionCase::new(heads, kv_heads, head_dim);
    let data = AttentionData::new(&case, seed);
    let config = &case.config;
    let total_q = case.total_q();
    let (positions, cu_seqlens_q, kv_starts) =
        (case.positions(), case.cu_seqlens_q(), case.kv_starts());
    let scale = 1.0 / (head_dim as f32).sqrt();
    let shape_args = |slices: usize| {
        [
            KernelArg::I64(slices as i64),
            KernelArg::I64(total_q as i64),
            KernelArg::I64(heads as i64),
            KernelArg::I64(kv_heads as i64),
            KernelArg::I64(head_dim as i64),
            KernelArg::F32(scale),
        ]
    };
    let label = format!("heads {heads}, kv_heads {kv_heads}, head_dim {head_dim}");
    let dk_added = increment(&data.dk, &data.dk_before);
    let dv_added = increment(&data.dv, &data.dv_before);
    run(|kernels| {
        for shape in shapes("slimpack_attention_fwd", |name| case.counts(name)) {
            let mut out = vec![0.0; total_q * config.q_width()];
            let mut lse = vec![0.0; total_q * heads];
            let mut args = vec![
                KernelArg::F32s(&data.q),
                KernelArg::F32s(&data.k),
                KernelArg::F32s(&data.v),
                KernelArg::F32sMut(&mut out),
                KernelArg::F32sMut(&mut lse),
                KernelArg::I32s(&positions),
                KernelArg::I32s(&cu_seqlens_q),
                KernelArg::I32s(&kv_starts),
            ];
            args.extend(shape_args(case.slices.len()));
            launch(kernels, "slimpack_attention_fwd", shape, &mut args);
            check(
                &format!("attention_fwd out ({label})"),
                shape,
                &out,
                &data.out,
            );
            check(
                &format!("attention_fwd lse ({label})"),
                shape,
                &lse,
                &data.lse,
            );
        }
        for shape in shapes("slimpack_attention_bwd_dq", |name| case.counts(name)) {
            let mut dq = vec![0.0; total_q * config.q_width()];
            let mut args = vec![
                KernelArg::F32s(&data.q),
                KernelArg::F32s(&data.k),
                KernelArg::F32s(&data.v),
                KernelArg::F32s(&data.out),
                KernelArg::F32s(&data.lse),
                KernelArg::F32s(&data.d_out),
                KernelArg::F32sMut(&mut dq),
                KernelArg::I32s(&positions),
                KernelArg::I32s(&cu_seqlens_q),
                KernelArg::I32s(&kv_starts),
            ];
            args.extend(shape_args(case.slices.len()));
            launch(kernels, "slimpack_attention_bwd_dq", shape, &mut args);
            check(
                &format!("attention_bwd_dq dq ({label})"),
                shape,
                &dq,
                &data.dq,
            );
        }
        for shape in shapes("slimpack_attention_bwd_dkv", |name| case.counts(name)) {
            let (mut dk, mut dv) = (data.dk_before.clone(), data.dv_before.clone());
            let mut args = vec![
                KernelArg::F32s(&data.q),
                KernelArg::F32s(&data.k),
                KernelArg::F32s(&data.v),
                KernelArg::F32s(&data.out),
                KernelArg::F32s(&data.lse),
                KernelArg::F32s(&data.d_out),
                KernelArg::F32sMut(&mut dk),
                KernelArg::F32sMut(&mut dv),
                KernelArg::I32s(&positions),
                KernelArg::I32s(&cu_seqlens_q),
                KernelArg::I32s(&kv_starts),
            ];
            let mut shape_args = shape_args(case.slices.len()).into_iter();
            args.extend(shape_args.by_ref().take(2));
            args.push(KernelArg::I64(case.pool_rows as i64));
            args.extend(shape_args);
            launch(kernels, "slimpack_attention_bwd_dkv", shape, &mut args);
            let (dk_kernel, dv_kernel) = (
                increment(&dk, &data.dk_before),
                increment(&dv, &data.dv_before),
            );
            check(
                &format!("attention_bwd_dkv dk ({label})"),
                shape,
                &dk_kernel,
                &dk_added,
            );
            check(
                &format!("attention_bwd_dkv dv ({label})"),
                shape,
                &dv_kernel,
                &dv_added,
            );
            assert_unseen_rows_untouched(&case, &dk, &data.dk_before);
            assert_unseen_rows_untouched(&case, &dv, &data.dv_before);
        }
    });
}

/// Pool rows no query sees keep their gradients bit for bit.
fn assert_unseen_rows_untouched(case: &AttentionCase, after: &[f32], before: &[f32]) {
    let kvw = case.config.kv_width();
    let mut seen = vec![false; case.pool_rows];
    for slice in &case.slices {
        seen[case.key_rows(slice)].fill(true);
    }
    assert!(seen.contains(&false), "the case has no unseen rows");
    for (row, seen) in seen.iter().enumerate() {
        if !seen {
            let range = row * kvw..(row + 1) * kvw;
            assert_eq!(
                after[range.clone()],
                before[range],
                "unseen row {row} changed"
            );
        }
    }
}

#[test]
fn attention_matches_the_cpu_backend_with_grouped_query_heads() {
    // The `tiny` model's attention shape.
    check_attention(4, 2, 32, 6);
}

#[test]
fn attention_matches_the_cpu_backend_with_one_kv_head_per_query_head() {
    check_attention(3, 3, 8, 7);
}

#[test]
fn attention_matches_the_cpu_backend_with_one_kv_head_and_heads_wider_than_a_dkv_pass() {
    // head_dim 80: `bwd_dkv` sums 64 columns, then 16.
    check_attention(4, 1, 80, 8);
}

#[test]
fn a_malformed_launch_is_an_error() {
    run(|kernels| {
        let x = [0.0f32; 4];
        let shape = LaunchShape { grid: 1, block: 32 };
        // SAFETY: refused before the kernel runs.
        let wrong_count =
            unsafe { kernels.launch("slimpack_scale", shape, &mut [KernelArg::F32s(&x)]) };
        assert!(wrong_count
            .unwrap_err()
            .to_string()
            .contains("takes 4 arguments"));
        let mut out = [0.0f32; 4];
        let mut wrong_kind = [
            KernelArg::F32s(&x),
            KernelArg::F32sMut(&mut out),
            KernelArg::I64(2),
            KernelArg::I64(4),
        ];
        // SAFETY: as above.
        let error = unsafe { kernels.launch("slimpack_scale", shape, &mut wrong_kind) };
        assert!(error.unwrap_err().to_string().contains("parameter alpha"));
        let mut rows = [
            KernelArg::F32s(&x),
            KernelArg::F32s(&x),
            KernelArg::F32sMut(&mut out),
            KernelArg::F32s(&x),
            KernelArg::I64(1),
            KernelArg::I64(4),
            KernelArg::F32(1e-5),
        ];
        let odd_block = LaunchShape { grid: 1, block: 48 };
        // SAFETY: as above.
        let error = unsafe { kernels.launch("slimpack_rmsnorm_fwd", odd_block, &mut rows) };
        assert!(error.unwrap_err().to_string().contains("multiple of 32"));
        // SAFETY: as above.
        let unknown = unsafe { kernels.launch("slimpack_gelu", shape, &mut []) };
        assert!(unknown.unwrap_err().to_string().contains("no such kernel"));
    });
}
