//! The background removal of what guards and acquires leave behind: each
//! entry (or interrupted append) adopted as an orphan, removed, fenced,
//! with capped backoff until it is gone or the session is over.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::SessionInner;
use crate::{Entry, EntryKind, Result};

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

impl SessionInner {
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
        let mut backoff = CLEANUP_BACKOFF;
        let mut failures = 0u32;
        loop {
            let outcome = tokio::select! {
                biased;
                state = self.over() => {
                    tracing::debug!(key, why, ?state, "session over; the server removes its entries");
                    return false;
                }
                outcome = self.call(self.clean(orphan)) => outcome,
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
                self.count_cleanup_failure(orphan.kind);
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
                self.count_cleanup_failure(orphan.kind);
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

    /// Counts a background removal that failed for good or for long, in
    /// [`ClientStats::cleanup_failures`](crate::ClientStats) and its metric.
    fn count_cleanup_failure(&self, kind: EntryKind) {
        self.counters.bump(|c| &c.cleanup_failures);
        crate::observe::cleanup_failure(&self.counters, self.backend_name(), kind);
    }
}
