//! Parallel loops over pieces of work for the CPU paths (rayon's pool):
//! outputs split into chunks that each worker owns, and slices written in
//! disjoint parts. Results never depend on how the work was split: each
//! output element belongs to one piece.

use rayon::prelude::*;

/// Runs `f` on one of the pool's workers, for a whole pass that starts many
/// short parallel loops (a decode step). A loop started from outside the
/// pool hands its work over and puts the caller to sleep until the pool is
/// done, one wake-up per loop; started from a worker, the worker takes part
/// and the others are still awake from the loop before.
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    // A scope's body runs on a worker of the global pool (`--threads` sizes
    // it), in place when the caller is one already.
    rayon::scope(|_| f())
}

/// Calls `f(i)` for every `i` in `0..n`, each exactly once, in parallel.
pub fn for_each_index(n: usize, f: impl Fn(usize) + Sync + Send) {
    (0..n).into_par_iter().for_each(f);
}

/// `f` of each chunk of `k` elements of `x` (the last one shorter), in
/// order, computed in parallel.
pub fn map_chunks<'a, T: Sync, R: Send>(
    x: &'a [T],
    k: usize,
    f: impl Fn(&'a [T]) -> R + Sync + Send,
) -> Vec<R> {
    x.par_chunks(k.max(1)).map(f).collect()
}

/// Splits each of `outs` into chunks of `chunk` elements (the last one
/// shorter) and calls `f(which, start, chunk)` once for each, in parallel: `which` indexes `outs`, `start` is the chunk's offset in it.
pub fn for_each_chunk_mut<T: Send>(
    outs: &mut [&mut [T]],
    chunk: usize,
    f: impl Fn(usize, usize, &mut [T]) + Sync,
) {
    assert!(chunk > 0, "for_each_chunk_mut: empty chunks");
    let mut firsts = Vec::with_capacity(outs.len() + 1);
    let mut total = 0;
    for o in outs.iter() {
        firsts.push(total);
        total += o.len().div_ceil(chunk);
    }
    firsts.push(total);
    let ptrs: Vec<SendPtr<T>> = outs
        .iter_mut()
        .map(|o| SendPtr(o.as_mut_ptr(), o.len()))
        .collect();
    for_each_index(total, |c| {
        let which = firsts.partition_point(|&f| f <= c) - 1;
        let SendPtr(ptr, len) = ptrs[which];
        let start = (c - firsts[which]) * chunk;
        let n = chunk.min(len - start);
        // SAFETY: chunk c is handed out once, and chunks of one output do
        // not overlap; `outs` is borrowed mutably until every call is done.
        let part = unsafe { std::slice::from_raw_parts_mut(ptr.add(start), n) };
        f(which, start, part);
    });
}

/// A mutable slice that parallel workers write in parts they own (for outputs
/// whose parts are not contiguous, such as a block of columns).
pub struct DisjointMut<'a, T> {
    ptr: SendPtr<T>,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

impl<'a, T: Send> DisjointMut<'a, T> {
    pub fn new(s: &'a mut [T]) -> Self {
        DisjointMut {
            ptr: SendPtr(s.as_mut_ptr(), s.len()),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Elements `start..start + len`.
    ///
    /// # Safety
    /// No two parts in use at the same time may overlap.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part(&self, start: usize, len: usize) -> &mut [T] {
        let SendPtr(ptr, n) = self.ptr;
        assert!(start <= n && len <= n - start, "DisjointMut: out of bounds");
        std::slice::from_raw_parts_mut(ptr.add(start), len)
    }
}

/// A slice's pointer and length, shared with the workers for
/// [`for_each_chunk_mut`] and [`DisjointMut`].
struct SendPtr<T>(*mut T, usize);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: workers only touch disjoint chunks (see `for_each_chunk_mut`).
unsafe impl<T: Send> Sync for SendPtr<T> {}
unsafe impl<T: Send> Send for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_chunk_is_visited_once() {
        let mut a = vec![0u32; 1000];
        let mut b = vec![0u32; 37];
        let mut c: Vec<u32> = Vec::new();
        for chunk in [1, 7, 64, 5000] {
            for_each_chunk_mut(
                &mut [&mut a, &mut b, &mut c],
                chunk,
                |which, start, part| {
                    for (i, v) in part.iter_mut().enumerate() {
                        *v += (which * 10_000 + start + i) as u32;
                    }
                },
            );
        }
        // Four passes added each element's own index (and its output's tag).
        for (i, &v) in a.iter().enumerate() {
            assert_eq!(v, 4 * i as u32);
        }
        for (i, &v) in b.iter().enumerate() {
            assert_eq!(v, 4 * (10_000 + i) as u32);
        }
    }

    #[test]
    fn disjoint_parts_are_written_in_parallel() {
        let mut y = vec![0usize; 300];
        let parts = DisjointMut::new(&mut y);
        for_each_index(30, |p| {
            // SAFETY: piece p alone writes elements p * 10..p * 10 + 10.
            let part = unsafe { parts.part(p * 10, 10) };
            for (i, v) in part.iter_mut().enumerate() {
                *v = p * 10 + i;
            }
        });
        assert!(y.iter().enumerate().all(|(i, &v)| v == i));
        let sum = AtomicUsize::new(0);
        for_each_index(10, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.into_inner(), 45);
    }
}
