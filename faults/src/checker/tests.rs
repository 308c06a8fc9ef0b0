//! The checker's tests, a module per family of rules, over histories built
//! with the small builders below: each test states the events, writes,
//! faults and bounds it is about, and what the checker must find.

mod exclusion;
mod fencing;
mod lock_delay;
mod modes;
mod recovery;
mod sessions;

use lockline::LockMode;

use super::{check, Bounds, Report};
use crate::history::{Event, Fence, Tag, What, Write};
use crate::nemesis::{Fault, FaultKind};

/// A second, in the history's nanoseconds.
const S: u64 = 1_000_000_000;

/// Contender `slot`'s first process.
fn tag(slot: usize) -> Tag {
    Tag { slot, incarnation: 0 }
}

/// Contender `slot`'s event at `t`.
fn ev(t: u64, slot: usize, what: What) -> Event {
    Event {
        t,
        tag: tag(slot),
        what,
    }
}

/// A mutex grant.
fn grant(t: u64, slot: usize, token: u64) -> Event {
    ev(
        t,
        slot,
        What::Grant {
            token,
            key: String::new(),
            mode: None,
        },
    )
}

/// A lock-mode grant.
fn granted_in(t: u64, slot: usize, token: u64, mode: LockMode) -> Event {
    ev(
        t,
        slot,
        What::Grant {
            token,
            key: String::new(),
            mode: Some(mode),
        },
    )
}

/// A conversion asked for.
fn converting(t: u64, slot: usize, from: LockMode, to: LockMode) -> Event {
    ev(t, slot, What::Converting { from, to })
}

/// A conversion granted.
fn converted(t: u64, slot: usize, from: LockMode, to: LockMode, token: u64) -> Event {
    ev(t, slot, What::Converted { from, to, token })
}

/// An explicit release.
fn release(t: u64, slot: usize, token: u64) -> Event {
    ev(t, slot, What::Release { token, dropped: false })
}

/// A release by dropping the guard.
fn dropped(t: u64, slot: usize, token: u64) -> Event {
    ev(t, slot, What::Release { token, dropped: true })
}

/// `lost()` heard for `token`.
fn lost(t: u64, slot: usize, token: u64) -> Event {
    ev(t, slot, What::Lost { token })
}

/// A session opened.
fn session(t: u64, slot: usize, id: &str) -> Event {
    ev(t, slot, What::Session { id: id.into() })
}

/// A session given up.
fn session_over(t: u64, slot: usize, id: &str) -> Event {
    ev(t, slot, What::SessionOver { id: id.into() })
}

/// A write to the test's token register.
fn write(t: u64, slot: usize, token: u64, accepted: bool) -> Write {
    Write {
        t,
        tag: tag(slot),
        token,
        seq: 0,
        accepted,
        fence: Fence::Token,
        unsure: false,
    }
}

/// A write fenced by the backend on the lock itself.
fn held_write(t: u64, slot: usize, token: u64, accepted: bool) -> Write {
    Write {
        fence: Fence::Held,
        ..write(t, slot, token, accepted)
    }
}

/// A fault dealt to contender `slot`'s holder.
fn holder_fault(kind: FaultKind, slot: usize, start: u64, end: Option<u64>) -> Fault {
    Fault {
        kind,
        target: tag(slot).to_string(),
        holder: Some(tag(slot)),
        start,
        end,
    }
}

/// A fault dealt to the one server, from `start` to `end`.
fn server_fault(kind: FaultKind, start: u64, end: u64) -> Fault {
    Fault {
        kind,
        target: "the server".into(),
        holder: None,
        start,
        end: Some(end),
    }
}

/// The bounds of a backend that frees nothing without its holder's
/// knowing, for a run stopped at `stop`: recovery within 8 s.
fn bounds(stop: u64) -> Bounds {
    Bounds {
        start: 0,
        stop,
        recovery: 8 * S,
        reset_notice: 0,
        reset_kinds: &[],
        reset_at_end: false,
        ride_out: 0,
        ride_out_kinds: &[],
        loss_deadline: 2 * S,
        forgets_sessions: &[],
        lock_delay: 0,
    }
}

/// PostgreSQL's: a reset of a holder's connections frees its lock, and
/// the holder may take `notice` to hear of it.
fn postgres_resets(stop: u64, notice: u64) -> Bounds {
    Bounds {
        reset_notice: notice,
        reset_kinds: crate::Backend::Postgres.forgets(),
        ..bounds(stop)
    }
}

/// The history `events`, without writes or faults, checked with
/// [`bounds`]`(stop)`.
fn check_events(events: &[Event], stop: u64) -> Report {
    check(events, &[], &[], bounds(stop))
}

/// How many violations begin with `head`.
fn starts_with(report: &Report, head: &str) -> usize {
    report.violations.iter().filter(|v| v.starts_with(head)).count()
}

/// Whether a violation begins with `head`.
fn any_starts_with(report: &Report, head: &str) -> bool {
    starts_with(report, head) > 0
}

/// The report has no violation.
#[track_caller]
fn assert_clean(report: &Report) {
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
}

/// The report's first violation begins with `head`.
#[track_caller]
fn assert_first(report: &Report, head: &str) {
    assert!(
        report.violations.first().is_some_and(|v| v.starts_with(head)),
        "{report}"
    );
}
