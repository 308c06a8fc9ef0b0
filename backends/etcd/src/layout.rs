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
//! | lock-mode contender | `<name>/dlm/<lease hex>-<attempt>` | the core's encoded state |
//!
//! Every key is bound to the session's lease; the queue is ordered by create
//! revision across the whole `<name>/` prefix; the fencing token is the
//! holder's create revision.
//!
//! A lock-mode resource (lockline's `Resource`, the six DLM modes) keeps,
//! besides its entries:
//!
//! | what | key | value | lease |
//! |---|---|---|---|
//! | lock value block | `<name>` NUL `lockline/block` ([`block`]) | the block as last written | none: it outlives every session |
//! | tick of an update that writes nothing else | `<name>` NUL `lockline/touched-<lease hex>` ([`touched`]) | empty | the writer's |
//!
//! Both lie beside the lock like the markers (see [`BESIDE`]): in the key
//! range of the name, outside `<name>/`, so no lock's listing (lockline's,
//! Go's, `etcdctl lock`'s) takes them for a contender, and a fenced write
//! can never reach them. An entry's version and the place of its last write
//! in the server's order are both its modification revision; an update's
//! token is the revision of its transaction.

use lockline::backend::{Conflicts, Entry, EntryKind};
use lockline::FencingToken;

/// The prefix every entry of a lock lives under.
pub(crate) fn prefix(dir: &str) -> String {
    format!("{dir}/")
}

/// The prefix of the entries that can block a contender: the whole lock, for
/// every kind. A reader is blocked by writers, but also by a mutex or an
/// election of the same name (`<name>/<lease hex>`, Go's layout) and must see
/// other kinds' entries to refuse an unsafe mix, so it reads every entry and
/// filters by kind.
pub(crate) fn conflict_prefix(dir: &str, _conflicts: Conflicts) -> String {
    prefix(dir)
}

/// How many keys to read at once when looking for the nearest `count`
/// conflicting entries: more than `count` for readers, which skip the other
/// readers in front of them.
pub(crate) fn page(conflicts: Conflicts, count: usize) -> usize {
    match conflicts {
        Conflicts::Exclusive => count.max(32),
        _ => count,
    }
}

/// The key of a session's entry.
pub(crate) fn key(dir: &str, kind: EntryKind, lease_hex: &str, attempt: &str) -> String {
    match kind {
        EntryKind::Read => format!("{dir}/read/{lease_hex}-{attempt}"),
        EntryKind::Write => format!("{dir}/write/{lease_hex}-{attempt}"),
        EntryKind::Semaphore => format!("{dir}/semaphore/{lease_hex}-{attempt}"),
        EntryKind::Dlm => format!("{dir}/dlm/{lease_hex}-{attempt}"),
        // Mutex, election, and any kind added later: one key per session.
        _ => format!("{dir}/{lease_hex}"),
    }
}

/// Where a session writes its markers (abandoned attempts, hand-overs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Markers {
    /// Beside each lock, in the key range of its name but outside its
    /// prefix: `<dir>` + [`BESIDE`] (the default). Any role whose key
    /// range covers the lock's entries through a prefix of its name
    /// (`locks/` for `locks/a`, or `locks/a` itself) covers them too.
    BesideEachLock,
    /// Under one prefix for every lock (namespace included), one hand-over
    /// marker per session ([`Etcd::with_marker_prefix`](crate::Etcd::with_marker_prefix)).
    Under(String),
}

/// What follows a lock's name in the keys of its markers: a NUL byte, which
/// no lock name contains (lockline refuses control characters in names), so
/// the range `<dir>\0lockline/` is no lock's prefix and lies outside
/// `<dir>/`, where Go's `concurrency.Mutex` and `etcdctl lock` count every key
/// as a contender; NUL sorts before `/`, so the range sits right after the
/// name and before its entries.
pub(crate) const BESIDE: &str = "\0lockline/";

impl Markers {
    /// The prefix of the markers for the lock `dir`.
    fn base(&self, dir: &str) -> String {
        match self {
            Markers::BesideEachLock => format!("{dir}{BESIDE}"),
            Markers::Under(prefix) => prefix.clone(),
        }
    }

    /// Whether a key a user writes (as stored, namespace included) lies
    /// where markers live: written, it could forge one (a loss would pass
    /// for a hand-over, an append would be taken for abandoned).
    pub(crate) fn covers(&self, key: &str) -> bool {
        match self {
            Markers::BesideEachLock => key.contains(BESIDE),
            Markers::Under(prefix) => key.starts_with(prefix.as_str()),
        }
    }

    /// The lock whose entry a marker would look like, if any: under a
    /// marker prefix such as `locks/read/` (or `locks/read/ab`, hex digits
    /// continuing into the lease), an abandoned attempt's marker
    /// `locks/read/<lease hex>-<attempt>` has the shape of a reader of the
    /// lock `locks`, which every contender of that lock would wait on. The
    /// shortest lease (`1`) stands for every lease: a longer one can only
    /// overflow the 16 hex digits of a lease id. Markers beside each lock
    /// never do. Given the prefix without the namespace, the lock is named
    /// as within the namespace.
    pub(crate) fn shadowed_lock(&self) -> Option<String> {
        let Markers::Under(_) = self else { return None };
        [
            abandoned(self, "", "1", "a"),
            released(self, "", "1"),
            waits_delayed(self, "", "1"),
        ]
        .into_iter()
        .find_map(|marker| {
            marker
                .match_indices('/')
                .map(|(at, _)| &marker[..at])
                .find(|dir| !dir.is_empty() && is_entry(dir, marker.as_bytes()))
                .map(str::to_owned)
        })
    }
}

/// The marker an abandoned acquire attempt on the lock `dir` leaves, bound
/// to the session's lease: `<dir>\0lockline/<lease hex>-<attempt>` by
/// default, `<markers>/<lease hex>-<attempt>` under a marker prefix. It is
/// under no lock name's prefix `<name>/` of the same name (Go's and
/// etcdctl's contenders on that name never see it) and is no entry of any
/// lock; the append transaction of that attempt requires it absent, so an
/// append that reaches the server after its attempt was given up creates
/// nothing. One small key per acquire cancelled while its append was in
/// flight; the server deletes it with the session.
pub(crate) fn abandoned(markers: &Markers, dir: &str, lease_hex: &str, attempt: &str) -> String {
    format!("{}{lease_hex}-{attempt}", markers.base(dir))
}

/// The lock value block of the lock-mode resource `dir`:
/// `<dir>\0lockline/block`, beside the lock whatever the marker prefix (every
/// client of the resource must find the same key), with no lease. Shaped
/// like no marker (a lease's hex is followed by `-`, and `released-` starts
/// otherwise) and no entry of any lock.
pub(crate) fn block(dir: &str) -> String {
    format!("{dir}{BESIDE}block")
}

/// The key an update of the lock-mode resource `dir` that changes nothing
/// else writes, so that it still gets a revision of its own (its token must
/// be above every earlier one): `<dir>\0lockline/touched-<lease hex>`, empty,
/// bound to the writer's lease.
pub(crate) fn touched(dir: &str, lease_hex: &str) -> String {
    format!("{dir}{BESIDE}touched-{lease_hex}")
}

/// The prefix abandoned-attempt markers lived under by default before they
/// moved beside each lock: a namespace of its own, under no lock's prefix.
pub(crate) const ABANDONED: &str = "__lockline_abandoned__/";

/// The hand-over marker of the session with lease `lease_hex` on the lock
/// `dir`: `<dir>\0lockline/released-<lease hex>` by default (one key per
/// lock and session), `<markers>released-<lease hex>` under a marker prefix
/// (one key per session). Bound to the lease (it goes with the session).
/// Written only where someone reads it: a removal of one of the session's
/// own entries (a release, a resignation, a cancelled acquire) writes it,
/// empty, in the removal's own transaction (so its modification revision is
/// the revision of that deletion) when a contender with a lock-delay has
/// flagged the lock ([`waits_delayed`]; a nested transaction conditioned on
/// the flags, evaluated with the removal's own compare), or always when the
/// backend was asked to ([`Etcd::with_release_markers`](crate::Etcd::with_release_markers)).
/// `close()` writes [`CLOSING`] into the markers of the flagged locks it
/// still has entries in before it revokes the lease. A waiter with a
/// lock-delay reads the marker of its predecessor's lock and lease *as of*
/// the revision its wait saw the entry deleted at (and the one before): the
/// deletion was a hand-over exactly when the marker was written in that
/// very revision, or said [`CLOSING`] just before it. Beside the
/// abandoned-attempt markers (a lease's hex never starts with `r`), and
/// shaped like no entry of any lock.
pub(crate) fn released(markers: &Markers, dir: &str, lease_hex: &str) -> String {
    format!("{}released-{lease_hex}", markers.base(dir))
}

/// The flag a session with a lock-delay leaves on the lock `dir` when it
/// appends an entry there, in the append's own transaction:
/// `<dir>\0lockline/lock-delay-<lease hex>` by default, `<markers>lock-delay-<lease
/// hex>` under a marker prefix (one per session, standing for every lock
/// under that prefix). Empty, bound to the lease, kept while the session
/// lives. A removal writes its hand-over marker only while some flag exists
/// under [`delay_flags`]: a lock no lock-delayed session ever queued on is
/// released with the plain fenced delete. A lease's hex never starts with
/// `l`, and no entry of any lock has this shape.
pub(crate) fn waits_delayed(markers: &Markers, dir: &str, lease_hex: &str) -> String {
    format!("{}{DELAY_FLAG}{lease_hex}", markers.base(dir))
}

/// The prefix of every [`waits_delayed`] flag that a removal of an entry of
/// the lock `dir` looks at.
pub(crate) fn delay_flags(markers: &Markers, dir: &str) -> String {
    format!("{}{DELAY_FLAG}", markers.base(dir))
}

/// What the flags of [`waits_delayed`] start with.
const DELAY_FLAG: &str = "lock-delay-";

/// The value of a hand-over marker while its session closes.
pub(crate) const CLOSING: &[u8] = b"closing";

/// What [`entry`] reads of a key-value found on the server (an etcd
/// `KeyValue`): this module depends on no client, so that its decoding can be
/// fuzzed on its own.
pub(crate) trait Stored {
    /// The key, as stored (namespace included).
    fn key(&self) -> &[u8];
    /// The revision the key was created at.
    fn create_revision(&self) -> i64;
    /// The lease the key is bound to, 0 for none.
    fn lease(&self) -> i64;
}

/// Whether `key` is an entry of the lock `dir` (see [`entry`]).
pub(crate) fn is_entry(dir: &str, key: &[u8]) -> bool {
    std::str::from_utf8(key).is_ok_and(|key| kind_under(dir, key).is_some())
}

/// Reads an entry of the lock `dir` back from a key-value found under
/// `<dir>/`, decoding its kind from its position under that prefix; `None` for
/// a key that is not an entry of this lock.
///
/// Under `db/` the keys of other locks show up too: mutex `db/read`'s key
/// `db/read/<lease>`, mutex `db/x`'s key `db/x/<lease>`, an rwlock `db/x`'s
/// `db/x/read/<lease>-<attempt>`. Only these shapes are entries of `db`:
///
/// - `db/<lease hex>` (mutex, election, and Go / `etcdctl` / server-side lock
///   contenders);
/// - `db/read/<lease hex>-<attempt>`, `db/write/<lease hex>-<attempt>`,
///   `db/semaphore/<lease hex>-<attempt>`, `db/dlm/<lease hex>-<attempt>`.
///
/// A name is never searched for a word: a lock may be called `read`,
/// `a/write/b` or `semaphore`.
pub(crate) fn entry(dir: &str, kv: &impl Stored) -> Option<Entry> {
    let key = std::str::from_utf8(kv.key()).ok()?;
    let kind = kind_under(dir, key)?;
    let order = kv.create_revision();
    Some(Entry {
        key: key.to_owned(),
        kind,
        order,
        token: FencingToken::new(u64::try_from(order).ok()?),
        owner: (kv.lease() != 0).then(|| format!("{:x}", kv.lease())),
    })
}

/// The kind of the entry `key` of the lock `dir`, or `None` when `key` is not
/// one of its entries.
fn kind_under(dir: &str, key: &str) -> Option<EntryKind> {
    let rest = key.strip_prefix(dir)?.strip_prefix('/')?;
    match rest.split_once('/') {
        None if is_lease_hex(rest) => Some(EntryKind::Mutex),
        None => None,
        Some((segment, tail)) => {
            let kind = match segment {
                "read" => EntryKind::Read,
                "write" => EntryKind::Write,
                "semaphore" => EntryKind::Semaphore,
                "dlm" => EntryKind::Dlm,
                _ => return None,
            };
            let (lease, attempt) = tail.split_once('-')?;
            let attempt_ok = !attempt.is_empty()
                && attempt
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            (is_lease_hex(lease) && attempt_ok).then_some(kind)
        }
    }
}

/// A lease id as Go's `concurrency` package and lockline write it: lowercase
/// hex of a positive 64-bit number.
fn is_lease_hex(text: &str) -> bool {
    !text.is_empty() && text.len() <= 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The directory of one of this session's own entries: the key with its
/// kind's suffix cut off by position (`<dir>/<lease>` or
/// `<dir>/<kind>/<lease>-<attempt>`).
pub(crate) fn dir_of(entry: &Entry) -> &str {
    let key = entry.key.as_str();
    let cut = match entry.kind {
        EntryKind::Read | EntryKind::Write | EntryKind::Semaphore | EntryKind::Dlm => {
            key.rsplitn(3, '/').nth(2).map(str::len)
        }
        _ => key.rfind('/'),
    };
    cut.map_or(key, |at| &key[..at])
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
        assert_eq!(key("res", EntryKind::Dlm, "1f", "u1"), "res/dlm/1f-u1");
        assert_eq!(conflict_prefix("rw", Conflicts::Exclusive), "rw/");
        assert_eq!(conflict_prefix("rw", Conflicts::All), "rw/");
    }

    #[test]
    fn lock_delay_flags_are_apart_from_every_other_marker_and_from_entries() {
        for markers in [Markers::BesideEachLock, Markers::Under(ABANDONED.to_owned())] {
            for (dir, lease) in [
                ("locks/a", "694d7a1b2c"),
                ("lock-delay", "1"),
                ("a/read", "ffffffffffffffff"),
            ] {
                let flag = waits_delayed(&markers, dir, lease);
                let flags = delay_flags(&markers, dir);
                assert!(flag.starts_with(&flags), "{flag:?} under {flags:?}");
                // No other marker of any lease or attempt lies under the flags'
                // prefix: a lease's hex never starts with `l`.
                for other in [
                    abandoned(&markers, dir, lease, "lock-delay-1"),
                    released(&markers, dir, lease),
                    block(dir),
                    touched(dir, lease),
                ] {
                    assert!(!other.starts_with(&flags), "{other:?} under {flags:?}");
                }
                for (at, _) in flag.match_indices('/') {
                    assert!(
                        !is_entry(&flag[..at], flag.as_bytes()),
                        "{flag:?} under {}",
                        &flag[..at]
                    );
                }
            }
        }
        assert_eq!(
            waits_delayed(&Markers::BesideEachLock, "locks/a", "1f"),
            "locks/a\0lockline/lock-delay-1f"
        );
        assert_eq!(delay_flags(&Markers::Under("m/".into()), "locks/a"), "m/lock-delay-");
    }

    #[test]
    fn hand_over_markers_are_apart_from_abandoned_ones_and_from_entries() {
        let under = Markers::Under(ABANDONED.to_owned());
        let marker = released(&under, "locks/a", "694d7a1b2c");
        assert_eq!(marker, "__lockline_abandoned__/released-694d7a1b2c");
        assert_ne!(marker, abandoned(&under, "locks/a", "694d7a1b2c", "released"));
        // Under a marker prefix inside a lock's namespace, still no entry of
        // any lock above it.
        let marker = released(&Markers::Under("locks/__lockline_abandoned__/".into()), "x", "1f");
        for (at, _) in marker.match_indices('/') {
            assert!(
                !is_entry(&marker[..at], marker.as_bytes()),
                "{marker} under {}",
                &marker[..at]
            );
        }
    }

    #[test]
    fn markers_beside_a_lock_are_in_its_name_range_but_outside_its_prefix() {
        let beside = Markers::BesideEachLock;
        let attempt = "0123456789abcdef0123456789abcdef";
        for dir in ["locks/a", "/my-lock/", "a/read", "db"] {
            let own = prefix(dir);
            for marker in [
                released(&beside, dir, "694d7a1b2c"),
                abandoned(&beside, dir, "694d7a1b2c", attempt),
            ] {
                // Inside a role on the name's own range, or any prefix of it.
                assert!(marker.starts_with(dir), "{marker:?}");
                // Outside `<dir>/`, where Go and etcdctl count contenders.
                assert!(!marker.starts_with(&own), "{marker:?} is under {own:?}");
                // No entry of this lock or of any lock above it.
                assert!(!is_entry(dir, marker.as_bytes()), "{marker:?}");
                for (at, _) in marker.match_indices('/') {
                    assert!(!is_entry(&marker[..at], marker.as_bytes()), "{marker:?}");
                }
                assert!(beside.covers(&marker), "{marker:?}");
            }
            assert_ne!(released(&beside, dir, "1f"), abandoned(&beside, dir, "1f", "released"));
        }
        // Per lock and session: another lock, another key.
        assert_ne!(released(&beside, "locks/a", "1f"), released(&beside, "locks/b", "1f"));
        // A lock name never holds the separator (control characters are
        // refused), so no lock's prefix lies in a marker range.
        assert!(beside.covers("locks/a\0lockline/x"));
        assert!(!beside.covers("locks/a/x"));
        assert!(Markers::Under("m/".into()).covers("m/x"));
        assert!(!Markers::Under("m/".into()).covers("locks/m/x"));
    }

    #[test]
    fn a_marker_prefix_that_makes_markers_look_like_entries_is_found() {
        // Found by fuzzing: under `locks/read/`, an abandoned attempt's
        // marker is a reader of the lock `locks`.
        for (prefix, lock) in [
            ("locks/read/", "locks"),
            ("locks/write/", "locks"),
            ("a/b/semaphore/", "a/b"),
            ("locks/read/ab", "locks"),
        ] {
            let under = Markers::Under(prefix.to_owned());
            assert_eq!(under.shadowed_lock().as_deref(), Some(lock), "{prefix:?}");
            let marker = abandoned(&under, "", "694d7a1b2c", "0123456789abcdef");
            assert!(is_entry(lock, marker.as_bytes()), "{marker:?}");
        }
        for prefix in [
            ABANDONED,
            "locks/__lockline_abandoned__/",
            "locks/read",
            "locks/reader/",
            "locks/read/x",
            "locks/read/0123456789abcdef",
            "m-",
        ] {
            assert_eq!(Markers::Under(prefix.to_owned()).shadowed_lock(), None, "{prefix:?}");
        }
        assert_eq!(Markers::BesideEachLock.shadowed_lock(), None);
    }

    #[test]
    fn kinds_come_from_the_position_under_the_lock_prefix() {
        let attempt = "0123456789abcdef0123456789abcdef";
        assert_eq!(kind_under("db", "db/1f"), Some(EntryKind::Mutex));
        assert_eq!(
            kind_under("db", &format!("db/read/1f-{attempt}")),
            Some(EntryKind::Read)
        );
        assert_eq!(
            kind_under("db", &format!("db/write/1f-{attempt}")),
            Some(EntryKind::Write)
        );
        assert_eq!(
            kind_under("db", &format!("db/semaphore/1f-{attempt}")),
            Some(EntryKind::Semaphore)
        );
        assert_eq!(kind_under("db", &format!("db/dlm/1f-{attempt}")), Some(EntryKind::Dlm));
        // A mutex named `db/dlm` is no lock-mode entry of `db`, and a
        // lock-mode entry of `db` is no entry of `db/dlm`.
        assert_eq!(kind_under("db", "db/dlm/1f"), None);
        assert_eq!(kind_under("db/dlm", "db/dlm/1f"), Some(EntryKind::Mutex));
        assert_eq!(kind_under("db/dlm", &format!("db/dlm/1f-{attempt}")), None);
        // Other locks' keys under the same prefix.
        assert_eq!(kind_under("db", "db/read/1f"), None, "mutex db/read");
        assert_eq!(kind_under("db", "db/x/1f"), None, "mutex db/x");
        assert_eq!(kind_under("db", &format!("db/x/read/1f-{attempt}")), None);
        assert_eq!(kind_under("db", "db/lock/1f"), None);
        assert_eq!(kind_under("db", "dbx/1f"), None);
        assert_eq!(kind_under("db", "db/1F"), None);
        // Names made of recipe words decode by position alone.
        assert_eq!(kind_under("read", "read/1f"), Some(EntryKind::Mutex));
        assert_eq!(kind_under("a/write/b", "a/write/b/1f"), Some(EntryKind::Mutex));
        assert_eq!(
            kind_under("db/read", &format!("db/read/write/1f-{attempt}")),
            Some(EntryKind::Write)
        );
        // An rwlock `db`'s read entry is not an entry of mutex `db/read`.
        assert_eq!(kind_under("db/read", &format!("db/read/1f-{attempt}")), None);
    }

    #[test]
    fn the_directory_is_cut_by_position() {
        let entry = |key: &str, kind| Entry {
            key: key.into(),
            kind,
            order: 1,
            token: FencingToken::new(1),
            owner: None,
        };
        assert_eq!(dir_of(&entry("db/read/1f", EntryKind::Mutex)), "db/read");
        assert_eq!(dir_of(&entry("db/read/read/1f-u", EntryKind::Read)), "db/read");
        assert_eq!(dir_of(&entry("write/write/1f-u", EntryKind::Write)), "write");
        assert_eq!(dir_of(&entry("a/dlm/b/dlm/1f-u", EntryKind::Dlm)), "a/dlm/b");
    }

    #[test]
    fn the_value_block_lies_beside_the_lock_and_is_no_entry_or_marker() {
        let beside = Markers::BesideEachLock;
        for dir in ["locks/a", "/res/", "a/dlm", "db"] {
            let block = block(dir);
            let touched = touched(dir, "694d7a1b2c");
            for key in [&block, &touched] {
                assert!(key.starts_with(dir), "{key:?}");
                assert!(!key.starts_with(&prefix(dir)), "{key:?} is under {dir:?}/");
                assert!(!is_entry(dir, key.as_bytes()), "{key:?}");
                for (at, _) in key.match_indices('/') {
                    assert!(!is_entry(&key[..at], key.as_bytes()), "{key:?}");
                }
                // Fenced writes can never reach it.
                assert!(beside.covers(key), "{key:?}");
            }
            // No marker of any session or attempt.
            for lease in ["b", "1f", "694d7a1b2c"] {
                assert_ne!(block, released(&beside, dir, lease));
                assert_ne!(touched, released(&beside, dir, lease));
                for attempt in ["lock", "u1"] {
                    assert_ne!(block, abandoned(&beside, dir, lease, attempt));
                    assert_ne!(touched, abandoned(&beside, dir, lease, attempt));
                }
            }
        }
        assert_ne!(block("a"), block("a/b"));
        assert_eq!(block("res"), "res\0lockline/block");
    }

    #[test]
    fn a_marker_prefix_shaped_like_lock_mode_entries_is_found() {
        let under = Markers::Under("locks/dlm/".to_owned());
        assert_eq!(under.shadowed_lock().as_deref(), Some("locks"));
    }
}
