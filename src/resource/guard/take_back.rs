//! Taking back a conversion given up (cancelled, timed out or failed), so
//! that it leaves no mark behind.

use super::*;

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
        // On the session's runtime (dropped on any thread), counted by
        // `flush`, and tried until it is done or the session is over (the
        // server then removes the entry, mark and all): a mark left behind
        // would keep every later request but NL waiting.
        let background = Arc::clone(&inner);
        background.spawn_background(async move {
            let mut pause = INITIAL_BACKOFF;
            let mut failures = 0u32;
            loop {
                let outcome = tokio::select! {
                    biased;
                    _ = inner.over() => return,
                    outcome = take_back(&inner, &name, &entry, conv) => outcome,
                };
                match outcome {
                    Ok(()) => return,
                    Err(error) if error.is_transient() => {
                        failures += 1;
                        if failures == TAKE_BACK_WARN_AFTER {
                            tracing::warn!(key = %entry.key, %error, failures, "still cannot take back a cancelled conversion; retrying until the session ends");
                        } else {
                            tracing::debug!(key = %entry.key, %error, "taking back a cancelled conversion; retrying");
                        }
                    }
                    Err(error) => {
                        tracing::warn!(key = %entry.key, %error, "could not take back a cancelled conversion");
                        return;
                    }
                }
                tokio::select! {
                    biased;
                    _ = inner.over() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        });
    }
}

/// Failed tries after which a background take-back is logged as a warning.
const TAKE_BACK_WARN_AFTER: u32 = 8;

/// Sets `entry` back to the mode it holds if it is still marked with the
/// conversion `conv`.
pub(super) async fn take_back(inner: &SessionInner, name: &str, entry: &Entry, conv: u32) -> Result<()> {
    loop {
        let queue = inner.call(inner.remote.read_queue(name)).await?;
        let Some(slot) = position_in(&queue, entry).map(|at| &queue.slots[at]) else {
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
        let write = SlotWrite::new(name, slot, &slot.entry, &value, None);
        if inner.call(inner.remote.update_queue(&write.update())).await?.is_some() {
            return Ok(());
        }
    }
}
