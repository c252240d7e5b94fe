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
//! (The `wasmctrl` host adds the arena its Wasm compiles allocate from: `wasmctrl::heap`.)
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
/// static MALLOC_CONF: wasmctrl_runtime::heap::MallocConf = wasmctrl_runtime::heap::MallocConf::HOST;
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
pub fn release_free_pages() -> bool {
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

#[cfg(test)]
mod tests {
    #[test]
    fn jemalloc_accepts_the_purge() {
        // A control renamed or removed in a jemalloc upgrade fails here, not silently.
        assert!(super::release_free_pages());
        assert!(super::release_free_pages(), "twice: nothing left to purge is no error");
    }
}
