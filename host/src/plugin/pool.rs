//! A bounded pool of ready plugin instances.
//!
//! Invariants:
//! - At most `max` instances are alive (idle + checked out) at once; a checkout beyond
//!   that waits for a return, at most until the caller's deadline.
//! - An instance comes back to the idle list only if its call ended cleanly; a lease
//!   dropped while marked poisoned (a trap) destroys the instance and frees its slot, so
//!   the next checkout instantiates afresh.
//! - [`Pool::renew`] starts a new generation: the idle instances are dropped at once, the
//!   checked-out ones when their lease ends (their call finishes first), and no instance of
//!   an older generation is ever handed out again. The bound on live instances holds across
//!   generations: an old instance's slot is freed only when it is dropped.
//! - Instances are created outside the pool's lock (instantiation and `init` run guest code).
//! - Each idle instance remembers when it became idle; [`Pool::release_idle_since`] drops
//!   those idle since a cutoff (outside the lock) and frees their slots. A checkout takes
//!   the most recently returned instance, so the ones left idle are the oldest.
//! - The pool remembers when it was last active (an instance checked out or returned);
//!   [`Pool::when_unused_since`] runs its closure under the pool's lock only when no
//!   instance is alive and the pool has not been active since a cutoff, so no checkout can
//!   start (or be under way) while it runs.

use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// A bounded pool of `T`.
pub struct Pool<T> {
    max: usize,
    state: Mutex<PoolState<T>>,
    freed: Condvar,
}

struct PoolState<T> {
    /// Idle instances and when each became idle, oldest first; all of the current generation.
    idle: Vec<(T, Instant)>,
    live: usize,
    /// Bumped by [`Pool::renew`].
    generation: u64,
    /// When an instance was last checked out or returned (or the pool was created).
    last_active: Instant,
}

/// Why no item could be had.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError<E> {
    /// All `max` items stayed checked out until the deadline.
    #[error("all {0} instances stayed busy until the call's deadline")]
    Exhausted(usize),
    /// Creating a new item failed.
    #[error(transparent)]
    Create(E),
}

impl<T> Pool<T> {
    /// A pool of at most `max` (at least 1) live items.
    pub fn new(max: usize) -> Self {
        Pool {
            max: max.max(1),
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                live: 0,
                generation: 0,
                last_active: Instant::now(),
            }),
            freed: Condvar::new(),
        }
    }

    /// Adds an already created instance (counts against `max`; dropped if the pool is full).
    pub fn put_new(&self, item: T) {
        let mut s = self.state.lock();
        if s.live < self.max {
            s.live += 1;
            s.idle.push((item, Instant::now()));
            self.freed.notify_one();
        }
    }

    /// An idle instance, or a new one from `create` when below `max`, or waits for one to
    /// come back until `deadline`.
    pub fn checkout<E>(
        &self,
        deadline: Instant,
        create: impl FnOnce() -> Result<T, E>,
    ) -> Result<Lease<'_, T>, CheckoutError<E>> {
        let mut s = self.state.lock();
        loop {
            s.last_active = Instant::now();
            let generation = s.generation;
            if let Some((item, _)) = s.idle.pop() {
                return Ok(Lease { pool: self, item: Some(item), poisoned: false, generation });
            }
            if s.live < self.max {
                s.live += 1;
                drop(s);
                // Created for this generation: if the pool is renewed while `create` runs,
                // the item serves this one call and is dropped when the lease ends.
                return match create() {
                    Ok(item) => Ok(Lease { pool: self, item: Some(item), poisoned: false, generation }),
                    Err(e) => {
                        self.release_slot();
                        Err(CheckoutError::Create(e))
                    }
                };
            }
            if self.freed.wait_until(&mut s, deadline).timed_out() {
                return Err(CheckoutError::Exhausted(self.max));
            }
        }
    }

    fn release_slot(&self) {
        let mut s = self.state.lock();
        s.last_active = Instant::now();
        s.live -= 1;
        self.freed.notify_one();
    }

    /// (idle, live) counts.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.state.lock();
        (s.idle.len(), s.live)
    }

    /// Drops every idle instance (checked-out ones are dropped on return as usual).
    pub fn clear_idle(&self) {
        let idle = {
            let mut s = self.state.lock();
            let idle = std::mem::take(&mut s.idle);
            s.live -= idle.len();
            self.freed.notify_all();
            idle
        };
        drop(idle);
    }

    /// Starts a new generation: drops the idle instances now and each checked-out one when
    /// its lease ends; later checkouts get only instances created from now on.
    pub fn renew(&self) {
        let idle = {
            let mut s = self.state.lock();
            s.generation += 1;
            let idle = std::mem::take(&mut s.idle);
            s.live -= idle.len();
            self.freed.notify_all();
            idle
        };
        // Dropped outside the lock: tearing a store down is not free.
        drop(idle);
    }

    /// Whether the pool has been inactive (nothing checked out or returned) since `cutoff`
    /// or earlier.
    pub fn inactive_since(&self, cutoff: Instant) -> bool {
        self.state.lock().last_active <= cutoff
    }

    /// Runs `f` under the pool's lock when no instance is alive (idle or checked out) and
    /// the pool has been inactive since `cutoff` or earlier; `None` otherwise. A checkout
    /// waits for `f`, so keep it short (take something out; drop it after).
    pub fn when_unused_since<R>(&self, cutoff: Instant, f: impl FnOnce() -> R) -> Option<R> {
        let s = self.state.lock();
        (s.live == 0 && s.last_active <= cutoff).then(f)
    }

    /// Drops the instances idle since `cutoff` or earlier; returns how many.
    pub fn release_idle_since(&self, cutoff: Instant) -> usize {
        let released = {
            let mut s = self.state.lock();
            // Oldest first: the instances to release are a prefix.
            let n = s.idle.partition_point(|(_, since)| *since <= cutoff);
            let released: Vec<_> = s.idle.drain(..n).collect();
            s.live -= released.len();
            if !released.is_empty() {
                self.freed.notify_all();
            }
            released
        };
        let n = released.len();
        // Dropped outside the lock: tearing a store down is not free.
        drop(released);
        n
    }
}

/// A checked-out instance; returns to the pool on drop unless poisoned or of a generation
/// the pool has left.
pub struct Lease<'a, T> {
    pool: &'a Pool<T>,
    item: Option<T>,
    poisoned: bool,
    /// The pool's generation when the instance was handed out (or created).
    generation: u64,
}

impl<T> Lease<'_, T> {
    /// Marks the instance unusable: it is destroyed instead of returned.
    pub fn poison(&mut self) {
        self.poisoned = true;
    }

    /// The checked-out item.
    pub fn get(&mut self) -> &mut T {
        // `item` is only taken in `drop`.
        self.item.as_mut().unwrap_or_else(|| unreachable!("lease used after drop"))
    }
}

impl<T> Drop for Lease<'_, T> {
    fn drop(&mut self) {
        let Some(item) = self.item.take() else { return };
        if !self.poisoned {
            let mut s = self.pool.state.lock();
            s.last_active = Instant::now();
            if s.generation == self.generation {
                s.idle.push((item, Instant::now()));
                self.pool.freed.notify_one();
                return;
            }
        }
        drop(item);
        self.pool.release_slot();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn ok(v: u32) -> impl FnOnce() -> Result<u32, ()> {
        move || Ok(v)
    }

    #[test]
    fn reuses_returned_instances() {
        let pool = Pool::new(2);
        let far = Instant::now() + Duration::from_secs(60);
        {
            let mut l = pool.checkout(far, ok(1)).unwrap_or_else(|_| panic!());
            assert_eq!(*l.get(), 1);
        }
        let mut l = pool.checkout(far, ok(2)).unwrap_or_else(|_| panic!());
        assert_eq!(*l.get(), 1, "the idle instance is reused, not a new one created");
        assert_eq!(pool.counts(), (0, 1));
    }

    #[test]
    fn poisoned_instances_are_replaced() {
        let pool = Pool::new(1);
        let far = Instant::now() + Duration::from_secs(60);
        {
            let mut l = pool.checkout(far, ok(1)).unwrap_or_else(|_| panic!());
            l.poison();
        }
        assert_eq!(pool.counts(), (0, 0));
        let mut l = pool.checkout(far, ok(2)).unwrap_or_else(|_| panic!());
        assert_eq!(*l.get(), 2);
    }

    #[test]
    fn failed_creation_frees_its_slot() {
        let pool: Pool<u32> = Pool::new(1);
        let far = Instant::now() + Duration::from_secs(60);
        assert!(matches!(pool.checkout(far, || Err("boom")), Err(CheckoutError::Create("boom"))));
        assert_eq!(pool.counts(), (0, 0));
        assert!(pool.checkout(far, ok(3)).is_ok());
    }

    #[test]
    fn exhausted_pool_waits_until_deadline() {
        let pool = Pool::new(1);
        let _held = pool.checkout(Instant::now(), ok(1)).unwrap_or_else(|_| panic!());
        // Deadline already passed: no wait.
        assert!(matches!(pool.checkout(Instant::now(), ok(2)), Err(CheckoutError::Exhausted(1))));
    }

    #[test]
    fn instances_idle_since_the_cutoff_are_released() {
        let pool = Pool::new(3);
        let far = Instant::now() + Duration::from_secs(60);
        let a = pool.checkout(far, ok(1)).unwrap_or_else(|_| panic!());
        let b = pool.checkout(far, ok(2)).unwrap_or_else(|_| panic!());
        drop(a);
        let between = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        drop(b);
        assert_eq!(pool.counts(), (2, 2));
        assert_eq!(pool.release_idle_since(between - Duration::from_secs(1)), 0);
        assert_eq!(pool.release_idle_since(between), 1, "only the one idle since before `between`");
        assert_eq!(pool.counts(), (1, 1));
        let mut l = pool.checkout(far, ok(3)).unwrap_or_else(|_| panic!());
        assert_eq!(*l.get(), 2, "the younger instance stayed");
        drop(l);
        assert_eq!(pool.release_idle_since(Instant::now()), 1);
        assert_eq!(pool.counts(), (0, 0));
        let mut l = pool.checkout(far, ok(4)).unwrap_or_else(|_| panic!());
        assert_eq!(*l.get(), 4, "the next checkout creates a new instance");
    }

    #[test]
    fn renewing_drops_idle_instances_now_and_busy_ones_when_returned() {
        let pool = Arc::new(Pool::new(2));
        let far = Instant::now() + Duration::from_secs(60);
        let mut busy = pool.checkout(far, ok(1)).unwrap_or_else(|_| panic!());
        drop(pool.checkout(far, ok(2)).unwrap_or_else(|_| panic!()));
        assert_eq!(pool.counts(), (1, 2));
        pool.renew();
        assert_eq!(pool.counts(), (0, 1), "the idle instance was dropped; the busy one still counts");
        // The pool is full (the busy instance holds its slot): a checkout waits for it.
        let p = pool.clone();
        let waiter = std::thread::spawn(move || {
            let _a = p.checkout(far, ok(3)).unwrap_or_else(|_| panic!());
            let mut b = p.checkout(far, ok(4)).unwrap_or_else(|_| panic!());
            *b.get()
        });
        assert_eq!(*busy.get(), 1, "the call in flight keeps its instance");
        drop(busy);
        assert_eq!(waiter.join().unwrap_or_default(), 4, "the old instance was not handed out again");
        assert_eq!(pool.counts(), (2, 2));
        let mut again = pool.checkout(far, ok(5)).unwrap_or_else(|_| panic!());
        assert!(matches!(*again.get(), 3 | 4), "new-generation instances are reused");
    }

    #[test]
    fn unused_runs_only_without_live_instances_and_past_the_last_activity() {
        let pool = Pool::new(2);
        let far = Instant::now() + Duration::from_secs(60);
        let lease = pool.checkout(far, ok(1)).unwrap_or_else(|_| panic!());
        let later = Instant::now() + Duration::from_secs(3600);
        assert_eq!(pool.when_unused_since(later, || ()), None, "checked out");
        assert!(pool.inactive_since(later) && !pool.inactive_since(Instant::now() - Duration::from_secs(1)));
        drop(lease);
        assert_eq!(pool.when_unused_since(later, || ()), None, "idle, but alive");
        pool.clear_idle();
        let cleared = Instant::now();
        assert_eq!(pool.when_unused_since(later, || 7), Some(7));
        std::thread::sleep(Duration::from_millis(2));
        drop(pool.checkout(far, ok(2)).unwrap_or_else(|_| panic!()));
        pool.clear_idle();
        assert_eq!(pool.when_unused_since(cleared, || ()), None, "active since the cutoff");
    }

    #[test]
    fn waiter_gets_the_returned_instance() {
        let pool = Arc::new(Pool::new(1));
        let far = Instant::now() + Duration::from_secs(60);
        let held = pool.checkout(far, ok(1)).unwrap_or_else(|_| panic!());
        let p = pool.clone();
        let waiter = std::thread::spawn(move || {
            let mut l = p.checkout(far, ok(2)).unwrap_or_else(|_| panic!());
            *l.get()
        });
        drop(held);
        assert_eq!(waiter.join().unwrap_or_default(), 1);
    }
}
