//! This session's own entries in a lock's queue: the append (one
//! transaction that creates the key and reads the queue ahead), the fenced
//! removal, and the abandonment of an acquire attempt.

use super::claims::{shares_key, Owner};
use super::*;

/// A key an append's put just created, as a read of it would show it.
struct Created<'a> {
    key: &'a str,
    revision: i64,
    lease: i64,
}

impl layout::Stored for Created<'_> {
    fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }
    fn create_revision(&self) -> i64 {
        self.revision
    }
    fn lease(&self) -> i64 {
        self.lease
    }
}

impl EtcdSession {
    /// [`BackendSession::append`], described there.
    pub(super) async fn append_entry(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        self.appended.store(true, Ordering::Relaxed);
        let dir = self.within(request.dir);
        let request = &AppendRequest { dir: &dir, ..*request };
        let key = layout::key(request.dir, request.kind, &self.id, request.attempt);
        // An earlier entry of this session under the same key whose removal has
        // not finished (a guard dropped while the server was unreachable) is
        // no retry of this attempt and must never be taken for its entry:
        // remove it first (fenced on its revision). A failure leaves the old
        // claim in place, so a retry of this append does the same.
        if let Some(order) = self.stale_entry(&key, request) {
            let stale = Entry {
                key: key.clone(),
                kind: request.kind,
                order,
                token: lockline::FencingToken::new(u64::try_from(order).unwrap_or(0)),
                owner: Some(self.id.clone()),
            };
            tracing::debug!(
                key,
                order,
                "removing this session's own leftover entry before appending"
            );
            self.remove(&stale).await?;
        }
        self.claim(&key, request)?;
        let flag = self.lock_delay && self.markers_allowed() && !self.is_flagged(request.dir);
        match self.append_once(request, &key, flag).await {
            // The role may not write the marker prefix: queue without the
            // flag (nothing of a refused transaction was applied).
            Err(refused) if flag && refused.is_refusal() => {
                let appended = self.append_once(request, &key, false).await?;
                self.refuse_flag(&refused);
                Ok(appended)
            }
            other => other,
        }
    }

    /// [`BackendSession::remove`], described there.
    pub(super) async fn remove_entry(&self, entry: &Entry) -> Result<bool> {
        let marked = entry.owner.as_deref() == Some(self.id.as_str()) && self.markers_allowed();
        let removed = match self.remove_once(entry, marked).await {
            Err(refused) if marked && refused.is_refusal() => {
                let removed = self.remove_once(entry, false).await?;
                self.refuse_markers(&refused);
                removed
            }
            other => other?,
        };
        // Deleted now or gone before: the key is free for the session's next entry.
        self.release_claim(&entry.key, Owner::Entry(entry.order));
        if entry.owner.as_deref() == Some(self.id.as_str()) {
            self.untrack(&entry.key);
        }
        Ok(removed)
    }

    /// [`BackendSession::abandon`], described there.
    pub(super) async fn abandon_attempt(&self, dir: &str, kind: EntryKind, attempt: &str) -> Result<()> {
        let dir = &*self.within(dir);
        let key = layout::key(dir, kind, &self.id, attempt);
        let marker = TxnOp::put(
            layout::abandoned(&self.markers, dir, &self.id, attempt),
            Vec::new(),
            Some(PutOptions::new().with_lease(self.lease)),
        );
        let others = shares_key(kind) && self.claimed_by_other(&key, attempt);
        let txn = if others {
            // The key is another entry's of this session (an election of the
            // same name while this mutex was refused, say): keep it.
            Txn::new().and_then([marker])
        } else {
            let mut removal = vec![marker.clone(), TxnOp::delete(key.clone(), None)];
            if self.markers_allowed() {
                removal.push(self.hand_over_if_awaited(dir));
            }
            Txn::new()
                .when([Compare::lease(key.clone(), CompareOp::Equal, self.lease)])
                .and_then(removal)
                .or_else([marker])
        };
        match self.txn(txn, "leave the queue of", &key).await {
            Ok(_) => {}
            Err(refused) if refused.is_refusal() => self.abandon_refused(dir, &key, attempt, refused).await?,
            Err(error) => return Err(error),
        }
        self.release_claim(&key, Owner::Attempt(attempt));
        if !others {
            self.untrack(&key);
        }
        Ok(())
    }

    /// One round trip: if my key does not exist (and this attempt was not
    /// abandoned), create it with my lease and read it back with the nearest
    /// earlier conflicting keys; else read it (a retry after a lost response
    /// finds its own key).
    ///
    /// With `flag`, the same transaction leaves this session's lock-delay
    /// flag on the lock ([`layout::waits_delayed`]), so that removals of the
    /// entries before this one write their hand-over markers.
    async fn append_once(&self, request: &AppendRequest<'_>, key: &str, flag: bool) -> Result<Appended> {
        let key = key.to_owned();
        let abandoned = layout::abandoned(&self.markers, request.dir, &self.id, request.attempt);
        // Right after my put my key is the newest under the prefix, so the
        // newest conflicting keys (one more than asked, mine may be among them)
        // are exactly the nearest earlier ones, unless keys of other locks
        // nested under the prefix take some of the room (then the core asks
        // `earlier`, which reads on).
        let nearest_prefix = layout::conflict_prefix(request.dir, request.conflicts);
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(
                i64::try_from(layout::page(request.conflicts, request.nearest).saturating_add(1)).unwrap_or(i64::MAX),
            );
        let put = TxnOp::put(
            key.clone(),
            request.value.to_vec(),
            Some(PutOptions::new().with_lease(self.lease)),
        );
        // A lock-mode request reads its queue in the same transaction, for
        // its first decision, in place of the nearest entries (without a
        // lock-delay, whose read also asks how the entries it waited on
        // went).
        let queue = request.kind == EntryKind::Dlm && !self.lock_delay;
        let mut created = vec![put];
        if queue {
            created.extend(Self::queue_reads(request.dir));
        } else {
            created.push(TxnOp::get(nearest_prefix, Some(newest)));
        }
        if flag {
            created.push(TxnOp::put(
                layout::waits_delayed(&self.markers, request.dir, &self.id),
                Vec::new(),
                Some(PutOptions::new().with_lease(self.lease)),
            ));
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                // An append that reaches the server after its attempt was
                // abandoned (another path, a slow member) creates nothing.
                Compare::create_revision(abandoned.clone(), CompareOp::Equal, 0),
            ])
            .and_then(created)
            .or_else([
                TxnOp::get(key.clone(), None),
                TxnOp::get(abandoned, Some(GetOptions::new().with_count_only())),
            ]);
        let response = self.txn(txn, "queue on", &key).await?;
        let ops = response.op_responses();
        if response.succeeded() {
            if flag {
                self.flagged(request.dir);
            }
            // My put created the key in this very transaction: its create
            // revision is the transaction's revision, its lease mine. No
            // read of it back (one range less per acquire than before).
            let revision = response
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| Error::backend(BACKEND, "a transaction's answer without a header"))?;
            let created = Created {
                key: &key,
                revision,
                lease: self.lease,
            };
            let entry = layout::entry(request.dir, &created).ok_or_else(|| Error::LockLost { key: key.clone() })?;
            if queue {
                let mut appended = self.appended(request, entry, None, Some(revision));
                appended.queue = Some(self.queue_read(request.dir, &ops, 1, Some(revision))?);
                return Ok(appended);
            }
            let newest = get_response(ops.get(1))?;
            return Ok(self.appended(request, entry, Some(newest), Some(revision)));
        }
        if get_response(ops.get(1))?.count() > 0 {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "acquire attempt {} on {:?} was already abandoned",
                    request.attempt, request.dir
                ),
            ));
        }
        // My key already existed (a retry after a lost answer): keys newer
        // than mine may exist too, so the core asks `earlier`.
        let mine = get_response(ops.first())?;
        let entry = mine
            .kvs()
            .first()
            .and_then(|kv| layout::entry(request.dir, kv))
            .ok_or_else(|| Error::LockLost { key: key.clone() })?;
        if mine.kvs().first().map(|kv| kv.lease()) != Some(self.lease) {
            return Err(Error::backend(
                BACKEND,
                format!("key {key:?} exists with another lease; refusing to share it"),
            ));
        }
        let read_at = response.header().map(|h| h.revision());
        Ok(self.appended(request, entry, None, read_at))
    }

    /// An append's entry, and the nearest earlier ones from `newest` (the
    /// newest conflicting keys the append's transaction read at `read_at`,
    /// mine among them), or `None` when that read is missing or was filled
    /// by other locks' keys.
    fn appended(
        &self,
        request: &AppendRequest<'_>,
        entry: Entry,
        newest: Option<&etcd_client::GetResponse>,
        read_at: Option<i64>,
    ) -> Appended {
        self.claimed_entry(request.attempt, &entry);
        self.track(&entry.key, request.dir);
        let nearest = newest.and_then(|newest| {
            let mut nearest: Vec<Entry> = Self::entries(request.dir, newest)
                .into_iter()
                .filter(|e| e.order < entry.order && request.conflicts.includes(e.kind))
                .collect();
            if nearest.len() < request.nearest && newest.more() {
                // Other locks' keys filled the page: the answer is incomplete.
                return None;
            }
            nearest.truncate(request.nearest);
            Some(nearest)
        });
        // What this read showed exists, for the watches the wait opens next:
        // on this entry, and on the one it will wait for.
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.insert(&entry, read_at);
        if let Some(blocker) = nearest.as_ref().and_then(|n| n.get(request.nearest.max(1) - 1)) {
            seen.insert(blocker, read_at);
        }
        drop(seen);
        Appended {
            entry,
            nearest,
            queue: None,
        }
    }

    /// The fenced delete of `entry`, with the hand-over marker if `marked`
    /// and the lock is flagged (written in the deletion's own revision,
    /// which is how a waiter with a lock-delay, and a release retried after
    /// a lost answer ([`BackendSession::removed_by_me`]), tell a removal of
    /// this session's from someone else's delete).
    async fn remove_once(&self, entry: &Entry, marked: bool) -> Result<bool> {
        let mut ops = vec![TxnOp::delete(entry.key.clone(), None)];
        if marked {
            ops.push(self.hand_over_if_awaited(layout::dir_of(entry)));
        }
        let txn = fenced_on(entry, ops);
        Ok(self.txn(txn, "delete", &entry.key).await?.succeeded())
    }

    /// The abandonment of `attempt` was refused. That ends the session only if
    /// it can leave an entry behind: when the marker alone may be written
    /// (so no try of the append still on its way can create the key any more)
    /// and the key is not there, the attempt made nothing, typically because
    /// the user may not write the lock's prefix at all, and the refusal is
    /// nothing to act on. Otherwise the refusal stands.
    async fn abandon_refused(&self, dir: &str, key: &str, attempt: &str, refused: Error) -> Result<()> {
        let marker = layout::abandoned(&self.markers, dir, &self.id, attempt);
        let fenced = self
            .client
            .kv_client()
            .put(marker, Vec::new(), Some(PutOptions::new().with_lease(self.lease)))
            .await;
        if fenced.is_err() {
            return Err(refused);
        }
        let response = self
            .client
            .kv_client()
            .get(key.to_owned(), Some(GetOptions::new().with_keys_only()))
            .await;
        match response {
            Ok(response) if response.kvs().iter().all(|kv| kv.lease() != self.lease) => {
                tracing::debug!(key, %refused, "abandoned attempt made no entry; its refused removal changes nothing");
                Ok(())
            }
            _ => Err(refused),
        }
    }
}
