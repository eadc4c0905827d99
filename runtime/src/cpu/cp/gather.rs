//! The two uses of the group's exchange in attention: gathering a sample's K/V prefix in
//! position order, and summing the group's K/V-gradient contributions into each owner's rows.

use super::exchange::KvExchange;
use super::CpShard;
use crate::cpu::error::Result;
use crate::cpu::kv_cache::LayerKv;
use crate::cpu::profile::{self, OpClass};

/// Positions, in row order, that worker `rank` of the group holds of the given slices.
fn positions_of(shard: CpShard, rank: usize, slices: &[(usize, usize)]) -> Vec<usize> {
    let member = CpShard { rank, ..shard };
    slices
        .iter()
        .flat_map(|&(start, len)| member.positions(start, len))
        .collect()
}

/// End of the last of `slices` (they are contiguous from position 0).
fn prefix_end(slices: &[(usize, usize)]) -> usize {
    slices.last().map_or(0, |&(start, len)| start + len)
}

/// All-gathers the keys and values the group holds of the positions covered by `slices` (a
/// sample's first slices, contiguous from 0, up to the one attending) and returns them in
/// position order, `[end, kv_width]` each.
pub(crate) fn gather_prefix(
    exchange: &mut dyn KvExchange,
    slices: &[(usize, usize)],
    kv: &LayerKv,
    kv_width: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let _timer = profile::scope(OpClass::Exchange);
    let shard = exchange.shard();
    // The rows of the positions before `end`: a backward pack may hold later slices too.
    let held = positions_of(shard, shard.rank, slices).len() * kv_width;
    let mut mine = Vec::with_capacity(2 * held);
    mine.extend_from_slice(&kv.keys[..held]);
    mine.extend_from_slice(&kv.values[..held]);
    let parts = exchange.all_gather(mine)?;
    let end = prefix_end(slices);
    let mut keys = vec![0.0; end * kv_width];
    let mut values = vec![0.0; end * kv_width];
    for (rank, part) in parts.iter().enumerate() {
        let positions = positions_of(shard, rank, slices);
        let half = positions.len() * kv_width;
        assert_eq!(
            part.len(),
            2 * half,
            "bug: a worker sent K/V of other positions"
        );
        let (part_keys, part_values) = part.split_at(half);
        for (row, &position) in positions.iter().enumerate() {
            let (from, to) = (row * kv_width, position * kv_width);
            keys[to..to + kv_width].copy_from_slice(&part_keys[from..from + kv_width]);
            values[to..to + kv_width].copy_from_slice(&part_values[from..from + kv_width]);
        }
    }
    Ok((keys, values))
}

/// Exchanges every worker's gradients of the prefix keys and values (`[end, kv_width]` each;
/// empty for a worker with no query in the slice) and adds, in rank order, the rows of the
/// positions this worker holds into its accumulators.
pub(crate) fn scatter_add_grads(
    exchange: &mut dyn KvExchange,
    slices: &[(usize, usize)],
    d_keys: Vec<f32>,
    d_values: Vec<f32>,
    kv: &mut LayerKv,
    kv_width: usize,
) -> Result<()> {
    let _timer = profile::scope(OpClass::Exchange);
    let shard = exchange.shard();
    let mut mine = d_keys;
    mine.extend_from_slice(&d_values);
    drop(d_values);
    let parts = exchange.all_gather(mine)?;
    let positions = positions_of(shard, shard.rank, slices);
    let end = prefix_end(slices);
    for part in parts.iter().filter(|part| !part.is_empty()) {
        assert_eq!(
            part.len(),
            2 * end * kv_width,
            "bug: gradients of another prefix"
        );
        let (part_keys, part_values) = part.split_at(end * kv_width);
        for (row, &position) in positions.iter().enumerate() {
            let (to, from) = (row * kv_width, position * kv_width);
            let pairs = [
                (&mut kv.key_grads, part_keys),
                (&mut kv.value_grads, part_values),
            ];
            for (acc, part) in pairs {
                let acc = &mut acc[to..to + kv_width];
                acc.iter_mut()
                    .zip(&part[from..from + kv_width])
                    .for_each(|(a, &g)| *a += g);
            }
        }
    }
    Ok(())
}
