//! The checker: reads a run's history and says what went wrong.
//!
//! - **Register**: the register never accepted a lower token after a higher one
//!   (writes taken in the order of their times), and grants (in the order they
//!   happened) carry strictly increasing tokens.
//! - **Overlaps**: a critical section runs from a grant until its holder stops
//!   using the lock (`lost()` seen, release or drop started, process killed).
//!   When a later grant falls inside an earlier section, the overlap is
//!   *explained* only if every write the earlier holder made after that grant
//!   was rejected (fenced), or it made none (it was frozen). Where the test's
//!   token register decided ([`Fence::Token`](crate::history::Fence::Token)), a frozen holder's write
//!   accepted before any newer holder wrote counts as fenced too (the resource
//!   saw the holders in token order); where the backend's own fence decided
//!   ([`Fence::Held`](crate::history::Fence::Held): the write commits only while the lock is held), no
//!   write of the earlier holder may land after the later grant at all.
//! - **`lost()` first**: a holder whose process ran (was not SIGSTOPped) must
//!   have seen `lost()` before anyone else was granted the lock: any overlap
//!   with a running holder is a violation, whatever its writes; silently
//!   blackholed holders are the case this is about. One bounded exception,
//!   [`Bounds::reset_notice`], for the faults of [`Bounds::reset_kinds`]:
//!   where the server frees a lock the moment its holder's connection resets
//!   (lockline-sql: the connection holds the lock), a holder whose
//!   connections were reset (a cut, a server crash) learns it only from a
//!   later request, or when its loss deadline passes; where a Redis server
//!   restarted without persistence forgot every session, a holder learns it
//!   at its next renewal. It must stop holding within that bound of the
//!   reset (of the server's return, [`Bounds::reset_at_end`]); every write
//!   it made after the next grant must still have been refused by a fence
//!   that decides on the lock ([`Fence::Held`](crate::history::Fence::Held)), and, where the test's token
//!   register decided, accepted only before any newer holder wrote (the
//!   resource saw the holders in token order, as for a frozen holder). Such
//!   cases are counted, with the worst one named, not hidden.
//! - **Riding out**: an outage of [`Bounds::ride_out_kinds`] (a Redis
//!   restart with its data, a pause of the server, a reset of a holder's
//!   connections) no longer than
//!   [`Bounds::ride_out`] costs no session: no holder hears `lost()` and no
//!   waiter fails with a lost session because of it.
//! - **Recovery**: after every fault a grant follows within the bound (TTL +
//!   election time + slack), counted from the fault's start (from its end for
//!   an outage of the whole cluster), and no quiet stretch without a fault
//!   goes longer than the bound without a grant.
//! - **No hangs**: opening a session, `lock_timeout` and `release()` return
//!   within their deadlines (plus 5 s); the contenders report when they do not.
//! - **Orphans** (checked by the runner at the end): no entry remains.
//!
//! **Lock modes** (`--modes`): a holder of a lock-mode resource holds in
//! one mode at a time; each grant is cut into sections at its conversions
//! (a down-conversion from the moment it was asked for, an up-conversion
//! from the moment it was granted). Two sections *overlap* only when their
//! modes are incompatible (EX beside anyone but NL, PW beside anything but
//! CR and NL, PR beside CW, PW or EX, CW beside PR, PW or EX); such an
//! overlap is judged exactly as two mutex holders' (`lost()` first, the
//! frozen and reset allowances, the earlier holder's writes fenced), an
//! up-conversion counting as a grant. Sections in compatible modes are
//! counted, never judged. PW and EX holders write the register (a key of the
//! lock's own store per write, with `write_if_held`: [`Fence::Held`](crate::history::Fence::Held)); its
//! order rule applies to their writes unchanged. Tokens: a section that
//! took a fresh token (a grant, an up-conversion to CW, PW or EX) carries
//! one above every incompatible section begun before it. Recovery and
//! stalls count grants in any mode but NL (an NL request waits for nobody).

//!
//! Each rule is a function of its own, in a module per family: `fencing`
//! (the register and the tokens), `exclusion` (overlaps, `lost()` first,
//! blackholed holders), `sessions` (riding out, forgotten sessions),
//! `recovery` (recovery and stalls) and `lock_delay`; `sections` cuts the
//! history into critical sections for them.

mod bounds;
mod exclusion;
mod fencing;
mod lock_delay;
mod recovery;
mod report;
mod sections;
mod sessions;

use crate::history::{Event, Write};
use crate::nemesis::Fault;

pub use self::bounds::Bounds;
pub use self::report::{add_violation, Report};

use self::exclusion::{check_blackholed_holders, check_overlaps};
use self::fencing::{check_mode_tokens, check_mutex_tokens, check_register};
use self::lock_delay::check_lock_delay;
use self::recovery::{check_recovery, check_stalls};
use self::sections::{sections_of, Section};
use self::sessions::{check_forgotten, check_ride_out};

/// Checks a history: each rule is a function of its own, run in this order,
/// each adding what it finds to the report.
pub fn check(events: &[Event], writes: &[Write], faults: &[Fault], bounds: Bounds) -> Report {
    let mut report = Report::default();
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| e.t);
    let (sections, paused) = sections_of(&events, bounds, &mut report);
    // The register and the tokens. Writes in the order of their times: the
    // register's own are recorded in that order already; a backend-fenced
    // write is reported by its writer after its commit, possibly after a
    // newer holder's.
    let mut writes: Vec<&Write> = writes.iter().collect();
    writes.sort_by_key(|w| w.t);
    check_register(&writes, bounds, &mut report);
    check_mutex_tokens(&events, &sections, bounds, &mut report);
    check_mode_tokens(&sections, bounds, &mut report);
    check_overlaps(&sections, &writes, &paused, faults, bounds, &mut report);
    check_blackholed_holders(&sections, faults, &mut report);
    check_ride_out(&events, faults, bounds, &mut report);
    check_forgotten(&events, faults, bounds, &mut report);
    // Grants that show the lock can be had, for recovery and stalls.
    let grants: Vec<&Section> = sections.iter().filter(|s| s.counts_as_grant()).collect();
    check_recovery(&grants, faults, bounds, &mut report);
    if bounds.lock_delay > 0 {
        check_lock_delay(&events, &sections, faults, bounds, &mut report);
    }
    check_stalls(&grants, faults, bounds, &mut report);
    report
}

#[cfg(test)]
mod tests;
