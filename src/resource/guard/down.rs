//! A guard's down-conversions: one write, the waiters' marks kept when the
//! lock listens for them.

use super::*;

impl ResourceGuard {
    /// A down-conversion: one write (a listening lock's reads first, to keep
    /// the marks of the waiters it still blocks). With `fresh`, the lock
    /// takes the write's token, `mode` possibly the mode held (see
    /// `convert_now`).
    pub(super) async fn down(&mut self, mode: LockMode, fresh: bool) -> Result<()> {
        let inner = self.hold.session().inner.clone();
        let token = if fresh { 0 } else { self.cell().token };
        let block = (!mode.sole_writer()).then(|| self.leaving_block()).flatten();
        // The lower mode first: a call cancelled in flight leaves the guard
        // claiming less than the server may hold, never more. A value set
        // and not yet written stays pending until the write is known to
        // have landed (here, or by `resync`): a call cancelled before it
        // leaves it for the release.
        let pending = {
            let mut cell = self.cell();
            cell.uncertain = true;
            cell.mode = mode;
            cell.told = 0;
            if block.is_some() {
                cell.pending.clone()
            } else {
                None
            }
        };
        // The release block stays as it was: a release after this call was
        // cancelled writes it only if its read shows the lock still in PW
        // or EX (`mode_rule::hand_over`), that is, only if this write did
        // not land.
        let written = if self.resource.notify_blocking {
            self.down_keeping_marks(mode, token, block.as_deref()).await?
        } else {
            // No waiter marks a lock that does not listen: one write, at
            // whatever version.
            let value = State::held(mode, token).encode();
            let update = QueueUpdate {
                dir: &self.resource.name,
                unchanged: &[],
                present: &[&self.entry],
                set: &[(&self.entry, &value)],
                delete: &[],
                block: block.as_deref(),
            };
            match inner.call(inner.remote.update_queue(&update)).await? {
                Some(written) => written,
                None => return Err(inner.vanished_error(&self.entry.key).await),
            }
        };
        {
            let mut cell = self.cell();
            if fresh {
                cell.token = written;
            }
            if let Some(bytes) = pending {
                cell.pending = None;
                cell.value.bytes = bytes;
                cell.value.sequence += 1;
                cell.value.valid = true;
            }
            cell.uncertain = false;
        }
        self.sync_release_block();
        Ok(())
    }

    /// A listening lock's down-conversion: one read, then one write
    /// conditioned on the entry as read, keeping the marks of the waiters it
    /// still blocks (its holder is told of them again). Returns the write's
    /// token.
    pub(super) async fn down_keeping_marks(&self, mode: LockMode, token: u64, block: Option<&[u8]>) -> Result<u64> {
        let inner = &self.hold.session().inner;
        loop {
            let (slot, _) = self.read_own().await?;
            let marks = State::decode(&slot.value, slot.changed).blocked;
            let still = LockMode::ALL
                .into_iter()
                .filter(|m| marks & m.bit() != 0 && !m.compatible(mode))
                .fold(marks & LISTENING, |bits, m| bits | m.bit());
            let value = State {
                blocked: still,
                ..State::held(mode, token)
            }
            .encode();
            let write = SlotWrite::new(&self.resource.name, &slot, &self.entry, &value, block);
            if let Some(written) = inner.call(inner.remote.update_queue(&write.update())).await? {
                return Ok(written);
            }
        }
    }
}
