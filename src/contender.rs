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
}

impl From<Entry> for Contender {
    fn from(entry: Entry) -> Self {
        Contender {
            key: entry.key,
            kind: entry.kind,
            token: entry.token,
            owner: entry.owner,
        }
    }
}
