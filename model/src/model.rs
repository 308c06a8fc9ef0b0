//! The model: the server's steps, the clients' steps, the faults, and the
//! properties the checker holds them to.

use stateright::{Model, Property};

use crate::state::{Append, Budget, Client, Entry, Ghost, Held, Phase, Resource, State, Wake};
use crate::{property, Config, Mode, Op, Patience, Queueing, Rule};

/// lockline's queue protocol under one [`Config`] and one [`Rule`].
#[derive(Debug, Clone)]
pub struct QueueModel {
    /// What runs: the recipe, the scripts, the fault budgets.
    pub config: Config,
    /// The wait rule followed.
    pub rule: Rule,
}

/// One step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The client runs its next step: sends an append, reads the queue
    /// before marking an up-conversion (or converts down), writes or
    /// releases (each but the append one atomic round trip).
    Step(u8),
    /// The client's up-conversion writes its mark, conditioned on its own
    /// entry only.
    Mark(u8),
    /// The client's up-conversion reads the queue after its mark and
    /// decides: give up (a deadlock), granted, or wait on one entry.
    ReadAfterMark(u8),
    /// The client's up-conversion, given up, takes its mark back.
    TakeBack(u8),
    /// ([`Rule::GrantBeforeMark`] only) the client's up-conversion writes
    /// the grant decided on the read before its mark, if the entries of
    /// that read are unchanged; otherwise it reads again.
    GrantFromRead(u8),
    /// The server receives an append; its answer (the entry and what the
    /// read with it decides) reaches the client if it still waits for it.
    DeliverAppend(Append),
    /// The client sends its append again (its answer was lost).
    RetryAppend(u8),
    /// A wake-up reaches its client, which (under the sound rule) reads the
    /// queue once and decides.
    DeliverWake(Wake),
    /// A wake-up is duplicated: a second copy may arrive any time later.
    DuplicateWake(Wake),
    /// The client's session expires: the server deletes its entries.
    Expire(u8),
    /// The client learns that its session is lost and ends.
    Learn(u8),
    /// The client's deadline passes while it waits (`lock_timeout`, a dropped
    /// future): the request is withdrawn, or the conversion given up (its
    /// mark, if written, taken back).
    Cancel(u8),
    /// The client's release writes what its read decided: in one write
    /// conditioned on the entries of that read (its own, and every entry up
    /// to the last one it grants), it deletes its own entry and marks
    /// granted the waiting requests its departure lets in. If an entry
    /// changed, it only deletes its own entry (the plain release).
    HandOver(u8),
    /// The client's release write finds its condition failed for a reason
    /// the model does not show (a blocked mark written on an entry of its
    /// read, or a change undone since): it only deletes its own entry.
    ReleaseOnly(u8),
    /// The client's `try_` request, blocked, removes its entry.
    Withdraw(u8),
}

/// What one read of the queue decides for a waiting entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// My entry is gone: my session was lost.
    Gone,
    /// Granted.
    Hold,
    /// Wait on this one entry.
    Blocked(u8),
}

fn find(resource: &Resource, id: u8) -> Option<&Entry> {
    resource.entries.iter().find(|e| e.id == id)
}

/// Whether an entry waits: a request, or a granted entry converting up.
fn waits(entry: &Entry) -> bool {
    !entry.granted || entry.converting.is_some()
}

/// The order of conversion marks: the mark's place, ties by entry order.
fn mark_order(entry: &Entry) -> (u8, u8) {
    (entry.since, entry.id)
}

/// The `since` of a mark written now: after every mark standing. Only the
/// order of the standing marks is ever compared, so the model numbers them
/// densely rather than by the revision (which would split states that
/// differ only in how many marks came and went).
fn next_mark(resource: &Resource) -> u8 {
    resource.entries.iter().map(|e| e.since).max().unwrap_or(0) + 1
}

impl QueueModel {
    /// The model of `config` under `rule`.
    pub fn new(config: Config, rule: Rule) -> QueueModel {
        QueueModel { config, rule }
    }

    fn script(&self, client: usize) -> &[Op] {
        &self.config.scripts[client]
    }

    fn current_op(&self, state: &State, client: usize) -> Op {
        self.script(client)[state.clients[client].pc as usize]
    }

    /// Whether `earlier`, an entry before a request in `mode`, keeps that
    /// request waiting.
    fn blocks_request(&self, earlier: &Entry, mode: Mode) -> bool {
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
    fn decide(&self, resource: &Resource, id: u8) -> Decision {
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
    fn reaches(&self, resource: &Resource, from: u8, to: u8, through: &dyn Fn(&Entry) -> bool) -> bool {
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
    fn marked_at_end(&self, resource: &Resource, id: u8, latest: bool) -> bool {
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
    fn on_cycle_marked_last(&self, resource: &Resource, id: u8) -> bool {
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
    fn pairwise(&self, resource: &Resource, id: u8, earlier: bool) -> bool {
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
    fn deadlock_before_mark(&self, hypothetical: &Resource, id: u8) -> bool {
        match self.rule {
            Rule::NoDeadlockDetection => false,
            Rule::PairwiseDeadlockDetection => self.pairwise(hypothetical, id, false),
            _ => self.in_cycle(hypothetical, id),
        }
    }

    /// On a read after its mark: whether the conversion `id` gives up: it
    /// lies on a cycle its own mark closed.
    fn deadlock_after_mark(&self, resource: &Resource, id: u8) -> bool {
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
    fn deadlock_found(&self, state: &mut State, read: &Resource, id: u8) {
        state.ghost.deadlock_detected = true;
        state.ghost.false_deadlock |= !self.on_cycle_marked_last(read, id);
    }

    fn advance(&self, state: &mut State, client: usize) {
        let c = &mut state.clients[client];
        c.pc += 1;
        c.phase = if usize::from(c.pc) >= self.script(client).len() {
            Phase::Done
        } else {
            Phase::Ready
        };
    }

    fn learn_lost(&self, state: &mut State, client: usize) {
        let c = &mut state.clients[client];
        c.phase = Phase::Done;
        c.held.iter_mut().for_each(|h| *h = None);
        c.read.clear();
        c.release.clear();
        c.hand_to.clear();
        c.read_revision = 0;
    }

    /// The entry a waiting client's own entry is, if it waits.
    fn own_entry(state: &State, client: usize) -> Option<u8> {
        let c = &state.clients[client];
        match c.phase {
            Phase::Waiting { entry, .. } => Some(entry),
            Phase::Converting { resource, .. } => c.held[usize::from(resource)].map(|h| h.entry),
            _ => None,
        }
    }

    /// Tells the waiters of entry `id` that it was removed or changed: under
    /// the sound rule, only those it lets on (gone, or no longer among their
    /// blockers). A waiter watches its blocker's value and reads nothing
    /// until that holds (`changed` in the code).
    fn notify(&self, state: &mut State, resource: u8, id: u8, removed: bool) {
        if !removed && self.rule == Rule::WakeOnRemovalOnly {
            return;
        }
        for client in 0..state.clients.len() {
            let Some((r, on)) = state.clients[client].phase.waits_on() else {
                continue;
            };
            if r != resource {
                continue;
            }
            let res = &state.resources[usize::from(resource)];
            let still_blocks = !removed
                && Self::own_entry(state, client)
                    .and_then(|own| find(res, own))
                    .is_some_and(|own| self.blockers(res, own).contains(&id));
            let lets_on = on == id && !still_blocks;
            let wake = match self.rule {
                Rule::WakeEveryWaiter => true,
                Rule::WakeOnAnyChange => on == id,
                _ => lets_on,
            };
            if !wake {
                continue;
            }
            state.ghost.herd |= !lets_on;
            insert_sorted(
                &mut state.wakes,
                Wake {
                    client: client as u8,
                    resource,
                    entry: id,
                },
            );
        }
    }

    fn remove_entry(&self, state: &mut State, resource: u8, id: u8) {
        let entries = &mut state.resources[usize::from(resource)].entries;
        if let Some(pos) = entries.iter().position(|e| e.id == id) {
            entries.remove(pos);
            self.notify(state, resource, id, true);
        }
    }

    /// Its owner removes entry `id` (a release, a cancel, a try withdrawn):
    /// with `writes_block`, the same write clears the value block's name if
    /// it names the entry; without, a name left behind makes the block look
    /// lost by its holder.
    fn remove_own(&self, state: &mut State, resource: u8, id: u8, writes_block: bool) {
        let res = &mut state.resources[usize::from(resource)];
        if find(res, id).is_none() {
            return;
        }
        if res.block == id {
            if writes_block {
                res.block = 0;
            } else {
                state.ghost.block_falsely_lost = true;
            }
        }
        self.remove_entry(state, resource, id);
    }

    /// Whether a hand-over may grant `entry`: a waiting request (not a
    /// conversion) that asked to be handed the lock, which every request
    /// that waits does and a `try_` request does not.
    fn hands_to(&self, entry: &Entry) -> bool {
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
    fn hand_over_plan(&self, res: &Resource, own: u8) -> Vec<u8> {
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

    /// Sets the conversion of entry `id` (a mark, or none: taken back), as
    /// one write, and tells its waiters.
    fn set_converting(&self, state: &mut State, resource: u8, id: u8, to: Option<Mode>) {
        let res = &mut state.resources[usize::from(resource)];
        let since = if to.is_some() { next_mark(res) } else { 0 };
        let Some(pos) = res.entries.iter().position(|e| e.id == id) else {
            return;
        };
        let entry = &mut res.entries[pos];
        entry.converting = to;
        entry.since = since;
        self.written(entry);
        self.notify(state, resource, id, false);
    }

    /// Counts a write of `entry` in its version, which only the
    /// [`Rule::GrantBeforeMark`] twin reads: the other rules' conditional
    /// writes are single steps (see the crate docs), and versions nobody
    /// reads would only split states.
    fn written(&self, entry: &mut Entry) {
        if self.rule == Rule::GrantBeforeMark {
            entry.version += 1;
        }
    }

    /// A request granted: decided on one read, written conditioned on the
    /// entries before it and itself (see the crate docs for why one atomic
    /// step is that).
    fn grant_request(&self, state: &mut State, client: usize, resource: u8, id: u8) {
        let res = &mut state.resources[usize::from(resource)];
        let Some(pos) = res.entries.iter().position(|e| e.id == id) else {
            return self.learn_lost(state, client);
        };
        if res.entries[pos].granted {
            // A release handed it the lock: the read shows the entry
            // granted, with the token of that write. Nothing to write.
            let entry = &res.entries[pos];
            state.clients[client].held[usize::from(resource)] = Some(Held {
                entry: id,
                mode: entry.mode,
                token: entry.token,
                grant: entry.grant,
            });
            state.ghost.handed_over = true;
            return self.advance(state, client);
        }
        let mode = res.entries[pos].mode;
        let bypass = res.entries[..pos].iter().any(|earlier| match self.config.queueing {
            Queueing::Modes => {
                (!earlier.granted && !earlier.mode.compatible(mode))
                    || earlier.converting.is_some_and(|t| !t.compatible(mode))
            }
            Queueing::Permits(_) => !earlier.granted,
        });
        let token = if self.rule == Rule::TokenAtAppend {
            id
        } else {
            res.revision += 1;
            res.revision
        };
        res.grants += 1;
        let grant = res.grants;
        if mode.fenced_writer() {
            res.block = id;
        }
        let entry = &mut res.entries[pos];
        entry.granted = true;
        entry.token = token;
        entry.grant = grant;
        self.written(entry);
        state.ghost.bypass |= bypass;
        state.clients[client].held[usize::from(resource)] = Some(Held {
            entry: id,
            mode,
            token,
            grant,
        });
        self.notify(state, resource, id, false);
        self.advance(state, client);
    }

    /// An up-conversion of entry `id` to `target` granted: decided on one
    /// read, written conditioned on every entry of that read.
    fn grant_conversion(&self, state: &mut State, client: usize, resource: u8, id: u8, target: Mode) {
        let res = &mut state.resources[usize::from(resource)];
        let Some(pos) = res.entries.iter().position(|e| e.id == id) else {
            return self.learn_lost(state, client);
        };
        let bypass = res.entries[..pos]
            .iter()
            .any(|earlier| !earlier.granted && !earlier.mode.compatible(target));
        if target.writes() && self.rule != Rule::KeepTokenOnConversion {
            res.revision += 1;
            res.entries[pos].token = res.revision;
        }
        res.grants += 1;
        let grant = res.grants;
        if target.fenced_writer() {
            res.block = id;
        }
        let entry = &mut res.entries[pos];
        entry.mode = target;
        entry.converting = None;
        entry.since = 0;
        entry.grant = grant;
        self.written(entry);
        let token = entry.token;
        state.ghost.bypass |= bypass;
        state.ghost.converted = true;
        state.clients[client].held[usize::from(resource)] = Some(Held {
            entry: id,
            mode: target,
            token,
            grant,
        });
        self.notify(state, resource, id, false);
        self.advance(state, client);
    }

    /// Acts on what a read decided for the client's waiting request `id`.
    fn act_on_request(&self, state: &mut State, client: usize, resource: u8, id: u8, decision: Decision) {
        match decision {
            Decision::Gone => self.learn_lost(state, client),
            Decision::Hold => self.grant_request(state, client, resource, id),
            Decision::Blocked(on) => {
                if self.current_op(state, client).patience() == Patience::Try {
                    // Removing the entry is a write of its own, later.
                    state.clients[client].phase = Phase::Withdrawing { resource, entry: id };
                } else {
                    state.clients[client].phase = Phase::Waiting {
                        resource,
                        entry: id,
                        on,
                    };
                }
            }
        }
    }

    /// An up-conversion's read after its mark (the first, or after a
    /// wake-up): give up if it lies on a cycle and was marked last of the
    /// conversions on it; otherwise granted, or wait on its first blocker.
    fn read_after_mark(&self, state: &mut State, client: usize, resource: u8) {
        let Some(held) = state.clients[client].held[usize::from(resource)] else {
            return self.learn_lost(state, client);
        };
        let res = &state.resources[usize::from(resource)];
        let Some(entry) = find(res, held.entry) else {
            // The read finds the entry gone: the session was lost.
            return self.learn_lost(state, client);
        };
        let Some(target) = entry.converting else {
            return self.advance(state, client);
        };
        if self.deadlock_after_mark(res, held.entry) {
            let read = res.clone();
            self.deadlock_found(state, &read, held.entry);
            state.ghost.deadlock_after_mark = true;
            if self.rule == Rule::KeepMarkOnDeadlock {
                return self.advance(state, client);
            }
            state.clients[client].phase = Phase::GivingUp { resource };
            return;
        }
        match self.decide(res, held.entry) {
            Decision::Gone => self.learn_lost(state, client),
            Decision::Hold => self.grant_conversion(state, client, resource, held.entry, target),
            Decision::Blocked(_) if self.current_op(state, client).patience() == Patience::Try => {
                state.clients[client].phase = Phase::GivingUp { resource };
            }
            Decision::Blocked(on) => state.clients[client].phase = Phase::Converting { resource, on },
        }
    }

    /// The read before an up-conversion's mark, counting the entry as
    /// converting: if it would wait and close a cycle, the conversion fails
    /// without writing; if it would wait and may not, it gives up without
    /// writing; otherwise the mark is next.
    fn read_before_mark(&self, state: &mut State, client: usize, resource: u8, id: u8, mode: Mode) {
        let res = &state.resources[usize::from(resource)];
        let Some(pos) = res.entries.iter().position(|e| e.id == id) else {
            // The read finds the entry gone: the session was lost.
            return self.learn_lost(state, client);
        };
        let mut read = res.clone();
        read.entries[pos].converting = Some(mode);
        read.entries[pos].since = next_mark(res);
        let blocked = self.decide(&read, id) != Decision::Hold;
        if blocked && self.deadlock_before_mark(&read, id) {
            self.deadlock_found(state, &read, id);
            return self.advance(state, client);
        }
        if blocked && self.current_op(state, client).patience() == Patience::Try {
            return self.advance(state, client);
        }
        let res = &state.resources[usize::from(resource)];
        let snapshot: Vec<(u8, u8)> = res.entries.iter().map(|e| (e.id, e.version)).collect();
        let c = &mut state.clients[client];
        if !blocked && self.rule == Rule::GrantBeforeMark {
            c.read = snapshot;
            c.phase = Phase::Granting { resource };
        } else {
            c.phase = Phase::Marking { resource };
        }
    }

    fn step(&self, state: &mut State, client: usize) {
        let op = self.current_op(state, client);
        let live = state.clients[client].live;
        let r = usize::from(op.resource());
        let held = state.clients[client].held[r];
        match op {
            Op::Lock { resource, mode, .. } => {
                if !live {
                    // The server refuses an append on a lost session.
                    return self.learn_lost(state, client);
                }
                let attempt = state.clients[client].pc;
                insert_sorted(
                    &mut state.appends,
                    Append {
                        client: client as u8,
                        resource,
                        attempt,
                        mode,
                    },
                );
                state.clients[client].phase = Phase::Appending { resource };
            }
            Op::Convert { resource, mode, .. } => {
                let Some(held) = held else {
                    return self.advance(state, client);
                };
                if !mode.is_down_from(held.mode) {
                    return self.read_before_mark(state, client, resource, held.entry, mode);
                }
                // A down-conversion: one read, one write conditioned on the
                // entry itself.
                let res = &mut state.resources[r];
                let Some(pos) = res.entries.iter().position(|e| e.id == held.entry) else {
                    // The conversion finds the entry gone: the session was lost.
                    return self.learn_lost(state, client);
                };
                if mode != held.mode {
                    if res.block == held.entry && !mode.fenced_writer() {
                        res.block = 0;
                    }
                    res.entries[pos].mode = mode;
                    self.written(&mut res.entries[pos]);
                    if let Some(h) = state.clients[client].held[r].as_mut() {
                        h.mode = mode;
                    }
                    self.notify(state, resource, held.entry, false);
                }
                self.advance(state, client);
            }
            Op::Write { .. } => {
                if let Some(held) = held.filter(|h| h.mode.fenced_writer()) {
                    let res = &mut state.resources[r];
                    if held.token >= res.fence {
                        res.fence = held.token;
                        if !live && held.grant < res.newest_writer {
                            state.ghost.stale_write_accepted = true;
                        }
                        res.newest_writer = res.newest_writer.max(held.grant);
                    } else if live {
                        state.ghost.live_write_refused = true;
                    } else {
                        state.ghost.stale_write_refused = true;
                    }
                }
                self.advance(state, client);
            }
            Op::Release { resource } => {
                let Some(held) = held else {
                    return self.advance(state, client);
                };
                let res = &state.resources[r];
                let hand_to = if find(res, held.entry).is_some() {
                    self.hand_over_plan(res, held.entry)
                } else {
                    Vec::new()
                };
                let Some(&last) = hand_to.last() else {
                    // Nobody to hand over to: the write is a fenced delete
                    // of this very entry, whatever came between the read
                    // and it, so one step.
                    state.clients[client].held[r] = None;
                    self.remove_own(state, resource, held.entry, true);
                    return self.advance(state, client);
                };
                let mut release: Vec<Entry> = res.entries.iter().filter(|e| e.id == held.entry).cloned().collect();
                release.extend(
                    res.entries
                        .iter()
                        .filter(|e| e.id != held.entry && e.id <= last)
                        .filter(|e| self.rule != Rule::HandOverUnconditionedEarlier || hand_to.contains(&e.id))
                        .cloned(),
                );
                let read_revision = if self.rule == Rule::HandOverTokenAtRead {
                    res.revision
                } else {
                    0
                };
                let c = &mut state.clients[client];
                c.release = release;
                c.hand_to = hand_to;
                c.read_revision = read_revision;
                c.phase = Phase::Releasing { resource };
            }
        }
    }

    /// The client's up-conversion writes its mark.
    fn mark(&self, state: &mut State, client: usize) {
        let Phase::Marking { resource } = state.clients[client].phase else {
            return;
        };
        let Op::Convert { mode, .. } = self.current_op(state, client) else {
            return;
        };
        let Some(held) = state.clients[client].held[usize::from(resource)] else {
            return self.advance(state, client);
        };
        if find(&state.resources[usize::from(resource)], held.entry).is_none() {
            // The write's condition fails on a vanished entry; the read
            // after it finds the session lost.
            return self.learn_lost(state, client);
        }
        self.set_converting(state, resource, held.entry, Some(mode));
        state.clients[client].phase = Phase::Marked { resource };
    }

    /// The client's given-up conversion takes its mark back (if its entry
    /// is still there) and ends.
    fn take_back(&self, state: &mut State, client: usize) {
        let Phase::GivingUp { resource } = state.clients[client].phase else {
            return;
        };
        if let Some(held) = state.clients[client].held[usize::from(resource)] {
            self.set_converting(state, resource, held.entry, None);
        }
        self.advance(state, client);
    }

    /// ([`Rule::GrantBeforeMark`]) the grant decided on the read before the
    /// mark, written if every entry of that read is at the version read.
    fn grant_from_read(&self, state: &mut State, client: usize) {
        let Phase::Granting { resource } = state.clients[client].phase else {
            return;
        };
        let read = std::mem::take(&mut state.clients[client].read);
        let (Op::Convert { mode, .. }, Some(held)) = (
            self.current_op(state, client),
            state.clients[client].held[usize::from(resource)],
        ) else {
            return self.advance(state, client);
        };
        let res = &state.resources[usize::from(resource)];
        let unchanged = read
            .iter()
            .all(|&(id, version)| find(res, id).is_some_and(|e| e.version == version));
        if unchanged {
            self.grant_conversion(state, client, resource, held.entry, mode);
        } else {
            // A condition failed: read again.
            state.clients[client].phase = Phase::Ready;
        }
    }

    /// The release's write: if every entry of its read is as read, it
    /// deletes the releaser's entry and grants the requests its read chose,
    /// all with one token, the write's revision; the value block names a
    /// PW or EX request granted (or else is cleared if it named the
    /// releaser). Otherwise, or with `fails`, it only deletes the releaser's
    /// entry (the plain release; its waiters read and decide for
    /// themselves).
    fn hand_over(&self, state: &mut State, client: usize, fails: bool) {
        let Phase::Releasing { resource } = state.clients[client].phase else {
            return;
        };
        let r = usize::from(resource);
        let c = &mut state.clients[client];
        let release = std::mem::take(&mut c.release);
        let hand_to = std::mem::take(&mut c.hand_to);
        let read_revision = std::mem::take(&mut c.read_revision);
        let Some(held) = c.held[r].take() else {
            return self.advance(state, client);
        };
        let res = &state.resources[r];
        let unchanged = release.iter().all(|read| find(res, read.id) == Some(read));
        if !unchanged || fails {
            state.ghost.hand_over_fell_back |= !unchanged;
            self.remove_own(state, resource, held.entry, true);
            return self.advance(state, client);
        }
        let res = &mut state.resources[r];
        let token = if self.rule == Rule::HandOverTokenAtRead {
            read_revision
        } else {
            res.revision += 1;
            res.revision
        };
        if res.block == held.entry {
            res.block = 0;
        }
        res.entries.retain(|e| e.id != held.entry);
        for &id in &hand_to {
            let Some(pos) = res.entries.iter().position(|e| e.id == id) else {
                continue;
            };
            let mode = res.entries[pos].mode;
            let bypass = res.entries[..pos].iter().any(|earlier| match self.config.queueing {
                Queueing::Modes => {
                    (!earlier.granted && !earlier.mode.compatible(mode))
                        || earlier.converting.is_some_and(|t| !t.compatible(mode))
                }
                Queueing::Permits(_) => !earlier.granted,
            });
            state.ghost.bypass |= bypass;
            res.grants += 1;
            if mode.fenced_writer() {
                res.block = id;
            }
            let entry = &mut res.entries[pos];
            entry.granted = true;
            entry.token = if self.rule == Rule::TokenAtAppend { id } else { token };
            entry.grant = res.grants;
            if self.rule == Rule::GrantBeforeMark {
                entry.version += 1;
            }
        }
        self.notify(state, resource, held.entry, true);
        for &id in &hand_to {
            self.notify(state, resource, id, false);
        }
        self.advance(state, client);
    }

    /// A blocked `try_` request removes its entry.
    fn withdraw(&self, state: &mut State, client: usize) {
        let Phase::Withdrawing { resource, entry } = state.clients[client].phase else {
            return;
        };
        // Never handed the lock (it did not ask), so never named in the
        // value block: a plain delete.
        self.remove_own(state, resource, entry, false);
        self.advance(state, client);
    }

    fn deliver_append(&self, state: &mut State, append: Append) {
        remove_one(&mut state.appends, &append);
        let client = usize::from(append.client);
        let c = &state.clients[client];
        let answered = c.phase
            == Phase::Appending {
                resource: append.resource,
            }
            && c.pc == append.attempt;
        if !c.live {
            // Refused: the session's lease is gone.
            if answered {
                self.learn_lost(state, client);
            }
            return;
        }
        let res = &mut state.resources[usize::from(append.resource)];
        let known = if self.rule == Rule::ForgetAttempts {
            res.entries
                .iter()
                .any(|e| e.owner == append.client && e.attempt == append.attempt)
        } else {
            res.attempts.contains(&(append.client, append.attempt))
        };
        if known {
            return;
        }
        res.revision += 1;
        let id = res.revision;
        res.entries.push(Entry {
            id,
            owner: append.client,
            attempt: append.attempt,
            mode: append.mode,
            granted: false,
            converting: None,
            since: 0,
            token: 0,
            version: 0,
            grant: 0,
        });
        if self.rule != Rule::ForgetAttempts {
            insert_sorted(&mut res.attempts, (append.client, append.attempt));
        }
        if answered {
            let decision = self.decide(res, id);
            self.act_on_request(state, client, append.resource, id, decision);
        }
    }

    fn deliver_wake(&self, state: &mut State, wake: Wake) {
        remove_one(&mut state.wakes, &wake);
        let client = usize::from(wake.client);
        let c = &state.clients[client];
        let r = usize::from(wake.resource);
        match c.phase {
            Phase::Waiting { resource, entry, on } if resource == wake.resource && on == wake.entry => {
                let res = &state.resources[r];
                let decision = if self.rule == Rule::GrantOnWake && find(res, entry).is_some() {
                    Decision::Hold
                } else {
                    self.decide(res, entry)
                };
                self.act_on_request(state, client, resource, entry, decision);
            }
            Phase::Converting { resource, on } if resource == wake.resource && on == wake.entry => {
                let own = c.held[r].and_then(|held| find(&state.resources[r], held.entry));
                match own {
                    Some(&Entry {
                        id,
                        converting: Some(target),
                        ..
                    }) if self.rule == Rule::GrantOnWake => self.grant_conversion(state, client, resource, id, target),
                    _ => self.read_after_mark(state, client, resource),
                }
            }
            _ => state.ghost.stale_wake_ignored = true,
        }
    }

    fn cancel(&self, state: &mut State, client: usize) {
        let pc = state.clients[client].pc;
        match state.clients[client].phase {
            Phase::Appending { resource } => {
                // Abandon the attempt: a copy still on its way makes nothing.
                if self.rule != Rule::ForgetAttempts {
                    insert_sorted(&mut state.resources[usize::from(resource)].attempts, (client as u8, pc));
                }
            }
            Phase::Waiting { resource, entry, .. } => {
                // A release may have handed it the lock already: its
                // removal is then a release, and writes the value block.
                let res = &state.resources[usize::from(resource)];
                state.ghost.handed_over_cancelled |= find(res, entry).is_some_and(|e| e.granted);
                self.remove_own(state, resource, entry, self.rule != Rule::CancelKeepsBlockName);
            }
            // Nothing written yet.
            Phase::Marking { .. } => {}
            Phase::Granting { .. } => state.clients[client].read.clear(),
            Phase::Marked { resource } | Phase::Converting { resource, .. } => {
                if let Some(held) = state.clients[client].held[usize::from(resource)] {
                    self.set_converting(state, resource, held.entry, None);
                }
            }
            Phase::Ready
            | Phase::GivingUp { .. }
            | Phase::Releasing { .. }
            | Phase::Withdrawing { .. }
            | Phase::Done => return,
        }
        self.advance(state, client);
    }

    fn expire(&self, state: &mut State, client: usize) {
        state.clients[client].live = false;
        state.budget.expiries -= 1;
        for resource in 0..state.resources.len() {
            let owned: Vec<u8> = state.resources[resource]
                .entries
                .iter()
                .filter(|e| usize::from(e.owner) == client)
                .map(|e| e.id)
                .collect();
            for id in owned {
                self.remove_entry(state, resource as u8, id);
            }
        }
    }
}

fn insert_sorted<T: Ord>(items: &mut Vec<T>, item: T) {
    let at = items.partition_point(|x| *x <= item);
    items.insert(at, item);
}

fn remove_one<T: PartialEq>(items: &mut Vec<T>, item: &T) {
    if let Some(pos) = items.iter().position(|x| x == item) {
        items.remove(pos);
    }
}

impl Model for QueueModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let resources = usize::from(self.config.resources);
        vec![State {
            resources: vec![Resource::default(); resources],
            clients: self
                .config
                .scripts
                .iter()
                .map(|script| Client {
                    pc: 0,
                    phase: if script.is_empty() { Phase::Done } else { Phase::Ready },
                    live: true,
                    held: vec![None; resources],
                    read: Vec::new(),
                    release: Vec::new(),
                    hand_to: Vec::new(),
                    read_revision: 0,
                })
                .collect(),
            wakes: Vec::new(),
            appends: Vec::new(),
            budget: Budget {
                expiries: self.config.expiries,
                duplicate_wakes: self.config.duplicate_wakes,
                append_retries: self.config.append_retries,
            },
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (index, client) in state.clients.iter().enumerate() {
            let id = index as u8;
            match client.phase {
                Phase::Ready => actions.push(Action::Step(id)),
                Phase::Marking { .. } => actions.push(Action::Mark(id)),
                Phase::Marked { .. } => actions.push(Action::ReadAfterMark(id)),
                Phase::GivingUp { .. } => actions.push(Action::TakeBack(id)),
                Phase::Granting { .. } => actions.push(Action::GrantFromRead(id)),
                Phase::Releasing { .. } => {
                    actions.push(Action::HandOver(id));
                    actions.push(Action::ReleaseOnly(id));
                }
                Phase::Withdrawing { .. } => actions.push(Action::Withdraw(id)),
                Phase::Appending { .. } if state.budget.append_retries > 0 => actions.push(Action::RetryAppend(id)),
                _ => {}
            }
            if client.phase == Phase::Done {
                continue;
            }
            if client.live && state.budget.expiries > 0 {
                actions.push(Action::Expire(id));
            }
            if !client.live {
                actions.push(Action::Learn(id));
            }
            let waiting = matches!(
                client.phase,
                Phase::Appending { .. }
                    | Phase::Waiting { .. }
                    | Phase::Marking { .. }
                    | Phase::Marked { .. }
                    | Phase::Converting { .. }
                    | Phase::Granting { .. }
            );
            if waiting && self.current_op(state, index).patience() == Patience::Timeout {
                actions.push(Action::Cancel(id));
            }
        }
        let mut last = None;
        for &append in &state.appends {
            if last != Some(append) {
                actions.push(Action::DeliverAppend(append));
            }
            last = Some(append);
        }
        let mut last = None;
        for &wake in &state.wakes {
            if last != Some(wake) {
                actions.push(Action::DeliverWake(wake));
                if state.budget.duplicate_wakes > 0 {
                    actions.push(Action::DuplicateWake(wake));
                }
            }
            last = Some(wake);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Step(client) => self.step(&mut state, usize::from(client)),
            Action::Mark(client) => self.mark(&mut state, usize::from(client)),
            Action::ReadAfterMark(client) => {
                let Phase::Marked { resource } = state.clients[usize::from(client)].phase else {
                    return None;
                };
                self.read_after_mark(&mut state, usize::from(client), resource);
            }
            Action::TakeBack(client) => self.take_back(&mut state, usize::from(client)),
            Action::GrantFromRead(client) => self.grant_from_read(&mut state, usize::from(client)),
            Action::DeliverAppend(append) => self.deliver_append(&mut state, append),
            Action::RetryAppend(client) => {
                let c = &state.clients[usize::from(client)];
                let Phase::Appending { .. } = c.phase else {
                    return None;
                };
                let Op::Lock { resource, mode, .. } = self.current_op(&state, usize::from(client)) else {
                    return None;
                };
                let append = Append {
                    client,
                    resource,
                    attempt: c.pc,
                    mode,
                };
                insert_sorted(&mut state.appends, append);
                state.budget.append_retries -= 1;
            }
            Action::DeliverWake(wake) => self.deliver_wake(&mut state, wake),
            Action::DuplicateWake(wake) => {
                insert_sorted(&mut state.wakes, wake);
                state.budget.duplicate_wakes -= 1;
            }
            Action::Expire(client) => self.expire(&mut state, usize::from(client)),
            Action::Learn(client) => self.learn_lost(&mut state, usize::from(client)),
            Action::Cancel(client) => self.cancel(&mut state, usize::from(client)),
            Action::HandOver(client) => self.hand_over(&mut state, usize::from(client), false),
            Action::ReleaseOnly(client) => self.hand_over(&mut state, usize::from(client), true),
            Action::Withdraw(client) => self.withdraw(&mut state, usize::from(client)),
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(property::EXCLUSION, exclusion),
            Property::always(property::FENCED, fenced),
            Property::always(property::LIVE_WRITES_ACCEPTED, live_writes_accepted),
            Property::always(property::NO_BYPASS, no_bypass),
            Property::always(property::DEADLOCK_DETECTED, no_deadlock),
            Property::always(property::NO_FALSE_DEADLOCK, no_false_deadlock),
            Property::always(property::NO_ENTRY_LEFT, no_entry_left),
            Property::always(property::NO_STRAY_MARK, no_stray_mark),
            Property::always(property::HERD_FREE, herd_free),
            Property::always(property::NO_LOST_WAKEUP, no_lost_wakeup),
            Property::always(property::BLOCK_LOST_ONLY_BY_LOSS, block_lost_only_by_loss),
            Property::eventually(property::ALL_END, all_end),
            Property::sometimes(property::GRANTED, granted),
            Property::sometimes(property::CONVERTED, converted),
            Property::sometimes(property::DEADLOCK_FOUND, deadlock_found),
            Property::sometimes(property::DEADLOCK_AFTER_MARK, deadlock_after_mark),
            Property::sometimes(property::STALE_WRITE_REFUSED, stale_write_refused),
            Property::sometimes(property::STALE_HOLDER, stale_holder),
            Property::sometimes(property::STALE_WAKE_IGNORED, stale_wake_ignored),
            Property::sometimes(property::HANDED_OVER, handed_over),
            Property::sometimes(property::HAND_OVER_FELL_BACK, hand_over_fell_back),
            Property::sometimes(property::HANDED_OVER_CANCELLED, handed_over_cancelled),
        ]
    }
}

fn fenced(_: &QueueModel, state: &State) -> bool {
    !state.ghost.stale_write_accepted
}

fn live_writes_accepted(_: &QueueModel, state: &State) -> bool {
    !state.ghost.live_write_refused
}

fn no_bypass(_: &QueueModel, state: &State) -> bool {
    !state.ghost.bypass
}

/// Property 4: no cycle of waiting entries stands whose conversions have
/// all made their read after the mark and sleep (waiting on one entry).
/// Requests always count: every cycle holds a conversion.
fn no_deadlock(model: &QueueModel, state: &State) -> bool {
    state.resources.iter().enumerate().all(|(r, res)| {
        let asleep = |e: &Entry| {
            let phase = state.clients[usize::from(e.owner)].phase;
            let sleeps = matches!(phase, Phase::Converting { resource, .. } if usize::from(resource) == r);
            !e.granted || (e.converting.is_some() && sleeps)
        };
        res.entries
            .iter()
            .filter(|e| asleep(e))
            .all(|e| !model.reaches(res, e.id, e.id, &asleep))
    })
}

fn no_false_deadlock(_: &QueueModel, state: &State) -> bool {
    !state.ghost.false_deadlock
}

/// Property 5b: an entry is marked converting only while its owner's
/// conversion runs: after the mark, before the grant or the take-back.
fn no_stray_mark(_: &QueueModel, state: &State) -> bool {
    state.resources.iter().enumerate().all(|(r, res)| {
        res.entries
            .iter()
            .filter(|e| e.converting.is_some())
            .all(|e| match state.clients[usize::from(e.owner)].phase {
                Phase::Marked { resource } | Phase::Converting { resource, .. } | Phase::GivingUp { resource } => {
                    usize::from(resource) == r
                }
                _ => false,
            })
    })
}

fn no_entry_left(_: &QueueModel, state: &State) -> bool {
    !state.all_done() || state.resources.iter().all(|r| r.entries.is_empty())
}

fn handed_over(_: &QueueModel, state: &State) -> bool {
    state.ghost.handed_over
}

fn hand_over_fell_back(_: &QueueModel, state: &State) -> bool {
    state.ghost.hand_over_fell_back
}

fn handed_over_cancelled(_: &QueueModel, state: &State) -> bool {
    state.ghost.handed_over_cancelled
}

fn block_lost_only_by_loss(_: &QueueModel, state: &State) -> bool {
    !state.ghost.block_falsely_lost
}

fn herd_free(_: &QueueModel, state: &State) -> bool {
    !state.ghost.herd
}

fn all_end(_: &QueueModel, state: &State) -> bool {
    state.all_done()
}

fn granted(_: &QueueModel, state: &State) -> bool {
    state.clients.iter().any(|c| c.held.iter().any(Option::is_some))
}

fn converted(_: &QueueModel, state: &State) -> bool {
    state.ghost.converted
}

fn deadlock_found(_: &QueueModel, state: &State) -> bool {
    state.ghost.deadlock_detected
}

fn deadlock_after_mark(_: &QueueModel, state: &State) -> bool {
    state.ghost.deadlock_after_mark
}

fn stale_write_refused(_: &QueueModel, state: &State) -> bool {
    state.ghost.stale_write_refused
}

fn stale_holder(_: &QueueModel, state: &State) -> bool {
    state
        .clients
        .iter()
        .any(|c| !c.live && c.held.iter().any(Option::is_some))
}

fn stale_wake_ignored(_: &QueueModel, state: &State) -> bool {
    state.ghost.stale_wake_ignored
}

/// Property 1: the live clients that believe they hold a resource hold
/// compatible modes (at most `n` of them for a semaphore).
fn exclusion(model: &QueueModel, state: &State) -> bool {
    (0..usize::from(model.config.resources)).all(|r| {
        let holders: Vec<Held> = state
            .clients
            .iter()
            .filter(|c| c.live)
            .filter_map(|c| c.held[r])
            .collect();
        match model.config.queueing {
            Queueing::Permits(n) => holders.len() <= usize::from(n.max(1)),
            Queueing::Modes => holders
                .iter()
                .enumerate()
                .all(|(i, a)| holders[i + 1..].iter().all(|b| a.mode.compatible(b.mode))),
        }
    })
}

/// Property 7: a live waiter whose entry is no longer blocked by the entry
/// it waits on has a wake-up on its way.
fn no_lost_wakeup(model: &QueueModel, state: &State) -> bool {
    state.clients.iter().enumerate().all(|(index, c)| {
        if !c.live {
            return true;
        }
        let (resource, on, own) = match c.phase {
            Phase::Waiting { resource, entry, on } => (resource, on, entry),
            Phase::Converting { resource, on } => match c.held[usize::from(resource)] {
                Some(held) => (resource, on, held.entry),
                None => return true,
            },
            _ => return true,
        };
        let res = &state.resources[usize::from(resource)];
        let Some(entry) = res.entries.iter().find(|e| e.id == own) else {
            return true;
        };
        model.blockers(res, entry).contains(&on)
            || state.wakes.contains(&Wake {
                client: index as u8,
                resource,
                entry: on,
            })
    })
}
