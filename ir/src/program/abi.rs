//! The runtime's C ABI, declared once: one function per [`Op`] kind, its symbol, the dialect op
//! it lowers from, and what each argument means. The MLIR lowering emits its declarations and
//! calls from this table, and the runtime binds its `extern "C"` functions to it (and checks
//! that it binds every one); [`abi_call`] is the one mapping from an op to its call.
//!
//! Every argument is an `i64`: the calling worker's `dp` and `pp` first, then the pack id, the
//! direction (0 = forward, 1 = backward) and peers as `dp`, `pp`; a CP group is passed as a
//! pointer to its DP ranks and their count.

use std::fmt;

use super::{Op, Worker};
use crate::step::Direction;

/// What an argument of a C ABI function carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// One `i64`, named as the dialect op's attribute of the same name.
    Int(&'static str),
    /// A CP group: a pointer to its DP ranks (`i64`s) and their count, from the dialect op's
    /// `group` array attribute.
    Group,
}

/// One function of the C ABI.
#[derive(Debug, PartialEq, Eq)]
pub struct Function {
    /// The exported symbol (`slimpack_rt_forward`).
    pub symbol: &'static str,
    /// The `slimpack` dialect op it lowers from (`slimpack.forward`).
    pub dialect_op: &'static str,
    /// The op kind, as calls print (`Forward`).
    pub kind: &'static str,
    pub params: &'static [Param],
}

const DEVICE: [Param; 2] = [Param::Int("dp"), Param::Int("pp")];

pub const FORWARD: Function = Function {
    symbol: "slimpack_rt_forward",
    dialect_op: "slimpack.forward",
    kind: "Forward",
    params: &[DEVICE[0], DEVICE[1], Param::Int("pack")],
};
pub const BACKWARD: Function = Function {
    symbol: "slimpack_rt_backward",
    dialect_op: "slimpack.backward",
    kind: "Backward",
    params: &[DEVICE[0], DEVICE[1], Param::Int("pack")],
};
pub const CP_EXCHANGE: Function = Function {
    symbol: "slimpack_rt_cp_exchange",
    dialect_op: "slimpack.cp_exchange",
    kind: "CpExchange",
    params: &[
        DEVICE[0],
        DEVICE[1],
        Param::Int("pack"),
        Param::Int("direction"),
        Param::Group,
    ],
};
pub const SEND: Function = Function {
    symbol: "slimpack_rt_send",
    dialect_op: "slimpack.send",
    kind: "Send",
    params: &[
        DEVICE[0],
        DEVICE[1],
        Param::Int("pack"),
        Param::Int("direction"),
        Param::Int("to_dp"),
        Param::Int("to_pp"),
    ],
};
pub const RECV: Function = Function {
    symbol: "slimpack_rt_recv",
    dialect_op: "slimpack.recv",
    kind: "Recv",
    params: &[
        DEVICE[0],
        DEVICE[1],
        Param::Int("pack"),
        Param::Int("direction"),
        Param::Int("from_dp"),
        Param::Int("from_pp"),
    ],
};
pub const REDUCE_SCATTER: Function = Function {
    symbol: "slimpack_rt_reduce_scatter",
    dialect_op: "slimpack.reduce_scatter",
    kind: "ReduceScatter",
    params: &DEVICE,
};
pub const OPTIMIZER: Function = Function {
    symbol: "slimpack_rt_optimizer",
    dialect_op: "slimpack.optimizer",
    kind: "Optimizer",
    params: &DEVICE,
};
pub const ALL_GATHER: Function = Function {
    symbol: "slimpack_rt_all_gather",
    dialect_op: "slimpack.all_gather",
    kind: "AllGather",
    params: &DEVICE,
};

/// Every function of the C ABI.
pub const FUNCTIONS: [&Function; 8] = [
    &FORWARD,
    &BACKWARD,
    &CP_EXCHANGE,
    &SEND,
    &RECV,
    &REDUCE_SCATTER,
    &OPTIMIZER,
    &ALL_GATHER,
];

/// The function a dialect op lowers to.
pub fn function_for_dialect_op(name: &str) -> Option<&'static Function> {
    FUNCTIONS.into_iter().find(|f| f.dialect_op == name)
}

/// One call through the C ABI: the function, its `i64` arguments in parameter order (a group
/// parameter excluded), and the group's ranks (empty for functions without one).
#[derive(Clone, PartialEq, Eq)]
pub struct Call {
    pub function: &'static Function,
    pub args: Vec<i64>,
    pub group: Vec<i64>,
}

impl fmt::Debug for Call {
    /// `Send { dp: 1, pp: 1, pack: 4, direction: 1, to_dp: 1, to_pp: 0 }`: stable across
    /// builds (execution traces are hashed from it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {{ ", self.function.kind)?;
        let mut args = self.args.iter();
        let mut fields = Vec::new();
        for param in self.function.params {
            match param {
                Param::Int(name) => {
                    let value = args.next().map_or("?".to_string(), i64::to_string);
                    fields.push(format!("{name}: {value}"));
                }
                Param::Group => fields.push(format!("group: {:?}", self.group)),
            }
        }
        write!(f, "{} }}", fields.join(", "))
    }
}

/// The direction's argument value.
pub fn direction_code(direction: Direction) -> i64 {
    match direction {
        Direction::Forward => 0,
        Direction::Backward => 1,
    }
}

/// The call that runs `op` on worker (`dp`, `pp`).
pub fn abi_call(dp: i64, pp: i64, op: &Op) -> Call {
    let peer = |worker: &Worker| [i64::from(worker.dp), i64::from(worker.pp)];
    let (function, rest, group): (&'static Function, Vec<i64>, Vec<i64>) = match op {
        Op::Forward { pack, .. } => (&FORWARD, vec![i64::from(*pack)], Vec::new()),
        Op::Backward { pack, .. } => (&BACKWARD, vec![i64::from(*pack)], Vec::new()),
        Op::CpExchange {
            pack,
            direction,
            group,
            ..
        } => (
            &CP_EXCHANGE,
            vec![i64::from(*pack), direction_code(*direction)],
            group.iter().map(|&rank| i64::from(rank)).collect(),
        ),
        Op::Send {
            pack,
            direction,
            to,
            ..
        } => (
            &SEND,
            [[i64::from(*pack), direction_code(*direction)], peer(to)].concat(),
            Vec::new(),
        ),
        Op::Recv {
            pack,
            direction,
            from,
            ..
        } => (
            &RECV,
            [[i64::from(*pack), direction_code(*direction)], peer(from)].concat(),
            Vec::new(),
        ),
        Op::ReduceScatter => (&REDUCE_SCATTER, Vec::new(), Vec::new()),
        Op::Optimizer => (&OPTIMIZER, Vec::new(), Vec::new()),
        Op::AllGather => (&ALL_GATHER, Vec::new(), Vec::new()),
    };
    Call {
        function,
        args: [vec![dp, pp], rest].concat(),
        group,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::Part;

    #[test]
    fn every_call_has_one_argument_per_integer_parameter() {
        let ops = [
            Op::Forward { pack: 1, chunk: 0 },
            Op::Backward {
                pack: 1,
                chunk: 0,
                part: Part::Whole,
            },
            Op::CpExchange {
                pack: 1,
                direction: Direction::Backward,
                group: vec![0, 1],
                chunk: 0,
            },
            Op::Send {
                pack: 1,
                direction: Direction::Forward,
                to: Worker { dp: 0, pp: 1 },
                chunk: 0,
            },
            Op::Recv {
                pack: 1,
                direction: Direction::Backward,
                from: Worker { dp: 0, pp: 1 },
                chunk: 0,
            },
            Op::ReduceScatter,
            Op::Optimizer,
            Op::AllGather,
        ];
        for (op, function) in ops.iter().zip(FUNCTIONS) {
            let call = abi_call(3, 2, op);
            assert_eq!(call.function, function);
            let ints = function
                .params
                .iter()
                .filter(|p| matches!(p, Param::Int(_)))
                .count();
            assert_eq!(call.args.len(), ints, "{}", function.symbol);
            assert_eq!(call.args[..2], [3, 2]);
            assert_eq!(function_for_dialect_op(function.dialect_op), Some(function));
        }
        assert_eq!(
            format!("{:?}", abi_call(1, 1, &ops[2])),
            "CpExchange { dp: 1, pp: 1, pack: 1, direction: 1, group: [0, 1] }"
        );
    }
}
