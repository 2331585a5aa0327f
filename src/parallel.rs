//! The parallel loops of the CPU backend and of the model's host-side
//! code: a pool of spinning workers for the many short loops of a decode
//! step (a few hundred per token, each a few tens of µs), rayon where no
//! pool is installed (the CUDA engine's host code, tests).
//!
//! rayon's idle workers go to sleep after a few dozen yields, and a loop
//! then wakes them one by one: on the 16-core device host (a KVM guest)
//! a loop of 64 tasks of 2 µs took 60–200 µs after a pause of 50 µs or
//! more, against 8 µs of work. Here the workers spin on an epoch counter
//! for `SPIN` after their last task and only then sleep, so a loop begins
//! on every core within about a µs (15–30 µs for the same loop).
//!
//! A loop is `for_each(n, f)`: tasks are indices handed out by an atomic
//! counter, the caller takes tasks too and waits until all are done.
//! Called from inside a task, or on a thread that has no pool installed
//! (`install`), `for_each` runs on rayon instead (inline in a task).

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker spins for the next loop before it sleeps.
pub(crate) const SPIN: Duration = Duration::from_micros(500);

/// A yield that took this long gave the core to another thread (rayon's
/// workers in a loop of the model's code): the worker then sleeps
/// instead of taking turns with it.
const YIELDED: Duration = Duration::from_micros(20);

/// One parallel loop: tasks `0..n` of `f`.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
    /// Tasks taken at once: many tiny tasks (the rows of a norm) would
    /// otherwise spend their time on the two shared counters.
    grain: usize,
    /// The next task to take and the tasks done, each on a cache line of
    /// its own (the threads take from the first while finished ones add
    /// to the second), and `done` added to once per thread: an empty loop took
    /// less than half the time on the 16-core device host
    /// (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "The spinning pool's
    /// counters on their own cache lines").
    next: Line<AtomicUsize>,
    done: Line<AtomicUsize>,
    /// A task's panic, raised again on the caller.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

/// A value alone on its cache line (and the adjacent line, which Intel
/// cores fetch in pairs).
#[repr(align(128))]
struct Line<T>(T);

impl Job<'_> {
    /// Take tasks until none is left; the tasks this thread ran are
    /// counted as done once, at the end.
    fn work(&self) {
        let mut ran = 0;
        loop {
            let i0 = self.next.0.fetch_add(self.grain, Relaxed);
            if i0 >= self.n {
                break;
            }
            let i1 = (i0 + self.grain).min(self.n);
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| (i0..i1).for_each(self.f))) {
                *self.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
            }
            ran += i1 - i0;
        }
        if ran > 0 {
            self.done.0.fetch_add(ran, Release);
        }
    }
}

struct Shared {
    /// Bumped for every loop.
    epoch: AtomicUsize,
    /// The loop in progress (null between loops). Its caller returns only
    /// once no worker is `entered`, so a non-null job read while entered
    /// is alive.
    job: AtomicPtr<Job<'static>>,
    /// On a line of its own: each worker adds to it as a loop begins,
    /// while the others still read `epoch` and `job`.
    entered: Line<AtomicUsize>,
    sleeping: AtomicUsize,
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The pool: `threads − 1` workers, and the caller of each loop.
pub(crate) struct SpinPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for SpinPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SpinPool({} threads)", self.workers.len() + 1)
    }
}

thread_local! {
    /// The pool that `for_each` on this thread uses (set by `install`).
    static CURRENT: Cell<*const SpinPool> = const { Cell::new(std::ptr::null()) };
    /// Whether this thread is running a task of a loop.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

impl SpinPool {
    pub(crate) fn new(threads: usize) -> std::io::Result<SpinPool> {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            entered: Line(AtomicUsize::new(0)),
            sleeping: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut pool = SpinPool {
            shared,
            workers: Vec::new(),
        };
        for i in 1..threads.max(1) {
            let s = pool.shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("moeflux-spin-{i}"))
                .spawn(move || worker(&s))?;
            pool.workers.push(h);
        }
        Ok(pool)
    }

    /// `f` with this pool as the one `for_each` uses on this thread.
    pub(crate) fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(*const SpinPool);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(self)));
        f()
    }

    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let job = Job {
            f,
            n,
            grain: (n / (4 * (self.workers.len() + 1))).max(1),
            next: Line(AtomicUsize::new(0)),
            done: Line(AtomicUsize::new(0)),
            panic: Mutex::new(None),
        };
        let s = &*self.shared;
        // SAFETY (of the lifetime erased here): `job` outlives every use
        // by a worker, which is only while `entered`, waited for below.
        s.job.store(&job as *const Job as *mut Job<'static>, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleeping.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        IN_TASK.with(|t| t.set(true));
        job.work();
        IN_TASK.with(|t| t.set(false));
        while job.done.0.load(Acquire) < n {
            std::hint::spin_loop();
        }
        s.job.store(std::ptr::null_mut(), SeqCst);
        while s.entered.0.load(SeqCst) != 0 {
            std::hint::spin_loop();
        }
        if let Some(p) = job.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            resume_unwind(p);
        }
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, SeqCst);
        {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// A job for a [`SpinRunner`].
pub(crate) type RunJob = Box<dyn FnOnce() + Send>;

/// How long a runner spins for its next job before it parks.
const RUNNER_SPIN: Duration = Duration::from_millis(5);

struct RunSlot {
    job: Mutex<Option<RunJob>>,
    posted: std::sync::atomic::AtomicU64,
    done: std::sync::atomic::AtomicU64,
    /// A job panicked (its panic is not raised again: the job's own guard
    /// must report it).
    panicked: AtomicBool,
    stop: AtomicBool,
}

/// A thread of its own that runs jobs with a [`SpinPool`] installed (as
/// the caller of its loops): [`SpinRunner::submit`] hands a job over and
/// returns at once, and the runner spins between jobs (for
/// `RUNNER_SPIN`), so that a job a few hundred µs after the last starts
/// without a system call. `--hybrid`'s CPU steps run on one while the
/// thread that drives the GPU goes on issuing launches.
pub(crate) struct SpinRunner {
    slot: Arc<RunSlot>,
    thread: Option<JoinHandle<()>>,
}

impl SpinRunner {
    pub(crate) fn new(pool: SpinPool) -> std::io::Result<SpinRunner> {
        let slot = Arc::new(RunSlot {
            job: Mutex::new(None),
            posted: Default::default(),
            done: Default::default(),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let s = slot.clone();
        let thread = std::thread::Builder::new()
            .name("moeflux-runner".into())
            .spawn(move || {
                let mut seen = 0u64;
                loop {
                    let t0 = Instant::now();
                    while s.posted.load(Acquire) == seen {
                        if s.stop.load(Acquire) {
                            return;
                        }
                        match t0.elapsed() < RUNNER_SPIN {
                            true => std::hint::spin_loop(),
                            false => std::thread::park_timeout(Duration::from_millis(1)),
                        }
                    }
                    seen += 1;
                    let job = s.job.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some(job) = job {
                        if catch_unwind(AssertUnwindSafe(|| pool.install(job))).is_err() {
                            s.panicked.store(true, Release);
                        }
                    }
                    s.done.store(seen, Release);
                }
            })?;
        Ok(SpinRunner {
            slot,
            thread: Some(thread),
        })
    }

    /// Wait until the last job handed over has finished; whether any job
    /// has panicked so far.
    pub(crate) fn wait(&self) -> bool {
        let s = &*self.slot;
        let t0 = Instant::now();
        while s.done.load(Acquire) != s.posted.load(Acquire) {
            match t0.elapsed() < RUNNER_SPIN {
                true => std::hint::spin_loop(),
                false => std::thread::yield_now(),
            }
        }
        s.panicked.load(Acquire)
    }

    /// Hand `job` over, once the last one has finished.
    pub(crate) fn submit(&self, job: RunJob) {
        self.wait();
        *self.slot.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        self.slot.posted.fetch_add(1, Release);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

impl Drop for SpinRunner {
    fn drop(&mut self) {
        self.slot.stop.store(true, Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn worker(s: &Shared) {
    IN_TASK.with(|t| t.set(true));
    let mut seen = s.epoch.load(SeqCst);
    let mut idle = Instant::now();
    let mut spins = 0u32;
    loop {
        let e = s.epoch.load(SeqCst);
        if e != seen {
            seen = e;
            s.entered.0.fetch_add(1, SeqCst);
            let p = s.job.load(SeqCst);
            if !p.is_null() {
                // SAFETY: non-null while entered: the caller waits.
                unsafe { &*p }.work();
            }
            s.entered.0.fetch_sub(1, SeqCst);
            idle = Instant::now();
            spins = 0;
            continue;
        }
        if s.stop.load(SeqCst) {
            return;
        }
        spins += 1;
        if !spins.is_multiple_of(256) {
            std::hint::spin_loop();
            continue;
        }
        if idle.elapsed() < SPIN {
            // Let a thread of another pool have the core if one waits; if
            // one did (the yield took long), the core is wanted: sleep.
            let t = Instant::now();
            std::thread::yield_now();
            if t.elapsed() < YIELDED {
                continue;
            }
        }
        let g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        s.sleeping.fetch_add(1, SeqCst);
        let g = if s.epoch.load(SeqCst) == seen && !s.stop.load(SeqCst) {
            s.wake.wait(g).unwrap_or_else(|e| e.into_inner())
        } else {
            g
        };
        s.sleeping.fetch_sub(1, SeqCst);
        drop(g);
        idle = Instant::now();
    }
}

/// `f(i)` for every `i < n`, in parallel: on the installed pool, or
/// rayon's where none is (or inline within a task of the pool).
pub(crate) fn for_each(n: usize, f: impl Fn(usize) + Sync) {
    if n == 0 {
        return;
    }
    if n == 1 || IN_TASK.with(|t| t.get()) {
        return (0..n).for_each(f);
    }
    let pool = CURRENT.with(|c| c.get());
    if pool.is_null() {
        use rayon::prelude::*;
        return (0..n).into_par_iter().for_each(&f);
    }
    // SAFETY: set by `install`, whose pool outlives the call it wraps.
    unsafe { &*pool }.run(n, &f);
}

/// A slice's chunks handed to the tasks of a loop, each chunk to one.
struct Chunks<T> {
    p: *mut T,
    len: usize,
    chunk: usize,
}

// SAFETY: each chunk goes to one task, so no element is shared.
unsafe impl<T: Send> Sync for Chunks<T> {}

impl<T> Chunks<T> {
    fn new(s: &mut [T], chunk: usize) -> Chunks<T> {
        Chunks {
            p: s.as_mut_ptr(),
            len: s.len(),
            chunk: chunk.max(1),
        }
    }

    fn count(&self) -> usize {
        self.len.div_ceil(self.chunk)
    }

    /// Chunk `i`.
    ///
    /// # Safety
    /// `i < count()`, and no other live reference to chunk `i`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, i: usize) -> &mut [T] {
        let at = i * self.chunk;
        std::slice::from_raw_parts_mut(self.p.add(at), self.chunk.min(self.len - at))
    }
}

/// `f(&mut items[i])` for every item, in parallel as `for_each`.
pub(crate) fn for_each_mut<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    for_each_chunk(items, 1, |_, c| f(&mut c[0]));
}

/// `f(i, chunk i)` for the chunks of `len` (the last one shorter) of
/// `out`, in parallel as `for_each`.
pub(crate) fn for_each_chunk<T: Send>(out: &mut [T], len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let c = Chunks::new(out, len);
    // SAFETY: each index is one task's, and in bounds.
    for_each(c.count(), |i| f(i, unsafe { c.get(i) }));
}

/// `f(i, chunk i of a, chunk i of b)` for the chunks of `la` of `a` and
/// `lb` of `b` (as many chunks in each), in parallel as `for_each`.
pub(crate) fn for_each_chunk2<A: Send, B: Send>(
    a: &mut [A],
    la: usize,
    b: &mut [B],
    lb: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    let (ca, cb) = (Chunks::new(a, la), Chunks::new(b, lb));
    // SAFETY: each index is one task's, and in bounds of both.
    for_each(ca.count().min(cb.count()), |i| unsafe { f(i, ca.get(i), cb.get(i)) });
}

/// Elements from which `zeros` and `for_each_span` split their work
/// among the threads, and the span each task takes.
const SPLIT_MIN: usize = 1 << 16;
const SPAN: usize = 1 << 14;

/// `len` zeros; a long vector is zeroed by all threads. A 512-token
/// prefill chunk's buffers are 4–16 MiB, and memory that the heap keeps
/// (`heap::retain_freed_memory`) is zeroed by the allocating thread: one
/// thread took about a millisecond a buffer.
pub(crate) fn zeros<T: Copy + Default + Send>(len: usize) -> Vec<T> {
    if len < SPLIT_MIN {
        return vec![T::default(); len];
    }
    let mut v = Vec::with_capacity(len);
    for_each_chunk(&mut v.spare_capacity_mut()[..len], SPAN, |_, c| {
        c.fill(std::mem::MaybeUninit::new(T::default()))
    });
    // SAFETY: the loop above wrote all `len` elements.
    unsafe { v.set_len(len) };
    v
}

/// `f(offset, span)` for consecutive spans of `out` (`offset` the span's
/// first index): in parallel when `out` is long, in one call when short.
pub(crate) fn for_each_span<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Sync) {
    if out.len() < SPLIT_MIN {
        return f(0, out);
    }
    for_each_chunk(out, SPAN, |i, c| f(i * SPAN, c));
}

/// `f(r, row r)` for the rows of `dim` elements of `out`: in parallel
/// when `out` is long, one after another when short.
pub(crate) fn for_each_row<T: Send>(out: &mut [T], dim: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if out.len() < SPLIT_MIN {
        return out.chunks_mut(dim.max(1)).enumerate().for_each(|(r, c)| f(r, c));
    }
    for_each_chunk(out, dim.max(1), f);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jobs run in order on the runner with the pool installed (their
    /// loops cover every task), `submit` returns before a job ends, and a
    /// panicking job is reported by `wait` without stopping the runner.
    #[test]
    fn runner_runs_jobs_in_order() {
        let runner = SpinRunner::new(SpinPool::new(3).expect("threads")).expect("runner");
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(AtomicBool::new(false));
        for j in 0..20usize {
            let (log, held) = (log.clone(), gate.clone());
            runner.submit(Box::new(move || {
                if j == 0 {
                    // Held until the caller has seen submit return.
                    while !held.load(Acquire) {
                        std::hint::spin_loop();
                    }
                }
                let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
                for_each(64, |i| {
                    hits[i].fetch_add(1, Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
                log.lock().expect("log").push(j);
            }));
            gate.store(true, Release);
        }
        assert!(!runner.wait());
        assert_eq!(*log.lock().expect("log"), (0..20).collect::<Vec<_>>());
        runner.submit(Box::new(|| panic!("job")));
        assert!(runner.wait());
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        runner.submit(Box::new(move || d.store(true, Release)));
        runner.wait();
        assert!(done.load(Acquire));
    }

    /// Long and short vectors come back zeroed whatever memory they got,
    /// and spans and rows cover every element once, with their offsets.
    #[test]
    fn zeros_spans_and_rows() {
        let pool = SpinPool::new(3).expect("threads");
        pool.install(|| {
            for len in [0, 5, SPLIT_MIN - 1, SPLIT_MIN, 3 * SPAN + 7 + SPLIT_MIN] {
                // Leave garbage where the next vector may be placed.
                drop(vec![7.5f32; len]);
                let z: Vec<f32> = zeros(len);
                assert_eq!(z.len(), len);
                assert!(z.iter().all(|&v| v == 0.0), "len {len}");
                let mut v = vec![0usize; len];
                for_each_span(&mut v, |o, s| {
                    s.iter_mut().enumerate().for_each(|(j, e)| *e += o + j + 1)
                });
                assert!(v.iter().enumerate().all(|(i, &e)| e == i + 1), "spans of {len}");
                let mut w = vec![0usize; len];
                for_each_row(&mut w, 100, |r, row| row.iter_mut().for_each(|e| *e += r + 1));
                assert!(w.iter().enumerate().all(|(i, &e)| e == i / 100 + 1), "rows of {len}");
            }
        });
    }

    /// Every task runs once, on the pool and without one, also loops
    /// nested in a task and loops after the workers slept.
    #[test]
    fn every_task_runs_once() {
        let pool = SpinPool::new(3).expect("threads");
        let count = |n: usize| {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for_each(n, |i| {
                hits[i].fetch_add(1, Relaxed);
                for_each(2, |_| {});
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "{n} tasks");
        };
        count(37);
        pool.install(|| {
            for n in [0, 1, 2, 5, 100] {
                count(n);
            }
            std::thread::sleep(SPIN * 3);
            count(64);
            let mut v = vec![1u32; 50];
            for_each_mut(&mut v, |x| *x += 1);
            assert!(v.iter().all(|&x| x == 2));
            for_each_chunk(&mut v, 7, |i, c| c.iter_mut().for_each(|x| *x += i as u32));
            assert!(v.iter().enumerate().all(|(j, &x)| x == 2 + (j / 7) as u32));
            let mut w = vec![0u8; 8];
            for_each_chunk2(&mut v, 7, &mut w, 1, |i, c, d| d[0] = (c.len() + i) as u8);
            assert_eq!(w, [7, 8, 9, 10, 11, 12, 13, 8]);
        });
    }

    /// A task's panic reaches the caller, and the pool still works.
    #[test]
    fn a_panic_reaches_the_caller() {
        let pool = SpinPool::new(2).expect("threads");
        pool.install(|| {
            let r = catch_unwind(|| for_each(8, |i| assert!(i != 5, "task five")));
            assert!(r.is_err());
            let n = AtomicUsize::new(0);
            for_each(8, |_| {
                n.fetch_add(1, Relaxed);
            });
            assert_eq!(n.load(Relaxed), 8);
        });
    }
}
