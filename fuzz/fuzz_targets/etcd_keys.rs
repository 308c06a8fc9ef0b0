//! The etcd layout's decoding of keys found under a lock's prefix, written by
//! anyone (Go's `concurrency`, `etcdctl lock`, the server-side lock API, any
//! client with write access). Input: `DIR\nKEY`, or a bare KEY read under each
//! of its ancestors. Properties: no panic; a key is an entry of at most one of
//! its ancestors (read by position, never by searching for a word); a decoded
//! entry re-encodes to the key it came from and its directory cuts back to
//! `DIR`; every key the layout writes decodes to its kind; markers (and a
//! lock-mode resource's value block and tick keys) are never entries of any
//! lock, beside it or under a marker prefix the backend accepts.
#![no_main]

#[allow(dead_code)]
#[path = "../../backends/etcd/src/layout.rs"]
mod layout;

use libfuzzer_sys::fuzz_target;
use lockline::backend::EntryKind;

struct Kv<'a> {
    key: &'a [u8],
    revision: i64,
    lease: i64,
}

impl layout::Stored for Kv<'_> {
    fn key(&self) -> &[u8] {
        self.key
    }
    fn create_revision(&self) -> i64 {
        self.revision
    }
    fn lease(&self) -> i64 {
        self.lease
    }
}

fn hash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Decodes `key` under `dir`, checking what a decoded entry must satisfy.
fn decode(dir: &str, key: &[u8], revision: i64, lease: i64) -> bool {
    let kv = Kv { key, revision, lease };
    let found = layout::entry(dir, &kv);
    assert_eq!(
        found.is_some(),
        layout::is_entry(dir, key) && revision >= 0,
        "{dir:?} {key:?}"
    );
    let Some(entry) = found else {
        return layout::is_entry(dir, key);
    };
    assert_eq!(entry.key.as_bytes(), key);
    assert_eq!(entry.order, revision);
    assert_eq!(entry.token.get(), revision as u64);
    assert_eq!(layout::dir_of(&entry), dir, "{:?}", entry.key);
    // Re-encoded from its parts, the same key.
    let rest = &entry.key[dir.len() + 1..];
    let again = match entry.kind {
        EntryKind::Mutex => layout::key(dir, EntryKind::Mutex, rest, "unused"),
        kind => {
            let (_, tail) = rest.split_once('/').expect("kind segment");
            let (lease_hex, attempt) = tail.split_once('-').expect("lease-attempt");
            layout::key(dir, kind, lease_hex, attempt)
        }
    };
    assert_eq!(again, entry.key);
    true
}

fuzz_target!(|data: &[u8]| {
    let h = hash(data);
    let revision = (h >> 1) as i64 * if h & 1 == 0 { 1 } else { -1 };
    let lease = (h.rotate_left(17) >> 1) as i64;
    let (dir, key) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (std::str::from_utf8(&data[..at]).ok(), &data[at + 1..]),
        None => (None, data),
    };
    match dir {
        Some(dir) => {
            decode(dir, key, revision, lease);
        }
        None => {
            // Under every ancestor: an entry of one at most.
            let entries = key
                .iter()
                .enumerate()
                .filter(|&(_, &b)| b == b'/')
                .filter_map(|(at, _)| std::str::from_utf8(&key[..at]).ok())
                .filter(|dir| decode(dir, key, revision, lease))
                .count();
            assert!(entries <= 1, "{key:?} is an entry of {entries} locks");
        }
    }

    // Encode, then decode: every key the layout writes for a lock named by
    // the input (a name the core accepts: no control character).
    let Some(dir) = dir.or_else(|| std::str::from_utf8(key).ok()) else {
        return;
    };
    if dir.chars().any(char::is_control) {
        return;
    }
    let lease_hex = format!("{:x}", (h >> (h % 63)) | 1);
    let attempt = format!("{:032x}", u128::from(h) << 64 | u128::from(h.rotate_left(7)));
    for kind in [
        EntryKind::Mutex,
        EntryKind::Election,
        EntryKind::Read,
        EntryKind::Write,
        EntryKind::Semaphore,
        EntryKind::Dlm,
    ] {
        let written = layout::key(dir, kind, &lease_hex, &attempt);
        let entry = layout::entry(
            dir,
            &Kv {
                key: written.as_bytes(),
                revision: 7,
                lease: 1,
            },
        )
        .unwrap_or_else(|| panic!("{written:?} is no entry of {dir:?}"));
        let expected = if kind == EntryKind::Election {
            EntryKind::Mutex
        } else {
            kind
        };
        assert_eq!(entry.kind, expected, "{written:?}");
        assert_eq!(layout::dir_of(&entry), dir);
    }
    // Markers beside the lock: no entry of it or of any lock above it.
    let beside = layout::Markers::BesideEachLock;
    for marker in [
        layout::released(&beside, dir, &lease_hex),
        layout::abandoned(&beside, dir, &lease_hex, &attempt),
        layout::waits_delayed(&beside, dir, &lease_hex),
        layout::block(dir),
        layout::touched(dir, &lease_hex),
    ] {
        assert!(beside.covers(&marker));
        assert!(!layout::is_entry(dir, marker.as_bytes()), "{marker:?}");
        for (at, _) in marker.match_indices('/') {
            assert!(!layout::is_entry(&marker[..at], marker.as_bytes()), "{marker:?}");
        }
    }
    // Under a marker prefix (the input) the backend accepts, the same.
    let under = layout::Markers::Under(dir.to_owned());
    if under.shadowed_lock().is_some() {
        return;
    }
    for marker in [
        layout::released(&under, "", &lease_hex),
        layout::abandoned(&under, "", &lease_hex, &attempt),
        layout::waits_delayed(&under, "", &lease_hex),
    ] {
        assert!(under.covers(&marker));
        // No lock is named "" (a marker prefix starting with '/').
        for (at, _) in marker.match_indices('/').filter(|&(at, _)| at > 0) {
            assert!(
                !layout::is_entry(&marker[..at], marker.as_bytes()),
                "{marker:?} under {dir:?}"
            );
        }
    }
});
