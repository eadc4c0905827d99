//! The exact phase-2 problem as a mixed-integer linear program, for measuring the optimality gap
//! of the MicroPack heuristic ([`crate::micropack::partition`]) on small instances. Not used by
//! the compiler: it is far too slow for a step's worth of slices.
//!
//! Variables `x[i][k]` put item `i` in pack `k`. Constraints: every item in one pack; items of a
//! chain in non-decreasing pack index (`sum_k k x[a][k] <= sum_k k x[b][k]` for consecutive
//! `a -> b`); no chain before its release; at most `cap` tokens per pack; `T >= cost of pack k`.
//! Objective: minimise `T`, the largest pack cost. Solved with good_lp's pure-Rust `microlp`
//! backend (HiGHS, the usual choice, needs a C++/CMake build that CI does not need to pay for).

use good_lp::{
    constraint, variable, Expression, ProblemVariables, Solution, SolverModel, Variable,
};

use crate::micropack::Item;

/// The smallest achievable largest-pack cost with exactly `packs` packs, or `None` when the
/// instance is infeasible or the solver fails.
pub fn optimal_max_pack_cost(
    chains: &[Vec<Item>],
    release: &[usize],
    packs: usize,
    cap: u32,
) -> Option<f64> {
    // Costs are FLOPs (~1e12): scale them to ~1 so the simplex stays well conditioned.
    let scale = chains
        .iter()
        .flatten()
        .map(|i| i.cost)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut vars = ProblemVariables::new();
    let items: Vec<(usize, usize)> = chains
        .iter()
        .enumerate()
        .flat_map(|(c, chain)| (0..chain.len()).map(move |i| (c, i)))
        .collect();
    let x: Vec<Vec<Variable>> = items
        .iter()
        .map(|_| (0..packs).map(|_| vars.add(variable().binary())).collect())
        .collect();
    let largest = vars.add(variable().min(0.0));
    let mut model = vars
        .minimise(largest)
        .using(good_lp::solvers::microlp::microlp);
    let index_of = |c: usize, i: usize| {
        items
            .iter()
            .position(|&it| it == (c, i))
            .expect("item exists")
    };
    for row in &x {
        let one: Expression = row.iter().copied().sum();
        model = model.with(constraint!(one == 1.0));
    }
    for (c, chain) in chains.iter().enumerate() {
        for i in 0..chain.len() {
            let row = &x[index_of(c, i)];
            for &var in row.iter().take(release[c].min(packs)) {
                model = model.with(constraint!(var == 0.0));
            }
            if i + 1 < chain.len() {
                let next = &x[index_of(c, i + 1)];
                let here: Expression = row.iter().enumerate().map(|(k, &v)| (k as f64) * v).sum();
                let there: Expression = next.iter().enumerate().map(|(k, &v)| (k as f64) * v).sum();
                model = model.with(constraint!(here <= there));
            }
        }
    }
    for k in 0..packs {
        let tokens: Expression = items
            .iter()
            .enumerate()
            .map(|(n, &(c, i))| f64::from(chains[c][i].tokens) * x[n][k])
            .sum();
        model = model.with(constraint!(tokens <= f64::from(cap)));
        let cost: Expression = items
            .iter()
            .enumerate()
            .map(|(n, &(c, i))| chains[c][i].cost / scale * x[n][k])
            .sum();
        model = model.with(constraint!(cost <= largest));
    }
    model
        .solve()
        .ok()
        .map(|solution| solution.value(largest) * scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::micropack::{partition, Chains};

    fn item(cost: f64) -> Item {
        Item { cost, tokens: 1 }
    }

    #[test]
    fn optimum_is_a_lower_bound_of_the_heuristic_and_exact_on_a_known_case() {
        // Chains [4,4] and [3,3,2]: 16 over 2 packs; with order constraints 8/8 is reachable.
        let chains = vec![
            vec![item(4.0), item(4.0)],
            vec![item(3.0), item(3.0), item(2.0)],
        ];
        let optimum = optimal_max_pack_cost(&chains, &[0, 0], 2, 100).unwrap();
        assert!((optimum - 8.0).abs() < 1e-6, "{optimum}");
        let heuristic = partition(&chains, &[0, 0], 2, 100, Chains::Contiguous, None);
        let worst = heuristic
            .iter()
            .map(|p| p.iter().map(|&(c, i)| chains[c][i].cost).sum::<f64>())
            .fold(0.0, f64::max);
        assert!(worst >= optimum - 1e-9);
    }
}
