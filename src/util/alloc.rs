//! Allocator settings for tools that allocate and free large buffers in a
//! loop.

/// Keeps the memory of freed large buffers in the heap for the next ones.
/// glibc's defaults give blocks above a (growing) threshold their own
/// mappings and trim the heap's top when freed, so every sentence of
/// `speak --cpu` faulted its ~100 MB of generator buffers in afresh (about
/// 10% of its time). The price is that the process keeps its peak heap until
/// it exits. Does nothing on other C libraries.
pub fn reuse_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's thresholds (32 MiB is the most
    // M_MMAP_THRESHOLD accepts on 64-bit); it takes the allocator's lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}
