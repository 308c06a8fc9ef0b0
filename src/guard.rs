//! What every held lock, permit and leadership has in common.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::sync::{watch, OwnedMutexGuard};
use tokio::task::AbortHandle;

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
pub(crate) struct Hold {
    session: Session,
    entry: Entry,
    loss: watch::Receiver<Option<Loss>>,
    monitor: AbortHandle,
    /// The same-session queue permit, shared with the monitor: it lets go once
    /// the entry is gone (released, or lost), never before.
    local: LocalPermit,
    released: bool,
}

type LocalPermit = Arc<std::sync::Mutex<Option<OwnedMutexGuard<()>>>>;

fn take_permit(permit: &LocalPermit) -> Option<OwnedMutexGuard<()>> {
    permit.lock().unwrap_or_else(PoisonError::into_inner).take()
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

impl Hold {
    /// `watch` is the watch on `entry` the acquire already had open while
    /// queued, if any: the monitor carries it on instead of opening another.
    pub(crate) fn new(
        session: Session,
        entry: Entry,
        local: Option<OwnedMutexGuard<()>>,
        watch: Option<EntryWatch>,
    ) -> Self {
        let (tx, loss) = watch::channel(None);
        let inner = session.inner.clone();
        let watched = entry.clone();
        let local: LocalPermit = Arc::new(std::sync::Mutex::new(local));
        let monitor_permit = Arc::clone(&local);
        let monitor = tokio::spawn(async move {
            let mut watch = watch.unwrap_or_else(|| watch_entry(&inner, &watched));
            let mut backoff = REWATCH_BACKOFF;
            let loss = loop {
                tokio::select! {
                    biased;
                    state = inner.over() => break Loss::Session(state),
                    gone = watch.as_mut() => match gone {
                        Ok(()) => {
                            // Lost now, whatever the reason: stop the holder's
                            // work at once, then find out why.
                            tx.send_replace(Some(Loss::Vanished));
                            break match inner.vanished_error(&watched.key).await {
                                Error::LockLost { .. } => Loss::EntryDeleted,
                                _ => Loss::Session(inner.state()),
                            };
                        }
                        Err(error) => {
                            // A failed watch is not a loss; the session's own
                            // liveness tracking decides that. Watch again shortly.
                            // Back off (capped) so a server that is down is not
                            // hammered; the session ending stops the wait.
                            tracing::debug!(key = %watched.key, %error, ?backoff, "watch on a held entry failed; re-watching");
                            tokio::select! {
                                biased;
                                state = inner.over() => break Loss::Session(state),
                                () = tokio::time::sleep(backoff) => {}
                            }
                            backoff = (backoff * 2).min(REWATCH_MAX_BACKOFF);
                            inner.counters.bump(|c| &c.rewatches);
                            watch = watch_entry(&inner, &watched);
                        }
                    },
                }
            };
            tracing::debug!(key = %watched.key, ?loss, "lock lost");
            tx.send_replace(Some(loss));
            // The entry is gone: a same-session contender may queue again.
            drop(take_permit(&monitor_permit));
        })
        .abort_handle();
        Hold {
            session,
            entry,
            loss,
            monitor,
            local,
            released: false,
        }
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
        self.loss.borrow().is_none() && !self.session.state().is_over()
    }

    pub(crate) async fn lost(&self) {
        let mut loss = self.loss.clone();
        if loss.wait_for(Option::is_some).await.is_err() {
            // The monitor is gone (the runtime is shutting down): fall back to
            // the session alone.
            self.session.lost().await;
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
        let known = *self.loss.borrow();
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

    pub(crate) async fn release(mut self) -> Result<()> {
        self.monitor.abort();
        let inner = self.session.inner.clone();
        let known = *self.loss.borrow();
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
            match inner.call(inner.remote.remove(&self.entry)).await {
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
                // transit, on a session the server still confirms: that try
                // most likely removed it, its answer lost. A removal cannot
                // tell its own earlier try from another client's delete, so
                // this is reported as released (as Go's, Curator's and kazoo's
                // unlocks do for a key already gone); a lost session is not.
                Error::LockLost { .. } if retried => {
                    tracing::debug!(key = %self.entry.key, "release retried: entry already gone, taken as removed by the cut-off try");
                    inner.counters.bump(|c| &c.releases);
                    Ok(())
                }
                error => Err(error),
            },
            Err(error) => {
                // Keep trying in the background; the caller hears of the failure.
                inner.spawn_remove(self.entry.clone(), "release", take_permit(&self.local));
                Err(error)
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.monitor.abort();
        let permit = take_permit(&self.local);
        if self.released {
            drop(permit);
        } else {
            self.session.inner.spawn_remove(self.entry.clone(), "release", permit);
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
            /// (`ttl - safety margin`), or the entry was deleted by someone else.
            /// Stop using the protected resource when it does.
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
            /// the fence alone. See [`Write`](crate::Write) and the README's
            /// "Fenced writes" for each backend's details (ZooKeeper creates
            /// missing parent nodes).
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
            /// server still confirms, counts as released: the cut-off try
            /// most likely removed it, and a removal cannot tell that from
            /// another client's delete.
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
