//! The code of one component across its tier-up: compiled first by the baseline compiler
//! (Winch: fast to compile, slower to run), replaced once by the optimising compiler's
//! (Cranelift) when that is ready.
//!
//! Invariants:
//! - A [`TieredComponent`] goes from [`Tier::Baseline`] to [`Tier::Optimized`] at most
//!   once, and never back; one that starts optimised (a compile cache hit, or tier-up off)
//!   never changes.
//! - Every target that [`TieredComponent::subscribe`]d while it was baseline and is still
//!   alive is told of the tier-up exactly once (by [`TieredComponent::complete`]'s caller);
//!   a target subscribing after the tier-up gets the optimised code back instead, so no
//!   target misses it whatever the interleaving. Targets are held weakly: a plugin dropped
//!   (its version replaced or removed) before the tier-up is never told, and so never
//!   instantiates anything again.
//! - After the tier-up this holds only the optimised code: the baseline code lives on only
//!   while instances (or an `InstancePre`) made from it do.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use wasmtime::component::Component;

/// Which compiler produced the code an instance runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Winch, wasmtime's baseline compiler: compiles several times faster, runs slower.
    Baseline,
    /// Cranelift, wasmtime's optimising compiler.
    Optimized,
}

impl Tier {
    /// `baseline` or `optimized` (log fields, metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Baseline => "baseline",
            Tier::Optimized => "optimized",
        }
    }
}

/// Something running a component's baseline code that switches to its optimised code (a
/// loaded plugin).
pub(crate) trait TierUpTarget: Send + Sync {
    /// The optimised code of the component is ready; `since_load` is how long ago the
    /// component's load started.
    fn tier_up(&self, optimized: &Component, since_load: Duration);
}

/// One component's code, shared by every plugin loaded from the same bytes.
pub struct TieredComponent {
    /// Hex SHA-256 of the `.wasm`.
    hash: String,
    /// When the load (compile or cache read) started.
    loaded_at: Instant,
    state: Mutex<TierState>,
}

struct TierState {
    component: Component,
    tier: Tier,
    /// Targets to tell of the tier-up (only while baseline).
    waiting: Vec<Weak<dyn TierUpTarget>>,
}

impl TieredComponent {
    /// A component compiled by `tier`'s compiler, whose load started at `loaded_at`.
    pub(crate) fn new(hash: String, component: Component, tier: Tier, loaded_at: Instant) -> Self {
        TieredComponent {
            hash,
            loaded_at,
            state: Mutex::new(TierState { component, tier, waiting: Vec::new() }),
        }
    }

    /// Hex SHA-256 of the `.wasm`.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// When the component's load started.
    pub fn loaded_at(&self) -> Instant {
        self.loaded_at
    }

    /// The code to instantiate now, and its tier.
    pub fn current(&self) -> (Component, Tier) {
        let s = self.state.lock();
        (s.component.clone(), s.tier)
    }

    /// The tier of the code to instantiate now.
    pub fn tier(&self) -> Tier {
        self.state.lock().tier
    }

    /// Asks for `target` to be told of the tier-up. Returns the optimised code when the
    /// tier-up already happened (the target is then not registered: it switches now).
    pub(crate) fn subscribe(&self, target: Weak<dyn TierUpTarget>) -> Option<Component> {
        let mut s = self.state.lock();
        match s.tier {
            Tier::Optimized => Some(s.component.clone()),
            Tier::Baseline => {
                s.waiting.retain(|w| w.strong_count() > 0);
                s.waiting.push(target);
                None
            }
        }
    }

    /// Installs the optimised code; returns the targets still alive to tell (outside any
    /// lock). `None` when this was already optimised (nothing changes).
    pub(crate) fn complete(&self, optimized: Component) -> Option<Vec<Arc<dyn TierUpTarget>>> {
        let waiting = {
            let mut s = self.state.lock();
            if s.tier == Tier::Optimized {
                return None;
            }
            s.tier = Tier::Optimized;
            s.component = optimized;
            std::mem::take(&mut s.waiting)
        };
        Some(waiting.iter().filter_map(Weak::upgrade).collect())
    }
}
