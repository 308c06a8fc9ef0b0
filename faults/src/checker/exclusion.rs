//! Exclusion: overlapping sections in incompatible modes, judged by the
//! earlier holder's writes after the later grant (fenced, or none while
//! frozen) and by when it heard `lost()` (before the later grant, unless it
//! was frozen or the server freed its lock without its knowing); and the
//! blackholed holders that heard `lost()` in time.

use crate::clock::secs;
use crate::history::{Fence, Tag, Write};
use crate::nemesis::{Fault, FaultKind};

use super::fencing::landed;
use super::sections::{Paused, Section};
use super::{Bounds, Report};

/// Overlaps of incompatible sections: a stale holder's writes after the
/// next grant must have been refused (unfenced overlap), and its `lost()`
/// must come before the next grant unless it was frozen or a reset freed
/// its lock without its knowing (lost() after the next grant).
pub(super) fn check_overlaps(
    sections: &[Section],
    writes: &[&Write],
    paused: &Paused,
    faults: &[Fault],
    bounds: Bounds,
    report: &mut Report,
) {
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
            // `a` went up to a mode `b` shares (CW to PR beside a PR grant)
            // with no fresh token, and `b` was granted while `a`'s holder
            // waited for that conversion's answer: the server may have
            // converted `a` first (as the rule has it: a converting entry
            // blocks through both its modes), and nothing in the history
            // orders the two. Counted, not judged; the rule itself is the
            // model's to check (its `ConvertingCountsNewModeOnly` twin).
            if a.unordered_conversion
                .is_some_and(|(asked, to)| b.grant >= asked && b.mode.is_some_and(|m| m.compatible(to)))
            {
                report.overlaps_conversion_unordered += 1;
                continue;
            }
            report.overlaps_raw += 1;
            let overlap = Overlap::of(a, b, end, writes, paused, faults, bounds);
            judge_writes(&overlap, bounds, report);
            if !overlap.frozen && !late_reported.contains(&(a.tag, a.token)) {
                late_reported.push((a.tag, a.token));
                judge_lateness(&overlap, bounds, report);
            }
        }
    }
}

/// Two sections in incompatible modes: the earlier `a` still held when the
/// later `b` began; and what the history says about `a` from then.
struct Overlap<'h> {
    a: &'h Section,
    b: &'h Section,
    /// When `a` ended (the run's stop when it never did).
    end: u64,
    /// `a`'s writes after `b`'s grant.
    after: Vec<&'h Write>,
    /// How many of them landed and are not excused.
    accepted: usize,
    /// `a`'s process was paused between the two grants.
    frozen: bool,
    /// When the server freed `a`'s lock without its knowing, if `a` stopped
    /// holding within the reset notice of it.
    noticed: Option<u64>,
    /// When `a` heard `lost()`, for messages.
    when_lost: String,
    /// The faults active between the two grants, for messages.
    context: String,
}

impl<'h> Overlap<'h> {
    /// What the history says about `a` once `b` began.
    fn of(
        a: &'h Section,
        b: &'h Section,
        end: u64,
        writes: &[&'h Write],
        paused: &Paused,
        faults: &[Fault],
        bounds: Bounds,
    ) -> Self {
        let after: Vec<&Write> = writes
            .iter()
            .copied()
            .filter(|w| w.tag == a.tag && w.token == a.token && w.t > b.grant)
            .collect();
        let frozen = was_paused(paused, a.tag, a.grant, b.grant);
        let reset = freed_unknowingly(a, b, faults, bounds);
        let noticed = reset.filter(|&r| bounds.reset_notice > 0 && end <= r.saturating_add(bounds.reset_notice));
        // A frozen holder cannot be told, nor one the server forgot
        // before its next request.
        let untold = frozen || noticed.is_some();
        let accepted = accepted_after(a, &after, writes, untold);
        Overlap {
            a,
            b,
            end,
            after,
            accepted,
            frozen,
            noticed,
            when_lost: when_lost(a, b),
            context: faults_during(a, b, faults, bounds),
        }
    }
}

/// Whether `tag`'s process was paused at some time from `from` to `to`.
fn was_paused(paused: &Paused, tag: Tag, from: u64, to: u64) -> bool {
    paused
        .get(&tag)
        .is_some_and(|spans| spans.iter().any(|&(a, b)| a <= to && b >= from))
}

/// How many of `after` (`a`'s writes after the next grant) landed without
/// excuse. An `untold` holder's write to the test's token register that
/// landed before any write of a newer holder is excused: the resource saw
/// the holders in token order, so it is ordered, not overlapping.
fn accepted_after(a: &Section, after: &[&Write], writes: &[&Write], untold: bool) -> usize {
    let newer_wrote = writes
        .iter()
        .filter(|w| landed(w) && w.token > a.token)
        .map(|w| w.t)
        .min()
        .unwrap_or(u64::MAX);
    after
        .iter()
        .filter(|w| landed(w) && !(untold && w.fence == Fence::Token && w.t < newer_wrote))
        .count()
}

/// When `a` heard `lost()`, counted from `b`'s grant, for messages.
fn when_lost(a: &Section, b: &Section) -> String {
    match a.lost {
        Some(l) => format!("its lost() fired {:.3}s later", secs(l.saturating_sub(b.grant))),
        None => "its lost() never fired".to_owned(),
    }
}

/// The earlier holder's writes after the later grant: any that landed is
/// an unfenced overlap; otherwise the overlap is explained, as idle (none
/// written) or fenced (every one refused).
fn judge_writes(overlap: &Overlap<'_>, bounds: Bounds, report: &mut Report) {
    let Overlap { a, b, accepted, .. } = *overlap;
    if accepted > 0 {
        report.violations.push(format!(
            "unfenced overlap: {} (token {}{}) had {accepted} write(s) accepted after {} (token {}) was {} at {:.3}s; {}; {}",
            a.tag,
            a.token,
            a.in_mode(),
            b.tag,
            b.token,
            b.began(),
            bounds.since_start(b.grant),
            overlap.when_lost,
            overlap.context
        ));
    } else if overlap.after.is_empty() {
        report.overlaps_idle += 1;
    } else {
        report.overlaps_fenced += 1;
    }
}

/// `lost()` first: a running holder must have stopped before the later
/// grant. One whose lock the server freed without its knowing, and that
/// stopped within the notice, is counted (the worst case kept); any other
/// is a violation.
fn judge_lateness(overlap: &Overlap<'_>, bounds: Bounds, report: &mut Report) {
    let Overlap { a, b, end, .. } = *overlap;
    let Some(freed) = overlap.noticed else {
        report.violations.push(format!(
            "lost() after the next grant: {} (token {}{}, {} {:.3}s, not frozen) still held when {} (token {}{}) was {} at {:.3}s; {}; {} of its writes rejected; {}",
            a.tag,
            a.token,
            a.in_mode(),
            a.began(),
            bounds.since_start(a.grant),
            b.tag,
            b.token,
            b.in_mode(),
            b.began(),
            bounds.since_start(b.grant),
            overlap.when_lost,
            overlap.after.len() - overlap.accepted,
            overlap.context
        ));
        return;
    };
    report.reset_holders_late.0 += 1;
    let held_on = secs(end.saturating_sub(freed));
    if held_on >= report.reset_holders_late.1 {
        report.reset_holders_late.1 = held_on;
        let how = if a.lost.is_some() { "saw lost()" } else { "stopped" };
        report.reset_worst = format!(
            "{} (token {}) {how} at {:.3}s, its lock freed by the server at {:.3}s, {} granted at {:.3}s; {}",
            a.tag,
            a.token,
            bounds.since_start(end),
            bounds.since_start(freed),
            b.tag,
            bounds.since_start(b.grant),
            overlap.context
        );
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
    let during = faults
        .iter()
        .filter(|f| f.start <= b.grant && f.end.unwrap_or(u64::MAX) >= a.grant)
        .map(|f| bounds.fault_at(f))
        .collect::<Vec<_>>();
    if during.is_empty() {
        "no fault active".to_owned()
    } else {
        format!("during {}", during.join(", "))
    }
}

/// Blackholed holders: counts those whose `lost()` (or end) came before
/// the next incompatible grant.
pub(super) fn check_blackholed_holders(sections: &[Section], faults: &[Fault], report: &mut Report) {
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
