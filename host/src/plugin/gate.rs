//! A bound on how many Cranelift compiles run at once.
//!
//! Invariants: at most `max` (at least 1) permits are out at a time; a caller beyond that
//! blocks until one is returned; a permit is returned when dropped, on every path.
//!
//! Hand-written (a mutex, a condition variable and a count) because the compiles run on
//! blocking threads and tokio's semaphore has no blocking acquire; wasmtime already spreads
//! each compile over every core, so more at once only adds memory (each holds its IR).

use parking_lot::{Condvar, Mutex};

/// Counts compiles in progress.
pub(crate) struct Gate {
    max: usize,
    running: Mutex<usize>,
    freed: Condvar,
}

/// One compile's permission to run; returned on drop.
pub(crate) struct Permit<'a>(&'a Gate);

impl Gate {
    /// A gate letting `max` (at least 1) callers through at once.
    pub fn new(max: usize) -> Self {
        Gate { max: max.max(1), running: Mutex::new(0), freed: Condvar::new() }
    }

    /// Waits for a free permit.
    pub fn enter(&self) -> Permit<'_> {
        let mut running = self.running.lock();
        while *running >= self.max {
            self.freed.wait(&mut running);
        }
        *running += 1;
        Permit(self)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.running.lock() -= 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn never_more_than_max_at_once() {
        let gate = Arc::new(Gate::new(2));
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (gate, now, most) = (gate.clone(), now.clone(), most.clone());
                std::thread::spawn(move || {
                    let _permit = gate.enter();
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap_or_else(|_| panic!("thread panicked"));
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
        assert_eq!(*gate.running.lock(), 0, "every permit came back");
    }
}
