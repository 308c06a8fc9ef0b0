//! The ZooKeeper layout's decoding of a lock directory's children, made by
//! anyone (Curator's recipes, kazoo, ZooKeeper's own lock recipe, any client
//! with write access). Input: one child name a line. Properties: no panic;
//! a recognised node keeps its name, and a Curator node re-encoded from its
//! parts (as ZooKeeper numbers it, `%010d`) decodes the same; the queue holds
//! every recognised node once, other clients' semaphores first; every node
//! the layout writes decodes to its kind, attempt and sequence number.
#![no_main]

#[allow(dead_code)]
#[path = "../../backends/zookeeper/src/layout.rs"]
mod layout;

use libfuzzer_sys::fuzz_target;
use lockline::backend::EntryKind;

const KINDS: [EntryKind; 5] = [
    EntryKind::Mutex,
    EntryKind::Read,
    EntryKind::Write,
    EntryKind::Semaphore,
    EntryKind::Election,
];

/// The name ZooKeeper gives a node created with `prefix` as sequence `n`.
fn sequential(prefix: &str, n: i32) -> String {
    let full = format!("{prefix}{n:010}");
    full.rsplit('/').next().expect("a name").to_owned()
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let children: Vec<String> = text.split('\n').map(str::to_owned).collect();
    for child in &children {
        let Some(found) = layout::parse(child) else { continue };
        assert_eq!(&found.name, child);
        assert_eq!(found.entry("/d").key, format!("/d/{child}"));
        if let Some(attempt) = &found.attempt {
            if !attempt.contains('/') {
                let again = sequential(&layout::node_prefix("/d", found.kind, attempt), found.sequence);
                let reparsed = layout::parse(&again).unwrap_or_else(|| panic!("{again:?}"));
                assert_eq!(
                    (reparsed.kind, reparsed.sequence, reparsed.attempt.as_ref()),
                    (found.kind, found.sequence, Some(attempt)),
                    "{child:?} re-encoded as {again:?}"
                );
            }
        }
    }
    let queue = layout::contenders(&children);
    let recognised = children.iter().filter(|c| layout::parse(c).is_some()).count();
    assert_eq!(queue.len(), recognised);
    let foreign = queue.iter().take_while(|c| c.kind == EntryKind::Foreign).count();
    assert!(queue[foreign..].iter().all(|c| c.kind != EntryKind::Foreign));
    for c in &queue[..foreign] {
        assert!(layout::precedes(c, 0) && layout::precedes(c, i32::MIN));
    }

    // Encode, then decode: the first line as an attempt id (no '/': a node
    // name), every kind, a sequence from the input, as ZooKeeper numbers it.
    let attempt = children[0].replace('/', "");
    let n = data.iter().fold(0i32, |h, &b| h.rotate_left(5) ^ i32::from(b));
    for kind in KINDS {
        for sequence in [n, 0, 1, -1, i32::MAX, i32::MIN] {
            let name = sequential(&layout::node_prefix("/locks/a", kind, &attempt), sequence);
            let c = layout::parse(&name).unwrap_or_else(|| panic!("{name:?} not recognised"));
            assert_eq!(
                (c.kind, c.sequence, c.attempt.as_deref()),
                (kind, sequence, Some(attempt.as_str())),
                "{name:?}"
            );
        }
    }
});
