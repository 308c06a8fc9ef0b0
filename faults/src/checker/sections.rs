//! The history cut into critical sections ([`Section`]): a holding interval
//! in one mode, from a grant or a conversion to the holder's giving up the
//! lock, with the spans each process was paused; and the figures counted on
//! the way (grants, modes, conversions, losses, timeouts, sessions, errors).

use std::collections::BTreeMap;

use lockline::LockMode;

use crate::history::{Event, Tag, What};

use super::{Bounds, Report};

/// One critical section: a holding interval in one mode. A lock-mode
/// holder's grant is cut into one section per mode it held in, at each
/// conversion.
#[derive(Debug, Clone)]
pub(super) struct Section {
    pub(super) tag: Tag,
    pub(super) token: u64,
    /// When it began: the grant, or the conversion that began it.
    pub(super) grant: u64,
    pub(super) end: Option<u64>,
    pub(super) lost: Option<u64>,
    /// The mode held; `None` for a mutex (it excludes everyone, as EX).
    pub(super) mode: Option<LockMode>,
    /// Begun by a conversion rather than a grant.
    pub(super) converted: bool,
    /// Its token was taken when it began (a grant, an up-conversion to CW,
    /// PW or EX): above every token granted before.
    pub(super) fresh: bool,
    /// Ended by an up-conversion with a fresh token: that token. The server
    /// converted it there, in its order of grants, whenever its holder
    /// heard of it.
    pub(super) converted_at: Option<u64>,
    /// While its holder waits for an up-conversion: when it asked, and for
    /// which mode.
    pub(super) converting: Option<(u64, LockMode)>,
    /// Ended by an up-conversion that took no fresh token (to CR or PR;
    /// what matters is CW to PR): when its holder asked for it, and the mode
    /// it went to. The server's order of that conversion and a grant made
    /// while the holder waited for its answer is unknown.
    pub(super) unordered_conversion: Option<(u64, LockMode)>,
}

impl Section {
    /// Whether two holders in these sections may hold at once.
    pub(super) fn compatible(&self, other: &Section) -> bool {
        match (self.mode, other.mode) {
            (Some(a), Some(b)) => a.compatible(b),
            _ => false,
        }
    }

    /// A grant that shows the lock can be had (not a conversion, nor an NL
    /// grant, which waits for nobody).
    pub(super) fn counts_as_grant(&self) -> bool {
        !self.converted && self.mode != Some(LockMode::Nl)
    }

    /// The mode, for messages.
    pub(super) fn in_mode(&self) -> String {
        self.mode.map_or_else(String::new, |m| format!(" in {m}"))
    }

    /// How it began, for messages.
    pub(super) fn began(&self) -> &'static str {
        if self.converted {
            "converted"
        } else {
            "granted"
        }
    }
}

/// Paused spans (start, end) per process.
pub(super) type Paused = BTreeMap<Tag, Vec<(u64, u64)>>;

/// The critical sections (from a grant or a conversion to its end), sorted
/// by their start, and the spans each process was paused. Counts grants,
/// modes, conversions, losses, timeouts, sessions and errors on the way, and
/// reports a conversion by a process that did not hold what it converted
/// from, and a hung call.
pub(super) fn sections_of(events: &[&Event], bounds: Bounds, report: &mut Report) -> (Vec<Section>, Paused) {
    let mut cut = Cut::default();
    for event in events {
        tally(event, report);
        report_hang(event, bounds, report);
        cut.follow(event, bounds, report);
    }
    cut.sections.sort_by_key(|s| s.grant);
    report.grants = cut.sections.iter().filter(|s| !s.converted).count();
    (cut.sections, cut.paused)
}

/// Counts what `event` adds to the figures: a grant's mode, a conversion
/// (up or down), a deadlock, a conversion timeout, a loss, a timeout, a
/// session, an error (by its kind).
fn tally(event: &Event, report: &mut Report) {
    match &event.what {
        What::Grant { mode: Some(mode), .. } => *report.modes.entry(mode.label().to_owned()).or_default() += 1,
        What::Converted { from, to, .. } if to.is_down_from(*from) => report.conversions.1 += 1,
        What::Converted { .. } => report.conversions.0 += 1,
        What::Deadlock { .. } => report.deadlocks += 1,
        What::ConvertTimeout { .. } => report.convert_timeouts += 1,
        What::Lost { .. } => report.lost += 1,
        What::Timeout => report.timeouts += 1,
        What::Session { .. } => report.sessions += 1,
        What::Error { message } => *report.errors.entry(error_kind(message)).or_default() += 1,
        _ => {}
    }
}

/// No hangs: a call that did not return within its deadline, as its
/// contender reported it, is a violation.
fn report_hang(event: &Event, bounds: Bounds, report: &mut Report) {
    if let What::Error { message } = &event.what {
        if message.starts_with("hang") {
            report.violations.push(format!(
                "{} at {:.3}s: {message}",
                event.tag,
                bounds.since_start(event.t)
            ));
        }
    }
}

/// The sections cut so far: every one begun, the one each process holds
/// now, and the spans each process was paused.
#[derive(Debug, Default)]
struct Cut {
    sections: Vec<Section>,
    open: BTreeMap<Tag, usize>,
    paused: Paused,
}

impl Cut {
    /// Follows one event: a grant or a conversion begins a section, a loss,
    /// a release or the process's end ends it, a pause and a resumption
    /// mark a paused span.
    fn follow(&mut self, event: &Event, bounds: Bounds, report: &mut Report) {
        match &event.what {
            What::Grant { token, mode, .. } => self.grant(event, *token, *mode),
            What::Converting { to, .. } => self.asked(event, Some(*to)),
            What::Deadlock { .. } | What::ConvertTimeout { .. } => self.asked(event, None),
            What::Converted { from, to, token } => self.convert(event, *from, *to, *token, bounds, report),
            What::Lost { token } => self.lose(event, *token),
            What::Release { .. } | What::Killed | What::Exited | What::Idle | What::Closed => {
                self.close(event.tag, event.t)
            }
            What::Paused => self.paused.entry(event.tag).or_default().push((event.t, u64::MAX)),
            What::Resumed => {
                if let Some(last) = self.paused.entry(event.tag).or_default().last_mut() {
                    last.1 = event.t;
                }
            }
            _ => {}
        }
    }

    /// A grant: ends what its process held, and begins a section with a
    /// fresh token.
    fn grant(&mut self, event: &Event, token: u64, mode: Option<LockMode>) {
        self.close(event.tag, event.t);
        self.begin(event, token, mode, false, true);
    }

    /// An up-conversion asked for (`Some`), or failed (`None`: the holder
    /// keeps its mode, as if it never asked).
    fn asked(&mut self, event: &Event, to: Option<LockMode>) {
        if let Some(i) = self.open.get(&event.tag).copied() {
            self.sections[i].converting = to.map(|to| (event.t, to));
        }
    }

    /// A conversion: ends the section in `from` and begins one in `to`
    /// (with a fresh token when it went up to a writing mode). A process
    /// that did not hold `from` is reported.
    fn convert(
        &mut self,
        event: &Event,
        from: LockMode,
        to: LockMode,
        token: u64,
        bounds: Bounds,
        report: &mut Report,
    ) {
        let up = !to.is_down_from(from);
        match self.open.get(&event.tag).copied() {
            Some(i) if self.sections[i].mode == Some(from) => {
                let old = &mut self.sections[i];
                old.end.get_or_insert(event.t);
                if up && to.writes() {
                    old.converted_at = Some(token);
                } else if up {
                    old.unordered_conversion = old.converting.filter(|&(_, asked)| asked == to);
                }
                self.begin(event, token, Some(to), true, up && to.writes());
            }
            held => report.violations.push(format!(
                "{} reported a conversion from {from} to {to} at {:.3}s while holding {}",
                event.tag,
                bounds.since_start(event.t),
                held.map_or("nothing".to_owned(), |i| format!(
                    "in {}",
                    self.sections[i].mode.map_or("a mutex".to_owned(), |m| m.to_string())
                ))
            )),
        }
    }

    /// `lost()` heard: ends the section of that token, and its process
    /// holds nothing from then.
    fn lose(&mut self, event: &Event, token: u64) {
        if let Some(section) = self
            .sections
            .iter_mut()
            .rev()
            .find(|s| s.tag == event.tag && s.token == token)
        {
            section.lost.get_or_insert(event.t);
            section.end.get_or_insert(event.t);
        }
        self.open.remove(&event.tag);
    }

    /// Begins a section at `event` (a grant, or a conversion when
    /// `converted`), held by its process from now; `fresh` when its token
    /// was taken then.
    fn begin(&mut self, event: &Event, token: u64, mode: Option<LockMode>, converted: bool, fresh: bool) {
        self.open.insert(event.tag, self.sections.len());
        self.sections.push(Section {
            tag: event.tag,
            token,
            grant: event.t,
            end: None,
            lost: None,
            mode,
            converted,
            fresh,
            converted_at: None,
            converting: None,
            unordered_conversion: None,
        });
    }

    /// Ends what `tag` holds, at `t`.
    fn close(&mut self, tag: Tag, t: u64) {
        if let Some(i) = self.open.remove(&tag) {
            self.sections[i].end.get_or_insert(t);
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
