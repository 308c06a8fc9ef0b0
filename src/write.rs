//! Fenced writes: keys of the lock's own store, written only while a lock is held.

use std::collections::HashSet;

use crate::{Error, Result};

/// One change to a key of the lock's own store (an etcd key, an absolute
/// ZooKeeper path), applied by a guard's `write_if_held` only while it still
/// holds, together with the other changes of the same call or not at all.
///
/// This is what Go users write as
/// `Txn(If(mutex.IsOwner()).Then(Put(...)))`: state guarded by a lock,
/// changed only by its current holder, even when a holder paused past its
/// lease wakes up and writes.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// use lockline::Write;
///
/// let session = lockline::Client::memory().session().await?;
/// let guard = session.mutex("billing/nightly")?.lock().await?;
/// guard
///     .write_if_held([
///         Write::put("/billing/last-run", "2024-05-01"),
///         Write::delete("/billing/pending"),
///     ])
///     .await?;
/// assert_eq!(session.read("/billing/last-run").await?.as_deref(), Some(&b"2024-05-01"[..]));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Write {
    /// Sets `key` to `value`, creating it when it does not exist. The key is
    /// persistent: it outlives the session and the lock (it is guarded
    /// state, not a lock entry).
    Put {
        /// The key (etcd) or absolute path (ZooKeeper).
        key: String,
        /// Its new value.
        value: Vec<u8>,
    },
    /// Deletes `key` if it exists; deleting a missing key is not an error.
    Delete {
        /// The key (etcd) or absolute path (ZooKeeper).
        key: String,
    },
}

impl Write {
    /// Sets `key` to `value` (creating it if needed).
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Write::Put {
            key: key.into(),
            value: value.into(),
        }
    }

    /// Deletes `key` (nothing happens if it does not exist).
    pub fn delete(key: impl Into<String>) -> Self {
        Write::Delete { key: key.into() }
    }

    /// The key or path it changes.
    pub fn key(&self) -> &str {
        match self {
            Write::Put { key, .. } | Write::Delete { key } => key,
        }
    }

    /// The value a put writes; `None` for a delete.
    pub fn value(&self) -> Option<&[u8]> {
        match self {
            Write::Put { value, .. } => Some(value),
            Write::Delete { .. } => None,
        }
    }
}

/// Refuses a key no backend can store (empty).
pub(crate) fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidName {
            name: String::new(),
            reason: "the key is empty".into(),
        });
    }
    Ok(())
}

/// Refuses a batch that changes one key twice: etcd refuses such a
/// transaction, and the outcome would depend on the order otherwise.
pub(crate) fn refuse_duplicates(writes: &[Write]) -> Result<()> {
    let mut seen = HashSet::new();
    for write in writes {
        if !seen.insert(write.key()) {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "the key {:?} is changed twice in one write_if_held; give each key at most one write",
                    write.key()
                ),
            });
        }
    }
    Ok(())
}
