//! A global allocator that counts the bytes currently allocated, for benchmarks that report
//! the heap a cache holds: install it with
//! `#[global_allocator] static GLOBAL: CountingAllocator = CountingAllocator;`
//! and read [`allocated`] before and after, or [`peak_allocated`] since [`reset_peak`].
//!
//! Invariants: [`allocated`] is the sum of the sizes of live allocations made through it
//! (requested sizes, not the system allocator's rounding), updated with relaxed atomics;
//! [`peak_allocated`] is the highest value it reached since the last [`reset_peak`] (or
//! since start).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting.
pub struct CountingAllocator;

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

// SAFETY: every call forwards to `System` with the caller's arguments; the counter is
// only bookkeeping.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        // Counted by its net change: a large block grows in place (glibc `mremap`s it), so
        // old and new size are not held at once.
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
