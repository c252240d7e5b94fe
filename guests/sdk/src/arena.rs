//! A per-call bump arena: the global allocator [`export_plugin!`](crate::export_plugin)
//! installs unless the plugin opts out with `export_plugin!(MyPlugin, allocator = system)`.
//!
//! A reconcile allocates many small, short-lived values (the object read from the cache, the
//! strings and maps of its parsed form) and frees them all before it returns. A bump
//! allocator serves those with an add and a compare, and frees them all at once by moving
//! its pointer back. Hand-written rather than taken from a crate because the rewind rule
//! below, which is what makes it safe for any plugin, is the whole point.
//!
//! Invariants:
//! - The arena is one region of [`ARENA_BYTES`] taken from the system allocator (wasi-libc's
//!   dlmalloc) the first time an export call starts. Inside an export call, an allocation
//!   that fits is bumped from the region; every other allocation (outside a call, such as
//!   the plugin value `init` builds, or too big, or the region full) goes to the system
//!   allocator. `dealloc` and `realloc` tell the two apart by address.
//! - The bump pointer is rewound to the region's start only when an export call starts
//!   and no allocation from the region is live (a count of region allocations minus
//!   region frees). A value allocated in a call that outlives it (kept in the plugin's
//!   state, a lazily initialised static, a leaked box) is therefore never overwritten: it
//!   only keeps the region from rewinding until it is freed, and allocations fall back to
//!   the system allocator once the region is full. Correctness never depends on what the
//!   plugin does; only the speed-up does.
//! - A call's return value, freed by the canonical ABI's post-return after the export
//!   returned, stays intact until then: the region is not rewound before the next call.
//! - wasm32-wasip2 guests are single-threaded and exports never re-enter, so the state is
//!   plain `Cell`s; the global instance exists only on wasm32 without the `atomics` feature.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Size of the region bumped from during a call.
pub const ARENA_BYTES: usize = 256 << 10;

/// The arena's state. See the module doc for its rules.
pub struct CallArena {
    /// Start of the region (0 until the first call).
    base: Cell<usize>,
    /// One past its end.
    end: Cell<usize>,
    /// Next free byte.
    bump: Cell<usize>,
    /// Region allocations not freed yet.
    live: Cell<usize>,
    /// Where bumping must stop: `end` inside an export call, 0 outside one (and while
    /// there is no region), so that nothing fits then. One load and compare on the
    /// allocation path stand for "inside a call, with a region, and it fits".
    limit: Cell<usize>,
    /// Region size.
    bytes: usize,
}

impl CallArena {
    /// An arena whose region (taken at the first call) is `bytes` long.
    pub const fn new(bytes: usize) -> Self {
        CallArena {
            base: Cell::new(0),
            end: Cell::new(0),
            bump: Cell::new(0),
            live: Cell::new(0),
            limit: Cell::new(0),
            bytes,
        }
    }

    /// Runs `f` as one export call: allocations inside it are bumped from the region.
    pub fn call<R>(&self, f: impl FnOnce() -> R) -> R {
        self.enter();
        // Leaves the call even if `f` unwinds (native tests; wasm aborts on panic).
        struct Exit<'a>(&'a CallArena);
        impl Drop for Exit<'_> {
            fn drop(&mut self) {
                self.0.limit.set(0);
            }
        }
        let _exit = Exit(self);
        f()
    }

    fn enter(&self) {
        if self.base.get() == 0 {
            // Taken while inactive, so from the system allocator; a failure leaves the
            // arena unused (every allocation then goes to the system allocator).
            if let Ok(layout) = Layout::from_size_align(self.bytes, 16) {
                // SAFETY: `layout` has a non-zero size (`bytes` > 0 is checked by the
                // caller's constant; a zero-sized region is simply never used).
                let base =
                    if self.bytes > 0 { unsafe { System.alloc(layout) } } else { std::ptr::null_mut() };
                if !base.is_null() {
                    self.base.set(base as usize);
                    self.end.set(base as usize + self.bytes);
                    self.bump.set(base as usize);
                }
            }
        } else if self.live.get() == 0 {
            self.bump.set(self.base.get());
        }
        self.limit.set(self.end.get());
    }

    /// Inside an export call, with a region.
    #[inline(always)]
    fn active(&self) -> bool {
        self.limit.get() != 0
    }

    #[inline(always)]
    fn owns(&self, ptr: *mut u8) -> bool {
        let p = ptr as usize;
        p >= self.base.get() && p < self.end.get()
    }

    /// Bumps `layout` from the region, or returns null when it does not fit or no call runs.
    #[inline(always)]
    fn bump_alloc(&self, layout: Layout) -> *mut u8 {
        let align = layout.align();
        let start = match self.bump.get().checked_add(align - 1) {
            Some(v) => v & !(align - 1),
            None => return std::ptr::null_mut(),
        };
        match start.checked_add(layout.size()) {
            Some(next) if next <= self.limit.get() => {
                self.bump.set(next);
                self.live.set(self.live.get() + 1);
                start as *mut u8
            }
            _ => std::ptr::null_mut(),
        }
    }

    /// Region bytes in use (bump pointer minus start); for tests and diagnostics.
    pub fn used(&self) -> usize {
        self.bump.get() - self.base.get()
    }

    /// Region allocations not freed yet.
    pub fn live(&self) -> usize {
        self.live.get()
    }
}

// SAFETY: every method keeps the rules of `GlobalAlloc`: a returned pointer is either a
// fresh system allocation or a region range no live allocation overlaps (the bump pointer
// only moves back over freed memory: the top allocation when it is freed, or the whole
// region when none is live); `dealloc`/`realloc` route by address to whoever allocated.
//
// Everything that calls the system allocator or copies is in a function of its own, out
// of line, so that the bump path keeps no frame in linear memory (with the system call
// inlined, `alloc` moved the shadow stack pointer on every call); what remains of an
// allocation is mostly the cost of a Wasm call under Cranelift. Count the instructions per
// allocation by running `cargo bench -p wasmctrl --bench plugin` (`BENCH_ONLY`) under
// callgrind.
unsafe impl GlobalAlloc for CallArena {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = self.bump_alloc(layout);
        if p.is_null() {
            // SAFETY: forwarded with the caller's layout.
            unsafe { system_alloc(layout) }
        } else {
            p
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = self.bump_alloc(layout);
        if p.is_null() {
            // SAFETY: forwarded with the caller's layout.
            unsafe { System.alloc_zeroed(layout) }
        } else {
            // SAFETY: `p` is `layout.size()` bytes of the region, owned by the caller now.
            unsafe { p.write_bytes(0, layout.size()) };
            p
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if self.owns(ptr) {
            self.live.set(self.live.get().saturating_sub(1));
            // The top allocation: give its bytes back at once (stack-like use).
            if ptr as usize + layout.size() == self.bump.get() {
                self.bump.set(ptr as usize);
            }
        } else {
            // SAFETY: not from the region, so from the system allocator with this layout.
            unsafe { system_dealloc(ptr, layout) }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if self.owns(ptr) {
            let p = ptr as usize;
            // The top allocation grows or shrinks in place while the region has room.
            if p + layout.size() == self.bump.get()
                && p.checked_add(new_size).is_some_and(|n| n <= self.limit.get())
            {
                self.bump.set(p + new_size);
                return ptr;
            }
            if new_size <= layout.size() {
                return ptr;
            }
        } else if !self.active() {
            // SAFETY: a system allocation, and outside a call nothing goes to the region.
            return unsafe { system_realloc(ptr, layout, new_size) };
        }
        // SAFETY: the caller's guarantees, passed on.
        unsafe { self.realloc_by_copy(ptr, layout, new_size) }
    }
}

impl CallArena {
    /// `realloc` by a new allocation, a copy and a free: a region block that is not the top
    /// one (or no longer fits), or a system block inside a call (its successor may come
    /// from the region).
    ///
    /// # Safety
    /// As `GlobalAlloc::realloc`.
    #[inline(never)]
    unsafe fn realloc_by_copy(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `new_layout` is valid and non-zero (`new_size` > 0 per `realloc`'s contract).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are valid for the smaller size and do not overlap
            // (`new` is a fresh allocation while `ptr` is still live).
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

/// The system allocator's `alloc`, out of line (see the note on the `GlobalAlloc` impl).
///
/// # Safety
/// As `GlobalAlloc::alloc`.
#[inline(never)]
unsafe fn system_alloc(layout: Layout) -> *mut u8 {
    // SAFETY: the caller's guarantees.
    unsafe { System.alloc(layout) }
}

/// The system allocator's `dealloc`, out of line.
///
/// # Safety
/// As `GlobalAlloc::dealloc`, for a block the system allocator returned.
#[inline(never)]
unsafe fn system_dealloc(ptr: *mut u8, layout: Layout) {
    // SAFETY: the caller's guarantees.
    unsafe { System.dealloc(ptr, layout) }
}

/// The system allocator's `realloc`, out of line.
///
/// # Safety
/// As `GlobalAlloc::realloc`, for a block the system allocator returned.
#[inline(never)]
unsafe fn system_realloc(ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
    // SAFETY: the caller's guarantees.
    unsafe { System.realloc(ptr, layout, new_size) }
}

/// The global instance behind `export_plugin!(…)` (`allocator = arena`, the default).
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
mod global {
    use super::{ARENA_BYTES, CallArena};

    /// A single-threaded target: nothing else can touch the `Cell`s.
    struct Shared(CallArena);
    // SAFETY: wasm32 without the `atomics` feature has exactly one thread.
    unsafe impl Sync for Shared {}

    static ARENA: Shared = Shared(CallArena::new(ARENA_BYTES));

    pub(super) fn get() -> &'static CallArena {
        &ARENA.0
    }
}

/// The global allocator `export_plugin!(…)` installs by default: the one
/// [`CallArena`] of the instance. Calls outside exports go to the system allocator.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
pub struct GlobalCallArena;

#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
// SAFETY: forwards to the one arena, which keeps `GlobalAlloc`'s rules.
unsafe impl GlobalAlloc for GlobalCallArena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { global::get().alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe { global::get().alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { global::get().dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe { global::get().realloc(ptr, layout, new_size) }
    }
}

/// Runs one export call (the export glue wraps every export but `init` in it). Without
/// the arena as global allocator it only flips a flag nobody reads.
#[doc(hidden)]
pub fn export_call<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
    {
        global::get().call(f)
    }
    #[cfg(not(all(target_arch = "wasm32", not(target_feature = "atomics"))))]
    {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn calls_bump_from_the_region_and_rewind_when_nothing_is_live() {
        let a = CallArena::new(4096);
        let first = a.call(|| unsafe {
            let p = a.alloc(layout(100, 8));
            let q = a.alloc(layout(10, 1));
            assert!(a.owns(p) && a.owns(q));
            assert_eq!(q as usize, p as usize + 100);
            a.dealloc(q, layout(10, 1));
            a.dealloc(p, layout(100, 8));
            p as usize
        });
        assert_eq!(a.live(), 0);
        let again = a.call(|| unsafe {
            let p = a.alloc(layout(100, 8));
            a.dealloc(p, layout(100, 8));
            p as usize
        });
        assert_eq!(first, again, "the region is reused by the next call");
    }

    #[test]
    fn outside_calls_and_oversized_allocations_use_the_system_allocator() {
        let a = CallArena::new(256);
        unsafe {
            let outside = a.alloc(layout(16, 8));
            assert!(!a.owns(outside));
            a.call(|| {
                let big = a.alloc(layout(1024, 8));
                assert!(!a.owns(big));
                let small = a.alloc(layout(16, 8));
                assert!(a.owns(small));
                a.dealloc(big, layout(1024, 8));
                a.dealloc(small, layout(16, 8));
            });
            a.dealloc(outside, layout(16, 8));
        }
    }

    #[test]
    fn a_value_kept_across_calls_is_never_overwritten() {
        let a = CallArena::new(4096);
        // Allocated in call 1 and kept (as plugin state or a lazy static would).
        let kept = a.call(|| unsafe {
            let p = a.alloc(layout(64, 8));
            p.write_bytes(0xAB, 64);
            let tmp = a.alloc(layout(32, 8));
            a.dealloc(tmp, layout(32, 8));
            p
        });
        for _ in 0..100 {
            a.call(|| unsafe {
                let p = a.alloc(layout(64, 8));
                assert!(p as usize >= kept as usize + 64 || !a.owns(p), "never over the kept value");
                p.write_bytes(0xCD, 64);
                a.dealloc(p, layout(64, 8));
            });
        }
        assert!((0..64).all(|i| unsafe { *kept.add(i) } == 0xAB));
        // Once it is freed, the next call rewinds the region again.
        unsafe { a.dealloc(kept, layout(64, 8)) };
        a.call(|| assert_eq!(a.used(), 0));
    }

    #[test]
    fn a_return_value_freed_after_the_call_survives_until_then() {
        let a = CallArena::new(4096);
        let returned = a.call(|| unsafe {
            let p = a.alloc(layout(8, 8));
            p.write_bytes(7, 8);
            p
        });
        // Post-return: read, then freed, outside any call.
        assert!((0..8).all(|i| unsafe { *returned.add(i) } == 7));
        unsafe { a.dealloc(returned, layout(8, 8)) };
        assert_eq!(a.live(), 0);
    }

    #[test]
    fn the_top_allocation_grows_in_place_and_others_move() {
        let a = CallArena::new(4096);
        a.call(|| unsafe {
            let p = a.alloc(layout(16, 8));
            p.write_bytes(1, 16);
            let grown = a.realloc(p, layout(16, 8), 64);
            assert_eq!(grown, p, "top allocation grows in place");
            let q = a.alloc(layout(8, 8));
            let moved = a.realloc(grown, layout(64, 8), 128);
            assert_ne!(moved, grown);
            assert!((0..16).all(|i| *moved.add(i) == 1), "contents are kept");
            let huge = a.realloc(moved, layout(128, 8), 1 << 20);
            assert!(!a.owns(huge), "too big for the region: system allocator");
            assert!((0..16).all(|i| *huge.add(i) == 1));
            a.dealloc(huge, layout(1 << 20, 8));
            a.dealloc(q, layout(8, 8));
        });
        assert_eq!(a.live(), 0);
    }

    #[test]
    fn a_full_region_falls_back_to_the_system_allocator() {
        let a = CallArena::new(128);
        a.call(|| unsafe {
            let blocks: Vec<*mut u8> = (0..8).map(|_| a.alloc(layout(32, 8))).collect();
            assert_eq!(blocks.iter().filter(|p| a.owns(**p)).count(), 4);
            for p in blocks.iter().rev() {
                p.write_bytes(9, 32);
            }
            for p in blocks {
                a.dealloc(p, layout(32, 8));
            }
        });
        assert_eq!(a.live(), 0);
    }

    #[test]
    fn zeroed_allocations_are_zero_after_reuse() {
        let a = CallArena::new(1024);
        a.call(|| unsafe {
            let p = a.alloc(layout(64, 8));
            p.write_bytes(0xFF, 64);
            a.dealloc(p, layout(64, 8));
        });
        a.call(|| unsafe {
            let p = a.alloc_zeroed(layout(64, 8));
            assert!((0..64).all(|i| *p.add(i) == 0));
            a.dealloc(p, layout(64, 8));
        });
    }
}
