//! Lock modes as the session sees them: a queue read and changed as a
//! whole, and the watch of one entry's value (woken on the server by its
//! owner's value lock, or by a notice of another session's write).

use std::sync::PoisonError;

use lockline::backend::{Entry, Queue, QueueUpdate, Slot, Wanted, WAITING_EX};
use lockline::Result;

use super::wait::{FoundSlot, WaitOn};
use super::{Shared, SqlSession};
use crate::dialect::{Dialect, Found, QueueChange, Watched};
use crate::error::{map, timed_out};
use crate::layout::{parse_entry_key, DLM};
use crate::notices::{Notices, Subscription};

impl<D: Dialect> SqlSession<D> {
    /// A lock-mode queue and its lock value block, in one statement.
    pub(super) async fn read_mode_queue(&self, dir: &str) -> Result<Queue> {
        let shared = &self.shared;
        shared.check_live()?;
        let mut reads = 0;
        let (rows, block) = loop {
            let (rows, block) = on_owner!(shared, "read the queue", |d, conn| d.read_queue(conn, dir, &shared.id))?;
            reads += 1;
            // A read's rows are of its statement's snapshot, but whether an
            // entry is live is asked of its guard as the statement runs: a
            // release that committed meanwhile (its guard let go since)
            // looks like a lost holder beside the block its snapshot had,
            // which still names it. A statement after this one sees that
            // release whole, so a block naming a holder the read left out
            // is read again; a holder still left out then was lost.
            match named_holder(block.as_deref()) {
                Some(holder) if reads < QUEUE_READS && !rows.iter().any(|row| row.row.id == holder) => continue,
                _ => break (rows, block),
            }
        };
        {
            let mut reads = shared.queue_reads.lock().unwrap_or_else(PoisonError::into_inner);
            if reads.len() > 4096 {
                reads.clear();
            }
            for row in rows.iter().filter(|row| row.row.kind == DLM) {
                let watched = Watched {
                    value: row.value.clone(),
                    version: row.version,
                    epoch: row.epoch,
                };
                reads.insert(row.row.id, watched);
            }
        }
        let slots = rows
            .into_iter()
            .map(|row| Slot {
                entry: self.entry_from(dir, &row.row),
                value: row.value,
                version: row.version,
                changed: row.changed.unsigned_abs(),
            })
            .collect();
        Ok(Queue { slots, block })
    }

    /// A conditional change of a lock-mode queue: its token, or `None`,
    /// having written nothing.
    pub(super) async fn update_mode_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let shared = &self.shared;
        shared.check_live()?;
        // An entry of another lock (or not of this layout) is not the very
        // same entry under this name: a condition on it fails.
        let under = |entry: &Entry| {
            parse_entry_key(&entry.key)
                .filter(|(name, id)| *name == update.dir && *id == entry.order)
                .map(|(_, id)| id)
        };
        let mut unchanged = Vec::with_capacity(update.unchanged.len());
        for (entry, version) in update.unchanged {
            match under(entry) {
                Some(id) => unchanged.push((id, *version)),
                None => return Ok(None),
            }
        }
        let mut present = Vec::with_capacity(update.present.len());
        for entry in update.present {
            match under(entry) {
                Some(id) => present.push(id),
                None => return Ok(None),
            }
        }
        let set = update
            .set
            .iter()
            .filter_map(|(entry, value)| Some((under(entry)?, *value)))
            .collect();
        let delete: Vec<i64> = update.delete.iter().filter_map(|entry| under(entry)).collect();
        let change = QueueChange::new(update.dir, &shared.id, &unchanged, &present, set, delete, update.block);
        let token = on_owner!(shared, "change the queue", |d, conn| d.update_queue(conn, &change))?;
        let Some(token) = token else {
            return Ok(None);
        };
        // Our own entries it deleted: their guards went with them.
        let own: Vec<i64> = update
            .delete
            .iter()
            .filter(|entry| entry.owner.as_deref() == Some(shared.id.as_str()))
            .filter_map(|entry| under(entry))
            .collect();
        for id in own {
            shared.forget(id);
        }
        Ok(Some(token.unsigned_abs()))
    }

    /// Waits until a lock-mode entry's value differs from `seen` (the new
    /// value) or the entry is gone (`None`). On the server, on the lock its
    /// owner holds for the entry's version (a write by its owner, its
    /// removal, the end of its owner's connection); a write by another
    /// session is heard on the entry's channel (PostgreSQL) or wakes the
    /// wait itself (MariaDB/MySQL, see the watch procedure). A new value
    /// `wanted` refuses is watched past: it becomes the value seen, and the
    /// wait goes on at its version, on the same subscription.
    ///
    /// `listen` says whether writes of other sessions must be heard while
    /// the value seen is the one given: a lock-mode waiter's watch of the
    /// entry that blocks it (`watch_blocker_until`), where the value is
    /// one [`only_owner_unblocks`](lockline::backend::only_owner_unblocks)
    /// accepts (a request waiting, a lock held in its mode), needs none of
    /// them, so it subscribes to the entry's channel
    /// only once the value seen is not such a value (after the read that
    /// saw it: a write since moved the version, at which the wait returns
    /// at once). A watcher that listens to nothing keeps no listening
    /// connection, and PostgreSQL signals only listening connections of
    /// each notice. On MariaDB/MySQL such a wait takes no watch slot: it
    /// waits on the owner's value lock alone, so a grant or a mark by
    /// another session neither writes the entry's watcher count for it nor
    /// ends its wait.
    pub(super) async fn watch_lock_mode(
        &self,
        entry: &Entry,
        seen: &[u8],
        wanted: &Wanted,
        listen: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Result<Option<Vec<u8>>> {
        let mut seen = seen.to_vec();
        let (_, id) = self.id_of(entry)?;
        let shared = &self.shared;
        let owner = entry.owner.clone().unwrap_or_default();
        let mut notices: Option<Subscription> = None;
        // Whether the last wait saw the entry's owner's connection end (the
        // entry's value lock free with the entry still there).
        let mut lost = false;
        // The entry as the last wait read it after waking, or first as the
        // last queue read found it (live, with the value seen): no read
        // needed. (Read before the notices are marked seen below: a write
        // after it moved the version, at which the next wait returns at
        // once.)
        let mut woken: Option<Found> = shared
            .queue_reads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)
            .filter(|read| read.value == seen)
            .map(|read| Some((read, true)));
        loop {
            shared.check_live()?;
            if let Some(notices) = notices.as_mut() {
                notices.seen();
            }
            let found = match woken.take() {
                Some(found) => found,
                None => on_owner!(shared, "read the entry's value", |d, conn| d
                    .watch_read(conn, id, &shared.id))?,
            };
            let (value, version, epoch) = match found {
                Some((Watched { value, version, epoch }, true)) => (value, version, epoch),
                // There with its guard free: gone with its owner's
                // connection (or, its wait having seen that, deleted by
                // whoever met it dead).
                Some((_, false)) => {
                    shared.saw_go(entry, true);
                    return Ok(None);
                }
                None => {
                    shared.saw_go(entry, lost);
                    return Ok(None);
                }
            };
            if value != seen {
                if wanted(&value) {
                    return Ok(Some(value));
                }
                seen = value;
            }
            if notices.is_none() && listen(&seen) {
                if let Some(channel) = &shared.notices {
                    notices = Some(subscribe(shared, channel, id).await?);
                }
            }
            let at = Watched {
                value: (),
                version,
                epoch,
            };
            // A slot of this wait's own: a wait dropped for a notice may
            // still answer into its slot later.
            let slot = FoundSlot::default();
            // The entry's version the watcher knows: a notice of a write up
            // to it tells nothing new.
            let mut known = version;
            // Where no notice tells of other sessions' writes (MariaDB/MySQL,
            // whose writers wake the holders of the entry's watch slots), a
            // wait that need not hear them takes no slot: it waits on the
            // owner's value lock alone, and is neither woken by a grant or
            // a mark nor makes the entry's row count its watchers. It reads
            // the entry in a round trip of its own after the wake, so it
            // cannot tell a loss from a release when another session
            // deletes the dead entry in between: not with a lock-delay,
            // which asks how the entry went (the watch procedure reads it
            // in the same call), nor under a reset grace, whose reset
            // holder's entry stays live with its value lock free. And only
            // behind a request that waits for EX (`WAITING_EX`), whose grant
            // is the write it spares: behind a lock held, whose next change
            // is its release, the procedure's read in the same call keeps
            // the successor's handoff at one round trip.
            let quiet = !shared.dialect.notifies()
                && seen.starts_with(WAITING_EX)
                && !listen(&seen)
                && shared.options.lock_delay().is_zero()
                && !shared.reset_grace;
            let waited = shared.wait_on_server(WaitOn::Watch(id, at, quiet), &owner, entry.order, Some(&slot), None);
            tokio::pin!(waited);
            lost = match notices.as_mut() {
                Some(notices) => loop {
                    tokio::select! {
                        written = notices.changed() => match written {
                            // A write the read (or an earlier notice) saw
                            // already: its notice came late.
                            Some(write) if write.version <= known => {}
                            // Written by another session (the notice carries
                            // the value): one that leaves the watcher waiting
                            // is watched past on the same wait, which waits
                            // on the owner's value lock, where it was; one
                            // wanted is the answer, with no read.
                            Some(write) if write.value == seen || !wanted(&write.value) => {
                                known = write.version;
                                seen = write.value;
                            }
                            Some(write) => return Ok(Some(write.value)),
                            // A removal, or notices that may have been
                            // missed: read the entry.
                            None => break false,
                        },
                        waited = &mut waited => break waited?,
                    }
                },
                None => waited.await?,
            };
            woken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        }
    }
}

/// A subscription to the notices of entry `id`'s writes by other sessions,
/// bounded by the request timeout.
async fn subscribe<D: Dialect>(shared: &Shared<D>, notices: &Notices, id: i64) -> Result<Subscription> {
    let timeout = shared.options.request_timeout();
    match tokio::time::timeout(timeout, notices.subscribe(id)).await {
        Err(_) => Err(timed_out(shared.doing("listen for the entry's writes"), timeout)),
        Ok(None) => Err(shared.over_error()),
        Ok(Some(Err(error))) => Err(map(shared.doing("listen for the entry's writes"), error)),
        Ok(Some(Ok(subscription))) => Ok(subscription),
    }
}

/// How many times a queue is read at most while its value block names a
/// holder the read left out (see `read_mode_queue`).
const QUEUE_READS: usize = 3;

/// The entry id a lock value block names as its PW or EX holder (its
/// order: an SQL entry's order is its id), from the block's header (`lvb1
/// <sequence> <valid> <holder order> <holder key length>`, a newline, the
/// key, the value), or `None` when it names none or is not one lockline
/// wrote.
fn named_holder(block: Option<&[u8]>) -> Option<i64> {
    let block = block?;
    let end = block.iter().position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&block[..end]).ok()?;
    let mut words = header.split(' ');
    if words.next()? != "lvb1" {
        return None;
    }
    let order: i64 = words.nth(2)?.parse().ok()?;
    let key_length: usize = words.next()?.parse().ok()?;
    (key_length > 0).then_some(order)
}

#[cfg(test)]
mod tests {
    use super::named_holder;

    #[test]
    fn the_block_names_its_holder_by_order() {
        assert_eq!(named_holder(Some(b"lvb1 3 1 42 9\nres/dlm/42value")), Some(42));
        assert_eq!(named_holder(Some(b"lvb1 3 0 0 0\nvalue")), None);
        assert_eq!(named_holder(Some(b"lvb1 3 1 42 9")), None);
        assert_eq!(named_holder(Some(b"something else\n")), None);
        assert_eq!(named_holder(None), None);
    }
}
