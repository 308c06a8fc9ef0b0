//! How a node ahead went: the wakes the waits remember, from which a
//! release is told from a loss (for the lock-delay).

use super::*;

/// How a wait on another contender's node ended.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wake {
    /// When the waiter heard of it.
    at: Instant,
    /// Woken by the release mark (the node's data changed, and the node was
    /// deleted in the same transaction if it is gone at the next read), not
    /// by the deletion alone.
    marked: bool,
}

/// How long a wake is remembered for [`BackendSession::departure`] at most:
/// the core asks right after the read that follows the wake. A read later
/// than this (a stalled waiter) is taken as a loss: see
/// [`ZkSession::departure`].
pub(super) const WAKE_MEMORY: Duration = Duration::from_secs(1);

impl ZkSession {
    /// Remembers how a wait on another contender's node ended, when the
    /// session has a lock-delay (nobody asks otherwise); forgets wakes too
    /// old to count.
    pub(super) fn note_wake(&self, key: &str, marked: bool) {
        let now = Instant::now();
        let mut wakes = lock(&self.wakes);
        let memory = self.wake_memory;
        wakes.retain(|_, wake| now.saturating_duration_since(wake.at) < memory);
        wakes.insert(key.to_owned(), Wake { at: now, marked });
    }

    pub(super) fn departure_of(&self, gone: &Entry) -> Departure {
        let now = Instant::now();
        let wake = lock(&self.wakes).get(&gone.key).copied();
        match wake {
            Some(wake) if wake.marked && now.saturating_duration_since(wake.at) < self.wake_memory => {
                Departure::Released
            }
            Some(wake) if !wake.marked => Departure::Lost { noticed: wake.at },
            _ => Departure::Lost { noticed: now },
        }
    }
}
