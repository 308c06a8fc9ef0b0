//! The rule, over one read of the queue: who blocks whom, and cycles.

use super::*;

/// One read of a resource, decoded.
#[derive(Debug)]
pub(crate) struct View {
    pub(crate) slots: Vec<(Slot, State)>,
    pub(crate) block: Block,
}

impl View {
    pub(crate) fn new(name: &str, queue: Queue) -> Result<View> {
        if let Some(other) = queue.slots.iter().find(|s| s.entry.kind != EntryKind::Dlm) {
            return Err(Error::mixed_recipes(name, EntryKind::Dlm, &other.entry));
        }
        let block = Block::decode(queue.block.as_deref());
        let slots = queue
            .slots
            .into_iter()
            .map(|slot| {
                let state = State::decode(&slot.value, slot.changed);
                (slot, state)
            })
            .collect();
        Ok(View { slots, block })
    }

    /// The entries a PW or EX grant of entry `at` writes again as they are
    /// (the same state, a new version), with their values: every entry
    /// before it that still waits (a request) or converts, but those in
    /// `granted` (granted by the same write) and values lockline did not
    /// write.
    ///
    /// Each of them may have decided a grant of its own from a read that
    /// did not see this one (the entry appended since, or not yet granted),
    /// and a grant outside PW and EX writes the value block as that read
    /// had it when the block named a lost holder (clearing the name): after
    /// this grant, that write would overwrite what this holder writes. Its
    /// condition holds its own version, so, written again, it fails and
    /// reads again, and finds this grant's name in the block. An entry
    /// after `at` needs nothing: its own decision read this entry, whose
    /// version this grant changes.
    pub(crate) fn pending_before(&self, at: usize, granted: &[usize]) -> Vec<(usize, Vec<u8>)> {
        (0..at)
            .filter(|j| !granted.contains(j))
            .filter_map(|j| {
                let (slot, state) = &self.slots[j];
                let pending = state.granted.is_none() || state.converting().is_some();
                (pending && State::parse(&slot.value, slot.changed).is_some()).then(|| (j, state.encode()))
            })
            .collect()
    }

    pub(crate) fn position(&self, entry: &Entry) -> Option<usize> {
        self.slots
            .iter()
            .position(|(s, _)| s.entry.key == entry.key && s.entry.order == entry.order)
    }

    /// Every entry that keeps entry `at` from being granted, in queue order.
    pub(crate) fn blockers(&self, at: usize) -> Vec<usize> {
        let me = self.slots[at].1;
        match me.granted {
            Some(_) => {
                let Some(target) = me.converting() else {
                    return Vec::new();
                };
                (0..self.slots.len())
                    .filter(|&j| j != at)
                    .filter(|&j| {
                        let other = self.slots[j].1;
                        match other.granted {
                            Some(held) => !held.compatible(target),
                            None => j < at && !other.requested.compatible(target),
                        }
                    })
                    .collect()
            }
            None => (0..at).filter(|&j| request_waits_on(self.slots[j].1, me)).collect(),
        }
    }

    /// The one entry `at` waits on: a conversion the first blocker in queue
    /// order, a request the nearest earlier one.
    pub(crate) fn blocker(&self, at: usize) -> Option<usize> {
        let blockers = self.blockers(at);
        if self.slots[at].1.granted.is_some() {
            blockers.first().copied()
        } else {
            blockers.last().copied()
        }
    }

    /// Whether `from` reaches `to` through entries that wait (not through
    /// one that never waits: a `try_` request's, a `try_convert`'s).
    pub(crate) fn reaches(&self, from: usize, to: usize) -> bool {
        let waits = |j: usize| {
            let state = self.slots[j].1;
            (state.granted.is_none() || state.converting().is_some()) && !state.never_waits()
        };
        let mut seen = Vec::new();
        let mut stack = vec![from];
        while let Some(at) = stack.pop() {
            for next in self.blockers(at) {
                if next == to {
                    return true;
                }
                if waits(next) && !seen.contains(&next) {
                    seen.push(next);
                    stack.push(next);
                }
            }
        }
        false
    }

    /// Whether the conversion `at` lies on a cycle that its own mark closed:
    /// a cycle through waiting entries none of whose other conversions was
    /// marked after it (ties: the later entry). That conversion gives up;
    /// a cycle closed by a later mark is that one's to break. (Deferring to
    /// any later mark on a cycle is wrong: that mark may close another
    /// cycle, and once it is taken back the first one stands with no one
    /// awake to see it — the model's `DeferToAnyLaterMark`.)
    pub(crate) fn closes_cycle(&self, at: usize) -> bool {
        let key = |j: usize| (self.slots[j].1.since, self.slots[j].0.entry.order);
        let passable = |j: usize| {
            let state = self.slots[j].1;
            !state.never_waits()
                && match state.converting() {
                    Some(_) => key(j) < key(at),
                    None => state.granted.is_none(),
                }
        };
        let mut seen = Vec::new();
        let mut stack = vec![at];
        while let Some(from) = stack.pop() {
            for next in self.blockers(from) {
                if next == at {
                    return true;
                }
                if passable(next) && !seen.contains(&next) {
                    seen.push(next);
                    stack.push(next);
                }
            }
        }
        false
    }

    /// Whether `at` lies on a cycle of entries that wait on each other.
    pub(crate) fn in_cycle(&self, at: usize) -> bool {
        self.reaches(at, at)
    }

    /// The waiting requests that the departure of entry `at` lets in, in
    /// queue order, with the modes they asked for: each one that finds no
    /// blocker among the entries left, counting those before it that this
    /// departure lets in as granted, exactly as each would decide for
    /// itself after the departure. Only requests that wait to be granted
    /// ([`WAITS`]); conversions decide for themselves.
    pub(crate) fn handed_over(&self, at: usize) -> Vec<(usize, LockMode)> {
        // The states of the entries left (their slots are not needed).
        let mut rest: Vec<State> = self.slots.iter().map(|(_, state)| *state).collect();
        rest.remove(at);
        let mut granted = Vec::new();
        for i in 0..rest.len() {
            let state = rest[i];
            if state.granted.is_some()
                || state.blocked & WAITS == 0
                || rest[..i].iter().any(|&other| request_waits_on(other, state))
            {
                continue;
            }
            rest[i] = State::held(state.requested, 0);
            granted.push((if i < at { i } else { i + 1 }, state.requested));
        }
        granted
    }

    /// The condition of a decision on entry `at`: every entry the rule
    /// looked at, at the version read. A request looks at the entries
    /// before it; a conversion at all of them.
    pub(crate) fn unchanged(&self, at: usize) -> Vec<(&Entry, i64)> {
        let upto = if self.slots[at].1.granted.is_some() {
            self.slots.len()
        } else {
            at + 1
        };
        self.slots[..upto].iter().map(|(s, _)| (&s.entry, s.version)).collect()
    }
}

/// Whether a waiting request in state `me` waits on an earlier entry in
/// state `other`: held in a mode, or asking for one, that `me`'s is not
/// compatible with.
fn request_waits_on(other: State, me: State) -> bool {
    other.granted.is_some_and(|g| !g.compatible(me.requested)) || !other.requested.compatible(me.requested)
}
