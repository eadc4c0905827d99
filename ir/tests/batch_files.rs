//! Batch inputs read from files: each format from the committed fixtures in
//! `tests/fixtures/batch/`, the errors bad files produce, a `[batch]` config resolved against
//! its directory, and (when the shared data is checked out beside the project) the real
//! Wikipedia length list.

use std::path::{Path, PathBuf};

use slimpack_ir::batch::{
    BatchConfig, BatchOptions, Dataset, DatasetFormat, LoadOptions, Tokenizer,
};
use slimpack_ir::IrError;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/batch")
        .join(name)
}

fn load(name: &str, options: &LoadOptions) -> Result<Dataset, IrError> {
    Dataset::load(&fixture(name), options)
}

fn load_error(name: &str) -> String {
    let message = load(name, &LoadOptions::default()).unwrap_err().to_string();
    assert!(!message.contains('\n'), "errors are one line: {message}");
    message
}

const FIXTURE_LENGTHS: [u32; 5] = [350, 1200, 87, 9000, 4];

#[test]
fn every_length_format_reads_the_same_lengths() {
    for name in ["lengths.txt", "lengths.json", "lengths.jsonl"] {
        let dataset = load(name, &LoadOptions::default()).unwrap();
        assert_eq!(dataset.lengths, FIXTURE_LENGTHS, "{name}");
        assert!(dataset.name.ends_with(name), "{}", dataset.name);
        assert_eq!(dataset.total_tokens(), 10_641);
    }
}

#[test]
fn explicit_formats_match_detection() {
    for (name, format) in [
        ("lengths.txt", DatasetFormat::Text),
        ("lengths.json", DatasetFormat::Json),
        ("lengths.jsonl", DatasetFormat::Jsonl),
    ] {
        let options = LoadOptions {
            format,
            ..LoadOptions::default()
        };
        assert_eq!(
            load(name, &options).unwrap().lengths,
            FIXTURE_LENGTHS,
            "{name}"
        );
    }
}

#[test]
fn corpus_is_tokenized_offline() {
    let dataset = load("corpus.jsonl", &LoadOptions::default()).unwrap();
    // "hello world" and the pangram are 2 and 10 tokens in cl100k_base (OpenAI's tiktoken).
    assert_eq!(dataset.lengths[..2], [2, 10]);
    assert_eq!(dataset.len(), 3);
    let o200k = LoadOptions {
        format: DatasetFormat::Corpus,
        tokenizer: Some(Tokenizer::O200kBase),
        ..LoadOptions::default()
    };
    assert_eq!(load("corpus.jsonl", &o200k).unwrap().lengths[..2], [2, 10]);
}

#[test]
fn bad_files_name_file_line_and_value() {
    let negative = load_error("negative.txt");
    assert!(
        negative.contains("negative.txt: line 3: length -87 is negative"),
        "{negative}"
    );
    let missing = load_error("missing_field.jsonl");
    assert!(
        missing.contains("missing_field.jsonl: line 2: no length field (looked for 'length', 'len', 'num_tokens', 'n_tokens'"),
        "{missing}"
    );
    let malformed = load_error("malformed.json");
    assert!(
        malformed.contains("malformed.json: line 2, column 2: malformed JSON: expected `,` or `]`"),
        "{malformed}"
    );
    let absent = load("absent.txt", &LoadOptions::default()).unwrap_err();
    assert!(matches!(absent, IrError::Io { .. }), "{absent:?}");
    assert!(absent.to_string().contains("absent.txt"), "{absent}");
}

#[test]
fn config_resolves_the_file_against_its_directory() {
    let text = std::fs::read_to_string(fixture("job.toml")).unwrap();
    let mut document: toml::Table = text.parse().unwrap();
    let Some(toml::Value::Table(table)) = document.remove("batch") else {
        panic!("job.toml has no [batch] table");
    };
    let config = BatchConfig::from_table(table, "job.toml").unwrap();
    let (dataset, options) = config.resolve(&fixture("")).unwrap();
    assert_eq!(dataset.lengths, FIXTURE_LENGTHS);
    assert_eq!(
        options,
        BatchOptions {
            context: Some(1000),
            global_batch: None,
            global_batch_tokens: Some(2000),
            seed: 7
        }
    );
    let batch = dataset.global_batch(&options).unwrap();
    assert!(batch.tokens() >= 2000);
    assert!(batch.samples.iter().all(|sample| sample.len <= 1000));
}

#[test]
fn wikipedia_lengths_when_shared_data_is_present() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/wikipedia.lengths.txt");
    if !path.exists() {
        return;
    }
    let dataset = Dataset::load(&path, &LoadOptions::default()).unwrap();
    assert_eq!(dataset.len(), 1_000_000);
    let options = BatchOptions {
        context: Some(4096),
        ..BatchOptions::default()
    };
    let batch = dataset.global_batch(&options).unwrap();
    assert_eq!(batch.documents, 1_000_000);
    assert_eq!(
        batch.tokens(),
        dataset.total_tokens(),
        "cutting loses no token"
    );
    // 4.4% of the documents are longer than 4K (shared data, `wikipedia.lengths.txt`).
    let longer = dataset.lengths.iter().filter(|&&l| l > 4096).count();
    assert_eq!(batch.documents_cut, longer);
    assert!((40_000..50_000).contains(&longer), "{longer}");
}
