//! The fuzz targets' bodies: each reader of user input, fed arbitrary bytes. Each function
//! must return (an error is fine) and never panic, whatever the bytes; a panic is a bug.
//!
//! `fuzz/` (cargo-fuzz, outside the workspace) drives them with libFuzzer; `tests/fuzz_smoke.rs`
//! runs each on the committed corpus (`fuzz/corpus/<target>/`) and on seeded mutations of it in
//! every `cargo test`.

use slimpack_ir::batch::{BatchConfig, Dataset, DatasetFormat, LoadOptions};
use slimpack_ir::spec::{ConfigFile, ParallelSpec};

/// A fuzz target: its name and the function that takes one input.
pub type Target = (&'static str, fn(&[u8]));

/// The fuzz targets by name (the names of `fuzz/fuzz_targets/*.rs` and of the corpus folders).
pub const TARGETS: [Target; 5] = [
    ("ir_text", ir_text),
    ("schedule_json", schedule_json),
    ("lengths", lengths),
    ("config_toml", config_toml),
    ("pipeline", pipeline),
];

/// The IR text parser, then the verifier and the printer on whatever parses.
pub fn ir_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(ir) = slimpack_ir::text::parse(text, "fuzz") {
        if slimpack_ir::verify::verify(&ir).is_ok() {
            let printed = slimpack_ir::text::print(&ir);
            let again = slimpack_ir::text::parse(&printed, "printed")
                .expect("printed IR parses back (bug)");
            assert_eq!(
                slimpack_ir::text::print(&again),
                printed,
                "printing is not a fixpoint (bug)"
            );
        }
    }
}

/// The schedule JSON reader and its conversion to a step (with the verifier).
pub fn schedule_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(document) = slimpack_codegen::schedule_json::parse(text) {
        let _ = slimpack_codegen::schedule_json::to_ir(&document);
    }
}

/// The length-file readers: the first byte picks text, JSON array or JSONL lengths (or
/// detection from the content), the rest is the file.
pub fn lengths(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let format = match selector % 4 {
        0 => DatasetFormat::Auto,
        1 => DatasetFormat::Text,
        2 => DatasetFormat::Json,
        _ => DatasetFormat::Jsonl,
    };
    let options = LoadOptions {
        format,
        ..LoadOptions::default()
    };
    if let Ok(dataset) = Dataset::parse("fuzz", bytes, &options) {
        assert!(
            !dataset.lengths.is_empty() && dataset.lengths.iter().all(|&l| l > 0),
            "a loaded dataset holds at least one non-empty document (bug)"
        );
    }
}

/// A TOML job file: the spec tables and the `[batch]` table's options (nothing is drawn).
pub fn config_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = ConfigFile::parse(text, "fuzz.toml") else {
        return;
    };
    if let Some(table) = config.batch {
        if let Ok(batch) = BatchConfig::from_table(table, "fuzz.toml") {
            let _ = batch.batch_options();
            if let Some(synthetic) = &batch.synthetic {
                let _ = synthetic.to_synthetic(0);
            }
        }
    }
}

/// The pipeline-string parser, each pass built from its options, and the `--parallel` layout.
pub fn pipeline(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(entries) = slimpack_passes::parse_pipeline(text) {
        for entry in &entries {
            let _ = entry.create();
        }
        let rendered = slimpack_passes::render_pipeline(&entries);
        let again =
            slimpack_passes::parse_pipeline(&rendered).expect("a rendered pipeline parses (bug)");
        assert_eq!(slimpack_passes::render_pipeline(&again), rendered);
    }
    let _ = text.parse::<ParallelSpec>();
}
