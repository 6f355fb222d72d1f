//! A team of threads that stays awake between short parallel steps.
//!
//! A decode step of a small language model is some 120 matrix-vector
//! products of 10-300 us each, with short serial work (norms, attention)
//! between them. Handing each product to rayon costs a wake-up of a sleeping
//! worker and a sleep of the calling thread, several microseconds each, and
//! the caller does none of the work: on two cores that was ~15-25% of a
//! token (perf: futex waits, `sched_yield`, wake-ups). The team's helpers
//! instead wait for the next step spinning for a while, the caller works
//! too, and members claim pieces of the step from an atomic counter, as
//! llama.cpp's CPU thread pool does.
//!
//! Unlike llama.cpp's pool, a step never waits for a helper to arrive: a
//! helper joins a step only while it is open, and the caller closes it once
//! every piece is claimed, then waits only for the helpers that joined. On
//! a machine busy with other work a descheduled helper costs nothing but
//! its share of the pieces, which the caller takes.
//!
//! When the calling thread keeps losing its core (more runnable threads
//! than cores: other builds, other programs), steps go to rayon for a
//! while instead: there the caller sleeps through the step, and threads
//! that sleep often are scheduled sooner than ones that never do.
//!
//! Results never depend on how work was split: each output element belongs
//! to one piece, so a step run by one thread or by all gives the same bits.
//! A step runs on the calling thread alone when the team is busy with
//! another caller's step, when it is called from a rayon worker (the rayon
//! pool is then already using the cores) or from inside a step, and where
//! threads cannot be started (the browser build).

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How long a helper waits for the next step before it sleeps: longer than
/// the serial gaps inside a forward (attention, norms: tens of us), short
/// enough that an idle team soon stops using a core.
const SPIN: Duration = Duration::from_micros(200);

/// How long the caller spins for helpers to finish their last pieces
/// before it sleeps (a piece is a few microseconds of work).
const FINISH_SPIN: Duration = Duration::from_micros(30);

/// Spins between yields of the core while waiting (a few microseconds):
/// on a machine with more runnable threads than cores, a waiting member
/// lets them run.
const SPINS_PER_YIELD: u32 = 1 << 11;

/// A step's work, called by each member that takes part.
type Job = dyn Fn() + Sync;

/// `Shared::state`: the step's number in the high 32 bits, whether it is
/// closed, and how many helpers are in it.
const CLOSED: u64 = 1 << 31;
const IN_STEP_MASK: u64 = CLOSED - 1;

struct Shared {
    /// The current step (see `CLOSED`); a new number publishes `job`.
    state: AtomicU64,
    job: UnsafeCell<Option<*const Job>>,
    /// Whether a helper's part of the current step panicked.
    panicked: AtomicBool,
    /// Helpers asleep on `wake` (changed under `sleep`).
    sleeping: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    /// Whether the caller sleeps on `done` until the helpers in its step
    /// leave (changed under `sleep`).
    caller_waits: AtomicBool,
    done: Condvar,
}

// SAFETY: `job` is written only by the thread holding `Team::busy`, while
// no helper is in a step (the state is closed with none in it), before it
// publishes the step; helpers read it only after joining the open step, and
// the writer waits for every helper that joined to leave before it returns.
// The pointee is `Sync`.
unsafe impl Sync for Shared {}

struct Team {
    helpers: usize,
    shared: &'static Shared,
    /// Held by the thread running a step.
    busy: Mutex<()>,
}

thread_local! {
    /// Whether this thread is running part of a team step.
    static IN_STEP: Cell<bool> = const { Cell::new(false) };
}

/// The team: as many members as rayon's global pool has threads (so
/// `generate -t N` sizes both), started on first use.
fn team() -> &'static Team {
    static TEAM: OnceLock<Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(None),
            panicked: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            caller_waits: AtomicBool::new(false),
            done: Condvar::new(),
        }));
        let wanted = rayon::current_num_threads().saturating_sub(1);
        let mut helpers = 0;
        for member in 1..=wanted {
            let started = std::thread::Builder::new()
                .name(format!("lfm-team-{member}"))
                .spawn(move || helper(shared));
            if started.is_err() {
                break;
            }
            helpers += 1;
        }
        Team {
            helpers,
            shared,
            busy: Mutex::new(()),
        }
    })
}

fn helper(s: &'static Shared) {
    let mut seen = 0u64;
    loop {
        let st = wait_for_step(s, seen);
        seen = st >> 32;
        if !join(s, st) {
            continue;
        }
        // SAFETY: see `Shared`; the step's caller keeps the closure alive
        // until every helper that joined has left.
        let job = unsafe { (*s.job.get()).expect("a published step") };
        IN_STEP.with(|f| f.set(true));
        let ok =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job)() })).is_ok();
        IN_STEP.with(|f| f.set(false));
        if !ok {
            s.panicked.store(true, Ordering::Relaxed);
        }
        let left = s.state.fetch_sub(1, Ordering::SeqCst) - 1;
        if left & IN_STEP_MASK == 0 && s.caller_waits.load(Ordering::SeqCst) {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.done.notify_all();
        }
    }
}

/// Joins the step whose state was `st`, if it is still that step and open.
fn join(s: &Shared, mut st: u64) -> bool {
    let step = st >> 32;
    while st >> 32 == step && st & CLOSED == 0 {
        match s
            .state
            .compare_exchange_weak(st, st + 1, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => return true,
            Err(now) => st = now,
        }
    }
    false
}

/// Spins (yielding now and then), then sleeps, until a step numbered other
/// than `seen` is published; returns its state.
fn wait_for_step(s: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let st = s.state.load(Ordering::SeqCst);
        if st >> 32 != seen {
            return st;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(SPINS_PER_YIELD) {
            std::hint::spin_loop();
            continue;
        }
        if start.elapsed() < SPIN {
            std::thread::yield_now();
            continue;
        }
        let mut guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
        s.sleeping.fetch_add(1, Ordering::SeqCst);
        while s.state.load(Ordering::SeqCst) >> 32 == seen {
            guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        s.sleeping.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Closes the step in flight and waits for the helpers in it, also when
/// the caller's own part unwinds (they borrow the caller's stack).
struct StepEnd<'a>(&'a Shared);

impl Drop for StepEnd<'_> {
    fn drop(&mut self) {
        let s = self.0;
        let in_step = || s.state.load(Ordering::SeqCst) & IN_STEP_MASK != 0;
        s.state.fetch_or(CLOSED, Ordering::SeqCst);
        // A helper still in the step is finishing its last piece (a few
        // microseconds) unless it lost its core; then sleep until it is
        // done rather than take the core from it.
        let start = Instant::now();
        let mut spins = 0u32;
        while in_step() {
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) || start.elapsed() < FINISH_SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mut guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.caller_waits.store(true, Ordering::SeqCst);
            while in_step() {
                guard = s.done.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            s.caller_waits.store(false, Ordering::SeqCst);
        }
        // SAFETY: the step is closed and every helper has left it; we hold
        // `busy`.
        unsafe { *s.job.get() = None };
        IN_STEP.with(|f| f.set(false));
    }
}

/// Steps between two looks at whether the caller lost its core.
const PROBE_STEPS: u32 = 64;

/// Steps handed to rayon after a look found that it did.
const RAYON_STEPS: u32 = 512;

thread_local! {
    /// Steps until the next look, rayon steps left, and the caller's
    /// involuntary context switches at the last look.
    static PROBE: Cell<(u32, u32, i64)> = const { Cell::new((0, 0, -1)) };
}

/// Whether the calling thread was preempted in the last `PROBE_STEPS`
/// steps (then, for the next `RAYON_STEPS` steps, true), from the
/// kernel's count of its involuntary context switches; false where there
/// is no such count.
fn preempted_lately() -> bool {
    PROBE.with(|p| {
        let (until, rayon_left, last) = p.get();
        if rayon_left > 0 {
            let left = rayon_left - 1;
            let last = if left == 0 {
                involuntary_switches()
            } else {
                last
            };
            p.set((PROBE_STEPS, left, last));
            return true;
        }
        if until > 0 {
            p.set((until - 1, 0, last));
            return false;
        }
        let now = involuntary_switches();
        let preempted = last >= 0 && now > last;
        p.set((PROBE_STEPS, if preempted { RAYON_STEPS } else { 0 }, now));
        preempted
    })
}

#[cfg(target_os = "linux")]
fn involuntary_switches() -> i64 {
    // SAFETY: getrusage writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } == 0 {
        i64::from(u.ru_nivcsw)
    } else {
        -1
    }
}

#[cfg(not(target_os = "linux"))]
fn involuntary_switches() -> i64 {
    -1
}

/// Runs `f` on the caller and on the helpers that arrive while the step is
/// open, and returns when all of them are done. `f` must finish the step's
/// work whoever runs it (members claim pieces of it): it may run on the
/// caller alone.
fn step(f: impl Fn() + Sync) {
    let t = team();
    let alone =
        t.helpers == 0 || IN_STEP.with(|f| f.get()) || rayon::current_thread_index().is_some();
    let guard = if alone {
        None
    } else {
        match t.busy.try_lock() {
            Ok(g) => Some(g),
            // A step that panicked left nothing half-done in the team.
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    };
    let Some(_busy) = guard else {
        return f();
    };
    if preempted_lately() {
        // The machine has more runnable threads than cores: a caller that
        // never sleeps then gets only its fair share of a core, and a
        // helper that loses its core mid-piece stalls the step, so hand the
        // step to rayon, whose caller sleeps and whose workers are woken
        // (a first run here: 0.4-0.8x rayon's decode at load ~10 on two
        // cores without this).
        rayon::broadcast(|_| f());
        return;
    }
    let job_ref: &(dyn Fn() + Sync + '_) = &f;
    let s = t.shared;
    // SAFETY: the lifetime is erased for the helpers; `StepEnd` waits for
    // all that joined before `f` goes out of scope, even on unwinding.
    let job_ptr: *const Job =
        unsafe { std::mem::transmute::<&(dyn Fn() + Sync + '_), &'static Job>(job_ref) };
    unsafe { *s.job.get() = Some(job_ptr) };
    s.panicked.store(false, Ordering::Relaxed);
    let next = (s.state.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xFFFF_FFFF;
    s.state.store(next << 32, Ordering::SeqCst);
    if s.sleeping.load(Ordering::SeqCst) > 0 {
        let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
        s.wake.notify_all();
    }
    IN_STEP.with(|f| f.set(true));
    {
        let _end = StepEnd(s);
        f();
    }
    assert!(
        !s.panicked.load(Ordering::Relaxed),
        "team: a helper's part of the step panicked"
    );
}

/// Calls `f(i)` for every `i` in `0..n`, each exactly once, spread over the
/// team: members claim indices from a shared counter, so a member that
/// lost its core leaves its share to the others.
pub fn for_each_index(n: usize, f: impl Fn(usize) + Sync) {
    if n <= 1 {
        return (0..n).for_each(f);
    }
    let next = AtomicUsize::new(0);
    step(|| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        f(i);
    });
}

/// Splits each of `outs` into chunks of `chunk` elements (the last one
/// shorter) and calls `f(which, start, chunk)` once for each, spread over
/// the team: `which` indexes `outs`, `start` is the chunk's offset in it.
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

/// A mutable slice that team members write in parts they own (for outputs
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

/// A slice's pointer and length, shared with the team for
/// [`for_each_chunk_mut`] and [`DisjointMut`].
struct SendPtr<T>(*mut T, usize);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: members only touch disjoint chunks (see `for_each_chunk_mut`).
unsafe impl<T: Send> Sync for SendPtr<T> {}
unsafe impl<T: Send> Send for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn steps_from_many_threads_and_nested_steps_run() {
        // Concurrent callers: one gets the team, the others run alone.
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                sc.spawn(move || {
                    for round in 0..200u64 {
                        let sum = AtomicU64::new(0);
                        for_each_index(100, |i| {
                            // A nested step runs on the member alone.
                            let inner = AtomicU64::new(0);
                            for_each_index(3, |j| {
                                inner.fetch_add(j as u64, Ordering::Relaxed);
                            });
                            sum.fetch_add(i as u64 + inner.into_inner(), Ordering::Relaxed);
                        });
                        assert_eq!(sum.into_inner(), 4950 + 300, "thread {t} round {round}");
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_step_reaches_the_caller_and_the_team_survives() {
        let r = std::panic::catch_unwind(|| {
            for_each_index(64, |i| {
                if i == 40 {
                    panic!("boom");
                }
            })
        });
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        for_each_index(10, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.into_inner(), 45);
    }

    #[test]
    fn a_sleeping_team_wakes_up() {
        let sum = AtomicUsize::new(0);
        for_each_index(8, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        std::thread::sleep(SPIN * 20);
        // Enough pieces that a helper woken up takes some (not asserted:
        // the step is correct without it).
        for_each_index(2000, |i| {
            std::hint::black_box(i);
            sum.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(sum.into_inner(), 28 + 2000);
    }
}
