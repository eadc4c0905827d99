//! Costs of schedule terms, composed bottom-up from the machine model.
//!
//! - A pack's time is [`CostModel::pack_time`]'s critical path on the pipeline's slowest stage.
//!   That function is additive over a pack's slices in three quantities only — attention time
//!   (per slice, at its offset and query length), tokens and keys (prefix + length) — and the
//!   rest depends on the pack's token total alone. [`PackTimer`] uses that split: a slice's
//!   [`PackLoad`] is looked up once, a list's load is the sum of its slices', and a pack's time
//!   is `max over stages [rest(stage, tokens) + max(attention, cp_exchange(stage, keys))]`, with
//!   `rest` and `cp_exchange` memoised by token and key count, once per set of alike stages
//!   ([`CostModel::alike_stages`]: a middle stage is timed for all). It equals `pack_time` on the same
//!   slices (a test checks it), at the price of a hash lookup.
//! - A pipelined sequence of packs costs `sum + (pp - 1) x max`: every pack passes every stage
//!   once, and the fill and drain of a 1F1B pipeline add roughly `pp - 1` times the largest.
//! - A replica costs forward plus backward; a step (outside the e-graph, whose terms are single
//!   replicas) costs the maximum over replicas. The pass judges its results by a finer cost,
//!   the replica's 1F1B makespan (`pipeline.rs`), which no bottom-up composition captures.
//!
//! [`ScheduleCost`] is egg's [`CostFunction`]: the greedy extractor keeps, per e-class, the
//! term of least cost under an [`Objective`]. Ranking a sequence by `sum + (pp - 1) x max`
//! (what the replica pays) is not what a longer sequence holding it always prefers — greedy
//! extraction is exact only for costs that add up — so `extract.rs` ranks by the largest pack,
//! then by the sum under a bound on the largest pack, and keeps the best of a few bounds.

use std::cell::RefCell;

use egg::{CostFunction, Id, Language};
use rustc_hash::FxHashMap as HashMap;

use super::analysis::{direction_index, ReplicaFacts};
use super::language::{Kept, Schedule, Span};
use slimpack_ir::step::Direction;
use slimpack_machine::cost::{AlikeStages, CostModel};

/// What a set of slices contributes to a pack's time: additive over slices.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PackLoad {
    pub tokens: u64,
    /// Sum over slices of prefix + length: the keys a CP ring ships.
    pub keys: u64,
    /// Attention seconds of the stage's layers, forward.
    pub attention_forward: f64,
    /// Attention seconds of the stage's layers, backward.
    pub attention_backward: f64,
}

impl PackLoad {
    pub fn add(&self, other: &PackLoad) -> PackLoad {
        PackLoad {
            tokens: self.tokens + other.tokens,
            keys: self.keys + other.keys,
            attention_forward: self.attention_forward + other.attention_forward,
            attention_backward: self.attention_backward + other.attention_backward,
        }
    }

    pub fn sub(&self, other: &PackLoad) -> PackLoad {
        PackLoad {
            tokens: self.tokens - other.tokens,
            keys: self.keys - other.keys,
            attention_forward: self.attention_forward - other.attention_forward,
            attention_backward: self.attention_backward - other.attention_backward,
        }
    }

    fn attention(&self, direction: Direction) -> f64 {
        match direction {
            Direction::Forward => self.attention_forward,
            Direction::Backward => self.attention_backward,
        }
    }
}

/// Pack times of one replica, from the machine model, memoised.
#[derive(Debug, Clone)]
pub struct PackTimer {
    model: CostModel,
    /// DP ranks of the replica (several for a DP-Merge group).
    ranks: Vec<u32>,
    stages: u32,
    /// Whether packs pay a CP exchange (a merged group, or a static CP degree).
    context_parallel: bool,
    /// Per stage, the first with the same pack times and CP exchange: the memo tables are
    /// keyed by those.
    alike: AlikeStages,
    /// By (offset, length): a slice's load does not depend on its sample.
    slices: HashMap<(u32, u32), PackLoad>,
    /// Without CP: the largest non-attention time over stages, by (direction, tokens).
    rest_max: HashMap<(Direction, u64), f64>,
    /// With CP: non-attention time by (direction, stage, tokens).
    rest: HashMap<(Direction, u32, u64), f64>,
    /// With CP: ring exchange time by (direction, stage, keys).
    exchange: HashMap<(Direction, u32, u64), f64>,
}

impl PackTimer {
    /// The timer of packs run by the DP ranks `ranks`.
    pub fn new(model: CostModel, ranks: Vec<u32>) -> PackTimer {
        let parallel = &model.spec().parallel;
        let context_parallel = ranks.len() > 1 || parallel.cp_degree() > 1;
        PackTimer {
            stages: parallel.stages(),
            alike: model.alike_stages(&ranks),
            model,
            ranks,
            context_parallel,
            slices: HashMap::default(),
            rest_max: HashMap::default(),
            rest: HashMap::default(),
            exchange: HashMap::default(),
        }
    }

    /// Whether packs pay a CP exchange, whose time depends on the ranks' links: a timer is
    /// then specific to its replica; otherwise every replica can share one.
    pub fn context_parallel(&self) -> bool {
        self.context_parallel
    }

    /// Pipeline stages.
    pub fn stages(&self) -> u32 {
        self.stages
    }

    /// The load of one slice (both directions).
    pub fn load(&mut self, span: Span) -> PackLoad {
        if let Some(load) = self.slices.get(&(span.start, span.len)) {
            return *load;
        }
        let [attention_forward, attention_backward] =
            self.model
                .slice_attention_s(u64::from(span.len), u64::from(span.start), &self.ranks);
        let load = PackLoad {
            tokens: u64::from(span.len),
            keys: u64::from(span.end()),
            attention_forward,
            attention_backward,
        };
        self.slices.insert((span.start, span.len), load);
        load
    }

    /// The load of a list of slices.
    pub fn list_load(&mut self, spans: &[Span]) -> PackLoad {
        spans
            .iter()
            .fold(PackLoad::default(), |sum, &span| sum.add(&self.load(span)))
    }

    /// Seconds of a pack of this load on the slowest stage.
    pub fn seconds(&mut self, direction: Direction, load: &PackLoad) -> f64 {
        if load.tokens == 0 {
            return 0.0;
        }
        let attention = load.attention(direction);
        if !self.context_parallel {
            return attention + self.rest_max(direction, load.tokens);
        }
        // Alike stages take the same time: the first of each is enough for the largest.
        let mut seconds: f64 = 0.0;
        for stage in 0..self.stages {
            if self.alike.times[stage as usize] == stage {
                seconds = seconds.max(
                    self.rest(direction, stage, load.tokens)
                        + attention.max(self.exchange(direction, stage, load.keys)),
                );
            }
        }
        seconds
    }

    /// Seconds of a pack of `spans` on every stage.
    pub fn stage_seconds(&mut self, direction: Direction, spans: &[Span]) -> Vec<f64> {
        let load = self.list_load(spans);
        let attention = load.attention(direction);
        let mut seconds = vec![0.0; self.stages as usize];
        if load.tokens == 0 {
            return seconds;
        }
        for stage in 0..self.stages {
            // An alike stage's time is its first's.
            let like = self.alike.times[stage as usize];
            if like != stage {
                seconds[stage as usize] = seconds[like as usize];
                continue;
            }
            let exchange = if self.context_parallel {
                self.exchange(direction, stage, load.keys)
            } else {
                0.0
            };
            seconds[stage as usize] =
                self.rest(direction, stage, load.tokens) + attention.max(exchange);
        }
        seconds
    }

    /// Seconds of a pack of `spans`.
    pub fn pack_seconds(&mut self, direction: Direction, spans: &[Span]) -> f64 {
        let load = self.list_load(spans);
        self.seconds(direction, &load)
    }

    fn rest_max(&mut self, direction: Direction, tokens: u64) -> f64 {
        if let Some(&seconds) = self.rest_max.get(&(direction, tokens)) {
            return seconds;
        }
        let mut seconds: f64 = 0.0;
        for stage in 0..self.stages {
            if self.alike.times[stage as usize] == stage {
                seconds = seconds.max(self.rest(direction, stage, tokens));
            }
        }
        self.rest_max.insert((direction, tokens), seconds);
        seconds
    }

    /// Everything but attention and the CP exchange: a function of the token count only, so
    /// one slice of `tokens` tokens at offset 0 measures it.
    fn rest(&mut self, direction: Direction, stage: u32, tokens: u64) -> f64 {
        let stage = self.alike.times[stage as usize];
        if let Some(&seconds) = self.rest.get(&(direction, stage, tokens)) {
            return seconds;
        }
        let time = self
            .model
            .pack_time_on(stage, &[(tokens, 0)], direction, &self.ranks);
        // The critical path less attention and less what the CP exchange adds beyond it.
        let cp_beyond_attention = (time.cp_comm_s - time.attention_s).max(0.0);
        let seconds = time.critical_path_s() - time.attention_s - cp_beyond_attention;
        self.rest.insert((direction, stage, tokens), seconds);
        seconds
    }

    /// The CP ring exchange: a function of the key count only.
    fn exchange(&mut self, direction: Direction, stage: u32, keys: u64) -> f64 {
        if keys == 0 {
            return 0.0;
        }
        let stage = self.alike.exchange[stage as usize];
        if let Some(&seconds) = self.exchange.get(&(direction, stage, keys)) {
            return seconds;
        }
        let seconds = self
            .model
            .cp_exchange_on(stage, keys, direction, &self.ranks);
        self.exchange.insert((direction, stage, keys), seconds);
        seconds
    }
}

/// A pipelined sequence of packs: the sum and the largest of their times.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SequenceCost {
    pub sum: f64,
    pub max: f64,
}

impl SequenceCost {
    /// This sequence with a pack of `seconds` in front.
    pub fn then(&self, seconds: f64) -> SequenceCost {
        SequenceCost {
            sum: self.sum + seconds,
            max: self.max.max(seconds),
        }
    }

    /// This sequence followed by `rest`.
    pub fn join(&self, rest: &SequenceCost) -> SequenceCost {
        SequenceCost {
            sum: self.sum + rest.sum,
            max: self.max.max(rest.max),
        }
    }

    /// Sum plus the fill and drain of a `stages`-stage pipeline.
    pub fn total(&self, stages: u32) -> f64 {
        self.sum + f64::from(stages.saturating_sub(1)) * self.max
    }
}

/// What the extractor minimises over a sequence's terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Objective {
    /// The largest pack, then the sum.
    Bottleneck,
    /// The sum, over terms whose packs all take at most these many seconds (forward,
    /// backward; the others are infinitely expensive). Exact under greedy extraction.
    SumWithin([f64; 2]),
}

/// The cost of a term, by the kind of its e-class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A slice or a list of slices.
    Load(PackLoad),
    /// A run of kept packs (its cost depends on the direction that holds it).
    Kept(Kept),
    /// A pack: seconds.
    Pack(f64),
    Sequence(SequenceCost),
    /// A replica: the totals of its two sequences.
    Replica(f64),
}

/// A term's cost and the figures terms of one e-class are ranked by, most significant first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TermCost {
    pub value: Value,
    rank: (f64, f64),
}

impl TermCost {
    fn load(&self) -> PackLoad {
        match self.value {
            Value::Load(load) => load,
            other => panic!("{other:?} is not a slice list's cost; this is a bug"),
        }
    }

    fn pack(&self) -> f64 {
        match self.value {
            Value::Pack(seconds) => seconds,
            other => panic!("{other:?} is not a pack's cost; this is a bug"),
        }
    }

    pub fn sequence(&self) -> SequenceCost {
        match self.value {
            Value::Sequence(sequence) => sequence,
            other => panic!("{other:?} is not a sequence's cost; this is a bug"),
        }
    }
}

impl PartialOrd for TermCost {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(
            self.rank
                .0
                .total_cmp(&other.rank.0)
                .then(self.rank.1.total_cmp(&other.rank.1)),
        )
    }
}

/// egg's cost function over [`Schedule`] terms (see the module header).
pub struct ScheduleCost<'a> {
    pub timer: &'a RefCell<PackTimer>,
    pub facts: &'a ReplicaFacts,
    pub objective: Objective,
}

impl ScheduleCost<'_> {
    fn pack(&self, direction: Direction, seconds: f64) -> TermCost {
        let seconds = match self.objective {
            Objective::SumWithin(limits) => {
                let limit = limits[direction_index(direction)];
                if seconds > limit * (1.0 + 1e-12) {
                    f64::INFINITY
                } else {
                    seconds
                }
            }
            _ => seconds,
        };
        TermCost {
            value: Value::Pack(seconds),
            rank: (seconds, 0.0),
        }
    }

    fn sequence(&self, sequence: SequenceCost) -> TermCost {
        let rank = match self.objective {
            Objective::Bottleneck => (sequence.max, sequence.sum),
            Objective::SumWithin(_) => (sequence.sum, sequence.max),
        };
        TermCost {
            value: Value::Sequence(sequence),
            rank,
        }
    }
}

fn load_cost(load: PackLoad) -> TermCost {
    TermCost {
        value: Value::Load(load),
        rank: (load.attention_forward + load.attention_backward, 0.0),
    }
}

impl CostFunction<Schedule> for ScheduleCost<'_> {
    type Cost = TermCost;

    fn cost<C>(&mut self, enode: &Schedule, mut costs: C) -> TermCost
    where
        C: FnMut(Id) -> TermCost,
    {
        let stages = self.timer.borrow().stages();
        match enode {
            Schedule::Slice(span) => load_cost(self.timer.borrow_mut().load(*span)),
            Schedule::KeptPacks(kept) => TermCost {
                value: Value::Kept(*kept),
                rank: (0.0, 0.0),
            },
            Schedule::Nil => load_cost(PackLoad::default()),
            Schedule::Cons([head, rest]) => {
                load_cost(costs(*head).load().add(&costs(*rest).load()))
            }
            Schedule::ForwardPack(list) => {
                let load = costs(*list).load();
                let seconds = self.timer.borrow_mut().seconds(Direction::Forward, &load);
                self.pack(Direction::Forward, seconds)
            }
            Schedule::BackwardPack(list) => {
                let load = costs(*list).load();
                let seconds = self.timer.borrow_mut().seconds(Direction::Backward, &load);
                self.pack(Direction::Backward, seconds)
            }
            Schedule::End => self.sequence(SequenceCost::default()),
            Schedule::ForwardSeq([pack, rest]) | Schedule::BackwardSeq([pack, rest]) => {
                let sequence = costs(*rest).sequence().then(costs(*pack).pack());
                self.sequence(sequence)
            }
            Schedule::ForwardKeep([kept, rest]) | Schedule::BackwardKeep([kept, rest]) => {
                let Value::Kept(kept) = costs(*kept).value else {
                    panic!("a keep node holds a kept run; this is a bug")
                };
                let direction = match enode {
                    Schedule::ForwardKeep(_) => Direction::Forward,
                    _ => Direction::Backward,
                };
                let run = self.facts.kept_cost(direction, kept);
                self.sequence(run.join(&costs(*rest).sequence()))
            }
            Schedule::Replica(_) => {
                let total: f64 = enode
                    .children()
                    .iter()
                    .map(|&c| costs(c).sequence().total(stages))
                    .sum();
                TermCost {
                    value: Value::Replica(total),
                    rank: (total, 0.0),
                }
            }
            Schedule::Idle | Schedule::Work(_) | Schedule::Pair(_) | Schedule::WholeSample(_) => {
                panic!(
                    "{enode:?} in a replica's e-graph (rank pairs have their own); this is a bug"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::Spec;

    fn spans(list: &[(u32, u32, u32)]) -> Vec<Span> {
        list.iter()
            .map(|&(sample, start, len)| Span { sample, start, len })
            .collect()
    }

    /// The decomposition must stay equal to the machine model's own pack time, on the slowest
    /// stage, with and without a CP group.
    #[test]
    fn pack_seconds_equal_the_machine_model() {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=4,dp=4").unwrap();
        let model = CostModel::new(&spec);
        let slices = spans(&[(0, 0, 8192), (0, 8192, 8192), (1, 0, 300), (2, 4096, 5000)]);
        let raw: Vec<(u64, u64)> = slices
            .iter()
            .map(|s| (u64::from(s.len), u64::from(s.start)))
            .collect();
        for ranks in [vec![0], vec![0, 1]] {
            let mut timer = PackTimer::new(model.clone(), ranks.clone());
            for direction in [Direction::Forward, Direction::Backward] {
                let expected = (0..4)
                    .map(|stage| {
                        model
                            .pack_time_on(stage, &raw, direction, &ranks)
                            .critical_path_s()
                    })
                    .fold(0.0, f64::max);
                let actual = timer.pack_seconds(direction, &slices);
                assert!(
                    (actual - expected).abs() <= 1e-9 * expected,
                    "{ranks:?} {direction:?}: {actual} vs {expected}"
                );
            }
        }
    }

    #[test]
    fn a_sequence_pays_fill_and_drain_on_its_largest_pack() {
        let sequence = SequenceCost::default().then(1.0).then(3.0).then(2.0);
        assert_eq!(sequence, SequenceCost { sum: 6.0, max: 3.0 });
        assert_eq!(sequence.total(4), 15.0);
        assert_eq!(sequence.total(1), 6.0);
    }
}
