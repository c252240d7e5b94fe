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
//! - With a [`SlotQuota`] ([`Pool::with_quota`]), every live instance holds one of the
//!   host's instance slots: a new instance is created only once the quota grants a slot,
//!   else the checkout waits (until the deadline) for one of its own instances or a slot
//!   to come back. Slots are given back with the pool's lock released.

use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::instance_slots::{SlotQuota, SlotWaiter};

/// A bounded pool of `T`.
pub struct Pool<T> {
    max: usize,
    shared: Arc<PoolInner<T>>,
    /// The host's slots this pool's instances take (dropped after the instances).
    quota: Option<SlotQuota>,
}

/// What checkouts wait on, shared with the slots (which wake waiting checkouts).
struct PoolInner<T> {
    state: Mutex<PoolState<T>>,
    freed: Condvar,
}

impl<T: Send> SlotWaiter for PoolInner<T> {
    fn wake(&self) {
        // Under the lock: a checkout that was refused a slot is waiting by now.
        let _s = self.state.lock();
        self.freed.notify_all();
    }
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
    /// All the items the pool could have (its size, or the instance slots the host could
    /// grant it) stayed checked out until the deadline.
    #[error("all {0} instances stayed busy until the call's deadline")]
    Exhausted(usize),
    /// The pool had no instance and the host granted it no slot before the deadline (every
    /// slot in use by other plugins' calls).
    #[error("no instance slot of the host became free before the call's deadline")]
    NoSlot,
    /// Creating a new item failed.
    #[error(transparent)]
    Create(E),
}

impl<T> Pool<T> {
    /// A pool of at most `max` (at least 1) live items.
    pub fn new(max: usize) -> Self {
        Self::with_quota(max, None)
    }

    /// A pool of at most `max` (at least 1) live items, each holding a slot of `quota`.
    pub fn with_quota(max: usize, quota: Option<SlotQuota>) -> Self {
        Pool {
            max: max.max(1),
            shared: Arc::new(PoolInner {
                state: Mutex::new(PoolState {
                    idle: Vec::new(),
                    live: 0,
                    generation: 0,
                    last_active: Instant::now(),
                }),
                freed: Condvar::new(),
            }),
            quota,
        }
    }

    /// Gives back `n` slots of dropped instances (the pool's lock released).
    fn give_back(&self, n: usize) {
        if let Some(q) = &self.quota {
            q.release(n);
        }
    }

    /// An idle instance, or a new one from `create` when below `max`, or waits for one to
    /// come back until `deadline`.
    pub fn checkout<E>(
        &self,
        deadline: Instant,
        create: impl FnOnce() -> Result<T, E>,
    ) -> Result<Lease<'_, T>, CheckoutError<E>>
    where
        T: Send + 'static,
    {
        let waiter = Arc::downgrade(&self.shared) as Weak<dyn SlotWaiter>;
        let mut s = self.shared.state.lock();
        loop {
            s.last_active = Instant::now();
            let generation = s.generation;
            if let Some((item, _)) = s.idle.pop() {
                return Ok(Lease { pool: self, item: Some(item), poisoned: false, generation });
            }
            if s.live < self.max && self.quota.as_ref().is_none_or(|q| q.try_acquire(&waiter)) {
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
            if self.shared.freed.wait_until(&mut s, deadline).timed_out() {
                return Err(if s.live == 0 {
                    CheckoutError::NoSlot
                } else {
                    CheckoutError::Exhausted(s.live)
                });
            }
        }
    }

    /// An idle instance, if one is waiting; never creates one and never waits (for a caller
    /// that must not block its thread: it makes a blocking [`Pool::checkout`] elsewhere
    /// otherwise).
    pub fn checkout_idle(&self) -> Option<Lease<'_, T>> {
        let mut s = self.shared.state.lock();
        let generation = s.generation;
        let (item, _) = s.idle.pop()?;
        s.last_active = Instant::now();
        Some(Lease { pool: self, item: Some(item), poisoned: false, generation })
    }

    fn release_slot(&self) {
        {
            let mut s = self.shared.state.lock();
            s.last_active = Instant::now();
            s.live -= 1;
            self.shared.freed.notify_one();
        }
        self.give_back(1);
    }

    /// (idle, live) counts.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.shared.state.lock();
        (s.idle.len(), s.live)
    }

    /// Drops every idle instance (checked-out ones are dropped on return as usual).
    pub fn clear_idle(&self) {
        let idle = {
            let mut s = self.shared.state.lock();
            let idle = std::mem::take(&mut s.idle);
            s.live -= idle.len();
            self.shared.freed.notify_all();
            idle
        };
        let n = idle.len();
        drop(idle);
        self.give_back(n);
    }

    /// Starts a new generation: drops the idle instances now and each checked-out one when
    /// its lease ends; later checkouts get only instances created from now on.
    pub fn renew(&self) {
        let idle = {
            let mut s = self.shared.state.lock();
            s.generation += 1;
            let idle = std::mem::take(&mut s.idle);
            s.live -= idle.len();
            self.shared.freed.notify_all();
            idle
        };
        // Dropped outside the lock: tearing a store down is not free.
        let n = idle.len();
        drop(idle);
        self.give_back(n);
    }

    /// Whether the pool has been inactive (nothing checked out or returned) since `cutoff`
    /// or earlier.
    pub fn inactive_since(&self, cutoff: Instant) -> bool {
        self.shared.state.lock().last_active <= cutoff
    }

    /// Runs `f` under the pool's lock when no instance is alive (idle or checked out) and
    /// the pool has been inactive since `cutoff` or earlier; `None` otherwise. A checkout
    /// waits for `f`, so keep it short (take something out; drop it after).
    pub fn when_unused_since<R>(&self, cutoff: Instant, f: impl FnOnce() -> R) -> Option<R> {
        let s = self.shared.state.lock();
        (s.live == 0 && s.last_active <= cutoff).then(f)
    }

    /// Drops the instances idle since `cutoff` or earlier; returns how many.
    pub fn release_idle_since(&self, cutoff: Instant) -> usize {
        let released = {
            let mut s = self.shared.state.lock();
            // Oldest first: the instances to release are a prefix.
            let n = s.idle.partition_point(|(_, since)| *since <= cutoff);
            let released: Vec<_> = s.idle.drain(..n).collect();
            s.live -= released.len();
            if !released.is_empty() {
                self.shared.freed.notify_all();
            }
            released
        };
        let n = released.len();
        // Dropped outside the lock: tearing a store down is not free.
        drop(released);
        self.give_back(n);
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

    /// Takes [`Lease::poison`] back: the instance returns to the pool when the lease ends.
    /// (A call that may be abandoned half-way, a future dropped at an await, poisons its
    /// lease first and clears the mark once the call finished cleanly.)
    pub fn unpoison(&mut self) {
        self.poisoned = false;
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
            let mut s = self.pool.shared.state.lock();
            s.last_active = Instant::now();
            if s.generation == self.generation {
                s.idle.push((item, Instant::now()));
                self.pool.shared.freed.notify_one();
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
    fn a_checkout_waiting_for_a_slot_is_woken_when_another_pool_gives_one_back() {
        let slots = super::super::instance_slots::InstanceSlots::new(2, 2);
        let quota = |n| slots.register(n, n - 1).unwrap_or_else(|e| panic!("{e}"));
        let hog = Pool::with_quota(2, Some(quota(2)));
        let far = Instant::now() + Duration::from_secs(60);
        let held = hog.checkout(far, ok(1)).unwrap_or_else(|_| panic!());
        // Alone, the hog may take the second slot too; the late pool's floor then waits.
        let extra = hog.checkout(far, ok(2)).unwrap_or_else(|_| panic!());
        let late = Arc::new(Pool::with_quota(2, Some(quota(2))));
        assert!(matches!(late.checkout(Instant::now(), ok(3)), Err(CheckoutError::NoSlot)));
        let l = late.clone();
        let waiter = std::thread::spawn(move || {
            let mut lease = l.checkout(far, ok(4)).unwrap_or_else(|_| panic!());
            *lease.get()
        });
        // The hog's extra goes (its call trapped): its slot goes to the late pool.
        let mut extra = extra;
        extra.poison();
        drop(extra);
        assert_eq!(waiter.join().unwrap_or_default(), 4);
        drop(held);
        assert_eq!(late.counts(), (1, 1));
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
