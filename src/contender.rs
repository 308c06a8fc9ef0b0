//! What a caller sees of a lock's queue.

use crate::backend::Entry;
use crate::{EntryKind, FencingToken};

/// One contender queued under a name, as [`Session::queue`](crate::Session::queue)
/// and the recipes' `contenders()` list them: holders first, then waiters in
/// the order they will be granted.
///
/// Other clients' contenders (etcdctl, Go's `concurrency`, Curator, kazoo)
/// are listed too, in their place in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Contender {
    /// The entry's key (etcd) or node path (ZooKeeper).
    pub key: String,
    /// What the contender is queued for.
    pub kind: EntryKind,
    /// The fencing token it holds with, or will hold with once granted.
    pub token: FencingToken,
    /// The session that owns the entry (etcd lease or ZooKeeper session id,
    /// in hex), when the server says.
    pub owner: Option<String>,
    /// When the contender is in lock-delay (next in line after a holder
    /// that lost its lock involuntarily, see
    /// [`SessionOptions::with_lock_delay`](crate::SessionOptions::with_lock_delay)):
    /// the time it will be granted at the earliest. It is not the holder
    /// until then. Looked at for the first few contenders of a queue.
    pub delayed_until: Option<std::time::SystemTime>,
}

impl From<Entry> for Contender {
    fn from(entry: Entry) -> Self {
        Contender {
            key: entry.key,
            kind: entry.kind,
            token: entry.token,
            owner: entry.owner,
            delayed_until: None,
        }
    }
}

/// The end of a lock-delay an entry's value marks, if it is still ahead.
pub(crate) fn delayed_until(value: &[u8]) -> Option<std::time::SystemTime> {
    let text = std::str::from_utf8(value).ok()?;
    let ms: u64 = text.strip_prefix(DELAY_MARK)?.parse().ok()?;
    let until = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    (until > std::time::SystemTime::now()).then_some(until)
}

/// The head of a lock-delay mark (see `acquire::delay_mark`).
pub(crate) const DELAY_MARK: &str = "lockline-delay-until:";
