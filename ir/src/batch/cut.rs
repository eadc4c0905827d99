//! Cutting a document into context-length samples, as trainers do.
//!
//! A document of `L` tokens longer than the context `C` becomes `ceil(L / C)` samples: all of
//! `C` tokens except the last, which holds the remainder; `piece` numbers them from 0. A
//! document that fits (or any document when there is no context) is one sample with piece 0.
//! No token is dropped or duplicated: the pieces' lengths sum to `L`.

use super::Sample;

/// Appends the samples of document `doc` (of `length` tokens) to `samples`; returns whether the
/// document was cut.
pub(super) fn cut_document(
    doc: usize,
    length: u32,
    context: Option<u32>,
    samples: &mut Vec<Sample>,
) -> bool {
    let doc = doc as u64;
    let context = match context {
        Some(context) if length > context => context,
        _ => {
            samples.push(Sample {
                len: length,
                doc,
                piece: 0,
            });
            return false;
        }
    };
    let mut remaining = length;
    let mut piece = 0;
    while remaining > 0 {
        let len = remaining.min(context);
        samples.push(Sample { len, doc, piece });
        remaining -= len;
        piece += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(length: u32, context: Option<u32>) -> (bool, Vec<u32>) {
        let mut samples = Vec::new();
        let was_cut = cut_document(3, length, context, &mut samples);
        assert!(samples.iter().all(|s| s.doc == 3));
        assert!(samples
            .iter()
            .enumerate()
            .all(|(i, s)| s.piece as usize == i));
        let expected = context.map_or(1, |c| length.div_ceil(c).max(1));
        assert_eq!(samples.len() as u32, expected);
        (was_cut, samples.iter().map(|s| s.len).collect())
    }

    #[test]
    fn long_documents_become_context_pieces() {
        assert_eq!(cut(10, Some(4)), (true, vec![4, 4, 2]));
        assert_eq!(cut(12, Some(4)), (true, vec![4, 4, 4]));
        assert_eq!(cut(5, Some(4)), (true, vec![4, 1]));
        assert_eq!(
            cut(u32::MAX, Some(u32::MAX - 1)),
            (true, vec![u32::MAX - 1, 1])
        );
    }

    #[test]
    fn fitting_documents_stay_whole() {
        assert_eq!(cut(4, Some(4)), (false, vec![4]));
        assert_eq!(cut(3, Some(4)), (false, vec![3]));
        assert_eq!(cut(1_000_000, None), (false, vec![1_000_000]));
    }
}
