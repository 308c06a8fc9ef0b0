//! The lock-delay: after a fault took a holder's lock, a contender that
//! waited through it is granted the lock no sooner than the delay after the
//! fault.

use crate::clock::secs;
use crate::history::{Event, What};
use crate::nemesis::{Fault, FaultKind};

use super::sections::Section;
use super::{Bounds, Report};

/// Lock-delay: after a fault that took a holder's lock from it (the holder
/// killed, or told `lost()` after a pause, a blackhole or a reset), the next
/// grant must not come sooner than the lock-delay after the fault, when its
/// contender was already waiting at the fault and waited through (the server
/// removed the lost entry at the fault or later, and the waiter counts the
/// delay from then). Not judged when a contender ahead of it in the queue
/// (waiting since before it) gave up waiting (`lock_timeout`) in between: a
/// waiter that leaves cleanly hands on at once, lock-delay or not (its
/// give-up may be logged just after the grant it let in).
pub(super) fn check_lock_delay(
    events: &[&Event],
    sections: &[Section],
    faults: &[Fault],
    bounds: Bounds,
    report: &mut Report,
) {
    for fault in faults.iter().filter(|f| takes_the_lock(f.kind)) {
        let Some(taken) = section_taken(sections, fault) else {
            continue;
        };
        let Some(next) = sections.iter().find(|s| s.grant > fault.start && s.tag != taken.tag) else {
            continue;
        };
        if next.grant >= bounds.stop || !waited_through(events, next, fault) || one_ahead_gave_up(events, next, fault) {
            continue;
        }
        judge_delay(taken, next, fault, bounds, report);
    }
}

/// The faults that may take a holder's lock from it.
fn takes_the_lock(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::PauseHolder | FaultKind::KillHolder | FaultKind::BlackholeHolder | FaultKind::CutHolder
    )
}

/// The section whose lock `fault` took: its holder's at the fault, when the
/// holder was killed or heard `lost()` (not when it kept its lock through a
/// short pause or a reset its session outlived).
fn section_taken<'a>(sections: &'a [Section], fault: &Fault) -> Option<&'a Section> {
    let tag = fault.holder?;
    sections
        .iter()
        .find(|s| s.tag == tag && s.grant <= fault.start && s.end.is_none_or(|e| e >= fault.start))
        .filter(|section| fault.kind == FaultKind::KillHolder || section.lost.is_some())
}

/// Whether `next`'s contender was already waiting at the fault and went on
/// waiting until its grant.
fn waited_through(events: &[&Event], next: &Section, fault: &Fault) -> bool {
    events
        .iter()
        .rfind(|e| e.tag == next.tag && e.t < next.grant && !matches!(e.what, What::Lost { .. }))
        .is_some_and(|e| e.what == What::Waiting && e.t <= fault.start)
}

/// How long after the grant it let in a give-up may be logged: a contender
/// logs its `lock_timeout` once its removal has been answered, and the
/// removal is what lets the next one in, so the log may come after that
/// grant by a round trip and the scheduling of both processes.
const GIVE_UP_LOGGED_WITHIN: u64 = 1_000_000_000;

/// Whether a contender ahead of `next`'s in the queue (waiting since before
/// it) gave up waiting between the fault and `next`'s grant (its give-up
/// logged before that grant, or within [`GIVE_UP_LOGGED_WITHIN`] after it).
fn one_ahead_gave_up(events: &[&Event], next: &Section, fault: &Fault) -> bool {
    let next_waiting = events
        .iter()
        .rfind(|e| e.tag == next.tag && e.t <= fault.start && e.what == What::Waiting)
        .map_or(0, |e| e.t);
    events.iter().any(|e| {
        e.t > fault.start
            && e.t < next.grant + GIVE_UP_LOGGED_WITHIN
            && e.what == What::Timeout
            && events
                .iter()
                .rfind(|w| w.tag == e.tag && w.t < e.t && w.what == What::Waiting)
                .is_some_and(|w| w.t < next_waiting)
    })
}

/// Counts one grant checked against the lock-delay, and reports it when it
/// came sooner than the delay after the fault.
fn judge_delay(taken: &Section, next: &Section, fault: &Fault, bounds: Bounds, report: &mut Report) {
    let gap = next.grant - fault.start;
    report.lock_delay_checks += 1;
    report.lock_delay_shortest = Some(report.lock_delay_shortest.map_or(secs(gap), |s: f64| s.min(secs(gap))));
    if gap < bounds.lock_delay {
        report.violations.push(format!(
            "lock-delay broken: {} was granted token {} at {:.3}s, {:.3}s after {} took token {}'s lock (lock-delay {:.1}s)",
            next.tag,
            next.token,
            bounds.since_start(next.grant),
            secs(gap),
            bounds.fault_at(fault),
            taken.token,
            secs(bounds.lock_delay)
        ));
    }
}
