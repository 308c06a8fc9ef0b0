//! The session's own entries (the flag their holders wait on), and the
//! turns its waiters read next: which entry each waits on, so that the
//! wait on it reads the waiter's turn in its own statement, and the turns
//! such waits read.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use super::Shared;
use crate::dialect::{Dialect, Row, Turn, TurnRead};
use crate::pool::Stop;

/// At most this many turns noted or read and not yet taken are kept (more
/// means waits given up without a read after them; they are dropped, and
/// those waiters read on their own).
const TURNS_KEPT: usize = 4096;

impl<D: Dialect> Shared<D> {
    /// The session's own entries, each with the flag its holders wait on.
    pub(super) fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<Stop>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks one of our entries gone.
    pub(super) fn forget(&self, id: i64) {
        if let Some(gone) = self.entries().remove(&id) {
            gone.signal();
        }
        self.turns_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        self.behind
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, turn| turn.as_ref().is_none_or(|t| t.id != id));
    }

    pub(super) fn signal_gone_all(&self) {
        for gone in self.entries().values() {
            gone.signal();
        }
    }

    /// Notes which entry the waiter of our entry `turn.id` waits on next,
    /// from the nearest earlier entries a read gave it (the rule's blocker
    /// is the `count`-th of them, as the core picks it), so that the wait
    /// on that entry reads the waiter's turn too.
    pub(super) fn note_blocker(&self, turn: Turn, nearest: &[Row]) {
        let Some(blocker) = usize::try_from(turn.count)
            .ok()
            .and_then(|count| nearest.get(count.checked_sub(1)?))
        else {
            return;
        };
        if blocker.session == self.id {
            // Our own entry: its wait reads nothing on the server.
            return;
        }
        let mut behind = self.behind.lock().unwrap_or_else(PoisonError::into_inner);
        if behind.len() > TURNS_KEPT {
            behind.clear();
        }
        behind
            .entry(blocker.id)
            .and_modify(|other| {
                if other.as_ref().is_some_and(|o| o.id != turn.id) {
                    *other = None;
                } else {
                    *other = Some(turn.clone());
                }
            })
            .or_insert(Some(turn));
    }

    /// Keeps a turn a wait read, for the waiter's next `earlier`.
    pub(super) fn keep_turn(&self, turn: &Turn, read: TurnRead) {
        let mut kept = self.turns_read.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() > TURNS_KEPT {
            kept.clear();
        }
        kept.insert(turn.id, (turn.skip_shared, turn.count, read));
    }

    /// The turn a wait read for our entry `id`, if it read the same one.
    pub(super) fn take_turn(&self, id: i64, skip_shared: bool, count: i32) -> Option<TurnRead> {
        let kept = self
            .turns_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)?;
        (kept.0 == skip_shared && kept.1 == count).then_some(kept.2)
    }
}
