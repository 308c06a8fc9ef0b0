//! N contenders on one lock for a measured while: the loop of every handoff
//! benchmark, for lockline and for every baseline alike.
//!
//! A [`Contest`] runs one task per contender. Each task loops while its
//! [`Contender`] is [`running`](Contender::running): it takes the lock, calls
//! [`granted`](Contender::granted) with the time its acquire began, then
//! [`releasing`](Contender::releasing) just before it lets go. The contest
//! counts grants, and handoffs (grants to another contender than the one
//! granted before), and keeps each acquire's latency and each handoff's
//! (from the holder starting to release to the next grant).
//!
//! ```
//! use std::time::Instant;
//! use lockline_bench::{Contest, Sampling};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockline_bench::BoxResult<()> {
//! let lock = std::sync::Arc::new(tokio::sync::Mutex::new(()));
//! let mut contest = Contest::start(2, Sampling::Window, |mut contender| {
//!     let lock = lock.clone();
//!     async move {
//!         while contender.running() {
//!             let started = Instant::now();
//!             let guard = lock.lock().await;
//!             contender.granted(started);
//!             contender.releasing();
//!             drop(guard);
//!             tokio::task::yield_now().await;
//!         }
//!         Ok::<(), std::io::Error>(())
//!     }
//! });
//! contest.run_for(0.05).await;
//! let outcome = contest.stop().await?;
//! assert!(outcome.grants_per_sec() > 0.0);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::latency::Latencies;
use crate::BoxResult;

/// Which grants a contest takes latencies from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampling {
    /// Grants until the window ends; a grant counts as a handoff only when
    /// another contender released just before it (`bench_redis`,
    /// `bench_zookeeper`, `bench_sql`).
    Window,
    /// Every grant until the contenders stop (the queue's drain after the
    /// window included); at N ≥ 2 each grant counts as a handoff from the
    /// release just before it, whoever released (`bench_etcd`).
    UntilStopped,
}

/// What the contenders share.
struct Shared {
    contenders: usize,
    sampling: Sampling,
    stop: AtomicBool,
    grants: AtomicU64,
    handoffs: AtomicU64,
    /// The last contender granted, plus one (0: none yet).
    last: AtomicUsize,
    /// Who began to release last, and when: the next grant takes it.
    releasing: Mutex<Option<(usize, Instant)>>,
    /// Every finished contender's samples: acquires, handoffs.
    samples: Mutex<(Latencies, Latencies)>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One contender's handle: its loop asks it whether to go on, and tells it
/// of each grant and release. Its samples join the contest's when it drops.
pub struct Contender {
    who: usize,
    shared: Arc<Shared>,
    acquire: Latencies,
    handoff: Latencies,
}

impl std::fmt::Debug for Contender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contender")
            .field("who", &self.who)
            .finish_non_exhaustive()
    }
}

impl Contender {
    /// This contender's number (0, 1, ... in the order they entered).
    pub fn who(&self) -> usize {
        self.who
    }

    /// Whether the contest goes on: once it is stopped, a contender ends its
    /// loop (after releasing what it holds).
    pub fn running(&self) -> bool {
        !self.shared.stop.load(Ordering::Relaxed)
    }

    /// The lock was granted to this contender, whose acquire began at
    /// `started`. Call it while holding, before [`releasing`](Self::releasing).
    pub fn granted(&mut self, started: Instant) {
        let granted = Instant::now();
        let shared = &self.shared;
        let released = lock(&shared.releasing).take();
        match shared.sampling {
            Sampling::Window => {
                if !shared.stop.load(Ordering::Relaxed) {
                    self.acquire.push(granted - started);
                    if let Some((releaser, at)) = released {
                        if releaser != self.who {
                            self.handoff.push(granted - at);
                        }
                    }
                }
            }
            Sampling::UntilStopped => {
                self.acquire.push(granted - started);
                if let (true, Some((_, at))) = (shared.contenders > 1, released) {
                    self.handoff.push(granted - at);
                }
            }
        }
        shared.grants.fetch_add(1, Ordering::Relaxed);
        let before = shared.last.swap(self.who + 1, Ordering::Relaxed);
        if before != 0 && before != self.who + 1 {
            shared.handoffs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// This contender begins to release now: the next grant is timed from
    /// here.
    pub fn releasing(&self) {
        *lock(&self.shared.releasing) = Some((self.who, Instant::now()));
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        let mut samples = lock(&self.shared.samples);
        samples.0.extend(std::mem::take(&mut self.acquire));
        samples.1.extend(std::mem::take(&mut self.handoff));
    }
}

/// A contest of N contenders (see the module docs).
pub struct Contest {
    shared: Arc<Shared>,
    entered: usize,
    tasks: Vec<tokio::task::JoinHandle<BoxResult<()>>>,
    /// Grants and handoffs when the window ended, and its length.
    window: Option<(u64, u64, f64)>,
}

impl std::fmt::Debug for Contest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contest")
            .field("contenders", &self.shared.contenders)
            .field("sampling", &self.shared.sampling)
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Contest {
    /// A contest dropped before [`stop`](Contest::stop) (its program failed
    /// meanwhile) stops its contenders' tasks.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What a contest measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Grants within the window.
    pub grants: u64,
    /// Grants within the window to another contender than the one before.
    pub handoffs: u64,
    /// Grants until the contenders stopped (the window's and the drain's
    /// after it), for figures per grant counted over the whole run.
    pub all_grants: u64,
    /// The window's length.
    pub seconds: f64,
    /// Each acquire, from its start to its grant.
    pub acquire: Latencies,
    /// Each handoff, from the holder starting to release to the next grant.
    pub handoff: Latencies,
}

impl Outcome {
    /// Grants per second within the window.
    pub fn grants_per_sec(&self) -> f64 {
        self.grants as f64 / self.seconds
    }

    /// Handoffs per second within the window.
    pub fn handoffs_per_sec(&self) -> f64 {
        self.handoffs as f64 / self.seconds
    }
}

impl Contest {
    /// A contest for `contenders`, none entered yet: for contenders that
    /// need set-up of their own first (a connection each, say), entered and
    /// spawned one by one with [`enter`](Self::enter) and
    /// [`spawn`](Self::spawn). Counting starts with the first contender.
    pub fn new(contenders: usize, sampling: Sampling) -> Self {
        Contest {
            shared: Arc::new(Shared {
                contenders,
                sampling,
                stop: AtomicBool::new(false),
                grants: AtomicU64::new(0),
                handoffs: AtomicU64::new(0),
                last: AtomicUsize::new(0),
                releasing: Mutex::new(None),
                samples: Mutex::new((Latencies::new(), Latencies::new())),
            }),
            entered: 0,
            tasks: Vec::new(),
            window: None,
        }
    }

    /// Spawns `contenders` tasks at once, each running `contender`'s future.
    pub fn start<F, Fut, E>(contenders: usize, sampling: Sampling, mut contender: F) -> Self
    where
        F: FnMut(Contender) -> Fut,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<crate::BoxError> + 'static,
    {
        let mut contest = Contest::new(contenders, sampling);
        for _ in 0..contenders {
            let handle = contest.enter();
            contest.spawn(contender(handle));
        }
        contest
    }

    /// The next contender's handle.
    pub fn enter(&mut self) -> Contender {
        let who = self.entered;
        self.entered += 1;
        Contender {
            who,
            shared: Arc::clone(&self.shared),
            acquire: Latencies::new(),
            handoff: Latencies::new(),
        }
    }

    /// Runs one contender's loop as a task.
    pub fn spawn<Fut, E>(&mut self, contender: Fut)
    where
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<crate::BoxError> + 'static,
    {
        self.tasks
            .push(tokio::spawn(async move { contender.await.map_err(Into::into) }));
    }

    /// Lets the contenders run for `seconds` (from now) and takes the
    /// window's counts; they go on until [`stop`](Self::stop).
    pub async fn run_for(&mut self, seconds: f64) {
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        let shared = &self.shared;
        self.window = Some((
            shared.grants.load(Ordering::SeqCst),
            shared.handoffs.load(Ordering::SeqCst),
            seconds,
        ));
    }

    /// Stops the contenders and waits for each to finish its loop.
    ///
    /// # Errors
    ///
    /// The first contender that failed (or panicked); the others are
    /// aborted then, so that none goes on holding its client.
    pub async fn stop(mut self) -> BoxResult<Outcome> {
        self.shared.stop.store(true, Ordering::SeqCst);
        let mut failed = None;
        for task in std::mem::take(&mut self.tasks) {
            if failed.is_some() {
                task.abort();
                continue;
            }
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => failed = Some(error),
                Err(panicked) => failed = Some(panicked.into()),
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
        let (grants, handoffs, seconds) = self.window.unwrap_or((0, 0, f64::NAN));
        let (acquire, handoff) = std::mem::take(&mut *lock(&self.shared.samples));
        Ok(Outcome {
            grants,
            handoffs,
            all_grants: self.shared.grants.load(Ordering::SeqCst),
            seconds,
            acquire,
            handoff,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two contenders taking turns by hand, as a FIFO lock would grant.
    fn turns(sampling: Sampling) -> (Outcome, Contender, Contender) {
        let mut contest = Contest::new(2, sampling);
        let (mut a, mut b) = (contest.enter(), contest.enter());
        let t = Instant::now();
        a.granted(t); // first grant: no handoff
        a.releasing();
        a.granted(t); // a again: a handoff only when sampling until stopped
        a.releasing();
        b.granted(t);
        b.releasing();
        let outcome = Outcome {
            grants: contest.shared.grants.load(Ordering::SeqCst),
            handoffs: contest.shared.handoffs.load(Ordering::SeqCst),
            ..Outcome::default()
        };
        (outcome, a, b)
    }

    #[test]
    fn window_sampling_counts_handoffs_to_another_contender_only() {
        let (outcome, a, b) = turns(Sampling::Window);
        assert_eq!((outcome.grants, outcome.handoffs), (3, 1));
        assert_eq!((a.acquire.len(), a.handoff.len()), (2, 0));
        assert_eq!((b.acquire.len(), b.handoff.len()), (1, 1));
        // Nothing is sampled once stopped.
        a.shared.stop.store(true, Ordering::SeqCst);
        let mut a = a;
        a.granted(Instant::now());
        assert_eq!(a.acquire.len(), 2);
    }

    #[test]
    fn until_stopped_sampling_times_every_grant_after_a_release() {
        let (outcome, a, b) = turns(Sampling::UntilStopped);
        assert_eq!((outcome.grants, outcome.handoffs), (3, 1));
        assert_eq!((a.acquire.len(), a.handoff.len()), (2, 1));
        assert_eq!(b.handoff.len(), 1);
        a.shared.stop.store(true, Ordering::SeqCst);
        let mut a = a;
        a.granted(Instant::now());
        assert_eq!(a.acquire.len(), 3);
    }

    #[tokio::test]
    async fn samples_join_when_contenders_end() {
        let mut contest = Contest::start(3, Sampling::Window, |mut contender| async move {
            for _ in 0..4 {
                let started = Instant::now();
                contender.granted(started);
                contender.releasing();
                tokio::task::yield_now().await;
            }
            Ok::<(), std::io::Error>(())
        });
        contest.run_for(0.01).await;
        let outcome = contest.stop().await.expect("contest");
        assert_eq!((outcome.grants, outcome.all_grants), (12, 12));
        assert_eq!(outcome.acquire.len(), 12);
        assert!(outcome.handoff.len() <= 11);
    }
}
