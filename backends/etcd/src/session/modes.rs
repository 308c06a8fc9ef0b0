//! Lock modes on etcd: the read of a resource's queue and value block in one
//! transaction, its conditional update, and the watch on an entry's value.

use super::departures::Look;
use super::*;

/// Lock-mode entries' values as a read ([`BackendSession::read_queue`]) or a
/// write ([`BackendSession::update_queue`]) of this session saw them, by (key,
/// create revision), with that revision: a
/// [`watch_value`](BackendSession::watch_value) whose watch the server
/// started at or before that revision, waiting for a change from that very
/// value, sees every later write and the deletion as events, so it needs no
/// read of its own. Taken by the first value watch on the entry; bounded (an
/// entry read but never watched only costs a later watch its read).
#[derive(Debug, Default)]
pub(super) struct Values(HashMap<(String, i64), (i64, Vec<u8>)>);

impl Values {
    /// At most this many entries are remembered.
    const LIMIT: usize = 4096;

    fn insert(&mut self, entry: &Entry, revision: i64, value: &[u8]) {
        if self.0.len() >= Self::LIMIT {
            self.0.clear();
        }
        self.0
            .insert((entry.key.clone(), entry.order), (revision, value.to_vec()));
    }

    /// The revision at which `entry` was seen, and its value then, if
    /// remembered.
    fn take(&mut self, entry: &Entry) -> Option<(i64, Vec<u8>)> {
        self.0.remove(&(entry.key.clone(), entry.order))
    }
}

impl EtcdSession {
    /// [`BackendSession::read_queue`], described there.
    pub(super) async fn read_dlm_queue(&self, dir: &str) -> Result<Queue> {
        let dir = &*self.within(dir);
        let looks = if self.lock_delay {
            self.gone().undecided(dir, i64::MAX)
        } else {
            Vec::new()
        };
        let read = |looks: &[Look]| {
            let mut ops = Vec::from(Self::queue_reads(dir));
            ops.extend(self.marker_reads(dir, looks));
            self.txn(Txn::new().and_then(ops), "read the queue of", dir)
        };
        let (response, looked) = match read(&looks).await {
            Err(error) if !looks.is_empty() && (error.is_refusal() || is_compacted(&error)) => {
                self.looks_unreadable(dir, &error, &looks);
                (read(&[]).await?, false)
            }
            other => (other?, !looks.is_empty()),
        };
        let read_at = response.header().map(|h| h.revision());
        let ops = response.op_responses();
        if looked {
            self.decide_looks(&ops, 2, &looks);
        }
        self.queue_read(dir, &ops, 0, read_at)
    }

    /// The two reads of a queue a transaction made (see
    /// [`queue_reads`](Self::queue_reads)), its answers `ops[at..at + 2]`,
    /// at revision `read_at`: the queue, its values remembered for the
    /// value watches to come.
    pub(super) fn queue_read(
        &self,
        dir: &str,
        ops: &[TxnOpResponse],
        at: usize,
        read_at: Option<i64>,
    ) -> Result<Queue> {
        let listed = get_response(ops.get(at))?;
        let block = get_response(ops.get(at + 1))?
            .kvs()
            .first()
            .map(|kv| kv.value().to_vec());
        let slots: Vec<Slot> = listed
            .kvs()
            .iter()
            .filter_map(|kv| {
                let entry = layout::entry(dir, kv)?;
                Some(Slot {
                    entry,
                    value: kv.value().to_vec(),
                    version: kv.mod_revision(),
                    changed: u64::try_from(kv.mod_revision()).unwrap_or(0),
                })
            })
            .collect();
        if let Some(read_at) = read_at {
            let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
            for slot in slots.iter().filter(|slot| slot.entry.kind == EntryKind::Dlm) {
                values.insert(&slot.entry, read_at, &slot.value);
            }
        }
        Ok(Queue { slots, block })
    }

    /// The reads of the queue of `dir` (every entry, first created first;
    /// the value block), for [`queue_read`](Self::queue_read).
    pub(super) fn queue_reads(dir: &str) -> [TxnOp; 2] {
        [
            TxnOp::get(layout::prefix(dir), Some(first_created(0))),
            TxnOp::get(layout::block(dir), None),
        ]
    }

    /// [`BackendSession::update_queue`], described there.
    pub(super) async fn update_dlm_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let dir = self.within(update.dir);
        let marked = update
            .delete
            .iter()
            .any(|entry| entry.owner.as_deref() == Some(self.id.as_str()))
            && self.markers_allowed();
        let response = match self.update_once(&dir, update, marked).await {
            Err(refused) if marked && refused.is_refusal() => {
                let response = self.update_once(&dir, update, false).await?;
                self.refuse_markers(&refused);
                response
            }
            other => other?,
        };
        let Some(token) = response else {
            return Ok(None);
        };
        for entry in update.delete {
            if entry.owner.as_deref() == Some(self.id.as_str()) {
                self.untrack(&entry.key);
            }
        }
        {
            let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
            for (entry, value) in update.set {
                if !update.delete.iter().any(|gone| gone.key == entry.key) {
                    values.insert(entry, token, value);
                }
            }
        }
        Ok(Some(u64::try_from(token).unwrap_or(0)))
    }

    /// [`BackendSession::watch_value`], described there.
    pub(super) async fn watch_dlm_value(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        let remembered = self.values.lock().unwrap_or_else(PoisonError::into_inner).take(entry);
        // A revision at which the entry existed, and one at which it held `seen`.
        let existed_at = remembered.as_ref().map(|(revision, _)| *revision);
        let known = remembered.and_then(|(revision, value)| (value == seen).then_some(revision));
        let mut seen = seen.to_vec();
        let mut watch = self.hub.watch(&entry.key, true);
        loop {
            match watch.next().await {
                Signal::Created { revision } if known.is_some_and(|known| revision <= known) => {}
                Signal::Created { .. } => match boxed(self.value_at(entry)).await? {
                    (None, _) => {
                        drop(watch);
                        boxed(self.went(entry, None, existed_at)).await;
                        return Ok(None);
                    }
                    (Some(value), read_at) if value != seen => {
                        if wanted(&value) {
                            self.remember(entry, read_at, &value);
                            return Ok(Some(value));
                        }
                        seen = value;
                    }
                    (Some(_), _) => {}
                },
                Signal::Delete { revision } if revision > entry.order => {
                    boxed(self.went(entry, Some(revision), None)).await;
                    return Ok(None);
                }
                Signal::Delete { .. } => {}
                Signal::Put(written) => {
                    // An older key under the same name: not this entry. A
                    // write the value seen already followed (replayed by a
                    // member that lags): nothing new.
                    if written.create_revision < entry.order || known.is_some_and(|known| written.mod_revision <= known)
                    {
                        continue;
                    }
                    if written.create_revision > entry.order {
                        boxed(self.went(entry, None, None)).await;
                        return Ok(None);
                    }
                    if written.value != seen {
                        if wanted(&written.value) {
                            self.remember(entry, Some(written.mod_revision), &written.value);
                            return Ok(Some(written.value));
                        }
                        // Watched past on the same watch.
                        seen = written.value;
                    }
                }
                Signal::Broken(reason) => return Err(self.broken(reason.into(), &entry.key).await),
            }
        }
    }

    /// The transaction of [`update_queue`](BackendSession::update_queue),
    /// with this session's hand-over marker if `marked`: the revision it
    /// applied at, or `None` when a condition failed.
    async fn update_once(&self, dir: &str, update: &QueueUpdate<'_>, marked: bool) -> Result<Option<i64>> {
        let mut compares = Vec::with_capacity(update.unchanged.len());
        for (entry, version) in update.unchanged {
            if *version <= 0 {
                // No entry that exists has such a version.
                return Ok(None);
            }
            compares.push(Compare::mod_revision(entry.key.clone(), CompareOp::Equal, *version));
        }
        // Present at any version: the very same entry (its create revision).
        for entry in update.present {
            compares.push(Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.order,
            ));
        }
        // The core lists every entry it sets or deletes as unchanged or
        // present too; one it did not is still fenced on its identity.
        let fenced = |entry: &Entry| {
            update.unchanged.iter().any(|(known, _)| known.key == entry.key)
                || update.present.iter().any(|known| known.key == entry.key)
        };
        for entry in update
            .set
            .iter()
            .map(|(entry, _)| *entry)
            .chain(update.delete.iter().copied())
        {
            if !fenced(entry) {
                compares.push(Compare::create_revision(
                    entry.key.clone(),
                    CompareOp::Equal,
                    entry.order,
                ));
            }
        }
        // etcd refuses two writes of one key in a transaction: a deleted
        // entry is not also set, and an entry set twice takes the last value.
        let mut ops: Vec<TxnOp> = Vec::with_capacity(update.set.len() + update.delete.len() + 2);
        let mut written: Vec<&str> = Vec::with_capacity(update.set.len());
        for (at, (entry, value)) in update.set.iter().enumerate() {
            let later = update.set[at + 1..].iter().any(|(other, _)| other.key == entry.key);
            let deleted = update.delete.iter().any(|gone| gone.key == entry.key);
            if later || deleted {
                continue;
            }
            written.push(&entry.key);
            ops.push(TxnOp::put(
                entry.key.clone(),
                value.to_vec(),
                Some(PutOptions::new().with_ignore_lease()),
            ));
        }
        for (at, entry) in update.delete.iter().enumerate() {
            if !update.delete[..at].iter().any(|other| other.key == entry.key) {
                ops.push(TxnOp::delete(entry.key.clone(), None));
            }
        }
        if let Some(block) = update.block {
            ops.push(TxnOp::put(layout::block(dir), block.to_vec(), None));
        }
        if marked {
            ops.push(self.hand_over_if_awaited(dir));
        }
        if ops.is_empty() {
            ops.push(TxnOp::put(
                layout::touched(dir, &self.id),
                Vec::new(),
                Some(PutOptions::new().with_lease(self.lease)),
            ));
        }
        let txn = Txn::new().when(compares).and_then(ops);
        let response = self.txn(txn, "update the queue of", dir).await?;
        if !response.succeeded() {
            return Ok(None);
        }
        let revision = response
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| Error::backend(BACKEND, "a transaction's answer without a header"))?;
        Ok(Some(revision))
    }

    /// `entry`'s current value (`None` when it is gone), and the revision
    /// of the read.
    async fn value_at(&self, entry: &Entry) -> Result<(Option<Vec<u8>>, Option<i64>)> {
        let response = self.get(&entry.key, None, "read").await?;
        let value = response
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == entry.order)
            .map(|kv| kv.value().to_vec());
        Ok((value, response.header().map(|h| h.revision())))
    }

    /// Remembers that `entry` held `value` at `revision`, for the next value
    /// watch on it (see [`Values`]).
    fn remember(&self, entry: &Entry, revision: Option<i64>, value: &[u8]) {
        if let Some(revision) = revision {
            self.values
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(entry, revision, value);
        }
    }
}
