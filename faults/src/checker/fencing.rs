//! Fencing: the register never lets a token go back, and tokens rise from
//! one holder to the next (mutex grants in their order; a lock-mode section
//! with a fresh token over every incompatible one begun before it).

use crate::history::{Event, Tag, What, Write};

use super::sections::Section;
use super::{Bounds, Report};

/// A write whose writer got no answer counts as landed, unless read back.
pub(super) fn landed(w: &Write) -> bool {
    w.accepted || w.unsure
}

/// The register: no write lands with a token below one that landed before
/// it (one violation per grant that did, with a count).
pub(super) fn check_register(writes: &[&Write], bounds: Bounds, report: &mut Report) {
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
            bounds.since_start(t)
        ));
    }
}

/// Mutex grants in the order they happened carry strictly increasing
/// tokens.
pub(super) fn check_mutex_tokens(events: &[&Event], sections: &[Section], bounds: Bounds, report: &mut Report) {
    let mutex: Vec<&Section> = sections.iter().filter(|s| s.mode.is_none()).collect();
    for pair in mutex.windows(2) {
        if pair[1].token == pair[0].token && pair[1].tag == pair[0].tag {
            let released = events
                .iter()
                .find(|e| e.tag == pair[0].tag && e.t >= pair[0].grant && matches!(e.what, What::Release { .. }))
                .map_or("never released".to_owned(), |e| {
                    format!("released at {:.3}s", bounds.since_start(e.t))
                });
            report.violations.push(format!(
                "fencing token did not increase: {} was granted token {} again at {:.3}s (first granted at {:.3}s, {released}; nobody held it between)",
                pair[1].tag,
                pair[1].token,
                bounds.since_start(pair[1].grant),
                bounds.since_start(pair[0].grant)
            ));
        } else if pair[1].token <= pair[0].token {
            report.violations.push(format!(
                "fencing token did not increase: {} granted token {} at {:.3}s after {} was granted token {} at {:.3}s",
                pair[1].tag,
                pair[1].token,
                bounds.since_start(pair[1].grant),
                pair[0].tag,
                pair[0].token,
                bounds.since_start(pair[0].grant)
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
pub(super) fn check_mode_tokens(sections: &[Section], bounds: Bounds, report: &mut Report) {
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
                bounds.since_start(later.grant),
                earlier.tag,
                earlier.began(),
                earlier.token,
                earlier.in_mode(),
                bounds.since_start(earlier.grant)
            ));
        }
    }
}
