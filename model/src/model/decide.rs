//! What one read of the queue decides: the rule (with its broken twins'
//! departures from it) applied to one entry, the edges of "is kept
//! waiting by", the cycles they close, and what a release's read hands over.

use crate::state::{Entry, Resource, State};
use crate::{Mode, Patience, QueueModel, Queueing, Rule};

/// What one read of the queue decides for a waiting entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    /// My entry is gone: my session was lost.
    Gone,
    /// Granted.
    Hold,
    /// Wait on this one entry.
    Blocked(u8),
}

pub(super) fn find(resource: &Resource, id: u8) -> Option<&Entry> {
    resource.entries.iter().find(|e| e.id == id)
}

/// Whether an entry waits: a request, or a granted entry converting up.
pub(super) fn waits(entry: &Entry) -> bool {
    !entry.granted || entry.converting.is_some()
}

/// The order of conversion marks: the mark's place, ties by entry order.
pub(super) fn mark_order(entry: &Entry) -> (u8, u8) {
    (entry.since, entry.id)
}

/// The `since` of a mark written now: after every mark standing. Only the
/// order of the standing marks is ever compared, so the model numbers them
/// densely rather than by the revision (which would split states that
/// differ only in how many marks came and went).
pub(super) fn next_mark(resource: &Resource) -> u8 {
    resource.entries.iter().map(|e| e.since).max().unwrap_or(0) + 1
}

impl QueueModel {
    /// Whether `earlier`, an entry before a request in `mode`, keeps that
    /// request waiting.
    pub(super) fn blocks_request(&self, earlier: &Entry, mode: Mode) -> bool {
        let held = !earlier.mode.compatible(mode);
        match earlier.converting {
            None => held,
            Some(target) if self.rule == Rule::ConvertingCountsNewModeOnly => !target.compatible(mode),
            Some(target) => held || !target.compatible(mode),
        }
    }

    /// Every entry that keeps `entry` from being granted, in queue order:
    /// for a request, the earlier entries it conflicts with; for an
    /// up-conversion, the other granted entries and the earlier waiting
    /// requests its new mode conflicts with.
    pub fn blockers(&self, resource: &Resource, entry: &Entry) -> Vec<u8> {
        if entry.granted {
            let Some(target) = entry.converting else {
                return Vec::new();
            };
            return resource
                .entries
                .iter()
                .filter(|other| other.id != entry.id)
                .filter(|other| {
                    let waiting_before = !other.granted && other.id < entry.id;
                    let counts = other.granted || (waiting_before && self.rule != Rule::ConversionPassesEarlierWaiters);
                    counts && !other.mode.compatible(target)
                })
                .map(|other| other.id)
                .collect();
        }
        let earlier = resource.entries.iter().filter(|other| other.id < entry.id);
        match self.config.queueing {
            // The lock manager's check without its queue order: compatible
            // with every granted entry, wherever it stands, is enough.
            Queueing::Modes if self.rule == Rule::BypassWaiters => resource
                .entries
                .iter()
                .filter(|other| other.granted && other.id != entry.id)
                .filter(|other| self.blocks_request(other, entry.mode))
                .map(|other| other.id)
                .collect(),
            Queueing::Modes => earlier
                .filter(|other| self.blocks_request(other, entry.mode))
                .map(|other| other.id)
                .collect(),
            Queueing::Permits(permits) => {
                let earlier: Vec<u8> = earlier.map(|other| other.id).collect();
                let permits = usize::from(permits.max(1));
                if earlier.len() < permits {
                    Vec::new()
                } else {
                    vec![earlier[earlier.len() - permits]]
                }
            }
        }
    }

    /// One read of the queue: the rule applied to `id`. A request waits on
    /// the nearest earlier blocker; a conversion on the first blocker in
    /// queue order.
    pub(super) fn decide(&self, resource: &Resource, id: u8) -> Decision {
        let Some(entry) = find(resource, id) else {
            return Decision::Gone;
        };
        let blockers = self.blockers(resource, entry);
        let chosen = if entry.granted {
            blockers.first()
        } else {
            blockers.last()
        };
        match chosen {
            None => Decision::Hold,
            Some(&on) => Decision::Blocked(on),
        }
    }

    /// Whether `from` reaches `to` along "is kept waiting by" edges, through
    /// entries for which `through` holds (`View::reaches` in the code, with
    /// [`waits`]).
    pub(super) fn reaches(&self, resource: &Resource, from: u8, to: u8, through: &dyn Fn(&Entry) -> bool) -> bool {
        let mut seen: Vec<u8> = Vec::new();
        let mut stack = vec![from];
        while let Some(at) = stack.pop() {
            let Some(entry) = find(resource, at) else {
                continue;
            };
            for next in self.blockers(resource, entry) {
                if next == to {
                    return true;
                }
                let waiting = find(resource, next).is_some_and(through);
                if waiting && !seen.contains(&next) {
                    seen.push(next);
                    stack.push(next);
                }
            }
        }
        false
    }

    /// Whether `id` lies on a cycle of entries that wait on each other
    /// (edges to every blocker that itself waits: a request, or a granted
    /// entry converting up). Nothing on such a cycle is ever granted.
    pub fn in_cycle(&self, resource: &Resource, id: u8) -> bool {
        self.reaches(resource, id, id, &waits)
    }

    /// Whether the conversion `id`, marked, was marked after (`latest`) or
    /// before (`!latest`) every other conversion that lies on a cycle with
    /// it (`View::last_marked_on_cycle`).
    pub(super) fn marked_at_end(&self, resource: &Resource, id: u8, latest: bool) -> bool {
        let Some(me) = find(resource, id) else {
            return false;
        };
        resource
            .entries
            .iter()
            .filter(|other| other.id != id && other.converting.is_some())
            .filter(|other| {
                self.reaches(resource, id, other.id, &waits) && self.reaches(resource, other.id, id, &waits)
            })
            .all(|other| (mark_order(other) < mark_order(me)) == latest)
    }

    /// Whether the conversion `id` lies on a cycle whose other conversions
    /// were all marked before it: a cycle its own mark closed.
    pub(super) fn on_cycle_marked_last(&self, resource: &Resource, id: u8) -> bool {
        let Some(me) = find(resource, id) else {
            return false;
        };
        let mine = mark_order(me);
        self.reaches(resource, id, id, &|e: &Entry| {
            waits(e) && (e.converting.is_none() || mark_order(e) < mine)
        })
    }

    /// The Linux DLM's pairwise check: another granted entry converts to a
    /// mode `id`'s granted mode blocks, while its own granted mode blocks
    /// `id`'s new mode (with `earlier`: and was marked before `id`).
    pub(super) fn pairwise(&self, resource: &Resource, id: u8, earlier: bool) -> bool {
        let Some(me) = find(resource, id) else {
            return false;
        };
        let Some(target) = me.converting else {
            return false;
        };
        resource.entries.iter().any(|other| {
            other.id != id
                && other.granted
                && !other.mode.compatible(target)
                && other.converting.is_some_and(|t| !t.compatible(me.mode))
                && (!earlier || mark_order(other) < mark_order(me))
        })
    }

    /// On the read before the mark, the queue read as if the conversion
    /// `id` were marked (`hypothetical`, and blocked): whether it fails at
    /// once, without writing.
    pub(super) fn deadlock_before_mark(&self, hypothetical: &Resource, id: u8) -> bool {
        match self.rule {
            Rule::NoDeadlockDetection => false,
            Rule::PairwiseDeadlockDetection => self.pairwise(hypothetical, id, false),
            _ => self.in_cycle(hypothetical, id),
        }
    }

    /// On a read after its mark: whether the conversion `id` gives up: it
    /// lies on a cycle its own mark closed.
    pub(super) fn deadlock_after_mark(&self, resource: &Resource, id: u8) -> bool {
        match self.rule {
            Rule::NoDeadlockDetection => false,
            Rule::PairwiseDeadlockDetection => self.pairwise(resource, id, true),
            Rule::EveryConversionOnCycleGivesUp => self.in_cycle(resource, id),
            Rule::EarliestMarkGivesUp => self.in_cycle(resource, id) && self.marked_at_end(resource, id, false),
            Rule::DeferToAnyLaterMark => self.in_cycle(resource, id) && self.marked_at_end(resource, id, true),
            _ => self.on_cycle_marked_last(resource, id),
        }
    }

    /// Records a deadlock found for the conversion `id` on `read` (the
    /// queue as read, with the conversion's own mark), and whether it was a
    /// false one: `id` lies on no cycle its own mark closed (one whose other
    /// conversions were all marked before it).
    pub(super) fn deadlock_found(&self, state: &mut State, read: &Resource, id: u8) {
        state.ghost.deadlock_detected = true;
        state.ghost.false_deadlock |= !self.on_cycle_marked_last(read, id);
    }

    /// Whether a request in `mode` granted behind `earlier` passes one of
    /// them still waiting that it should wait behind (property 3): an
    /// incompatible request or conversion (for a semaphore, any waiter).
    pub(super) fn bypasses(&self, earlier: &[Entry], mode: Mode) -> bool {
        earlier.iter().any(|earlier| match self.config.queueing {
            Queueing::Modes => {
                (!earlier.granted && !earlier.mode.compatible(mode))
                    || earlier.converting.is_some_and(|t| !t.compatible(mode))
            }
            Queueing::Permits(_) => !earlier.granted,
        })
    }

    /// Whether a hand-over may grant `entry`: a waiting request (not a
    /// conversion) that asked to be handed the lock, which every request
    /// that waits does and a `try_` request does not.
    pub(super) fn hands_to(&self, entry: &Entry) -> bool {
        if entry.granted || entry.converting.is_some() {
            return false;
        }
        let op = self.script(usize::from(entry.owner)).get(usize::from(entry.attempt));
        self.rule == Rule::HandOverToTry || op.is_some_and(|op| op.patience() != Patience::Try)
    }

    /// A release's read: the waiting requests the departure of entry `own`
    /// lets in. Walking the queue in order without `own`, a request is
    /// granted when no earlier entry left keeps it waiting (the request
    /// rule, so requests granted earlier in the walk count as granted).
    pub(super) fn hand_over_plan(&self, res: &Resource, own: u8) -> Vec<u8> {
        let mut after = res.clone();
        after.entries.retain(|e| e.id != own);
        let mut granted = Vec::new();
        for i in 0..after.entries.len() {
            let entry = after.entries[i].clone();
            if !self.hands_to(&entry) {
                continue;
            }
            let blocked = match self.config.queueing {
                Queueing::Modes if self.rule == Rule::HandOverPastWaiters => after.entries[..i]
                    .iter()
                    .any(|e| (e.granted || e.converting.is_some()) && self.blocks_request(e, entry.mode)),
                _ => !self.blockers(&after, &entry).is_empty(),
            };
            if !blocked {
                granted.push(entry.id);
                after.entries[i].granted = true;
            }
        }
        granted
    }
}
