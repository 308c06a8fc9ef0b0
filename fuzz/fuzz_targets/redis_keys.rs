//! The Redis layout's keys and labels, as found on a server anyone can write
//! to (redis-py, any client): input lines are a key, an entry's stored kind
//! label and a lock name. Properties: no panic; an entry key decodes to the
//! name and attempt that encode back to it, and has the layout's shape; a
//! label decodes to a kind whose label is itself, or to `Foreign`; a name
//! the backend accepts round-trips through every key of its lock, and its
//! refusal is `InvalidName`.
#![no_main]

#[allow(dead_code)]
#[path = "../../backends/redis/src/layout.rs"]
mod layout;

use libfuzzer_sys::fuzz_target;
use lockline::backend::EntryKind;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.splitn(3, '\n');
    let key = lines.next().unwrap_or_default();
    let label = lines.next().unwrap_or(key);
    let name = lines.next().unwrap_or(key);

    // Decode, then encode.
    let layout_key = layout::is_layout_key(key);
    if let Some((lock, attempt)) = layout::parse_entry_key(key) {
        assert_eq!(layout::entry_key(lock, attempt), key);
        assert!(layout_key, "{key:?}");
    }
    let kind = layout::kind_from_label(label);
    if kind == EntryKind::Foreign {
        assert!(!["mutex", "read", "write", "semaphore", "election"].contains(&label));
    } else {
        assert_eq!(layout::kind_label(kind), label);
    }

    // Encode, then decode.
    match layout::validate_name(name) {
        Ok(()) => {
            let attempt = key;
            assert_eq!(
                layout::parse_entry_key(&layout::entry_key(name, attempt)),
                Some((name, attempt))
            );
            for own in [
                layout::queue(name),
                layout::counter(name),
                layout::joined(name),
                layout::entry_key(name, attempt),
                layout::channel(name, attempt),
            ] {
                assert!(layout::is_layout_key(&own), "{own:?}");
                assert!(own.starts_with(&layout::prefix(name)));
            }
            let blocker = layout::plain_blocker(name);
            assert!(layout::is_plain_blocker(&blocker), "{name:?}");
        }
        Err(lockline::Error::InvalidName { name: refused, .. }) => assert_eq!(refused, name),
        Err(other) => panic!("{name:?}: not InvalidName: {other:?}"),
    }
});
