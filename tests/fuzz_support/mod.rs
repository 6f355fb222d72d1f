//! What the fuzz test binaries share: an allocator that turns an absurd
//! allocation into an abort, and their scratch folders. Each binary that
//! declares `mod fuzz_support;` gets the allocator as its global one.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;

/// Refuses single allocations over `CAP`: the process then aborts with
/// "memory allocation of N bytes failed", failing the test loudly.
struct CappedAlloc;
const CAP: usize = 256 << 20;

unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lfm-fuzz-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
