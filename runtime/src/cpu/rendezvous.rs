//! [`Rendezvous`]: the in-process all-gather that every collective of the CPU runtime is built
//! on (a DP-Merge group's K/V exchange, the data-parallel gradient reduce-scatter and parameter
//! all-gather, the tied-embedding sum between pipeline ends).
//!
//! `size` threads each call [`Rendezvous::all_gather`] with a value, their rank and their own
//! round counter (how many times they called it before); each call returns every thread's value
//! of that round, by rank, shared (`Arc`, no copy). Rounds alternate between two slot sets, so a
//! fast thread can post round `r + 1` while a slow one is still collecting round `r` (it cannot
//! post `r + 2` before everyone has collected `r`: that needs everyone's round `r + 1`).
//!
//! The rendezvous lets go of a round's values once every thread collected them, so they live
//! exactly as long as the callers hold them.
//!
//! Waits give up when the shared abort flag is raised (another worker failed), so that a failed
//! step ends instead of hanging; they poll it every [`ABORT_POLL`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How often a waiting thread checks the abort flag.
pub const ABORT_POLL: Duration = Duration::from_millis(20);

/// The all-gather of `size` threads; see the module documentation.
#[derive(Debug)]
pub struct Rendezvous<T> {
    size: usize,
    state: Mutex<Slots<T>>,
    arrived: Condvar,
    abort: Arc<AtomicBool>,
}

#[derive(Debug)]
struct Slots<T> {
    /// The round each slot set holds.
    round: [u64; 2],
    /// Threads that posted to each set, and that collected from it.
    count: [usize; 2],
    collected: [usize; 2],
    values: [Vec<Option<Arc<T>>>; 2],
}

/// The rendezvous was abandoned: the abort flag was raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aborted;

impl<T> Rendezvous<T> {
    /// A rendezvous of `size` threads that gives up when `abort` is raised.
    pub fn new(size: usize, abort: Arc<AtomicBool>) -> Rendezvous<T> {
        Rendezvous {
            size,
            state: Mutex::new(Slots {
                round: [u64::MAX; 2],
                count: [0; 2],
                collected: [0; 2],
                values: [
                    (0..size).map(|_| None).collect(),
                    (0..size).map(|_| None).collect(),
                ],
            }),
            arrived: Condvar::new(),
            abort,
        }
    }

    /// Threads taking part.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Posts `value` as `rank`'s contribution to `round` and returns all contributions of that
    /// round, by rank, once every thread has posted.
    pub fn all_gather(&self, rank: usize, round: u64, value: T) -> Result<Vec<Arc<T>>, Aborted> {
        assert!(
            rank < self.size,
            "bug: rank {rank} of a rendezvous of {}",
            self.size
        );
        let set = (round % 2) as usize;
        let mut slots = self
            .state
            .lock()
            .expect("a rendezvous lock is never poisoned");
        if slots.round[set] != round {
            slots.round[set] = round;
            slots.count[set] = 0;
            slots.collected[set] = 0;
            slots.values[set].iter_mut().for_each(|v| *v = None);
        }
        slots.values[set][rank] = Some(Arc::new(value));
        slots.count[set] += 1;
        if slots.count[set] == self.size {
            self.arrived.notify_all();
        }
        while slots.count[set] < self.size {
            if self.abort.load(Ordering::Relaxed) {
                return Err(Aborted);
            }
            slots = self
                .arrived
                .wait_timeout(slots, ABORT_POLL)
                .expect("a rendezvous lock is never poisoned")
                .0;
        }
        let values = slots.values[set]
            .iter()
            .map(|v| Arc::clone(v.as_ref().expect("every rank posted")))
            .collect();
        slots.collected[set] += 1;
        if slots.collected[set] == self.size {
            // The last collector lets go of the round: its values live only as long as the
            // callers keep them.
            slots.values[set].iter_mut().for_each(|v| *v = None);
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_gather_each_round_in_rank_order_and_abort_ends_a_wait() {
        let abort = Arc::new(AtomicBool::new(false));
        let rendezvous = Rendezvous::new(3, Arc::clone(&abort));
        std::thread::scope(|scope| {
            for rank in 0..3 {
                let rendezvous = &rendezvous;
                scope.spawn(move || {
                    for round in 0..50u64 {
                        let got = rendezvous
                            .all_gather(rank, round, round * 10 + rank as u64)
                            .unwrap();
                        let values: Vec<u64> = got.iter().map(|v| **v).collect();
                        assert_eq!(values, vec![round * 10, round * 10 + 1, round * 10 + 2]);
                    }
                });
            }
        });
        let lonely = Rendezvous::new(2, Arc::clone(&abort));
        abort.store(true, Ordering::Relaxed);
        assert_eq!(lonely.all_gather(0, 0, 1u8), Err(Aborted));
    }
}
