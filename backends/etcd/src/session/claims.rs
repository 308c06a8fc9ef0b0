//! The one key a session has per name for its mutex and election entries
//! (`<name>/<lease hex>`), and which acquire attempt holds it.

use super::*;

/// Which acquire attempt uses a session's one key of a name.
#[derive(Debug, Clone)]
pub(super) struct KeyClaim {
    attempt: String,
    kind: EntryKind,
    /// The entry's create revision, once appended.
    order: Option<i64>,
}

/// What a released claim must match.
#[derive(Debug, Clone, Copy)]
pub(super) enum Owner<'a> {
    Attempt(&'a str),
    Entry(i64),
}

/// Kinds whose key is the same for every entry of one session and name.
pub(super) fn shares_key(kind: EntryKind) -> bool {
    !matches!(
        kind,
        EntryKind::Read | EntryKind::Write | EntryKind::Semaphore | EntryKind::Dlm
    )
}

fn article(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::Election => "an election",
        _ => "a mutex",
    }
}

impl EtcdSession {
    /// Reserves the session's one key of a name for this attempt (mutex and
    /// election keys only: other kinds' keys carry their attempt id).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when an entry of the other kind (an election for
    /// a mutex, a mutex for an election) of this name uses the key now.
    pub(super) fn claim(&self, key: &str, request: &AppendRequest<'_>) -> Result<()> {
        if !shares_key(request.kind) {
            return Ok(());
        }
        let mut claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(claim) = claims.get(key) {
            if claim.attempt != request.attempt && claim.kind != request.kind {
                return Err(Error::InvalidName {
                    // The name as the caller gave it, without the namespace.
                    name: request
                        .dir
                        .strip_prefix(self.namespace.as_str())
                        .unwrap_or(request.dir)
                        .to_owned(),
                    reason: format!(
                        "this session already has {} entry {key:?}; on etcd a mutex and an election of \
                         one name share one key per session, so they cannot be used at once",
                        article(claim.kind)
                    ),
                });
            }
        }
        if claims.get(key).is_none_or(|claim| claim.attempt != request.attempt) {
            claims.insert(
                key.to_owned(),
                KeyClaim {
                    attempt: request.attempt.to_owned(),
                    kind: request.kind,
                    order: None,
                },
            );
        }
        Ok(())
    }

    /// The create revision of an entry of this session under `key` made by
    /// another attempt of the same kind: a leftover whose removal is pending
    /// (the core's same-session queue lets a new attempt of one name and kind
    /// start only once the previous entry is gone or being removed). Another
    /// kind's entry under the key is refused by [`claim`](Self::claim).
    pub(super) fn stale_entry(&self, key: &str, request: &AppendRequest<'_>) -> Option<i64> {
        let claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        claims
            .get(key)
            .filter(|claim| claim.attempt != request.attempt && claim.kind == request.kind)
            .and_then(|claim| claim.order)
    }

    /// Records the entry an attempt's claim stands for.
    pub(super) fn claimed_entry(&self, attempt: &str, entry: &Entry) {
        let mut claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(claim) = claims.get_mut(&entry.key).filter(|claim| claim.attempt == attempt) {
            claim.order = Some(entry.order);
        }
    }

    /// Whether `key` is claimed by another attempt than `attempt`.
    pub(super) fn claimed_by_other(&self, key: &str, attempt: &str) -> bool {
        let claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        claims.get(key).is_some_and(|claim| claim.attempt != attempt)
    }

    /// Lets go of a key whose entry is gone: the entry of this attempt, or
    /// this entry (not a newer one under the same key).
    pub(super) fn release_claim(&self, key: &str, owner: Owner<'_>) {
        let mut claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = claims.get(key).is_some_and(|claim| match owner {
            Owner::Attempt(attempt) => claim.attempt == attempt,
            Owner::Entry(order) => claim.order == Some(order),
        });
        if mine {
            claims.remove(key);
        }
    }
}
