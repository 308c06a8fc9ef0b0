//! The SQL backend's entry keys (`NAME/ID`, read back from a guard's key
//! before a fenced transaction), the kind labels stored in its rows (by any
//! client with write access to the tables), and the schema and table prefix
//! written into its statements. Input lines: a key, a label, an identifier.
//! Properties: no panic; a key decodes to a name and id that encode back to
//! it; a label decodes to a kind whose label is itself, or to `Foreign`; any
//! (name, id > 0) round-trips; an accepted identifier is `[a-z0-9_]` only and
//! a refused one is `InvalidOptions`.
#![no_main]

#[allow(dead_code)]
#[path = "../../backends/sql/src/layout.rs"]
mod layout;

use libfuzzer_sys::fuzz_target;
use lockline::backend::EntryKind;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.splitn(3, '\n');
    let key = lines.next().unwrap_or_default();
    let label = lines.next().unwrap_or(key);
    let identifier = lines.next().unwrap_or(key);

    // Decode, then encode.
    if let Some((name, id)) = layout::parse_entry_key(key) {
        assert!(id > 0 && !name.is_empty());
        assert_eq!(layout::entry_key(name, id), key, "{key:?} decoded as ({name:?}, {id})");
    }
    let kind = layout::kind_from_label(label);
    if kind == EntryKind::Foreign {
        assert!(!["mutex", "read", "write", "semaphore", "election"].contains(&label));
    } else {
        assert_eq!(layout::kind_label(kind), label);
    }

    // Encode, then decode.
    let id = data
        .iter()
        .fold(1i64, |h, &b| h.rotate_left(7) ^ i64::from(b))
        .checked_abs()
        .unwrap_or(1)
        .max(1);
    if !key.is_empty() {
        for id in [id, 1, i64::MAX] {
            assert_eq!(
                layout::parse_entry_key(&layout::entry_key(key, id)),
                Some((key, id)),
                "{key:?}"
            );
        }
    }
    for (schema, prefix) in [(Some(identifier), ""), (None, identifier)] {
        match layout::Tables::new(schema, prefix) {
            Ok(tables) => {
                let all = format!("{}{}", tables.qualifier, tables.prefix);
                assert!(
                    all.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                    "{all:?}"
                );
            }
            Err(lockline::Error::InvalidOptions { .. }) => {}
            Err(other) => panic!("{identifier:?}: not InvalidOptions: {other:?}"),
        }
    }
});
