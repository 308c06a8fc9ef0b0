//! One contender of the mixed workload: it draws a mode, locks it,
//! sometimes converts, and releases, telling the tracker what it surely
//! holds all along; and what all of them count together.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lockline::{Error, LockMode, Resource, ResourceGuard};

use crate::contest::Contender;

use super::tracker::Tracker;
use super::workload::{common, Dice};

/// What the mixed workload's contenders count together.
#[derive(Debug, Default)]
pub(super) struct MixedCounts {
    tracker: Tracker,
    conversions: AtomicU64,
    deadlocks: AtomicU64,
}

impl MixedCounts {
    /// Conversions granted and up-conversions refused as deadlocks so far.
    pub(super) fn conversions_and_deadlocks(&self) -> (u64, u64) {
        (
            self.conversions.load(Ordering::SeqCst),
            self.deadlocks.load(Ordering::SeqCst),
        )
    }

    /// Times two incompatible modes were tracked as held at once.
    pub(super) fn overlaps(&self) -> u64 {
        self.tracker.overlaps.load(Ordering::SeqCst)
    }
}

/// One contender's loop, until stopped: a mode drawn with `dice`, locked
/// with zero hold time, converted when the dice say so, and released.
pub(super) async fn mixed_contender(
    mut contender: Contender,
    resource: Resource,
    mut dice: Dice,
    counts: Arc<MixedCounts>,
) -> Result<(), Error> {
    let who = contender.who();
    while contender.running() {
        let (mode, convert_to) = dice.mixed_request();
        let started = Instant::now();
        let mut guard = resource.lock(mode).await?;
        contender.granted(started);
        counts.tracker.hold(who, mode);
        if let Some(to) = convert_to {
            convert_tracked(&mut guard, who, mode, to, &counts).await?;
        }
        counts.tracker.leave(who);
        contender.releasing();
        guard.release().await?;
    }
    Ok(())
}

/// Converts `guard` from `mode` to `to`, telling the tracker what contender
/// `who` surely holds meanwhile and after, and counting the conversion or
/// the deadlock refused to it.
async fn convert_tracked(
    guard: &mut ResourceGuard,
    who: usize,
    mode: LockMode,
    to: LockMode,
    counts: &MixedCounts,
) -> Result<(), Error> {
    // While the server may have either mode, claim only one below both
    // (CW → PR: CR; a down-conversion: the new mode).
    counts.tracker.hold(who, common(mode, to));
    match guard.convert(to).await {
        Ok(()) => {
            counts.tracker.hold(who, to);
            counts.conversions.fetch_add(1, Ordering::Relaxed);
        }
        Err(Error::Deadlock { held, .. }) => {
            counts.tracker.hold(who, held);
            counts.deadlocks.fetch_add(1, Ordering::Relaxed);
        }
        Err(error) => return Err(error),
    }
    Ok(())
}
