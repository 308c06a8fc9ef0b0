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
