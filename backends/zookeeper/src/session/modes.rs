//! Lock-mode resources on ZooKeeper: one multi-read of a directory (its
//! listing, the value block and every contender's data), remembered
//! between reads, and the conditional update of a queue as one multi.

use super::release::RELEASE_MARK;
use super::*;

/// What a session last saw of one lock-mode resource's directory.
///
/// Only a guess that saves a round trip: `read_queue` sends the listing of
/// the directory, the value block and the data of every child named here in
/// one multi-read, and uses the answer only if every contender the listing
/// shows was among them (a consistent snapshot of the whole queue);
/// otherwise it reads again with the names it was just given.
#[derive(Debug, Clone, Default)]
pub(super) struct QueueMemo {
    /// The contenders' node names the last listing showed.
    pub(super) children: Vec<String>,
    /// Whether the value block node existed (an update then sets its data
    /// instead of creating it).
    pub(super) block: bool,
    /// A whole queue read by `watch_value` when it found the node it
    /// watched released, when, and the session's write count when its read
    /// was sent: the `read_queue` the core makes next is answered from it
    /// instead of the server (see [`ZkSession::take_fresh`]).
    pub(super) fresh: Option<(Instant, u64, Queue)>,
}

/// One multi-read of a lock-mode resource's directory (see
/// [`ZkSession::snapshot`]).
#[derive(Debug)]
pub(super) struct Snapshot {
    /// The contenders its listing shows, in queue order.
    pub(super) contenders: Vec<Contender>,
    /// The data and stat of the children it read, by name.
    pub(super) read: HashMap<String, (Vec<u8>, Stat)>,
    /// The value block, when it exists.
    pub(super) block: Option<Vec<u8>>,
}

impl Snapshot {
    /// The whole queue, if every contender listed had its data read in the
    /// same request; otherwise the contenders' names, to read next time.
    pub(super) fn queue(mut self, dir: &str) -> std::result::Result<Queue, Vec<String>> {
        if !self.contenders.iter().all(|c| self.read.contains_key(&c.name)) {
            return Err(self.contenders.into_iter().map(|c| c.name).collect());
        }
        let mut slots = Vec::with_capacity(self.contenders.len());
        for contender in &self.contenders {
            let Some((data, stat)) = self.read.remove(&contender.name) else {
                continue;
            };
            let mut entry = contender.entry(dir);
            entry.token = FencingToken::new(u64::try_from(stat.czxid).unwrap_or(0));
            entry.owner = (stat.ephemeral_owner != 0).then(|| format!("{:x}", stat.ephemeral_owner));
            slots.push(Slot {
                // Other recipes' entries come with an empty value.
                value: if entry.kind == EntryKind::Dlm { data } else { Vec::new() },
                entry,
                version: i64::from(stat.version),
                changed: u64::try_from(stat.mzxid).unwrap_or(0),
            });
        }
        Ok(Queue {
            slots,
            block: self.block,
        })
    }
}

/// How many directories a session remembers a [`QueueMemo`] of; past it the
/// memory is emptied (costing each resource one more round trip on its
/// next read).
pub(super) const QUEUE_MEMO_MAX: usize = 1024;

/// How long a queue read by `watch_value` answers the next `read_queue`
/// of its directory (see [`ZkSession::take_fresh`]): the core reads right
/// after the wait.
pub(super) const FRESH_FOR: Duration = Duration::from_secs(1);

/// How many times `read_queue` reads again when contenders appeared between
/// the listing it guessed from and its read, and `update_queue` writes
/// again when its guess about the value block's node was wrong.
pub(super) const QUEUE_TRIES: usize = 16;

/// What one operation of an update's `multi` stands for (see
/// `update_queue`), to tell which failed.
#[derive(Debug, Clone, Copy)]
pub(super) enum QueueStep<'a> {
    /// A check, set or delete of an entry: its failure is a failed condition.
    Entry(&'a Entry),
    /// The value block's `setData`.
    SetBlock,
    /// The value block's `create`.
    CreateBlock,
    /// The stamp node's `create`.
    CreateStamp,
    /// The stamp node's `setData` or `delete`.
    Stamp,
}

/// What an update does to one entry.
#[derive(Debug, Clone, Copy)]
pub(super) enum EntryChange<'a> {
    Check,
    Set(&'a [u8]),
    Delete,
}

impl ZkSession {
    /// Remembers what a look at a lock-mode resource's directory showed
    /// (see [`QueueMemo`]): `children` when given, and `block` when known.
    pub(super) fn remember_queue(&self, dir: &str, children: Option<Vec<String>>, block: Option<bool>) {
        let mut queues = lock(&self.queues);
        if queues.len() >= QUEUE_MEMO_MAX && !queues.contains_key(dir) {
            queues.clear();
        }
        let memo = queues.entry(dir.to_owned()).or_default();
        // A newer look than any kept queue: never answer from the older one.
        memo.fresh = None;
        if let Some(children) = children {
            memo.children = children;
        }
        if let Some(block) = block {
            memo.block = block;
        }
    }

    /// One multi-read of a lock-mode resource: the directory's children,
    /// the value block, and the data and stat of each node in `guess`.
    pub(super) async fn snapshot(&self, client: &Client, dir: &str, guess: &[String]) -> Result<Snapshot> {
        let block_path = layout::value_block_path(dir);
        let paths: Vec<String> = guess.iter().map(|name| format!("{dir}/{name}")).collect();
        let chroot = client.path().len();
        let size = paths
            .iter()
            .chain([&block_path])
            .map(|path| MULTI_OP_OVERHEAD + chroot + path.len())
            .sum::<usize>()
            + MULTI_OP_OVERHEAD
            + chroot
            + dir.len();
        fits(size, dir)?;
        let mut reader = client.new_multi_reader();
        reader.add_get_children(dir).map_err(|e| self.err_on(e, "read", dir))?;
        reader
            .add_get_data(&block_path)
            .map_err(|e| self.err_on(e, "read", &block_path))?;
        for path in &paths {
            reader.add_get_data(path).map_err(|e| self.err_on(e, "read", path))?;
        }
        let mut results = reader
            .commit()
            .await
            .map_err(|e| self.err_on(e, "read", dir))?
            .into_iter();
        let unexpected = |path: &str| {
            Error::backend(
                crate::error::BACKEND,
                format!("unexpected answer to reading {path:?} in a multi-read"),
            )
        };
        let children = match results.next() {
            Some(MultiReadResult::Children { children }) => children,
            // No directory: no entries, and no block under it either.
            Some(MultiReadResult::Error { err: ZkError::NoNode }) => Vec::new(),
            Some(MultiReadResult::Error { err }) => return Err(self.err_on(err, "read", dir)),
            _ => return Err(unexpected(dir)),
        };
        let block = match results.next() {
            Some(MultiReadResult::Data { data, .. }) => Some(data),
            Some(MultiReadResult::Error { err: ZkError::NoNode }) => None,
            Some(MultiReadResult::Error { err }) => return Err(self.err_on(err, "read", &block_path)),
            _ => return Err(unexpected(&block_path)),
        };
        let mut read = HashMap::with_capacity(guess.len());
        for ((name, path), result) in guess.iter().zip(&paths).zip(results) {
            match result {
                MultiReadResult::Data { data, stat } => {
                    read.insert(name.clone(), (data, stat));
                }
                // Gone since the listing the guess came from.
                MultiReadResult::Error { err: ZkError::NoNode } => {}
                MultiReadResult::Error { err } => return Err(self.err_on(err, "read", path)),
                _ => return Err(unexpected(path)),
            }
        }
        Ok(Snapshot {
            contenders: layout::contenders(&children),
            read,
            block,
        })
    }

    /// [`snapshot`](Self::snapshot), remembered: the queue when it is
    /// whole, else the names to read next time.
    pub(super) async fn read_queue_once(
        &self,
        client: &Client,
        dir: &str,
        guess: &[String],
    ) -> Result<std::result::Result<Queue, Vec<String>>> {
        let snapshot = self.snapshot(client, dir, guess).await?;
        Ok(self.remember_snapshot(dir, snapshot))
    }

    /// Remembers what a snapshot showed (the contenders' names, whether the
    /// block exists) and returns its queue when it is whole, else the names.
    pub(super) fn remember_snapshot(&self, dir: &str, snapshot: Snapshot) -> std::result::Result<Queue, Vec<String>> {
        let block = snapshot.block.is_some();
        let queue = snapshot.queue(dir);
        let names = match &queue {
            Ok(queue) => queue
                .slots
                .iter()
                .map(|s| s.entry.key.rsplit('/').next().unwrap_or_default().to_owned())
                .collect(),
            Err(names) => names.clone(),
        };
        self.remember_queue(dir, Some(names), Some(block));
        queue
    }

    /// The queue `watch_value` read when the node it watched was released,
    /// if no more than [`FRESH_FOR`] ago and nothing since: it is taken
    /// once. A later read of the directory from the server drops it, and no
    /// write of this session may have begun or ended since its read was sent
    /// (see [`writing`](Self::writing)), so a session's reads of one
    /// resource never go back in time and always show its own writes: such
    /// a queue is what a read from a server a moment behind the leader
    /// gives, which ZooKeeper's reads may always be.
    pub(super) fn take_fresh(&self, dir: &str) -> Option<Queue> {
        let (at, writes, queue) = lock(&self.queues).get_mut(dir)?.fresh.take()?;
        (at.elapsed() <= FRESH_FOR && writes == self.writes.load(Ordering::SeqCst)).then_some(queue)
    }

    pub(super) async fn read_dlm_queue(&self, dir: &str) -> Result<Queue> {
        let client = self.client()?;
        let dir = layout::dir_path(dir);
        if let Some(queue) = self.take_fresh(&dir) {
            return Ok(queue);
        }
        let mut guess = lock(&self.queues)
            .get(&dir)
            .map(|memo| memo.children.clone())
            .unwrap_or_default();
        for _ in 0..QUEUE_TRIES {
            match self.read_queue_once(&client, &dir, &guess).await? {
                Ok(queue) => return Ok(queue),
                Err(listed) => guess = listed,
            }
        }
        Err(Error::unavailable(
            crate::error::BACKEND,
            format!(
                "reading the queue of {dir:?}: new contenders appeared between each listing and the read of \
                 their data, {QUEUE_TRIES} times in a row"
            ),
        ))
    }

    pub(super) async fn update_dlm_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let client = self.client()?;
        let dir = layout::dir_path(update.dir);
        let _writing = self.writing();
        let block_path = layout::value_block_path(&dir);
        let stamp_path = layout::stamp_path(&dir);
        // One operation per entry, in the order the core named them. An
        // entry named in `present` (or only in `set` or `delete`) must exist
        // at any version: version -1.
        let versions: HashMap<&str, i64> = update
            .unchanged
            .iter()
            .map(|(entry, version)| (entry.key.as_str(), *version))
            .collect();
        let values: HashMap<&str, &[u8]> = update
            .set
            .iter()
            .map(|(entry, value)| (entry.key.as_str(), *value))
            .collect();
        let deleted: HashSet<&str> = update.delete.iter().map(|entry| entry.key.as_str()).collect();
        let named = update
            .unchanged
            .iter()
            .map(|(entry, _)| *entry)
            .chain(update.present.iter().copied())
            .chain(update.set.iter().map(|(entry, _)| *entry))
            .chain(update.delete.iter().copied());
        let mut seen: HashSet<&str> = HashSet::new();
        let mut changes: Vec<(&Entry, Option<i32>, EntryChange<'_>)> = Vec::new();
        for entry in named {
            if !seen.insert(entry.key.as_str()) {
                continue;
            }
            let version = match versions.get(entry.key.as_str()) {
                Some(&version) => match i32::try_from(version) {
                    Ok(version) => Some(version),
                    // No ZooKeeper node is at such a version.
                    Err(_) => return Ok(None),
                },
                None => None,
            };
            let change = if deleted.contains(entry.key.as_str()) {
                EntryChange::Delete
            } else if let Some(value) = values.get(entry.key.as_str()) {
                EntryChange::Set(value)
            } else {
                EntryChange::Check
            };
            changes.push((entry, version, change));
        }
        // A delete is a release: the node is marked (its data set) and
        // deleted, as `release_node` does, so a lock-delayed waiter tells
        // it from a loss; the mark's `setData` gives the zxid too.
        let sets = changes
            .iter()
            .any(|(_, _, change)| !matches!(change, EntryChange::Check));
        let stamped = !sets && update.block.is_none();
        let chroot = client.path().len();
        let acls: usize = self
            .acls
            .iter()
            .map(|acl| ACL_BYTES + acl.scheme().len() + acl.id().len())
            .sum();
        let size = changes
            .iter()
            .map(|(entry, _, change)| {
                MULTI_OP_OVERHEAD
                    + chroot
                    + entry.key.len()
                    + match change {
                        EntryChange::Set(value) => value.len(),
                        // The mark, then the delete.
                        EntryChange::Delete => MULTI_OP_OVERHEAD + chroot + entry.key.len() + RELEASE_MARK.len(),
                        EntryChange::Check => 0,
                    }
            })
            .sum::<usize>()
            + update.block.map_or(0, |block| {
                2 * (MULTI_OP_OVERHEAD + chroot + block_path.len() + block.len()) + acls
            })
            + if stamped {
                3 * (MULTI_OP_OVERHEAD + chroot + stamp_path.len()) + acls
            } else {
                0
            };
        fits(size, &dir)?;
        let persistent = CreateMode::Persistent.with_acls(Acls::new(&self.acls));
        let mut block_exists = lock(&self.queues).get(&dir).is_none_or(|memo| memo.block);
        for _ in 0..QUEUE_TRIES {
            let mut multi = client.new_multi_writer();
            let mut steps: Vec<QueueStep<'_>> = Vec::with_capacity(changes.len() + 3);
            for &(entry, version, change) in &changes {
                let added = match change {
                    EntryChange::Check => multi.add_check_version(&entry.key, version.unwrap_or(-1)),
                    EntryChange::Set(value) => multi.add_set_data(&entry.key, value, version),
                    EntryChange::Delete => {
                        steps.push(QueueStep::Entry(entry));
                        multi
                            .add_set_data(&entry.key, RELEASE_MARK, version)
                            .and_then(|()| multi.add_delete(&entry.key, None))
                    }
                };
                added.map_err(|e| self.err_on(e, "write", &entry.key))?;
                steps.push(QueueStep::Entry(entry));
            }
            if let Some(block) = update.block {
                if !block_exists {
                    multi
                        .add_create(&block_path, block, &persistent)
                        .map_err(|e| self.err_on(e, "write", &block_path))?;
                    steps.push(QueueStep::CreateBlock);
                }
                multi
                    .add_set_data(&block_path, block, None)
                    .map_err(|e| self.err_on(e, "write", &block_path))?;
                steps.push(QueueStep::SetBlock);
            }
            if stamped {
                multi
                    .add_create(&stamp_path, b"", &persistent)
                    .and_then(|()| multi.add_set_data(&stamp_path, b"", None))
                    .and_then(|()| multi.add_delete(&stamp_path, None))
                    .map_err(|e| self.err_on(e, "write", &stamp_path))?;
                steps.extend([QueueStep::CreateStamp, QueueStep::Stamp, QueueStep::Stamp]);
            }
            // Never sent past the loss deadline, however long the steps
            // above took (a stalled process).
            self.check_deadline()?;
            let (index, source) = match multi.commit().await {
                Ok(results) => {
                    let Some(zxid) = results.iter().find_map(|result| match result {
                        MultiWriteResult::SetData { stat } => Some(stat.mzxid),
                        _ => None,
                    }) else {
                        return Err(Error::backend(
                            crate::error::BACKEND,
                            format!("the update of {dir:?} was applied but answered without the stat of its setData"),
                        ));
                    };
                    if !deleted.is_empty() {
                        let mut held = lock(&self.held);
                        for key in &deleted {
                            held.remove(*key);
                        }
                    }
                    if let Some(memo) = lock(&self.queues).get_mut(&dir) {
                        memo.children
                            .retain(|name| !deleted.contains(format!("{dir}/{name}").as_str()));
                        memo.block |= update.block.is_some();
                    }
                    return Ok(Some(u64::try_from(zxid).unwrap_or(0)));
                }
                Err(MultiWriteError::RequestFailed {
                    source: ZkError::NoAuth,
                }) => return Err(denied("write", &dir)),
                Err(MultiWriteError::RequestFailed { source }) => return Err(self.err_sent(source, &dir)),
                Err(MultiWriteError::OperationFailed { index, source }) => (index, source),
            };
            let Some(step) = steps.get(index).copied() else {
                return Err(self.err_on(source, "write", &dir));
            };
            match (step, source) {
                // A condition failed: nothing was written.
                (QueueStep::Entry(_), ZkError::NoNode | ZkError::BadVersion) => return Ok(None),
                (QueueStep::Entry(entry), error) => return Err(self.err_on(error, "write", &entry.key)),
                // The block's node is not where the last read left it:
                // nothing was written, send the other operation.
                (QueueStep::SetBlock, ZkError::NoNode) => block_exists = false,
                (QueueStep::CreateBlock, ZkError::NodeExists) => block_exists = true,
                // No directory (an update that names no entry): make it as
                // an append would, and try again.
                (QueueStep::CreateBlock | QueueStep::CreateStamp, ZkError::NoNode) => {
                    if changes.is_empty() {
                        let container = CreateMode::Container.with_acls(Acls::new(&self.acls));
                        match client.mkdir(&dir, &container).await {
                            Ok(()) | Err(ZkError::NodeExists) => {}
                            Err(error) => return Err(self.err_on(error, "create", &dir)),
                        }
                    } else {
                        return Err(self.err_on(ZkError::NoNode, "write", &dir));
                    }
                }
                (QueueStep::CreateStamp, ZkError::NodeExists) => {
                    return Err(Error::backend(
                        crate::error::BACKEND,
                        format!(
                            "cannot update {dir:?}: a node {stamp_path:?} exists, a name lockline reserves \
                             for its own use inside a transaction; delete it"
                        ),
                    ))
                }
                (QueueStep::SetBlock | QueueStep::CreateBlock, error) => {
                    return Err(self.err_on(error, "write", &block_path))
                }
                (QueueStep::CreateStamp | QueueStep::Stamp, error) => {
                    return Err(self.err_on(error, "write", &stamp_path))
                }
            }
        }
        Err(Error::backend(
            crate::error::BACKEND,
            format!(
                "an update of {dir:?} was tried {QUEUE_TRIES} times; its value block node kept appearing or \
                 vanishing under it"
            ),
        ))
    }
}
