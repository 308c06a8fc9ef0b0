//! The etcd layout: Go's `concurrency` package for mutexes and elections, so
//! `etcdctl lock`, `etcdctl elect`, Go's `concurrency.Mutex`/`Election` and the
//! server-side lock API see lockline's contenders and lockline sees theirs.
//!
//! | kind | key | value |
//! |---|---|---|
//! | mutex, election | `<name>/<lease id, lowercase hex>` | empty / the proclaimed value |
//! | read lock | `<name>/read/<lease hex>-<attempt>` | empty |
//! | write lock | `<name>/write/<lease hex>-<attempt>` | empty |
//! | semaphore permit | `<name>/semaphore/<lease hex>-<attempt>` | empty |
//!
//! Every key is bound to the session's lease; the queue is ordered by create
//! revision across the whole `<name>/` prefix; the fencing token is the
//! holder's create revision.

use etcd_client::KeyValue;
use lockline::{Conflicts, Entry, EntryKind, FencingToken};

/// The prefix every entry of a lock lives under.
pub(crate) fn prefix(dir: &str) -> String {
    format!("{dir}/")
}

/// The prefix of the entries that can block a contender.
pub(crate) fn conflict_prefix(dir: &str, conflicts: Conflicts) -> String {
    match conflicts {
        Conflicts::Exclusive => format!("{dir}/write/"),
        _ => prefix(dir),
    }
}

/// The key of a session's entry.
pub(crate) fn key(dir: &str, kind: EntryKind, lease_hex: &str, attempt: &str) -> String {
    match kind {
        EntryKind::Read => format!("{dir}/read/{lease_hex}-{attempt}"),
        EntryKind::Write => format!("{dir}/write/{lease_hex}-{attempt}"),
        EntryKind::Semaphore => format!("{dir}/semaphore/{lease_hex}-{attempt}"),
        // Mutex, election, and any kind added later: one key per session.
        _ => format!("{dir}/{lease_hex}"),
    }
}

/// Reads an entry back from a key-value under `<dir>/`.
pub(crate) fn entry(kv: &KeyValue) -> Option<Entry> {
    let key = std::str::from_utf8(kv.key()).ok()?;
    let order = kv.create_revision();
    let kind = if key.contains("/read/") {
        EntryKind::Read
    } else if key.contains("/write/") {
        EntryKind::Write
    } else if key.contains("/semaphore/") {
        EntryKind::Semaphore
    } else {
        EntryKind::Mutex
    };
    Some(Entry {
        key: key.to_owned(),
        kind,
        order,
        token: FencingToken::new(u64::try_from(order).ok()?),
        owner: (kv.lease() != 0).then(|| format!("{:x}", kv.lease())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_layout_for_mutexes() {
        assert_eq!(
            key("locks/a", EntryKind::Mutex, "694d7a1b2c", "u1"),
            "locks/a/694d7a1b2c"
        );
        assert_eq!(key("/x", EntryKind::Election, "1f", "u1"), "/x/1f");
        assert_eq!(key("rw", EntryKind::Write, "1f", "u1"), "rw/write/1f-u1");
        assert_eq!(conflict_prefix("rw", Conflicts::Exclusive), "rw/write/");
        assert_eq!(conflict_prefix("rw", Conflicts::All), "rw/");
    }
}
