//! Every child's grants merged into one run's figures ([`CrowdResult`]):
//! sorted by token, each handoff's latency, the holds that overlap.

use std::time::Duration;

use crate::latency::{ms, Latencies};

use super::protocol::{CrowdCounts, GrantRecord, Window};

/// Every child's grants merged.
#[derive(Debug, Clone, Default)]
pub(super) struct Merged {
    /// Grants within the window.
    pub(super) granted: usize,
    pub(super) handoff: Latencies,
    pub(super) overlaps: usize,
    pub(super) duplicate_tokens: usize,
}

/// Sorts the grants within `window` by token and measures each handoff.
pub(super) fn merge(mut records: Vec<GrantRecord>, window: Window) -> Merged {
    records.retain(|r| window.contains(r.granted_ns));
    records.sort_unstable_by_key(|r| r.token);
    let mut merged = Merged {
        granted: records.len(),
        ..Merged::default()
    };
    for pair in records.windows(2) {
        let (before, next) = (pair[0], pair[1]);
        if before.token == next.token {
            merged.duplicate_tokens += 1;
        } else if next.granted_ns < before.release_started_ns {
            merged.overlaps += 1;
        } else {
            merged
                .handoff
                .push(Duration::from_nanos(next.granted_ns - before.release_started_ns));
        }
    }
    merged
}

/// What one crowd run measured.
#[derive(Debug, Clone)]
pub struct CrowdResult {
    /// Child processes.
    pub processes: usize,
    /// Contenders over all of them.
    pub contenders: usize,
    /// The window's length.
    pub seconds: f64,
    /// The clients' counters within the window, summed over children.
    pub counts: CrowdCounts,
    /// Grants within the window (from the records).
    pub granted: usize,
    /// Handoff latency: each grant's time minus its predecessor's release start.
    pub handoff: Latencies,
    /// Grants that came before their predecessor (by token) began to release.
    pub overlaps: usize,
    /// Grants that carried the token of another.
    pub duplicate_tokens: usize,
}

impl CrowdResult {
    /// Grants per second within the window.
    pub fn grants_per_sec(&self) -> f64 {
        self.granted as f64 / self.seconds
    }

    /// Client-counted wakeups per release within the window.
    pub fn wakeups_per_release(&self) -> f64 {
        self.counts.wakeups as f64 / self.counts.releases.max(1) as f64
    }

    pub(super) fn p99_ms(&self) -> f64 {
        self.handoff.quantile(0.99).map_or(f64::NAN, ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crowd::protocol::record;

    #[test]
    fn merge_sorts_by_token_and_measures_handoffs_within_the_window() {
        let window = Window {
            start_ns: 1_000,
            end_ns: 10_000,
        };
        // As three children would report them, out of order.
        let records = vec![
            record(30, 3_000, 3_100),
            record(10, 500, 600), // before the window
            record(20, 1_000, 1_200),
            record(50, 6_000, 6_100),
            record(40, 4_000, 4_050),
            record(60, 10_000, 10_100), // at the end: outside
        ];
        let merged = merge(records, window);
        assert_eq!(merged.granted, 4);
        assert_eq!((merged.overlaps, merged.duplicate_tokens), (0, 0));
        // 3_000 - 1_200, 4_000 - 3_100, 6_000 - 4_050.
        assert_eq!(merged.handoff.len(), 3);
        assert_eq!(merged.handoff.quantile(0.0), Some(Duration::from_nanos(900)));
        assert_eq!(merged.handoff.quantile(0.5), Some(Duration::from_nanos(1_800)));
        assert_eq!(merged.handoff.quantile(1.0), Some(Duration::from_nanos(1_950)));
    }

    #[test]
    fn merge_counts_overlapping_holds_and_repeated_tokens() {
        let window = Window {
            start_ns: 0,
            end_ns: 100,
        };
        let merged = merge(
            vec![
                record(1, 10, 20),
                record(2, 15, 30),
                record(2, 40, 50),
                record(3, 60, 70),
            ],
            window,
        );
        assert_eq!((merged.overlaps, merged.duplicate_tokens), (1, 1));
        assert_eq!(merged.handoff.len(), 1);
    }
}
