//! Campaign workers: trials on every thread with no barrier, their results written in trial
//! order by whichever worker completes a contiguous run, in buffered appends.

use super::TrialTime;
use crate::error::{FaultError, Result};
use crate::record::TrialRecord;
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Jobs a worker may start ahead of the first one not yet written, per thread: enough to keep
/// every thread busy past a long trial, and a bound on the results held in memory.
pub(super) const WINDOW_PER_THREAD: usize = 64;

/// Runs `job(state, i)` for each `i` in `0..len` on `pool`'s threads, one worker per thread
/// with its own `state` from `init`, and hands the results to `write` in order of `i`, one
/// batch at a time, each as soon as it continues what was written: whichever worker ends a job
/// that lets a batch be written writes it, unless another is writing (which then takes that
/// job's result too), so `write` runs on one thread at a time, and on one thread a job and its
/// writing follow each other with no hand-over between threads.
///
/// No barrier: a worker takes the next job as it ends one, at most `window` jobs past the
/// first unwritten one (it waits for the writing otherwise), so a long job holds up no other
/// thread and at most `window` results are held. A job's error stops the workers taking jobs
/// after it; the jobs before it still run and are written, and the first failing job's error
/// is returned (the same for any thread count), or else `write`'s first error (which stops
/// every worker). A panic in a job or in `write` stops every worker and is raised again here
/// once they have ended.
pub(super) fn run_ordered<S, T: Send>(
    pool: &rayon::ThreadPool,
    len: usize,
    window: usize,
    init: impl Fn() -> S + Sync,
    job: impl Fn(&mut S, usize) -> Result<T> + Sync,
    write: impl FnMut(Vec<T>) -> Result<()> + Send,
) -> Result<()> {
    let order = Order::new(len, window, write);
    // One worker on each of the pool's threads: a broadcast, so that no worker runs nested
    // inside another's job, and any parallelism inside a job stays on the pool.
    pool.broadcast(|_| {
        // A panic here must not leave the others waiting for a job this one will never end.
        let _stop = StopOnPanic(&order);
        let mut state = init();
        while let Some(i) = order.take() {
            let r = job(&mut state, i);
            order.deliver(i, r);
        }
    });
    let mut g = order.lock();
    match (g.failed.take(), g.write_failed.take()) {
        (Some((_, e)), _) | (None, Some(e)) => Err(e),
        (None, None) => Ok(()),
    }
}

/// The jobs of [`run_ordered`] and their results: which job runs next, which are held until
/// their turn to be written, and who writes.
struct Order<T, W> {
    state: Mutex<OrderState<T>>,
    /// Signalled when the written jobs or the limit change.
    moved: Condvar,
    /// Jobs in all.
    len: usize,
    /// How far past the first unwritten job a worker may start one.
    window: usize,
    /// Locked only by the one writing (`OrderState::writing`).
    write: Mutex<W>,
}

struct OrderState<T> {
    /// The next job to hand out.
    next: usize,
    /// No job from here on runs (just past the first failing one, or 0 to stop all).
    limit: usize,
    /// Results of jobs not yet taken to be written, by job.
    held: BTreeMap<usize, T>,
    /// Jobs taken to be written (the first ones), and written.
    taken: usize,
    written: usize,
    /// A worker is writing (for good, once a write failed or panicked: no more writes).
    writing: bool,
    /// The first failing job and its error.
    failed: Option<(usize, FaultError)>,
    /// The error of the write that failed.
    write_failed: Option<FaultError>,
}

impl<T, W> Order<T, W> {
    fn lock(&self) -> MutexGuard<'_, OrderState<T>> {
        // No panic happens while the state is locked but an allocation's; what it guards stays
        // whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// No job from `i` on is to run.
    fn stop_at(&self, i: usize) {
        let mut g = self.lock();
        g.limit = g.limit.min(i);
        drop(g);
        self.moved.notify_all();
    }
}

impl<T, W: FnMut(Vec<T>) -> Result<()>> Order<T, W> {
    fn new(len: usize, window: usize, write: W) -> Self {
        let state = OrderState {
            next: 0,
            limit: usize::MAX,
            held: BTreeMap::new(),
            taken: 0,
            written: 0,
            writing: false,
            failed: None,
            write_failed: None,
        };
        Order { state: Mutex::new(state), moved: Condvar::new(), len, window: window.max(1), write: Mutex::new(write) }
    }

    /// The next job to run, once it is inside the window, or `None` when there is none.
    fn take(&self) -> Option<usize> {
        let mut g = self.lock();
        let i = g.next;
        if i >= self.len.min(g.limit) {
            return None;
        }
        g.next += 1;
        while i < g.limit && i >= g.written + self.window {
            g = self.moved.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        (i < g.limit).then_some(i)
    }

    /// Job `i` ended with `r`: held until its turn, and whatever can be written now written,
    /// unless another worker is writing (it writes this too before it stops).
    fn deliver(&self, i: usize, r: Result<T>) {
        let mut g = self.lock();
        match r {
            Ok(x) if g.failed.as_ref().is_none_or(|(k, _)| i < *k) => {
                g.held.insert(i, x);
            }
            Ok(_) => {}
            Err(e) => {
                if g.failed.as_ref().is_none_or(|(k, _)| i < *k) {
                    // Nothing at or past the first failure is written.
                    g.held.retain(|&j, _| j < i);
                    g.failed = Some((i, e));
                }
                drop(g);
                self.stop_at(i + 1);
                g = self.lock();
            }
        }
        if g.writing {
            return;
        }
        g.writing = true;
        loop {
            let (mut batch, st) = (Vec::new(), &mut *g);
            while let Some(x) = st.held.remove(&st.taken) {
                batch.push(x);
                st.taken += 1;
            }
            if batch.is_empty() {
                g.writing = false;
                return;
            }
            let taken = g.taken;
            drop(g);
            let r = (self.write.lock().unwrap_or_else(PoisonError::into_inner))(batch);
            g = self.lock();
            if let Err(e) = r {
                // `writing` stays set: no more writes.
                g.write_failed = Some(e);
                drop(g);
                self.stop_at(0);
                return;
            }
            g.written = taken;
            self.moved.notify_all();
        }
    }
}

/// Stops every worker when dropped by a panic (a job's or a write's: that write's worker
/// stays the writer, so nothing more is written).
struct StopOnPanic<'a, T, W>(&'a Order<T, W>);

impl<T, W> Drop for StopOnPanic<'_, T, W> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop_at(0);
        }
    }
}

/// Records and timing lines waiting to be appended: at most this many bytes of records…
const WRITE_BYTES: usize = 64 << 10;
/// …or this many seconds since they were last appended, if trials end meanwhile.
const WRITE_SECS: f64 = 0.1;

/// The writer of a run's records and timing lines, in batches.
pub(super) struct Writer {
    records: fs::File,
    records_path: PathBuf,
    timing: fs::File,
    timing_path: PathBuf,
    /// Records and timing lines not yet appended.
    lines: String,
    times: String,
    /// When they were last appended.
    written: Instant,
    /// When the records were last synced.
    synced: Instant,
    /// An append failed: nothing more is appended (a retry could repeat part of a line).
    broken: bool,
}

impl Writer {
    pub(super) fn open(out: &Path) -> Result<Writer> {
        let records_path = out.join("records.jsonl");
        let records = OpenOptions::new().append(true).open(&records_path).map_err(FaultError::io(&records_path))?;
        let timing_path = out.join("timing.jsonl");
        let timing = OpenOptions::new().append(true).open(&timing_path).map_err(FaultError::io(&timing_path))?;
        let (lines, times, written, synced) = (String::new(), String::new(), Instant::now(), Instant::now());
        Ok(Writer { records, records_path, timing, timing_path, lines, times, written, synced, broken: false })
    }

    /// The next trials' records, wall times and where they went, appended with those before
    /// them once there are [`WRITE_BYTES`] or [`WRITE_SECS`] have passed.
    pub(super) fn add(&mut self, batch: &[(TrialRecord, Duration, TrialTime)]) -> Result<()> {
        for (rec, wall, time) in batch {
            self.lines.push_str(&serde_json::to_string(rec).expect("records serialise"));
            self.lines.push('\n');
            let us = |d: &Duration| d.as_micros();
            let (w, f, e) = (us(wall), us(&time.follow), us(&time.eval));
            let line = format!("{{\"trial\":{},\"wall_us\":{w},\"follow_us\":{f},\"eval_us\":{e}}}\n", rec.trial);
            self.times.push_str(&line);
        }
        if self.lines.len() >= WRITE_BYTES || self.written.elapsed().as_secs_f64() >= WRITE_SECS {
            self.flush()?;
        }
        Ok(())
    }

    /// Appends what is waiting and syncs the records: nothing recorded is lost, whatever
    /// stopped the run.
    pub(super) fn finish(&mut self) -> Result<()> {
        self.flush()?;
        self.records.sync_data().map_err(FaultError::io(&self.records_path))
    }

    /// Appends the records and timing lines not yet appended (none once an append failed).
    fn flush(&mut self) -> Result<()> {
        if self.lines.is_empty() || self.broken {
            return Ok(());
        }
        self.broken = true;
        // Timing first: a kill between the two leaves timing lines of unrecorded trials,
        // which resuming drops, rather than recorded trials without timing.
        self.timing.write_all(self.times.as_bytes()).map_err(FaultError::io(&self.timing_path))?;
        self.records.write_all(self.lines.as_bytes()).map_err(FaultError::io(&self.records_path))?;
        self.broken = false;
        self.lines.clear();
        self.times.clear();
        self.written = Instant::now();
        // A killed process loses nothing written (the kernel has it); syncing guards
        // against a machine crash, and once a second bounds that loss at little cost.
        if self.synced.elapsed().as_secs_f64() >= 1.0 {
            self.records.sync_data().map_err(FaultError::io(&self.records_path))?;
            self.synced = Instant::now();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
    }

    fn fail(i: usize) -> FaultError {
        FaultError::Inconsistent(format!("job {i} failed"))
    }

    /// Runs `f` on another thread and fails the test if it takes a minute (a deadlock).
    fn within_a_minute<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(f()).unwrap());
        rx.recv_timeout(Duration::from_secs(60)).expect("deadlocked")
    }

    /// Jobs of uneven length (some long, as follow-up trials are) are written in order, each
    /// once, for any thread count and window; no job starts a window or more past the first
    /// unwritten one.
    #[test]
    fn results_are_written_in_order_within_the_window() {
        for threads in 1..=4 {
            for window in [1, 3, 64] {
                let p = pool(threads);
                let (written, started_past) = (AtomicUsize::new(0), AtomicUsize::new(0));
                let mut out = Vec::new();
                let job = |_: &mut (), i: usize| {
                    if i >= written.load(Ordering::SeqCst) + window {
                        started_past.fetch_add(1, Ordering::SeqCst);
                    }
                    let us = if i % 17 == 3 { 3000 } else { (i * 7919 % 5) as u64 * 50 };
                    std::thread::sleep(Duration::from_micros(us));
                    Ok(i)
                };
                run_ordered(
                    &p,
                    120,
                    window,
                    || (),
                    job,
                    |batch| {
                        out.extend(batch);
                        written.store(out.len(), Ordering::SeqCst);
                        Ok(())
                    },
                )
                .unwrap();
                assert_eq!(out, (0..120).collect::<Vec<_>>(), "{threads} threads, window {window}");
                assert_eq!(started_past.load(Ordering::SeqCst), 0, "{threads} threads, window {window}");
            }
        }
    }

    /// The first failing job's error is returned, even when a later one fails first, and every
    /// job before it is written; nothing at or past it is, and no job starts past the window.
    #[test]
    fn the_first_failing_job_stops_the_run() {
        for threads in [1, 3] {
            let p = pool(threads);
            let started = AtomicUsize::new(0);
            let mut out = Vec::new();
            let job = |_: &mut (), i: usize| {
                started.fetch_max(i, Ordering::SeqCst);
                match i {
                    10 => {
                        std::thread::sleep(Duration::from_millis(30));
                        Err(fail(i))
                    }
                    12 => Err(fail(i)),
                    _ => Ok(i),
                }
            };
            let e = run_ordered(
                &p,
                1000,
                4,
                || (),
                job,
                |batch| {
                    out.extend(batch);
                    Ok(())
                },
            )
            .unwrap_err();
            assert_eq!(e.to_string(), "internal inconsistency: job 10 failed", "{threads} threads");
            assert_eq!(out, (0..10).collect::<Vec<_>>(), "{threads} threads");
            assert!(started.load(Ordering::SeqCst) < 14, "{threads} threads");
        }
        // A write's error stops the run too.
        let mut writes = 0;
        let e = run_ordered(
            &pool(2),
            1000,
            8,
            || (),
            |_, i| Ok(i),
            |_| {
                writes += 1;
                Err(fail(99))
            },
        )
        .unwrap_err();
        assert_eq!((e.to_string().as_str(), writes), ("internal inconsistency: job 99 failed", 1));
    }

    /// A job's panic, or the writer's, stops the run and is raised again, while other workers
    /// wait for the writer: no deadlock.
    #[test]
    fn a_panic_ends_the_run() {
        for threads in [1, 3] {
            let e = within_a_minute(move || {
                std::panic::catch_unwind(|| {
                    let job = |_: &mut (), i: usize| {
                        if i == 5 {
                            std::thread::sleep(Duration::from_millis(20));
                            panic!("job 5 panicked");
                        }
                        Ok(i)
                    };
                    run_ordered(&pool(threads), 1000, 2, || (), job, |_| Ok(()))
                })
            })
            .unwrap_err();
            assert_eq!(e.downcast_ref::<&str>(), Some(&"job 5 panicked"), "{threads} threads");
            let e = within_a_minute(move || {
                std::panic::catch_unwind(|| {
                    let job = |_: &mut (), i: usize| Ok(i);
                    run_ordered(&pool(threads), 1000, 2, || (), job, |_| panic!("the writer panicked"))
                })
            })
            .unwrap_err();
            assert_eq!(e.downcast_ref::<&str>(), Some(&"the writer panicked"), "{threads} threads");
        }
    }
}
