//! Test plugin for the SDK's per-call arena (`export_plugin!(…, allocator = arena)`): state
//! allocated inside calls and kept across them must never be overwritten by later calls.
//!
//! `reconcile` of request `n` (a number) first churns through temporary allocations, then
//! appends `n` to its state (a `Vec<String>` grown inside calls), a thread-local cache filled
//! lazily on the first call, and checks that the state reads `0, 1, …, n` and the cache is
//! intact. Any difference is returned as a terminal error naming it. Request `tmp` only
//! churns (a call after which nothing it allocated is live).

use std::cell::RefCell;

use wasmctrl_guest::k8s_openapi::api::core::v1::ConfigMap;
use wasmctrl_guest::prelude::*;

struct ArenaState {
    seen: RefCell<Vec<String>>,
}

thread_local! {
    /// Filled lazily inside the first call, as a library's cache would be.
    static LAZY: RefCell<Option<Vec<u64>>> = const { RefCell::new(None) };
}

fn churn(seed: &str) -> usize {
    let scratch: Vec<String> = (0..64).map(|i| format!("{seed}-{i}-{}", "x".repeat(i))).collect();
    scratch.iter().map(String::len).sum()
}

impl Plugin for ArenaState {
    type For = ConfigMap;

    fn init(_settings: Settings) -> Result<Self, InitError> {
        Ok(ArenaState { seen: RefCell::new(Vec::new()) })
    }

    fn reconcile(&self, target: Target<ConfigMap>) -> Result<Action, ReconcileError> {
        let name = match target {
            Target::Present(cm) => cm.name().to_owned(),
            Target::Gone(request) => request.name,
        };
        if churn(&name) == 0 {
            return Err(ReconcileError::Terminal("churn allocated nothing".into()));
        }
        if name == "tmp" {
            return Ok(Action::Done);
        }
        LAZY.with(|l| l.borrow_mut().get_or_insert_with(|| (0..1024).collect()).len());
        let mut seen = self.seen.borrow_mut();
        seen.push(name);
        for (i, s) in seen.iter().enumerate() {
            if *s != i.to_string() {
                return Err(ReconcileError::Terminal(format!("state entry {i} reads {s:?}")));
            }
        }
        let lazy_ok = LAZY.with(|l| l.borrow().as_ref().is_some_and(|v| v.iter().copied().eq(0..1024)));
        if !lazy_ok {
            return Err(ReconcileError::Terminal("lazily initialised cache was overwritten".into()));
        }
        Ok(Action::Done)
    }
}

wasmctrl_guest::export_plugin!(ArenaState, allocator = arena);
