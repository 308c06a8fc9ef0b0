//! The lock-mode rule over one read of a queue, for
//! [`Resource`](crate::Resource): the state each entry's value carries
//! (`state`), who blocks whom and the cycles of conversions (`view`), the
//! lock value block (`block`), and the hand-over by which a release grants
//! the waiters its departure lets in, in its own write. Over the backend
//! session and the counters alone: the guards' releases call into it, and
//! it calls nothing above it.

use tokio::time::Instant;

use crate::backend::{BackendSession, Queue, QueueUpdate, Slot};
use crate::stats::Counters;
use crate::{Entry, EntryKind, Error, LockMode, Result};

mod block;
mod state;
mod view;

pub(crate) use block::Block;
pub use block::LockValue;
pub(crate) use state::{blocks, push_decimal, state_settled_or_waiting, State, LISTENING, TRY_REQUEST, WAITS};
pub(crate) use view::View;

/// Removes `mine` from the resource `name` as a release does, and in the
/// same write grants every waiting request its departure lets in (the
/// releaser hands over): the successors learn from their own wake that they
/// hold, with that write's place in the server's order as their token, and
/// write nothing. `leaving` is the value block a PW or EX holder leaves
/// (with no holder named); for any other entry, a block that names `mine`
/// (a request granted by a hand-over and cancelled before it knew) is
/// cleared the same way, so the departure never reads as a lost holder.
///
/// The hand-over is conditioned on the releaser's entry being there and on
/// every entry the decision read (each one up to the last granted, but the
/// releaser's) being at the version read; when that fails, or the block
/// names a holder lost without a release (the successor may owe a
/// lock-delay), or the session's server is in a restart grace, the entry
/// is removed alone and the waiters decide for themselves, as they always
/// can. Returns whether the entry was there to remove.
///
/// `granted_from` is a PW or EX holder's view of the queue when it was
/// granted (no one else writes the block while it holds): when someone
/// waited then, the hand-over is decided from it without a read (one round
/// trip, as a mutex's release), the queue read again only when its
/// condition fails; when no one waited then, the queue is read.
///
/// # Cancel safety
///
/// If cancelled, the removal (with or without the hand-over) may or may not
/// have been applied, all or none.
pub(crate) async fn hand_over(
    remote: &dyn BackendSession,
    counters: &Counters,
    name: &str,
    mine: &Entry,
    leaving: Option<&[u8]>,
    granted_from: Option<&View>,
) -> Result<bool> {
    let alone = |block: Option<Vec<u8>>| async move {
        match block {
            None => remote.remove(mine).await,
            Some(block) => {
                let update = QueueUpdate {
                    dir: name,
                    unchanged: &[],
                    present: &[mine],
                    set: &[],
                    delete: &[mine],
                    block: Some(&block),
                };
                Ok(remote.update_queue(&update).await?.is_some())
            }
        }
    };
    if let Some(view) = granted_from {
        if let Some(at) = view.position(mine) {
            match offer(remote, counters, name, mine, at, leaving, view, true).await? {
                Offer::Handed => return Ok(true),
                // No one waited then: the plain release, one round trip as
                // before the hand-over; waiters come since grant themselves.
                Offer::NoOne(block) => return alone(block).await,
                // The condition failed: read again.
                Offer::Refused(_) => {}
            }
        }
    }
    for _ in 0..LEAVE_TRIES {
        let view = match View::new(name, remote.read_queue(name).await?) {
            Ok(view) => view,
            // Another recipe's entries under the name (what refused this
            // entry's request): no rule to hand over by, and nothing to
            // wait for either, or the entry would stay for as long as they
            // do and block them. Removed alone, the block with it.
            Err(Error::InvalidName { .. }) => return alone(leaving.map(<[u8]>::to_vec)).await,
            Err(error) => return Err(error),
        };
        let Some(at) = view.position(mine) else {
            return Ok(false);
        };
        // A block to leave is written only while the server still shows
        // this lock in PW or EX: a down-conversion cancelled after its
        // write landed (which wrote the block) leaves it in the guard.
        let leaving = leaving.filter(|_| view.slots[at].1.granted.is_some_and(LockMode::sole_writer));
        let block = match offer(remote, counters, name, mine, at, leaving, &view, false).await? {
            Offer::Handed => return Ok(true),
            Offer::NoOne(block) | Offer::Refused(block) => block,
        };
        let (slot, state) = &view.slots[at];
        if state.granted.is_some() {
            // A holder: removed whatever marks waiters wrote on it.
            return alone(block).await;
        }
        // A waiting request leaves only as read: a release may hand it the
        // lock meanwhile, and it must then leave as a holder does (its name
        // cleared from the block, its successors let in).
        let unchanged = [(&slot.entry, slot.version)];
        let update = QueueUpdate {
            dir: name,
            unchanged: &unchanged,
            present: &[],
            set: &[],
            delete: &[mine],
            block: block.as_deref(),
        };
        if remote.update_queue(&update).await?.is_some() {
            return Ok(true);
        }
    }
    // Changed under it time after time (marks of waiters behind): removed
    // alone.
    remote.remove(mine).await
}

/// How many reads a leaving entry decides from before it is removed alone.
const LEAVE_TRIES: usize = 8;

/// What [`offer`] did.
enum Offer {
    /// The entry is gone, the waiters it let in granted.
    Handed,
    /// No one to hand over to: remove the entry alone, with this block.
    NoOne(Option<Vec<u8>>),
    /// The hand-over's condition failed; nothing was written. The block to
    /// remove the entry alone with.
    Refused(Option<Vec<u8>>),
}

/// The hand-over of entry `at` (`mine`) decided from `view`, and its write.
#[allow(clippy::too_many_arguments)]
async fn offer(
    remote: &dyn BackendSession,
    counters: &Counters,
    name: &str,
    mine: &Entry,
    at: usize,
    leaving: Option<&[u8]>,
    view: &View,
    cached: bool,
) -> Result<Offer> {
    let named = view
        .block
        .holder
        .as_ref()
        .is_some_and(|(key, order)| *key == mine.key && *order == mine.order);
    let leaving: Option<Block> = match leaving {
        Some(bytes) => Block::parse(bytes),
        None => named.then(|| Block {
            value: view.block.value.clone(),
            holder: None,
        }),
    };
    let alone = leaving.as_ref().map(Block::encode);
    let grace = remote.grant_not_before().is_some_and(|t| t > Instant::now());
    let grants = if grace || view.block.lost_holder(view) {
        Vec::new()
    } else {
        view.handed_over(at)
    };
    let Some(&(last, _)) = grants.last() else {
        return Ok(Offer::NoOne(alone));
    };
    let values: Vec<Vec<u8>> = grants
        .iter()
        .map(|&(i, mode)| {
            State {
                blocked: view.slots[i].1.blocked & !WAITS,
                ..State::held(mode, 0)
            }
            .encode()
        })
        .collect();
    let mut set: Vec<(&Entry, &[u8])> = grants
        .iter()
        .zip(&values)
        .map(|(&(i, _), value)| (&view.slots[i].0.entry, value.as_slice()))
        .collect();
    let unchanged: Vec<(&Entry, i64)> = (0..=last)
        .filter(|&j| j != at)
        .map(|j| (&view.slots[j].0.entry, view.slots[j].0.version))
        .collect();
    // A PW or EX successor is named in the block, as its own grant would
    // have named it.
    let writer = grants.iter().find(|(_, mode)| mode.sole_writer());
    if cached && writer.is_some() && leaving.is_none() {
        // The block read at the grant may have been written since (by a PW
        // or EX holder beside this one): a PW or EX successor is named in
        // the block as it is now.
        return Ok(Offer::Refused(alone));
    }
    let block = match (writer, leaving) {
        (Some(&(i, _)), Some(leaving)) => Some(Block {
            holder: Some((view.slots[i].0.entry.key.clone(), view.slots[i].0.entry.order)),
            ..leaving
        }),
        (Some(&(i, _)), None) => Some(view.block.granted_to(view, &view.slots[i].0.entry)),
        (None, leaving) => leaving,
    };
    let block_bytes = block.as_ref().map(Block::encode);
    // A PW or EX request handed the lock writes again, with its grant, the
    // entries before it whose grants may be pending from an older read
    // (see `View::pending_before`): all of them are in the condition.
    let touched = match writer {
        Some(&(i, _)) => {
            let granted: Vec<usize> = grants.iter().map(|&(j, _)| j).chain([at]).collect();
            view.pending_before(i, &granted)
        }
        None => Vec::new(),
    };
    set.extend(touched.iter().map(|(j, v)| (&view.slots[*j].0.entry, v.as_slice())));
    let update = QueueUpdate {
        dir: name,
        unchanged: &unchanged,
        present: &[mine],
        set: &set,
        delete: &[mine],
        block: block_bytes.as_deref(),
    };
    if remote.update_queue(&update).await?.is_some() {
        counters.bump(|c| &c.handovers);
        return Ok(Offer::Handed);
    }
    Ok(Offer::Refused(alone))
}

#[cfg(test)]
mod tests;
