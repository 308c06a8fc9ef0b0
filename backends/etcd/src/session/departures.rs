//! How an entry that went away went, released or lost: the entries waits
//! saw go, the reads of their hand-over markers that decide it, and whether
//! an entry of this session's was deleted by a removal of its own.

use super::*;

/// Entries waited on and seen gone, by (key, create revision): how each went
/// is decided by the read that follows the wait (see
/// [`layout::released`]) and handed to [`BackendSession::departure`].
#[derive(Debug, Default)]
pub(super) struct Gone(HashMap<(String, i64), Went>);

/// An entry seen gone whose hand-over marker a read looks at: its (key,
/// create revision), its lease in hex, the revision of its deletion.
pub(super) type Look = ((String, i64), String, i64);

/// What a wait saw of an entry that went away.
#[derive(Debug, Clone)]
struct Went {
    /// The entry's lock directory.
    dir: String,
    /// The entry's lease, in hex (the owner of its hand-over marker).
    owner: Option<String>,
    /// The revision of its deletion, when the wait saw it.
    revision: Option<i64>,
    /// When the wait saw it go.
    noticed: Instant,
    /// How it went, once a read decided.
    decided: Option<Departure>,
}

impl Gone {
    /// At most this many are remembered.
    const LIMIT: usize = 4096;
    /// One forgotten this long after it went was never asked about.
    const FORGET: Duration = Duration::from_secs(60);
    /// A read after a wait looks at the markers of at most this many.
    const PER_READ: usize = 4;

    pub(super) fn insert(&mut self, entry: &Entry, revision: Option<i64>, noticed: Instant) {
        let now = Instant::now();
        if self.0.len() >= Self::LIMIT {
            self.0
                .retain(|_, went| now.saturating_duration_since(went.noticed) < Self::FORGET);
            if self.0.len() >= Self::LIMIT {
                self.0.clear();
            }
        }
        self.0.insert(
            (entry.key.clone(), entry.order),
            Went {
                dir: layout::dir_of(entry).to_owned(),
                owner: entry.owner.clone(),
                revision,
                noticed,
                decided: None,
            },
        );
    }

    /// The undecided entries of the lock `dir` created before `order` whose
    /// markers a read can look at (the latest seen first), deciding at once
    /// those it cannot (no deletion revision or no lease seen: lost).
    pub(super) fn undecided(&mut self, dir: &str, order: i64) -> Vec<Look> {
        let mut found: Vec<_> = self
            .0
            .iter_mut()
            .filter(|((_, created), went)| went.decided.is_none() && went.dir == dir && *created < order)
            .filter_map(|(id, went)| match (&went.owner, went.revision) {
                (Some(owner), Some(revision)) => Some((went.noticed, (id.clone(), owner.clone(), revision))),
                _ => {
                    went.decided = Some(Departure::Lost { noticed: went.noticed });
                    None
                }
            })
            .collect();
        found.sort_by_key(|(noticed, _)| std::cmp::Reverse(*noticed));
        found.into_iter().take(Self::PER_READ).map(|(_, id)| id).collect()
    }

    /// Takes the departure of `id` for a loss noticed now, whatever its
    /// marker said: something else ahead went unseen after it.
    pub(super) fn lost_now(&mut self, id: &(String, i64)) {
        if let Some(went) = self.0.get_mut(id) {
            went.decided = Some(Departure::Lost {
                noticed: Instant::now(),
            });
        }
    }

    fn decide(&mut self, id: &(String, i64), released: bool) {
        if let Some(went) = self.0.get_mut(id) {
            went.decided = Some(if released {
                Departure::Released
            } else {
                Departure::Lost { noticed: went.noticed }
            });
        }
    }
}

impl EtcdSession {
    /// [`BackendSession::departure`], described there.
    pub(super) fn decided_departure(&self, gone: &Entry) -> Departure {
        let went = self.gone().0.remove(&(gone.key.clone(), gone.order));
        match went {
            Some(Went {
                decided: Some(departure),
                ..
            }) => departure,
            Some(went) => Departure::Lost { noticed: went.noticed },
            None => Departure::Lost {
                noticed: Instant::now(),
            },
        }
    }

    /// [`BackendSession::removed_by_me`], described there.
    pub(super) async fn removed_by_me_from_markers(&self, entry: &Entry) -> Result<Option<bool>> {
        if entry.owner.as_deref() != Some(self.id.as_str()) || !self.markers_allowed() {
            return Ok(None);
        }
        let mut watch = self.hub.watch_deletes_from(&entry.key, entry.order + 1);
        let deleted_at = loop {
            match watch.next().await {
                Signal::Delete { revision } if revision > entry.order => break revision,
                // Canceled by the server: its history no longer goes back
                // to the entry's creation.
                Signal::Broken(reason) if reason.starts_with(WATCH_CANCELED) => return Ok(None),
                Signal::Broken(reason) => {
                    return Err(Error::unavailable(
                        BACKEND,
                        format!("reading when {:?} was deleted: {reason}", entry.key),
                    ))
                }
                Signal::Created { .. } | Signal::Delete { .. } | Signal::Put(_) => {}
            }
        };
        let dir = layout::dir_of(entry);
        let marker = layout::released(&self.markers, dir, &self.id);
        let flags = GetOptions::new()
            .with_prefix()
            .with_count_only()
            .with_revision((deleted_at - 1).max(1));
        let reads = Txn::new().and_then([
            TxnOp::get(marker.clone(), Some(GetOptions::new().with_revision(deleted_at))),
            TxnOp::get(layout::delay_flags(&self.markers, dir), Some(flags)),
        ]);
        let response = match self.txn(reads, "read", &marker).await {
            Err(error) if is_compacted(&error) || error.is_refusal() => return Ok(None),
            other => other?,
        };
        let ops = response.op_responses();
        // A read of a compacted revision ends the answer short on etcd 3.4.
        let (Ok(at), Ok(flagged)) = (get_response(ops.first()), get_response(ops.get(1))) else {
            return Ok(None);
        };
        if at.kvs().first().is_some_and(|kv| kv.mod_revision() == deleted_at) {
            return Ok(Some(true));
        }
        if self.always_mark || flagged.count() > 0 {
            return Ok(Some(false));
        }
        Ok(None)
    }

    pub(super) fn gone(&self) -> std::sync::MutexGuard<'_, Gone> {
        self.gone.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// For each of `looks` (an entry of the lock `dir` seen deleted at a
    /// revision, and its lease): two reads of that lease's hand-over marker,
    /// as of the deletion and as of the revision before.
    pub(super) fn marker_reads(&self, dir: &str, looks: &[Look]) -> Vec<TxnOp> {
        let mut ops = Vec::with_capacity(2 * looks.len());
        for (_, owner, deleted_at) in looks {
            let marker = layout::released(&self.markers, dir, owner);
            ops.push(TxnOp::get(
                marker.clone(),
                Some(GetOptions::new().with_revision(*deleted_at)),
            ));
            ops.push(TxnOp::get(
                marker,
                Some(GetOptions::new().with_revision((*deleted_at - 1).max(1))),
            ));
        }
        ops
    }

    /// Decides how each of `looks` went from the answers of its
    /// [`marker_reads`](Self::marker_reads), found in `ops` from `from` on.
    pub(super) fn decide_looks(&self, ops: &[TxnOpResponse], from: usize, looks: &[Look]) {
        let mut gone = self.gone();
        for (i, (id, _, deleted_at)) in looks.iter().enumerate() {
            // A read of a compacted revision ends the answer short on
            // etcd 3.4 (3.5 refuses the whole request): undecided, so
            // lost.
            let (Ok(at), Ok(before)) = (
                get_response(ops.get(from + 2 * i)),
                get_response(ops.get(from + 1 + 2 * i)),
            ) else {
                tracing::debug!(key = %id.0, "hand-over marker history compacted away; taken for a loss");
                gone.decide(id, false);
                continue;
            };
            // Written by the very transaction that deleted the entry, or
            // saying its session was closing just before the deletion.
            let released = at.kvs().first().is_some_and(|kv| kv.mod_revision() == *deleted_at)
                || before.kvs().first().is_some_and(|kv| kv.value() == layout::CLOSING);
            gone.decide(id, released);
        }
    }

    /// The markers of `looks` cannot be read (history compacted away, the
    /// marker prefix not readable): each undecided, so lost (a lock-delay at
    /// worst).
    pub(super) fn looks_unreadable(&self, key: &str, error: &Error, looks: &[Look]) {
        tracing::debug!(key, %error, "hand-over markers unreadable; taken for losses");
        let mut gone = self.gone();
        for (id, ..) in looks {
            gone.decide(id, false);
        }
    }

    /// The revision `entry` was deleted at, after `seen` (a revision at which
    /// a read showed it): a watch from `seen + 1` replays the deletion from
    /// the server's history. `None` when that history was compacted away or
    /// the server does not answer within a second.
    pub(super) async fn deleted_since(&self, entry: &Entry, seen: i64) -> Option<i64> {
        let mut watch = self.hub.watch_deletes_from(&entry.key, seen + 1);
        let replay = async {
            loop {
                match watch.next().await {
                    Signal::Delete { revision } if revision > entry.order => return Some(revision),
                    Signal::Broken(_) => return None,
                    Signal::Created { .. } | Signal::Delete { .. } | Signal::Put(_) => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(1), replay)
            .await
            .ok()
            .flatten()
    }

    /// A value watch saw `entry` go: with a lock-delay, remember it with the
    /// revision of its deletion (`deleted_at`, or replayed from the server's
    /// history after `existed_at`, a revision at which it existed), for the
    /// next read of its lock to decide how it went.
    pub(super) async fn went(&self, entry: &Entry, deleted_at: Option<i64>, existed_at: Option<i64>) {
        if !self.lock_delay {
            return;
        }
        let noticed = Instant::now();
        let deleted_at = match (deleted_at, existed_at) {
            (Some(revision), _) => Some(revision),
            (None, Some(seen)) => self.deleted_since(entry, seen).await,
            (None, None) => None,
        };
        self.gone().insert(entry, deleted_at, noticed);
    }
}
