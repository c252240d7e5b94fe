//! A global allocator that counts the bytes currently allocated, for benchmarks that report
//! the heap a cache holds, over an inner allocator chosen once per process (the system's —
//! glibc malloc on Linux —, jemalloc or mimalloc), so one benchmark binary can compare them
//! in child processes. Install it with the allocator a benchmark measures by default:
//! `#[global_allocator] static GLOBAL: CountingAllocator = CountingAllocator::new(Allocator::Jemalloc);`
//! The environment variable [`ALLOCATOR_ENV`] (`system`, `jemalloc` or `mimalloc`) overrides
//! that default for the process; read [`allocated`] before and after, or [`peak_allocated`]
//! since [`reset_peak`], and [`in_use`] for the allocator that actually served.
//!
//! Invariants:
//! - The inner allocator is decided on the first call into the allocator and never changes,
//!   so every allocation, reallocation and free of the process goes to the same one. The
//!   decision reads the environment with `getenv`, which does not allocate; the first
//!   allocation happens while the process starts, before any thread could change the
//!   environment. Two threads deciding at once decide the same and keep the first stored.
//! - [`allocated`] is the sum of the sizes of live allocations made through it (requested
//!   sizes, not the inner allocator's rounding), updated with relaxed atomics, so it is the
//!   same whichever allocator serves; [`peak_allocated`] is the highest value it reached since
//!   the last [`reset_peak`] (or since start).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use mimalloc::MiMalloc;
use tikv_jemallocator::Jemalloc;

/// The environment variable naming the inner allocator of a process (see [`Allocator::name`]).
pub const ALLOCATOR_ENV: &str = "BENCH_ALLOCATOR";
/// [`ALLOCATOR_ENV`] for `getenv`.
const ALLOCATOR_ENV_C: &std::ffi::CStr = c"BENCH_ALLOCATOR";

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The inner allocator: `UNDECIDED`, then an [`Allocator`] as `u8` for the rest of the process.
static CHOSEN: AtomicU8 = AtomicU8::new(UNDECIDED);
const UNDECIDED: u8 = u8::MAX;

/// An allocator [`CountingAllocator`] can forward to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Allocator {
    /// `std::alloc::System`: glibc's malloc on Linux.
    System = 0,
    /// jemalloc (`tikv-jemallocator`), with its default configuration (tunable at run time
    /// through `_RJEM_MALLOC_CONF`).
    Jemalloc = 1,
    /// mimalloc (the `mimalloc` crate), with its default configuration.
    Mimalloc = 2,
}

impl Allocator {
    /// Every allocator, in the order benchmarks list them.
    pub const ALL: [Allocator; 3] = [Allocator::System, Allocator::Jemalloc, Allocator::Mimalloc];

    /// Its name in [`ALLOCATOR_ENV`] and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Allocator::System => "system",
            Allocator::Jemalloc => "jemalloc",
            Allocator::Mimalloc => "mimalloc",
        }
    }

    /// The allocator of that name, if any.
    pub fn from_name(name: &str) -> Option<Allocator> {
        Allocator::ALL.into_iter().find(|a| a.name() == name)
    }

    fn from_u8(v: u8) -> Allocator {
        match v {
            1 => Allocator::Jemalloc,
            2 => Allocator::Mimalloc,
            _ => Allocator::System,
        }
    }

    fn inner(self) -> &'static dyn GlobalAlloc {
        match self {
            Allocator::System => &System,
            Allocator::Jemalloc => &Jemalloc,
            Allocator::Mimalloc => &MiMalloc,
        }
    }
}

/// An allocator that counts, forwarding to the [`Allocator`] named by [`ALLOCATOR_ENV`], or to
/// its default when the variable is unset or names none.
pub struct CountingAllocator {
    default: Allocator,
}

impl CountingAllocator {
    /// Forwards to `default` unless [`ALLOCATOR_ENV`] names another.
    pub const fn new(default: Allocator) -> Self {
        CountingAllocator { default }
    }

    fn inner(&self) -> &'static dyn GlobalAlloc {
        let chosen = CHOSEN.load(Ordering::Acquire);
        let chosen = if chosen == UNDECIDED { self.decide() } else { chosen };
        Allocator::from_u8(chosen).inner()
    }

    #[cold]
    fn decide(&self) -> u8 {
        // SAFETY: the name is a NUL-terminated literal; `getenv` only reads the environment
        // and returns null or a pointer to a NUL-terminated value, read at once (nothing
        // changes the environment while the process starts; see the module's invariants).
        let named = unsafe {
            let value = libc::getenv(ALLOCATOR_ENV_C.as_ptr());
            if value.is_null() {
                None
            } else {
                std::str::from_utf8(std::ffi::CStr::from_ptr(value).to_bytes())
                    .ok()
                    .and_then(Allocator::from_name)
            }
        };
        let chosen = named.unwrap_or(self.default) as u8;
        match CHOSEN.compare_exchange(UNDECIDED, chosen, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => chosen,
            Err(first) => first,
        }
    }
}

/// The allocator serving this process's allocations (`None` if [`CountingAllocator`] is not
/// installed).
pub fn in_use() -> Option<Allocator> {
    match CHOSEN.load(Ordering::Acquire) {
        UNDECIDED => None,
        chosen => Some(Allocator::from_u8(chosen)),
    }
}

/// Bytes currently allocated through [`CountingAllocator`] (0 if it is not installed).
pub fn allocated() -> usize {
    ALLOCATED.load(Ordering::SeqCst)
}

/// The most bytes allocated at once since the last [`reset_peak`].
pub fn peak_allocated() -> usize {
    PEAK.load(Ordering::SeqCst)
}

/// Starts a new peak from what is allocated now.
pub fn reset_peak() {
    PEAK.store(ALLOCATED.load(Ordering::SeqCst), Ordering::SeqCst);
}

fn grew(by: usize) {
    let now = ALLOCATED.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call forwards to the one inner allocator of the process (see the module's
// invariants) with the caller's arguments; the counter is only bookkeeping.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.inner().alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { self.inner().dealloc(ptr, layout) };
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.inner().alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { self.inner().realloc(ptr, layout, new_size) };
        // Counted by its net change: a large block grows in place (glibc `mremap`s it,
        // jemalloc and mimalloc extend or remap it too), so old and new size are not held at once.
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                ALLOCATED.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Allocator::ALL {
            assert_eq!(Allocator::from_name(a.name()), Some(a));
            assert_eq!(Allocator::from_u8(a as u8), a);
        }
        assert_eq!(Allocator::from_name("glibc"), None);
        assert_eq!(ALLOCATOR_ENV_C.to_str(), Ok(ALLOCATOR_ENV));
    }

    #[test]
    fn each_inner_allocator_round_trips_a_block() {
        let layout = Layout::from_size_align(4096, 64).unwrap();
        for a in Allocator::ALL {
            let inner = a.inner();
            // SAFETY: the layout is non-zero; the block is written within it, then freed by
            // the allocator that made it.
            unsafe {
                let p = inner.alloc(layout);
                assert!(!p.is_null(), "{}", a.name());
                assert_eq!(p as usize % 64, 0, "{}", a.name());
                p.write_bytes(7, 4096);
                let p = inner.realloc(p, layout, 8192);
                assert!(!p.is_null(), "{}", a.name());
                assert_eq!(*p.add(4095), 7, "{}", a.name());
                inner.dealloc(p, Layout::from_size_align(8192, 64).unwrap());
            }
        }
    }
}
