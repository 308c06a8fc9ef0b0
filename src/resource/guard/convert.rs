//! A guard's conversions: the calls, what ends them (a loss, a deadlock),
//! and the read that learns what a conversion cancelled in flight did.

use super::take_back::ConversionCleanup;
use super::*;

impl ResourceGuard {
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
    /// over-claims. A next conversion up from the mode it claims, to CW, PW
    /// or EX, takes a fresh token even when the server holds that mode
    /// already, or one above it.
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
        self.hold.set_release_view(None);
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
        let claimed = self.mode();
        self.resync().await?;
        let from = self.mode();
        // Up from the mode the guard claimed, but already held or down from
        // the mode held (an earlier conversion, cancelled in flight, left it
        // on the server): asked as an up-conversion, a writing mode takes a
        // fresh token as an up-conversion's grant does, above every token
        // granted while the guard did not know what it held.
        let fresh = mode.writes() && !mode.is_down_from(claimed);
        if mode == from && !fresh {
            return Ok(true);
        }
        if mode.is_down_from(from) {
            self.down(mode, fresh).await?;
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
        let (slot, block) = self.read_own().await?;
        let state = State::decode(&slot.value, slot.changed);
        let block = Block::decode(block.as_deref());
        {
            let mut cell = self.cell();
            if let Some(held) = state.granted {
                if !held.sole_writer() && cell.pending.is_some() {
                    // A down-conversion out of PW or EX landed, and its
                    // write of the block carried the value set before it.
                    cell.pending = None;
                    cell.value = block.value.clone();
                }
                if held != cell.mode {
                    // Entering PW or EX, the grant read the block as it is
                    // now (no one else writes it meanwhile).
                    if held.sole_writer() && !cell.mode.sole_writer() {
                        cell.value = block.value;
                    }
                    cell.mode = held;
                    cell.token = state.token;
                    cell.told = 0;
                } else if held.writes() {
                    // A down-conversion that took a fresh token landed.
                    cell.token = state.token;
                }
            }
            cell.uncertain = false;
        }
        self.sync_release_block();
        Ok(())
    }

    pub(super) async fn deadlock(&mut self, from: LockMode, to: LockMode) -> Error {
        let held = if self.resource.demote_on_deadlock {
            match self.down(LockMode::Nl, false).await {
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
}
