//! Waiters beyond the wait connections: their entries looked at together
//! every [`OVERFLOW_RECHECK`], in one statement, and the sessions past
//! their TTL that hold them ended; and the end of every silent session
//! after a row-lock wait ran out.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::wait::WaitOn;
use super::Shared;
use tokio::time::error::Elapsed;

use crate::dialect::{DbResult, Dialect, Purpose, Reaped, Status};
use crate::pool::Stop;

/// How a waiter without a wait connection is woken: its signal, and the
/// flag saying its predecessor was lost rather than released.
type Wake = (Arc<Stop>, Arc<AtomicBool>);

/// A waiter with no wait connection (see `Shared::overflow`).
pub(super) struct Overflow {
    id: i64,
    version: Option<i64>,
    gone: Arc<Stop>,
    /// Set with `gone` when the entry was lost with its owner's connection.
    lost: Arc<AtomicBool>,
}

/// How often waiters with no wait connection have their entries looked at
/// (one statement for all of a session's): only while a session has more
/// waiters than wait connections.
pub(crate) const OVERFLOW_RECHECK: Duration = Duration::from_millis(100);

impl<D: Dialect> Shared<D> {
    pub(super) fn register_overflow(&self, on: WaitOn) -> (u64, Arc<Stop>, Arc<AtomicBool>) {
        let key = self.next_overflow.fetch_add(1, Ordering::Relaxed);
        let gone = Arc::new(Stop::default());
        let lost = Arc::new(AtomicBool::new(false));
        let (id, version) = match on {
            WaitOn::Guard(id) => (id, None),
            WaitOn::Version(id, version) => (id, Some(version)),
            WaitOn::Watch(id, at, _) => (id, Some(at.version)),
        };
        self.overflow.lock().unwrap_or_else(PoisonError::into_inner).insert(
            key,
            Overflow {
                id,
                version,
                gone: Arc::clone(&gone),
                lost: Arc::clone(&lost),
            },
        );
        (key, gone, lost)
    }

    pub(super) fn unregister_overflow(&self, key: u64) {
        self.overflow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
    }

    /// Looks at the entries of waiters that have no wait connection, every
    /// [`OVERFLOW_RECHECK`] while there are any: wakes those whose entry is
    /// gone (or whose value changed), and ends the sessions past their TTL
    /// that hold the others (as a waiter with a connection would).
    pub(super) async fn check_overflow(self: Arc<Self>) {
        loop {
            tokio::time::sleep(OVERFLOW_RECHECK).await;
            if self.state.borrow().is_over() {
                return;
            }
            // Each waiter's entry id, the version it waits for, and how to wake it.
            let waiting: Vec<(i64, Option<i64>, Wake)> = self
                .overflow
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .map(|o| {
                    let wake = (Arc::clone(&o.gone), Arc::clone(&o.lost));
                    (o.id, o.version, wake)
                })
                .collect();
            if waiting.is_empty() {
                continue;
            }
            let mut ids: Vec<(i64, i64)> = waiting.iter().map(|(id, v, ..)| (*id, v.unwrap_or(-1))).collect();
            ids.sort_unstable();
            ids.dedup();
            let statuses = match on_control!(self, "look at queued waits", |d, conn| d.statuses(conn, &ids)) {
                Ok(statuses) => statuses,
                Err(error) => {
                    tracing::debug!(session = %self.id, %error, "could not look at queued waits");
                    continue;
                }
            };
            for (id, version, status, owner, beat) in statuses {
                match status {
                    Status::Free | Status::Dead => {
                        for (_, _, (gone, lost)) in waiting
                            .iter()
                            .filter(|(i, v, ..)| *i == id && v.unwrap_or(-1) == version)
                        {
                            lost.store(status == Status::Dead, Ordering::SeqCst);
                            gone.signal();
                        }
                    }
                    Status::Held => {
                        if let Some(beat) = beat {
                            if self.silent(&owner, beat) {
                                self.spawn_reap(owner, id, beat.count);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Ends a session past its TTL that holds an entry a waiter without a
    /// connection waits on, through a connection of its own (the step can
    /// take seconds: the server ends the connection first).
    pub(super) fn spawn_reap(self: &Arc<Self>, owner: String, id: i64, beat: i64) {
        let ending = owner.clone();
        let reap = move |shared: Arc<Self>| async move {
            let (mut conn, _) = shared.dialect.connect(Purpose::Wait).await?;
            shared.dialect.reap(&mut conn, &ending, id, beat).await
        };
        self.spawn_reaping(
            owner.clone(),
            Duration::from_secs(5),
            reap,
            move |shared, reaped| match reaped {
                Ok(Ok(Reaped::Ended)) => {
                    tracing::info!(session = %shared.id, %owner, "ended a session that stopped renewing");
                    shared.forget_beat(&owner);
                }
                Ok(Ok(Reaped::Gone)) => shared.forget_beat(&owner),
                Ok(Ok(Reaped::Renewed)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(session = %shared.id, %owner, %error, "could not end a silent session")
                }
                Err(_) => tracing::debug!(session = %shared.id, %owner, "ending a silent session took too long"),
            },
        );
    }

    /// Ends every session past its TTL, in the background (once at a
    /// time): after a statement of this session waited too long on a row
    /// lock, which a silent session may hold from a transaction it was in
    /// when it went silent.
    pub(super) fn spawn_reap_stale(self: &Arc<Self>) {
        let reap = move |shared: Arc<Self>| async move {
            let (mut conn, _) = shared.dialect.connect(Purpose::Wait).await?;
            let mut ended = 0u64;
            for (owner, beat, entry) in shared.dialect.beats(&mut conn).await? {
                if owner != shared.id
                    && shared.silent(&owner, beat)
                    && shared.dialect.reap(&mut conn, &owner, entry, beat.count).await? == Reaped::Ended
                {
                    shared.forget_beat(&owner);
                    ended += 1;
                }
            }
            Ok::<_, sqlx::Error>(ended)
        };
        self.spawn_reaping(
            String::new(),
            Duration::from_secs(10),
            reap,
            |shared, reaped| match reaped {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(session = %shared.id, ended = n, "ended sessions that stopped renewing"),
                Ok(Err(error)) => tracing::debug!(session = %shared.id, %error, "could not end silent sessions"),
                Err(_) => tracing::debug!(session = %shared.id, "ending silent sessions took too long"),
            },
        );
    }

    /// Runs `reap` in a task of its own, unless a reaping of the same `key`
    /// (an owner's session id; empty: every silent session) is under way,
    /// bounded by the request timeout and `extra`; `told` hears how it
    /// ended.
    fn spawn_reaping<T, F>(
        self: &Arc<Self>,
        key: String,
        extra: Duration,
        reap: impl FnOnce(Arc<Self>) -> F + Send + 'static,
        told: impl FnOnce(&Self, Result<DbResult<T>, Elapsed>) + Send + 'static,
    ) where
        F: Future<Output = DbResult<T>> + Send,
    {
        if !self
            .reaping
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone())
        {
            return;
        }
        /// The reaping's key, taken off when the task ends: also when it is
        /// dropped with the runtime it runs on (its caller's), polled or
        /// not (it is made before the task and moved into it), or no
        /// reaping of that key would run again.
        struct Reaping<D: Dialect>(Arc<Shared<D>>, String);
        impl<D: Dialect> Drop for Reaping<D> {
            fn drop(&mut self) {
                self.0
                    .reaping
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&self.1);
            }
        }
        let shared = Arc::clone(self);
        let reaping = Reaping(Arc::clone(&shared), key);
        tokio::spawn(async move {
            let timeout = shared.options.request_timeout() + extra;
            let reaped = tokio::time::timeout(timeout, reap(Arc::clone(&shared))).await;
            told(&shared, reaped);
            drop(reaping);
        });
    }
}
