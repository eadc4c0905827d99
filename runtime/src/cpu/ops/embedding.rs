//! Token embedding lookup and its backward (a scatter-add into the table's gradient).

/// Rows `table[token]` for each token (`table: [vocab, hidden]`).
pub(crate) fn embed(table: &[f32], hidden: usize, tokens: impl Iterator<Item = u32>) -> Vec<f32> {
    let mut rows = Vec::new();
    for token in tokens {
        let start = token as usize * hidden;
        rows.extend_from_slice(&table[start..start + hidden]);
    }
    rows
}

/// `d_table[token] += d_rows[r]` for the token of each row `r`.
pub(crate) fn embed_backward(
    d_table: &mut [f32],
    hidden: usize,
    tokens: impl Iterator<Item = u32>,
    d_rows: &[f32],
) {
    for (token, d_row) in tokens.zip(d_rows.chunks_exact(hidden)) {
        let start = token as usize * hidden;
        for (d, &g) in d_table[start..start + hidden].iter_mut().zip(d_row) {
            *d += g;
        }
    }
}
