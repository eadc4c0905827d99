//! Human-readable reports shared by commands (stderr; `--report json` bypasses them).

use slimpack_machine::sim::Metrics;

/// Bytes as GiB with two decimals.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The simulator's figures, a few lines, then where the step goes.
pub fn print_metrics(metrics: &Metrics, simulate_ms: f64) {
    eprintln!(
        "  simulated step {:.4} s ({:.0} tokens/s), MFU {:.1}%, efficiency {:.1}% (useful ideal {:.4} s), schedule efficiency {:.1}% (floor {:.4} s), executed efficiency {:.1}% (ideal {:.4} s)",
        metrics.step_time_s,
        metrics.tokens_per_s,
        100.0 * metrics.mfu,
        100.0 * metrics.efficiency,
        metrics.useful_ideal_step_time_s,
        100.0 * metrics.schedule_efficiency,
        metrics.floor_step_time_s,
        100.0 * metrics.executed_efficiency,
        metrics.ideal_step_time_s,
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
    print_losses(metrics);
}

/// "Where the step goes": one line per non-zero cause, seconds and share of the step.
fn print_losses(metrics: &Metrics) {
    eprintln!("  where the step goes (device-averaged):");
    let step = metrics.step_time_s;
    for (what, seconds) in metrics.losses.entries() {
        if seconds.abs() < 1e-9 * step.max(1e-12) {
            continue;
        }
        let share = if step > 0.0 {
            100.0 * seconds / step
        } else {
            0.0
        };
        eprintln!("    {what:<22} {seconds:>10.4} s {share:>6.1}%");
    }
}
