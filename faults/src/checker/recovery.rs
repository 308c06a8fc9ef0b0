//! Recovery: a grant follows every fault within the bound, and no quiet
//! stretch without a fault goes longer than the bound without one.

use crate::clock::secs;
use crate::nemesis::Fault;

use super::sections::Section;
use super::{Bounds, Report};

/// Recovery after each fault: a grant within the recovery bound (after an
/// outage of the whole cluster, counted from its end).
pub(super) fn check_recovery(grants: &[&Section], faults: &[Fault], bounds: Bounds, report: &mut Report) {
    let mut worst: Option<(u64, String)> = None;
    for fault in faults {
        *report.faults.entry(fault.kind.to_string()).or_default() += 1;
        // After an outage of the whole cluster, recovery counts from its end.
        let from = if fault.kind.is_outage() {
            fault.end.unwrap_or(fault.start)
        } else {
            fault.start
        };
        match grants.iter().find(|s| s.grant > from) {
            Some(next) => {
                let took = next.grant - from;
                if worst.as_ref().is_none_or(|(w, _)| took > *w) {
                    worst = Some((took, bounds.fault_at(fault)));
                }
                if took > bounds.recovery {
                    report.violations.push(format!(
                        "slow recovery: no grant for {:.3}s after {} (bound {:.1}s)",
                        secs(took),
                        bounds.fault_at(fault),
                        secs(bounds.recovery)
                    ));
                }
            }
            // A fault whose recovery window outlasts the run cannot be
            // judged: the contenders were stopped before the bound ran out.
            None if from.saturating_add(bounds.recovery) > bounds.stop => {}
            None => report
                .violations
                .push(format!("no grant after {}", bounds.fault_at(fault))),
        }
    }
    report.worst_recovery = worst.map(|(t, kind)| (secs(t), kind));
}

/// Quiet stretches: no stretch without a fault goes longer than the
/// recovery bound without a grant.
pub(super) fn check_stalls(grants: &[&Section], faults: &[Fault], bounds: Bounds, report: &mut Report) {
    let mut grants: Vec<u64> = grants.iter().map(|s| s.grant).collect();
    grants.push(bounds.stop);
    for pair in grants.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        let faulted = faults
            .iter()
            .any(|f| f.start <= to && f.end.unwrap_or(u64::MAX) >= from);
        if faulted {
            continue;
        }
        let gap = to.saturating_sub(from);
        report.worst_quiet_gap = report.worst_quiet_gap.max(secs(gap));
        if gap > bounds.recovery {
            report.violations.push(format!(
                "stall: no grant for {:.3}s from {:.3}s with no fault active (bound {:.1}s)",
                secs(gap),
                bounds.since_start(from),
                secs(bounds.recovery)
            ));
        }
    }
}
