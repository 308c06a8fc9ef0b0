//! Lock-delay flags and hand-over markers as this session writes them: the
//! flag its first append to a lock leaves, the marker a removal writes where
//! a lock is flagged, and the `closing` marks of `close()`.

use super::*;

/// How many hand-over markers one transaction of `close()` writes (etcd
/// refuses transactions of more than 128 operations by default).
const CLOSING_PER_TXN: usize = 64;

/// How many flagged locks a session with a lock-delay remembers.
const FLAGGED_LIMIT: usize = 4096;

impl EtcdSession {
    /// Whether removals write the session's hand-over marker.
    pub(super) fn markers_allowed(&self) -> bool {
        !self.markers_refused.load(Ordering::Relaxed)
    }

    /// The server refused a removal with the hand-over marker and took it
    /// without: the user's roles do not cover the marker prefix for writes.
    pub(super) fn refuse_markers(&self, refused: &Error) {
        if !self.markers_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                lease = %self.id,
                %refused,
                "the hand-over marker may not be written: releases by this session look like losses to waiters with a lock-delay"
            );
        }
    }

    /// The server refused an append with this lock-delayed session's flag
    /// and took it without: the user's roles do not cover the marker prefix
    /// for writes. Without a flag of its own, the releases before this
    /// session's entries write no marker for it (unless another lock-delayed
    /// session flagged the lock), so its waits take them for losses: held
    /// back for the lock-delay after each, never granted early. Its own
    /// removals write no marker either.
    pub(super) fn refuse_flag(&self, refused: &Error) {
        if !self.markers_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                lease = %self.id,
                %refused,
                "the lock-delay flag may not be written: this session queues without it, so a release before its wait looks like a loss and it is held back for the lock-delay after each (never granted early); releases by this session look like losses to waiters with a lock-delay"
            );
        }
    }

    /// The put of this session's hand-over marker for the lock `dir`, bound
    /// to its lease.
    fn hand_over(&self, dir: &str, value: &[u8]) -> TxnOp {
        TxnOp::put(
            layout::released(&self.markers, dir, &self.id),
            value.to_vec(),
            Some(PutOptions::new().with_lease(self.lease)),
        )
    }

    /// The put of this session's hand-over marker for the lock `dir` as a
    /// removal writes it: only if a lock-delayed contender flagged the lock
    /// (a nested transaction whose compare, on the range of the flags, is
    /// evaluated with the removal's own, before any of its writes), or
    /// always with [`Etcd::with_release_markers`](crate::Etcd::with_release_markers).
    /// Without a flag the removal writes nothing but its delete.
    pub(super) fn hand_over_if_awaited(&self, dir: &str) -> TxnOp {
        let put = self.hand_over(dir, b"");
        if self.always_mark {
            return put;
        }
        TxnOp::txn(Txn::new().when([self.awaited(dir)]).and_then([put]))
    }

    /// The compare that holds while a lock-delayed contender has flagged
    /// the lock `dir`: some key under its flags' prefix (a range compare on
    /// an empty range compares a missing key, version 0).
    fn awaited(&self, dir: &str) -> Compare {
        Compare::version(layout::delay_flags(&self.markers, dir), CompareOp::Greater, 0).with_prefix()
    }

    /// Whether this session's lock-delay flag is known to be on the lock
    /// `dir` (on the marker prefix, under one).
    pub(super) fn is_flagged(&self, dir: &str) -> bool {
        self.flagged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(self.flag_scope(dir))
    }

    /// Remembers that this session's lock-delay flag is on the lock `dir`.
    pub(super) fn flagged(&self, dir: &str) {
        let mut flagged = self.flagged.lock().unwrap_or_else(PoisonError::into_inner);
        if flagged.len() >= FLAGGED_LIMIT {
            flagged.clear();
        }
        flagged.insert(self.flag_scope(dir).to_owned());
    }

    /// What one flag stands for: the lock `dir` beside it, every lock under
    /// a marker prefix.
    fn flag_scope<'a>(&self, dir: &'a str) -> &'a str {
        match self.markers {
            layout::Markers::BesideEachLock => dir,
            layout::Markers::Under(_) => "",
        }
    }

    /// Remembers that `key`, an entry of this session in the lock `dir`,
    /// exists (markers beside each lock only: `close()` marks those locks).
    pub(super) fn track(&self, key: &str, dir: &str) {
        if self.markers == layout::Markers::BesideEachLock {
            self.live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.to_owned(), dir.to_owned());
        }
    }

    /// Forgets the entry `key`: removed, or never made.
    pub(super) fn untrack(&self, key: &str) {
        if self.markers == layout::Markers::BesideEachLock {
            self.live.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
        }
    }

    /// The hand-over markers `close()` writes `closing` into, with the lock
    /// each stands for: the session's one marker under a marker prefix, or
    /// beside each lock it still has entries in.
    fn closing_markers(&self) -> Vec<(String, String)> {
        match &self.markers {
            layout::Markers::Under(_) => vec![(layout::released(&self.markers, "", &self.id), String::new())],
            layout::Markers::BesideEachLock => {
                let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
                let dirs: std::collections::BTreeSet<&str> = live.values().map(String::as_str).collect();
                dirs.into_iter()
                    .map(|dir| (layout::released(&self.markers, dir, &self.id), dir.to_owned()))
                    .collect()
            }
        }
    }

    /// Before the revoke of a close: the hand-over markers say the session
    /// is closing, so that a waiter with a lock-delay takes the revoke's
    /// deletions for a hand-over. Written with the session's lease, so they
    /// are only written while the lease lives (a lease the server already let
    /// expire fails the put: those deletions were a loss). One transaction
    /// per [`CLOSING_PER_TXN`] locks the session still has entries in, sent
    /// together; each marker only if a lock-delayed contender flagged its
    /// lock (as a removal writes it), so that without lock-delayed
    /// contenders the transaction writes nothing. Best effort, bounded:
    /// without them waiters are only held back.
    pub(super) async fn mark_closing(&self) {
        let markers = self.closing_markers();
        if markers.is_empty() {
            return;
        }
        let txns = markers.chunks(CLOSING_PER_TXN).map(|chunk| {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(marker, dir)| {
                    let put = TxnOp::put(
                        marker.clone(),
                        layout::CLOSING.to_vec(),
                        Some(PutOptions::new().with_lease(self.lease)),
                    );
                    if self.always_mark {
                        put
                    } else {
                        TxnOp::txn(Txn::new().when([self.awaited(dir)]).and_then([put]))
                    }
                })
                .collect();
            let mut kv = self.client.kv_client();
            async move { kv.txn(Txn::new().and_then(ops)).await }
        });
        let marked = futures::future::join_all(txns);
        let first = &markers[0].0;
        match tokio::time::timeout(self.close_mark_timeout, marked).await {
            Ok(results) => {
                for error in results.into_iter().filter_map(std::result::Result::err) {
                    tracing::debug!(lease = %self.id, marker = first, %error, "closing without a hand-over marker");
                }
            }
            Err(_) => {
                tracing::debug!(lease = %self.id, marker = first, "closing without a hand-over marker: no answer in time")
            }
        }
    }
}
