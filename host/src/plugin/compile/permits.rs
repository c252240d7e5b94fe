//! A bound on how many Cranelift compiles run at once.
//!
//! Invariants: at most `max` (at least 1) permits are out at a time, foreground and
//! background together; a caller beyond that blocks until one is returned; a permit is
//! returned when dropped, on every path. A background caller (a tier-up compile) also waits
//! while any foreground caller (a load someone is waiting for) is waiting, so background
//! work never takes a permit a load could have had.
//!
//! Hand-written (a mutex, a condition variable and a count) because the compiles run on
//! blocking threads and tokio's semaphore has no blocking acquire; wasmtime already spreads
//! each compile over every core, so more at once only adds memory (each holds its IR).

use parking_lot::{Condvar, Mutex};

/// Counts compiles in progress.
pub(crate) struct CompilePermits {
    max: usize,
    state: Mutex<PermitsState>,
    freed: Condvar,
}

#[derive(Default)]
struct PermitsState {
    /// Permits out.
    running: usize,
    /// Foreground callers waiting for a permit.
    waiting: usize,
}

/// One compile's permission to run; returned on drop.
pub(crate) struct Permit<'a>(&'a CompilePermits);

impl CompilePermits {
    /// A gate letting `max` (at least 1) callers through at once.
    pub fn new(max: usize) -> Self {
        CompilePermits { max: max.max(1), state: Mutex::new(PermitsState::default()), freed: Condvar::new() }
    }

    /// Waits for a free permit (a compile a load waits for).
    pub fn enter(&self) -> Permit<'_> {
        let mut s = self.state.lock();
        s.waiting += 1;
        while s.running >= self.max {
            self.freed.wait(&mut s);
        }
        s.waiting -= 1;
        s.running += 1;
        Permit(self)
    }

    /// Waits for a free permit that no foreground caller is waiting for (a compile nobody
    /// waits for).
    pub fn enter_background(&self) -> Permit<'_> {
        let mut s = self.state.lock();
        while s.running >= self.max || s.waiting > 0 {
            self.freed.wait(&mut s);
        }
        s.running += 1;
        Permit(self)
    }

    /// Every permit (tests hold back background compiles with it).
    #[cfg(test)]
    pub fn enter_all(&self) -> Vec<Permit<'_>> {
        (0..self.max).map(|_| self.enter()).collect()
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.state.lock().running -= 1;
        // Every waiter re-checks: a background one may not take what a foreground one can.
        self.0.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn never_more_than_max_at_once() {
        let gate = Arc::new(CompilePermits::new(2));
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
        assert_eq!(gate.state.lock().running, 0, "every permit came back");
    }

    #[test]
    fn background_callers_wait_behind_foreground_ones() {
        let gate = Arc::new(CompilePermits::new(1));
        let held = gate.enter();
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let spawn = |background: bool| {
            let (gate, order) = (gate.clone(), order.clone());
            std::thread::spawn(move || {
                let _permit = if background { gate.enter_background() } else { gate.enter() };
                order.lock().push(if background { "background" } else { "foreground" });
            })
        };
        let background = spawn(true);
        let foreground = spawn(false);
        // Both wait behind the held permit (the foreground one counted as waiting).
        while gate.state.lock().waiting == 0 {
            std::thread::yield_now();
        }
        drop(held);
        for t in [background, foreground] {
            t.join().unwrap_or_else(|_| panic!("thread panicked"));
        }
        assert_eq!(*order.lock(), ["foreground", "background"]);
    }
}
