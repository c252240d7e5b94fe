//! The host's instance slots (the pooling allocator's, shared by every plugin), handed out
//! so that no plugin can starve another of instances.
//!
//! Each loaded plugin version holds a [`SlotQuota`]. Invariants:
//! - A plugin may hold at most `per_plugin` instances (its quota's cap, the smaller of that
//!   and its pool's size); a plugin asking for more is refused at load
//!   ([`InstanceSlots::register`]) with the numbers, so no plugin can take every slot.
//! - Every registered plugin has one slot reserved for it (its floor): registering fails
//!   once every slot is some plugin's floor. A plugin's first instance comes out of its
//!   floor and only waits while slots that other plugins took beyond their floors are in
//!   use (then those are not handed out again until it got its own): a plugin always gets
//!   an instance within the other plugins' call deadlines.
//! - Beyond its floor, an instance is granted only while the slots charged (each plugin's
//!   instances, its floor counting when it has none) stay within the total: the extras of
//!   every plugin together never eat into another plugin's floor.
//! - A refused request registers its pool to be woken when a slot comes back; a wake takes
//!   the waiting pool's lock before notifying, and slots are given back with no pool lock
//!   held, so no wake is lost and no two pools wait on each other.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// Something that waits for a slot (a pool); told when one is given back.
pub trait SlotWaiter: Send + Sync {
    /// Wakes the pool's waiting checkouts (they check again).
    fn wake(&self);
}

/// The instance slots of one engine.
#[derive(Debug)]
pub struct InstanceSlots {
    total: usize,
    per_plugin: usize,
    state: Mutex<SlotsState>,
}

#[derive(Default)]
struct SlotsState {
    /// Registered quotas (each has a floor).
    plugins: usize,
    /// Σ over plugins of max(held, 1).
    charged: usize,
    /// Σ over plugins of held: instances alive.
    used: usize,
    waiters: Vec<Weak<dyn SlotWaiter>>,
}

impl std::fmt::Debug for SlotsState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotsState")
            .field("plugins", &self.plugins)
            .field("charged", &self.charged)
            .field("used", &self.used)
            .finish_non_exhaustive()
    }
}

/// Why a plugin cannot have the slots it asks for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    #[error(
        "it needs {wanted} instances (concurrency {concurrency}, plus one for hook calls) but a plugin may hold \
         at most {per_plugin} of this host's {total} instance slots: lower its concurrency to {} or less, or raise \
         max-instances-per-plugin (and instance-slots) in the host TOML",
        per_plugin.saturating_sub(1)
    )]
    OverQuota { wanted: usize, concurrency: usize, per_plugin: usize, total: usize },
    #[error(
        "every one of this host's {total} instance slots is reserved for a loaded plugin (one each): raise \
         instance-slots in the host TOML"
    )]
    Full { total: usize },
}

impl InstanceSlots {
    /// `total` slots, at most `per_plugin` (at least 1) per plugin.
    pub fn new(total: usize, per_plugin: usize) -> Arc<Self> {
        Arc::new(InstanceSlots {
            total: total.max(1),
            per_plugin: per_plugin.clamp(1, total.max(1)),
            state: Mutex::new(SlotsState::default()),
        })
    }

    /// A quota for a plugin whose pool holds up to `wanted` instances (`concurrency` + 1),
    /// with its floor reserved.
    pub fn register(self: &Arc<Self>, wanted: usize, concurrency: usize) -> Result<SlotQuota, SlotError> {
        if wanted > self.per_plugin {
            return Err(SlotError::OverQuota {
                wanted,
                concurrency,
                per_plugin: self.per_plugin,
                total: self.total,
            });
        }
        let mut s = self.state.lock();
        if s.plugins >= self.total {
            return Err(SlotError::Full { total: self.total });
        }
        s.plugins += 1;
        s.charged += 1;
        Ok(SlotQuota { slots: self.clone(), cap: wanted.max(1), held: Mutex::new(0) })
    }

    /// (instances alive, slots charged, plugins registered).
    pub fn counts(&self) -> (usize, usize, usize) {
        let s = self.state.lock();
        (s.used, s.charged, s.plugins)
    }

    fn wake(waiters: Vec<Weak<dyn SlotWaiter>>) {
        for w in waiters.iter().filter_map(Weak::upgrade) {
            w.wake();
        }
    }
}

/// One plugin's share of the slots; gives back what it holds when dropped.
#[derive(Debug)]
pub struct SlotQuota {
    slots: Arc<InstanceSlots>,
    cap: usize,
    /// Instances this plugin holds (changed only under the slots' lock, after this one).
    held: Mutex<usize>,
}

impl SlotQuota {
    /// A slot for one more instance, or `false` (and `waiter` is woken when one may be
    /// free). Never blocks.
    pub fn try_acquire(&self, waiter: &Weak<dyn SlotWaiter>) -> bool {
        let mut s = self.slots.state.lock();
        let mut held = self.held.lock();
        let total = self.slots.total;
        let granted = if *held >= self.cap {
            false
        } else if *held == 0 {
            // The floor: already charged; physically free unless others' extras fill it.
            s.used < total
        } else {
            s.charged < total && s.used < total
        };
        if granted {
            if *held > 0 {
                s.charged += 1;
            }
            *held += 1;
            s.used += 1;
        } else if !s.waiters.iter().any(|w| w.ptr_eq(waiter)) {
            s.waiters.retain(|w| w.strong_count() > 0);
            s.waiters.push(waiter.clone());
        }
        granted
    }

    /// Gives back `n` slots. Call with no pool lock held (waiting pools are woken).
    pub fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        let waiters = {
            let mut s = self.slots.state.lock();
            let mut held = self.held.lock();
            let n = n.min(*held);
            // The floor stays charged: of the instances given back, those above one were extras.
            let extras = n.min(held.saturating_sub(1));
            *held -= n;
            s.used -= n;
            s.charged -= extras;
            std::mem::take(&mut s.waiters)
        };
        InstanceSlots::wake(waiters);
    }

    /// Instances held now.
    pub fn held(&self) -> usize {
        *self.held.lock()
    }
}

impl Drop for SlotQuota {
    fn drop(&mut self) {
        let waiters = {
            let mut s = self.slots.state.lock();
            let held = *self.held.lock();
            s.used -= held;
            s.charged -= held.max(1);
            s.plugins -= 1;
            std::mem::take(&mut s.waiters)
        };
        InstanceSlots::wake(waiters);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl SlotWaiter for Counter {
        fn wake(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waiter() -> (Arc<Counter>, Weak<dyn SlotWaiter>) {
        let c = Arc::new(Counter::default());
        let w = Arc::downgrade(&c) as Weak<dyn SlotWaiter>;
        (c, w)
    }

    #[test]
    fn a_plugin_asking_for_more_than_its_share_is_refused_with_the_numbers() {
        let slots = InstanceSlots::new(128, 32);
        let err = slots.register(1025, 1024).unwrap_err();
        assert_eq!(err, SlotError::OverQuota { wanted: 1025, concurrency: 1024, per_plugin: 32, total: 128 });
        let text = err.to_string();
        assert!(
            text.contains("needs 1025 instances") && text.contains("concurrency to 31 or less"),
            "{text}"
        );
        assert!(slots.register(32, 31).is_ok());
    }

    #[test]
    fn a_hog_cannot_take_the_floor_of_another_plugin() {
        let slots = InstanceSlots::new(4, 4);
        let (_c, w) = waiter();
        let hog = slots.register(4, 3).unwrap_or_else(|e| panic!("{e}"));
        let quiet = slots.register(2, 1).unwrap_or_else(|e| panic!("{e}"));
        // The hog gets its floor and extras until only the quiet plugin's floor is left.
        let got = (0..4).filter(|_| hog.try_acquire(&w)).count();
        assert_eq!(got, 3, "{:?}", slots.counts());
        assert!(quiet.try_acquire(&w), "the quiet plugin's first instance has its slot");
        assert!(!quiet.try_acquire(&w), "everything else is taken");
        assert_eq!(slots.counts(), (4, 4, 2));
    }

    #[test]
    fn a_new_plugin_waits_for_extras_to_come_back_and_they_are_not_handed_out_again() {
        let slots = InstanceSlots::new(3, 3);
        let (hog_waker, hog_w) = waiter();
        let hog = slots.register(3, 2).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((0..3).filter(|_| hog.try_acquire(&hog_w)).count(), 3, "alone, it may use every slot");
        // A plugin loaded now has its floor charged, but the hog's extras fill the pool.
        let late = slots.register(2, 1).unwrap_or_else(|e| panic!("{e}"));
        let (late_waker, late_w) = waiter();
        assert!(!late.try_acquire(&late_w));
        // One extra comes back: it goes to the late plugin, not to the hog again.
        hog.release(1);
        assert_eq!(late_waker.0.load(Ordering::SeqCst), 1, "woken");
        assert!(!hog.try_acquire(&hog_w), "the hog is over its fair charge now");
        assert!(late.try_acquire(&late_w));
        assert_eq!(slots.counts(), (3, 3, 2));
        drop(late);
        assert_eq!(slots.counts(), (2, 2, 1));
        assert!(hog_waker.0.load(Ordering::SeqCst) >= 1, "the hog was told a slot came back");
        assert!(hog.try_acquire(&hog_w));
        drop(hog);
        assert_eq!(slots.counts(), (0, 0, 0));
    }

    #[test]
    fn registering_fails_once_every_slot_is_a_floor() {
        let slots = InstanceSlots::new(2, 2);
        let _a = slots.register(2, 1).unwrap_or_else(|e| panic!("{e}"));
        let b = slots.register(2, 1).unwrap_or_else(|e| panic!("{e}"));
        let err = slots.register(2, 1).unwrap_err();
        assert_eq!(err, SlotError::Full { total: 2 });
        assert!(err.to_string().contains("instance-slots"));
        drop(b);
        assert!(slots.register(2, 1).is_ok(), "a dropped plugin's floor is free again");
    }
}
