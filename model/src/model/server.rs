//! The server's side: the writes that remove an entry or change its
//! conversion, the wake-ups they send (to the waiters they let on), an
//! append received, a wake-up delivered, a session expired.

use super::decide::{find, next_mark, Decision};
use crate::state::{Append, Entry, Phase, State, Wake};
use crate::{Mode, QueueModel, Rule};

impl QueueModel {
    /// The entry a waiting client's own entry is, if it waits.
    pub(super) fn own_entry(state: &State, client: usize) -> Option<u8> {
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
    pub(super) fn notify(&self, state: &mut State, resource: u8, id: u8, removed: bool) {
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

    pub(super) fn remove_entry(&self, state: &mut State, resource: u8, id: u8) {
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
    pub(super) fn remove_own(&self, state: &mut State, resource: u8, id: u8, writes_block: bool) {
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

    /// Sets the conversion of entry `id` (a mark, or none: taken back), as
    /// one write, and tells its waiters.
    pub(super) fn set_converting(&self, state: &mut State, resource: u8, id: u8, to: Option<Mode>) {
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

    /// Counts a write of `entry` in its version, which an up-conversion's
    /// grant compares with the version its read saw. Versions matter only
    /// while a grant is pending; the model forgets them otherwise (see
    /// `forget_versions`), so that they do not split states.
    pub(super) fn written(&self, entry: &mut Entry) {
        entry.version = entry.version.wrapping_add(1);
    }

    pub(super) fn deliver_append(&self, state: &mut State, append: Append) {
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

    pub(super) fn deliver_wake(&self, state: &mut State, wake: Wake) {
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
                    }) if self.rule == Rule::GrantOnWake => {
                        let clears = super::client::lost_named(&state.resources[r]);
                        self.grant_conversion(state, client, resource, id, target, clears)
                    }
                    _ => self.read_after_mark(state, client, resource),
                }
            }
            _ => state.ghost.stale_wake_ignored = true,
        }
    }

    pub(super) fn expire(&self, state: &mut State, client: usize) {
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

pub(super) fn insert_sorted<T: Ord>(items: &mut Vec<T>, item: T) {
    let at = items.partition_point(|x| *x <= item);
    items.insert(at, item);
}

pub(super) fn remove_one<T: PartialEq>(items: &mut Vec<T>, item: &T) {
    if let Some(pos) = items.iter().position(|x| x == item) {
        items.remove(pos);
    }
}
