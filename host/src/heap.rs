//! The allocator around the plugins' compiles: compiles allocate from a jemalloc arena of
//! their own ([`InCompileArena`]), so that a compile's garbage and the host's long-lived
//! objects do not share pages. Handing free pages back after a burst and the jemalloc
//! options of the binary are `wasmctrl-runtime`'s (`wasmctrl_runtime::heap`), re-exported
//! here.
//!
//! Invariants:
//! - Without the `jemalloc` feature this does nothing (the embedding program's allocator
//!   is its own business).
//! - A thread leaves the compile arena for its own when an [`InCompileArena`] is dropped;
//!   a compile pool's threads stay in it for good.

pub use wasmctrl_runtime::heap::{MallocConf, release_free_pages};

/// jemalloc's `mallctl` reading a `u32` (`old`) and/or writing one (`new`); whether it
/// accepted.
#[cfg(feature = "jemalloc")]
fn mallctl_u32(name: &std::ffi::CStr, old: Option<&mut u32>, new: Option<u32>) -> bool {
    let mut new_value = new.unwrap_or(0);
    let mut old_len = std::mem::size_of::<u32>();
    let (old_ptr, old_len_ptr) = match old {
        Some(o) => (o as *mut u32 as *mut std::ffi::c_void, &mut old_len as *mut usize),
        None => (std::ptr::null_mut(), std::ptr::null_mut()),
    };
    let (new_ptr, new_len) = match new {
        Some(_) => (&mut new_value as *mut u32 as *mut std::ffi::c_void, std::mem::size_of::<u32>()),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: the pointers are to live `u32`s and `usize`s of the lengths given, or null
    // with zero lengths, as `mallctl` expects for a `unsigned` control.
    unsafe { tikv_jemalloc_sys::mallctl(name.as_ptr(), old_ptr, old_len_ptr, new_ptr, new_len) == 0 }
}

/// Empties the calling thread's cache of freed objects into their arenas (so that
/// allocations after an arena switch come from the new arena, and so that a purge can
/// hand their pages back).
pub(crate) fn flush_thread_cache() {
    #[cfg(feature = "jemalloc")]
    // SAFETY: a void control: null pointers and zero lengths.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"thread.tcache.flush".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

/// The arena compiles allocate from, created at the first use; `None` without jemalloc
/// or if it refused.
#[cfg(feature = "jemalloc")]
fn compile_arena() -> Option<u32> {
    static ARENA: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *ARENA.get_or_init(|| {
        let mut index = 0;
        mallctl_u32(c"arenas.create", Some(&mut index), None).then_some(index)
    })
}

/// While alive, the calling thread allocates from the compile arena (without the
/// `jemalloc` feature, nothing).
///
/// A compile allocates and frees far more than it keeps, and other threads (loads,
/// instances, the caches) allocate long-lived objects meanwhile. In a shared arena those
/// land on pages among the compile's garbage, and the pages cannot be handed back once the
/// garbage is freed. In an arena of its own, a compile's pages empty when it ends and the
/// purge after a load returns them; the compile threads' caches are flushed after the
/// compiles too ([`flush_thread_cache`]). `cargo bench -p wasmctrl --bench many_plugins`
/// (`SCENARIOS=distinct`) measures the anonymous resident memory after loading many distinct
/// plugins, compiled and from the compile cache (figures in `docs/benchmarks.md`).
pub(crate) struct InCompileArena {
    #[cfg(feature = "jemalloc")]
    previous: Option<u32>,
}

impl InCompileArena {
    /// Switches the calling thread to the compile arena (its cache of freed objects is
    /// flushed first, so that none of them is handed out in the new arena).
    pub(crate) fn enter() -> Self {
        #[cfg(feature = "jemalloc")]
        {
            flush_thread_cache();
            let previous = compile_arena().and_then(|arena| {
                let mut old = 0;
                mallctl_u32(c"thread.arena", Some(&mut old), Some(arena)).then_some(old)
            });
            InCompileArena { previous }
        }
        #[cfg(not(feature = "jemalloc"))]
        {
            InCompileArena {}
        }
    }

    /// Binds the calling thread to the compile arena for good (a compile pool's thread).
    pub(crate) fn bind_for_life() {
        std::mem::forget(Self::enter());
    }
}

impl Drop for InCompileArena {
    fn drop(&mut self) {
        #[cfg(feature = "jemalloc")]
        if let Some(old) = self.previous {
            flush_thread_cache();
            mallctl_u32(c"thread.arena", None, Some(old));
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "jemalloc")]
    #[test]
    fn a_compile_allocates_from_its_own_arena_and_the_thread_returns_to_its_own() {
        let arena = || {
            let mut index = u32::MAX;
            assert!(super::mallctl_u32(c"thread.arena", Some(&mut index), None));
            index
        };
        let before = arena();
        {
            let _compiling = super::InCompileArena::enter();
            assert_eq!(Some(arena()), super::compile_arena());
            assert_ne!(arena(), before);
        }
        assert_eq!(arena(), before);
    }
}
