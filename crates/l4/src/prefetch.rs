//! Memory hints, the one place of this crate with `unsafe`: prefetches (a
//! vector's table lookups are issued ahead of their use so the cache misses
//! of many packets overlap) and huge-page advice for big tables.

/// Asks the CPU to bring the cache lines holding `r` closer: the line of
/// its first byte and, for a value that crosses a line boundary (a 20-byte
/// session record does one time in four), the line of its last byte too.
#[allow(unsafe_code)]
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    let first = (r as *const T).cast::<i8>();
    let last = first.wrapping_add(std::mem::size_of::<T>().saturating_sub(1));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is only a hint: it never faults, whatever the
    // address, and changes no architectural state; both pointers lie within
    // the value behind a live reference anyway. SSE, which it needs, is part
    // of x86_64.
    unsafe {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<{ _MM_HINT_T0 }>(first);
        if (first as usize) >> 6 != (last as usize) >> 6 {
            _mm_prefetch::<{ _MM_HINT_T0 }>(last);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (first, last);
}

/// A vector of `n` copies of `value` whose memory the kernel is asked to
/// back with huge pages (transparent huge pages in `madvise` mode), before
/// any of it is touched: a table of millions of sessions then costs far
/// fewer TLB misses. Without THP the advice is ignored and nothing changes.
pub fn huge_vec<T: Clone>(n: usize, value: T) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    let bytes = n * std::mem::size_of::<T>();
    // madvise wants a page-aligned start: the allocator's block is not.
    let start = v.as_mut_ptr() as usize;
    let aligned = start.next_multiple_of(4096);
    let bytes = bytes.saturating_sub(aligned - start) & !4095;
    #[cfg(target_os = "linux")]
    if bytes >= 4 << 20
        && let Some(ptr) =
            std::ptr::NonNull::new(v.as_mut_ptr().wrapping_byte_add(aligned - start).cast::<std::ffi::c_void>())
    {
        #[allow(unsafe_code)]
        // SAFETY: madvise(MADV_HUGEPAGE) only changes how the kernel backs
        // this range of our own allocation (it neither reads nor writes it
        // and cannot unmap it); the range lies inside `v`'s capacity. An
        // error (no THP) leaves the memory as it was.
        let _ = unsafe { nix::sys::mman::madvise(ptr, bytes, nix::sys::mman::MmapAdvise::MADV_HUGEPAGE) };
    }
    v.resize(n, value);
    v
}
