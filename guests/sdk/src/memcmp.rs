//! `memcmp` and `bcmp` for plugins, a word at a time.
//!
//! Rust compares strings and byte slices by calling `memcmp` (`Ord` for `str` and `[u8]`;
//! `==` becomes `bcmp`), so every key a parse inserts into a `BTreeMap` (a ConfigMap's `data`,
//! any object's labels and annotations) costs a few of them. wasi-libc's `memcmp` compares
//! one byte per loop iteration, and in Wasm every iteration also checks the engine's
//! interruption counter, so it weighs heavily in a typed parse; run the plugin benchmark's
//! reconcile under callgrind (`cargo bench -p wasmctrl --bench plugin` with `BENCH_ONLY`) to
//! see its share.
//!
//! Invariants:
//! - [`compare`] returns what C's `memcmp` returns for the same bytes: zero when the first `n`
//!   bytes are equal, otherwise the sign of the difference of the first unequal pair, read
//!   as unsigned bytes. It reads exactly the bytes `[0, n)` of each side (no read past them,
//!   so no trap at the end of a linear memory), unaligned as they come.
//! - It calls nothing: no loop in it has the shape a compiler would turn back into a call
//!   to `memcmp`, so the exported symbol cannot recurse.
//! - The exports exist only in Wasm builds (where they replace wasi-libc's, found first by the
//!   linker); natively [`compare`] is only tested against slice ordering.

/// Loads 8 bytes as the little-endian number whose lowest byte is the first in memory.
///
/// # Safety
/// `p..p + 8` must be readable.
#[inline(always)]
unsafe fn load8(p: *const u8) -> u64 {
    // SAFETY: the caller guarantees the 8 bytes are readable; no alignment is assumed.
    u64::from_le_bytes(unsafe { p.cast::<[u8; 8]>().read_unaligned() })
}

/// Loads 4 bytes likewise.
///
/// # Safety
/// `p..p + 4` must be readable.
#[inline(always)]
unsafe fn load4(p: *const u8) -> u64 {
    // SAFETY: as for `load8`.
    u64::from(u32::from_le_bytes(unsafe { p.cast::<[u8; 4]>().read_unaligned() }))
}

/// Loads 2 bytes likewise.
///
/// # Safety
/// `p..p + 2` must be readable.
#[inline(always)]
unsafe fn load2(p: *const u8) -> u64 {
    // SAFETY: as for `load8`.
    u64::from(u16::from_le_bytes(unsafe { p.cast::<[u8; 2]>().read_unaligned() }))
}

/// The order of two unequal little-endian words: the lowest unequal byte is the first
/// unequal byte in memory, and it decides.
#[inline(always)]
fn order(x: u64, y: u64) -> i32 {
    let shift = (x ^ y).trailing_zeros() & !7;
    i32::from((x >> shift) as u8) - i32::from((y >> shift) as u8)
}

/// Compares the `n` bytes at `a` with the `n` bytes at `b` as `memcmp` does.
///
/// Bytes already found equal may be read twice: the tail is one word ending at `n`,
/// overlapping the words before it.
///
/// # Safety
/// `a..a + n` and `b..b + n` must be readable.
#[inline(always)]
pub(crate) unsafe fn compare(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY (every load below): it reads inside `[0, n)` of each side, which the caller
    // guarantees readable; each branch checks `n` against the width it loads.
    unsafe {
        if n >= 8 {
            let mut at = 0;
            while n - at > 8 {
                let (x, y) = (load8(a.add(at)), load8(b.add(at)));
                if x != y {
                    return order(x, y);
                }
                at += 8;
            }
            let (x, y) = (load8(a.add(n - 8)), load8(b.add(n - 8)));
            return if x != y { order(x, y) } else { 0 };
        }
        if n >= 4 {
            let (x, y) = (load4(a), load4(b));
            if x != y {
                return order(x, y);
            }
            let (x, y) = (load4(a.add(n - 4)), load4(b.add(n - 4)));
            return if x != y { order(x, y) } else { 0 };
        }
        if n >= 2 {
            let (x, y) = (load2(a), load2(b));
            if x != y {
                return order(x, y);
            }
            let (x, y) = (load2(a.add(n - 2)), load2(b.add(n - 2)));
            return if x != y { order(x, y) } else { 0 };
        }
        if n == 1 {
            return i32::from(*a) - i32::from(*b);
        }
        0
    }
}

/// C's `memcmp`, replacing wasi-libc's in the plugin's core module.
///
/// # Safety
/// As C's: `a` and `b` point to at least `n` readable bytes.
#[cfg(target_arch = "wasm32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's guarantee is `compare`'s.
    unsafe { compare(a, b, n) }
}

/// C's `bcmp` (zero when equal), which compilers call for equality tests.
///
/// # Safety
/// As C's: `a` and `b` point to at least `n` readable bytes.
#[cfg(target_arch = "wasm32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's guarantee is `compare`'s.
    unsafe { compare(a, b, n) }
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    fn memcmp(a: &[u8], b: &[u8]) -> Ordering {
        assert_eq!(a.len(), b.len());
        // SAFETY: both slices have `a.len()` readable bytes.
        unsafe { super::compare(a.as_ptr(), b.as_ptr(), a.len()) }.cmp(&0)
    }

    #[test]
    fn agrees_with_slice_order_for_every_length_and_first_difference() {
        // Every length up to three words and a half, the first difference at every position,
        // each direction, with bytes whose order differs signed and unsigned (0x7f, 0x80).
        for n in 0..29 {
            let base: Vec<u8> = (0..n).map(|i| b"key-0123456789abcdefghijklmnop"[i]).collect();
            assert_eq!(memcmp(&base, &base), Ordering::Equal, "n={n}");
            for at in 0..n {
                for (lo, hi) in [(b'a', b'b'), (0x7f, 0x80), (0x00, 0xff)] {
                    let (mut a, mut b) = (base.clone(), base.clone());
                    a[at] = lo;
                    b[at] = hi;
                    // Later bytes ordered the other way must not matter.
                    if at + 1 < n {
                        a[n - 1] = 0xff;
                        b[n - 1] = 0x00;
                    }
                    assert_eq!(memcmp(&a, &b), a.cmp(&b), "n={n} at={at}");
                    assert_eq!(memcmp(&b, &a), b.cmp(&a), "n={n} at={at}");
                }
            }
        }
    }

    #[test]
    fn agrees_with_slice_order_at_every_alignment() {
        // Slices starting at every offset of a buffer (every alignment of the word loads),
        // unequal only in their last byte.
        let a: Vec<u8> = (0..64u8).collect();
        let mut b = a.clone();
        b[63] = 0;
        for start in 0..64 {
            assert_eq!(memcmp(&a[start..], &b[start..]), a[start..].cmp(&b[start..]), "start={start}");
        }
    }
}
