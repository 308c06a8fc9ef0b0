//! What every held lock, permit and leadership has in common.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::task::AbortHandle;

use crate::backend::EntryKind;
use crate::sequencer::{Mode, Sequencer};
use crate::session::SessionInner;
use crate::{Entry, Error, FencingToken, Result, Session, SessionState, Write};

/// A watch that resolves once one entry is gone, owning what it needs.
pub(crate) type EntryWatch = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// Opens a watch on `entry` through the session's backend.
pub(crate) fn watch_entry(inner: &Arc<SessionInner>, entry: &Entry) -> EntryWatch {
    let remote = Arc::clone(&inner.remote);
    let entry = entry.clone();
    Box::pin(async move { remote.wait_gone(&entry).await })
}

/// The first pause before re-watching a held entry after its watch failed,
/// and its cap (the pause doubles on each failure in a row).
const REWATCH_BACKOFF: Duration = Duration::from_millis(100);

/// The first pause before trying a release again after a transient failure.
const RELEASE_RETRY_PAUSE: Duration = Duration::from_millis(20);
const REWATCH_MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Why a held entry may no longer be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    Session(SessionState),
    EntryDeleted,
    /// The entry is gone; whether the session ended too is being asked.
    Vanished,
}

/// A held entry: the shared body of every guard.
///
/// A monitor task watches the session and the entry; whichever ends first marks
/// the hold lost. Dropped without `release`, it releases in the background.
///
/// One session may hold very many of these (DESIGN §8: bounded memory per
/// lock), so what each keeps is small: the entry is shared with the monitor,
/// not copied; the monitor's and the guard's common state is one allocation;
/// and the monitor's rare steps are boxed when they happen, so that the task
/// every hold keeps stays small while it waits.
pub(crate) struct Hold {
    session: Session,
    entry: Arc<Entry>,
    shared: Arc<HoldShared>,
    monitor: AbortHandle,
    released: bool,
    /// The lock's name and the mode it is held in, for its sequencer.
    name: Box<str>,
    mode: Mode,
    /// When the append that made the entry was tried more than once: its
    /// directory, kind and attempt. An earlier try may still be on its way
    /// to the server, and could make the entry again after the release:
    /// letting go fences the whole attempt, as a cancelled acquire does
    /// (DESIGN §6.10).
    retried: Option<(String, EntryKind, String)>,
    /// A lock-mode resource's value block, written by the release together
    /// with the entry's removal (a PW or EX holder's release).
    release_block: Option<Vec<u8>>,
    /// A lock-mode holder's view of its queue when it was granted (the read
    /// as decoded, with the block its grant left): its release hands over
    /// from it without reading again (see `mode_rule::hand_over`). Boxed: a
    /// held lock that has none keeps a pointer, not a view.
    release_view: Option<Box<crate::mode_rule::View>>,
}

/// What a hold and its monitor task share.
struct HoldShared {
    cell: std::sync::Mutex<HoldCell>,
    /// Notified (to every waiter) whenever `cell.loss` or `cell.monitor_gone` changes.
    changed: Notify,
    /// The hold's metrics (nothing without the `metrics` feature).
    metrics: crate::observe::Holding,
}

struct HoldCell {
    /// Why it may no longer be held, once known.
    loss: Option<Loss>,
    /// The monitor task has ended, or was dropped without ending (the
    /// runtime is shutting down): no further loss will be reported.
    monitor_gone: bool,
    /// The same-session queue permit: it lets go once the entry is gone
    /// (released, or lost), never before.
    local: Option<OwnedMutexGuard<()>>,
}

impl HoldShared {
    fn cell(&self) -> std::sync::MutexGuard<'_, HoldCell> {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn loss(&self) -> Option<Loss> {
        self.cell().loss
    }

    fn set_loss(&self, loss: Loss) {
        self.cell().loss = Some(loss);
        self.changed.notify_waiters();
    }

    fn take_permit(&self) -> Option<OwnedMutexGuard<()>> {
        self.cell().local.take()
    }
}

/// Marks the monitor gone when its task ends or is dropped. The task's
/// future owns it from its creation, so a task dropped before it was ever
/// polled (its runtime shut down at once) marks it too.
struct MonitorGone(Arc<HoldShared>);

impl Drop for MonitorGone {
    fn drop(&mut self) {
        self.0.metrics.monitor_gone();
        self.0.cell().monitor_gone = true;
        self.0.changed.notify_waiters();
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("key", &self.entry.key)
            .field("token", &self.entry.token)
            .field("held", &self.is_held())
            .finish()
    }
}

/// Watches the session and the entry until either ends the hold; then
/// reports the loss and lets the same-session queue go on.
///
/// Its task lives as long as the hold, so its state is kept small: nothing
/// but the two waits is kept across them, and the rare steps are boxed.
async fn monitor(inner: Arc<SessionInner>, entry: Arc<Entry>, gone: MonitorGone, watch: Option<EntryWatch>) {
    let shared = &gone.0;
    // The backend's watch borrows the entry the task owns: no copy of it.
    let mut watch: Pin<Box<dyn Future<Output = Result<()>> + Send + '_>> = match watch {
        Some(watch) => watch,
        None => inner.remote.wait_gone(&entry),
    };
    let mut backoff = REWATCH_BACKOFF;
    // One wait for the session's end over the whole hold, polled before the
    // entry's watch each time (as a `biased` select! would).
    let mut ended = std::pin::pin!(inner.ended());
    let mut loss = loop {
        let watched = std::future::poll_fn(|cx| match ended.as_mut().poll(cx) {
            Poll::Ready(state) => Poll::Ready(Err(state)),
            Poll::Pending => watch.as_mut().poll(cx).map(Ok),
        });
        // The end signal is set by another task: a session the backend
        // already reports over is taken as over here too, as the entry's
        // end is likely its doing (a Redis session's loss wakes its holds;
        // a closed ZooKeeper session fails their watches).
        let failed = match (watched.await, inner.state()) {
            (Err(state), _) => break Loss::Session(state),
            (Ok(_), state) if state.is_over() => break Loss::Session(state),
            (Ok(Ok(())), _) => break Loss::Vanished,
            (Ok(Err(error)), _) => error,
        };
        // A failed watch is not a loss; the session's own liveness tracking
        // decides that. Watch again shortly, backing off (capped) so a
        // server that is down is not hammered; the session ending stops the
        // wait.
        tracing::debug!(key = %entry.key, error = %failed, ?backoff, "watch on a held entry failed; re-watching");
        drop(failed);
        let mut pause = pause(backoff);
        let paused = std::future::poll_fn(|cx| match ended.as_mut().poll(cx) {
            Poll::Ready(state) => Poll::Ready(Some(state)),
            Poll::Pending => pause.as_mut().poll(cx).map(|()| None),
        });
        if let Some(state) = paused.await {
            break Loss::Session(state);
        }
        backoff = (backoff * 2).min(REWATCH_MAX_BACKOFF);
        inner.counters.bump(|c| &c.rewatches);
        watch = inner.remote.wait_gone(&entry);
    };
    if loss == Loss::Vanished {
        // Lost now, whatever the reason: stop the holder's work at once,
        // then find out why.
        shared.set_loss(loss);
        loss = vanished(&inner, &entry.key).await;
    }
    tracing::debug!(key = %entry.key, session = inner.remote.id(), token = entry.token.get(), ?loss, "lock lost");
    shared.metrics.end(match loss {
        Loss::Session(SessionState::Lost) => crate::observe::End::Lost(inner.loss_cause()),
        Loss::Session(_) => crate::observe::End::LetGo,
        Loss::EntryDeleted | Loss::Vanished => crate::observe::End::Lost(crate::observe::Cause::Deleted),
    });
    shared.set_loss(loss);
    // The entry is gone: a same-session contender may queue again.
    drop(shared.take_permit());
}

// The monitor's rare steps, boxed by plain functions: a future built inside
// the monitor's own body would take room in every held lock's task, even
// boxed, for as long as the lock is held.

/// Why a held entry vanished: deleted by someone else, or its session ended.
fn vanished<'a>(inner: &'a SessionInner, key: &'a str) -> Pin<Box<dyn Future<Output = Loss> + Send + 'a>> {
    Box::pin(async move {
        match inner.vanished_error(key).await {
            Error::LockLost { .. } => Loss::EntryDeleted,
            _ => Loss::Session(inner.state()),
        }
    })
}

/// The pause before re-watching a held entry.
fn pause(backoff: Duration) -> Pin<Box<tokio::time::Sleep>> {
    Box::pin(tokio::time::sleep(backoff))
}

impl Hold {
    /// `watch` is the watch on `entry` the acquire already had open while
    /// queued, if any: the monitor carries it on instead of opening another.
    pub(crate) fn new(
        session: Session,
        entry: Entry,
        local: Option<OwnedMutexGuard<()>>,
        watch: Option<EntryWatch>,
        name: &str,
        mode: Mode,
        retried: Option<(String, EntryKind, String)>,
    ) -> Self {
        let entry = Arc::new(entry);
        let shared = Arc::new(HoldShared {
            cell: std::sync::Mutex::new(HoldCell {
                loss: None,
                monitor_gone: false,
                local,
            }),
            changed: Notify::new(),
            metrics: crate::observe::Holding::new(&session.inner.counters, session.inner.backend_name(), mode, name),
        });
        let monitor = tokio::spawn(monitor(
            session.inner.clone(),
            Arc::clone(&entry),
            MonitorGone(Arc::clone(&shared)),
            watch,
        ))
        .abort_handle();
        Hold {
            session,
            entry,
            shared,
            monitor,
            released: false,
            name: name.into(),
            mode,
            retried,
            release_block: None,
            release_view: None,
        }
    }

    /// Makes the release write `block` as the lock-mode resource's value
    /// block, atomically with the entry's removal.
    pub(crate) fn set_release_block(&mut self, block: Option<Vec<u8>>) {
        self.release_block = block;
    }

    /// Lets the release hand over from `view`, the queue as the grant read
    /// it (`None`: it reads the queue again).
    pub(crate) fn set_release_view(&mut self, view: Option<crate::mode_rule::View>) {
        self.release_view = view.map(Box::new);
    }

    /// Removes the entry once (fenced), writing the release's value block
    /// with it if there is one.
    async fn remove_entry(&self) -> Result<bool> {
        if self.entry.kind == EntryKind::Dlm {
            return crate::mode_rule::hand_over(
                &*self.session.inner.remote,
                &self.session.inner.counters,
                &self.name,
                &self.entry,
                self.release_block.as_deref(),
                self.release_view.as_deref(),
            )
            .await;
        }
        let remote = &self.session.inner.remote;
        match &self.release_block {
            None => remote.remove(&self.entry).await,
            Some(block) => {
                let update = crate::backend::QueueUpdate {
                    dir: &self.name,
                    unchanged: &[],
                    present: &[&self.entry],
                    set: &[],
                    delete: &[&self.entry],
                    block: Some(block),
                };
                Ok(remote.update_queue(&update).await?.is_some())
            }
        }
    }

    pub(crate) fn sequencer(&self) -> Sequencer {
        Sequencer::new(&*self.name, self.mode, self.entry.token)
    }

    pub(crate) fn entry(&self) -> &Entry {
        &self.entry
    }

    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    pub(crate) fn token(&self) -> FencingToken {
        self.entry.token
    }

    pub(crate) fn key(&self) -> &str {
        &self.entry.key
    }

    pub(crate) fn is_held(&self) -> bool {
        let watched = {
            let cell = self.shared.cell();
            cell.loss.is_none() && !cell.monitor_gone
        };
        watched && !self.session.state().is_over()
    }

    pub(crate) async fn lost(&self) {
        Self::lost_of(&self.shared).await;
    }

    /// As [`lost`](Self::lost), borrowing nothing of the hold: a call that
    /// changes the hold (a conversion) can race against it.
    pub(crate) fn lost_owned(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        async move { Self::lost_of(&shared).await }
    }

    async fn lost_of(shared: &HoldShared) {
        loop {
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            // Registered before looking, so no change in between is missed.
            changed.as_mut().enable();
            let (loss, monitor_gone) = {
                let cell = shared.cell();
                (cell.loss, cell.monitor_gone)
            };
            if loss.is_some() {
                return;
            }
            if monitor_gone {
                // The monitor is gone without a loss: the runtime it ran on
                // shut down. Nothing watches the entry or the session for
                // this lock any more, so it may no longer be held.
                return;
            }
            changed.await;
        }
    }

    async fn loss_error(&self, loss: Loss) -> Error {
        match loss {
            Loss::Session(state) => self.session.inner.over_error(state),
            Loss::Vanished => self.session.inner.vanished_error(&self.entry.key).await,
            Loss::EntryDeleted => Error::LockLost {
                key: self.entry.key.clone(),
            },
        }
    }

    /// Applies `writes` only while this hold still holds (see the guard
    /// surface's `write_if_held`).
    pub(crate) async fn write_if_held(&self, writes: Vec<Write>) -> Result<()> {
        let inner = &self.session.inner;
        for write in &writes {
            inner.check_write_key(write.key())?;
        }
        crate::write::refuse_duplicates(&writes)?;
        // Known lost already: say so without asking the server.
        let known = self.shared.loss();
        if let Some(loss) = known {
            return Err(self.loss_error(loss).await);
        }
        inner.check_usable()?;
        match inner.call(inner.remote.write_if_held(&self.entry, &writes)).await {
            Ok(true) => Ok(()),
            // Nothing was written: the entry is gone. Lost session or deleted
            // entry, as `release` tells them apart.
            Ok(false) => Err(inner.vanished_error(&self.entry.key).await),
            Err(error) => Err(inner.label(error)),
        }
    }

    /// The span of a release: the lock, the session, the token.
    fn release_span(&self) -> tracing::Span {
        tracing::debug_span!(
            "lockline.release",
            lock = &*self.name,
            session = self.session.id(),
            token = self.entry.token.get()
        )
    }

    #[cfg(not(feature = "metrics"))]
    pub(crate) async fn release(self) -> Result<()> {
        use tracing::Instrument;
        let span = self.release_span();
        self.let_go().instrument(span).await
    }

    #[cfg(feature = "metrics")]
    pub(crate) async fn release(self) -> Result<()> {
        use tracing::Instrument;
        let span = self.release_span();
        let shared = Arc::clone(&self.shared);
        let inner = Arc::clone(&self.session.inner);
        // Ends the hold's metrics as the release ends, or as let go if the
        // release is cancelled.
        let ending = shared.metrics.ending();
        let result = self.let_go().instrument(span).await;
        ending.done(&result, || inner.loss_cause());
        result
    }

    async fn let_go(mut self) -> Result<()> {
        self.shared.metrics.letting_go();
        self.monitor.abort();
        let inner = self.session.inner.clone();
        let known = self.shared.loss();
        if let Some(loss) = known {
            self.released = true;
            return Err(self.loss_error(loss).await);
        }
        let state = inner.state();
        if state.is_over() {
            self.released = true;
            return Err(inner.over_error(state));
        }
        // Until the removal has finished, a cancelled `release` leaves the work
        // to `Drop` (fenced, so a second attempt is harmless).
        // A removal cut off in transit (a connection reset, a member going
        // away) is tried again while the request timeout lasts: it is fenced,
        // so a second try can only delete this very entry.
        let deadline = tokio::time::Instant::now() + inner.options.request_timeout();
        let mut pause = RELEASE_RETRY_PAUSE;
        let mut retried = false;
        let removed = loop {
            match inner.call(self.remove_entry()).await {
                Err(error)
                    if error.is_transient()
                        && tokio::time::Instant::now() + pause < deadline
                        && !inner.state().is_over() =>
                {
                    tracing::debug!(key = %self.entry.key, %error, "release cut off; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(REWATCH_MAX_BACKOFF);
                    retried = true;
                }
                other => break other,
            }
        };
        self.released = true;
        match removed {
            Ok(true) => {
                inner.counters.bump(|c| &c.releases);
                Ok(())
            }
            Ok(false) => match inner.vanished_error(&self.entry.key).await {
                // A retry that finds the entry gone after a try cut off in
                // transit, on a session the server still confirms: either
                // that try removed it (its answer lost) or another client
                // deleted it during the fault. The backend tells which where
                // it can (etcd: the hand-over marker its release writes
                // where a lock-delayed contender or the backend asks for it;
                // Redis: a queue member left behind); where it cannot, this
                // is reported as released, as Go's, Curator's and kazoo's
                // unlocks do for a key already gone. A lost session never
                // is, and a question that got no answer is not taken for a
                // release either.
                error @ Error::LockLost { .. } if retried => {
                    match inner.call(inner.remote.removed_by_me(&self.entry)).await {
                        Ok(Some(false)) => {
                            tracing::debug!(key = %self.entry.key, "release retried: entry already gone, deleted by someone else");
                            Err(error)
                        }
                        Ok(answer) => {
                            tracing::debug!(key = %self.entry.key, ?answer, "release retried: entry already gone, taken as removed by the cut-off try");
                            inner.counters.bump(|c| &c.releases);
                            Ok(())
                        }
                        Err(unanswered) => Err(inner.label(unanswered)),
                    }
                }
                error => Err(error),
            },
            Err(error) => {
                // Keep trying in the background; the caller hears of the failure.
                inner.spawn_remove_in(
                    self.name.to_string(),
                    (*self.entry).clone(),
                    "release",
                    self.shared.take_permit(),
                    self.release_block.clone(),
                );
                Err(error)
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.shared.metrics.letting_go();
        self.monitor.abort();
        let permit = self.shared.take_permit();
        if let Some((dir, kind, attempt)) = self.retried.take() {
            // The entry (unless released) and whatever a try still on its
            // way may make; the same-session queue waits for it.
            if !self.released {
                self.shared.metrics.end(crate::observe::End::LetGo);
            }
            let entry = (!self.released).then(|| (*self.entry).clone());
            let leaving = self.release_block.take();
            self.session
                .inner
                .spawn_abandon(dir, kind, attempt, entry, permit, leaving);
        } else if self.released {
            drop(permit);
        } else {
            self.shared.metrics.end(crate::observe::End::LetGo);
            let inner = Arc::clone(&self.session.inner);
            let entry = (*self.entry).clone();
            let view = self.release_view.take();
            let block = self.release_block.take();
            if entry.kind == EntryKind::Dlm {
                // A lock-mode holder hands over and writes its value block
                // as its release would, on the session's runtime (dropped
                // on any thread, in a runtime or not), and `flush` waits
                // for it; the background removal is the fallback.
                let name = self.name.to_string();
                let background = Arc::clone(&inner);
                background.spawn_background(async move {
                    match inner
                        .call(crate::mode_rule::hand_over(
                            &*inner.remote,
                            &inner.counters,
                            &name,
                            &entry,
                            block.as_deref(),
                            view.as_deref(),
                        ))
                        .await
                    {
                        Ok(true) => {
                            inner.counters.bump(|c| &c.releases);
                            drop(permit);
                        }
                        // Tried again in the background, the block with it.
                        _ => inner.spawn_remove_in(name, entry, "release", permit, block),
                    }
                });
            } else {
                inner.spawn_remove(entry, "release", permit);
            }
        }
    }
}

/// Declares the guard surface shared by every recipe's guard type.
macro_rules! guard_surface {
    ($guard:ident, $what:literal) => {
        impl $guard {
            #[doc = concat!("The fencing token of this ", $what, ": higher than every earlier holder's.")]
            ///
            /// Pass it with every write to the protected resource, which should
            /// reject tokens lower than the highest it has seen (see
            /// [`FencingToken`](crate::FencingToken)).
            pub fn token(&self) -> $crate::FencingToken {
                self.hold.token()
            }

            /// The key (etcd) or path (ZooKeeper) of the entry that holds it.
            pub fn key(&self) -> &str {
                self.hold.key()
            }

            #[doc = concat!("This ", $what, "'s [`Sequencer`](crate::Sequencer): the lock's name, the mode it is held in and its fencing token, for a resource to check with [`Client::check`](crate::Client::check).")]
            pub fn sequencer(&self) -> $crate::Sequencer {
                self.hold.sequencer()
            }

            /// Whether it is still held as far as this client knows: turns
            /// `false` once [`lost`](Self::lost) would resolve.
            pub fn is_held(&self) -> bool {
                self.hold.is_held()
            }

            /// The session it was taken on.
            pub fn session(&self) -> &$crate::Session {
                self.hold.session()
            }

            /// Resolves when it may no longer be held: the session expired or was
            /// closed, the session went unconfirmed past its loss deadline
            /// (`ttl - safety margin`), the entry was deleted by someone else, or
            /// the tokio runtime that kept the session alive or watched this
            /// lock (the one `lock()` ran on) shut down. Stop using the
            /// protected resource when it does.
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only observes.
            pub async fn lost(&self) {
                self.hold.lost().await
            }

            /// Writes to the lock's own store (etcd keys, absolute ZooKeeper
            /// paths) only if it is still held, atomically: every write in
            /// `writes` is applied, or none is.
            ///
            /// The server checks the fence in the same request as the writes:
            /// on etcd one `Txn` comparing this entry's create revision (its
            /// fencing token), on ZooKeeper one `multi` beginning with a
            /// `check` of this entry's node, on the memory backend one step
            /// under the store's lock. So a holder that was paused past its
            /// session's end and wakes up writes nothing, even before it has
            /// noticed its loss. Use it for state that only the holder may
            /// change; read it back with [`Session::read`](crate::Session::read).
            ///
            /// Puts create persistent keys (they outlive the session); a
            /// delete of a missing key is no error. An empty `writes` checks
            /// the fence alone. See [`Write`](crate::Write) and the chapter
            /// "Fenced writes" (`docs/fenced-writes.md`) for each backend's
            /// details (ZooKeeper creates missing parent nodes).
            ///
            /// ```
            /// # #[tokio::main(flavor = "current_thread")]
            /// # async fn main() -> lockline::Result<()> {
            /// use lockline::{Client, MemoryBackend, Write};
            ///
            /// let store = MemoryBackend::new();
            /// let session = Client::new(store.clone()).session().await?;
            /// let guard = session.mutex("jobs/report")?.lock().await?;
            /// guard.write_if_held([Write::put("jobs/report-state", "running")]).await?;
            ///
            /// store.expire(session.id()); // the session ends under the holder
            /// let late = guard.write_if_held([Write::put("jobs/report-state", "done")]).await;
            /// assert!(matches!(late, Err(lockline::Error::SessionLost { .. })));
            /// let reader = Client::new(store).session().await?;
            /// assert_eq!(reader.read("jobs/report-state").await?.as_deref(), Some(&b"running"[..]));
            /// # Ok(()) }
            /// ```
            ///
            /// # Cancel safety
            ///
            /// If cancelled, the writes may or may not have been applied: all
            /// of them or none.
            ///
            /// # Errors
            ///
            /// Nothing is written when it fails, except that after
            /// [`Error::Unavailable`](crate::Error::Unavailable) the writes may
            /// have been applied (all of them or none).
            /// [`Error::SessionLost`](crate::Error::SessionLost) or
            /// [`Error::LockLost`](crate::Error::LockLost) when it is no
            /// longer held (as [`release`](Self::release) reports them),
            /// [`Error::Closed`](crate::Error::Closed) when the session was
            /// closed;
            /// [`Error::InvalidName`](crate::Error::InvalidName) for a key the
            /// backend cannot store or one under this lock's own entries;
            /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) when a
            /// key appears twice; [`Error::Unavailable`](crate::Error::Unavailable)
            /// when the server did not answer in time (the writes may then
            /// have been applied, all or none), a refusal or another backend
            /// error (a ZooKeeper delete of a node that has children, say);
            /// [`Error::Unsupported`](crate::Error::Unsupported) on a backend
            /// without fenced writes.
            pub async fn write_if_held(&self, writes: impl IntoIterator<Item = $crate::Write>) -> $crate::Result<()> {
                self.hold.write_if_held(writes.into_iter().collect()).await
            }

            /// Releases it: deletes its entry, fenced on the entry's own creation
            /// revision / znode, so a stale guard can never delete a newer
            /// holder's entry. Wakes at most one waiter. A removal cut off in
            /// transit is tried again while the request timeout lasts. A
            /// retry that finds the entry already gone, on a session the
            /// server still confirms, counts as released when the cut-off
            /// try removed it, and as [`Error::LockLost`](crate::Error::LockLost)
            /// when another client deleted it meanwhile. etcd and Redis tell
            /// the two apart (see each backend's docs for what is left);
            /// ZooKeeper and SQL cannot, and count it as released, as Go's,
            /// Curator's and kazoo's unlocks do for a key already gone. When
            /// the question gets no answer, the release fails with that error
            /// (the entry is gone either way).
            ///
            /// # Cancel safety
            ///
            /// If cancelled, the release finishes in the background, as on drop.
            ///
            /// # Errors
            ///
            /// [`Error::SessionLost`](crate::Error::SessionLost) or
            /// [`Error::LockLost`](crate::Error::LockLost) when it had already
            /// been lost (others may have held it since),
            /// [`Error::Closed`](crate::Error::Closed) when the session was
            /// closed, or a backend error (the removal is then retried in the
            /// background).
            pub async fn release(self) -> $crate::Result<()> {
                self.hold.release().await
            }
        }
    };
}
pub(crate) use guard_surface;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    /// Every held lock keeps one monitor task for as long as it is held
    /// (DESIGN §8: bounded memory per lock). Its future was 704 bytes (a
    /// 1024-byte task) before its rare steps were boxed and it waited on
    /// the session's one end signal instead of following the session's
    /// state itself; 360 with rustc 1.95, a 512-byte task (tokio adds about
    /// 150 bytes and rounds up to 128).
    #[tokio::test]
    async fn a_held_lock_keeps_a_small_monitor() {
        let session = crate::Client::memory().session().await.expect("session");
        let entry = Arc::new(crate::Entry {
            key: "a/1".into(),
            kind: crate::EntryKind::Mutex,
            order: 1,
            token: crate::FencingToken::new(1),
            owner: None,
        });
        let shared = Arc::new(super::HoldShared {
            cell: std::sync::Mutex::new(super::HoldCell {
                loss: None,
                monitor_gone: false,
                local: None,
            }),
            changed: tokio::sync::Notify::new(),
            metrics: crate::observe::Holding::new(
                &session.inner.counters,
                "memory",
                crate::sequencer::Mode::Mutex,
                "a",
            ),
        });
        let monitor = super::monitor(Arc::clone(&session.inner), entry, super::MonitorGone(shared), None);
        let size = std::mem::size_of_val(&monitor);
        assert!(size <= 384, "the monitor's future is {size} bytes");
    }
}
