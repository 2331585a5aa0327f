//! `JobQueue`: jobs run one at a time, in the order they were pushed, on a
//! thread of their own, with a barrier (`flush`) that waits for every job
//! pushed before it and returns the first error any of them met. The CUDA
//! expert cache reads staged experts and issues their copies on one
//! (`backend/cuda/staging.rs`), so that the host goes on launching work
//! meanwhile; nothing here knows about devices.

use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

fn poisoned() -> Error {
    Error::Invalid("a job queue's lock was poisoned by a panic".into())
}

struct State<J> {
    /// Jobs pushed and not yet started, oldest first.
    jobs: VecDeque<J>,
    /// Jobs pushed so far, and jobs finished (run, failed or dropped).
    pushed: u64,
    finished: u64,
    /// The first error of a job since the last flush.
    error: Option<Error>,
    /// The queue is being dropped: the thread ends without starting the
    /// jobs still queued.
    stop: bool,
}

struct Shared<J> {
    st: Mutex<State<J>>,
    /// A job was pushed, or the queue stops.
    work: Condvar,
    /// A job finished.
    finished: Condvar,
}

/// A FIFO of jobs of type `J`, run in push order by one thread
/// (`name`). Errors of jobs (and panics, turned into errors) are kept
/// until the next [`JobQueue::flush`]; later jobs still run. Dropping the
/// queue waits for the job running, if any, and drops the ones not
/// started.
pub struct JobQueue<J: Send + 'static> {
    shared: Arc<Shared<J>>,
    thread: Option<JoinHandle<()>>,
}

impl<J: Send + 'static> JobQueue<J> {
    /// A queue whose thread, named `name`, runs each job with `run`.
    pub fn spawn(name: &str, run: impl FnMut(J) -> Result<()> + Send + 'static) -> Result<JobQueue<J>> {
        let shared = Arc::new(Shared {
            st: Mutex::new(State {
                jobs: VecDeque::new(),
                pushed: 0,
                finished: 0,
                error: None,
                stop: false,
            }),
            work: Condvar::new(),
            finished: Condvar::new(),
        });
        let worker = shared.clone();
        let who = name.to_string();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || serve(&worker, &who, run))
            .map_err(|e| Error::Invalid(format!("starting the thread {name}: {e}")))?;
        Ok(JobQueue {
            shared,
            thread: Some(thread),
        })
    }

    /// Queue `job` behind every job pushed before it.
    pub fn push(&self, job: J) -> Result<()> {
        let mut st = self.shared.st.lock().map_err(|_| poisoned())?;
        st.jobs.push_back(job);
        st.pushed += 1;
        self.shared.work.notify_one();
        Ok(())
    }

    /// Wait until every job pushed so far has finished; the first error
    /// one of them (or any job since the last flush) met, if any.
    pub fn flush(&self) -> Result<()> {
        let mut st = self.shared.st.lock().map_err(|_| poisoned())?;
        let target = st.pushed;
        while st.finished < target && !st.stop {
            st = self.shared.finished.wait(st).map_err(|_| poisoned())?;
        }
        match st.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The thread's loop (thread `name`): the oldest job, run without the
/// lock, until stopped.
fn serve<J>(sh: &Shared<J>, name: &str, mut run: impl FnMut(J) -> Result<()>) {
    loop {
        let job = {
            let Ok(mut st) = sh.st.lock() else { return };
            loop {
                if st.stop {
                    return;
                }
                if let Some(j) = st.jobs.pop_front() {
                    break j;
                }
                st = match sh.work.wait(st) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            }
        };
        let res = catch_unwind(AssertUnwindSafe(|| run(job)))
            .unwrap_or_else(|_| Err(Error::Invalid(format!("a job of the thread {name} panicked"))));
        let Ok(mut st) = sh.st.lock() else { return };
        st.finished += 1;
        if let Err(e) = res {
            st.error.get_or_insert(e);
        }
        sh.finished.notify_all();
    }
}

impl<J: Send + 'static> Drop for JobQueue<J> {
    fn drop(&mut self) {
        match self.shared.st.lock() {
            Ok(mut st) => st.stop = true,
            Err(p) => p.into_inner().stop = true,
        }
        self.shared.work.notify_all();
        self.shared.finished.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn jobs_run_in_push_order() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let q = JobQueue::spawn("test-order", move |j: u32| {
            // Early jobs slower, so that a reordering would show.
            std::thread::sleep(Duration::from_micros(u64::from(50 - j.min(50)) * 20));
            s.lock().map_err(|_| poisoned())?.push(j);
            Ok(())
        })
        .unwrap();
        for j in 0..100 {
            q.push(j).unwrap();
        }
        q.flush().unwrap();
        assert_eq!(*seen.lock().unwrap(), (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn flush_waits_for_every_earlier_job() {
        let count = Arc::new(Mutex::new(0u32));
        let c = count.clone();
        let q = JobQueue::spawn("test-flush", move |()| {
            std::thread::sleep(Duration::from_millis(5));
            *c.lock().map_err(|_| poisoned())? += 1;
            Ok(())
        })
        .unwrap();
        for round in 1..=3 {
            for _ in 0..4 {
                q.push(()).unwrap();
            }
            q.flush().unwrap();
            assert_eq!(*count.lock().unwrap(), 4 * round);
        }
        // A flush with nothing queued returns at once.
        q.flush().unwrap();
    }

    #[test]
    fn an_error_reaches_the_next_flush_once() {
        let ran = Arc::new(Mutex::new(Vec::new()));
        let r = ran.clone();
        let q = JobQueue::spawn("test-error", move |j: u32| {
            r.lock().map_err(|_| poisoned())?.push(j);
            match j {
                1 => Err(Error::Invalid("job 1 failed".into())),
                2 => Err(Error::Invalid("job 2 failed".into())),
                4 => panic!("job 4 panicked"),
                _ => Ok(()),
            }
        })
        .unwrap();
        for j in 0..4 {
            q.push(j).unwrap();
        }
        let e = q.flush().unwrap_err();
        assert!(e.to_string().contains("job 1 failed"), "{e}");
        // Later jobs ran; the error was taken by that flush.
        assert_eq!(*ran.lock().unwrap(), vec![0, 1, 2, 3]);
        q.flush().unwrap();
        // A panicking job is an error too, and the thread goes on.
        q.push(4).unwrap();
        q.push(5).unwrap();
        let e = q.flush().unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        assert_eq!(*ran.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn drop_waits_for_the_running_job_and_joins() {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let done = Arc::new(AtomicBool::new(false));
        let later = Arc::new(AtomicBool::new(false));
        let (d, l) = (done.clone(), later.clone());
        let q = JobQueue::spawn("test-drop", move |j: u32| {
            if j == 0 {
                let _ = started_tx.send(());
                std::thread::sleep(Duration::from_millis(50));
                d.store(true, Ordering::SeqCst);
            } else {
                l.store(true, Ordering::SeqCst);
            }
            Ok(())
        })
        .unwrap();
        q.push(0).unwrap();
        q.push(1).unwrap();
        started_rx.recv().unwrap();
        let weak = Arc::downgrade(&q.shared);
        drop(q);
        // The running job finished, the queued one never started, and the
        // thread is gone (it held the other reference to the state).
        assert!(done.load(Ordering::SeqCst));
        assert!(!later.load(Ordering::SeqCst));
        assert!(weak.upgrade().is_none());
    }
}
