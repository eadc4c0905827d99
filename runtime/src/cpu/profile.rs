//! Per-op wall time of the thread that runs a pack: where a worker's compute time goes.
//!
//! Code opens a [`scope`] of an [`OpClass`] around a piece of work; scopes nest, and each
//! scope's *exclusive* time (its wall time minus that of the scopes opened inside it) is added
//! to the thread's total of its class. A pack opens [`pack_scope`]: everything it does that no
//! inner scope claims (norms, RoPE, SwiGLU, residual adds, embedding, loss, copies, allocation)
//! counts as element-wise work of its direction. Every GEMM claims its time as a GEMM of the
//! pack's direction ([`gemm_scope`]) unless it runs inside the attention, whose GEMMs are the
//! attention's. The classes are those of the cost model's achieved-rate tables, so that a
//! measured pack can be compared with the prediction term by term.
//!
//! [`take`] returns this thread's totals and resets them. Timing costs two clock reads per
//! scope (tens of nanoseconds, against microseconds of work per scope).

use std::cell::RefCell;
use std::ops::AddAssign;
use std::time::Instant;

use serde::Serialize;
use slimpack_ir::step::Direction;

/// What a piece of a worker's time was spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpClass {
    GemmForward,
    GemmBackward,
    AttentionForward,
    AttentionBackward,
    ElementwiseForward,
    ElementwiseBackward,
    /// Waiting for and copying the K/V (gradients) of the other workers of a DP-Merge group.
    Exchange,
}

const CLASSES: usize = 7;
const MAX_DEPTH: usize = 8;

/// Seconds per [`OpClass`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct OpTimes {
    pub gemm_forward_s: f64,
    pub gemm_backward_s: f64,
    pub attention_forward_s: f64,
    pub attention_backward_s: f64,
    pub elementwise_forward_s: f64,
    pub elementwise_backward_s: f64,
    pub exchange_s: f64,
}

impl OpTimes {
    fn from_array(totals: [f64; CLASSES]) -> OpTimes {
        OpTimes {
            gemm_forward_s: totals[0],
            gemm_backward_s: totals[1],
            attention_forward_s: totals[2],
            attention_backward_s: totals[3],
            elementwise_forward_s: totals[4],
            elementwise_backward_s: totals[5],
            exchange_s: totals[6],
        }
    }

    /// All classes together.
    pub fn total_s(&self) -> f64 {
        self.gemm_forward_s
            + self.gemm_backward_s
            + self.attention_forward_s
            + self.attention_backward_s
            + self.elementwise_forward_s
            + self.elementwise_backward_s
            + self.exchange_s
    }
}

impl AddAssign for OpTimes {
    fn add_assign(&mut self, other: OpTimes) {
        self.gemm_forward_s += other.gemm_forward_s;
        self.gemm_backward_s += other.gemm_backward_s;
        self.attention_forward_s += other.attention_forward_s;
        self.attention_backward_s += other.attention_backward_s;
        self.elementwise_forward_s += other.elementwise_forward_s;
        self.elementwise_backward_s += other.elementwise_backward_s;
        self.exchange_s += other.exchange_s;
    }
}

#[derive(Clone, Copy)]
struct Frame {
    class: OpClass,
    start: Option<Instant>,
    /// Wall time of the scopes opened inside this one.
    children_s: f64,
}

struct State {
    totals: [f64; CLASSES],
    stack: [Frame; MAX_DEPTH],
    depth: usize,
    direction: Direction,
}

const EMPTY: Frame = Frame {
    class: OpClass::ElementwiseForward,
    start: None,
    children_s: 0.0,
};

thread_local! {
    static STATE: RefCell<State> = const {
        RefCell::new(State {
            totals: [0.0; CLASSES],
            stack: [EMPTY; MAX_DEPTH],
            depth: 0,
            direction: Direction::Forward,
        })
    };
}

/// An open scope; closing it (dropping) books its exclusive time.
#[must_use = "a scope measures until it is dropped"]
pub(crate) struct Scope {
    open: bool,
    /// The pack direction to restore (for pack scopes).
    restore: Option<Direction>,
}

/// Opens a scope of `class`.
pub(crate) fn scope(class: OpClass) -> Scope {
    let open = STATE.with(|state| {
        let mut state = state.borrow_mut();
        if state.depth == MAX_DEPTH {
            return false;
        }
        let depth = state.depth;
        state.stack[depth] = Frame {
            class,
            start: Some(Instant::now()),
            children_s: 0.0,
        };
        state.depth += 1;
        true
    });
    Scope {
        open,
        restore: None,
    }
}

/// Opens the base scope of a pack running in `direction`.
pub(crate) fn pack_scope(direction: Direction) -> Scope {
    let previous =
        STATE.with(|state| std::mem::replace(&mut state.borrow_mut().direction, direction));
    let class = match direction {
        Direction::Forward => OpClass::ElementwiseForward,
        Direction::Backward => OpClass::ElementwiseBackward,
    };
    let mut scope = scope(class);
    scope.restore = Some(previous);
    scope
}

/// Opens the scope of one GEMM: a GEMM of the pack's direction, or nothing inside attention.
pub(crate) fn gemm_scope() -> Option<Scope> {
    let class = STATE.with(|state| {
        let state = state.borrow();
        let inner = state.depth.checked_sub(1).map(|d| state.stack[d].class);
        match (inner, state.direction) {
            (Some(OpClass::AttentionForward | OpClass::AttentionBackward), _) => None,
            (_, Direction::Forward) => Some(OpClass::GemmForward),
            (_, Direction::Backward) => Some(OpClass::GemmBackward),
        }
    })?;
    Some(scope(class))
}

impl Drop for Scope {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        STATE.with(|state| {
            let mut state = state.borrow_mut();
            state.depth -= 1;
            let frame = state.stack[state.depth];
            let elapsed = frame.start.map_or(0.0, |s| s.elapsed().as_secs_f64());
            state.totals[frame.class as usize] += elapsed - frame.children_s;
            if let Some(parent) = state.depth.checked_sub(1) {
                state.stack[parent].children_s += elapsed;
            }
            if let Some(direction) = self.restore {
                state.direction = direction;
            }
        });
    }
}

/// CPU seconds the calling thread has run (`CLOCK_THREAD_CPUTIME_ID`): beside its wall time,
/// it tells whether the thread was preempted.
pub fn thread_cpu_s() -> f64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through the valid pointer it is given.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    assert_eq!(
        status, 0,
        "bug: the thread CPU clock is always available on Linux"
    );
    time.tv_sec as f64 + time.tv_nsec as f64 * 1e-9
}

/// This thread's totals since the last call; resets them.
pub fn take() -> OpTimes {
    STATE.with(|state| {
        let mut state = state.borrow_mut();
        OpTimes::from_array(std::mem::take(&mut state.totals))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(seconds: f64) {
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds {}
    }

    #[test]
    fn nested_scopes_book_exclusive_time_to_their_class() {
        take();
        let start = Instant::now();
        {
            let _pack = pack_scope(Direction::Backward);
            spin(0.002);
            {
                let _gemm = gemm_scope();
                spin(0.003);
            }
            {
                let _attention = scope(OpClass::AttentionBackward);
                let inner = gemm_scope();
                assert!(inner.is_none(), "an attention GEMM is the attention's");
                spin(0.001);
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let times = take();
        assert!(times.gemm_backward_s >= 0.003, "{times:?}");
        assert!(times.attention_backward_s >= 0.001, "{times:?}");
        assert!(times.elementwise_backward_s >= 0.002, "{times:?}");
        // Exclusive times partition the outer scope: nothing is counted twice.
        assert!(times.total_s() <= elapsed, "{times:?} in {elapsed} s");
        assert_eq!(times.gemm_forward_s, 0.0);
        assert_eq!(take(), OpTimes::default());
    }
}
