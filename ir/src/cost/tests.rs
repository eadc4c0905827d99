//! End-to-end checks of the machine model against hand counts and practitioners' figures.

use super::*;

fn spec(model: &str, cluster: &str, parallel: &str) -> Spec {
    Spec::from_presets(model, cluster, parallel).unwrap()
}

#[test]
fn print_mfu() {
    for tp in [1u32, 2, 4, 8] {
        let s = spec("llama-7b", "h100-sxm", &format!("tp={tp},pp=1,dp={}", 8 / tp));
        let m = CostModel::new(&s);
        let f = m.pack_time(0, &[(4096, 0)], Direction::Forward, 1);
        let b = m.pack_time(0, &[(4096, 0)], Direction::Backward, 1);
        let t = f.critical_path_s() + b.critical_path_s();
        let mfu = m.model_flops(4096, 0) / f64::from(tp) / t / s.cluster.gpu.peak_flops;
        eprintln!("tp={tp} mfu={mfu:.4} fwd={f:?} bwd={b:?}");
    }
}
