//! A queue as the session sees it: appending to it, reading the entries
//! before one of its own, waiting for an entry to go, and how it went.

use std::sync::{Arc, PoisonError};

use lockline::backend::{AppendRequest, Appended, Conflicts, Earlier, Entry};
use lockline::{FencingToken, Result};
use tokio::time::Instant;

use super::wait::WaitOn;
use super::{count_of, SqlSession};
use crate::dialect::{Append, Dialect, Turn};
use crate::layout::{entry_key, kind_label};

impl<D: Dialect> SqlSession<D> {
    /// Appends an entry and reads the nearest earlier ones in the same
    /// round trip; notes which entry the new one waits on.
    pub(super) async fn append_entry(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        let shared = &self.shared;
        shared.check_live()?;
        let append = Append {
            name: request.dir,
            kind: kind_label(request.kind),
            session: &shared.id,
            attempt: request.attempt,
            value: request.value,
            skip_shared: request.conflicts == Conflicts::Exclusive,
            count: count_of(request.nearest),
        };
        let (id, nearest) = on_owner!(shared, "append to the queue", |d, conn| d.append(conn, &append))?;
        shared.entries().entry(id).or_default();
        shared.note_blocker(
            Turn {
                id,
                name: request.dir.to_owned(),
                session: shared.id.clone(),
                skip_shared: append.skip_shared,
                count: append.count,
            },
            &nearest,
        );
        if shared.state.borrow().is_over() {
            shared.check_live()?;
        }
        let mut nearest: Vec<Entry> = nearest.iter().map(|row| self.entry_from(request.dir, row)).collect();
        nearest.truncate(request.nearest);
        Ok(Appended {
            entry: Entry {
                key: entry_key(request.dir, id),
                kind: request.kind,
                order: id,
                token: FencingToken::new(id.unsigned_abs()),
                owner: Some(shared.id.clone()),
            },
            nearest: Some(nearest),
            queue: None,
        })
    }

    /// The nearest earlier entries before one of ours: as the wait that
    /// woke its waiter read them, or read now.
    pub(super) async fn read_earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let (name, id) = self.id_of(entry)?;
        let shared = &self.shared;
        let skip_shared = conflicts == Conflicts::Exclusive;
        // Read already by the wait that woke this waiter, in its own
        // statement: no second round trip.
        let turn = Turn {
            id,
            name: name.clone(),
            session: shared.id.clone(),
            skip_shared,
            count: count_of(count),
        };
        let found = match shared.take_turn(id, skip_shared, turn.count) {
            Some(read) => read,
            None => on_owner!(shared, "read the queue", |d, conn| d.earlier(conn, &turn))?,
        };
        if let Some(rows) = &found {
            shared.note_blocker(turn, rows);
        }
        Ok(match found {
            None => Earlier::Gone,
            Some(rows) => {
                let mut nearest: Vec<Entry> = rows.iter().map(|row| self.entry_from(&name, row)).collect();
                nearest.truncate(count);
                Earlier::Entries(nearest)
            }
        })
    }

    /// Waits until `entry` is gone: one of ours by its flag, another's on
    /// the server (reading the turn of a waiter of ours behind it).
    pub(super) async fn wait_entry_gone(&self, entry: &Entry) -> Result<()> {
        let shared = &self.shared;
        let (_, id) = self.id_of(entry)?;
        if entry.owner.as_deref() == Some(shared.id.as_str()) {
            // Our own entries: their guard is ours; renewals and our own
            // removals say when they are gone.
            let gone = shared.entries().get(&id).map(Arc::clone);
            return match gone {
                Some(gone) => {
                    gone.wait().await;
                    Ok(())
                }
                None => Ok(()),
            };
        }
        let owner = entry.owner.clone().unwrap_or_default();
        // The waiter behind it, if one of ours waits on it alone: its wait
        // reads its turn too.
        let turn = shared
            .behind
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)
            .flatten();
        let lost = match turn {
            Some(turn) => {
                let (lost, read) = shared.wait_on_turn(id, &owner, entry.order, turn.clone()).await?;
                if let Some(read) = read {
                    shared.keep_turn(&turn, read);
                }
                lost
            }
            None => shared.wait_on(WaitOn::Guard(id), &owner, entry.order).await?,
        };
        shared.saw_go(entry, lost);
        Ok(())
    }

    /// How `gone` went, as this session saw it go.
    pub(super) fn departure_of(&self, gone: &Entry) -> lockline::backend::Departure {
        use lockline::backend::Departure;
        // One of ours went by our own removal (or with our session, whose
        // loss ends the wait anyway).
        if gone.owner.as_deref() == Some(self.shared.id.as_str()) {
            return Departure::Released;
        }
        let seen = self.id_of(gone).ok().and_then(|(_, id)| {
            self.shared
                .departures
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id)
        });
        match seen {
            Some(Some(noticed)) => Departure::Lost { noticed },
            Some(None) => Departure::Released,
            // Never seen go (its wait was cut short): erring toward a delay.
            None => Departure::Lost {
                noticed: Instant::now(),
            },
        }
    }
}
