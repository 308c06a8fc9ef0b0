//! A guard's up-conversions: the mark, the reads after it that decide,
//! the grant, and the lock-delay an up-conversion may owe.

use super::take_back::ConversionCleanup;
use super::*;

impl ResourceGuard {
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
        // Whether a grant was sent whose answer said its condition failed:
        // a resend after a lost answer says so too when the first landed.
        let mut grant_sent = false;
        loop {
            let queue = acquire
                .retrying(|| inner.remote.read_queue(&self.resource.name))
                .await?;
            let mut view = View::new(&self.resource.name, queue)?;
            let Some(at) = view.position(&self.entry) else {
                return Err(inner.vanished_error(&self.entry.key).await);
            };
            let mine = view.slots[at].1;
            if grant_sent && mine.granted == Some(mode) && mine.converting().is_none() {
                // Only this guard's grant sets its entry to the new mode: it
                // landed, and its answer was lost. Marking again would write
                // the old mode back over it.
                let mut cell = self.cell();
                cell.mode = mode;
                cell.told = 0;
                cell.uncertain = false;
                if mode.writes() {
                    cell.token = mine.token;
                }
                cell.value = view.block.seen(&view);
                drop(cell);
                self.sync_release_block();
                return Ok(true);
            }
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
                let conv = State::conversion_id(!matches!(patience, Patience::Never));
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
                let write = SlotWrite::new(&self.resource.name, slot, &slot.entry, &value, None);
                let update = write.update();
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
                // Every other conversion marked toward a mode this one's
                // conflicts with is written again as it is (same state, a
                // new version): its grant may be decided from a read that
                // never saw this entry (appended after it), and is
                // conditioned on its own version, so it then fails and
                // reads again. Without it, an entry appended after that
                // read, granted a mode compatible with the mark's held mode
                // and converted up (a conversion counts a granted entry by
                // its held mode only), is granted beside it.
                let mut touched: Vec<(usize, Vec<u8>)> = (0..view.slots.len())
                    .filter(|&j| j != at)
                    .filter_map(|j| {
                        let other = view.slots[j].1;
                        other
                            .converting()
                            .filter(|target| !target.compatible(mode))
                            .map(|_| (j, other.encode()))
                    })
                    .collect();
                // A grant to PW or EX also writes again the earlier entries
                // whose grants may be pending from an older read, which
                // would write the value block as that read had it (see
                // `View::pending_before`).
                if mode.sole_writer() {
                    let already: Vec<usize> = touched.iter().map(|(j, _)| *j).collect();
                    touched.extend(
                        view.pending_before(at, &[])
                            .into_iter()
                            .filter(|(j, _)| !already.contains(j)),
                    );
                }
                let mut set: Vec<(&Entry, &[u8])> = vec![(&self.entry, value.as_slice())];
                set.extend(touched.iter().map(|(j, v)| (&view.slots[*j].0.entry, v.as_slice())));
                let update = QueueUpdate {
                    dir: &self.resource.name,
                    unchanged: &unchanged,
                    present: &[],
                    set: &set,
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
                    grant_sent = true;
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
                changed = changed(inner, &blocker, seen, view.slots[at].1) => {
                    woke(inner, &acquire, changed, blocker, &mut last_gone, &mut backoff).await?;
                }
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
}
