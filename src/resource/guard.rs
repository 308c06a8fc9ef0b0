//! The guard of a resource held in a mode: conversions, the value block, release.

use super::*;

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

    /// Converts the lock to `mode` in place, keeping its place in the
    /// queue: a down-conversion at once, an up-conversion once every other
    /// holder is compatible with `mode`, ahead of every request behind it.
    ///
    /// # Cancel safety
    ///
    /// Cancelling an up-conversion gives it up: the lock keeps the mode it
    /// held (a background cleanup takes the conversion back), unless the
    /// conversion's grant was already on its way to the server. The guard
    /// then learns at its next conversion or release that it holds the new
    /// mode (its value block written by that release as a PW or EX holder's
    /// is); until then [`mode`](Self::mode) under-claims, never
    /// over-claims.
    ///
    /// # Errors
    ///
    /// [`Error::Deadlock`] when it would wait for ever (the lock keeps its
    /// mode, or is NL with [`Resource::demote_on_deadlock`]); as
    /// [`release`](Self::release) when the lock is lost, as soon as
    /// [`lost`](Self::lost) would resolve, whatever request of the
    /// conversion is still in flight (the guard is borrowed while it
    /// converts, so the call itself tells of the loss).
    pub async fn convert(&mut self, mode: LockMode) -> Result<()> {
        self.converting(mode, Patience::Forever).await.map(|_| ())
    }

    /// Converts only if that needs no wait; `Ok(false)` otherwise, the mode
    /// unchanged. A conversion that would deadlock fails as
    /// [`convert`](Self::convert) does (demoted to NL with
    /// [`Resource::demote_on_deadlock`]).
    ///
    /// # Cancel safety
    ///
    /// As [`convert`](Self::convert).
    ///
    /// # Errors
    ///
    /// As [`convert`](Self::convert).
    pub async fn try_convert(&mut self, mode: LockMode) -> Result<bool> {
        self.converting(mode, Patience::Never).await
    }

    /// As [`convert`](Self::convert), waiting at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`convert`](Self::convert).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when it runs out (the mode unchanged), and as
    /// [`convert`](Self::convert).
    pub async fn convert_timeout(&mut self, mode: LockMode, timeout: Duration) -> Result<()> {
        let patience = if timeout.is_zero() {
            Patience::Never
        } else {
            crate::wait::patience_for(timeout)
        };
        if self.converting(mode, patience).await? {
            Ok(())
        } else {
            Err(Error::Timeout {
                name: self.resource.name.to_string(),
                waited: timeout,
                held_by_this_session: false,
            })
        }
    }

    pub(super) async fn converting(&mut self, mode: LockMode, patience: Patience) -> Result<bool> {
        // The queue read at the grant no longer says what this lock's
        // release may hand over.
        self.hold.set_release_queue(None);
        if let Some(error) = self.known_loss().await {
            return Err(error);
        }
        // The whole conversion ends as soon as the lock is lost, a request
        // of it still in flight or not (one stuck in an outage runs until
        // the request timeout, past the loss deadline): its holder cannot
        // watch `lost()` while it converts, the guard being borrowed.
        let lost = self.hold.lost_owned();
        let outcome = tokio::select! {
            biased;
            () = lost => None,
            outcome = self.convert_now(mode, patience) => Some(outcome),
        };
        match outcome {
            Some(outcome) => outcome,
            None => Err(self.known_loss().await.unwrap_or_else(|| Error::LockLost {
                key: self.entry.key.clone(),
            })),
        }
    }

    pub(super) async fn convert_now(&mut self, mode: LockMode, patience: Patience) -> Result<bool> {
        self.resync().await?;
        let from = self.mode();
        if mode == from {
            return Ok(true);
        }
        if mode.is_down_from(from) {
            self.down(mode).await?;
            return Ok(true);
        }
        let mut cleanup = ConversionCleanup {
            session: self.hold.session().clone(),
            name: self.resource.name.clone(),
            entry: self.entry.clone(),
            conv: None,
        };
        let outcome = self.up(mode, patience, &mut cleanup).await;
        match &outcome {
            // Granted: nothing to take back.
            Ok(true) => cleanup.conv = None,
            // Given up or failed: take the mark back now (a drop meanwhile
            // leaves it to the background).
            Ok(false) | Err(_) => cleanup.take_back().await,
        }
        outcome
    }

    pub(super) async fn known_loss(&self) -> Option<Error> {
        if self.hold.is_held() {
            return None;
        }
        let inner = &self.hold.session().inner;
        let state = inner.state();
        Some(if state.is_over() {
            inner.over_error(state)
        } else {
            inner.vanished_error(&self.entry.key).await
        })
    }

    /// After a conversion whose answer never came (the call was cancelled
    /// in flight), reads what the server holds for this lock: the guard
    /// under-claims meanwhile (the mode before an up-conversion, the mode
    /// after a down-conversion), never over-claims.
    pub(super) async fn resync(&mut self) -> Result<()> {
        if !self.cell().uncertain {
            return Ok(());
        }
        let inner = self.hold.session().inner.clone();
        let queue = inner.call(inner.remote.read_queue(&self.resource.name)).await?;
        let Some(slot) = queue
            .slots
            .iter()
            .find(|s| s.entry.key == self.entry.key && s.entry.order == self.entry.order)
        else {
            return Err(inner.vanished_error(&self.entry.key).await);
        };
        let state = State::decode(&slot.value, slot.changed);
        let block = Block::decode(queue.block.as_deref());
        {
            let mut cell = self.cell();
            if let Some(held) = state.granted {
                if held != cell.mode {
                    // Entering PW or EX, the grant read the block as it is
                    // now (no one else writes it meanwhile).
                    if held.sole_writer() && !cell.mode.sole_writer() {
                        cell.value = block.value;
                    }
                    cell.mode = held;
                    cell.token = state.token;
                    cell.told = 0;
                }
            }
            cell.uncertain = false;
        }
        self.sync_release_block();
        Ok(())
    }

    /// A down-conversion: one write (a listening lock's reads first, to keep
    /// the marks of the waiters it still blocks).
    pub(super) async fn down(&mut self, mode: LockMode) -> Result<()> {
        let inner = self.hold.session().inner.clone();
        let token = self.cell().token;
        let block = (!mode.sole_writer()).then(|| self.leaving_block()).flatten();
        // The lower mode first: a call cancelled in flight leaves the guard
        // claiming less than the server may hold, never more.
        let pending = {
            let mut cell = self.cell();
            cell.uncertain = true;
            cell.mode = mode;
            cell.told = 0;
            if block.is_some() {
                cell.pending.take()
            } else {
                None
            }
        };
        self.hold.set_release_block(None);
        if self.resource.notify_blocking {
            self.down_keeping_marks(mode, token, block.as_deref()).await?;
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
            if inner.call(inner.remote.update_queue(&update)).await?.is_none() {
                return Err(inner.vanished_error(&self.entry.key).await);
            }
        }
        {
            let mut cell = self.cell();
            if let Some(bytes) = pending {
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
    /// still blocks (its holder is told of them again).
    pub(super) async fn down_keeping_marks(&self, mode: LockMode, token: u64, block: Option<&[u8]>) -> Result<()> {
        let inner = &self.hold.session().inner;
        loop {
            let queue = inner.call(inner.remote.read_queue(&self.resource.name)).await?;
            let Some(slot) = queue
                .slots
                .iter()
                .find(|s| s.entry.key == self.entry.key && s.entry.order == self.entry.order)
            else {
                return Err(inner.vanished_error(&self.entry.key).await);
            };
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
            let unchanged = [(&slot.entry, slot.version)];
            let update = QueueUpdate {
                dir: &self.resource.name,
                unchanged: &unchanged,
                present: &[],
                set: &[(&self.entry, &value)],
                delete: &[],
                block,
            };
            if inner.call(inner.remote.update_queue(&update)).await?.is_some() {
                return Ok(());
            }
        }
    }

    /// An up-conversion: mark the entry as converting (conditioned on its
    /// own version only), then read again and decide from that read alone:
    /// whatever was granted without seeing the mark had its grant
    /// conditioned on this entry's earlier version, so it was granted
    /// before the mark and shows in the read; whatever reads after the mark
    /// counts this entry with its new mode. Of the conversions on a cycle,
    /// the one marked last gives up.
    pub(super) async fn up(
        &mut self,
        mode: LockMode,
        patience: Patience,
        cleanup: &mut ConversionCleanup,
    ) -> Result<bool> {
        let session = self.hold.session().clone();
        let inner = &session.inner;
        let acquire = self.resource.acquire(patience);
        let from = self.mode();
        let token = self.cell().token;
        let notify = !matches!(patience, Patience::Never) || self.resource.notify_on_try;
        let delay = inner.options.lock_delay();
        let mut delayed = false;
        let mut last_gone: Option<Entry> = None;
        let mut backoff = INITIAL_BACKOFF;
        loop {
            let queue = acquire
                .retrying(|| inner.remote.read_queue(&self.resource.name))
                .await?;
            let mut view = View::new(&self.resource.name, queue)?;
            let Some(at) = view.position(&self.entry) else {
                return Err(inner.vanished_error(&self.entry.key).await);
            };
            let mine = view.slots[at].1;
            let marked = cleanup
                .conv
                .is_some_and(|conv| mine.converting() == Some(mode) && mine.conv == conv);
            if !marked {
                // As if marked: a conversion that would wait and close a
                // cycle of marks already there is the last one; one that
                // would wait in a try gives up before writing anything.
                view.slots[at].1.requested = mode;
                if view.blocker(at).is_some() {
                    if view.in_cycle(at) {
                        return Err(self.deadlock(from, mode).await);
                    }
                    if let Patience::Never = patience {
                        if notify {
                            if let Some(on) = view.blocker(at) {
                                self.resource.mark(&view, at, on).await;
                            }
                        }
                        return Ok(false);
                    }
                }
                let conv = rand_nonce() | 1;
                let value = State {
                    granted: Some(from),
                    requested: mode,
                    token,
                    blocked: mine.blocked,
                    since: 0,
                    conv,
                }
                .encode();
                let slot = &view.slots[at].0;
                let unchanged = [(&slot.entry, slot.version)];
                let update = QueueUpdate {
                    dir: &self.resource.name,
                    unchanged: &unchanged,
                    present: &[],
                    set: &[(&slot.entry, &value)],
                    delete: &[],
                    block: None,
                };
                // Armed before the write: a mark whose answer is lost (and
                // whose retry then fails its condition) is still taken back.
                cleanup.conv = Some(conv);
                acquire.retrying(|| inner.remote.update_queue(&update)).await?;
                continue;
            }
            if view.closes_cycle(at) {
                return Err(self.deadlock(from, mode).await);
            }
            let Some(on) = view.blocker(at) else {
                // Next after a holder that lost its lock involuntarily: the
                // lock-delay first.
                let lost = last_gone
                    .take()
                    .filter(|_| !delay.is_zero())
                    .map(|gone| inner.remote.departure(&gone));
                let noticed = match lost {
                    Some(crate::backend::Departure::Lost { noticed }) => Some(noticed),
                    _ if !delayed && !delay.is_zero() && view.block.lost_holder(&view) => Some(Instant::now()),
                    _ => None,
                };
                if let Some(noticed) = noticed.filter(|_| mode != LockMode::Nl) {
                    delayed = true;
                    inner.counters.bump(|c| &c.lock_delays);
                    if !self.pause_until(noticed + delay, patience).await? {
                        return Ok(false);
                    }
                    continue;
                }
                let granted_token = if mode.writes() { 0 } else { token };
                let value = State {
                    blocked: mine.blocked,
                    ..State::held(mode, granted_token)
                }
                .encode();
                let block = if mode.sole_writer() && !from.sole_writer() {
                    Some(view.block.granted_to(&view, &self.entry))
                } else {
                    view.block.cleared_if_lost(&view)
                };
                let block_bytes = block.as_ref().map(Block::encode);
                let unchanged = view.unchanged(at);
                let update = QueueUpdate {
                    dir: &self.resource.name,
                    unchanged: &unchanged,
                    present: &[],
                    set: &[(&self.entry, &value)],
                    delete: &[],
                    block: block_bytes.as_deref(),
                };
                // The grant's answer is awaited past the deadline (within the
                // request timeout): a grant the server made is never reported
                // as a timeout. The guard claims nothing new until it comes.
                // Until it comes, the guard claims only what both modes
                // allow (CR between CW and PR): a call cancelled in flight
                // never leaves it claiming more than the server may hold.
                {
                    let mut cell = self.cell();
                    cell.uncertain = true;
                    cell.mode = below_both(from, mode);
                }
                let Some(fresh) = self.granting(&update).await? else {
                    let mut cell = self.cell();
                    cell.uncertain = false;
                    cell.mode = from;
                    continue;
                };
                let mut cell = self.cell();
                cell.mode = mode;
                cell.told = 0;
                cell.uncertain = false;
                if mode.writes() {
                    cell.token = fresh;
                }
                cell.value = match &block {
                    Some(block) if mode.sole_writer() && !from.sole_writer() => block.value.clone(),
                    _ => view.block.seen(&view),
                };
                drop(cell);
                self.sync_release_block();
                return Ok(true);
            };
            if let Patience::Never = patience {
                if notify {
                    self.resource.mark(&view, at, on).await;
                }
                return Ok(false);
            }
            let mut seen = view.slots[on].0.value.clone();
            if notify {
                if let Some(written) = self.resource.mark(&view, at, on).await {
                    seen = written;
                }
            }
            let blocker = view.slots[on].0.entry.clone();
            let deadline = patience.deadline();
            inner.counters.bump(|c| &c.waits);
            tokio::select! {
                biased;
                state = inner.over() => return Err(inner.over_error(state)),
                () = self.hold.lost() => {
                    return Err(self.known_loss().await.unwrap_or_else(|| Error::LockLost { key: self.entry.key.clone() }));
                }
                changed = changed(inner, &blocker, seen, view.slots[at].1) => match changed {
                    Ok(gone) => {
                        inner.counters.bump(|c| &c.wakeups);
                        last_gone = gone.then_some(blocker);
                    }
                    Err(error) if error.is_transient() => acquire.back_off(&error, &mut backoff).await?,
                    Err(error) => return Err(error),
                },
                () = deadline => return Ok(false),
            }
        }
    }

    /// Applies a conversion's grant, retrying a transient failure within the
    /// request timeout whatever the caller's deadline.
    pub(super) async fn granting(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let inner = &self.hold.session().inner;
        let until = Instant::now() + inner.options.request_timeout();
        let mut pause = INITIAL_BACKOFF;
        loop {
            match inner.call(inner.remote.update_queue(update)).await {
                Err(error) if error.is_transient() && Instant::now() + pause < until && !inner.state().is_over() => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                other => return other,
            }
        }
    }

    /// Waits until `until` (a lock-delay) unless the session ends, the lock
    /// is lost or the deadline passes first: `Ok(false)` for the deadline.
    pub(super) async fn pause_until(&self, until: Instant, patience: Patience) -> Result<bool> {
        let inner = &self.hold.session().inner;
        let deadline = patience.deadline();
        tokio::select! {
            biased;
            state = inner.over() => Err(inner.over_error(state)),
            () = self.hold.lost() => Err(self.known_loss().await.unwrap_or_else(|| Error::LockLost { key: self.entry.key.clone() })),
            () = deadline => Ok(false),
            () = tokio::time::sleep_until(until) => Ok(true),
        }
    }

    pub(super) async fn deadlock(&mut self, from: LockMode, to: LockMode) -> Error {
        let held = if self.resource.demote_on_deadlock {
            match self.down(LockMode::Nl).await {
                Ok(()) => LockMode::Nl,
                Err(error) => return error,
            }
        } else {
            from
        };
        Error::Deadlock {
            name: self.resource.name.to_string(),
            from,
            to,
            held,
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

/// Takes a cancelled, timed-out or failed conversion back, so that it
/// leaves nothing behind: the entry is set back to its held mode if it is
/// still marked with this very conversion.
pub(super) struct ConversionCleanup {
    pub(super) session: Session,
    pub(super) name: Arc<str>,
    pub(super) entry: Entry,
    /// The conversion's id once its mark may have been written.
    pub(super) conv: Option<u32>,
}

impl ConversionCleanup {
    /// Takes the mark back now; if this is cancelled, the drop does it in
    /// the background.
    pub(super) async fn take_back(&mut self) {
        let Some(conv) = self.conv else {
            return;
        };
        if take_back(&self.session.inner, &self.name, &self.entry, conv)
            .await
            .is_ok()
        {
            self.conv = None;
        }
    }
}

impl Drop for ConversionCleanup {
    fn drop(&mut self) {
        let Some(conv) = self.conv.take() else {
            return;
        };
        let (inner, name, entry) = (self.session.inner.clone(), self.name.clone(), self.entry.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let mut pause = INITIAL_BACKOFF;
                for _ in 0..8 {
                    match take_back(&inner, &name, &entry, conv).await {
                        Ok(()) => return,
                        Err(error) if error.is_transient() => {
                            tracing::debug!(key = %entry.key, %error, "taking back a cancelled conversion; retrying");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_secs(1));
                        }
                        Err(error) => {
                            tracing::warn!(key = %entry.key, %error, "could not take back a cancelled conversion");
                            return;
                        }
                    }
                }
            });
        }
    }
}

/// Sets `entry` back to the mode it holds if it is still marked with the
/// conversion `conv`.
pub(super) async fn take_back(inner: &SessionInner, name: &str, entry: &Entry, conv: u32) -> Result<()> {
    loop {
        let queue = inner.call(inner.remote.read_queue(name)).await?;
        let Some(slot) = queue
            .slots
            .iter()
            .find(|s| s.entry.key == entry.key && s.entry.order == entry.order)
        else {
            return Ok(());
        };
        let state = State::decode(&slot.value, slot.changed);
        let Some(held) = state
            .granted
            .filter(|_| state.converting().is_some() && state.conv == conv)
        else {
            return Ok(());
        };
        let value = State {
            blocked: state.blocked,
            ..State::held(held, state.token)
        }
        .encode();
        let unchanged = [(&slot.entry, slot.version)];
        let update = QueueUpdate {
            dir: name,
            unchanged: &unchanged,
            present: &[],
            set: &[(&slot.entry, &value)],
            delete: &[],
            block: None,
        };
        if inner.call(inner.remote.update_queue(&update)).await?.is_some() {
            return Ok(());
        }
    }
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
