//! What the checker holds the model to: each property's condition on a
//! state (the names and what they mean are in [`crate::property`]).

use stateright::Property;

use crate::state::{Entry, Held, Phase, State, Wake};
use crate::{property, QueueModel, Queueing};

/// Every property the checker holds the model to, with its condition.
pub(super) fn properties() -> Vec<Property<QueueModel>> {
    vec![
        Property::always(property::EXCLUSION, exclusion),
        Property::always(property::FENCED, |_, state: &State| !state.ghost.stale_write_accepted),
        Property::always(property::LIVE_WRITES_ACCEPTED, |_, state: &State| {
            !state.ghost.live_write_refused
        }),
        Property::always(property::TOKENS_RISE, |_, state: &State| !state.ghost.token_fell),
        Property::always(property::NO_BYPASS, |_, state: &State| !state.ghost.bypass),
        Property::always(property::DEADLOCK_DETECTED, no_deadlock),
        Property::always(property::NO_FALSE_DEADLOCK, |_, state: &State| {
            !state.ghost.false_deadlock
        }),
        Property::always(property::NO_ENTRY_LEFT, no_entry_left),
        Property::always(property::NO_STRAY_MARK, no_stray_mark),
        Property::always(property::HERD_FREE, |_, state: &State| !state.ghost.herd),
        Property::always(property::NO_LOST_WAKEUP, no_lost_wakeup),
        Property::always(property::BLOCK_LOST_ONLY_BY_LOSS, |_, state: &State| {
            !state.ghost.block_falsely_lost
        }),
        // A semaphore's permits (EX entries) keep no value block.
        Property::always(property::BLOCK_NAMES_WRITER, |model: &QueueModel, state: &State| {
            model.config.queueing != crate::Queueing::Modes
                || state.resources.iter().all(|res| {
                    res.entries
                        .iter()
                        .filter(|e| e.granted && e.mode.fenced_writer())
                        .all(|e| res.block == e.id)
                })
        }),
        Property::eventually(property::ALL_END, all_end),
        Property::sometimes(property::GRANTED, granted),
        Property::sometimes(property::CONVERTED, |_, state: &State| state.ghost.converted),
        Property::sometimes(property::DEADLOCK_FOUND, |_, state: &State| {
            state.ghost.deadlock_detected
        }),
        Property::sometimes(property::DEADLOCK_AFTER_MARK, |_, state: &State| {
            state.ghost.deadlock_after_mark
        }),
        Property::sometimes(property::STALE_WRITE_REFUSED, |_, state: &State| {
            state.ghost.stale_write_refused
        }),
        Property::sometimes(property::STALE_HOLDER, stale_holder),
        Property::sometimes(property::STALE_WAKE_IGNORED, |_, state: &State| {
            state.ghost.stale_wake_ignored
        }),
        Property::sometimes(property::HANDED_OVER, |_, state: &State| state.ghost.handed_over),
        Property::sometimes(property::HAND_OVER_FELL_BACK, |_, state: &State| {
            state.ghost.hand_over_fell_back
        }),
        Property::sometimes(property::HANDED_OVER_CANCELLED, |_, state: &State| {
            state.ghost.handed_over_cancelled
        }),
    ]
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

/// Property 5b: an entry is marked converting only while its owner's
/// conversion runs: after the mark, until the grant is written or the mark
/// taken back.
fn no_stray_mark(_: &QueueModel, state: &State) -> bool {
    state.resources.iter().enumerate().all(|(r, res)| {
        res.entries
            .iter()
            .filter(|e| e.converting.is_some())
            .all(|e| match state.clients[usize::from(e.owner)].phase {
                Phase::Marked { resource }
                | Phase::Converting { resource, .. }
                | Phase::Granting { resource }
                | Phase::GivingUp { resource } => usize::from(resource) == r,
                _ => false,
            })
    })
}

fn no_entry_left(_: &QueueModel, state: &State) -> bool {
    !state.all_done() || state.resources.iter().all(|r| r.entries.is_empty())
}

fn all_end(_: &QueueModel, state: &State) -> bool {
    state.all_done()
}

fn granted(_: &QueueModel, state: &State) -> bool {
    state.clients.iter().any(|c| c.held.iter().any(Option::is_some))
}

fn stale_holder(_: &QueueModel, state: &State) -> bool {
    state
        .clients
        .iter()
        .any(|c| !c.live && c.held.iter().any(Option::is_some))
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
