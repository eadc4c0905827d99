//! Epoch planning keeps memory bounded by a few steps: with the counting allocator installed
//! (as the `slimpack` binary installs it), planning four times as many steps of the same size
//! peaks at about the same bytes.

use slimpack::ir::batch::{BatchOptions, Dataset};
use slimpack::ir::Spec;
use slimpack::plan::{plan_epoch, PlanOptions};
use slimpack::runtime::cpu::{CountingAllocator, MemoryMeter};
use slimpack::tune::autotune::TuneOptions;
use slimpack::tune::strategy::{self, Choices};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// Peak bytes of planning `steps` steps on this thread (the dataset is allocated before).
fn peak_of_planning(dataset: &Dataset, steps: usize) -> i64 {
    let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,cp=1,pp=2,dp=4").unwrap();
    let options = BatchOptions {
        global_batch_tokens: Some(400_000),
        context: Some(32768),
        ..BatchOptions::default()
    };
    let choices = Choices::fixed(spec.model.recompute);
    let plan = PlanOptions {
        strategy: strategy::lookup("megatron").unwrap(),
        choices: &choices,
        tune: TuneOptions::default(),
        max_steps: Some(steps),
        threads: Some(1),
    };
    let meter = MemoryMeter::new().expect("a free meter");
    let _attached = meter.attach();
    let mut planned = 0;
    let summary = plan_epoch(&spec, dataset, &options, &plan, &mut |step| {
        assert_eq!(step.step, planned + 1, "steps arrive in order");
        planned += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(summary.steps, steps);
    meter.peak_bytes()
}

#[test]
fn memory_does_not_grow_with_the_number_of_steps() {
    assert!(CountingAllocator::installed());
    // 20,000 documents of 50..2,000 tokens: about 50 steps of 400K tokens.
    let lengths: Vec<u32> = (0..20_000u32).map(|i| 50 + (i * 7919) % 1950).collect();
    let dataset = Dataset {
        name: "synthetic".into(),
        lengths,
        empty: 0,
    };
    let few = peak_of_planning(&dataset, 4);
    let many = peak_of_planning(&dataset, 16);
    assert!(few > 0);
    assert!(
        (many as f64) < 1.5 * few as f64,
        "16 steps peak at {many} bytes, 4 steps at {few}"
    );
}
