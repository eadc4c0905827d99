//! How long the simulator takes on a production-sized step: a 2,048-sample global batch of
//! llama-7b on 256 H100s (tp=8, pp=4, dp=8), lognormal lengths (median 2,048, capped at 32K),
//! 256 samples per replica in 1F1B order, one sample per pack (16K compute tasks) and four
//! samples per pack. `cargo bench -p slimpack-runtime` prints the time per `simulate` call.

use criterion::{criterion_group, criterion_main, Criterion};
use slimpack_ir::batch::{Distribution, Synthetic};
use slimpack_ir::spec::Spec;
use slimpack_ir::step::StepIr;
use slimpack_machine::cost::CostModel;
use slimpack_machine::sim::fixture::{one_f_one_b, ReplicaPlan};
use slimpack_machine::sim::{simulate, svg, trace};

const SAMPLES: usize = 2048;
const DP: usize = 8;

fn step(samples_per_pack: usize) -> StepIr {
    let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=4,dp=8").unwrap();
    let lengths = Synthetic {
        distribution: Distribution::LogNormal {
            median: 2048.0,
            sigma: 1.0,
        },
        count: SAMPLES,
        max: 32768,
        seed: 7,
    }
    .generate()
    .unwrap()
    .lengths;
    let replicas: Vec<ReplicaPlan> = (0..DP)
        .map(|rank| {
            let mine: Vec<u32> = lengths.iter().skip(rank).step_by(DP).copied().collect();
            ReplicaPlan {
                ranks: vec![rank as u32],
                packs: mine.chunks(samples_per_pack).map(<[u32]>::to_vec).collect(),
            }
        })
        .collect();
    one_f_one_b(spec, &replicas)
}

fn bench(c: &mut Criterion) {
    for samples_per_pack in [1, 4] {
        let ir = step(samples_per_pack);
        let cost = CostModel::new(&ir.spec);
        let name =
            format!("simulate llama-7b 256 devices 2048 samples {samples_per_pack} per pack");
        c.bench_function(&name, |b| b.iter(|| simulate(&ir, &cost).unwrap()));
        if samples_per_pack == 1 {
            let result = simulate(&ir, &cost).unwrap();
            let mut pictures = c.benchmark_group("pictures of that step");
            pictures.sample_size(20);
            pictures.bench_function("chrome trace", |b| b.iter(|| trace::chrome_trace(&result)));
            pictures.bench_function("svg timeline", |b| b.iter(|| svg::timeline(&result)));
            pictures.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
