//! Handing the allocator's free pages back to the system after a one-off burst of
//! allocations: a large list applied to a cache (the FIFO's table of a million keys, the
//! decoded page buffers), a plugin loaded (deserialising its component's metadata, linking
//! it, creating and `init`-ing a first instance allocates and frees far more than the plugin
//! keeps).
//!
//! With the `jemalloc` feature (the binary's global allocator), jemalloc keeps freed pages
//! resident for `dirty_decay_ms` (10 s) to reuse them, so a host stays that much bigger for
//! as long after each burst (`cargo bench -p wasmctrl --bench many_plugins` measures the
//! resident memory after loading many plugins, with and without the purge below; figures in
//! `docs/benchmarks.md`). After each burst the calling thread's cache of freed objects is flushed and every arena's unused
//! dirty pages are purged (`madvise`).
//!
//! Compiles allocate from an arena of their own ([`InCompileArena`]), so that a compile's
//! garbage and the host's long-lived objects do not share pages.
//!
//! Invariants:
//! - Only pages jemalloc holds free are released; nothing live moves. A later allocation
//!   faults fresh zeroed pages in instead of reusing those.
//! - Without the `jemalloc` feature this does nothing (the embedding program's allocator
//!   is its own business). With it, in a process whose global allocator is another one
//!   (the library's tests), jemalloc has nothing to purge.

/// The jemalloc options of a program whose global allocator is jemalloc (the `wasmctrl`
/// binary's): a C string for jemalloc to read at start-up, exported under jemalloc's name
/// for it by the program's own crate (a library's export would not be linked):
///
/// ```ignore
/// #[unsafe(export_name = "_rjem_malloc_conf")]
/// static MALLOC_CONF: wasmctrl::heap::MallocConf = wasmctrl::heap::MallocConf::HOST;
/// ```
///
/// `_RJEM_MALLOC_CONF` in the environment is read after it, so a user can still override.
#[repr(transparent)]
pub struct MallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a `'static` C string literal, never written.
unsafe impl Sync for MallocConf {}

impl MallocConf {
    /// Slabs of 16 pages (64 KiB) for every small size class up to 4 KiB.
    ///
    /// jemalloc keeps one extent descriptor (~128 B of metadata) per slab, and by default
    /// sizes a slab to the fewest pages with little waste: one page (two regions) for the
    /// 2,048-byte class that a ~2 KB object's JSON falls in. A cache of such objects
    /// then holds one descriptor per two objects. Sixteen pages per slab cut
    /// that metadata by an order of magnitude; `cargo bench -p wasmctrl --bench scale`
    /// measures the resident memory of a large sync against the JSON it holds (figures in
    /// `docs/benchmarks.md`).
    pub const HOST: MallocConf = MallocConf(c"slab_sizes:1-4096:16".as_ptr());

    /// The options, as jemalloc reads them.
    pub fn options(&self) -> &'static std::ffi::CStr {
        // SAFETY: every `MallocConf` is made from a `'static` C string literal above.
        unsafe { std::ffi::CStr::from_ptr(self.0) }
    }
}

/// Flushes this thread's jemalloc cache and purges every arena's unused dirty pages;
/// whether jemalloc accepted both requests (true without the feature).
pub(crate) fn release_free_pages() -> bool {
    #[cfg(feature = "jemalloc")]
    {
        // `MALLCTL_ARENAS_ALL` (4096) names every arena.
        ["thread.tcache.flush", "arena.4096.purge"].iter().all(|name| {
            let name = std::ffi::CString::new(*name).unwrap_or_default();
            // SAFETY: both controls are void (no old or new value): null pointers and
            // lengths are what jemalloc's `mallctl` expects for them.
            let rc = unsafe {
                tikv_jemalloc_sys::mallctl(
                    name.as_ptr(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                )
            };
            rc == 0
        })
    }
    #[cfg(not(feature = "jemalloc"))]
    {
        true
    }
}

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

    #[test]
    fn jemalloc_accepts_the_purge() {
        // A control renamed or removed in a jemalloc upgrade fails here, not silently.
        assert!(super::release_free_pages());
        assert!(super::release_free_pages(), "twice: nothing left to purge is no error");
    }
}
