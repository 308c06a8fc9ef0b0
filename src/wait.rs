//! The one wait rule (DESIGN §4), for every recipe.
//!
//! A contender waits on exactly one other entry: the nearest earlier entry that
//! conflicts with it (for a semaphore of `n` permits, the conflicting entry `n`
//! places earlier). When that entry is gone it looks once more (one read) and
//! applies the rule again. It never watches the whole queue, never polls and
//! never sleeps, so a release wakes one waiter however long the queue is.
//!
//! Here are the rule itself ([`Rule`]), how long an acquire may wait
//! ([`Patience`]) and the check of a sequencer against a queue by the rule;
//! the acquire that applies the rule over a session is in `acquire`.

use std::time::Duration;

use tokio::time::Instant;

use crate::sequencer::Mode;
use crate::{Conflicts, Entry};

/// Which earlier entries block a contender, and how many of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // `Shared` and `Permits` serve the read/write lock and semaphore recipes.
pub(crate) enum Rule {
    /// Mutex, write lock, election: any earlier entry blocks.
    Exclusive,
    /// Read lock: any earlier non-shared entry blocks.
    Shared,
    /// Semaphore: `n` earlier entries block.
    Permits(usize),
}

impl Rule {
    pub(crate) fn conflicts(self) -> Conflicts {
        match self {
            Rule::Shared => Conflicts::Exclusive,
            Rule::Exclusive | Rule::Permits(_) => Conflicts::All,
        }
    }

    /// How many earlier conflicting entries it takes to block.
    pub(crate) fn depth(self) -> usize {
        match self {
            Rule::Permits(n) => n.max(1),
            Rule::Exclusive | Rule::Shared => 1,
        }
    }

    /// Decides from the nearest earlier conflicting entries (nearest first):
    /// `None` to hold, or the one entry to wait on.
    pub(crate) fn blocker(self, nearest: &[Entry]) -> Option<&Entry> {
        nearest.get(self.depth() - 1)
    }
}

/// How long an acquire may wait.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Patience {
    /// Until granted (or the session is over).
    Forever,
    /// Not at all: `try_*` calls.
    Never,
    /// Until the deadline; `Timeout` reports the duration asked for.
    Until(Instant, Duration),
}

impl Patience {
    /// Resolves at the deadline, if there is one; never otherwise.
    pub(crate) async fn deadline(self) {
        match self {
            Patience::Until(at, _) => tokio::time::sleep_until(at).await,
            Patience::Forever | Patience::Never => std::future::pending().await,
        }
    }
}

/// Waiting at most `timeout` (not zero): until its deadline, or for ever
/// when the deadline lies past what the clock can tell (`Duration::MAX`).
pub(crate) fn patience_for(timeout: Duration) -> Patience {
    match Instant::now().checked_add(timeout) {
        Some(at) => Patience::Until(at, timeout),
        None => Patience::Forever,
    }
}

// A sequencer's mode (a value below the wait rule) is given its rule here.
impl Mode {
    /// The one wait rule this mode holds by.
    pub(crate) fn rule(self) -> Rule {
        match self {
            Mode::Read => Rule::Shared,
            Mode::Permit { permits } => Rule::Permits(permits),
            Mode::Mutex | Mode::Write | Mode::Leadership | Mode::Lock(_) => Rule::Exclusive,
        }
    }
}

/// Whether `sequencer`'s entry is in `queue` (first-created first), holds
/// by its mode's wait rule, and is not held back by a lock-delay (a
/// contender in lock-delay is not the holder yet).
pub(crate) fn current(queue: &[crate::Contender], sequencer: &crate::Sequencer) -> bool {
    let mode = sequencer.mode();
    let Some(at) = queue
        .iter()
        .position(|e| e.token == sequencer.token() && mode.matches(e.kind))
    else {
        return false;
    };
    if queue[at].delayed_until.is_some() {
        return false;
    }
    let rule = mode.rule();
    let earlier = queue[..at].iter().filter(|e| rule.conflicts().includes(e.kind)).count();
    earlier < rule.depth()
}

#[cfg(test)]
mod tests {
    use super::Rule;
    use crate::{Entry, EntryKind, FencingToken};

    fn entry(order: i64, kind: EntryKind) -> Entry {
        Entry {
            key: format!("q/{order}"),
            kind,
            order,
            token: FencingToken::new(order as u64),
            owner: None,
        }
    }

    #[test]
    fn exclusive_waits_on_the_entry_just_before() {
        let nearest = [entry(4, EntryKind::Mutex), entry(3, EntryKind::Mutex)];
        assert_eq!(Rule::Exclusive.blocker(&nearest).map(|e| e.order), Some(4));
        assert_eq!(Rule::Exclusive.blocker(&[]), None);
        assert_eq!(Rule::Exclusive.depth(), 1);
    }

    #[test]
    fn readers_are_blocked_by_exclusive_entries_only() {
        assert_eq!(Rule::Shared.conflicts(), crate::Conflicts::Exclusive);
        assert!(!Rule::Shared.conflicts().includes(EntryKind::Read));
        assert!(Rule::Shared.conflicts().includes(EntryKind::Write));
        assert!(Rule::Exclusive.conflicts().includes(EntryKind::Read));
    }

    #[test]
    fn semaphore_waits_on_the_entry_n_places_earlier() {
        let rule = Rule::Permits(3);
        let nearest = [
            entry(7, EntryKind::Semaphore),
            entry(4, EntryKind::Semaphore),
            entry(1, EntryKind::Semaphore),
        ];
        assert_eq!(rule.blocker(&nearest).map(|e| e.order), Some(1));
        assert_eq!(rule.blocker(&nearest[..2]), None);
        assert_eq!(Rule::Permits(0).depth(), 1);
    }
}
