//! The runtime's C ABI: one `extern "C"` function per program op, which a compiled schedule
//! driver (codegen's MLIR lowering, compiled by its LLVM backend) calls, and an interpreter that
//! walks a [`Program`] calling the very same functions.
//!
//! Every argument is an `i64`: the calling device's `dp` and `pp` first, then the pack id, the
//! direction (0 = forward, 1 = backward), peers as `dp`, `pp`; a CP group is a pointer to its DP
//! ranks and their count.
//!
//! A call goes to the [`Call`] handler installed on the calling thread with [`with_handler`];
//! [`record`] installs one that collects the calls, which is how the interpreted and the compiled
//! paths are compared. A call with no handler installed is a bug in the caller (nothing would
//! run the op); it aborts, since unwinding cannot cross the C ABI.

use std::cell::RefCell;

use slimpack_ir::program::{Op, Program, WorkerProgram};
use slimpack_ir::step::Direction;

/// One call through the C ABI, as a handler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Forward {
        dp: i64,
        pp: i64,
        pack: i64,
    },
    Backward {
        dp: i64,
        pp: i64,
        pack: i64,
    },
    CpExchange {
        dp: i64,
        pp: i64,
        pack: i64,
        direction: i64,
        group: Vec<i64>,
    },
    Send {
        dp: i64,
        pp: i64,
        pack: i64,
        direction: i64,
        to_dp: i64,
        to_pp: i64,
    },
    Recv {
        dp: i64,
        pp: i64,
        pack: i64,
        direction: i64,
        from_dp: i64,
        from_pp: i64,
    },
    ReduceScatter {
        dp: i64,
        pp: i64,
    },
    Optimizer {
        dp: i64,
        pp: i64,
    },
    AllGather {
        dp: i64,
        pp: i64,
    },
}

type Handler<'a> = &'a mut dyn FnMut(Call);

thread_local! {
    /// The handler of the calling thread, lifetime-erased while [`with_handler`] runs.
    static HANDLER: RefCell<Option<Handler<'static>>> = const { RefCell::new(None) };
}

/// Runs `body` with `handler` receiving this thread's C ABI calls.
pub fn with_handler<R>(handler: &mut dyn FnMut(Call), body: impl FnOnce() -> R) -> R {
    // SAFETY: the handler is removed before this function returns (the guard below runs on
    // unwinding too), so the erased lifetime never outlives the borrow.
    let erased: Handler<'static> = unsafe { std::mem::transmute(handler) };
    let previous = HANDLER.with(|slot| slot.borrow_mut().replace(erased));
    struct Restore(Option<Handler<'static>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            HANDLER.with(|slot| *slot.borrow_mut() = previous);
        }
    }
    let _restore = Restore(previous);
    body()
}

/// Runs `body` and returns what it returned with the C ABI calls it made on this thread.
pub fn record<R>(body: impl FnOnce() -> R) -> (R, Vec<Call>) {
    let mut calls = Vec::new();
    let result = with_handler(&mut |call| calls.push(call), body);
    (result, calls)
}

fn dispatch(call: Call) {
    HANDLER.with(|slot| {
        // Take the handler out while it runs, so a handler that calls the ABI itself reports
        // the missing handler instead of aliasing the borrow.
        let Some(handler) = slot.borrow_mut().take() else {
            eprintln!("slimpack runtime: {call:?} called with no handler installed (bug)");
            std::process::abort();
        };
        handler(call);
        *slot.borrow_mut() = Some(handler);
    });
}

#[no_mangle]
pub extern "C" fn slimpack_rt_forward(dp: i64, pp: i64, pack: i64) {
    dispatch(Call::Forward { dp, pp, pack });
}

#[no_mangle]
pub extern "C" fn slimpack_rt_backward(dp: i64, pp: i64, pack: i64) {
    dispatch(Call::Backward { dp, pp, pack });
}

/// # Safety
/// `group` points to `group_len` readable i64s (the driver passes a constant global).
#[no_mangle]
pub unsafe extern "C" fn slimpack_rt_cp_exchange(
    dp: i64,
    pp: i64,
    pack: i64,
    direction: i64,
    group: *const i64,
    group_len: i64,
) {
    let group = if group_len <= 0 || group.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller's contract above.
        unsafe { std::slice::from_raw_parts(group, group_len as usize) }.to_vec()
    };
    dispatch(Call::CpExchange {
        dp,
        pp,
        pack,
        direction,
        group,
    });
}

#[no_mangle]
pub extern "C" fn slimpack_rt_send(
    dp: i64,
    pp: i64,
    pack: i64,
    direction: i64,
    to_dp: i64,
    to_pp: i64,
) {
    dispatch(Call::Send {
        dp,
        pp,
        pack,
        direction,
        to_dp,
        to_pp,
    });
}

#[no_mangle]
pub extern "C" fn slimpack_rt_recv(
    dp: i64,
    pp: i64,
    pack: i64,
    direction: i64,
    from_dp: i64,
    from_pp: i64,
) {
    dispatch(Call::Recv {
        dp,
        pp,
        pack,
        direction,
        from_dp,
        from_pp,
    });
}

#[no_mangle]
pub extern "C" fn slimpack_rt_reduce_scatter(dp: i64, pp: i64) {
    dispatch(Call::ReduceScatter { dp, pp });
}

#[no_mangle]
pub extern "C" fn slimpack_rt_optimizer(dp: i64, pp: i64) {
    dispatch(Call::Optimizer { dp, pp });
}

#[no_mangle]
pub extern "C" fn slimpack_rt_all_gather(dp: i64, pp: i64) {
    dispatch(Call::AllGather { dp, pp });
}

/// Every C ABI function's symbol and address, for a JIT to resolve the driver's calls.
pub fn symbols() -> Vec<(&'static str, usize)> {
    vec![
        (
            "slimpack_rt_forward",
            slimpack_rt_forward as *const () as usize,
        ),
        (
            "slimpack_rt_backward",
            slimpack_rt_backward as *const () as usize,
        ),
        (
            "slimpack_rt_cp_exchange",
            slimpack_rt_cp_exchange as *const () as usize,
        ),
        ("slimpack_rt_send", slimpack_rt_send as *const () as usize),
        ("slimpack_rt_recv", slimpack_rt_recv as *const () as usize),
        (
            "slimpack_rt_reduce_scatter",
            slimpack_rt_reduce_scatter as *const () as usize,
        ),
        (
            "slimpack_rt_optimizer",
            slimpack_rt_optimizer as *const () as usize,
        ),
        (
            "slimpack_rt_all_gather",
            slimpack_rt_all_gather as *const () as usize,
        ),
    ]
}

fn direction_code(direction: Direction) -> i64 {
    match direction {
        Direction::Forward => 0,
        Direction::Backward => 1,
    }
}

/// The call a driver makes for `op` on worker (`dp`, `pp`).
pub fn call_of(dp: i64, pp: i64, op: &Op) -> Call {
    let pack = |pack: &u32| i64::from(*pack);
    match op {
        Op::Forward { pack: p } => Call::Forward {
            dp,
            pp,
            pack: pack(p),
        },
        Op::Backward { pack: p } => Call::Backward {
            dp,
            pp,
            pack: pack(p),
        },
        Op::CpExchange {
            pack: p,
            direction,
            group,
        } => Call::CpExchange {
            dp,
            pp,
            pack: pack(p),
            direction: direction_code(*direction),
            group: group.iter().map(|&rank| i64::from(rank)).collect(),
        },
        Op::Send {
            pack: p,
            direction,
            to,
        } => Call::Send {
            dp,
            pp,
            pack: pack(p),
            direction: direction_code(*direction),
            to_dp: i64::from(to.dp),
            to_pp: i64::from(to.pp),
        },
        Op::Recv {
            pack: p,
            direction,
            from,
        } => Call::Recv {
            dp,
            pp,
            pack: pack(p),
            direction: direction_code(*direction),
            from_dp: i64::from(from.dp),
            from_pp: i64::from(from.pp),
        },
        Op::ReduceScatter => Call::ReduceScatter { dp, pp },
        Op::Optimizer => Call::Optimizer { dp, pp },
        Op::AllGather => Call::AllGather { dp, pp },
    }
}

/// Runs `program` by walking it: every worker in program order (`pp · dp_count + dp`), its ops
/// in order, each through the C ABI function a compiled driver would call.
pub fn interpret(program: &Program) {
    for worker_program in &program.workers {
        interpret_worker(worker_program);
    }
}

/// Runs one worker's ops in order through the C ABI: the interpreted counterpart of a compiled
/// driver's `slimpack_run_device(index)`, which a runtime calls on that worker's thread.
pub fn interpret_worker(worker_program: &WorkerProgram) {
    let (dp, pp) = (
        i64::from(worker_program.worker.dp),
        i64::from(worker_program.worker.pp),
    );
    for op in &worker_program.ops {
        interpret_op(dp, pp, op);
    }
}

fn interpret_op(dp: i64, pp: i64, op: &Op) {
    match op {
        Op::Forward { pack } => slimpack_rt_forward(dp, pp, i64::from(*pack)),
        Op::Backward { pack } => slimpack_rt_backward(dp, pp, i64::from(*pack)),
        Op::CpExchange {
            pack,
            direction,
            group,
        } => {
            let group: Vec<i64> = group.iter().map(|&rank| i64::from(rank)).collect();
            // SAFETY: `group` is a live vector of `group.len()` i64s.
            unsafe {
                slimpack_rt_cp_exchange(
                    dp,
                    pp,
                    i64::from(*pack),
                    direction_code(*direction),
                    group.as_ptr(),
                    group.len() as i64,
                )
            }
        }
        Op::Send {
            pack,
            direction,
            to,
        } => slimpack_rt_send(
            dp,
            pp,
            i64::from(*pack),
            direction_code(*direction),
            i64::from(to.dp),
            i64::from(to.pp),
        ),
        Op::Recv {
            pack,
            direction,
            from,
        } => slimpack_rt_recv(
            dp,
            pp,
            i64::from(*pack),
            direction_code(*direction),
            i64::from(from.dp),
            i64::from(from.pp),
        ),
        Op::ReduceScatter => slimpack_rt_reduce_scatter(dp, pp),
        Op::Optimizer => slimpack_rt_optimizer(dp, pp),
        Op::AllGather => slimpack_rt_all_gather(dp, pp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::program::Worker;

    #[test]
    fn interpreting_a_worker_makes_the_call_of_each_op() {
        let worker = WorkerProgram {
            worker: Worker { dp: 1, pp: 1 },
            ops: vec![
                Op::Recv {
                    pack: 2,
                    direction: Direction::Forward,
                    from: Worker { dp: 1, pp: 0 },
                },
                Op::CpExchange {
                    pack: 2,
                    direction: Direction::Forward,
                    group: vec![0, 1],
                },
                Op::Forward { pack: 2 },
                Op::Send {
                    pack: 4,
                    direction: Direction::Backward,
                    to: Worker { dp: 1, pp: 0 },
                },
                Op::ReduceScatter,
            ],
        };
        let ((), calls) = record(|| interpret_worker(&worker));
        let expected: Vec<Call> = worker.ops.iter().map(|op| call_of(1, 1, op)).collect();
        assert_eq!(calls, expected);
        assert_eq!(
            calls[3],
            Call::Send {
                dp: 1,
                pp: 1,
                pack: 4,
                direction: 1,
                to_dp: 1,
                to_pp: 0
            }
        );
    }

    #[test]
    fn calls_reach_the_installed_handler_in_order_and_nesting_restores_it() {
        let ((), outer) = record(|| {
            slimpack_rt_forward(1, 0, 3);
            let ((), inner) = record(|| slimpack_rt_optimizer(1, 0));
            assert_eq!(inner, vec![Call::Optimizer { dp: 1, pp: 0 }]);
            let group = [1i64, 2];
            // SAFETY: a live array of two i64s.
            unsafe { slimpack_rt_cp_exchange(1, 0, 3, 1, group.as_ptr(), 2) };
        });
        assert_eq!(
            outer,
            vec![
                Call::Forward {
                    dp: 1,
                    pp: 0,
                    pack: 3
                },
                Call::CpExchange {
                    dp: 1,
                    pp: 0,
                    pack: 3,
                    direction: 1,
                    group: vec![1, 2]
                },
            ]
        );
    }
}
