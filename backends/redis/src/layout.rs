//! Key names: everything of lock `n` shares the hash tag `{n}`.
//!
//! The whole layout is in the crate docs. A lock-mode resource (entries of
//! kind `lock mode`) uses the same keys as every other lock, and one more:
//! its lock value block `{n}:b`, a plain string outside the queue, which
//! no entry key (`{n}:e:…`) and no plain key `n` can be.

use lockline::backend::{Entry, EntryKind};
use lockline::{Error, FencingToken};

/// `{n}:`, the prefix of every key of lock `n` but the plain key.
pub(crate) fn prefix(name: &str) -> String {
    format!("{{{name}}}:")
}

pub(crate) fn queue(name: &str) -> String {
    format!("{{{name}}}:q")
}

pub(crate) fn counter(name: &str) -> String {
    format!("{{{name}}}:seq")
}

/// The counter's epoch: `<run_id>:<master_replid>` of the server that last
/// started or lifted the counter (see `APPEND` in the scripts).
pub(crate) fn epoch(name: &str) -> String {
    format!("{{{name}}}:run")
}

pub(crate) fn entry_key(name: &str, attempt: &str) -> String {
    format!("{{{name}}}:e:{attempt}")
}

pub(crate) fn channel(name: &str, attempt: &str) -> String {
    format!("{{{name}}}:c:{attempt}")
}

pub(crate) fn joined(name: &str) -> String {
    format!("{{{name}}}:joined")
}

/// The lock value block of the lock-mode resource `n` (a string, never
/// deleted, like the counter): not a member of the queue, so never listed
/// as an entry.
pub(crate) fn block(name: &str) -> String {
    format!("{{{name}}}:b")
}

/// The session's own key, renewed with its entries: while it exists the
/// session lives on the server.
pub(crate) fn session_key(id: &str) -> String {
    format!("lockline:session:{id}")
}

/// The name and attempt of an entry key `{n}:e:<attempt>`, read from its
/// positions (names hold no braces), never by searching for a word.
pub(crate) fn parse_entry_key(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix('{')?;
    let close = rest.find('}')?;
    let (name, tail) = rest.split_at(close);
    let attempt = tail.strip_prefix("}:e:")?;
    Some((name, attempt))
}

/// The wire label of a kind, as the scripts store it.
pub(crate) fn kind_label(kind: EntryKind) -> &'static str {
    kind.label()
}

pub(crate) fn kind_from_label(label: &str) -> EntryKind {
    match label {
        "mutex" => EntryKind::Mutex,
        "read" => EntryKind::Read,
        "write" => EntryKind::Write,
        "semaphore" => EntryKind::Semaphore,
        "election" => EntryKind::Election,
        "lock mode" => EntryKind::Dlm,
        _ => EntryKind::Foreign,
    }
}

/// The entry a foreign owner of the plain key `name` stands for: a blocker
/// of order 0, which a waiter waits on like any other.
pub(crate) fn plain_blocker(name: &str) -> Entry {
    Entry {
        key: name.to_owned(),
        kind: EntryKind::Mutex,
        order: 0,
        token: FencingToken::new(0),
        owner: None,
    }
}

/// Whether `entry` is the stand-in for a foreign owner of the plain key.
pub(crate) fn is_plain_blocker(entry: &Entry) -> bool {
    entry.order == 0 && entry.owner.is_none() && parse_entry_key(&entry.key).is_none()
}

/// Whether `key` has the shape of a lock's own keys: `{n}:q`, `{n}:seq`, `{n}:run`,
/// `{n}:e:…`, `{n}:c:…`, `{n}:x:…`, `{n}:l:…`, `{n}:joined`, `{n}:b`, or a
/// session key.
pub(crate) fn is_layout_key(key: &str) -> bool {
    if key.starts_with("lockline:session:") {
        return true;
    }
    let Some(rest) = key.strip_prefix('{') else {
        return false;
    };
    let Some(close) = rest.find('}') else {
        return false;
    };
    let tail = &rest[close + 1..];
    matches!(tail, ":q" | ":seq" | ":run" | ":joined" | ":b")
        || tail.starts_with(":e:")
        || tail.starts_with(":c:")
        || tail.starts_with(":x:")
        || tail.starts_with(":l:")
}

/// Refuses names that would break the hash tag or the layout.
pub(crate) fn validate_name(name: &str) -> lockline::Result<()> {
    if name.contains(['{', '}']) {
        return Err(Error::InvalidName {
            name: name.to_owned(),
            reason: "Redis lock names cannot hold '{' or '}': the name is the hash tag of the lock's keys".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_keys_are_read_from_their_positions() {
        let key = entry_key("jobs/e:x}", "abc");
        assert_eq!(key, "{jobs/e:x}}:e:abc");
        // A name with a brace is refused before it gets here; a plain one
        // holding the layout's words parses.
        let key = entry_key("a}:e:b", "x");
        assert!(validate_name("a}:e:b").is_err());
        assert!(parse_entry_key(&key).is_some());
        assert_eq!(parse_entry_key(&entry_key("q:e:c", "id")), Some(("q:e:c", "id")));
        assert_eq!(parse_entry_key("plain"), None);
    }

    #[test]
    fn the_block_is_a_layout_key_and_no_entry() {
        assert_eq!(block("jobs"), "{jobs}:b");
        assert!(is_layout_key(&block("jobs")));
        assert_eq!(parse_entry_key(&block("jobs")), None);
        // A name that ends in the layout's words is still its own lock.
        assert!(!is_layout_key("{jobs}:b:x"));
    }

    #[test]
    fn labels_round_trip() {
        for kind in [
            EntryKind::Mutex,
            EntryKind::Read,
            EntryKind::Write,
            EntryKind::Semaphore,
            EntryKind::Election,
            EntryKind::Dlm,
        ] {
            assert_eq!(kind_from_label(kind_label(kind)), kind);
        }
    }
}
