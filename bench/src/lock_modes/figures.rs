//! What a measurement gives ([`Figures`]) and one N's three of them
//! ([`Row`]).

use crate::contest::Outcome;

#[cfg(doc)]
use super::ServerCounters;

/// One measurement's figures.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// The contest's window: grants, handoffs, latencies.
    pub outcome: Outcome,
    /// Wakeups per release, as the clients counted them over the whole
    /// measurement.
    pub wakeups_per_release: f64,
    /// Conversions granted within the window (mixed only).
    pub conversions: u64,
    /// Up-conversions refused as deadlocks within the window (mixed only).
    pub deadlocks: u64,
    /// Times two incompatible modes were tracked as held at once (mixed
    /// only; 0 unless the lock is broken).
    pub overlaps: u64,
    /// The server's counters per grant over the whole measurement, one per
    /// [`ServerCounters::names`] (none without them).
    pub server: Vec<f64>,
}

impl Figures {
    /// A handoff measurement's figures: its `outcome` and the clients'
    /// wakeups per release (no conversions, deadlocks or server counters).
    pub(super) fn of_handoffs(outcome: Outcome, wakeups_per_release: f64) -> Self {
        Figures {
            outcome,
            wakeups_per_release,
            ..Figures::default()
        }
    }

    /// Grants per second within the window.
    pub fn grants_per_sec(&self) -> f64 {
        self.outcome.grants_per_sec()
    }

    /// Handoffs per second within the window.
    pub fn handoffs_per_sec(&self) -> f64 {
        self.outcome.handoffs_per_sec()
    }

    /// Per second within the window.
    pub fn per_sec(&self, count: u64) -> f64 {
        count as f64 / self.outcome.seconds
    }
}

/// One N's three measurements; a measurement that failed or stalled holds
/// its reason (a finding, printed under the tables).
#[derive(Debug)]
pub struct Row {
    /// The number of contenders.
    pub n: usize,
    /// Whether EX ran before the mutex at this N.
    pub ex_first: bool,
    /// lockline's mutex.
    pub mutex: Result<Figures, String>,
    /// A resource in EX.
    pub ex: Result<Figures, String>,
    /// The mixed workload.
    pub mixed: Result<Figures, String>,
}
