//! Releases: a node deleted with the release mark in one multi, so that its
//! waiters can tell a release from a loss.

use super::*;

/// The data a release writes into its node in the same transaction as it
/// deletes it (see [`ZkSession::release_node`]): nothing, the change itself
/// is the mark.
pub(super) const RELEASE_MARK: &[u8] = b"";

impl ZkSession {
    /// Deletes one of this session's nodes as a release: one `multi` that
    /// first sets the node's data (to [`RELEASE_MARK`]) and then deletes it.
    /// A contender waiting on the node is woken by the data change, and
    /// finds the node gone at the read it makes next: that tells it the node
    /// was released. A node that goes with its session (expired, closed
    /// without `close()`) is deleted without the change: its waiters hear
    /// `NodeDeleted` (see [`ZkSession::departure`]). The same one request as
    /// a plain delete; the data change needs WRITE on the node, which the
    /// session's own ACL policy always gives it, and nothing is written
    /// outside the node. Returns whether it deleted the node.
    ///
    /// The request is sent when this function is called, not when its
    /// future is first polled, so `close()` can send several at once.
    ///
    /// An election candidate's node is deleted without the mark (`marked`
    /// false): Curator's `LeaderLatch` wakes only on `NodeDeleted`, so a
    /// latch queued behind a lockline candidate would miss a data change and
    /// wait for ever.
    pub(super) fn release_node<'a>(
        &'a self,
        client: &'a Client,
        key: &'a str,
        marked: bool,
    ) -> impl std::future::Future<Output = Result<bool>> + Send + 'a {
        let mut multi = client.new_multi_writer();
        let built = if marked {
            multi.add_set_data(key, RELEASE_MARK, None)
        } else {
            Ok(())
        };
        let built = built.and_then(|()| multi.add_delete(key, None));
        let sent = built.map(|()| multi.commit());
        async move {
            let outcome = match sent {
                Ok(commit) => commit.await,
                Err(error) => return Err(self.err_on(error, "delete", key)),
            };
            match outcome {
                Ok(_) => Ok(true),
                Err(MultiWriteError::OperationFailed {
                    source: ZkError::NoNode,
                    ..
                }) => Ok(false),
                // Not allowed to change the node's data (an ACL set on it
                // since): delete it plainly; a waiter takes that for a loss,
                // which only delays it.
                Err(MultiWriteError::OperationFailed {
                    index: 0,
                    source: ZkError::NoAuth,
                }) => match client.delete(key, None).await {
                    Ok(()) => Ok(true),
                    Err(ZkError::NoNode) => Ok(false),
                    Err(error) => Err(self.err_on(error, "delete", key)),
                },
                Err(MultiWriteError::OperationFailed { source, .. } | MultiWriteError::RequestFailed { source }) => {
                    Err(self.err_on(source, "delete", key))
                }
            }
        }
    }

    pub(super) async fn remove_node(&self, entry: &Entry) -> Result<bool> {
        let client = self.client()?;
        let _writing = self.writing();
        let removed = self.release_node(&client, &entry.key, marks(entry.kind)).await;
        if removed.is_ok() {
            lock(&self.held).remove(&entry.key);
        }
        removed
    }
}

/// Whether a release of a node of `kind` carries the release mark (see
/// `ZkSession::release_node`): every kind but an election candidate.
pub(super) fn marks(kind: EntryKind) -> bool {
    kind != EntryKind::Election
}
