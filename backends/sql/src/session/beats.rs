//! Other sessions as this one sees them: each owner's heartbeat count and
//! when it first saw it (silence is judged on this process's monotonic
//! clock, never by a server's wall clock), and how the entries it waited
//! on went (for a lock-delay).

use std::sync::PoisonError;
use std::time::Duration;

use lockline::backend::Entry;
use tokio::time::Instant;

use super::Shared;
use crate::dialect::{Beat, Dialect};
use crate::layout::parse_entry_key;

/// An owner's heartbeat count as first seen (see `Shared::beats`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    count: i64,
    ttl: Duration,
    at: Instant,
}

impl<D: Dialect> Shared<D> {
    /// Records `owner`'s heartbeat as read in an answer that arrived just
    /// now; whether its count has not moved for its TTL since an answer
    /// first carried it. The time is when the answer arrived, never when
    /// the question was sent: the renewal that wrote the count was sent
    /// before, so its sender's loss deadline (`ttl - margin` after that
    /// send) has passed when this says silent.
    pub(super) fn silent(&self, owner: &str, beat: Beat) -> bool {
        let now = Instant::now();
        let ttl = Duration::from_millis(u64::try_from(beat.ttl_ms).unwrap_or(0));
        let mut beats = self.beats.lock().unwrap_or_else(PoisonError::into_inner);
        match beats.get(owner) {
            Some(seen) if seen.count == beat.count => now.duration_since(seen.at) >= seen.ttl,
            _ => {
                if beats.len() >= 4096 {
                    beats.clear();
                }
                beats.insert(
                    owner.to_owned(),
                    Seen {
                        count: beat.count,
                        ttl,
                        at: now,
                    },
                );
                false
            }
        }
    }

    /// How long a wait on an entry of `owner` may block on the server
    /// before its heartbeat is read again: until it could be judged silent,
    /// at most our own TTL (the server also caps it at a third of the
    /// owner's TTL).
    pub(super) fn wait_bound(&self, owner: &str) -> Duration {
        let ttl = self.options.ttl();
        let beats = self.beats.lock().unwrap_or_else(PoisonError::into_inner);
        match beats.get(owner) {
            Some(seen) => (seen.at + seen.ttl)
                .saturating_duration_since(Instant::now())
                .min(seen.ttl / 3)
                .clamp(Duration::from_millis(1), ttl),
            None => ttl,
        }
    }

    /// Records how an entry of another session this session waited on went
    /// (for a lock-delay's `departure`): lost with its owner's connection
    /// or session, or released.
    pub(super) fn saw_go(&self, entry: &Entry, lost: bool) {
        if self.options.lock_delay().is_zero() || entry.owner.as_deref() == Some(self.id.as_str()) {
            return;
        }
        let Some((_, id)) = parse_entry_key(&entry.key) else {
            return;
        };
        let mut departures = self.departures.lock().unwrap_or_else(PoisonError::into_inner);
        if departures.len() > 4096 {
            departures.clear();
        }
        departures.insert(id, lost.then(Instant::now));
    }

    /// Forgets an owner's heartbeat (its session ended).
    pub(super) fn forget_beat(&self, owner: &str) {
        self.beats.lock().unwrap_or_else(PoisonError::into_inner).remove(owner);
    }
}
