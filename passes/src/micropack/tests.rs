//! MicroPack's partition: hand-built cases, the bisection's shortcut against running every
//! step, and properties of the greedy passes.

use super::*;

fn items(costs: &[f64]) -> Vec<Item> {
    costs.iter().map(|&cost| Item { cost, tokens: 1 }).collect()
}

#[test]
fn every_item_is_placed_once_and_in_chain_order() {
    let chains = vec![
        items(&[5.0, 6.0, 7.0]),
        items(&[1.0]),
        items(&[2.0, 2.0]),
        items(&[9.0]),
    ];
    let parts = partition(&chains, &[0; 4], 3, 100, Chains::Contiguous, None);
    let mut seen = vec![Vec::new(); chains.len()];
    for pack in &parts {
        for &(chain, index) in pack {
            seen[chain].push(index);
        }
    }
    for (chain, indices) in seen.iter().enumerate() {
        assert_eq!(indices, &(0..chains[chain].len()).collect::<Vec<_>>());
    }
}

#[test]
fn a_started_chain_continues_in_the_next_pack() {
    // A long sample's slices cost more the later they are (attention over the prefix);
    // short samples fill the rest. Without the rule a slice over the pack's remaining
    // budget waits (here the last one, a pack later: packs 13-17 and 19 of 20).
    // Every slice fills a pack (as 16K slices in 16K packs do).
    let mut chains = vec![(1..=6)
        .map(|k| Item {
            cost: 2.0 * k as f64,
            tokens: 20,
        })
        .collect::<Vec<_>>()];
    chains.extend((0..30).map(|k| {
        vec![Item {
            cost: 1.0 + (k % 5) as f64,
            tokens: 4,
        }]
    }));
    let parts = partition(
        &chains,
        &vec![0; chains.len()],
        1,
        20,
        Chains::Contiguous,
        None,
    );
    let packs: Vec<usize> = (0..6)
        .map(|i| {
            parts
                .iter()
                .position(|p| p.contains(&(0, i)))
                .expect("every slice placed")
        })
        .collect();
    assert!(
        packs.windows(2).all(|w| w[1] == w[0] + 1),
        "slices in packs {packs:?} of {}",
        parts.len()
    );
}

/// Chains of (noise, tokens) shapes whose costlier slices hold more tokens: the heads a
/// search passes over for their tokens are the costly ones, so searches do stop at their
/// scan limit.
fn costly_chains(shapes: &[Vec<(u32, u32)>]) -> Vec<Vec<Item>> {
    (shapes.iter())
        .map(|chain| {
            (chain.iter())
                .map(|&(noise, tokens)| Item {
                    cost: f64::from(5 * tokens + noise) * 0.37,
                    tokens,
                })
                .collect()
        })
        .collect()
}

/// The bisection with its shortcut against without, from the same fitting partition.
fn tightened_both_ways(
    chains: &[&[Item]],
    release: &[usize],
    packs: usize,
    cap: u32,
    rule: Chains,
    run: Option<u64>,
) -> (Partition, Partition) {
    let order = ChainOrder::new(chains, release, rule, run);
    let best = smallest_fitting_count(chains, release, &order, packs, cap);
    let with = tighten(chains, release, &order, cap, best.clone(), true);
    let without = tighten(chains, release, &order, cap, best, false);
    (with, without)
}

#[test]
fn the_shortcut_does_not_carry_over_to_fewer_packs() {
    // The first step (budget 20.5, 4 packs) fits in 3 packs: the next steps run with 3
    // packs, where the urgent chains differ, so the first pass says nothing about them.
    let item = |cost: f64, tokens| Item { cost, tokens };
    let chains = [
        vec![item(15.0, 1), item(2.0, 4), item(16.0, 4)],
        vec![item(9.0, 3), item(2.0, 1)],
    ];
    let chains: Vec<&[Item]> = chains.iter().map(Vec::as_slice).collect();
    let (with, without) = tightened_both_ways(&chains, &[1, 2], 4, 20, Chains::Contiguous, None);
    assert_eq!(with, without);
}

proptest::proptest! {
    /// The bisection ends with the same partition with its shortcut as without.
    #[test]
    fn the_bisection_shortcut_changes_no_partition(
        shapes in proptest::collection::vec(
            proptest::collection::vec((1u32..100, 1u32..60), 1..5),
            1..120,
        ),
        releases in proptest::collection::vec(0usize..6, 120),
        packs in 1usize..10,
        cap in 60u32..400,
        contiguous: bool,
        run in proptest::option::of(200u64..4000),
    ) {
        let chains = costly_chains(&shapes);
        let chains: Vec<&[Item]> = chains.iter().map(Vec::as_slice).collect();
        let rule = if contiguous { Chains::Contiguous } else { Chains::Free };
        let (with, without) =
            tightened_both_ways(&chains, &releases[..chains.len()], packs, cap, rule, run);
        proptest::prop_assert_eq!(with, without);
    }
}

proptest::proptest! {
    /// The budget bisection's shortcut ([`same_packs_from`]): a fitting pass under a
    /// fixed budget makes the same packs under every budget from where it says up to its
    /// own (chains of several slices, releases, caps that bind, runs bounded or not, more
    /// heads than a search scans).
    #[test]
    fn a_fitting_pass_repeats_under_budgets_down_to_its_largest_pack(
        shapes in proptest::collection::vec(
            proptest::collection::vec((1u32..100, 1u32..60), 1..5),
            1..160,
        ),
        releases in proptest::collection::vec(0usize..2, 160),
        packs in 0usize..4,
        cap in 60u32..400,
        contiguous: bool,
        stretch in 1.0f64..2.5,
        run in proptest::option::of(200u64..4000),
    ) {
        let chains = costly_chains(&shapes);
        let chains: Vec<&[Item]> = chains.iter().map(Vec::as_slice).collect();
        let release = &releases[..chains.len()];
        let rule = if contiguous { Chains::Contiguous } else { Chains::Free };
        let order = ChainOrder::new(&chains, release, rule, run);
        let packs = packs + order.total_tokens.div_ceil(u64::from(cap)) as usize;
        let budget = stretch * order.total_cost / packs as f64;
        let greedy = attempt(&chains, release, &order, packs, cap, Some(budget), false);
        let largest = max_load(&chains, &greedy.parts);
        proptest::prop_assume!(greedy.fits && largest <= budget * (1.0 + 1e-9));
        let from = same_packs_from(&greedy, largest);
        proptest::prop_assume!(from <= budget);
        for share in [0.0, 0.3, 0.7, 1.0] {
            let smaller = (from + share * (budget - from)).max(from);
            let again = attempt(&chains, release, &order, packs, cap, Some(smaller), false);
            proptest::prop_assert!(again.fits, "budget {} of {}", smaller, budget);
            proptest::prop_assert_eq!(&again.parts, &greedy.parts);
        }
    }
}

proptest::proptest! {
    /// Under a cap that never binds, a contiguous partition (the greedy, its budget
    /// bisection and the local search) keeps every chain's consecutive slices at most one
    /// pack apart, and places every slice once, in chain order.
    #[test]
    fn contiguous_chains_stay_within_a_pack_of_each_other(
        shapes in proptest::collection::vec(
            proptest::collection::vec((1u32..50, 1u32..100), 1..6),
            1..12,
        ),
        packs in 1usize..8,
    ) {
        let chains: Vec<Vec<Item>> = shapes
            .iter()
            .map(|chain| {
                let mut cost = 0.0;
                chain
                    .iter()
                    .map(|&(step, tokens)| {
                        cost += f64::from(step);
                        Item { cost, tokens }
                    })
                    .collect()
            })
            .collect();
        let parts = partition(
            &chains,
            &vec![0; chains.len()],
            packs,
            u32::MAX / 2,
            Chains::Contiguous,
            None,
        );
        let mut at: Vec<Vec<(usize, usize)>> = chains.iter().map(|_| Vec::new()).collect();
        for (k, pack) in parts.iter().enumerate() {
            for &(c, i) in pack {
                at[c].push((i, k));
            }
        }
        for (c, placed) in at.iter_mut().enumerate() {
            placed.sort_unstable();
            let indices: Vec<usize> = placed.iter().map(|&(i, _)| i).collect();
            proptest::prop_assert_eq!(indices, (0..chains[c].len()).collect::<Vec<_>>());
            let packs: Vec<usize> = placed.iter().map(|&(_, k)| k).collect();
            for pair in packs.windows(2) {
                proptest::prop_assert!(
                    pair[0] <= pair[1] && pair[1] <= pair[0] + 1,
                    "chain {} in packs {:?} of {}",
                    c,
                    packs,
                    parts.len()
                );
            }
        }
    }
}

#[test]
fn balances_independent_items() {
    let chains: Vec<Vec<Item>> = [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
        .iter()
        .map(|&c| items(&[c]))
        .collect();
    let parts = partition(&chains, &[0; 8], 4, 100, Chains::Contiguous, None);
    let loads: Vec<f64> = parts
        .iter()
        .map(|p| p.iter().map(|&(c, i)| chains[c][i].cost).sum())
        .collect();
    assert_eq!(loads.len(), 4);
    assert!(loads.iter().all(|&l| (l - 9.0).abs() < 1e-9), "{loads:?}");
}

#[test]
fn gallops_to_the_fewest_packs_when_the_cap_needs_many_more() {
    // 40 slices of 10 tokens under a cap of 20 need 20 packs, 18 more than asked for:
    // past the linear counts the search gallops and bisects, and still lands on 20.
    let chains: Vec<Vec<Item>> = (0..40)
        .map(|_| {
            vec![Item {
                cost: 1.0,
                tokens: 10,
            }]
        })
        .collect();
    let parts = partition(&chains, &[0; 40], 2, 20, Chains::Contiguous, None);
    assert_eq!(parts.len(), 20);
    assert!(parts.iter().all(|p| p.len() == 2));
}

#[test]
fn grows_the_pack_count_to_respect_the_cap() {
    let chains: Vec<Vec<Item>> = (0..6)
        .map(|_| {
            vec![Item {
                cost: 1.0,
                tokens: 10,
            }]
        })
        .collect();
    let parts = partition(&chains, &[0; 6], 2, 20, Chains::Contiguous, None);
    assert_eq!(parts.len(), 3);
    assert!(parts.iter().all(|p| p.len() == 2));
}

#[test]
fn a_run_window_bounds_the_packs_chains_join() {
    // Chains of three slices whose costs grow along the chain (a late slice attends to a
    // longer prefix) and single slices: the cost balance splits chains over packs.
    let mut chains: Vec<Vec<Item>> = (0..24)
        .map(|c| {
            (1..=3)
                .map(|k| Item {
                    cost: (k * (1 + c % 3)) as f64,
                    tokens: 10,
                })
                .collect()
        })
        .collect();
    chains.extend((0..24).map(|c| {
        vec![Item {
            cost: 1.0 + (c % 4) as f64,
            tokens: 5 + (c % 3) as u32,
        }]
    }));
    let release = vec![0; chains.len()];
    let free = partition(&chains, &release, 1, 40, Chains::Contiguous, None);
    let longest_free = run_tokens(&chains, &free).into_iter().max().unwrap();
    assert!(longest_free > 240, "no long run to bound: {longest_free}");
    let bounded = partition(&chains, &release, 1, 40, Chains::Contiguous, Some(80));
    // Runs stay within the bound, or pass it by at most a pack where the chains that the
    // pack count forces in (urgent ones, the last pack's) leave the closing pack no room.
    let runs = run_tokens(&chains, &bounded);
    assert!(runs.iter().all(|&t| t <= 80 + 40), "{runs:?}");
    assert!(runs.iter().filter(|&&t| t > 80).count() <= 2, "{runs:?}");
    // Every slice once, in chain order, within the cap.
    let mut seen: Vec<Vec<Option<usize>>> = chains.iter().map(|c| vec![None; c.len()]).collect();
    for (k, pack) in bounded.iter().enumerate() {
        assert!(pack.iter().map(|&(c, i)| chains[c][i].tokens).sum::<u32>() <= 40);
        for &(c, i) in pack {
            assert!(seen[c][i].replace(k).is_none());
        }
    }
    for chain in &seen {
        let packs: Vec<usize> = chain.iter().map(|k| k.expect("placed")).collect();
        assert!(packs.windows(2).all(|w| w[0] <= w[1]), "{packs:?}");
    }
}
