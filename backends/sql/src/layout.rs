//! Where lockline keeps its rows, and how entries are named.
//!
//! Every contender is a row of `PREFIXentries` (`lockline_entries` by
//! default): its `id` (the table's identity / `AUTO_INCREMENT`) orders its
//! lock's queue and is its fencing token; its key as users see it is
//! `NAME/ID` ([`entry_key`]), and its `kind` a label ([`kind_label`]).
//!
//! **Lock modes** (`EntryKind::Dlm`, label `dlm`): a contender of a
//! `Resource` is a row like any other, under the resource's name, with the
//! core's encoded state as its `value`. Besides `version` (raised by every
//! write of the value), such a row carries `changed`, the token of its last
//! write by `update_queue` (0 until one: read back as its `id`, the place
//! of its creation in the same counter), and `epoch`, the version of the
//! value lock its owner's connection holds (raised by the owner's own
//! writes only; a watcher waits on that lock), and on MariaDB/MySQL
//! `watchers`, how many watch slots (named locks `ll:<salt>:w:<id>:<n>`)
//! writers of other sessions look at. A token is the next value of the
//! entries' own id counter (PostgreSQL `nextval` of the identity's
//! sequence; MariaDB/MySQL the `AUTO_INCREMENT` of a row inserted and
//! deleted in the change's transaction), so it is above every id and token
//! before it and moves past the clock with the counter after a restart.
//! The resource's lock value block is the row of its name in
//! `PREFIXblocks` (`name`, `value`): a table of its own, which no key of
//! `PREFIXdata` (fenced writes) and no entry can meet, never listed as an
//! entry, kept when the queue empties and across restarts. No peer client
//! reads these rows; the core refuses to mix lock-mode entries with other
//! kinds under one name.

use lockline::{Error, Result};

/// The version of the tables and functions lockline expects; kept in the
/// `meta` table, checked at every session open. 2: on MariaDB/MySQL an
/// append is one call of a stored procedure, and no table keeps a row per
/// lock name; sessions carry a heartbeat count; the meta row keeps the
/// restart grace. 3: lock modes (`EntryKind::Dlm`, kind `dlm`): entries
/// carry `changed` (the token of their last write by `update_queue`; on
/// MariaDB/MySQL also `watchers`, the watch slots used), a `blocks` table
/// keeps each lock-mode resource's lock value block, and `update_queue`
/// (with, on MariaDB/MySQL, `watch` and `wake`) is a function or procedure.
/// 4: the fence (`fence`), a function on PostgreSQL and a procedure on
/// MariaDB/MySQL that any driver calls to commit a transaction only while a
/// lock is held; nothing else changed, so a session that may create tables
/// moves layout 3 tables to 4 itself (creates the fence, raises the row).
/// 5: a waiter's wait reads its turn in the same call (`wait_turn`, a
/// function on PostgreSQL and a procedure on MariaDB/MySQL), and a release
/// is one call that commits the deletion before it lets go of the guard
/// (`release`, a procedure on PostgreSQL; `remove` on MariaDB/MySQL);
/// nothing else changed,
/// so a session that may create tables moves layout 3 or 4 tables to 5
/// itself (creates what is missing, raises the row).
pub(crate) const LAYOUT_VERSION: i32 = 5;

/// The layouts a session moves to [`LAYOUT_VERSION`] itself: they differ
/// from it only by functions or procedures it creates.
pub(crate) const MOVABLE_LAYOUTS: [i32; 2] = [3, 4];

/// Whether a session moves tables of `layout` to [`LAYOUT_VERSION`] itself.
pub(crate) fn movable(layout: Option<i32>) -> bool {
    layout.is_some_and(|l| MOVABLE_LAYOUTS.contains(&l))
}

/// The statement that raises the layout of tables of a movable layout to
/// [`LAYOUT_VERSION`], once a session created what they lack (`meta`: the
/// meta table as statements name it).
pub(crate) fn raise_layout(meta: &str) -> String {
    let [oldest, newest] = MOVABLE_LAYOUTS;
    format!("UPDATE {meta} SET layout = {LAYOUT_VERSION} WHERE layout BETWEEN {oldest} AND {newest}")
}

/// The default prefix of lockline's table names.
pub(crate) const DEFAULT_PREFIX: &str = "lockline_";

/// The names of one set of lockline tables, and the salt that keeps the
/// server-wide lock keys of two sets apart.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    /// `"schema".` on PostgreSQL (empty: resolved to `current_schema()`), the
    /// database on MariaDB (empty: the connection's).
    pub(crate) qualifier: String,
    pub(crate) prefix: String,
}

impl Tables {
    pub(crate) fn new(schema: Option<&str>, prefix: &str) -> Result<Self> {
        check_identifier("table prefix", prefix, true)?;
        if let Some(schema) = schema {
            check_identifier("schema", schema, false)?;
        }
        Ok(Tables {
            qualifier: schema.map(str::to_owned).unwrap_or_default(),
            prefix: prefix.to_owned(),
        })
    }
}

/// Refuses a schema or prefix that is not a plain lower-case identifier:
/// they are written into statements, so nothing else is let in.
fn check_identifier(what: &str, value: &str, may_be_empty: bool) -> Result<()> {
    let ok_start = |c: char| c.is_ascii_lowercase() || c == '_';
    let ok = |c: char| ok_start(c) || c.is_ascii_digit();
    let valid = if value.is_empty() {
        may_be_empty
    } else {
        value.len() <= 40 && value.chars().next().is_some_and(ok_start) && value.chars().all(ok)
    };
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidOptions {
            reason: format!(
                "{what} {value:?} must be a lower-case identifier of at most 40 characters (a-z, 0-9, _; not starting with a digit)"
            ),
        })
    }
}

/// FNV-1a, 64 bits: a hash that stays the same across Rust versions and
/// machines, for the salt of the server-wide lock keys.
pub(crate) fn fnv64(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// An entry's key as users see it: the lock's name, `/`, the entry's id.
pub(crate) fn entry_key(name: &str, id: i64) -> String {
    format!("{name}/{id}")
}

/// The name and id of an entry key made by [`entry_key`]: the id as it
/// writes it, decimal digits without a sign or a leading zero (`str::parse`
/// takes `+5` and `05` too, which no entry key is).
pub(crate) fn parse_entry_key(key: &str) -> Option<(&str, i64)> {
    let (name, digits) = key.rsplit_once('/')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) || digits.starts_with('0') {
        return None;
    }
    let id: i64 = digits.parse().ok()?;
    (id > 0 && !name.is_empty()).then_some((name, id))
}

/// The label of a lock-mode entry (`EntryKind::Dlm`).
pub(crate) const DLM: &str = "dlm";

/// The label stored for each kind.
pub(crate) fn kind_label(kind: lockline::EntryKind) -> &'static str {
    use lockline::EntryKind;
    match kind {
        EntryKind::Read => "read",
        EntryKind::Write => "write",
        EntryKind::Semaphore => "semaphore",
        EntryKind::Election => "election",
        EntryKind::Mutex => "mutex",
        EntryKind::Dlm => DLM,
        _ => "foreign",
    }
}

/// The kind of a stored label; an unknown label (a newer lockline's kind)
/// queues with nothing.
pub(crate) fn kind_from_label(label: &str) -> lockline::EntryKind {
    use lockline::EntryKind;
    match label {
        "mutex" => EntryKind::Mutex,
        "read" => EntryKind::Read,
        "write" => EntryKind::Write,
        "semaphore" => EntryKind::Semaphore,
        "election" => EntryKind::Election,
        DLM => EntryKind::Dlm,
        _ => EntryKind::Foreign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_keys_round_trip_with_slashes_in_the_name() {
        let key = entry_key("jobs/nightly/", 42);
        assert_eq!(key, "jobs/nightly//42");
        assert_eq!(parse_entry_key(&key), Some(("jobs/nightly/", 42)));
        assert_eq!(parse_entry_key("jobs"), None);
        assert_eq!(parse_entry_key("jobs/x"), None);
        assert_eq!(parse_entry_key("/0"), None);
    }

    #[test]
    fn entry_ids_are_read_only_as_written() {
        // Found by fuzzing: these decoded as entry 5 (or 215) of `a`,
        // although no entry key is written so.
        for key in ["a/+5", "a/05", "a/00215", "a/-5", "a/ 5", "a/5 ", "a/"] {
            assert_eq!(parse_entry_key(key), None, "{key:?}");
        }
        assert_eq!(parse_entry_key("a/5"), Some(("a", 5)));
        assert_eq!(parse_entry_key(&entry_key("a", i64::MAX)), Some(("a", i64::MAX)));
    }

    #[test]
    fn identifiers_are_checked() {
        assert!(Tables::new(None, "lockline_").is_ok());
        assert!(Tables::new(Some("locks"), "").is_ok());
        for bad in ["Lockline", "a-b", "1a", "a b", "a\"b", &"x".repeat(41)] {
            assert!(Tables::new(None, bad).is_err(), "{bad:?}");
            assert!(Tables::new(Some(bad), "p_").is_err(), "{bad:?}");
        }
        assert!(Tables::new(Some(""), "p_").is_err());
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv64("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
