//! Metrics for Prometheus through the [`metrics`](https://docs.rs/metrics)
//! facade (the `metrics` cargo feature, off by default).
//!
//! With the feature on, every [`Client`](crate::Client) records what its
//! sessions do into whatever recorder the program installed (for
//! Prometheus, `metrics-exporter-prometheus`); with no recorder installed
//! the records go nowhere. Nothing is sent to the lock's server for them:
//! every value is taken from what the client already sees (DESIGN §6.17).
//!
//! | name | type | labels | what |
//! | --- | --- | --- | --- |
//! | `lockline_acquire_wait_seconds` | histogram | backend, recipe | from an acquire's call to its grant (granted acquires only) |
//! | `lockline_hold_seconds` | histogram | backend, recipe | from a grant to the release, the drop of the guard, the session's close or the loss |
//! | `lockline_handoff_seconds` | histogram | backend, recipe | from a waiter's wakeup (the entry it waited on seen gone) to its grant: the read after the wakeup (a grant held back by a lock-delay is not a handoff) |
//! | `lockline_grants_total` | counter | backend, recipe | locks, permits and leaderships granted |
//! | `lockline_timeouts_total` | counter | backend, recipe | acquires with a timeout that ran out |
//! | `lockline_busy_total` | counter | backend, recipe | one-try acquires (`try_*`, a zero timeout) that found it taken |
//! | `lockline_cancellations_total` | counter | backend, recipe | acquires dropped before they ended |
//! | `lockline_acquire_errors_total` | counter | backend, recipe | acquires that failed otherwise (session over, server unreachable, ...) |
//! | `lockline_losses_total` | counter | backend, recipe, cause | held locks lost, by `cause` (below) |
//! | `lockline_cleanup_retries_total` | counter | backend, recipe | failed tries of a background removal (a dropped guard, a cancelled acquire), each retried |
//! | `lockline_cleanup_failures_total` | counter | backend, recipe | background removals that failed five times in a row, or that the server refused |

//! | `lockline_held` | gauge | backend, recipe | locks, permits and leaderships held now |
//! | `lockline_waiters` | gauge | backend, recipe | acquires waiting now for an earlier entry to go |
//! | `lockline_sessions` | gauge | backend, state | sessions open now by `state`: `live` or `suspended` |
//! | `lockline_sessions_opened_total` | counter | backend | sessions opened |
//! | `lockline_sessions_ended_total` | counter | backend, state | sessions ended by `state`: `closed`, `lost`, or `dropped` (every handle dropped without a close) |
//!
//! The two cleanup counters never carry a lock name (a removal knows its
//! entry, not always its lock's name).
//!
//! `recipe` is `mutex` (multi-locks included), `read`, `write`, `semaphore`
//! or `election`; `backend` is [`Client::backend_name`](crate::Client::backend_name).
//! A loss's `cause` is one of:
//!
//! - `expired`: the session ended while it was confirmed (`Live`): the
//!   server said so (an expired or revoked lease, a ZooKeeper session
//!   expiry, a keepalive answered with no TTL, the memory backend's
//!   [`expire`](crate::MemoryBackend::expire));
//! - `unconfirmed`: the session ended while it was `Suspended`: not
//!   confirmed for `ttl - safety margin`, or its expiry learnt only on
//!   reconnecting;
//! - `deleted`: the entry was deleted by someone else while the session
//!   lived;
//! - `runtime_gone`: the tokio runtime that watched the lock shut down.
//!
//! A guard released, dropped, or whose session was closed is no loss.
//!
//! # Lock names
//!
//! Lock names are not labels by default: a service taking a lock per job
//! or per user would make a time series per name, without bound. A
//! program with a few fixed names may add them as a `lock` label to the
//! per-recipe metrics with [`include_lock_names`]. Each acquire then
//! registers its metrics by name with the recorder (a map look-up on every
//! acquire and release instead of handles kept per client).
//!
//! # Order
//!
//! Install the recorder before the first lock is taken: a client keeps
//! the handles it registered at its first acquire of each recipe.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockline::Result<()> {
//! // metrics_exporter_prometheus::PrometheusBuilder::new()
//! //     .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), lockline::metrics::BUCKETS)?
//! //     .with_http_listener(([127, 0, 0, 1], 9898))
//! //     .install()?;
//! lockline::metrics::describe();
//! let session = lockline::Client::memory().session().await?;
//! session.mutex("jobs/nightly")?.lock().await?.release().await?;
//! # Ok(()) }
//! ```
//!
//! `metrics-exporter-prometheus` renders histograms as summaries unless it
//! is given buckets: [`BUCKETS`] suits the `_seconds` histograms.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram, Label, Unit};

use crate::sequencer::Mode;
use crate::{EntryKind, Error, SessionState};

/// Histogram buckets (seconds) for the `_seconds` histograms, from 100 µs
/// (an uncontended acquire on the memory backend) to five minutes (a long
/// wait or hold), for an exporter that needs them
/// (`PrometheusBuilder::set_buckets_for_metric`).
pub const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0,
];

/// The name of the acquire-wait histogram.
pub const ACQUIRE_WAIT_SECONDS: &str = "lockline_acquire_wait_seconds";
/// The name of the hold-time histogram.
pub const HOLD_SECONDS: &str = "lockline_hold_seconds";
/// The name of the handoff-latency histogram.
pub const HANDOFF_SECONDS: &str = "lockline_handoff_seconds";
/// The name of the grants counter.
pub const GRANTS_TOTAL: &str = "lockline_grants_total";
/// The name of the timeouts counter.
pub const TIMEOUTS_TOTAL: &str = "lockline_timeouts_total";
/// The name of the counter of one-try acquires that found the lock taken.
pub const BUSY_TOTAL: &str = "lockline_busy_total";
/// The name of the cancellations counter.
pub const CANCELLATIONS_TOTAL: &str = "lockline_cancellations_total";
/// The name of the counter of acquires that failed otherwise.
pub const ACQUIRE_ERRORS_TOTAL: &str = "lockline_acquire_errors_total";
/// The name of the losses counter (label `cause`).
pub const LOSSES_TOTAL: &str = "lockline_losses_total";
/// The name of the counter of failed background-removal tries.
pub const CLEANUP_RETRIES_TOTAL: &str = "lockline_cleanup_retries_total";
/// The name of the counter of background removals given up on or refused.
pub const CLEANUP_FAILURES_TOTAL: &str = "lockline_cleanup_failures_total";
/// The name of the gauge of held locks.
pub const HELD: &str = "lockline_held";
/// The name of the gauge of waiting acquires.
pub const WAITERS: &str = "lockline_waiters";
/// The name of the gauge of open sessions (label `state`).
pub const SESSIONS: &str = "lockline_sessions";
/// The name of the counter of sessions opened.
pub const SESSIONS_OPENED_TOTAL: &str = "lockline_sessions_opened_total";
/// The name of the counter of sessions ended (label `state`).
pub const SESSIONS_ENDED_TOTAL: &str = "lockline_sessions_ended_total";

static LOCK_NAMES: AtomicBool = AtomicBool::new(false);

/// Whether the per-recipe metrics carry the lock's name as a `lock` label
/// (off by default; see [the module docs](self#lock-names)). Applies to
/// the acquires and holds that begin after the call, in every client of
/// the process.
pub fn include_lock_names(include: bool) {
    LOCK_NAMES.store(include, Ordering::Relaxed);
}

/// Registers every metric's description and unit with the installed
/// recorder (the `# HELP` lines of a Prometheus scrape). Optional; call
/// it after installing the recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        ACQUIRE_WAIT_SECONDS,
        Unit::Seconds,
        "Time from an acquire's call to its grant."
    );
    describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Time from a grant to the release, the guard's drop, the session's close or the loss."
    );
    describe_histogram!(
        HANDOFF_SECONDS,
        Unit::Seconds,
        "Time from a waiter's wakeup (the entry it waited on seen gone) to its grant."
    );
    describe_counter!(GRANTS_TOTAL, Unit::Count, "Locks, permits and leaderships granted.");
    describe_counter!(TIMEOUTS_TOTAL, Unit::Count, "Acquires whose timeout ran out.");
    describe_counter!(BUSY_TOTAL, Unit::Count, "One-try acquires that found the lock taken.");
    describe_counter!(CANCELLATIONS_TOTAL, Unit::Count, "Acquires dropped before they ended.");
    describe_counter!(ACQUIRE_ERRORS_TOTAL, Unit::Count, "Acquires that failed otherwise.");
    describe_counter!(LOSSES_TOTAL, Unit::Count, "Held locks lost, by cause.");
    describe_counter!(
        CLEANUP_RETRIES_TOTAL,
        Unit::Count,
        "Failed tries of a background removal."
    );
    describe_counter!(
        CLEANUP_FAILURES_TOTAL,
        Unit::Count,
        "Background removals that failed five times in a row or were refused."
    );
    describe_gauge!(HELD, Unit::Count, "Locks, permits and leaderships held now.");
    describe_gauge!(WAITERS, Unit::Count, "Acquires waiting for an earlier entry to go.");
    describe_gauge!(SESSIONS, Unit::Count, "Open sessions by state.");
    describe_counter!(SESSIONS_OPENED_TOTAL, Unit::Count, "Sessions opened.");
    describe_counter!(SESSIONS_ENDED_TOTAL, Unit::Count, "Sessions ended, by how.");
}

/// The recipe label of an entry kind.
fn recipe_of(kind: EntryKind) -> (usize, &'static str) {
    match kind {
        EntryKind::Mutex => (0, "mutex"),
        EntryKind::Read => (1, "read"),
        EntryKind::Write => (2, "write"),
        EntryKind::Semaphore => (3, "semaphore"),
        EntryKind::Election => (4, "election"),
        EntryKind::Foreign => (5, "foreign"),
        EntryKind::Dlm => (6, "lock_mode"),
    }
}

fn kind_of(mode: Mode) -> EntryKind {
    match mode {
        Mode::Mutex => EntryKind::Mutex,
        Mode::Read => EntryKind::Read,
        Mode::Write => EntryKind::Write,
        Mode::Permit { .. } => EntryKind::Semaphore,
        Mode::Leadership => EntryKind::Election,
        Mode::Lock(_) => EntryKind::Dlm,
    }
}

/// Why a held lock was lost (the `cause` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Expired = 0,
    Unconfirmed = 1,
    Deleted = 2,
    RuntimeGone = 3,
}

const CAUSES: [&str; 4] = ["expired", "unconfirmed", "deleted", "runtime_gone"];

/// One recipe's handles, under one backend (and one lock name, when names
/// are included).
pub(crate) struct RecipeHandles {
    wait: Histogram,
    hold: Histogram,
    handoff: Histogram,
    grants: Counter,
    timeouts: Counter,
    busy: Counter,
    cancellations: Counter,
    errors: Counter,
    losses: [Counter; 4],
    cleanup_retries: Counter,
    cleanup_failures: Counter,
    held: Gauge,
    waiters: Gauge,
}

impl RecipeHandles {
    fn register(backend: &'static str, recipe: &'static str, name: Option<&str>) -> Self {
        let mut labels = vec![Label::new("backend", backend), Label::new("recipe", recipe)];
        if let Some(name) = name {
            labels.push(Label::new("lock", name.to_owned()));
        }
        let with = |extra: Option<Label>| {
            let mut all = labels.clone();
            all.extend(extra);
            all
        };
        RecipeHandles {
            wait: metrics::histogram!(ACQUIRE_WAIT_SECONDS, with(None)),
            hold: metrics::histogram!(HOLD_SECONDS, with(None)),
            handoff: metrics::histogram!(HANDOFF_SECONDS, with(None)),
            grants: metrics::counter!(GRANTS_TOTAL, with(None)),
            timeouts: metrics::counter!(TIMEOUTS_TOTAL, with(None)),
            busy: metrics::counter!(BUSY_TOTAL, with(None)),
            cancellations: metrics::counter!(CANCELLATIONS_TOTAL, with(None)),
            errors: metrics::counter!(ACQUIRE_ERRORS_TOTAL, with(None)),
            losses: CAUSES.map(|cause| metrics::counter!(LOSSES_TOTAL, with(Some(Label::new("cause", cause))))),
            cleanup_retries: metrics::counter!(CLEANUP_RETRIES_TOTAL, with(None)),
            cleanup_failures: metrics::counter!(CLEANUP_FAILURES_TOTAL, with(None)),
            held: metrics::gauge!(HELD, with(None)),
            waiters: metrics::gauge!(WAITERS, with(None)),
        }
    }
}

/// The session-level handles of one backend.
struct SessionHandles {
    live: Gauge,
    suspended: Gauge,
    opened: Counter,
    closed: Counter,
    lost: Counter,
    dropped: Counter,
}

/// One client's registered handles (kept in its counters).
#[derive(Default)]
pub(crate) struct Registry {
    recipes: [OnceLock<Arc<RecipeHandles>>; 7],
    sessions: OnceLock<SessionHandles>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// The handles for `kind` under `backend`, and `name` when names are
    /// included.
    pub(crate) fn recipe(&self, backend: &'static str, kind: EntryKind, name: &str) -> Arc<RecipeHandles> {
        if LOCK_NAMES.load(Ordering::Relaxed) {
            return Arc::new(RecipeHandles::register(backend, recipe_of(kind).1, Some(name)));
        }
        Arc::clone(self.unnamed(backend, kind))
    }

    /// The handles for `kind` under `backend`, without a lock name.
    fn unnamed(&self, backend: &'static str, kind: EntryKind) -> &Arc<RecipeHandles> {
        let (at, recipe) = recipe_of(kind);
        self.recipes[at].get_or_init(|| Arc::new(RecipeHandles::register(backend, recipe, None)))
    }

    fn sessions(&self, backend: &'static str) -> &SessionHandles {
        self.sessions.get_or_init(|| {
            let state = |state: &'static str| [Label::new("backend", backend), Label::new("state", state)];
            SessionHandles {
                live: metrics::gauge!(SESSIONS, state("live").to_vec()),
                suspended: metrics::gauge!(SESSIONS, state("suspended").to_vec()),
                opened: metrics::counter!(SESSIONS_OPENED_TOTAL, vec![Label::new("backend", backend)]),
                closed: metrics::counter!(SESSIONS_ENDED_TOTAL, state("closed").to_vec()),
                lost: metrics::counter!(SESSIONS_ENDED_TOTAL, state("lost").to_vec()),
                dropped: metrics::counter!(SESSIONS_ENDED_TOTAL, state("dropped").to_vec()),
            }
        })
    }
}

/// A background removal's try failed (it is retried). Never by lock name:
/// a removal knows its entry, not always its lock's name.
pub(crate) fn cleanup_retry(counters: &crate::stats::Counters, backend: &'static str, kind: EntryKind) {
    counters.metrics.unnamed(backend, kind).cleanup_retries.increment(1);
}

/// A background removal failed five times in a row, or was refused.
pub(crate) fn cleanup_failure(counters: &crate::stats::Counters, backend: &'static str, kind: EntryKind) {
    counters.metrics.unnamed(backend, kind).cleanup_failures.increment(1);
}

/// Follows one session's state for the `lockline_sessions` gauge: counts
/// the session in its current state while it is open, and its end once.
pub(crate) struct SessionGauge {
    counters: Arc<crate::stats::Counters>,
    backend: &'static str,
    /// The state counted in the gauge now (`None` once ended).
    current: Option<SessionState>,
    /// The last state counted before the end, for a loss's cause.
    last: SessionState,
}

impl SessionGauge {
    pub(crate) fn opened(counters: Arc<crate::stats::Counters>, backend: &'static str) -> Self {
        counters.metrics.sessions(backend).opened.increment(1);
        SessionGauge {
            counters,
            backend,
            current: None,
            last: SessionState::Live,
        }
    }

    fn gauge(&self, state: SessionState) -> Option<&Gauge> {
        let handles = self.counters.metrics.sessions(self.backend);
        match state {
            SessionState::Live => Some(&handles.live),
            SessionState::Suspended => Some(&handles.suspended),
            _ => None,
        }
    }

    /// The session is now in `state`.
    pub(crate) fn set(&mut self, state: SessionState) {
        if self.current == Some(state) {
            return;
        }
        if let Some(old) = self.current.take() {
            self.last = old;
            if let Some(gauge) = self.gauge(old) {
                gauge.decrement(1.0);
            }
        }
        if state.is_over() {
            self.end(state, false);
            return;
        }
        if let Some(gauge) = self.gauge(state) {
            gauge.increment(1.0);
        }
        self.current = Some(state);
    }

    /// Whether the session ended while it was suspended (a loss's cause).
    pub(crate) fn lost_while_suspended(&self) -> bool {
        self.last == SessionState::Suspended
    }

    /// The session ended: `state`, or dropped without a close.
    pub(crate) fn end(&mut self, state: SessionState, dropped: bool) {
        if let Some(old) = self.current.take() {
            self.last = old;
            if let Some(gauge) = self.gauge(old) {
                gauge.decrement(1.0);
            }
        }
        let handles = self.counters.metrics.sessions(self.backend);
        match state {
            _ if dropped => handles.dropped.increment(1),
            SessionState::Closed => handles.closed.increment(1),
            _ => handles.lost.increment(1),
        }
        self.current = None;
    }
}

impl Drop for SessionGauge {
    fn drop(&mut self) {
        // The following task went away without the end (its runtime shut
        // down): the session can no longer be kept alive.
        if self.current.is_some() {
            self.end(SessionState::Lost, false);
        }
    }
}

/// One acquire, from its call to its end: wait time, the waiters gauge,
/// the handoff, and how it ended. Dropped before it ended: a cancellation.
pub(crate) struct Acquiring {
    handles: Arc<RecipeHandles>,
    started: Instant,
    /// Nanoseconds from `started` to the last wakeup; 0 for none.
    woken: AtomicU64,
    waiting: AtomicBool,
    done: AtomicBool,
}

impl Acquiring {
    pub(crate) fn start(counters: &crate::stats::Counters, backend: &'static str, kind: EntryKind, name: &str) -> Self {
        Acquiring {
            handles: counters.metrics.recipe(backend, kind, name),
            started: Instant::now(),
            woken: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            done: AtomicBool::new(false),
        }
    }

    /// The acquire begins waiting on an earlier entry.
    pub(crate) fn waiting(&self) {
        if !self.waiting.swap(true, Ordering::Relaxed) {
            self.handles.waiters.increment(1.0);
        }
    }

    /// The entry it waited on is gone.
    pub(crate) fn woken(&self) {
        let nanos = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.woken.store(nanos.max(1), Ordering::Relaxed);
    }

    /// A lock-delay holds it back: its grant will be no handoff.
    pub(crate) fn delayed(&self) {
        self.woken.store(0, Ordering::Relaxed);
    }

    fn done(&self) {
        self.done.store(true, Ordering::Relaxed);
        if self.waiting.swap(false, Ordering::Relaxed) {
            self.handles.waiters.decrement(1.0);
        }
    }

    /// Granted.
    pub(crate) fn granted(&self) {
        self.done();
        let waited = self.started.elapsed();
        self.handles.grants.increment(1);
        self.handles.wait.record(waited.as_secs_f64());
        let woken = self.woken.load(Ordering::Relaxed);
        if woken != 0 {
            let since = waited.as_nanos().saturating_sub(u128::from(woken));
            self.handles.handoff.record(since as f64 / 1e9);
        }
    }

    /// A one-try acquire found it taken.
    pub(crate) fn busy(&self) {
        self.done();
        self.handles.busy.increment(1);
    }

    /// It failed with `error`.
    pub(crate) fn failed(&self, error: &Error) {
        self.done();
        match error {
            Error::Timeout { .. } => self.handles.timeouts.increment(1),
            _ => self.handles.errors.increment(1),
        }
    }
}

impl Drop for Acquiring {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Relaxed) {
            self.done();
            self.handles.cancellations.increment(1);
        }
    }
}

const HOLDING: u8 = 0;
const LETTING_GO: u8 = 1;
const ENDED: u8 = 2;

/// One held lock: hold time, the held gauge, and its loss.
pub(crate) struct Holding {
    handles: Arc<RecipeHandles>,
    granted: Instant,
    state: AtomicU8,
}

/// How a hold ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    /// Released, dropped, or its session closed.
    LetGo,
    Lost(Cause),
}

impl Holding {
    pub(crate) fn new(counters: &crate::stats::Counters, backend: &'static str, mode: Mode, name: &str) -> Self {
        let handles = counters.metrics.recipe(backend, kind_of(mode), name);
        handles.held.increment(1.0);
        Holding {
            handles,
            granted: Instant::now(),
            state: AtomicU8::new(HOLDING),
        }
    }

    /// The guard lets go (release or drop): its monitor's end is no loss.
    pub(crate) fn letting_go(&self) {
        let _ = self
            .state
            .compare_exchange(HOLDING, LETTING_GO, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The hold ended, as `end` says; only its first end counts.
    pub(crate) fn end(&self, end: End) {
        if self.state.swap(ENDED, Ordering::Relaxed) == ENDED {
            return;
        }
        self.handles.held.decrement(1.0);
        self.handles.hold.record(self.granted.elapsed().as_secs_f64());
        if let End::Lost(cause) = end {
            self.handles.losses[cause as usize].increment(1);
        }
    }

    /// Ends the hold as a release ends (see [`Ending::done`]); dropped
    /// first, as let go.
    pub(crate) fn ending(&self) -> Ending<'_> {
        Ending(self)
    }

    /// The monitor is gone: unless the guard let go, its runtime shut down.
    pub(crate) fn monitor_gone(&self) {
        if self.state.load(Ordering::Relaxed) == HOLDING {
            self.end(End::Lost(Cause::RuntimeGone));
        }
    }
}

/// A release in progress (see [`Holding::ending`]).
pub(crate) struct Ending<'a>(&'a Holding);

impl Ending<'_> {
    /// The release ended with `result`: an error saying the lock had been
    /// lost counts the loss (`cause` tells a lost session's).
    pub(crate) fn done(self, result: &crate::Result<()>, cause: impl FnOnce() -> Cause) {
        self.0.end(match result {
            Err(Error::LockLost { .. }) => End::Lost(Cause::Deleted),
            Err(Error::SessionLost { .. }) => End::Lost(cause()),
            _ => End::LetGo,
        });
    }
}

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        self.0.end(End::LetGo);
    }
}
