//! A session's end: where it stands, the one task per session that follows
//! its state to the end, the waits on that end, and the errors of a call
//! on an over session or of an entry of it that vanished.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use tokio::sync::watch;

use super::SessionInner;
use crate::{Error, Result, SessionState};

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
pub(super) struct EndSignal {
    cell: std::sync::Mutex<EndCell>,
    /// Notified (to every waiter) when the cell changes.
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct EndCell {
    /// How the session ended, once it has.
    pub(super) ended: Option<SessionState>,
    /// The following task is gone without having seen the end.
    unfollowed: bool,
    /// The session was lost while `Suspended` (for a loss's metrics cause).
    unconfirmed: bool,
}

impl EndSignal {
    fn cell(&self) -> std::sync::MutexGuard<'_, EndCell> {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn update(&self, change: impl FnOnce(&mut EndCell)) {
        change(&mut self.cell());
        self.changed.notify_waiters();
    }
}

/// The end signal, as the task that follows the session holds it: marks it
/// unfollowed when the task is dropped before the end. The task's future
/// owns it from its creation, so a task dropped before it was ever polled
/// (its runtime shut down at once) marks it too.
pub(super) struct Following(pub(super) Arc<EndSignal>);

impl Drop for Following {
    fn drop(&mut self) {
        self.0.update(|cell| cell.unfollowed = cell.ended.is_none());
    }
}

/// Sets `end` once the session is over, as [`SessionInner::over`] sees it.
/// Also keeps the session's place in the sessions-by-state gauge.
pub(super) async fn follow_end(
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

impl SessionInner {
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

    pub(crate) fn check_usable(&self) -> Result<()> {
        let state = self.state();
        if state.is_over() {
            return Err(self.over_error(state));
        }
        Ok(())
    }
}
