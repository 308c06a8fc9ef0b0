//! Sessions: a liveness scope on the server, the background removal of
//! what guards and acquires leave behind, and what every recipe asks of a
//! session (names checked, calls bounded, errors told apart).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::stats::Counters;

use crate::{
    name, Backend, BackendSession, Contender, Entry, EntryKind, Error, FencingToken, LockMode, Result, SessionOptions,
    SessionState,
};

/// After this many failed tries a background removal is logged as a warning
/// (and counted in [`ClientStats::cleanup_failures`](crate::ClientStats)); it
/// goes on trying until the entry is gone or the session is over.
const CLEANUP_WARN_AFTER: u32 = 5;

/// The first pause between tries of a background removal, and its cap.
const CLEANUP_BACKOFF: Duration = Duration::from_millis(50);
const CLEANUP_MAX_BACKOFF: Duration = Duration::from_secs(2);

/// An entry (or an interrupted append's entry) that this session is removing
/// in the background. A contender of the same session that finds one in its
/// way removes it itself rather than wait for it (DESIGN §6.13).
#[derive(Debug, Clone)]
pub(crate) struct Orphan {
    id: u64,
    entry: Option<Entry>,
    dir: String,
    kind: EntryKind,
    attempt: Option<String>,
    /// The value block a lock-mode PW or EX holder leaves with its entry.
    leaving: Option<Vec<u8>>,
}

impl Orphan {
    /// Whether `entry` is (or was made by) this orphan.
    fn is(&self, entry: &Entry) -> bool {
        self.entry
            .as_ref()
            .is_some_and(|mine| mine.key == entry.key && mine.order == entry.order)
            || self
                .attempt
                .as_deref()
                .is_some_and(|attempt| entry.key.contains(attempt))
    }
}

/// Same-session FIFO queues by (name, kind); weak, so idle ones go away.
#[derive(Default)]
struct LocalQueues {
    queues: HashMap<(String, EntryKind), Weak<tokio::sync::Mutex<()>>>,
    /// How many queues the map may hold before idle ones are dropped again:
    /// twice those left by the last pruning, so that pruning costs O(1) per
    /// call, amortised (pruning on every call was O(names), which made a
    /// session taking many locks quadratic).
    prune_at: usize,
}

/// Where a session stands given its backend's state and whether it was closed.
fn state_of(remote: SessionState, closed: bool) -> SessionState {
    // A session lost before it was closed stays lost: its locks may have
    // been held by others since, and `close()` cannot undo that.
    if remote == SessionState::Lost {
        return remote;
    }
    if closed {
        return SessionState::Closed;
    }
    remote
}

/// A session's end, once known, for the waits that only need to learn of
/// it: every held lock's monitor. One task per session follows the state
/// and sets it; each monitor keeps one small wait on it instead of following
/// the state itself, which would also wake every monitor at each change
/// short of the end (`Suspended` and back).
#[derive(Default)]
pub(crate) struct EndSignal {
    cell: std::sync::Mutex<EndCell>,
    /// Notified (to every waiter) when the cell changes.
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default, Clone, Copy)]
struct EndCell {
    /// How the session ended, once it has.
    ended: Option<SessionState>,
    /// The following task is gone without having seen the end.
    unfollowed: bool,
    /// The session was lost while `Suspended` (for a loss's metrics cause).
    unconfirmed: bool,
}

impl EndSignal {
    fn cell(&self) -> std::sync::MutexGuard<'_, EndCell> {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, change: impl FnOnce(&mut EndCell)) {
        change(&mut self.cell());
        self.changed.notify_waiters();
    }
}

/// The end signal, as the task that follows the session holds it: marks it
/// unfollowed when the task is dropped before the end. The task's future
/// owns it from its creation, so a task dropped before it was ever polled
/// (its runtime shut down at once) marks it too.
struct Following(Arc<EndSignal>);

impl Drop for Following {
    fn drop(&mut self) {
        self.0.update(|cell| cell.unfollowed = cell.ended.is_none());
    }
}

/// Sets `end` once the session is over, as [`SessionInner::over`] sees it.
/// Also keeps the session's place in the sessions-by-state gauge.
async fn follow_end(
    mut remote: watch::Receiver<SessionState>,
    mut closed: watch::Receiver<bool>,
    end: Following,
    mut gauge: crate::observe::SessionGauge,
) {
    let end = &end.0;
    loop {
        let state = state_of(*remote.borrow_and_update(), *closed.borrow_and_update());
        gauge.set(state);
        if state.is_over() {
            let unconfirmed = state == SessionState::Lost && gauge.lost_while_suspended();
            end.update(|cell| {
                cell.ended.get_or_insert(state);
                cell.unconfirmed = unconfirmed;
            });
            return;
        }
        tokio::select! {
            changed = remote.changed() => {
                if changed.is_err() {
                    // As `over`: a backend that dropped its state sender can
                    // no longer confirm the session.
                    gauge.set(SessionState::Lost);
                    end.update(|cell| {
                        cell.ended.get_or_insert(SessionState::Lost);
                    });
                    return;
                }
            }
            changed = closed.changed() => {
                if changed.is_err() {
                    // The session itself is gone: nothing waits on its end.
                    gauge.end(state, true);
                    return;
                }
            }
        }
    }
}

/// A liveness scope on the server: an etcd lease kept alive by this process, or
/// a ZooKeeper session.
///
/// Everything a session creates is ephemeral: if the process dies, the server
/// deletes it once the TTL passes. One session serves any number of locks.
/// Cheap to clone; clones are the same session.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// use lockline::{Client, SessionState};
///
/// let session = Client::memory().session().await?;
/// assert_eq!(session.state(), SessionState::Live);
/// let _held = session.mutex("a")?.lock().await?;
/// session.close().await?; // releases everything the session held
/// assert_eq!(session.state(), SessionState::Closed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<SessionInner>,
}

pub(crate) struct SessionInner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) remote: Arc<dyn BackendSession>,
    pub(crate) options: SessionOptions,
    pub(crate) counters: Arc<Counters>,
    runtime: Handle,
    closed: AtomicBool,
    closed_tx: watch::Sender<bool>,
    /// The session's end, set by one task per session (see [`EndSignal`]).
    end: Arc<EndSignal>,
    background: watch::Sender<usize>,
    local_queues: std::sync::Mutex<LocalQueues>,
    orphans: std::sync::Mutex<Vec<Orphan>>,
    next_orphan: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id())
            .field("backend", &self.inner.backend.name())
            .field("state", &self.state())
            .finish()
    }
}

impl Session {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        remote: Arc<dyn BackendSession>,
        options: SessionOptions,
        counters: Arc<Counters>,
    ) -> Self {
        let runtime = Handle::current();
        let closed_tx = watch::Sender::new(false);
        let end = Arc::new(EndSignal::default());
        // Holds only receivers: it keeps neither the session nor its backend
        // session alive, and ends with the session.
        let gauge = crate::observe::SessionGauge::opened(Arc::clone(&counters), backend.name());
        runtime.spawn(follow_end(
            remote.state(),
            closed_tx.subscribe(),
            Following(Arc::clone(&end)),
            gauge,
        ));
        Session {
            inner: Arc::new(SessionInner {
                backend,
                remote,
                options,
                counters,
                runtime,
                closed: AtomicBool::new(false),
                closed_tx,
                end,
                background: watch::Sender::new(0),
                local_queues: std::sync::Mutex::default(),
                orphans: std::sync::Mutex::default(),
                next_orphan: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// The session's id: the etcd lease id in lowercase hex, the ZooKeeper
    /// session id in hex, a counter on the memory backend.
    pub fn id(&self) -> &str {
        self.inner.remote.id()
    }

    /// The options the session was opened with.
    pub fn options(&self) -> &SessionOptions {
        &self.inner.options
    }

    /// Where the session stands now.
    pub fn state(&self) -> SessionState {
        self.inner.state()
    }

    /// Every state the session moves through, as a `watch` receiver (closed
    /// sessions report `Closed` through [`state`](Self::state), not here).
    /// Use it to notice `Suspended` (connection trouble, locks maybe still
    /// held) before `Lost`.
    pub fn watch_state(&self) -> watch::Receiver<SessionState> {
        self.inner.remote.state()
    }

    /// Resolves when the session is over: `Lost` (expired, revoked, or not
    /// confirmed past the loss deadline) or `Closed`. Returns that state.
    ///
    /// Every lock the session held must then be assumed held by others.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes the state.
    pub async fn lost(&self) -> SessionState {
        self.inner.over().await
    }

    /// Every contender queued under `name`, whatever the recipe, from every
    /// client (etcdctl, Go's `concurrency`, Curator, kazoo), in queue order:
    /// holders first. One read; nothing is written.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockline::Result<()> {
    /// let session = lockline::Client::memory().session().await?;
    /// let _guard = session.mutex("jobs/nightly")?.lock().await?;
    /// let queue = session.queue("jobs/nightly").await?;
    /// assert_eq!(queue.len(), 1);
    /// assert_eq!(queue[0].token, _guard.token());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// As [`mutex`](Self::mutex), and [`Error::Unavailable`] or a backend
    /// error when the read fails.
    pub async fn queue(&self, name: &str) -> Result<Vec<Contender>> {
        self.inner.check_name(name)?;
        self.inner.contenders(name).await
    }

    /// Whether `sequencer` is current, as [`Client::check`](crate::Client::check)
    /// answers, read through this session: for a caller that opens a session
    /// for the check and closes it after (the `lockline check` command), where
    /// `Client::check` keeps one open for the next check. One read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// As [`queue`](Self::queue).
    pub async fn check(&self, sequencer: &crate::Sequencer) -> Result<bool> {
        if let crate::Mode::Lock(mode) = sequencer.mode() {
            return current(self, sequencer.name(), mode, sequencer.token()).await;
        }
        let entries = self.queue(sequencer.name()).await?;
        Ok(crate::wait::current(&entries, sequencer))
    }

    /// The value of `key` in the lock's own store (an etcd key, an absolute
    /// ZooKeeper path), or `None` when it does not exist: one plain read, to
    /// see what [`write_if_held`](crate::MutexGuard::write_if_held) wrote.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockline::Result<()> {
    /// let session = lockline::Client::memory().session().await?;
    /// assert_eq!(session.read("config/epoch").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a key the backend cannot store,
    /// [`Error::Closed`] or [`Error::SessionLost`] when the session is over,
    /// [`Error::Unavailable`] or a backend error when the read fails.
    pub async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.check_key(key)?;
        self.inner.check_usable()?;
        match self.inner.call(self.inner.remote.read(key)).await {
            Ok(value) => Ok(value),
            Err(error) => Err(self.inner.label(error)),
        }
    }

    /// Waits until every background release and cleanup this session started
    /// (guards dropped without `release()`, cancelled acquires) has finished.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes; the background work goes on.
    pub async fn flush(&self) {
        let mut rx = self.inner.background.subscribe();
        // The sender lives in `inner`, which `self` keeps alive: no error here.
        let _ = rx.wait_for(|pending| *pending == 0).await;
    }

    /// Closes the session on the server (revokes the lease, closes the ZooKeeper
    /// session): every lock it held is released at once and every call on it
    /// afterwards fails with [`Error::Closed`]. Closing twice is fine.
    ///
    /// Returns once the server has confirmed the close (etcd answered the
    /// revoke; ZooKeeper answered `CloseSession`; Redis deleted the session's
    /// entries and key), so a process may exit right after it without
    /// leaving its locks held until the TTL runs out. A confirmation that
    /// does not come within the request timeout is an
    /// [`Error::Unavailable`]; calling `close` again asks the server again
    /// (a lost or already closed session included), so `Ok` always means the
    /// server has confirmed.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the session is marked closed locally and the server ends it
    /// when its TTL passes.
    ///
    /// # Errors
    ///
    /// A backend error when the server could not be told; the session is closed
    /// locally all the same.
    pub async fn close(&self) -> Result<()> {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.closed_tx.send_replace(true);
        // Told here, not one task later: a held lock's monitor lets go of
        // the backend's watch at once (on ZooKeeper, a request in flight
        // there keeps the session open until it is dropped).
        let state = self.inner.state();
        self.inner.end.update(|cell| {
            cell.ended.get_or_insert(state);
        });
        let timeout = self.inner.options.request_timeout();
        match tokio::time::timeout(timeout, self.inner.remote.close()).await {
            Ok(result) => result,
            Err(_) => Err(Error::unavailable(
                self.inner.backend.name(),
                format!(
                    "the server did not confirm the close of session {} within {timeout:?}; \
                     what it held is released when its TTL runs out",
                    self.id()
                ),
            )),
        }
    }

    /// The backend session underneath, for backend-specific inspection.
    pub fn backend_session(&self) -> &Arc<dyn BackendSession> {
        &self.inner.remote
    }
}

/// Whether the holder of a `lock-MODE` sequencer with `token` still holds
/// `name` in that mode: its entry is granted in it with that token.
async fn current(session: &Session, name: &str, mode: LockMode, token: FencingToken) -> Result<bool> {
    let inner = &session.inner;
    inner.check_usable()?;
    let queue = inner.call(inner.remote.read_queue(name)).await?;
    Ok(queue.slots.iter().any(|slot| {
        let state = crate::mode_rule::State::decode(&slot.value, slot.changed);
        slot.entry.kind == EntryKind::Dlm && state.granted == Some(mode) && state.token == token.get()
    }))
}

impl SessionInner {
    pub(crate) fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    pub(crate) fn state(&self) -> SessionState {
        let remote = *self.remote.state().borrow();
        let state = state_of(remote, self.closed.load(Ordering::SeqCst));
        if !state.is_over() && self.end.cell().unfollowed {
            // The runtime the session was opened on has shut down: the tasks
            // that kept it alive and followed it are gone, so nothing confirms
            // it any more and the server will end it.
            return SessionState::Lost;
        }
        state
    }

    /// Why the session was lost, for the losses counter: after its end,
    /// `Unconfirmed` when it ended while `Suspended`, `RuntimeGone` when
    /// the task following it went away, else `Expired`.
    pub(crate) fn loss_cause(&self) -> crate::observe::Cause {
        let cell = *self.end.cell();
        if cell.unfollowed {
            crate::observe::Cause::RuntimeGone
        } else if cell.unconfirmed {
            crate::observe::Cause::Unconfirmed
        } else {
            crate::observe::Cause::Expired
        }
    }

    /// Resolves when the session is over, as [`over`](Self::over) does, but
    /// through the session's one [`EndSignal`]: a small wait that no state
    /// change short of the end wakes. For the waits every held lock keeps.
    pub(crate) async fn ended(&self) -> SessionState {
        loop {
            let changed = self.end.changed.notified();
            tokio::pin!(changed);
            // Registered before looking, so a change in between is not missed.
            changed.as_mut().enable();
            let cell = *self.end.cell();
            if let Some(state) = cell.ended {
                return state;
            }
            if cell.unfollowed {
                // The task that follows the state is gone (its runtime shut
                // down): follow it here.
                return self.over_boxed().await;
            }
            changed.await;
        }
    }

    /// [`over`](Self::over), boxed by a plain function so that the waits
    /// that fall back on it keep no room for it until they do.
    fn over_boxed(&self) -> std::pin::Pin<Box<dyn Future<Output = SessionState> + Send + '_>> {
        Box::pin(self.over())
    }

    pub(crate) async fn over(&self) -> SessionState {
        let mut remote = self.remote.state();
        let mut closed = self.closed_tx.subscribe();
        loop {
            // The end signal's task going away (its runtime shut down) is a
            // change of state too.
            let unfollowed = self.end.changed.notified();
            tokio::pin!(unfollowed);
            unfollowed.as_mut().enable();
            let state = self.state();
            if state.is_over() {
                return state;
            }
            tokio::select! {
                () = &mut unfollowed => {}
                changed = remote.changed() => {
                    if changed.is_err() {
                        // The backend dropped its state sender: it can no longer
                        // confirm the session, so it must be taken as lost.
                        return SessionState::Lost;
                    }
                }
                _ = closed.changed() => {}
            }
        }
    }

    /// The error a call on an over session gets.
    pub(crate) fn over_error(&self, state: SessionState) -> Error {
        let session = self.remote.id().to_owned();
        match state {
            SessionState::Closed => Error::Closed { session },
            _ => Error::SessionLost { session },
        }
    }

    /// The error for an entry of ours that vanished: the session's loss if the
    /// server confirms it, otherwise someone else deleted the entry.
    pub(crate) async fn vanished_error(&self, key: &str) -> Error {
        let state = match self.call(self.remote.confirm()).await {
            Ok(state) => state,
            Err(_) => self.state(),
        };
        let state = if self.closed.load(Ordering::SeqCst) {
            SessionState::Closed
        } else {
            state
        };
        if state.is_over() {
            self.over_error(state)
        } else {
            Error::LockLost { key: key.to_owned() }
        }
    }

    /// Every entry under `name`, for the recipes' `contenders()`.
    pub(crate) async fn contenders(&self, name: &str) -> Result<Vec<Contender>> {
        self.check_usable()?;
        let entries = self.call(self.remote.list(name)).await?;
        let mut contenders = Vec::with_capacity(entries.len());
        for (place, entry) in entries.into_iter().enumerate() {
            // A contender in lock-delay marks its own entry; only the first
            // few of a queue can be next in line.
            let delayed_until = if place < 4 && entry.kind != crate::EntryKind::Election {
                match self.call(self.remote.get_value(&entry)).await {
                    Ok(Some(value)) => crate::contender::delayed_until(&value),
                    _ => None,
                }
            } else {
                None
            };
            let mut contender = Contender::from(entry);
            contender.delayed_until = delayed_until;
            contenders.push(contender);
        }
        Ok(contenders)
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        let state = self.state();
        if state.is_over() {
            return Err(self.over_error(state));
        }
        Ok(())
    }

    /// Checks a key of a fenced write or a read.
    pub(crate) fn check_key(&self, key: &str) -> Result<()> {
        crate::write::validate_key(key)?;
        self.backend.validate_key(key)
    }

    /// Checks a key a fenced write creates or deletes.
    pub(crate) fn check_write_key(&self, key: &str) -> Result<()> {
        self.check_key(key)?;
        self.backend.validate_write_key(key)
    }

    /// Names the backend in an [`Error::Unsupported`] from a backend
    /// session's default method, which cannot know it.
    pub(crate) fn label(&self, error: Error) -> Error {
        match error {
            Error::Unsupported { operation, .. } => Error::Unsupported {
                backend: self.backend_name(),
                operation,
            },
            other => other,
        }
    }

    pub(crate) fn check_name(&self, name: &str) -> Result<()> {
        name::validate(name)?;
        self.backend.validate_name(name)
    }

    /// The in-process FIFO queue that same-session contenders for one name pass
    /// through before the session's entry is written (DESIGN §5).
    pub(crate) fn local_queue(&self, name: &str, kind: EntryKind) -> Arc<tokio::sync::Mutex<()>> {
        let mut local = self.local_queues.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (name.to_owned(), kind);
        if let Some(queue) = local.queues.get(&key).and_then(Weak::upgrade) {
            return queue;
        }
        let queue = Arc::new(tokio::sync::Mutex::new(()));
        if local.queues.len() >= local.prune_at {
            local.queues.retain(|_, weak| weak.strong_count() > 0);
            local.prune_at = (local.queues.len() * 2).max(16);
        }
        local.queues.insert(key, Arc::downgrade(&queue));
        queue
    }

    /// Runs `work` in the background on the session's runtime, counted for
    /// [`Session::flush`]. Works from `Drop`, outside the runtime.
    pub(crate) fn spawn_background<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        struct Pending(watch::Sender<usize>);
        impl Drop for Pending {
            fn drop(&mut self) {
                self.0.send_modify(|n| *n = n.saturating_sub(1));
            }
        }
        self.background.send_modify(|n| *n += 1);
        let pending = Pending(self.background.clone());
        self.runtime.spawn(async move {
            let _pending = pending;
            work.await;
        });
    }

    /// Removes an entry in the background, fenced, each try bounded by the
    /// request timeout, retried with capped backoff until the entry is gone or
    /// the session is over (the server then deletes it); failures are logged,
    /// never swallowed silently.
    pub(crate) fn spawn_remove(
        self: &Arc<Self>,
        entry: Entry,
        why: &'static str,
        then: Option<tokio::sync::OwnedMutexGuard<()>>,
    ) {
        self.spawn_remove_in(String::new(), entry, why, then, None);
    }

    /// [`spawn_remove`](Self::spawn_remove) of an entry of the queue `dir`
    /// (a lock-mode request leaves as a release does: see `clean`).
    pub(crate) fn spawn_remove_in(
        self: &Arc<Self>,
        dir: String,
        entry: Entry,
        why: &'static str,
        then: Option<tokio::sync::OwnedMutexGuard<()>>,
        leaving: Option<Vec<u8>>,
    ) {
        let orphan = self.adopt(Orphan {
            id: 0,
            dir,
            kind: entry.kind,
            entry: Some(entry),
            attempt: None,
            leaving,
        });
        let session = Arc::clone(self);
        self.spawn_background(async move {
            let removed = session.retry(why, &orphan).await;
            if removed {
                if why == "release" {
                    session.counters.bump(|c| &c.releases);
                } else {
                    session.counters.bump(|c| &c.cleanups);
                }
            }
            session.disown(orphan.id);
            drop(then);
        });
    }

    /// Removes whatever an interrupted acquire created, in the background:
    /// its entry if it is known, and every entry its append may have made
    /// (DESIGN §6.10).
    pub(crate) fn spawn_abandon(
        self: &Arc<Self>,
        dir: String,
        kind: EntryKind,
        attempt: String,
        entry: Option<Entry>,
        then: Option<tokio::sync::OwnedMutexGuard<()>>,
        leaving: Option<Vec<u8>>,
    ) {
        let orphan = self.adopt(Orphan {
            id: 0,
            entry,
            dir,
            kind,
            attempt: Some(attempt),
            leaving,
        });
        let session = Arc::clone(self);
        self.spawn_background(async move {
            if session.retry("cancelled acquire", &orphan).await {
                session.counters.bump(|c| &c.cleanups);
            }
            session.disown(orphan.id);
            drop(then);
        });
    }

    fn adopt(&self, mut orphan: Orphan) -> Orphan {
        orphan.id = self.next_orphan.fetch_add(1, Ordering::Relaxed);
        self.orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(orphan.clone());
        orphan
    }

    fn disown(&self, id: u64) {
        self.orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|o| o.id != id);
    }

    /// The background removal `entry` belongs to, if it is one of this
    /// session's own leftovers.
    pub(crate) fn orphan(&self, entry: &Entry) -> Option<Orphan> {
        self.orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|o| o.is(entry))
            .cloned()
    }

    /// One try at removing an orphan: its known entry (fenced), then anything
    /// else its attempt created.
    pub(crate) async fn clean(&self, orphan: &Orphan) -> Result<()> {
        match &orphan.entry {
            // A lock-mode request leaves as a release does: a release may
            // have handed it the lock before it gave up.
            Some(entry) if entry.kind == EntryKind::Dlm && !orphan.dir.is_empty() => {
                crate::mode_rule::hand_over(
                    &*self.remote,
                    &self.counters,
                    &orphan.dir,
                    entry,
                    orphan.leaving.as_deref(),
                    None,
                )
                .await?;
            }
            Some(entry) => {
                self.remote.remove(entry).await?;
            }
            None => {}
        }
        if let Some(attempt) = &orphan.attempt {
            self.remote.abandon(&orphan.dir, orphan.kind, attempt).await?;
        }
        Ok(())
    }

    /// Tries [`clean`](Self::clean) until it succeeds (`true`) or the session
    /// is over (`false`: the server deletes an over session's entries itself).
    async fn retry(&self, why: &'static str, orphan: &Orphan) -> bool {
        let key = orphan
            .entry
            .as_ref()
            .map_or(orphan.dir.as_str(), |entry| entry.key.as_str());
        let timeout = self.options.request_timeout();
        let mut backoff = CLEANUP_BACKOFF;
        let mut failures = 0u32;
        loop {
            let tried = async {
                match tokio::time::timeout(timeout, self.clean(orphan)).await {
                    Ok(result) => result,
                    Err(_) => Err(Error::unavailable(
                        self.backend_name(),
                        format!("no answer within the request timeout of {timeout:?}"),
                    )),
                }
            };
            let outcome = tokio::select! {
                biased;
                state = self.over() => {
                    tracing::debug!(key, why, ?state, "session over; the server removes its entries");
                    return false;
                }
                outcome = tried => outcome,
            };
            let error = match outcome {
                Ok(()) => return true,
                Err(error) => error,
            };
            if error.is_refusal() {
                // Retrying cannot help: the server refuses this identity the
                // removal (rights revoked while it held or waited). An entry
                // left in a queue would block every contender behind it for
                // as long as the session lives, so the session ends, and the
                // server deletes its entries as it does for any ended session.
                self.counters.bump(|c| &c.cleanup_failures);
                crate::observe::cleanup_failure(&self.counters, self.backend_name(), orphan.kind);
                tracing::warn!(
                    key,
                    why,
                    %error,
                    "the server refuses to remove a lock entry; ending the session so that the server removes it"
                );
                self.remote
                    .give_up("the server refused to remove one of its entries, which would block the lock's queue");
                return false;
            }
            failures += 1;
            crate::observe::cleanup_retry(&self.counters, self.backend_name(), orphan.kind);
            if failures == CLEANUP_WARN_AFTER {
                self.counters.bump(|c| &c.cleanup_failures);
                crate::observe::cleanup_failure(&self.counters, self.backend_name(), orphan.kind);
                tracing::warn!(
                    key,
                    why,
                    %error,
                    failures,
                    "still cannot remove a lock entry; retrying until the session ends"
                );
            } else {
                tracing::debug!(key, why, failures, %error, "background removal failed; retrying");
            }
            tokio::select! {
                biased;
                _ = self.over() => return false,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(CLEANUP_MAX_BACKOFF);
        }
    }
}

impl SessionInner {
    /// Bounds one server call by the request timeout.
    pub(crate) async fn call<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let timeout = self.options.request_timeout();
        match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(Error::unavailable(
                self.backend_name(),
                format!("no answer within the request timeout of {timeout:?}"),
            )),
        }
    }
}
