//! Global batches: the samples of one training step, drawn from a dataset.
//!
//! With no budget, a batch is the whole dataset in file order (and every one of `n` batches is
//! that same batch). With a budget (`global_batch` samples or `global_batch_tokens` tokens),
//! documents are drawn whole in the order of a seeded permutation (see [`super::permutation`]):
//! a batch takes documents until its budget is reached or exceeded, so the last document may
//! overshoot it (by at most one document's samples or tokens); nothing is cut to fit. Each
//! document is then cut to the context (see [`super::cut`]); the sample budget counts samples
//! after cutting.
//!
//! Consecutive batches continue down the same permutation, without replacement. When it runs
//! out, the next epoch's permutation (seed + 1, then seed + 2, ...) continues the stream. A batch
//! never holds a document twice: a document the new epoch offers while it is already in the
//! current batch is deferred to the start of the next batch. A batch whose budget exceeds the
//! whole dataset therefore stops when it holds every document: it is the whole dataset, in
//! permuted order.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use super::cut::cut_document;
use super::options::Budget;
use super::permutation::permutation;
use super::{batch_error, BatchOptions, Dataset, Sample, MAX_SAMPLES, MAX_TOKENS};
use crate::error::Result;

/// The samples of one training step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Samples in draw order; the pieces of a cut document are consecutive.
    pub samples: Vec<Sample>,
    /// Source documents drawn.
    pub documents: usize,
    /// Documents longer than the context, cut into several samples.
    pub documents_cut: usize,
    /// Zero-length documents of the source, skipped ([`Dataset::empty`]).
    #[serde(default)]
    pub documents_empty: u64,
    /// The context the documents were cut to, if any.
    pub context: Option<u32>,
    /// The dataset the batch was drawn from ([`Dataset::name`]).
    pub source: String,
}

impl Batch {
    /// A batch of one uncut document per length, in order (for tests and embedders that already
    /// hold their lengths), as if cut to `context`.
    pub fn from_lengths(lengths: &[u32], context: Option<u32>, source: &str) -> Batch {
        Batch {
            samples: lengths
                .iter()
                .enumerate()
                .map(|(doc, &len)| Sample {
                    len,
                    doc: doc as u64,
                    piece: 0,
                })
                .collect(),
            documents: lengths.len(),
            documents_cut: 0,
            documents_empty: 0,
            context,
            source: source.to_string(),
        }
    }

    /// Tokens over all samples.
    pub fn tokens(&self) -> u64 {
        self.samples
            .iter()
            .map(|sample| u64::from(sample.len))
            .sum()
    }
}

impl Dataset {
    /// The first global batch under `options`: `global_batches(options, 1)[0]`.
    pub fn global_batch(&self, options: &BatchOptions) -> Result<Batch> {
        let mut batches = self.global_batches(options, 1)?;
        Ok(batches.remove(0))
    }

    /// `count` consecutive global batches under `options` (see the module documentation for
    /// the draw order). Fails on invalid options or an empty dataset or a zero length.
    pub fn global_batches(&self, options: &BatchOptions, count: usize) -> Result<Vec<Batch>> {
        options.validate()?;
        self.check_drawable()?;
        let mut draw = Draw::new(self, options);
        (0..count).map(|_| draw.next_batch()).collect()
    }

    /// The global batches under `options`, drawn one at a time: the same batches as
    /// [`Dataset::global_batches`], for a caller that holds only the current one (an epoch
    /// plan over a large dataset).
    pub fn batch_stream(&self, options: &BatchOptions) -> Result<BatchStream<'_>> {
        options.validate()?;
        self.check_drawable()?;
        Ok(BatchStream {
            draw: Draw::new(self, options),
        })
    }

    /// Rejects what the readers never produce but a hand-built dataset could hold.
    fn check_drawable(&self) -> Result<()> {
        if self.lengths.is_empty() {
            return Err(batch_error(
                &self.name,
                "no documents: cannot draw a batch from an empty dataset",
            ));
        }
        if let Some(doc) = self.lengths.iter().position(|&length| length == 0) {
            return Err(batch_error(
                &self.name,
                format!("document {doc} has length 0: every document needs at least 1 token"),
            ));
        }
        Ok(())
    }
}

/// Consecutive global batches of a dataset (see [`Dataset::batch_stream`]).
pub struct BatchStream<'a> {
    draw: Draw<'a>,
}

impl BatchStream<'_> {
    /// The next global batch.
    pub fn next_batch(&mut self) -> Result<Batch> {
        self.draw.next_batch()
    }

    /// Whether the batches drawn so far hold every document of the first epoch (the last may
    /// already hold some of the next epoch's). Without a budget, one batch is the epoch.
    pub fn epoch_done(&self) -> bool {
        match self.draw.budget {
            Budget::Everything => self.draw.batch_number > 0,
            _ => {
                let stream = &self.draw.stream;
                stream.epoch > 0
                    || (stream.position == stream.order.len() && stream.deferred.is_empty())
            }
        }
    }
}

/// The state carried from one batch to the next.
struct Draw<'a> {
    dataset: &'a Dataset,
    context: Option<u32>,
    budget: Budget,
    stream: DocumentStream,
    /// `in_batch[doc] == batch_number` when `doc` is in the batch being drawn.
    in_batch: Vec<u64>,
    batch_number: u64,
}

impl<'a> Draw<'a> {
    fn new(dataset: &'a Dataset, options: &BatchOptions) -> Self {
        let budget = options.budget();
        // The whole-dataset batch needs no permutation: skip the shuffle of a large file.
        let stream = match budget {
            Budget::Everything => DocumentStream::in_file_order(dataset.len()),
            _ => DocumentStream::shuffled(dataset.len(), options.seed),
        };
        Draw {
            dataset,
            context: options.context,
            budget,
            stream,
            in_batch: vec![0; dataset.len()],
            batch_number: 0,
        }
    }

    /// The next batch; fails when cutting its documents to the context would make more than
    /// [`MAX_SAMPLES`] samples.
    fn next_batch(&mut self) -> Result<Batch> {
        self.batch_number += 1;
        let mut batch = Batch {
            samples: Vec::new(),
            documents: 0,
            documents_cut: 0,
            documents_empty: self.dataset.empty,
            context: self.context,
            source: self.dataset.name.clone(),
        };
        let mut tokens = 0u64;
        let mut deferred = Vec::new();
        while batch.documents < self.dataset.len()
            && !self.budget.is_met(batch.samples.len() as u64, tokens)
        {
            let doc = self.stream.next_document();
            if self.in_batch[doc] == self.batch_number {
                deferred.push(doc);
                continue;
            }
            self.in_batch[doc] = self.batch_number;
            let length = self.dataset.lengths[doc];
            if tokens + u64::from(length) > MAX_TOKENS {
                return Err(batch_error(
                    &self.dataset.name,
                    format!(
                        "the batch would hold more than {MAX_TOKENS} tokens (the 32-bit varlen offsets of a schedule); draw a smaller one with --global-batch-tokens"
                    ),
                ));
            }
            let pieces = self.context.map_or(1, |context| length.div_ceil(context)) as usize;
            if batch.samples.len() + pieces > MAX_SAMPLES {
                return Err(batch_error(
                    &self.dataset.name,
                    format!(
                        "the batch would hold more than {MAX_SAMPLES} samples (document {doc} of {length} tokens is {pieces} samples at context {})",
                        self.context.map_or("none".to_string(), |c| c.to_string())
                    ),
                ));
            }
            if cut_document(doc, length, self.context, &mut batch.samples) {
                batch.documents_cut += 1;
            }
            batch.documents += 1;
            tokens += u64::from(length);
        }
        self.stream.defer(deferred);
        Ok(batch)
    }
}

/// Documents in draw order: deferred ones first, then the current epoch's permutation.
struct DocumentStream {
    count: usize,
    /// `None`: every epoch is in file order.
    seed: Option<u64>,
    epoch: u64,
    order: Vec<usize>,
    position: usize,
    deferred: VecDeque<usize>,
}

impl DocumentStream {
    fn shuffled(count: usize, seed: u64) -> Self {
        DocumentStream {
            count,
            seed: Some(seed),
            epoch: 0,
            order: permutation(count, seed),
            position: 0,
            deferred: VecDeque::new(),
        }
    }

    fn in_file_order(count: usize) -> Self {
        DocumentStream {
            count,
            seed: None,
            epoch: 0,
            order: (0..count).collect(),
            position: 0,
            deferred: VecDeque::new(),
        }
    }

    fn next_document(&mut self) -> usize {
        if let Some(doc) = self.deferred.pop_front() {
            return doc;
        }
        if self.position == self.order.len() {
            self.epoch += 1;
            if let Some(seed) = self.seed {
                self.order = permutation(self.count, seed.wrapping_add(self.epoch));
            }
            self.position = 0;
        }
        self.position += 1;
        self.order[self.position - 1]
    }

    /// Puts `docs` back at the front of the stream, in their order.
    fn defer(&mut self, docs: Vec<usize>) {
        for doc in docs.into_iter().rev() {
            self.deferred.push_front(doc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset(lengths: &[u32]) -> Dataset {
        Dataset {
            name: "d".into(),
            lengths: lengths.to_vec(),
            empty: 0,
        }
    }

    fn docs(batch: &Batch) -> Vec<u64> {
        let mut docs: Vec<u64> = batch.samples.iter().map(|s| s.doc).collect();
        docs.dedup();
        docs
    }

    #[test]
    fn no_budget_is_the_whole_dataset_in_file_order() {
        let data = dataset(&[5, 20, 3]);
        let options = BatchOptions {
            context: Some(8),
            ..BatchOptions::default()
        };
        let batch = data.global_batch(&options).unwrap();
        let lens: Vec<u32> = batch.samples.iter().map(|s| s.len).collect();
        assert_eq!(lens, vec![5, 8, 8, 4, 3]);
        assert_eq!(docs(&batch), vec![0, 1, 2]);
        assert_eq!((batch.documents, batch.documents_cut), (3, 1));
        assert_eq!(batch.tokens(), 28);
        assert_eq!(batch.context, Some(8));
        assert_eq!(batch.source, "d");
        let batches = data.global_batches(&options, 3).unwrap();
        assert!(batches.iter().all(|b| *b == batch));
    }

    #[test]
    fn token_budget_is_reached_or_exceeded_by_the_last_document() {
        let data = dataset(&[100; 50]);
        let options = BatchOptions {
            global_batch_tokens: Some(250),
            seed: 4,
            ..BatchOptions::default()
        };
        let batch = data.global_batch(&options).unwrap();
        assert_eq!((batch.documents, batch.tokens()), (3, 300));
        let exact = BatchOptions {
            global_batch_tokens: Some(300),
            ..options
        };
        assert_eq!(data.global_batch(&exact).unwrap().tokens(), 300);
    }

    #[test]
    fn sample_budget_counts_samples_after_cutting() {
        let data = dataset(&[10; 20]);
        let options = BatchOptions {
            context: Some(4),
            global_batch: Some(7),
            seed: 1,
            ..BatchOptions::default()
        };
        let batch = data.global_batch(&options).unwrap();
        // 3 samples per document: 3 documents (9 samples) are the first to reach 7.
        assert_eq!(
            (batch.documents, batch.samples.len(), batch.documents_cut),
            (3, 9, 3)
        );
    }

    #[test]
    fn same_seed_same_batches() {
        let lengths: Vec<u32> = (1..=200).collect();
        let data = dataset(&lengths);
        let options = BatchOptions {
            global_batch: Some(16),
            seed: 11,
            ..BatchOptions::default()
        };
        let first = data.global_batches(&options, 5).unwrap();
        assert_eq!(first, data.global_batches(&options, 5).unwrap());
        let other = BatchOptions {
            seed: 12,
            ..options
        };
        assert_ne!(first, data.global_batches(&other, 5).unwrap());
        assert_eq!(first[0], data.global_batch(&options).unwrap());
    }

    #[test]
    fn batches_draw_without_replacement_within_an_epoch() {
        let lengths: Vec<u32> = (1..=100).collect();
        let data = dataset(&lengths);
        let options = BatchOptions {
            global_batch: Some(10),
            seed: 3,
            ..BatchOptions::default()
        };
        let batches = data.global_batches(&options, 10).unwrap();
        let mut all: Vec<u64> = batches.iter().flat_map(docs).collect();
        all.sort_unstable();
        assert_eq!(all, (0..100).collect::<Vec<u64>>());
    }

    #[test]
    fn epochs_wrap_without_repeating_a_document_in_a_batch() {
        let lengths: Vec<u32> = (1..=10).collect();
        let data = dataset(&lengths);
        let options = BatchOptions {
            global_batch: Some(4),
            seed: 0,
            ..BatchOptions::default()
        };
        let batches = data.global_batches(&options, 25).unwrap();
        for batch in &batches {
            let mut docs = docs(batch);
            assert_eq!(docs.len(), 4);
            docs.sort_unstable();
            docs.dedup();
            assert_eq!(docs.len(), 4, "a document repeated in {batch:?}");
        }
        // 100 draws over 10 epochs of 10 documents: every document drawn 10 times.
        let mut counts = [0; 10];
        for doc in batches.iter().flat_map(docs) {
            counts[doc as usize] += 1;
        }
        assert_eq!(counts, [10; 10]);
    }

    #[test]
    fn budget_beyond_the_dataset_takes_all_of_it() {
        let data = dataset(&[3, 4, 5]);
        let options = BatchOptions {
            global_batch_tokens: Some(1_000),
            ..BatchOptions::default()
        };
        let batches = data.global_batches(&options, 2).unwrap();
        for batch in &batches {
            let mut docs = docs(batch);
            docs.sort_unstable();
            assert_eq!(docs, vec![0, 1, 2]);
            assert_eq!(batch.tokens(), 12);
        }
    }

    #[test]
    fn undrawable_datasets_and_bad_options_are_errors() {
        let message = dataset(&[])
            .global_batch(&BatchOptions::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "d: no documents: cannot draw a batch from an empty dataset"
        );
        let message = dataset(&[3, 0])
            .global_batch(&BatchOptions::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "d: document 1 has length 0: every document needs at least 1 token"
        );
        let zero_context = BatchOptions {
            context: Some(0),
            ..BatchOptions::default()
        };
        let message = dataset(&[3])
            .global_batch(&zero_context)
            .unwrap_err()
            .to_string();
        assert!(message.starts_with("--context: "), "{message}");
        assert!(dataset(&[3])
            .global_batches(&BatchOptions::default(), 0)
            .unwrap()
            .is_empty());
    }
}
