//! A client's steps: its script run one step at a time (append, convert,
//! write, release), the reads that decide, the grants they write, the
//! marks of an up-conversion and their taking back, the release's
//! hand-over, a `try_` withdrawn, a deadline passed.

use super::decide::{find, next_mark, Decision};
use super::server::insert_sorted;
use crate::state::{Append, Entry, Held, Phase, Resource, State};
use crate::{Mode, Op, Patience, QueueModel, Rule};

impl QueueModel {
    pub(super) fn advance(&self, state: &mut State, client: usize) {
        let c = &mut state.clients[client];
        c.pc += 1;
        c.phase = if usize::from(c.pc) >= self.script(client).len() {
            Phase::Done
        } else {
            Phase::Ready
        };
    }

    pub(super) fn learn_lost(&self, state: &mut State, client: usize) {
        let c = &mut state.clients[client];
        c.phase = Phase::Done;
        c.held.iter_mut().for_each(|h| *h = None);
        c.read.clear();
        c.release.clear();
        c.hand_to.clear();
        c.read_revision = 0;
        c.clears_block = false;
    }

    /// A request granted: decided on one read, written conditioned on the
    /// entries before it and itself (see the crate docs for why one atomic
    /// step is that).
    pub(super) fn grant_request(&self, state: &mut State, client: usize, resource: u8, id: u8) {
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
        let bypass = self.bypasses(&res.entries[..pos], mode);
        let token = if self.rule == Rule::TokenAtAppend {
            id
        } else {
            res.revision += 1;
            res.revision
        };
        state.ghost.token_fell |= mode.writes() && token_below(res, token);
        if mode.fenced_writer() {
            self.write_pending_again(res, pos, &[]);
        } else if lost_named(res) {
            res.block = 0;
        }
        let grant = count_grant(res, id, mode);
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

    /// An up-conversion of entry `id` to `target` granted: the write of a
    /// grant decided on one read, whose condition (every entry of that
    /// read as read) held. The same write writes again, as they are, the
    /// other entries converting to a mode `target` conflicts with (a new
    /// version each): a grant of theirs decided on a read that never saw
    /// this entry's latest state then fails its condition and reads again.
    pub(super) fn grant_conversion(
        &self,
        state: &mut State,
        client: usize,
        resource: u8,
        id: u8,
        target: Mode,
        clears: bool,
    ) {
        let res = &mut state.resources[usize::from(resource)];
        let Some(pos) = res.entries.iter().position(|e| e.id == id) else {
            return self.learn_lost(state, client);
        };
        if self.rule != Rule::ConversionGrantLeavesOthers {
            for other in res.entries.iter_mut() {
                if other.id != id && other.converting.is_some_and(|to| !to.compatible(target)) {
                    self.written(other);
                }
            }
        }
        let bypass = res.entries[..pos]
            .iter()
            .any(|earlier| !earlier.granted && !earlier.mode.compatible(target));
        if target.writes() && self.rule != Rule::KeepTokenOnConversion {
            res.revision += 1;
            state.ghost.token_fell |= token_below(res, res.revision);
            res.entries[pos].token = res.revision;
        }
        if target.fenced_writer() {
            self.write_pending_again(res, pos, &[]);
        } else if clears {
            res.block = 0;
        }
        let grant = count_grant(res, id, target);
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

    /// A PW or EX grant of the entry at `pos` writes again (a new version)
    /// every entry before it that still waits or converts, but those in
    /// `granted` (granted by the same write): a grant of theirs decided on
    /// an older read, which would clear a lost holder's name from the value
    /// block as that read had it, then fails and reads again
    /// (`View::pending_before`; not under
    /// [`Rule::WriterGrantLeavesPending`]).
    fn write_pending_again(&self, res: &mut Resource, pos: usize, granted: &[u8]) {
        if self.rule == Rule::WriterGrantLeavesPending {
            return;
        }
        for earlier in res.entries[..pos].iter_mut() {
            if (!earlier.granted || earlier.converting.is_some()) && !granted.contains(&earlier.id) {
                self.written(earlier);
            }
        }
    }

    /// Acts on what a read decided for the client's waiting request `id`.
    pub(super) fn act_on_request(&self, state: &mut State, client: usize, resource: u8, id: u8, decision: Decision) {
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
    pub(super) fn read_after_mark(&self, state: &mut State, client: usize, resource: u8) {
        let Some(held) = state.clients[client].held[usize::from(resource)] else {
            return self.learn_lost(state, client);
        };
        let res = &state.resources[usize::from(resource)];
        let Some(entry) = find(res, held.entry) else {
            // The read finds the entry gone: the session was lost.
            return self.learn_lost(state, client);
        };
        if entry.converting.is_none() {
            return self.advance(state, client);
        }
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
            Decision::Hold => {
                // The grant is a later write, conditioned on every entry of
                // this read.
                let snapshot: Vec<(u8, u8)> = res.entries.iter().map(|e| (e.id, e.version)).collect();
                let clears = lost_named(res);
                let c = &mut state.clients[client];
                c.read = snapshot;
                c.clears_block = clears;
                c.phase = Phase::Granting { resource };
            }
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
    pub(super) fn read_before_mark(&self, state: &mut State, client: usize, resource: u8, id: u8, mode: Mode) {
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

    pub(super) fn step(&self, state: &mut State, client: usize) {
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
                // A block naming a holder lost without a release: the
                // successor may owe a lock-delay, so the waiters decide for
                // themselves (as `mode_rule::offer` does).
                let hand_to = if find(res, held.entry).is_some() && !lost_named(res) {
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
    pub(super) fn mark(&self, state: &mut State, client: usize) {
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
    pub(super) fn take_back(&self, state: &mut State, client: usize) {
        let Phase::GivingUp { resource } = state.clients[client].phase else {
            return;
        };
        if let Some(held) = state.clients[client].held[usize::from(resource)] {
            self.set_converting(state, resource, held.entry, None);
        }
        self.advance(state, client);
    }

    /// An up-conversion's grant, decided on a read after its mark (under
    /// [`Rule::GrantBeforeMark`], on the read before it), written if every
    /// entry of that read is at the version read; otherwise it reads again.
    pub(super) fn grant_from_read(&self, state: &mut State, client: usize) {
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
        let clears = std::mem::take(&mut state.clients[client].clears_block);
        if unchanged {
            self.grant_conversion(state, client, resource, held.entry, mode, clears);
        } else if find(res, held.entry).is_some_and(|e| e.converting.is_some()) {
            // A condition failed: read again, after the mark.
            state.clients[client].phase = Phase::Marked { resource };
        } else {
            // A condition failed before any mark: start over.
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
    pub(super) fn hand_over(&self, state: &mut State, client: usize, fails: bool) {
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
        state.ghost.token_fell |= hand_to
            .iter()
            .any(|&id| find(res, id).is_some_and(|e| e.mode.writes()) && token_below(res, token));
        for &id in &hand_to {
            let Some(pos) = res.entries.iter().position(|e| e.id == id) else {
                continue;
            };
            let mode = res.entries[pos].mode;
            let bypass = self.bypasses(&res.entries[..pos], mode);
            state.ghost.bypass |= bypass;
            if mode.fenced_writer() {
                self.write_pending_again(res, pos, &hand_to);
            }
            let grant = count_grant(res, id, mode);
            let entry = &mut res.entries[pos];
            entry.granted = true;
            entry.token = if self.rule == Rule::TokenAtAppend { id } else { token };
            entry.grant = grant;
            self.written(entry);
        }
        self.notify(state, resource, held.entry, true);
        for &id in &hand_to {
            self.notify(state, resource, id, false);
        }
        self.advance(state, client);
    }

    /// A blocked `try_` request removes its entry.
    pub(super) fn withdraw(&self, state: &mut State, client: usize) {
        let Phase::Withdrawing { resource, entry } = state.clients[client].phase else {
            return;
        };
        // Never handed the lock (it did not ask), so never named in the
        // value block: a plain delete.
        self.remove_own(state, resource, entry, false);
        self.advance(state, client);
    }

    pub(super) fn cancel(&self, state: &mut State, client: usize) {
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
            Phase::Marked { resource } | Phase::Converting { resource, .. } | Phase::Granting { resource } => {
                // A grant not yet written is not sent: only the mark (if
                // any) is taken back.
                state.clients[client].read.clear();
                state.clients[client].clears_block = false;
                if let Some(held) = state.clients[client].held[usize::from(resource)] {
                    let res = &state.resources[usize::from(resource)];
                    if find(res, held.entry).is_some_and(|e| e.converting.is_some()) {
                        self.set_converting(state, resource, held.entry, None);
                    }
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
}

/// Whether a granted entry of `res` holds a token above `token` (the
/// entries `token` is about to be given to are not granted yet).
fn token_below(res: &Resource, token: u8) -> bool {
    res.entries.iter().any(|e| e.granted && e.token > token)
}

/// Whether the value block names an entry that is gone (`Block::lost_holder`).
pub(super) fn lost_named(res: &Resource) -> bool {
    res.block != 0 && find(res, res.block).is_none()
}

/// Counts a grant of entry `id` in `mode` on `res`: its number in the
/// order of grants, and the value block names it when it is PW or EX.
fn count_grant(res: &mut Resource, id: u8, mode: Mode) -> u8 {
    res.grants += 1;
    if mode.fenced_writer() {
        res.block = id;
    }
    res.grants
}
