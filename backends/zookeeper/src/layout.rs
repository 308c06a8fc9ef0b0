//! The ZooKeeper layout: Apache Curator's, recognising kazoo's and ZooKeeper's
//! own lock recipe's contenders in the same directory.
//!
//! | kind | node under the lock's directory (ephemeral-sequential) |
//! |---|---|
//! | mutex | `_c_<attempt>-lock-<10-digit sequence>` (Curator `InterProcessMutex`) |
//! | read lock | `_c_<attempt>-__READ__<sequence>` (Curator `InterProcessReadWriteLock`) |
//! | write lock | `_c_<attempt>-__WRIT__<sequence>` |
//! | semaphore permit | `_c_<attempt>-lease-<sequence>` |
//! | election candidate | `_c_<attempt>-latch-<sequence>` (Curator `LeaderLatch`), value as data |
//! | lock-mode contender | `_c_<attempt>-dlm-<sequence>`, the core's encoded state as data |
//!
//! # Lock modes
//!
//! A lock-mode resource (the core's `Resource`) named `n` keeps its contenders in the
//! directory `/n` like every other recipe: ephemeral-sequential
//! `_c_<attempt>-dlm-<sequence>` nodes whose data is the entry's value (its
//! mode, grant and conversion, written and read by the core only). The
//! Curator-style `_c_<attempt>-` prefix lets a retried append find the node
//! its lost create made, as for the other kinds. No peer recipe takes such a
//! node for one of its contenders:
//!
//! - Curator's `InterProcessMutex`, `InterProcessReadWriteLock` and
//!   `LeaderLatch` sort every child by what follows their marker (`lock-`,
//!   `__READ__`/`__WRIT__`, `latch-`), and a child without the marker by its
//!   whole name: `_c_...` sorts after every sequence number, so a DLM node is
//!   never before a Curator contender (never its holder nor the node it
//!   waits on), and the read lock counts only nodes containing `__WRIT__`;
//! - kazoo's `Lock`/`ReadLock`/`WriteLock` match `(__lock__|__rlock__|<extra
//!   patterns>)` followed by ten digits at the end of a name, so `-dlm-`
//!   matches only if a user passes it as an extra pattern;
//! - ZooKeeper's own lock recipe (`WriteLock` of `zookeeper-recipes-lock`)
//!   takes *every* child with a number after its last `-` for a contender:
//!   it would queue behind DLM nodes (the safe side), as it does behind
//!   Curator's and kazoo's.
//!
//! The core refuses to mix lock-mode contenders with any other kind under
//! one name ([`EntryKind::queues_with`]).
//!
//! Two more children with reserved names, which no recipe (lockline's,
//! Curator's, kazoo's or ZooKeeper's, see above) takes for a contender: no
//! trailing sequence number, no recipe marker, sorted after every sequence
//! number by Curator:
//!
//! | child of `/n` | what |
//! |---|---|
//! | `lockline-value-block` | the lock value block: a persistent node whose data is the block, created at its first write with the session's ACL policy. It keeps the container `/n` from being cleaned up, so a resource whose block was ever written keeps its directory and block until deleted by hand |
//! | `lockline-stamp` | created, written and deleted inside one update `multi` of checks alone: its `setData` stat gives the update's zxid (the token). Never seen outside the transaction |
//!
//! Both live inside the lock's own directory, so the grant that lets a
//! session queue on `/n` (CREATE and DELETE on `/n`, READ on the nodes)
//! covers them, plus WRITE on the block node (which its creator's ACL policy
//! gives). Lock names and fenced-write keys with a segment of either name
//! are refused.
//!
//! Recognised from other clients: kazoo's `<hex>__lock__<seq>` (exclusive) and
//! `<hex>__rlock__<seq>` (shared), ZooKeeper's recipe `x-<session>-<seq>`
//! (exclusive). Entries are ordered by their sequence number, parsed from the
//! trailing digits as a signed 32-bit value (ZooKeeper's counter wraps
//! negative), never by a string sort.
//!
//! Recognised and refused: the nodes of semaphores lockline cannot queue with,
//! Curator's `InterProcessSemaphoreV2` (children `leases` and `locks`, its
//! leases one level down) and kazoo's `Semaphore` (32-hex-digit lease nodes
//! without a sequence number). They are reported as [`EntryKind::Foreign`]
//! entries placed first in the queue, so every lockline contender under that
//! name meets one and fails with `InvalidName` instead of holding beside a
//! lease it cannot see. Anything else in the directory is ignored.

use lockline::backend::EntryKind;
use lockline::FencingToken;

/// The ZooKeeper path of a lock's directory: the name with one leading `/`.
pub(crate) fn dir_path(name: &str) -> String {
    format!("/{}", name.trim_start_matches('/'))
}

/// The prefix of a new node's path; ZooKeeper appends the sequence number.
pub(crate) fn node_prefix(dir: &str, kind: EntryKind, attempt: &str) -> String {
    let marker = match kind {
        EntryKind::Read => "__READ__",
        EntryKind::Write => "__WRIT__",
        EntryKind::Semaphore => "lease-",
        EntryKind::Election => "latch-",
        EntryKind::Dlm => "dlm-",
        _ => "lock-",
    };
    format!("{dir}/_c_{attempt}-{marker}")
}

/// The lock value block's node name under a lock-mode resource's directory.
pub(crate) const VALUE_BLOCK: &str = "lockline-value-block";

/// The name of the node an update that writes nothing else creates, writes
/// and deletes in its one `multi`, for the zxid of its `setData` stat.
pub(crate) const STAMP: &str = "lockline-stamp";

/// Whether a node name is one of the names this layout reserves inside a
/// lock's directory (see the module docs).
pub(crate) fn reserved(segment: &str) -> bool {
    segment == VALUE_BLOCK || segment == STAMP
}

/// The path of the lock value block of the resource whose directory is `dir`.
pub(crate) fn value_block_path(dir: &str) -> String {
    format!("{dir}/{VALUE_BLOCK}")
}

/// The path of the stamp node of the resource whose directory is `dir`.
pub(crate) fn stamp_path(dir: &str) -> String {
    format!("{dir}/{STAMP}")
}

/// A child of a lock directory that is a contender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contender {
    pub(crate) name: String,
    pub(crate) kind: EntryKind,
    pub(crate) sequence: i32,
    /// The Curator attempt id (`_c_<attempt>-`), when the node has one.
    pub(crate) attempt: Option<String>,
}

impl Contender {
    pub(crate) fn entry(&self, dir: &str) -> lockline::backend::Entry {
        lockline::backend::Entry {
            key: format!("{dir}/{}", self.name),
            kind: self.kind,
            order: i64::from(self.sequence),
            token: FencingToken::new(0),
            owner: None,
        }
    }
}

/// Splits the trailing sequence number off a node name: `(rest, sequence)`.
fn sequence(name: &str) -> Option<(&str, i32)> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let (rest, number) = name.split_at(name.len() - digits);
    // A wrapped (negative) counter reads `...-lock--000000001`: a '-' sign
    // after the recipe's own separator.
    let negative = rest
        .strip_suffix('-')
        .is_some_and(|before| before.ends_with('-') || before.ends_with('_'));
    let value: i64 = number.parse().ok()?;
    let value = if negative { -value } else { value };
    let rest = if negative { &rest[..rest.len() - 1] } else { rest };
    Some((rest, i32::try_from(value).ok()?))
}

/// Curator `InterProcessSemaphoreV2`'s children of its path.
const CURATOR_SEMAPHORE_CHILDREN: [&str; 2] = ["leases", "locks"];

/// A node of another client's semaphore: Curator's `leases`/`locks`, or a
/// kazoo `Semaphore` lease (`uuid4().hex`: 32 lowercase hex digits).
fn foreign_semaphore(name: &str) -> bool {
    CURATOR_SEMAPHORE_CHILDREN.contains(&name)
        || (name.len() == 32 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Recognises a contender node, or `None` for anything else.
pub(crate) fn parse(name: &str) -> Option<Contender> {
    if foreign_semaphore(name) {
        // First in the queue: whoever queues under this name meets it.
        return Some(Contender {
            name: name.to_owned(),
            kind: EntryKind::Foreign,
            sequence: i32::MIN,
            attempt: None,
        });
    }
    let (rest, sequence) = sequence(name)?;
    let curator = |marker: &str| -> Option<String> {
        let body = rest.strip_prefix("_c_")?.strip_suffix(marker)?;
        Some(body.strip_suffix('-')?.to_owned())
    };
    let (kind, attempt) = if let Some(attempt) = curator("lock-") {
        (EntryKind::Mutex, Some(attempt))
    } else if let Some(attempt) = curator("__READ__") {
        (EntryKind::Read, Some(attempt))
    } else if let Some(attempt) = curator("__WRIT__") {
        (EntryKind::Write, Some(attempt))
    } else if let Some(attempt) = curator("lease-") {
        (EntryKind::Semaphore, Some(attempt))
    } else if let Some(attempt) = curator("latch-") {
        (EntryKind::Election, Some(attempt))
    } else if let Some(attempt) = curator("dlm-") {
        (EntryKind::Dlm, Some(attempt))
    } else if rest.ends_with("__lock__") {
        (EntryKind::Mutex, None)
    } else if rest.ends_with("__rlock__") {
        (EntryKind::Read, None)
    } else if rest.starts_with("x-") && rest.ends_with('-') {
        (EntryKind::Mutex, None)
    } else {
        return None;
    };
    Some(Contender {
        name: name.to_owned(),
        kind,
        sequence,
        attempt,
    })
}

/// The contenders among a directory's children, in queue order.
///
/// ZooKeeper's per-directory counter is a signed 32-bit value that wraps from
/// `2147483647` to `-2147483648`; queue order is serial-number order (RFC 1982):
/// every sequence is placed relative to the first one listed, so a node made
/// just after the wrap sorts after one made just before it. This holds while
/// the live contenders of one directory span fewer than 2³¹ creations.
pub(crate) fn contenders(children: &[String]) -> Vec<Contender> {
    let mut found: Vec<Contender> = children.iter().filter_map(|c| parse(c)).collect();
    // Other clients' semaphores come first, whatever their numbers.
    let anchor = found.iter().find(|c| c.kind != EntryKind::Foreign).map(|c| c.sequence);
    if let Some(anchor) = anchor {
        found.sort_by_key(|c| {
            let ours = c.kind != EntryKind::Foreign;
            (ours, i64::from(anchor) + i64::from(c.sequence.wrapping_sub(anchor)))
        });
    }
    found
}

/// Whether sequence `a` was handed out before `b` (serial-number order, see
/// [`contenders`]).
pub(crate) fn before(a: i32, b: i32) -> bool {
    b.wrapping_sub(a) > 0
}

/// Whether `contender` is queued before the node with sequence `sequence`
/// (another client's semaphore always is).
pub(crate) fn precedes(contender: &Contender, sequence: i32) -> bool {
    contender.kind == EntryKind::Foreign || before(contender.sequence, sequence)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curator_names() {
        let prefix = node_prefix("/locks/a", EntryKind::Mutex, "3f2a");
        assert_eq!(prefix, "/locks/a/_c_3f2a-lock-");
        let c = parse("_c_3f2a-lock-0000000042").expect("parsed");
        assert_eq!(
            (c.kind, c.sequence, c.attempt.as_deref()),
            (EntryKind::Mutex, 42, Some("3f2a"))
        );
        let uuid = "_c_1b4e28ba-2fa1-11d2-883f-0016d3cca427-__WRIT__0000000007";
        let w = parse(uuid).expect("parsed");
        assert_eq!(w.kind, EntryKind::Write);
        assert_eq!(w.attempt.as_deref(), Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427"));
        assert_eq!(parse("_c_ab-__READ__0000000001").map(|c| c.kind), Some(EntryKind::Read));
        assert_eq!(
            parse("_c_ab-latch-0000000001").map(|c| c.kind),
            Some(EntryKind::Election)
        );
    }

    #[test]
    fn foreign_contenders() {
        let kazoo = parse("5a1b2c3d4e__lock__0000000003").expect("kazoo lock");
        assert_eq!((kazoo.kind, kazoo.sequence, kazoo.attempt), (EntryKind::Mutex, 3, None));
        assert_eq!(parse("5a1b__rlock__0000000004").map(|c| c.kind), Some(EntryKind::Read));
        let recipe = parse("x-72057594037927936-0000000009").expect("ZooKeeper recipe");
        assert_eq!((recipe.kind, recipe.sequence), (EntryKind::Mutex, 9));
        assert_eq!(parse("config"), None);
        assert_eq!(parse("lease"), None);
        assert_eq!(parse("something-0000000001"), None);
    }

    #[test]
    fn other_clients_semaphores_are_foreign_and_first() {
        for name in ["leases", "locks", "0123456789abcdef0123456789abcdef"] {
            let c = parse(name).expect("recognised");
            assert_eq!((c.kind, c.sequence), (EntryKind::Foreign, i32::MIN), "{name}");
        }
        // Not a kazoo lease: upper case, or one digit short.
        assert_eq!(parse("0123456789ABCDEF0123456789ABCDEF"), None);
        assert_eq!(parse("0123456789abcdef0123456789abcde").map(|c| c.kind), None);
        let children = vec!["_c_a-lock-0000000001".to_owned(), "leases".to_owned()];
        let order: Vec<EntryKind> = contenders(&children).iter().map(|c| c.kind).collect();
        assert_eq!(order, vec![EntryKind::Foreign, EntryKind::Mutex]);
    }

    #[test]
    fn wrapped_sequences_sort_numerically_not_as_strings() {
        assert_eq!(parse("_c_a-lock--2147483648").map(|c| c.sequence), Some(i32::MIN));
        assert_eq!(parse("k__lock__-000000001").map(|c| c.sequence), Some(-1));
        let children = vec![
            "_c_a-lock-0000000010".to_owned(),
            "_c_b-lock-0000000009".to_owned(),
            "x-1-0000000100".to_owned(),
            "c__lock__0000000002".to_owned(),
            "_c_d-lock--000000005".to_owned(),
        ];
        let order: Vec<i32> = contenders(&children).iter().map(|c| c.sequence).collect();
        assert_eq!(order, vec![-5, 2, 9, 10, 100]);
    }

    #[test]
    fn order_survives_the_counter_wrap() {
        let children = vec![
            "_c_c-lock--2147483648".to_owned(),
            "_c_a-lock-2147483646".to_owned(),
            "_c_d-lock--2147483647".to_owned(),
            "_c_b-lock-2147483647".to_owned(),
        ];
        let order: Vec<i32> = contenders(&children).iter().map(|c| c.sequence).collect();
        assert_eq!(order, vec![2147483646, 2147483647, i32::MIN, i32::MIN + 1]);
        assert!(before(i32::MAX, i32::MIN));
        assert!(!before(i32::MIN, i32::MAX));
        assert!(before(-5, 2) && !before(2, -5) && !before(7, 7));
    }

    #[test]
    fn lock_mode_names() {
        let prefix = node_prefix("/res", EntryKind::Dlm, "1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        assert_eq!(prefix, "/res/_c_1b4e28ba-2fa1-11d2-883f-0016d3cca427-dlm-");
        let c = parse("_c_1b4e28ba-2fa1-11d2-883f-0016d3cca427-dlm-0000000012").expect("parsed");
        assert_eq!(
            (c.kind, c.sequence, c.attempt.as_deref()),
            (EntryKind::Dlm, 12, Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427"))
        );
        assert_eq!(parse("_c_ab-dlm--000000003").map(|c| c.sequence), Some(-3));
        // Queued by sequence with whatever else is in the directory.
        let children = vec![
            "_c_b-dlm-0000000002".to_owned(),
            "_c_a-lock-0000000001".to_owned(),
            VALUE_BLOCK.to_owned(),
        ];
        let order: Vec<EntryKind> = contenders(&children).iter().map(|c| c.kind).collect();
        assert_eq!(order, vec![EntryKind::Mutex, EntryKind::Dlm]);
    }

    #[test]
    fn reserved_names_are_no_contenders_of_any_recipe() {
        for name in [VALUE_BLOCK, STAMP] {
            assert!(reserved(name));
            // Not lockline's (nor a foreign semaphore's).
            assert_eq!(parse(name), None, "{name}");
            // No Curator marker (Curator sorts such a child by its whole
            // name, after every sequence number), and no trailing digits
            // (kazoo's pattern, ZooKeeper's recipe's number after the last
            // '-').
            for marker in [
                "lock-",
                "latch-",
                "__READ__",
                "__WRIT__",
                "lease-",
                "__lock__",
                "__rlock__",
            ] {
                assert!(!name.contains(marker), "{name} contains {marker}");
            }
            assert!(!name.ends_with(|c: char| c.is_ascii_digit()));
            // Curator sorts it after every sequence number, wrapped ones too.
            assert!(name > "9999999999");
        }
        assert_eq!(value_block_path("/res"), "/res/lockline-value-block");
        assert_eq!(stamp_path("/res"), "/res/lockline-stamp");
        assert!(!reserved("lockline"));
    }

    #[test]
    fn dir_paths_are_absolute() {
        assert_eq!(dir_path("jobs/x"), "/jobs/x");
        assert_eq!(dir_path("/jobs/x"), "/jobs/x");
    }
}
