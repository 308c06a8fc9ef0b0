//! Fenced writes: a batch of puts and deletes applied in one transaction,
//! only while the holder's entry is still the one it was granted with.

use super::*;

impl EtcdSession {
    /// [`BackendSession::write_if_held`], described there.
    pub(super) async fn write_fenced(&self, entry: &Entry, writes: &[Write]) -> Result<bool> {
        let own = layout::prefix(layout::dir_of(entry));
        let mut ops = Vec::with_capacity(writes.len());
        for write in writes {
            let key = self.within(write.key());
            if key.starts_with(&own) {
                return Err(Error::InvalidName {
                    name: write.key().to_owned(),
                    reason: format!(
                        "the key lies under {own:?}, the prefix of the lock that fences the write, \
                         where Go's and etcdctl's contenders would take it for a lock holder"
                    ),
                });
            }
            ops.push(match write {
                Write::Put { value, .. } => TxnOp::put(key.into_owned(), value.clone(), None),
                Write::Delete { .. } => TxnOp::delete(key.into_owned(), None),
                other => {
                    return Err(Error::InvalidOptions {
                        reason: format!("the etcd backend cannot apply {other:?}"),
                    })
                }
            });
        }
        let txn = fenced_on(entry, ops);
        let named = writes.first().map_or(entry.key.as_str(), Write::key);
        Ok(self.txn(txn, "write", named).await?.succeeded())
    }
}
