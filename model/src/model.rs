//! The model: the server's steps, the clients' steps, the faults, and the
//! properties the checker holds them to.

use stateright::{Model, Property};

use crate::state::{Append, Budget, Client, Entry, Ghost, Held, Phase, Resource, State, Wake};
use crate::{property, Config, Op, Patience, Queueing, Rule};

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
    /// The client runs its next step: sends an append, converts, writes or
    /// releases (each but the append one atomic round trip).
    Step(u8),
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
    /// future): the request is withdrawn, or the conversion given up.
    Cancel(u8),
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
    fn blocks_request(&self, earlier: &Entry, mode: crate::Mode) -> bool {
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
        let Some(entry) = resource.entries.iter().find(|e| e.id == id) else {
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

    /// Whether `id` lies on a cycle of entries that wait on each other
    /// (edges to every blocker that itself waits: a request, or a granted
    /// entry converting up). Nothing on such a cycle is ever granted.
    pub fn in_cycle(&self, resource: &Resource, id: u8) -> bool {
        let waits = |e: &Entry| !e.granted || e.converting.is_some();
        let mut seen: Vec<u8> = Vec::new();
        let mut stack = vec![id];
        while let Some(at) = stack.pop() {
            let Some(entry) = resource.entries.iter().find(|e| e.id == at) else {
                continue;
            };
            for next in self.blockers(resource, entry) {
                if next == id {
                    return true;
                }
                let waiting = resource.entries.iter().any(|e| e.id == next && waits(e));
                if waiting && !seen.contains(&next) {
                    seen.push(next);
                    stack.push(next);
                }
            }
        }
        false
    }

    /// Whether the conversion `id` just asked for can never be granted, as
    /// the rule detects it.
    fn deadlocked(&self, resource: &Resource, id: u8) -> bool {
        match self.rule {
            Rule::NoDeadlockDetection => false,
            Rule::PairwiseDeadlockDetection => {
                let Some(me) = resource.entries.iter().find(|e| e.id == id) else {
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
                })
            }
            _ => self.in_cycle(resource, id),
        }
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
    }

    /// Tells the waiters of entry `id` that it was removed or changed.
    fn notify(&self, state: &mut State, resource: u8, id: u8, removed: bool) {
        if !removed && self.rule == Rule::WakeOnRemovalOnly {
            return;
        }
        for client in 0..state.clients.len() {
            let Some((r, on)) = state.clients[client].phase.waits_on() else {
                continue;
            };
            if r != resource || (on != id && self.rule != Rule::WakeEveryWaiter) {
                continue;
            }
            if on != id {
                state.ghost.herd = true;
            }
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

    fn grant_request(&self, state: &mut State, client: usize, resource: u8, id: u8) {
        let res = &mut state.resources[usize::from(resource)];
        let Some(pos) = res.entries.iter().position(|e| e.id == id) else {
            return self.learn_lost(state, client);
        };
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
        let entry = &mut res.entries[pos];
        entry.granted = true;
        entry.token = token;
        state.ghost.bypass |= bypass;
        state.clients[client].held[usize::from(resource)] = Some(Held {
            entry: id,
            mode,
            token,
            grant,
        });
        self.advance(state, client);
    }

    fn grant_conversion(&self, state: &mut State, client: usize, resource: u8, id: u8) {
        let res = &mut state.resources[usize::from(resource)];
        let Some(pos) = res.entries.iter().position(|e| e.id == id) else {
            return self.learn_lost(state, client);
        };
        let Some(target) = res.entries[pos].converting else {
            return self.advance(state, client);
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
        let entry = &mut res.entries[pos];
        entry.mode = target;
        entry.converting = None;
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

    /// Acts on what a read decided for the client's entry `id`.
    fn act_on(&self, state: &mut State, client: usize, resource: u8, id: u8, decision: Decision) {
        let converting = state.resources[usize::from(resource)]
            .entries
            .iter()
            .any(|e| e.id == id && e.granted);
        match decision {
            Decision::Gone => self.learn_lost(state, client),
            Decision::Hold if converting => self.grant_conversion(state, client, resource, id),
            Decision::Hold => self.grant_request(state, client, resource, id),
            Decision::Blocked(on) => {
                if self.current_op(state, client).patience() == Patience::Try {
                    if converting {
                        set_converting(state, resource, id, None);
                    } else {
                        self.remove_entry(state, resource, id);
                    }
                    self.advance(state, client);
                } else {
                    state.clients[client].phase = if converting {
                        Phase::Converting { resource, on }
                    } else {
                        Phase::Waiting {
                            resource,
                            entry: id,
                            on,
                        }
                    };
                }
            }
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
                let res = &mut state.resources[r];
                let Some(pos) = res.entries.iter().position(|e| e.id == held.entry) else {
                    // The conversion finds the entry gone: the session was lost.
                    return self.learn_lost(state, client);
                };
                if mode.is_down_from(held.mode) {
                    res.entries[pos].mode = mode;
                    if let Some(h) = state.clients[client].held[r].as_mut() {
                        h.mode = mode;
                    }
                    if mode != held.mode {
                        self.notify(state, resource, held.entry, false);
                    }
                    return self.advance(state, client);
                }
                res.entries[pos].converting = Some(mode);
                if self.deadlocked(&state.resources[r], held.entry) {
                    // The later conversion fails at once and keeps its mode.
                    set_converting(state, resource, held.entry, None);
                    state.ghost.deadlock_detected = true;
                    return self.advance(state, client);
                }
                let decision = self.decide(&state.resources[r], held.entry);
                self.act_on(state, client, resource, held.entry, decision);
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
                if let Some(held) = state.clients[client].held[r].take() {
                    // A fenced delete: only this very entry, if still there.
                    self.remove_entry(state, resource, held.entry);
                }
                self.advance(state, client);
            }
        }
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
            token: 0,
        });
        if self.rule != Rule::ForgetAttempts {
            insert_sorted(&mut res.attempts, (append.client, append.attempt));
        }
        if answered {
            let decision = self.decide(res, id);
            self.act_on(state, client, append.resource, id, decision);
        }
    }

    fn deliver_wake(&self, state: &mut State, wake: Wake) {
        remove_one(&mut state.wakes, &wake);
        let client = usize::from(wake.client);
        let c = &state.clients[client];
        let own = match c.phase {
            Phase::Waiting { resource, entry, on } if resource == wake.resource && on == wake.entry => entry,
            Phase::Converting { resource, on } if resource == wake.resource && on == wake.entry => {
                match c.held[usize::from(resource)] {
                    Some(held) => held.entry,
                    None => return self.learn_lost(state, client),
                }
            }
            _ => {
                state.ghost.stale_wake_ignored = true;
                return;
            }
        };
        let res = &state.resources[usize::from(wake.resource)];
        let decision = if self.rule == Rule::GrantOnWake && res.entries.iter().any(|e| e.id == own) {
            Decision::Hold
        } else {
            self.decide(res, own)
        };
        self.act_on(state, client, wake.resource, own, decision);
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
            Phase::Waiting { resource, entry, .. } => self.remove_entry(state, resource, entry),
            Phase::Converting { resource, .. } => {
                if let Some(held) = state.clients[client].held[usize::from(resource)] {
                    set_converting(state, resource, held.entry, None);
                    self.notify(state, resource, held.entry, false);
                }
            }
            Phase::Ready | Phase::Done => return,
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

fn set_converting(state: &mut State, resource: u8, id: u8, to: Option<crate::Mode>) {
    if let Some(entry) = state.resources[usize::from(resource)]
        .entries
        .iter_mut()
        .find(|e| e.id == id)
    {
        entry.converting = to;
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
                Phase::Appending { .. } | Phase::Waiting { .. } | Phase::Converting { .. }
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
            Property::always(property::NO_ENTRY_LEFT, no_entry_left),
            Property::always(property::HERD_FREE, herd_free),
            Property::always(property::NO_LOST_WAKEUP, no_lost_wakeup),
            Property::eventually(property::ALL_END, all_end),
            Property::sometimes(property::GRANTED, granted),
            Property::sometimes(property::CONVERTED, converted),
            Property::sometimes(property::DEADLOCK_FOUND, deadlock_found),
            Property::sometimes(property::STALE_WRITE_REFUSED, stale_write_refused),
            Property::sometimes(property::STALE_HOLDER, stale_holder),
            Property::sometimes(property::STALE_WAKE_IGNORED, stale_wake_ignored),
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

fn no_deadlock(model: &QueueModel, state: &State) -> bool {
    state
        .resources
        .iter()
        .all(|res| res.entries.iter().all(|e| !model.in_cycle(res, e.id)))
}

fn no_entry_left(_: &QueueModel, state: &State) -> bool {
    !state.all_done() || state.resources.iter().all(|r| r.entries.is_empty())
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
