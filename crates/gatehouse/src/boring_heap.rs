//! BoringSSL's heap on the process's allocator. BoringSSL calls
//! `OPENSSL_memory_alloc`, `OPENSSL_memory_free` and
//! `OPENSSL_memory_get_size` when a program defines them (weak symbols in
//! its `crypto/mem.cc`); otherwise it uses the C library's `malloc`, which
//! here cost about 3% of a full TLS handshake's CPU (glibc's `malloc`,
//! `_int_free`, `malloc_consolidate`) beside mimalloc's 1%. Defined here, in
//! the binary, so that the linker always sees them.
//!
//! The contract is BoringSSL's: freed memory is zeroed before it goes back
//! (as its own `OPENSSL_free` does: key material lives there), the
//! functions never call BoringSSL, and they tolerate being called with
//! any lock held — mimalloc's thread-local heaps take none of ours.
#![allow(unsafe_code)]

use std::ffi::c_void;

unsafe extern "C" {
    // mimalloc's own entry points, in the library `mimalloc` links.
    fn mi_malloc(size: usize) -> *mut c_void;
    fn mi_free(p: *mut c_void);
    fn mi_usable_size(p: *const c_void) -> usize;
}

/// Allocates for BoringSSL.
#[unsafe(no_mangle)]
pub extern "C" fn OPENSSL_memory_alloc(size: usize) -> *mut c_void {
    // SAFETY: mi_malloc takes any size and returns null or a block of at
    // least `size` bytes.
    unsafe { mi_malloc(size) }
}

/// Zeroes a block BoringSSL frees, then frees it. BoringSSL never passes
/// null.
#[unsafe(no_mangle)]
pub extern "C" fn OPENSSL_memory_free(ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` came from OPENSSL_memory_alloc (mi_malloc) and is live
    // until the mi_free below; mi_usable_size is the block's whole writable
    // length, and nothing else uses the block once BoringSSL frees it. The
    // zeroing is a plain memset (a volatile loop writes a byte at a time)
    // that cannot be dropped: the block goes on to mi_free, a foreign
    // function that may read it.
    unsafe {
        std::ptr::write_bytes(ptr.cast::<u8>(), 0, mi_usable_size(ptr));
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        mi_free(ptr);
    }
}

/// The usable size of a block, for BoringSSL's `OPENSSL_realloc`.
#[unsafe(no_mangle)]
pub extern "C" fn OPENSSL_memory_get_size(ptr: *mut c_void) -> usize {
    // SAFETY: `ptr` came from OPENSSL_memory_alloc and is live.
    unsafe { mi_usable_size(ptr) }
}
