//! The same-session FIFO queues: the contenders of one session for one
//! name pass through one in-process queue before the session's entry is
//! written (DESIGN §5).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, Weak};

use super::SessionInner;
use crate::EntryKind;

/// Same-session FIFO queues by (name, kind); weak, so idle ones go away.
#[derive(Default)]
pub(super) struct LocalQueues {
    queues: HashMap<(String, EntryKind), Weak<tokio::sync::Mutex<()>>>,
    /// How many queues the map may hold before idle ones are dropped again:
    /// twice those left by the last pruning, so that pruning costs O(1) per
    /// call, amortised (pruning on every call was O(names), which made a
    /// session taking many locks quadratic).
    prune_at: usize,
}

impl SessionInner {
    /// The in-process FIFO queue that same-session contenders for one name pass
    /// through before the session's entry is written (DESIGN §5).
    pub(crate) fn local_queue(&self, name: &str, kind: EntryKind) -> Arc<tokio::sync::Mutex<()>> {
        let mut local = self.local_queues.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (name.to_owned(), kind);
        if let Some(queue) = local.queues.get(&key).and_then(Weak::upgrade) {
            return queue;
        }
        let queue = Arc::new(tokio::sync::Mutex::new(()));
        if local.queues.len() >= local.prune_at {
            local.queues.retain(|_, weak| weak.strong_count() > 0);
            local.prune_at = (local.queues.len() * 2).max(16);
        }
        local.queues.insert(key, Arc::downgrade(&queue));
        queue
    }
}
