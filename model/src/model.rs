//! The model: lockline's queue protocol as a state machine for the
//! checker, its actions and their order. What one read of the queue
//! decides is in `decide`; a client's steps in `client`; the server's
//! writes, the wake-ups they send, deliveries and expiry in `server`; what
//! the properties check in `conditions`.

use stateright::{Model, Property};

use crate::state::{Append, Budget, Client, Ghost, Phase, Resource, State, Wake};
use crate::{Config, Op, Patience, Rule};

mod client;
mod conditions;
mod decide;
mod server;

use server::insert_sorted;

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
    /// The client's up-conversion writes the grant decided on its read
    /// after its mark (under [`Rule::GrantBeforeMark`], before it), if
    /// every entry of that read is at the version read; otherwise it reads
    /// again.
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
                    clears_block: false,
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
        forget_versions(&mut state);
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        conditions::properties()
    }
}

/// Versions are compared only with those a pending conversion's grant read
/// ([`Client::read`](crate::state::Client::read)); with none pending, they
/// are set to 0 (in the queues and in the releases' reads alike), so that
/// states differing only in how often an entry was written are one.
fn forget_versions(state: &mut State) {
    if state.clients.iter().any(|c| !c.read.is_empty()) {
        return;
    }
    for entry in state.resources.iter_mut().flat_map(|r| r.entries.iter_mut()) {
        entry.version = 0;
    }
    for entry in state.clients.iter_mut().flat_map(|c| c.release.iter_mut()) {
        entry.version = 0;
    }
}
