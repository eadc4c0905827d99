//! The runtime's side of the C ABI (declared once in [`slimpack_ir::program::abi`]): one
//! `extern "C"` function per program op, which a compiled schedule driver (codegen's MLIR
//! lowering, compiled by its LLVM backend) calls, and an interpreter that walks a [`Program`]
//! calling the very same functions.
//!
//! A call goes to the handler installed on the calling thread with [`with_handler`], as an
//! [`abi::Call`]; [`record`] installs one that collects the calls, which is how the interpreted
//! and the compiled paths are compared. A call with no handler installed is a bug in the caller
//! (nothing would run the op); it aborts, since unwinding cannot cross the C ABI.

use std::cell::RefCell;

use slimpack_ir::program::abi::{self, abi_call, Function};
use slimpack_ir::program::{Program, WorkerProgram};

pub use slimpack_ir::program::abi::Call;

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

fn call(function: &'static Function, args: Vec<i64>) {
    dispatch(Call {
        function,
        args,
        group: Vec::new(),
    });
}

#[no_mangle]
pub extern "C" fn slimpack_rt_forward(dp: i64, pp: i64, pack: i64) {
    call(&abi::FORWARD, vec![dp, pp, pack]);
}

#[no_mangle]
pub extern "C" fn slimpack_rt_backward(dp: i64, pp: i64, pack: i64) {
    call(&abi::BACKWARD, vec![dp, pp, pack]);
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
    dispatch(Call {
        function: &abi::CP_EXCHANGE,
        args: vec![dp, pp, pack, direction],
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
    call(&abi::SEND, vec![dp, pp, pack, direction, to_dp, to_pp]);
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
    call(&abi::RECV, vec![dp, pp, pack, direction, from_dp, from_pp]);
}

#[no_mangle]
pub extern "C" fn slimpack_rt_reduce_scatter(dp: i64, pp: i64) {
    call(&abi::REDUCE_SCATTER, vec![dp, pp]);
}

#[no_mangle]
pub extern "C" fn slimpack_rt_optimizer(dp: i64, pp: i64) {
    call(&abi::OPTIMIZER, vec![dp, pp]);
}

#[no_mangle]
pub extern "C" fn slimpack_rt_all_gather(dp: i64, pp: i64) {
    call(&abi::ALL_GATHER, vec![dp, pp]);
}

/// The address of the runtime's function for `function`: where each declared symbol is bound.
fn address(function: &Function) -> usize {
    match function.symbol {
        "slimpack_rt_forward" => slimpack_rt_forward as *const () as usize,
        "slimpack_rt_backward" => slimpack_rt_backward as *const () as usize,
        "slimpack_rt_cp_exchange" => slimpack_rt_cp_exchange as *const () as usize,
        "slimpack_rt_send" => slimpack_rt_send as *const () as usize,
        "slimpack_rt_recv" => slimpack_rt_recv as *const () as usize,
        "slimpack_rt_reduce_scatter" => slimpack_rt_reduce_scatter as *const () as usize,
        "slimpack_rt_optimizer" => slimpack_rt_optimizer as *const () as usize,
        "slimpack_rt_all_gather" => slimpack_rt_all_gather as *const () as usize,
        other => panic!("the C ABI declares {other}, which the runtime does not bind (bug)"),
    }
}

/// Every C ABI function's symbol and address, for a JIT to resolve the driver's calls.
pub fn symbols() -> Vec<(&'static str, usize)> {
    abi::FUNCTIONS
        .into_iter()
        .map(|function| (function.symbol, address(function)))
        .collect()
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
        invoke(&abi_call(dp, pp, op));
    }
}

/// Makes `call` through the exported function it names, as compiled code would.
fn invoke(call: &Call) {
    let a = &call.args;
    match call.function.symbol {
        "slimpack_rt_forward" => slimpack_rt_forward(a[0], a[1], a[2]),
        "slimpack_rt_backward" => slimpack_rt_backward(a[0], a[1], a[2]),
        // SAFETY: `call.group` is a live vector of `call.group.len()` i64s.
        "slimpack_rt_cp_exchange" => unsafe {
            slimpack_rt_cp_exchange(
                a[0],
                a[1],
                a[2],
                a[3],
                call.group.as_ptr(),
                call.group.len() as i64,
            )
        },
        "slimpack_rt_send" => slimpack_rt_send(a[0], a[1], a[2], a[3], a[4], a[5]),
        "slimpack_rt_recv" => slimpack_rt_recv(a[0], a[1], a[2], a[3], a[4], a[5]),
        "slimpack_rt_reduce_scatter" => slimpack_rt_reduce_scatter(a[0], a[1]),
        "slimpack_rt_optimizer" => slimpack_rt_optimizer(a[0], a[1]),
        "slimpack_rt_all_gather" => slimpack_rt_all_gather(a[0], a[1]),
        other => panic!("the C ABI declares {other}, which the runtime does not bind (bug)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::program::{Op, Worker};
    use slimpack_ir::step::Direction;

    #[test]
    fn every_declared_function_is_bound() {
        let symbols = symbols();
        assert_eq!(symbols.len(), abi::FUNCTIONS.len());
        let mut addresses: Vec<usize> = symbols.iter().map(|&(_, a)| a).collect();
        addresses.sort_unstable();
        addresses.dedup();
        assert_eq!(addresses.len(), symbols.len());
    }

    #[test]
    fn interpreting_a_worker_makes_the_call_of_each_op() {
        let worker = WorkerProgram {
            worker: Worker { dp: 1, pp: 1 },
            ops: vec![
                Op::Recv {
                    pack: 2,
                    direction: Direction::Forward,
                    from: Worker { dp: 1, pp: 0 },
                    chunk: 0,
                },
                Op::CpExchange {
                    pack: 2,
                    direction: Direction::Forward,
                    group: vec![0, 1],
                    chunk: 0,
                },
                Op::Forward { pack: 2, chunk: 0 },
                Op::Send {
                    pack: 4,
                    direction: Direction::Backward,
                    to: Worker { dp: 1, pp: 0 },
                    chunk: 0,
                },
                Op::ReduceScatter,
            ],
        };
        let ((), calls) = record(|| interpret_worker(&worker));
        let expected: Vec<Call> = worker.ops.iter().map(|op| abi_call(1, 1, op)).collect();
        assert_eq!(calls, expected);
        assert_eq!(
            format!("{:?}", calls[3]),
            "Send { dp: 1, pp: 1, pack: 4, direction: 1, to_dp: 1, to_pp: 0 }"
        );
        assert_eq!(calls[1].group, [0, 1]);
    }

    #[test]
    fn calls_reach_the_installed_handler_in_order_and_nesting_restores_it() {
        let ((), outer) = record(|| {
            slimpack_rt_forward(1, 0, 3);
            let ((), inner) = record(|| slimpack_rt_optimizer(1, 0));
            assert_eq!(format!("{inner:?}"), "[Optimizer { dp: 1, pp: 0 }]");
            let group = [1i64, 2];
            // SAFETY: a live array of two i64s.
            unsafe { slimpack_rt_cp_exchange(1, 0, 3, 1, group.as_ptr(), 2) };
        });
        assert_eq!(
            format!("{outer:?}"),
            "[Forward { dp: 1, pp: 0, pack: 3 }, \
             CpExchange { dp: 1, pp: 0, pack: 3, direction: 1, group: [1, 2] }]"
        );
    }
}
