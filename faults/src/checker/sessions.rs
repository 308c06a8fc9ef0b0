//! Sessions through the server's outages: a short outage of the kinds a
//! session rides out costs none, and a restart that forgot every session
//! has each of them given up as lost.

use std::collections::BTreeMap;

use crate::clock::secs;
use crate::history::{Event, Tag, What};
use crate::nemesis::Fault;

use super::{Bounds, Report};

/// Riding out: an outage of [`Bounds::ride_out_kinds`] no
/// longer than [`Bounds::ride_out`] must cost no session. A loss due to it
/// is heard by the time the loss deadline has passed since the outage's
/// start plus its length (the last confirmed renewal was sent before the
/// outage); a holder's `lost()` or a waiter's lost session in that window,
/// and before the next fault, is a violation.
pub(super) fn check_ride_out(events: &[&Event], faults: &[Fault], bounds: Bounds, report: &mut Report) {
    for (i, fault) in faults.iter().enumerate() {
        let Some(end) = fault.end else { continue };
        if !bounds.ride_out_kinds.contains(&fault.kind) || end.saturating_sub(fault.start) > bounds.ride_out {
            continue;
        }
        let next_fault = faults.get(i + 1).map_or(u64::MAX, |f| f.start);
        let until = end
            .saturating_add(bounds.loss_deadline)
            .min(next_fault)
            .min(bounds.stop);
        report.ridden_out.0 += 1;
        let losses: Vec<String> = events
            .iter()
            .filter(|e| e.t >= fault.start && e.t < until)
            .filter_map(|e| match &e.what {
                What::Lost { token } => Some(format!(
                    "{} heard lost() of token {token} at {:.3}s",
                    e.tag,
                    bounds.since_start(e.t)
                )),
                What::Error { message } if message.starts_with("lock:") && message.ends_with(" lost") => {
                    Some(format!("{} at {:.3}s: {message}", e.tag, bounds.since_start(e.t)))
                }
                _ => None,
            })
            .collect();
        if losses.is_empty() {
            report.ridden_out.1 += 1;
        } else {
            report.violations.push(format!(
                "a session lost to a short outage: {}, serving again {:.3}s later (ridden out up to {:.1}s): {}",
                bounds.fault_at(fault),
                secs(end - fault.start),
                secs(bounds.ride_out),
                losses.join("; ")
            ));
        }
    }
}

/// Forgotten sessions: after a restart that forgot every session (Redis
/// without persistence), each session open when the restart began must be
/// declared lost (docs/redis.md: "lockline then declares every session
/// lost"): its contender gives it up (`session-over`), or was killed, within
/// the recovery bound of the server's return. Not judged when the run ended
/// sooner.
pub(super) fn check_forgotten(events: &[&Event], faults: &[Fault], bounds: Bounds, report: &mut Report) {
    for fault in faults.iter().filter(|f| bounds.forgets_sessions.contains(&f.kind)) {
        let Some(end) = fault.end else { continue };
        let until = end.saturating_add(bounds.recovery);
        if until > bounds.stop {
            continue;
        }
        let mut open: BTreeMap<Tag, String> = BTreeMap::new();
        for event in events.iter().take_while(|e| e.t < fault.start) {
            match &event.what {
                What::Session { id } => {
                    open.insert(event.tag, id.clone());
                }
                What::SessionOver { .. } | What::Killed | What::Exited => {
                    open.remove(&event.tag);
                }
                _ => {}
            }
        }
        for (tag, id) in open {
            let first = events.iter().find(|e| {
                e.tag == tag
                    && e.t >= fault.start
                    && e.t <= until
                    && matches!(
                        e.what,
                        What::SessionOver { .. } | What::Session { .. } | What::Killed | What::Exited
                    )
            });
            // A contender killed (by a later fault) before it gave the
            // session up: its session cannot be judged.
            if first.is_some_and(|e| matches!(e.what, What::Killed | What::Exited)) {
                continue;
            }
            report.forgotten_sessions.0 += 1;
            if first.is_some() {
                report.forgotten_sessions.1 += 1;
            } else {
                report.violations.push(format!(
                    "a forgotten session lived on: {tag}'s session {id} was open when {} forgot every session, and was not given up as lost within {:.1}s of the server's return at {:.3}s",
                    bounds.fault_at(fault),
                    secs(bounds.recovery),
                    bounds.since_start(end)
                ));
            }
        }
    }
}
