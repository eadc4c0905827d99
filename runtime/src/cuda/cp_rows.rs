//! The host-side bookkeeping of a DP-Merge group's K/V exchange on GPUs: which rows of which
//! member's contribution hold which positions of a sample. The split itself is
//! [`CpShard`]'s (`slimpack_ir::program::cp_shard`, the one definition); the scheme (all-gather
//! the prefix forward, all-gather and add the owners' rows backward) is the CPU backend's
//! (`cpu/cp/`), here as runs of contiguous rows, so that the device moves them with one copy
//! or one add per run instead of one per row.
//!
//! A member's K/V cache of a sample holds its own positions only, slice after slice, each
//! slice's two runs ([`CpShard::runs`]) in position order — the row order of
//! `cpu/cp/gather.rs`'s `positions_of`.

use crate::cpu::CpShard;

/// `len` rows of a member's contribution, from row `row`, that hold positions
/// `position..position + len` of the sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowRun {
    pub row: usize,
    pub position: usize,
    pub len: usize,
}

/// The runs member `rank` of `shard`'s group holds of `slices` (a sample's first slices,
/// `(start, len)`, contiguous from position 0), in its rows' order.
pub(crate) fn member_runs(shard: CpShard, rank: usize, slices: &[(usize, usize)]) -> Vec<RowRun> {
    let member = CpShard { rank, ..shard };
    let mut row = 0;
    let mut runs = Vec::with_capacity(2 * slices.len());
    for &(start, len) in slices {
        for run in member.runs(start, len) {
            if !run.is_empty() {
                runs.push(RowRun {
                    row,
                    position: run.start,
                    len: run.len(),
                });
                row += run.len();
            }
        }
    }
    runs
}

/// Rows member `rank` holds of `slices`.
pub(crate) fn held_rows(shard: CpShard, rank: usize, slices: &[(usize, usize)]) -> usize {
    let member = CpShard { rank, ..shard };
    slices
        .iter()
        .map(|&(start, len)| member.len_of(start, len))
        .sum()
}

/// End of the last of `slices` (they are contiguous from position 0).
pub(crate) fn prefix_end(slices: &[(usize, usize)]) -> usize {
    slices.last().map_or(0, |&(start, len)| start + len)
}

/// Values of every member's part of a forward K/V all-gather of `slices`: the largest member's
/// keys and values (`2 · rows · kv_width`); a smaller member's part ends in zeros (NCCL's
/// all-gather takes equal parts).
pub(crate) fn gather_part_len(shard: CpShard, slices: &[(usize, usize)], kv_width: usize) -> usize {
    (0..shard.size)
        .map(|rank| 2 * held_rows(shard, rank, slices) * kv_width)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample's slices, contiguous from 0.
    fn slices(lens: &[usize]) -> Vec<(usize, usize)> {
        let mut start = 0;
        lens.iter()
            .map(|&len| {
                start += len;
                (start - len, len)
            })
            .collect()
    }

    #[test]
    fn member_runs_are_the_cpu_exchanges_rows_and_partition_the_prefix() {
        for size in 1..=4 {
            for lens in [
                vec![1],
                vec![7],
                vec![5, 64],
                vec![3, 100, 33],
                vec![2, 2, 2],
            ] {
                let slices = slices(&lens);
                let end = prefix_end(&slices);
                let mut owner = vec![None; end];
                for rank in 0..size {
                    let shard = CpShard::new(rank, size).unwrap();
                    let runs = member_runs(shard, rank, &slices);
                    // Expanded, the runs are the positions the CPU's exchange sends, in order.
                    let expanded: Vec<(usize, usize)> = runs
                        .iter()
                        .flat_map(|r| (0..r.len).map(move |i| (r.row + i, r.position + i)))
                        .collect();
                    let cpu: Vec<usize> = slices
                        .iter()
                        .flat_map(|&(start, len)| shard.positions(start, len))
                        .collect();
                    let rows: Vec<usize> = expanded.iter().map(|&(row, _)| row).collect();
                    let positions: Vec<usize> = expanded.iter().map(|&(_, p)| p).collect();
                    assert_eq!(positions, cpu, "size {size} rank {rank} {lens:?}");
                    assert_eq!(rows, (0..cpu.len()).collect::<Vec<_>>());
                    assert_eq!(held_rows(shard, rank, &slices), cpu.len());
                    assert!(
                        2 * cpu.len() * 3 <= gather_part_len(shard, &slices, 3),
                        "every part fits"
                    );
                    for position in positions {
                        assert_eq!(owner[position], None, "position {position} held twice");
                        owner[position] = Some(rank);
                    }
                }
                assert!(
                    owner.iter().all(Option::is_some),
                    "{size} {lens:?}: {owner:?}"
                );
            }
        }
    }

    #[test]
    fn rows_before_a_slice_are_the_held_rows_of_the_slices_before_it() {
        let shard = CpShard::new(1, 3).unwrap();
        let slices = slices(&[10, 20, 7]);
        // The second slice's first row in the member's cache follows the first slice's rows.
        let before = held_rows(shard, 1, &slices[..1]);
        let runs = member_runs(shard, 1, &slices);
        let first_of_second = runs.iter().find(|r| r.position >= 10).unwrap();
        assert_eq!(first_of_second.row, before);
        assert_eq!(prefix_end(&slices), 37);
        assert_eq!(prefix_end(&[]), 0);
        assert_eq!(gather_part_len(shard, &[], 4), 0);
    }
}
