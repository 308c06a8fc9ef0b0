//! What the checker found ([`Report`]): the figures, every violation, and
//! how they are printed.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use lockline::LockMode;

#[cfg(doc)]
use super::Bounds;

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
    /// Lock-mode runs: grants made while an earlier holder waited for an
    /// up-conversion that takes no fresh token (CW to PR), in a mode its new
    /// mode admits, while its old one did not: the server's order of the
    /// two is unknown, and they are not judged.
    pub overlaps_conversion_unordered: usize,
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
                "lock modes granted: {}; conversions: {} up, {} down; deadlocks: {}; conversion timeouts: {}; compatible holders side by side: {}; grants during a conversion without a fresh token, not judged: {}",
                modes.join(", "),
                self.conversions.0,
                self.conversions.1,
                self.deadlocks,
                self.convert_timeouts,
                self.overlaps_compatible,
                self.overlaps_conversion_unordered
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

/// Appends `lines` to a report's violations as one entry (orphans, garbled lines).
pub fn add_violation(report: &mut Report, head: &str, lines: &[String]) {
    let mut text = head.to_owned();
    for line in lines {
        let _ = write!(text, "\n      {line}");
    }
    report.violations.push(text);
}
