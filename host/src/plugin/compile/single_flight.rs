//! Single-flight loading ([`SingleFlight`]): compiled components shared by content hash, one
//! compile (or cache load) per distinct `.wasm`, however many plugins use it.
//!
//! Invariants:
//! - For one key, at most one load runs at a time: a caller that finds a load in flight
//!   blocks until it ends and gets the same result (the same value on success, the same
//!   error on failure), never a second load.
//! - A loaded value stays shared exactly while some handle to it is alive (the map holds
//!   only weak references); once the last plugin using it is dropped (or has dropped its
//!   code while idle), the next request for the key loads again (from the on-disk compile
//!   cache, normally).
//! - A failed load is not remembered past the callers that were waiting for it: the next
//!   request after they return retries.
//! - The map's lock is never held while loading (loads take ~100s of ms).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

/// One key's slot: empty while its load runs, then the load's result.
struct Slot<T, E> {
    result: OnceLock<Result<T, E>>,
}

/// A loaded value; the key stays shared while any `SharedLoad` of it is alive.
pub struct SharedLoad<T, E> {
    value: T,
    slot: Arc<Slot<T, E>>,
}

impl<T, E> SharedLoad<T, E> {
    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// Whether both come from the same load.
    pub fn same_load(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.slot, &other.slot)
    }
}

impl<T: Clone, E> Clone for SharedLoad<T, E> {
    fn clone(&self) -> Self {
        SharedLoad { value: self.value.clone(), slot: self.slot.clone() }
    }
}

/// Values by key, loaded once while in use.
pub struct SingleFlight<K, T, E> {
    slots: Mutex<HashMap<K, Weak<Slot<T, E>>>>,
}

impl<K, T, E> Default for SingleFlight<K, T, E> {
    fn default() -> Self {
        SingleFlight { slots: Mutex::new(HashMap::new()) }
    }
}

/// What [`SingleFlight::get_or_load`] did for its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This caller ran the load.
    Loaded,
    /// Another caller's load (finished, or in flight and waited for) was reused.
    Shared,
}

impl<K: Eq + Hash + Clone, T: Clone, E: Clone> SingleFlight<K, T, E> {
    /// The value for `key`: the one in use or being loaded by another caller, else what
    /// `load` returns (run on this thread, outside the lock).
    pub fn get_or_load(
        &self,
        key: &K,
        load: impl FnOnce() -> Result<T, E>,
    ) -> Result<(SharedLoad<T, E>, Outcome), E> {
        let slot = {
            let mut slots = self.slots.lock();
            match slots.get(key).and_then(Weak::upgrade) {
                Some(slot) => slot,
                None => {
                    // Forget the keys nobody uses any more before adding one.
                    slots.retain(|_, w| w.strong_count() > 0);
                    let slot = Arc::new(Slot { result: OnceLock::new() });
                    slots.insert(key.clone(), Arc::downgrade(&slot));
                    slot
                }
            }
        };
        let mut ran = false;
        // `get_or_init` blocks concurrent callers on the same slot until the first one's
        // closure returns; they then see its result.
        let result = slot.result.get_or_init(|| {
            ran = true;
            load()
        });
        match result {
            Ok(value) => {
                let value = value.clone();
                Ok((
                    SharedLoad { value, slot: slot.clone() },
                    if ran { Outcome::Loaded } else { Outcome::Shared },
                ))
            }
            Err(e) => {
                let e = e.clone();
                let mut slots = self.slots.lock();
                // Drop a failed slot from the map so the next request retries, unless a
                // newer slot already replaced it.
                if slots.get(key).is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&slot))) {
                    slots.remove(key);
                }
                Err(e)
            }
        }
    }

    /// Keys with a value in use (or being loaded) now.
    pub fn live(&self) -> usize {
        self.slots.lock().values().filter(|w| w.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn concurrent_requests_for_one_key_share_one_load() {
        let registry: Arc<SingleFlight<&str, usize, String>> = Arc::default();
        let loads = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(16));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (registry, loads, start) = (registry.clone(), loads.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    registry.get_or_load(&"a", || {
                        // Long enough that the others arrive while it is in flight.
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        Ok(loads.fetch_add(1, Ordering::SeqCst))
                    })
                })
            })
            .collect();
        let results: Vec<_> = threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| panic!("thread panicked")).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(loads.load(Ordering::SeqCst), 1, "one load for sixteen requests");
        assert_eq!(results.iter().filter(|(_, o)| *o == Outcome::Loaded).count(), 1);
        let first = &results[0].0;
        assert!(results.iter().all(|(s, _)| s.same_load(first)), "every caller gets the same value");
        assert_eq!(first.value(), &0);
    }

    #[test]
    fn values_are_shared_only_while_in_use() {
        let registry: SingleFlight<u8, u32, String> = SingleFlight::default();
        let loads = AtomicUsize::new(0);
        let load = || {
            loads.fetch_add(1, Ordering::SeqCst);
            Ok(7)
        };
        let (held, o1) = registry.get_or_load(&1, load).unwrap_or_else(|e| panic!("{e}"));
        let (again, o2) = registry.get_or_load(&1, load).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((o1, o2), (Outcome::Loaded, Outcome::Shared));
        assert!(held.same_load(&again));
        assert_eq!(registry.live(), 1);
        drop((held, again));
        assert_eq!(registry.live(), 0);
        let (_, o3) = registry.get_or_load(&1, load).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o3, Outcome::Loaded, "nobody used it: loaded again");
        assert_eq!(loads.load(Ordering::SeqCst), 2);
        let (_, other) = registry.get_or_load(&2, load).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(other, Outcome::Loaded, "another key is another load");
    }

    #[test]
    fn a_failed_load_is_retried_by_the_next_request() {
        let registry: SingleFlight<u8, u32, String> = SingleFlight::default();
        let err = registry.get_or_load(&1, || Err("broken".to_owned())).err();
        assert_eq!(err.as_deref(), Some("broken"));
        assert_eq!(registry.live(), 0);
        let (slot, outcome) = registry.get_or_load(&1, || Ok(3)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((slot.value(), outcome), (&3, Outcome::Loaded));
    }
}
