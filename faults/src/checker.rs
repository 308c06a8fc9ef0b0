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
//!   token register decided ([`Fence::Token`]), a frozen holder's write
//!   accepted before any newer holder wrote counts as fenced too (the resource
//!   saw the holders in token order); where the backend's own fence decided
//!   ([`Fence::Held`]: the write commits only while the lock is held), no
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
//!   that decides on the lock ([`Fence::Held`]), and, where the test's token
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
//! lock's own store per write, with `write_if_held`: [`Fence::Held`]); its
//! order rule applies to their writes unchanged. Tokens: a section that
//! took a fresh token (a grant, an up-conversion to CW, PW or EX) carries
//! one above every incompatible section begun before it. Recovery and
//! stalls count grants in any mode but NL (an NL request waits for nobody).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use lockline::LockMode;

use crate::clock::secs;
use crate::history::{Event, Fence, Tag, What, Write};
use crate::nemesis::{Fault, FaultKind};

/// One critical section: a holding interval in one mode. A lock-mode
/// holder's grant is cut into one section per mode it held in, at each
/// conversion.
#[derive(Debug, Clone)]
struct Section {
    tag: Tag,
    token: u64,
    /// When it began: the grant, or the conversion that began it.
    grant: u64,
    end: Option<u64>,
    lost: Option<u64>,
    /// The mode held; `None` for a mutex (it excludes everyone, as EX).
    mode: Option<LockMode>,
    /// Begun by a conversion rather than a grant.
    converted: bool,
    /// Its token was taken when it began (a grant, an up-conversion to CW,
    /// PW or EX): above every token granted before.
    fresh: bool,
    /// Ended by an up-conversion with a fresh token: that token. The server
    /// converted it there, in its order of grants, whenever its holder
    /// heard of it.
    converted_at: Option<u64>,
}

impl Section {
    /// Whether two holders in these sections may hold at once.
    fn compatible(&self, other: &Section) -> bool {
        match (self.mode, other.mode) {
            (Some(a), Some(b)) => a.compatible(b),
            _ => false,
        }
    }

    /// A grant that shows the lock can be had (not a conversion, nor an NL
    /// grant, which waits for nobody).
    fn counts_as_grant(&self) -> bool {
        !self.converted && self.mode != Some(LockMode::Nl)
    }

    /// The mode, for messages.
    fn in_mode(&self) -> String {
        self.mode.map_or_else(String::new, |m| format!(" in {m}"))
    }

    /// How it began, for messages.
    fn began(&self) -> &'static str {
        if self.converted {
            "converted"
        } else {
            "granted"
        }
    }
}

/// What the checker found: the figures and every violation.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Grants (critical sections; a lock-mode grant counts once, however
    /// often it converts).
    pub grants: usize,
    /// Lock-mode runs: grants by the mode granted.
    pub modes: BTreeMap<String, usize>,
    /// Lock-mode runs: conversions, up (granted) and down.
    pub conversions: (usize, usize),
    /// Lock-mode runs: up-conversions that failed with `Error::Deadlock`.
    pub deadlocks: usize,
    /// Lock-mode runs: up-conversions whose `convert_timeout` ran out.
    pub convert_timeouts: usize,
    /// Lock-mode runs: pairs of holders whose sections overlapped in
    /// compatible modes (sharing, as the matrix allows).
    pub overlaps_compatible: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Overlapping pairs of critical sections.
    pub overlaps_raw: usize,
    /// Overlaps where every write of the earlier holder was rejected.
    pub overlaps_fenced: usize,
    /// Overlaps where the earlier holder (frozen) wrote nothing.
    pub overlaps_idle: usize,
    /// Writes accepted by the register.
    pub writes_accepted: usize,
    /// Writes the register rejected.
    pub writes_rejected: usize,
    /// Writes whose writer got no answer to its commit, read back from the
    /// backend's store (set by the runner).
    pub writes_read_back: usize,
    /// Holders that saw `lost()`.
    pub lost: usize,
    /// Holders silently blackholed, and how many of them saw `lost()` before the next grant.
    pub blackholed_holders: (usize, usize),
    /// Holders whose lock the server freed without their knowing (their
    /// connections reset, a restart without data) and who still held when
    /// the next holder was granted, within [`Bounds::reset_notice`] of it,
    /// and the longest they held on after it (s).
    pub reset_holders_late: (usize, f64),
    /// The case of that longest hold, in words.
    pub reset_worst: String,
    /// Outages of the server short enough to be ridden out (see
    /// [`Bounds::ride_out`]), and how many of them cost no session.
    pub ridden_out: (usize, usize),
    /// Sessions open when the server forgot every session (see
    /// [`Bounds::forgets_sessions`]), and how many of them their contender
    /// gave up as lost in time.
    pub forgotten_sessions: (usize, usize),
    /// The longest time from a fault to the next grant (s) and the fault's kind.
    pub worst_recovery: Option<(f64, String)>,
    /// The longest gap between grants with no fault active (s).
    pub worst_quiet_gap: f64,
    /// `lock_timeout` calls that ran out.
    pub timeouts: usize,
    /// Errors the contenders reported (acquire, session, release), by their first 90 characters.
    pub errors: BTreeMap<String, usize>,
    /// Sessions opened.
    pub sessions: usize,
    /// Entries left at the end (reported by the runner).
    pub orphans: usize,
    /// Lock-delay mode: grants checked against the lock-delay (each the next
    /// grant after a holder lost the lock to a fault, to a contender that
    /// waited through it).
    pub lock_delay_checks: usize,
    /// Lock-delay mode: the shortest time from such a fault to that grant (s).
    pub lock_delay_shortest: Option<f64>,
    /// Every violation, in words, with times relative to the run's start.
    pub violations: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "grants: {}   sessions opened: {}", self.grants, self.sessions)?;
        if !self.modes.is_empty() {
            let modes: Vec<String> = LockMode::ALL
                .iter()
                .map(|m| format!("{m} {}", self.modes.get(m.label()).copied().unwrap_or(0)))
                .collect();
            writeln!(
                f,
                "lock modes granted: {}; conversions: {} up, {} down; deadlocks: {}; conversion timeouts: {}; compatible holders side by side: {}",
                modes.join(", "),
                self.conversions.0,
                self.conversions.1,
                self.deadlocks,
                self.convert_timeouts,
                self.overlaps_compatible
            )?;
        }
        let faults: Vec<String> = self.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(
            f,
            "faults: {} ({})",
            self.faults.values().sum::<usize>(),
            faults.join(", ")
        )?;
        writeln!(
            f,
            "overlaps: {} raw, {} explained ({} fenced, {} frozen and idle), {} unexplained",
            self.overlaps_raw,
            self.overlaps_fenced + self.overlaps_idle,
            self.overlaps_fenced,
            self.overlaps_idle,
            self.overlaps_raw - self.overlaps_fenced - self.overlaps_idle
        )?;
        writeln!(
            f,
            "register writes: {} accepted, {} rejected ({} without an answer, read back)",
            self.writes_accepted, self.writes_rejected, self.writes_read_back
        )?;
        writeln!(
            f,
            "lost() seen: {}   blackholed holders: {} ({} saw lost() before the next grant)",
            self.lost, self.blackholed_holders.0, self.blackholed_holders.1
        )?;
        if self.reset_holders_late.0 > 0 {
            writeln!(
                f,
                "holders still holding at the next grant after the server freed their lock (a reset, a restart without data): {} (stopped at most {:.2}s after: {}; no later write landed after a newer holder's)",
                self.reset_holders_late.0, self.reset_holders_late.1, self.reset_worst
            )?;
        }
        if self.ridden_out.0 > 0 {
            writeln!(
                f,
                "short outages of the server to ride out: {} ({} cost no session)",
                self.ridden_out.0, self.ridden_out.1
            )?;
        }
        if self.forgotten_sessions.0 > 0 {
            writeln!(
                f,
                "sessions open when the server forgot them (a restart, a crash, a failover): {} ({} declared lost and given up)",
                self.forgotten_sessions.0, self.forgotten_sessions.1
            )?;
        }
        match &self.worst_recovery {
            Some((s, kind)) => writeln!(f, "worst recovery: {s:.2}s (after {kind})")?,
            None => writeln!(f, "worst recovery: -")?,
        }
        writeln!(f, "longest quiet gap between grants: {:.2}s", self.worst_quiet_gap)?;
        writeln!(
            f,
            "lock_timeout expiries: {}   contender errors: {}",
            self.timeouts,
            self.errors.values().sum::<usize>()
        )?;
        for (error, n) in &self.errors {
            writeln!(f, "  {n:4} x {error}")?;
        }
        writeln!(f, "entries left at the end: {}", self.orphans)?;
        if self.lock_delay_checks > 0 {
            writeln!(
                f,
                "lock-delay: {} grant(s) after an involuntary loss checked, the soonest {:.2}s after its fault",
                self.lock_delay_checks,
                self.lock_delay_shortest.unwrap_or_default()
            )?;
        }
        if self.violations.is_empty() {
            writeln!(f, "violations: 0")
        } else {
            writeln!(f, "violations: {}", self.violations.len())?;
            for violation in &self.violations {
                writeln!(f, "  - {violation}")?;
            }
            Ok(())
        }
    }
}

/// What the checker needs besides the history.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// The run's start (ns), for relative times in messages.
    pub start: u64,
    /// When the contenders were told to stop (ns): the end of the checked window.
    pub stop: u64,
    /// TTL + election time + slack (ns).
    pub recovery: u64,
    /// How long after its connections were reset (a cut, a crash of the
    /// server) a running holder may go on holding (ns): 0 where a reset frees
    /// nothing on the server (etcd, ZooKeeper: the session outlives its
    /// connection); on a backend whose server frees the lock with the
    /// connection, the time the holder takes to notice (its next request).
    pub reset_notice: u64,
    /// The faults that free a holder's lock on the server without its
    /// knowing, for which [`reset_notice`](Self::reset_notice) applies:
    /// PostgreSQL's resets of a holder's connections, a restart of a Redis
    /// server without persistence; none elsewhere.
    pub reset_kinds: &'static [FaultKind],
    /// Whether such a fault frees the locks when it ends (a Redis server
    /// back without its data) rather than when it begins (a reset).
    pub reset_at_end: bool,
    /// The longest outage of the server (ns, from its start to the server's
    /// serving again) of [`ride_out_kinds`](Self::ride_out_kinds) that must
    /// cost no session.
    pub ride_out: u64,
    /// The outages a session must ride out when short (a Redis restart with
    /// its data, a pause of the server, a reset of a holder's connections);
    /// none elsewhere.
    pub ride_out_kinds: &'static [FaultKind],
    /// The sessions' loss deadline (ns): how long after an outage's start a
    /// loss may still be due to it.
    pub loss_deadline: u64,
    /// The faults after which the server has forgotten every session (a
    /// Redis server restarted without persistence): each session open when
    /// one began must be declared lost, so that its contender gives it up,
    /// within the recovery bound of the server's return.
    pub forgets_sessions: &'static [FaultKind],
    /// The contenders' lock-delay (ns; 0: none, and nothing to check).
    pub lock_delay: u64,
}

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

/// Paused spans (start, end) per process.
type Paused = BTreeMap<Tag, Vec<(u64, u64)>>;

/// The critical sections (from a grant or a conversion to its end), sorted
/// by their start, and the spans each process was paused. Counts grants,
/// modes, conversions, losses, timeouts, sessions and errors on the way, and
/// reports a conversion by a process that did not hold what it converted
/// from, and a hung call.
fn sections_of(events: &[&Event], bounds: Bounds, report: &mut Report) -> (Vec<Section>, Paused) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
    let mut sections: Vec<Section> = Vec::new();
    let mut open: BTreeMap<Tag, usize> = BTreeMap::new();
    let mut paused: Paused = BTreeMap::new();
    for event in events {
        let close = |sections: &mut Vec<Section>, open: &mut BTreeMap<Tag, usize>, t: u64| {
            if let Some(i) = open.remove(&event.tag) {
                sections[i].end.get_or_insert(t);
            }
        };
        match &event.what {
            What::Grant { token, mode, .. } => {
                close(&mut sections, &mut open, event.t);
                open.insert(event.tag, sections.len());
                if let Some(mode) = mode {
                    *report.modes.entry(mode.label().to_owned()).or_default() += 1;
                }
                sections.push(Section {
                    tag: event.tag,
                    token: *token,
                    grant: event.t,
                    end: None,
                    lost: None,
                    mode: *mode,
                    converted: false,
                    fresh: true,
                    converted_at: None,
                });
            }
            What::Converted { from, to, token } => {
                let up = !to.is_down_from(*from);
                if up {
                    report.conversions.0 += 1;
                } else {
                    report.conversions.1 += 1;
                }
                match open.get(&event.tag) {
                    Some(&i) if sections[i].mode == Some(*from) => {
                        sections[i].end.get_or_insert(event.t);
                        if up && to.writes() {
                            sections[i].converted_at = Some(*token);
                        }
                        open.insert(event.tag, sections.len());
                        sections.push(Section {
                            tag: event.tag,
                            token: *token,
                            grant: event.t,
                            end: None,
                            lost: None,
                            mode: Some(*to),
                            converted: true,
                            fresh: up && to.writes(),
                            converted_at: None,
                        });
                    }
                    held => report.violations.push(format!(
                        "{} reported a conversion from {from} to {to} at {:.3}s while holding {}",
                        event.tag,
                        rel(event.t),
                        held.map_or("nothing".to_owned(), |&i| format!(
                            "in {}",
                            sections[i].mode.map_or("a mutex".to_owned(), |m| m.to_string())
                        ))
                    )),
                }
            }
            What::Deadlock { .. } => report.deadlocks += 1,
            What::ConvertTimeout { .. } => report.convert_timeouts += 1,
            What::Lost { token } => {
                report.lost += 1;
                if let Some(section) = sections
                    .iter_mut()
                    .rev()
                    .find(|s| s.tag == event.tag && s.token == *token)
                {
                    section.lost.get_or_insert(event.t);
                    section.end.get_or_insert(event.t);
                }
                open.remove(&event.tag);
            }
            What::Release { .. } | What::Killed | What::Exited | What::Idle | What::Closed => {
                close(&mut sections, &mut open, event.t)
            }
            What::Paused => paused.entry(event.tag).or_default().push((event.t, u64::MAX)),
            What::Resumed => {
                if let Some(last) = paused.entry(event.tag).or_default().last_mut() {
                    last.1 = event.t;
                }
            }
            What::Timeout => report.timeouts += 1,
            What::Session { .. } => report.sessions += 1,
            What::Error { message } if message.starts_with("hang") => {
                report
                    .violations
                    .push(format!("{} at {:.3}s: {message}", event.tag, rel(event.t)));
                *report.errors.entry(error_kind(message)).or_default() += 1;
            }
            What::Error { message } => {
                *report.errors.entry(error_kind(message)).or_default() += 1;
            }
            _ => {}
        }
    }
    sections.sort_by_key(|s| s.grant);
    report.grants = sections.iter().filter(|s| !s.converted).count();
    (sections, paused)
}

/// A write whose writer got no answer counts as landed, unless read back.
fn landed(w: &Write) -> bool {
    w.accepted || w.unsure
}

/// The register: no write lands with a token below one that landed before
/// it (one violation per grant that did, with a count).
fn check_register(writes: &[&Write], bounds: Bounds, report: &mut Report) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
    let mut highest = 0;
    // One violation per grant that wrote below the highest, with a count.
    let mut backwards: Vec<((Tag, u64), u64, u64, usize)> = Vec::new();
    for write in writes {
        if landed(write) {
            if write.token < highest {
                match backwards.iter_mut().find(|(g, ..)| *g == (write.tag, write.token)) {
                    Some((.., count)) => *count += 1,
                    None => backwards.push(((write.tag, write.token), write.t, highest, 1)),
                }
            }
            highest = highest.max(write.token);
            report.writes_accepted += 1;
        } else {
            report.writes_rejected += 1;
        }
    }
    for ((tag, token), t, above, count) in backwards {
        let more = if count > 1 {
            format!(" ({} more of that grant's writes after it)", count - 1)
        } else {
            String::new()
        };
        report.violations.push(format!(
            "register accepted token {token} from {tag} at {:.3}s after token {above}{more}",
            rel(t)
        ));
    }
}

/// Mutex grants in the order they happened carry strictly increasing
/// tokens.
fn check_mutex_tokens(events: &[&Event], sections: &[Section], bounds: Bounds, report: &mut Report) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
    let mutex: Vec<&Section> = sections.iter().filter(|s| s.mode.is_none()).collect();
    for pair in mutex.windows(2) {
        if pair[1].token == pair[0].token && pair[1].tag == pair[0].tag {
            let released = events
                .iter()
                .find(|e| e.tag == pair[0].tag && e.t >= pair[0].grant && matches!(e.what, What::Release { .. }))
                .map_or("never released".to_owned(), |e| format!("released at {:.3}s", rel(e.t)));
            report.violations.push(format!(
                "fencing token did not increase: {} was granted token {} again at {:.3}s (first granted at {:.3}s, {released}; nobody held it between)",
                pair[1].tag,
                pair[1].token,
                rel(pair[1].grant),
                rel(pair[0].grant)
            ));
        } else if pair[1].token <= pair[0].token {
            report.violations.push(format!(
                "fencing token did not increase: {} granted token {} at {:.3}s after {} was granted token {} at {:.3}s",
                pair[1].tag,
                pair[1].token,
                rel(pair[1].grant),
                pair[0].tag,
                pair[0].token,
                rel(pair[0].grant)
            ));
        }
    }
}

/// Overlaps of incompatible sections: a stale holder's writes after the
/// next grant must have been refused (unfenced overlap), and its `lost()`
/// must come before the next grant unless it was frozen or a reset freed
/// its lock without its knowing (lost() after the next grant).
fn check_overlaps(
    sections: &[Section],
    writes: &[&Write],
    paused: &Paused,
    faults: &[Fault],
    bounds: Bounds,
    report: &mut Report,
) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
    let was_paused = |tag: Tag, from: u64, to: u64| {
        paused
            .get(&tag)
            .is_some_and(|spans| spans.iter().any(|&(a, b)| a <= to && b >= from))
    };

    // One "lost() after the next grant" per stale section: the first grant it overlaps.
    let mut late_reported: Vec<(Tag, u64)> = Vec::new();
    for (i, a) in sections.iter().enumerate() {
        let end = a.end.unwrap_or(bounds.stop);
        for b in sections[i + 1..].iter().take_while(|b| b.grant < end) {
            if b.tag == a.tag {
                continue;
            }
            if a.compatible(b) {
                report.overlaps_compatible += 1;
                continue;
            }
            // The server converted `a` before it granted `b` (token order):
            // `a`'s old mode ended there, though its holder heard of it
            // after `b` was granted. Its new mode is checked against `b` in
            // turn.
            if a.converted_at.is_some_and(|converted| converted < b.token) {
                continue;
            }
            report.overlaps_raw += 1;
            let after: Vec<&Write> = writes
                .iter()
                .copied()
                .filter(|w| w.tag == a.tag && w.token == a.token && w.t > b.grant)
                .collect();
            let frozen = was_paused(a.tag, a.grant, b.grant);
            let reset = freed_unknowingly(a, b, faults, bounds);
            let noticed = reset.filter(|&r| bounds.reset_notice > 0 && end <= r.saturating_add(bounds.reset_notice));
            // A frozen holder cannot be told, nor one the server forgot
            // before its next request; the resource is safe if it saw the
            // holders in token order: a stale write accepted before any
            // write of a newer holder is ordered, not overlapping.
            let untold = frozen || noticed.is_some();
            let newer_wrote = writes
                .iter()
                .filter(|w| landed(w) && w.token > a.token)
                .map(|w| w.t)
                .min()
                .unwrap_or(u64::MAX);
            let accepted = after
                .iter()
                .filter(|w| landed(w) && !(untold && w.fence == Fence::Token && w.t < newer_wrote))
                .count();
            let when_lost = match a.lost {
                Some(l) => format!("its lost() fired {:.3}s later", secs(l.saturating_sub(b.grant))),
                None => "its lost() never fired".to_owned(),
            };
            let context = faults_during(a, b, faults, bounds);
            if accepted > 0 {
                report.violations.push(format!(
                    "unfenced overlap: {} (token {}{}) had {accepted} write(s) accepted after {} (token {}) was {} at {:.3}s; {when_lost}; {context}",
                    a.tag,
                    a.token,
                    a.in_mode(),
                    b.tag,
                    b.token,
                    b.began(),
                    rel(b.grant)
                ));
            } else if after.is_empty() {
                report.overlaps_idle += 1;
            } else {
                report.overlaps_fenced += 1;
            }
            if !frozen && !late_reported.contains(&(a.tag, a.token)) {
                late_reported.push((a.tag, a.token));
                if let Some(r) = noticed {
                    report.reset_holders_late.0 += 1;
                    let held_on = secs(end.saturating_sub(r));
                    if held_on >= report.reset_holders_late.1 {
                        report.reset_holders_late.1 = held_on;
                        let how = if a.lost.is_some() { "saw lost()" } else { "stopped" };
                        report.reset_worst = format!(
                            "{} (token {}) {how} at {:.3}s, its lock freed by the server at {:.3}s, {} granted at {:.3}s; {context}",
                            a.tag,
                            a.token,
                            rel(end),
                            rel(r),
                            b.tag,
                            rel(b.grant)
                        );
                    }
                } else {
                    report.violations.push(format!(
                    "lost() after the next grant: {} (token {}{}, {} {:.3}s, not frozen) still held when {} (token {}{}) was {} at {:.3}s; {when_lost}; {} of its writes rejected; {context}",
                    a.tag,
                    a.token,
                    a.in_mode(),
                    a.began(),
                    rel(a.grant),
                    b.tag,
                    b.token,
                    b.in_mode(),
                    b.began(),
                    rel(b.grant),
                    after.len() - accepted,
                ));
                }
            }
        }
    }
}

/// When a fault freed holder `a`'s lock on the server without its
/// knowing, before `b`'s grant: a fault that began before that grant
/// and lasted into the holder's section (a holder granted while a
/// crash of the server is under way is reset as well), counted
/// from the later of the moment the server freed the lock (the
/// reset, or the server's return without its data) and the
/// holder's grant.
fn freed_unknowingly(a: &Section, b: &Section, faults: &[Fault], bounds: Bounds) -> Option<u64> {
    faults
        .iter()
        .filter(|f| bounds.reset_kinds.contains(&f.kind) && f.holder.is_none_or(|h| h == a.tag))
        .filter(|f| f.start <= b.grant && f.end.unwrap_or(u64::MAX) >= a.grant)
        .map(|f| {
            let freed = if bounds.reset_at_end {
                f.end.unwrap_or(f.start)
            } else {
                f.start
            };
            freed.max(a.grant)
        })
        .min()
}

/// The faults active between `a`'s grant and `b`'s, for messages.
fn faults_during(a: &Section, b: &Section, faults: &[Fault], bounds: Bounds) -> String {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
    let during = faults
        .iter()
        .filter(|f| f.start <= b.grant && f.end.unwrap_or(u64::MAX) >= a.grant)
        .map(|f| format!("{} {} at {:.3}s", f.kind, f.target, rel(f.start)))
        .collect::<Vec<_>>();
    if during.is_empty() {
        "no fault active".to_owned()
    } else {
        format!("during {}", during.join(", "))
    }
}

/// Blackholed holders: counts those whose `lost()` (or end) came before
/// the next incompatible grant.
fn check_blackholed_holders(sections: &[Section], faults: &[Fault], report: &mut Report) {
    let blackholes: Vec<&Fault> = faults.iter().filter(|f| f.kind == FaultKind::BlackholeHolder).collect();
    for fault in &blackholes {
        let Some(tag) = fault.holder else { continue };
        let Some(section) = sections
            .iter()
            .find(|s| s.tag == tag && s.grant <= fault.start && s.end.unwrap_or(u64::MAX) >= fault.start)
        else {
            continue;
        };
        let Some(next) = sections
            .iter()
            .find(|s| s.grant > fault.start && s.tag != tag && !s.compatible(section))
        else {
            continue;
        };
        report.blackholed_holders.0 += 1;
        if section.lost.is_some_and(|l| l < next.grant) || section.end.is_some_and(|e| e < next.grant) {
            report.blackholed_holders.1 += 1;
        }
    }
}

/// Recovery after each fault: a grant within the recovery bound (after an
/// outage of the whole cluster, counted from its end).
fn check_recovery(grants: &[&Section], faults: &[Fault], bounds: Bounds, report: &mut Report) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
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
                    worst = Some((
                        took,
                        format!("{} {} at {:.3}s", fault.kind, fault.target, rel(fault.start)),
                    ));
                }
                if took > bounds.recovery {
                    report.violations.push(format!(
                        "slow recovery: no grant for {:.3}s after {} {} at {:.3}s (bound {:.1}s)",
                        secs(took),
                        fault.kind,
                        fault.target,
                        rel(fault.start),
                        secs(bounds.recovery)
                    ));
                }
            }
            // A fault whose recovery window outlasts the run cannot be
            // judged: the contenders were stopped before the bound ran out.
            None if from.saturating_add(bounds.recovery) > bounds.stop => {}
            None => report.violations.push(format!(
                "no grant after {} {} at {:.3}s",
                fault.kind,
                fault.target,
                rel(fault.start)
            )),
        }
    }
    report.worst_recovery = worst.map(|(t, kind)| (secs(t), kind));
}

/// Quiet stretches: no stretch without a fault goes longer than the
/// recovery bound without a grant.
fn check_stalls(grants: &[&Section], faults: &[Fault], bounds: Bounds, report: &mut Report) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
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
                rel(from),
                secs(bounds.recovery)
            ));
        }
    }
}

/// Lock-mode tokens: a section whose token was taken when it began (a
/// grant, an up-conversion to CW, PW or EX) carries a token above that of
/// every section in an incompatible mode that began before it (that holder
/// had left, or lost its lock, before this one could be granted, so its
/// token was handed out first). Compatible holders are granted side by
/// side, and their reports may come in another order than the server's:
/// their tokens are not compared. One violation per section.
fn check_mode_tokens(sections: &[Section], bounds: Bounds, report: &mut Report) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
    for (j, later) in sections.iter().enumerate() {
        if later.mode.is_none() || !later.fresh {
            continue;
        }
        let above = sections[..j].iter().find(|earlier| {
            earlier.mode.is_some()
                && earlier.grant < later.grant
                && !earlier.compatible(later)
                && earlier.token >= later.token
        });
        if let Some(earlier) = above {
            report.violations.push(format!(
                "fencing token did not increase: {} was {} token {}{} at {:.3}s after {} was {} token {}{} at {:.3}s",
                later.tag,
                later.began(),
                later.token,
                later.in_mode(),
                rel(later.grant),
                earlier.tag,
                earlier.began(),
                earlier.token,
                earlier.in_mode(),
                rel(earlier.grant)
            ));
        }
    }
}

/// Riding out: an outage of [`Bounds::ride_out_kinds`] no
/// longer than [`Bounds::ride_out`] must cost no session. A loss due to it
/// is heard by the time the loss deadline has passed since the outage's
/// start plus its length (the last confirmed renewal was sent before the
/// outage); a holder's `lost()` or a waiter's lost session in that window,
/// and before the next fault, is a violation.
fn check_ride_out(events: &[&Event], faults: &[Fault], bounds: Bounds, report: &mut Report) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
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
                What::Lost { token } => Some(format!("{} heard lost() of token {token} at {:.3}s", e.tag, rel(e.t))),
                What::Error { message } if message.starts_with("lock:") && message.ends_with(" lost") => {
                    Some(format!("{} at {:.3}s: {message}", e.tag, rel(e.t)))
                }
                _ => None,
            })
            .collect();
        if losses.is_empty() {
            report.ridden_out.1 += 1;
        } else {
            report.violations.push(format!(
                "a session lost to a short outage: {} {} at {:.3}s, serving again {:.3}s later (ridden out up to {:.1}s): {}",
                fault.kind,
                fault.target,
                rel(fault.start),
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
fn check_forgotten(events: &[&Event], faults: &[Fault], bounds: Bounds, report: &mut Report) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
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
                    "a forgotten session lived on: {tag}'s session {id} was open when {} {} at {:.3}s forgot every session, and was not given up as lost within {:.1}s of the server's return at {:.3}s",
                    fault.kind,
                    fault.target,
                    rel(fault.start),
                    secs(bounds.recovery),
                    rel(end)
                ));
            }
        }
    }
}

/// Lock-delay: after a fault that took a holder's lock from it (the holder
/// killed, or told `lost()` after a pause, a blackhole or a reset), the next
/// grant must not come sooner than the lock-delay after the fault, when its
/// contender was already waiting at the fault and waited through (the server
/// removed the lost entry at the fault or later, and the waiter counts the
/// delay from then). Not judged when a contender ahead of it in the queue
/// (waiting since before it) gave up waiting (`lock_timeout`) in between: a
/// waiter that leaves cleanly hands on at once, lock-delay or not.
fn check_lock_delay(events: &[&Event], sections: &[Section], faults: &[Fault], bounds: Bounds, report: &mut Report) {
    let rel = |t: u64| secs(t.saturating_sub(bounds.start));
    let takes_the_lock = |kind: FaultKind| {
        matches!(
            kind,
            FaultKind::PauseHolder | FaultKind::KillHolder | FaultKind::BlackholeHolder | FaultKind::CutHolder
        )
    };
    for fault in faults.iter().filter(|f| takes_the_lock(f.kind)) {
        let Some(tag) = fault.holder else { continue };
        let Some(section) = sections
            .iter()
            .find(|s| s.tag == tag && s.grant <= fault.start && s.end.is_none_or(|e| e >= fault.start))
        else {
            continue;
        };
        if fault.kind != FaultKind::KillHolder && section.lost.is_none() {
            // It kept its lock (a short pause, a reset its session outlived).
            continue;
        }
        let Some(next) = sections.iter().find(|s| s.grant > fault.start && s.tag != tag) else {
            continue;
        };
        if next.grant >= bounds.stop {
            continue;
        }
        let waited_through = events
            .iter()
            .rfind(|e| e.tag == next.tag && e.t < next.grant && !matches!(e.what, What::Lost { .. }))
            .is_some_and(|e| e.what == What::Waiting && e.t <= fault.start);
        // When the next holder began waiting: a contender that gave up
        // waiting and had begun before it was ahead of it in the queue.
        let next_waiting = events
            .iter()
            .rfind(|e| e.tag == next.tag && e.t <= fault.start && e.what == What::Waiting)
            .map_or(0, |e| e.t);
        let gave_up = events.iter().any(|e| {
            e.t > fault.start
                && e.t < next.grant
                && e.what == What::Timeout
                && events
                    .iter()
                    .rfind(|w| w.tag == e.tag && w.t < e.t && w.what == What::Waiting)
                    .is_some_and(|w| w.t < next_waiting)
        });
        if !waited_through || gave_up {
            continue;
        }
        let gap = next.grant - fault.start;
        report.lock_delay_checks += 1;
        report.lock_delay_shortest = Some(report.lock_delay_shortest.map_or(secs(gap), |s: f64| s.min(secs(gap))));
        if gap < bounds.lock_delay {
            report.violations.push(format!(
                "lock-delay broken: {} was granted token {} at {:.3}s, {:.3}s after {} {} at {:.3}s took token {}'s lock (lock-delay {:.1}s)",
                next.tag,
                next.token,
                rel(next.grant),
                secs(gap),
                fault.kind,
                fault.target,
                rel(fault.start),
                section.token,
                secs(bounds.lock_delay)
            ));
        }
    }
}

/// An error message with its ids and numbers blanked out (`#`), cut to 100
/// characters, so that alike errors count together.
fn error_kind(message: &str) -> String {
    let mut kind = String::new();
    let mut in_number = false;
    for word in message.split(' ') {
        let idish = word.len() >= 6 && word.chars().filter(|c| c.is_ascii_digit()).count() >= 2;
        if !kind.is_empty() {
            kind.push(' ');
        }
        kind.push_str(if idish { "#" } else { word });
    }
    for c in std::mem::take(&mut kind).chars() {
        if c.is_ascii_digit() {
            if !in_number {
                kind.push('#');
            }
            in_number = true;
        } else {
            in_number = false;
            kind.push(c);
        }
    }
    kind.chars().take(100).collect()
}

/// Appends `lines` to a report's violations as one entry (orphans, garbled lines).
pub fn add_violation(report: &mut Report, head: &str, lines: &[String]) {
    let mut text = head.to_owned();
    for line in lines {
        let _ = write!(text, "\n      {line}");
    }
    report.violations.push(text);
}

#[cfg(test)]
mod tests;
