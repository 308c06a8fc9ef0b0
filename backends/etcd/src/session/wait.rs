//! Waiting behind a predecessor: the read after a wake, the watch on the
//! predecessor's key, and the revisions reads saw entries at, which spare
//! such a watch its read.

use super::departures::Look;
use super::*;

/// The revisions at which reads showed entries to exist, for the watches about
/// to be opened on them: this session's own new entry and the entry it will
/// wait on. Taken by the first watch on the entry; bounded, since an acquire
/// may end without watching (granted at once, a `try_lock` that found the lock
/// taken): dropping what it holds only costs the watches a read.
#[derive(Debug, Default)]
pub(super) struct Seen(HashMap<(String, i64), i64>);

impl Seen {
    /// At most this many entries are remembered.
    const LIMIT: usize = 4096;

    pub(super) fn insert(&mut self, entry: &Entry, revision: Option<i64>) {
        let Some(revision) = revision else { return };
        if self.0.len() >= Self::LIMIT {
            self.0.clear();
        }
        self.0.insert((entry.key.clone(), entry.order), revision);
    }

    fn take(&mut self, entry: &Entry) -> Option<i64> {
        self.0.remove(&(entry.key.clone(), entry.order))
    }
}

impl EtcdSession {
    /// [`BackendSession::earlier`], described there.
    pub(super) async fn nearest_earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let dir = layout::dir_of(entry);
        let prefix = layout::conflict_prefix(dir, conflicts);
        let count = count.max(1);
        let below_mine = || {
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_max_create_revision(entry.order - 1)
        };
        let nearest = || below_mine().with_limit(i64::try_from(layout::page(conflicts, count)).unwrap_or(i64::MAX));
        // After a wait of a contender with a lock-delay: the hand-over
        // markers of the entries it saw go, as of their deletions, in the
        // same request (DESIGN §6.17).
        let looks = if self.lock_delay {
            self.gone().undecided(dir, entry.order)
        } else {
            Vec::new()
        };
        // The queue ahead as of the latest deletion the wait saw, read in
        // the same request: an entry there that this read no longer shows
        // went after it, unseen (two departures before one read).
        let then = looks.iter().map(|(_, _, deleted_at)| *deleted_at).max();
        let response = match self.read_earlier(entry, &prefix, nearest(), &looks, then).await {
            // History compacted away, or the marker prefix not readable:
            // undecided, so lost (a lock-delay at worst), and the queue is
            // read alone.
            Err(error) if !looks.is_empty() && (error.is_refusal() || is_compacted(&error)) => {
                self.looks_unreadable(&entry.key, &error, &looks);
                self.read_earlier(entry, &prefix, nearest(), &[], None).await?
            }
            other => other?,
        };
        if !response.succeeded() {
            return Ok(Earlier::Gone);
        }
        let mut read_at = response.header().map(|h| h.revision());
        let ops = response.op_responses();
        let first = get_response(ops.first())?;
        let mut found: Vec<Entry> = Self::entries(dir, first)
            .into_iter()
            .filter(|e| conflicts.includes(e.kind))
            .collect();
        if !looks.is_empty() {
            self.decide_looks(&ops, 1, &looks);
            let before = get_response(ops.get(1 + 2 * looks.len())).ok();
            let unseen = before.and_then(|before| {
                Self::entries(dir, before)
                    .into_iter()
                    .filter(|e| conflicts.includes(e.kind))
                    .find(|e| {
                        let watched = looks
                            .iter()
                            .any(|((key, order), ..)| *key == e.key && *order == e.order);
                        let listed = found.iter().any(|f| f.key == e.key && f.order == e.order);
                        // Beyond a short page of this read, an older entry may
                        // still be there: only judged within what was read.
                        let within = !first.more() || found.last().is_some_and(|last| e.order > last.order);
                        !watched && !listed && within
                    })
            });
            if let Some(unseen) = unseen {
                tracing::debug!(
                    key = %entry.key,
                    gone = %unseen.key,
                    "an entry ahead went unseen after the one watched; taken for a loss"
                );
                let mut gone = self.gone();
                for (id, ..) in &looks {
                    gone.lost_now(id);
                }
            }
        }
        if found.len() < count && first.more() {
            // Never take a short page for the whole queue: that would grant
            // a lock someone else holds. Keys created before mine can only
            // go away, so a later read is a subset, never a superset.
            let all = self.get(&prefix, Some(below_mine().with_keys_only()), "read").await?;
            read_at = all.header().map(|h| h.revision());
            found = Self::entries(dir, &all)
                .into_iter()
                .filter(|e| conflicts.includes(e.kind))
                .collect();
        }
        found.truncate(count);
        if let Some(blocker) = found.get(count - 1) {
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(blocker, read_at);
        }
        Ok(Earlier::Entries(found))
    }

    /// [`BackendSession::wait_gone`], described there.
    pub(super) async fn wait_for_deletion(&self, entry: &Entry) -> Result<()> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner).take(entry);
        let mut watch = self.hub.watch(&entry.key, false);
        loop {
            match watch.next().await {
                Signal::Created { revision } => {
                    // A read showed the entry at `seen`, and the watch started
                    // at `revision + 1` ≤ `seen + 1`: any deletion since is an
                    // event still to come, so no read is needed. Otherwise
                    // the entry may have gone in between: read.
                    let covered = seen.is_some_and(|seen| revision <= seen);
                    if !covered && !boxed(self.exists(entry)).await? {
                        if self.lock_delay {
                            // Gone before the watch began: its deletion's
                            // revision, for the hand-over marker, comes from
                            // the server's history since the read.
                            let noticed = Instant::now();
                            drop(watch);
                            let deleted_at = match seen {
                                Some(seen) => boxed(self.deleted_since(entry, seen)).await,
                                None => None,
                            };
                            self.gone().insert(entry, deleted_at, noticed);
                        }
                        return Ok(());
                    }
                }
                Signal::Delete { revision } if revision > entry.order => {
                    if self.lock_delay {
                        self.gone().insert(entry, Some(revision), Instant::now());
                    }
                    return Ok(());
                }
                Signal::Delete { .. } | Signal::Put(_) => {}
                Signal::Broken(reason) => return Err(boxed(self.broken(reason.into(), &entry.key)).await),
            }
        }
    }

    /// The read after a wait: my entry confirmed, the nearest earlier keys,
    /// and for each of `looks` (an entry seen deleted at a revision, and its
    /// lease) that lease's hand-over marker as of the deletion and as of
    /// the revision before.
    async fn read_earlier(
        &self,
        entry: &Entry,
        prefix: &str,
        nearest: GetOptions,
        looks: &[Look],
        then: Option<i64>,
    ) -> Result<etcd_client::TxnResponse> {
        let mut ops = Vec::with_capacity(2 + 2 * looks.len());
        ops.push(TxnOp::get(prefix.to_owned(), Some(nearest.clone())));
        ops.extend(self.marker_reads(layout::dir_of(entry), looks));
        if let Some(then) = then {
            ops.push(TxnOp::get(prefix.to_owned(), Some(nearest.with_revision(then))));
        }
        let txn = fenced_on(entry, ops);
        self.txn(txn, "read", prefix).await
    }

    async fn exists(&self, entry: &Entry) -> Result<bool> {
        let response = self
            .get(&entry.key, Some(GetOptions::new().with_keys_only()), "read")
            .await?;
        Ok(response
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == entry.order))
    }
}
