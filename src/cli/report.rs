//! Human-readable reports shared by commands (stderr; `--report json` bypasses them).

use slimpack_machine::sim::Metrics;

/// Bytes as GiB with two decimals.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The simulator's figures, a few lines.
pub fn print_metrics(metrics: &Metrics, simulate_ms: f64) {
    eprintln!(
        "  simulated step {:.4} s ({:.0} tokens/s), MFU {:.1}%, ideal {:.4} s, efficiency {:.1}%",
        metrics.step_time_s,
        metrics.tokens_per_s,
        100.0 * metrics.mfu,
        metrics.ideal_step_time_s,
        100.0 * metrics.efficiency
    );
    eprintln!(
        "  DP imbalance {:.3}, PP imbalance {:.3}, bubble {:.1}%, peak memory {}{} ({:.1} ms to simulate)",
        metrics.dp_imbalance,
        metrics.pp_imbalance,
        100.0 * metrics.bubble_fraction,
        gib(metrics.peak_memory_bytes),
        match metrics.oom_device {
            Some(device) => format!(" -- OUT OF MEMORY on device {device}"),
            None => String::new(),
        },
        simulate_ms
    );
}
