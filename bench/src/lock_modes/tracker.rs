//! What every contender of a mixed run tracks: who holds what, and how
//! often two incompatible modes were held at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex as StdMutex, PoisonError};

use lockline::LockMode;

/// What every contender of a mixed run tracks: who holds what.
#[derive(Debug, Default)]
pub(super) struct Tracker {
    held: StdMutex<Vec<(usize, LockMode)>>,
    pub(super) overlaps: AtomicU64,
}

impl Tracker {
    /// `who` holds `mode` from now (replacing what it held).
    pub(super) fn hold(&self, who: usize, mode: LockMode) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|(w, _)| *w != who);
        let clashes = held.iter().filter(|(_, theirs)| !theirs.compatible(mode)).count();
        self.overlaps.fetch_add(clashes as u64, Ordering::Relaxed);
        held.push((who, mode));
    }

    /// `who` holds nothing from now.
    pub(super) fn leave(&self, who: usize) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|(w, _)| *w != who);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tracker_counts_incompatible_holds_only() {
        let tracker = Tracker::default();
        tracker.hold(0, LockMode::Pr);
        tracker.hold(1, LockMode::Pr);
        tracker.hold(2, LockMode::Cr);
        assert_eq!(tracker.overlaps.load(Ordering::SeqCst), 0);
        tracker.hold(0, LockMode::Nl); // a down-conversion replaces the mode
        tracker.hold(3, LockMode::Pw);
        assert_eq!(tracker.overlaps.load(Ordering::SeqCst), 1, "PW beside PR");
        tracker.leave(1);
        tracker.leave(3);
        tracker.hold(4, LockMode::Ex);
        assert_eq!(tracker.overlaps.load(Ordering::SeqCst), 2, "EX beside CR");
    }
}
