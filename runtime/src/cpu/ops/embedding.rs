//! Token embedding lookup and its backward (a scatter-add into the table's gradient).

/// Rows `table[token]` for each of the `rows` tokens (`table: [vocab, hidden]`).
pub(crate) fn embed(
    table: &[f32],
    hidden: usize,
    rows: usize,
    tokens: impl Iterator<Item = u32>,
) -> Vec<f32> {
    // Exactly one row per token (the saved layer input: amortised growth would keep up to
    // twice its bytes).
    let mut out = Vec::with_capacity(rows * hidden);
    for token in tokens {
        let start = token as usize * hidden;
        out.extend_from_slice(&table[start..start + hidden]);
    }
    out
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
