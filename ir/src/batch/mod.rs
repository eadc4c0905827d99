//! The global batch (placeholder while the batch module is being written).

/// One training sample: a document, or one context-length piece of a longer document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// Tokens in this sample.
    pub len: u32,
    /// Index of the source document in the dataset.
    pub doc: u64,
    /// Which context-length piece of the document this is (0 when not cut).
    pub piece: u32,
}
