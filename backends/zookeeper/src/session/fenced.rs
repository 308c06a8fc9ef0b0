//! Fenced writes: a batch of writes applied in one multi, only while the
//! holder's node still exists, and plain reads of keys.

use super::*;

/// How many times a fenced write is tried again when a node it puts or
/// deletes appeared or vanished between its read and its `multi`, or a
/// parent had to be created.
pub(super) const WRITE_TRIES: usize = 8;

/// What a fenced write does to one node, decided from a read just before.
#[derive(Debug, Clone, Copy)]
pub(super) enum NodeOp<'a> {
    Create(&'a str, &'a [u8]),
    Set(&'a str, &'a [u8]),
    Delete(&'a str),
}

pub(super) fn op_path<'a>(op: &NodeOp<'a>) -> &'a str {
    match *op {
        NodeOp::Create(path, _) | NodeOp::Set(path, _) | NodeOp::Delete(path) => path,
    }
}

/// The parent path of an absolute path (`None` for a child of the root).
pub(super) fn parent_of(path: &str) -> Option<&str> {
    path.rfind('/').filter(|&at| at > 0).map(|at| &path[..at])
}

impl ZkSession {
    /// Which of the nodes `writes` change exist now: one multi-read.
    pub(super) async fn existing(&self, client: &Client, writes: &[Write]) -> Result<Vec<bool>> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let mut reader = client.new_multi_reader();
        for write in writes {
            reader
                .add_get_data(write.key())
                .map_err(|e| self.err_on(e, "read", write.key()))?;
        }
        let results = reader
            .commit()
            .await
            .map_err(|e| self.err_on(e, "read", writes[0].key()))?;
        writes
            .iter()
            .zip(results)
            .map(|(write, result)| match result {
                MultiReadResult::Data { .. } => Ok(true),
                MultiReadResult::Error { err: ZkError::NoNode } => Ok(false),
                MultiReadResult::Error { err } => Err(self.err_on(err, "read", write.key())),
                _ => Err(Error::backend(
                    crate::error::BACKEND,
                    format!("unexpected answer to reading {:?}", write.key()),
                )),
            })
            .collect()
    }

    pub(super) async fn write_fenced(&self, entry: &Entry, writes: &[Write]) -> Result<bool> {
        let client = self.client()?;
        let dir = dir_of(&entry.key);
        let inside = format!("{dir}/");
        if let Some(write) = writes.iter().find(|w| w.key() == dir || w.key().starts_with(&inside)) {
            return Err(Error::InvalidName {
                name: write.key().to_owned(),
                reason: format!("the path is the directory {dir:?} of the lock that fences the write, or under it"),
            });
        }
        // On the wire each operation of a `multi` also carries its header
        // and the chroot before its path; a put may create its node, with
        // its data and every ACL (permissions, scheme and id with lengths).
        let chroot = client.path().len();
        let acls: usize = self
            .acls
            .iter()
            .map(|acl| ACL_BYTES + acl.scheme().len() + acl.id().len())
            .sum();
        let size = writes
            .iter()
            .map(|w| {
                MULTI_OP_OVERHEAD
                    + chroot
                    + w.key().len()
                    + match w {
                        Write::Put { value, .. } => value.len() + acls,
                        _ => 0,
                    }
            })
            .sum();
        fits(size, writes.first().map_or(entry.key.as_str(), Write::key))?;
        let persistent = CreateMode::Persistent.with_acls(Acls::new(&self.acls));
        for _ in 0..WRITE_TRIES {
            let exists = self.existing(&client, writes).await?;
            let mut ops = Vec::with_capacity(writes.len());
            for (write, exists) in writes.iter().zip(exists) {
                match (write, exists) {
                    (Write::Put { key, value }, false) => ops.push(NodeOp::Create(key, value)),
                    (Write::Put { key, value }, true) => ops.push(NodeOp::Set(key, value)),
                    (Write::Delete { key }, true) => ops.push(NodeOp::Delete(key)),
                    (Write::Delete { .. }, false) => {}
                    (other, _) => {
                        return Err(Error::InvalidOptions {
                            reason: format!("the ZooKeeper backend cannot apply {other:?}"),
                        })
                    }
                }
            }
            let mut multi = client.new_multi_writer();
            multi
                .add_check_version(&entry.key, -1)
                .map_err(|e| self.err_on(e, "check", &entry.key))?;
            for op in &ops {
                let added = match *op {
                    NodeOp::Create(path, value) => multi.add_create(path, value, &persistent),
                    NodeOp::Set(path, value) => multi.add_set_data(path, value, None),
                    NodeOp::Delete(path) => multi.add_delete(path, None),
                };
                added.map_err(|e| self.err_on(e, "write", op_path(op)))?;
            }
            // Never sent past the loss deadline, however long the steps
            // above took (a stalled process).
            self.check_deadline()?;
            let failure = match multi.commit().await {
                Ok(_) => return Ok(true),
                Err(MultiWriteError::RequestFailed {
                    source: ZkError::NoAuth,
                }) => return Err(denied("write", dir)),
                Err(MultiWriteError::RequestFailed { source }) => return Err(self.err_sent(source, dir)),
                Err(MultiWriteError::OperationFailed { index, source }) => (index, source),
            };
            let (index, source) = failure;
            let Some(op) = index.checked_sub(1).and_then(|at| ops.get(at)) else {
                // The check of the entry's node failed: no longer held.
                return match source {
                    ZkError::NoNode | ZkError::BadVersion => Ok(false),
                    other => Err(self.err_on(other, "check", &entry.key)),
                };
            };
            match (*op, source) {
                // The node appeared or vanished since it was read: read again.
                (NodeOp::Create(..), ZkError::NodeExists)
                | (NodeOp::Set(..), ZkError::NoNode)
                | (NodeOp::Delete(_), ZkError::NoNode) => {}
                (NodeOp::Create(path, _), ZkError::NoNode) => {
                    if parent_of(path).is_none() {
                        return Err(Error::backend(
                            crate::error::BACKEND,
                            format!("cannot create {path:?}: the connect string's chroot does not exist"),
                        ));
                    }
                    // Every missing parent of the batch at once, so a batch
                    // with many new directories needs one more try, not one each.
                    for parent in ops.iter().filter_map(|op| match *op {
                        NodeOp::Create(path, _) => parent_of(path),
                        _ => None,
                    }) {
                        match client.mkdir(parent, &persistent).await {
                            Ok(()) | Err(ZkError::NodeExists) => {}
                            Err(error) => return Err(self.err_on(error, "create", parent)),
                        }
                    }
                }
                (NodeOp::Delete(path), ZkError::NotEmpty) => {
                    return Err(Error::InvalidOptions {
                        reason: format!("cannot delete {path:?}: the node has children (delete them first)"),
                    })
                }
                (op, error) => return Err(self.err_on(error, "write", op_path(&op))),
            }
        }
        Err(Error::backend(
            crate::error::BACKEND,
            format!(
                "a fenced write under the lock {dir:?} was tried {WRITE_TRIES} times; the nodes it writes kept \
                 appearing or vanishing under it"
            ),
        ))
    }

    pub(super) async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let client = self.client()?;
        match client.get_data(key).await {
            Ok((data, _)) => Ok(Some(data)),
            Err(ZkError::NoNode) => Ok(None),
            Err(error) => Err(self.err_on(error, "read", key)),
        }
    }
}
