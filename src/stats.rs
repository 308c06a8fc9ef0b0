//! The client's counters, [`ClientStats`] and the [`Counters`] its
//! sessions bump, and their export: `metrics` records them through the
//! `metrics` facade (cargo feature `metrics`); without the feature,
//! `observe` stands in for it with the same names and records nothing.

use std::sync::atomic::{fence, AtomicU64, Ordering};

#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
pub(crate) mod observe;
#[cfg(feature = "metrics")]
pub(crate) use self::metrics as observe;

/// Counters of what one [`Client`](crate::Client) and its sessions did.
///
/// `wakeups` is what the herd-free promise is measured by: it counts the times a
/// queued contender was woken because the one entry it waited on went away. With
/// the wait rule every release wakes at most one contender, so over a run of
/// handoffs `wakeups / releases` stays at 1 however long the queue is.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// let client = lockline::Client::memory();
/// let session = client.session().await?;
/// session.mutex("stats-demo")?.lock().await?.release().await?;
/// let stats = client.stats();
/// assert_eq!((stats.grants, stats.releases, stats.wakeups), (1, 1, 0));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Sessions opened.
    pub sessions: u64,
    /// Entries appended to a queue (acquire attempts that reached the server).
    pub appends: u64,
    /// Locks, permits and leaderships granted.
    pub grants: u64,
    /// Times a queued contender began waiting on the one entry before it.
    pub waits: u64,
    /// Queued contenders woken because the entry they waited on went away.
    pub wakeups: u64,
    /// Held entries released (explicitly or on drop).
    pub releases: u64,
    /// Entries of cancelled or failed acquires removed in the background.
    pub cleanups: u64,
    /// Background removals that failed five times in a row (each is logged
    /// as a warning; they go on being retried until the entry is gone or the
    /// session is over), and removals the server refused (permission
    /// denied), after which the session is given up so that the server
    /// deletes its entries.
    pub cleanup_failures: u64,
    /// Watches on held entries re-opened after they failed (a server down or
    /// unreachable). Re-watching backs off, from 100 ms doubling to 2 s.
    pub rewatches: u64,
    /// Lock-delays begun: a contender next in line after a holder that lost
    /// its lock involuntarily held back before its grant
    /// ([`SessionOptions::with_lock_delay`](crate::SessionOptions::with_lock_delay)).
    /// Counted once the contender has marked its entry, so a queue listed
    /// after the count is seen shows the mark
    /// ([`Contender::delayed_until`](crate::Contender::delayed_until)) until
    /// the delay ends (unless writing the mark failed: it is best effort).
    pub lock_delays: u64,
    /// Lock-mode releases that granted the waiters their departure let in,
    /// in the release's own write: those waiters learn from their wake that
    /// they hold, and write nothing ([`Resource`](crate::Resource)).
    pub handovers: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    changed: tokio::sync::watch::Sender<()>,
    pub(crate) sessions: AtomicU64,
    pub(crate) appends: AtomicU64,
    pub(crate) grants: AtomicU64,
    pub(crate) handovers: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) cleanups: AtomicU64,
    pub(crate) cleanup_failures: AtomicU64,
    pub(crate) rewatches: AtomicU64,
    pub(crate) lock_delays: AtomicU64,
    /// The handles registered with the metrics recorder.
    #[cfg(feature = "metrics")]
    pub(crate) metrics: self::metrics::Registry,
}

impl Counters {
    pub(crate) fn bump(&self, counter: impl FnOnce(&Counters) -> &AtomicU64) {
        counter(self).fetch_add(1, Ordering::Relaxed);
        // Nobody waits for the counts most of the time, and telling a watch
        // channel wakes its every shard whether it has receivers or not. The
        // fence pairs with `wait_for`'s: either this sees its receiver, or
        // its first look at the counts sees this count.
        fence(Ordering::SeqCst);
        if self.changed.receiver_count() > 0 {
            self.changed.send_replace(());
        }
    }

    pub(crate) async fn wait_for(&self, mut predicate: impl FnMut(&ClientStats) -> bool) -> ClientStats {
        let mut changed = self.changed.subscribe();
        // See `bump`.
        fence(Ordering::SeqCst);
        loop {
            let stats = self.snapshot();
            if predicate(&stats) {
                return stats;
            }
            // `self` owns the sender, so this cannot fail while we borrow it.
            let _ = changed.changed().await;
        }
    }

    pub(crate) fn snapshot(&self) -> ClientStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ClientStats {
            sessions: get(&self.sessions),
            appends: get(&self.appends),
            grants: get(&self.grants),
            handovers: get(&self.handovers),
            waits: get(&self.waits),
            wakeups: get(&self.wakeups),
            releases: get(&self.releases),
            cleanups: get(&self.cleanups),
            cleanup_failures: get(&self.cleanup_failures),
            rewatches: get(&self.rewatches),
            lock_delays: get(&self.lock_delays),
        }
    }
}
