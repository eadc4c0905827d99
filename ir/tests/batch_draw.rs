//! Properties of global batches over random datasets and options: cutting loses and duplicates
//! no token, pieces fit the context, a batch holds each document at most once, and a batch
//! stops at the first document that reaches its budget.

use proptest::prelude::*;
use std::collections::BTreeMap;

use slimpack_ir::batch::{Batch, BatchOptions, Dataset};

/// Tokens of each document of the batch, summed over its pieces, with the piece numbers seen.
fn documents(batch: &Batch) -> BTreeMap<u64, (u64, Vec<u32>)> {
    let mut documents: BTreeMap<u64, (u64, Vec<u32>)> = BTreeMap::new();
    for sample in &batch.samples {
        let entry = documents.entry(sample.doc).or_default();
        entry.0 += u64::from(sample.len);
        entry.1.push(sample.piece);
    }
    documents
}

fn options_strategy() -> impl Strategy<Value = BatchOptions> {
    let budget = prop_oneof![
        Just((None, None)),
        (1usize..40).prop_map(|samples| (Some(samples), None)),
        (1u64..20_000).prop_map(|tokens| (None, Some(tokens))),
    ];
    (proptest::option::of(1u32..3000), budget, any::<u64>()).prop_map(
        |(context, (global_batch, global_batch_tokens), seed)| BatchOptions {
            context,
            global_batch,
            global_batch_tokens,
            seed,
        },
    )
}

proptest! {
    #[test]
    fn batches_keep_every_token_of_the_documents_they_draw(
        lengths in proptest::collection::vec(1u32..10_000, 1..60),
        options in options_strategy(),
        count in 1usize..6,
    ) {
        let dataset = Dataset { name: "random".into(), lengths, empty: 0 };
        let batches = dataset.global_batches(&options, count).unwrap();
        prop_assert_eq!(batches.len(), count);
        for batch in &batches {
            let documents = documents(batch);
            prop_assert_eq!(documents.len(), batch.documents, "a document appears twice");
            let mut cut = 0;
            for (&doc, (tokens, pieces)) in &documents {
                prop_assert_eq!(*tokens, u64::from(dataset.lengths[doc as usize]));
                prop_assert_eq!(pieces.clone(), (0..pieces.len() as u32).collect::<Vec<_>>());
                cut += usize::from(pieces.len() > 1);
            }
            prop_assert_eq!(cut, batch.documents_cut);
            if let Some(context) = options.context {
                prop_assert!(batch.samples.iter().all(|s| s.len <= context));
            }
            check_budget(&dataset, &options, batch)?;
        }
        prop_assert_eq!(batches.clone(), dataset.global_batches(&options, count).unwrap());
    }
}

/// The batch meets its budget (or holds the whole dataset), and without its last document it
/// would not have.
fn check_budget(
    dataset: &Dataset,
    options: &BatchOptions,
    batch: &Batch,
) -> Result<(), TestCaseError> {
    let Some(last) = batch.samples.last() else {
        return Err(TestCaseError::fail("empty batch"));
    };
    let last_samples = batch.samples.iter().filter(|s| s.doc == last.doc).count();
    let last_tokens = u64::from(dataset.lengths[last.doc as usize]);
    let whole = batch.documents == dataset.len();
    if let Some(samples) = options.global_batch {
        prop_assert!(whole || batch.samples.len() >= samples);
        prop_assert!(batch.samples.len() - last_samples < samples);
    } else if let Some(tokens) = options.global_batch_tokens {
        prop_assert!(whole || batch.tokens() >= tokens);
        prop_assert!(batch.tokens() - last_tokens < tokens);
    } else {
        prop_assert!(whole);
    }
    Ok(())
}
