//! The guard of a resource held in a mode: what it claims, the value
//! block, blocking notifications, release. Its conversions are in
//! `convert` (down in `down`, up in `up`), and the taking back of a
//! conversion given up in `take_back`.

use super::*;
use crate::backend::Slot;

mod convert;
mod down;
mod take_back;
mod up;

/// What a guard knows of its lock, changed by conversions.
#[derive(Debug)]
pub(super) struct Cell {
    pub(super) mode: LockMode,
    pub(super) token: u64,
    /// The value block as the grant or the last up-conversion found it.
    pub(super) value: LockValue,
    /// A value set by [`ResourceGuard::set_value`], written when the lock
    /// leaves PW and EX.
    pub(super) pending: Option<Vec<u8>>,
    /// The blocked modes the holder was told of.
    pub(super) told: u8,
    /// A conversion's write was sent and its answer never came: the mode
    /// above may be less than what the server holds, until a read tells.
    pub(super) uncertain: bool,
}

/// A resource held in a [`LockMode`]. Dropped without
/// [`release`](Self::release), it releases in the background (a PW or EX
/// holder writes its value block then too).
#[must_use = "dropping the guard releases the lock"]
pub struct ResourceGuard {
    pub(super) hold: Hold,
    pub(super) resource: Resource,
    pub(super) entry: Entry,
    pub(super) cell: Arc<std::sync::Mutex<Cell>>,
}

impl fmt::Debug for ResourceGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceGuard")
            .field("key", &self.entry.key)
            .field("mode", &self.mode())
            .field("token", &self.token())
            .finish()
    }
}

impl ResourceGuard {
    pub(super) fn cell(&self) -> std::sync::MutexGuard<'_, Cell> {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mode the lock is held in now.
    pub fn mode(&self) -> LockMode {
        self.cell().mode
    }

    /// The fencing token of the grant, or of the last up-conversion to CW,
    /// PW or EX: above every token granted on this resource before it.
    pub fn token(&self) -> FencingToken {
        FencingToken::new(self.cell().token)
    }

    /// The entry's key (etcd) or path (ZooKeeper).
    pub fn key(&self) -> &str {
        &self.entry.key
    }

    /// A sequencer for the lock as held now (`lock-MODE`, the token): a
    /// resource that cannot keep the highest token it has seen asks
    /// [`Client::check`](crate::Client::check) whether it is still current.
    /// It stops being current when the lock is released, lost or converted.
    pub fn sequencer(&self) -> crate::Sequencer {
        let cell = self.cell();
        crate::Sequencer::new(
            &*self.resource.name,
            Mode::Lock(cell.mode),
            FencingToken::new(cell.token),
        )
    }

    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.resource.name
    }

    /// The session that holds the lock.
    pub fn session(&self) -> &Session {
        self.hold.session()
    }

    /// Whether the lock is still held, as far as this client knows.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Resolves once the lock may no longer be held (see
    /// [`MutexGuard::lost`](crate::MutexGuard::lost)).
    ///
    /// # Cancel safety
    ///
    /// Only waits; cancelling it changes nothing.
    pub async fn lost(&self) {
        self.hold.lost().await;
    }

    /// The lock value block as the grant, or the last up-conversion, found
    /// it (with this holder's own [`set_value`](Self::set_value) once it is
    /// written).
    pub fn value(&self) -> LockValue {
        self.cell().value.clone()
    }

    /// Sets the lock value block, written when this lock leaves PW and EX
    /// (its release or a down-conversion), fenced like any write: a holder
    /// that lost its lock writes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::WrongMode`] unless held in PW or EX;
    /// [`Error::InvalidOptions`] for more than [`MAX_LOCK_VALUE`] bytes.
    pub fn set_value(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_LOCK_VALUE {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "a lock value block holds at most {MAX_LOCK_VALUE} bytes, not {}",
                    bytes.len()
                ),
            });
        }
        let mode = self.mode();
        if !mode.sole_writer() {
            return Err(self.wrong_mode("set the lock value block", "PW or EX", mode));
        }
        self.cell().pending = Some(bytes.to_vec());
        self.sync_release_block();
        Ok(())
    }

    pub(super) fn wrong_mode(&self, operation: &'static str, needs: &'static str, held: LockMode) -> Error {
        Error::WrongMode {
            name: self.resource.name.to_string(),
            operation,
            needs,
            held,
        }
    }

    /// The block this holder writes when it leaves PW and EX now.
    pub(super) fn leaving_block(&self) -> Option<Vec<u8>> {
        let cell = self.cell();
        if !cell.mode.sole_writer() {
            return None;
        }
        let mut value = cell.value.clone();
        if let Some(bytes) = &cell.pending {
            value.bytes.clone_from(bytes);
            value.sequence += 1;
            value.valid = true;
        }
        Some(Block { value, holder: None }.encode())
    }

    /// One read of this lock's queue: the lock's own slot in it, and the
    /// value block; the error of a vanished entry when it is gone.
    pub(super) async fn read_own(&self) -> Result<(Slot, Option<Vec<u8>>)> {
        let inner = &self.hold.session().inner;
        let mut queue = inner.call(inner.remote.read_queue(&self.resource.name)).await?;
        match position_in(&queue, &self.entry) {
            Some(at) => Ok((queue.slots.swap_remove(at), queue.block)),
            None => Err(inner.vanished_error(&self.entry.key).await),
        }
    }

    pub(super) fn sync_release_block(&mut self) {
        let block = self.leaving_block();
        self.hold.set_release_block(block);
    }

    /// Applies `writes` only while the lock is held in CW, PW or EX (see
    /// [`MutexGuard::write_if_held`](crate::MutexGuard::write_if_held)).
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the writes may or may not have been applied, all or none.
    ///
    /// # Errors
    ///
    /// [`Error::WrongMode`] in NL, CR or PR; otherwise as
    /// [`MutexGuard::write_if_held`](crate::MutexGuard::write_if_held).
    pub async fn write_if_held(&self, writes: impl IntoIterator<Item = Write>) -> Result<()> {
        let mode = self.mode();
        if !mode.writes() {
            return Err(self.wrong_mode("fenced writes", "CW, PW or EX", mode));
        }
        self.hold.write_if_held(writes.into_iter().collect()).await
    }

    /// Resolves with a mode that a waiter blocked by this lock asks for,
    /// once per mode: the DLM's blocking notification. A caching holder
    /// then converts down or releases. Only for a lock taken through a
    /// resource made with [`Resource::notify_blocking`]. Waiting requests
    /// always tell the holder they wait on; `try_lock` calls only with
    /// [`Resource::notify_on_try`].
    ///
    /// # Cancel safety
    ///
    /// Cancelling it loses no notification: the next call hears it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a lock whose resource was not made
    /// with [`Resource::notify_blocking`] (no waiter would ever tell it);
    /// as [`release`](Self::release) when the lock is lost.
    pub async fn blocking(&self) -> Result<LockMode> {
        if !self.resource.notify_blocking {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "{:?} hears of no waiter: take it through `Resource::notify_blocking()` to call `blocking()`",
                    &*self.resource.name
                ),
            });
        }
        let inner = &self.hold.session().inner;
        let mut seen = match inner.call(inner.remote.get_value(&self.entry)).await? {
            Some(value) => value,
            None => return Err(inner.vanished_error(&self.entry.key).await),
        };
        loop {
            let state = State::decode(&seen, 0);
            {
                let mut cell = self.cell();
                let fresh = state.blocked & !cell.told;
                let mode = cell.mode;
                if let Some(asked) = LockMode::ALL
                    .into_iter()
                    .rev()
                    .find(|m| fresh & m.bit() != 0 && !m.compatible(mode))
                {
                    cell.told |= asked.bit();
                    return Ok(asked);
                }
            }
            let watched = tokio::select! {
                biased;
                state = inner.over() => return Err(inner.over_error(state)),
                watched = inner.remote.watch_value(&self.entry, &seen) => watched,
            };
            match watched {
                Ok(Some(value)) => seen = value,
                Ok(None) => return Err(inner.vanished_error(&self.entry.key).await),
                Err(error) if error.is_transient() => {
                    tokio::time::sleep(INITIAL_BACKOFF).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Releases the lock: a fenced removal of its entry; a PW or EX holder
    /// writes the lock value block with it.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the release finishes in the background.
    ///
    /// # Errors
    ///
    /// [`Error::SessionLost`] or [`Error::LockLost`] when the lock was lost
    /// before the release, [`Error::Unavailable`] when the server cannot be
    /// reached (the removal goes on in the background).
    pub async fn release(mut self) -> Result<()> {
        if self.hold.is_held() {
            // Best effort: a guard that cannot tell its mode writes no block.
            if self.resync().await.is_err() {
                self.hold.set_release_block(None);
            }
        }
        self.hold.release().await
    }
}

/// A write of one entry's value (and perhaps of the value block),
/// conditioned on one slot of a read being as read: a conversion's mark
/// and its taking back, a listening lock's down-conversion.
pub(super) struct SlotWrite<'a> {
    dir: &'a str,
    unchanged: [(&'a Entry, i64); 1],
    set: [(&'a Entry, &'a [u8]); 1],
    block: Option<&'a [u8]>,
}

impl<'a> SlotWrite<'a> {
    /// Sets `entry` to `value` (and the block to `block`) if `slot` is as
    /// read.
    pub(super) fn new(
        dir: &'a str,
        slot: &'a Slot,
        entry: &'a Entry,
        value: &'a [u8],
        block: Option<&'a [u8]>,
    ) -> Self {
        SlotWrite {
            dir,
            unchanged: [(&slot.entry, slot.version)],
            set: [(entry, value)],
            block,
        }
    }

    /// The update to send.
    pub(super) fn update(&self) -> QueueUpdate<'_> {
        QueueUpdate {
            dir: self.dir,
            unchanged: &self.unchanged,
            present: &[],
            set: &self.set,
            delete: &[],
            block: self.block,
        }
    }
}

/// Where `entry` stands in `queue`, if it is there.
pub(super) fn position_in(queue: &Queue, entry: &Entry) -> Option<usize> {
    queue
        .slots
        .iter()
        .position(|s| s.entry.key == entry.key && s.entry.order == entry.order)
}

/// The most restrictive mode that neither `a` nor `b` is below: what a
/// holder surely holds while it converts between them (CR between CW and
/// PR, the lower of two modes one of which covers the other).
pub(super) fn below_both(a: LockMode, b: LockMode) -> LockMode {
    let under: Vec<LockMode> = LockMode::ALL
        .into_iter()
        .filter(|m| m.is_down_from(a) && m.is_down_from(b))
        .collect();
    under
        .iter()
        .copied()
        .find(|&top| under.iter().all(|m| m.is_down_from(top)))
        .unwrap_or(LockMode::Nl)
}
