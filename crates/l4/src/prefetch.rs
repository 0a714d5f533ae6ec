//! Prefetch hints: a vector's table lookups are issued ahead of their use so
//! the cache misses of many packets overlap (the one `unsafe` of this crate).

/// Asks the CPU to bring the cache line holding `r` closer.
#[allow(unsafe_code)]
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is only a hint: it never faults, whatever the
    // address, and changes no architectural state; the pointer comes from a
    // live reference anyway. SSE, which it needs, is part of x86_64.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>((r as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}
