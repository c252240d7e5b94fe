//! A global allocator that counts the bytes currently allocated, for benchmarks that report
//! the heap a cache holds: install it with
//! `#[global_allocator] static GLOBAL: CountingAllocator = CountingAllocator;`
//! and read [`allocated`] before and after.
//!
//! Invariant: [`allocated`] is the sum of the sizes of live allocations made through it
//! (requested sizes, not the system allocator's rounding), updated with relaxed atomics.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting.
pub struct CountingAllocator;

/// Bytes currently allocated through [`CountingAllocator`] (0 if it is not installed).
pub fn allocated() -> usize {
    ALLOCATED.load(Ordering::SeqCst)
}

// SAFETY: every call forwards to `System` with the caller's arguments; the counter is
// only bookkeeping.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
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
            ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
            ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}
