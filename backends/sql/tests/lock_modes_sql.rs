//! The two primitives lock modes are written over, on PostgreSQL and on
//! MariaDB: `read_queue` (every entry of a name in creation order with its
//! value, version and last write's token, and the name's lock value block,
//! in one statement) and `update_queue` (a conditional, atomic change in
//! one call of a function or procedure), and `watch_value` on a lock-mode
//! entry, which must wake when anyone writes the entry, not only when it
//! is gone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockline::backend::{AppendRequest, BackendSession, Conflicts, Entry, EntryKind, Queue, QueueUpdate, Slot};
use lockline::conformance::{bounded, until};
use lockline::{Client, Session, SessionOptions};
use lockline_sql::Sql;

#[macro_use]
mod support;

use support::db::Db;

on_both!(
    read_queue_gives_every_entry_in_creation_order_with_its_value,
    an_update_applies_when_every_version_holds_and_its_token_rises,
    a_stale_version_fails_the_update_and_writes_nothing,
    a_deleted_entry_fails_the_update,
    a_present_entry_holds_at_any_version,
    entries_of_a_lost_session_fail_the_update,
    another_sessions_entry_keeps_its_owner_when_set,
    the_value_block_round_trips,
    a_watch_wakes_when_another_session_writes_the_entry,
    a_watch_until_goes_past_unwanted_values_of_another_session,
    a_watch_wakes_when_the_owner_writes_or_removes_the_entry,
    a_watch_starts_from_the_sessions_queue_read_only_at_the_value_it_saw,
    a_watch_wakes_when_another_session_deletes_the_entry,
    a_watch_wakes_when_the_owner_is_lost,
    every_watcher_of_an_entry_wakes_on_one_write,
    a_dropped_watch_leaves_no_wait_on_the_server,
    lock_mode_entries_are_abandoned_listed_and_waited_on,
);

/// How long a watch may take to wake: far below anything but a wake (a
/// wait on the server that missed its wake looks again only after a third
/// of the owner's TTL, 10 s here).
const WAKE: Duration = Duration::from_secs(5);

fn options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(30))
}

async fn open(db: &Db) -> Session {
    bounded(
        "open a session",
        Client::new(Sql::new(db.url())).session_with(options()),
    )
    .await
    .expect("session")
}

fn backend(session: &Session) -> &Arc<dyn BackendSession> {
    session.backend_session()
}

static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

async fn append_kind(session: &Session, dir: &str, kind: EntryKind, value: &[u8]) -> Entry {
    let attempt = format!("t{}-{}", ATTEMPTS.fetch_add(1, Ordering::Relaxed), session.id());
    let request = AppendRequest {
        dir,
        kind,
        attempt: &attempt,
        value,
        conflicts: Conflicts::All,
        nearest: 0,
    };
    bounded("append", backend(session).append(&request))
        .await
        .expect("append")
        .entry
}

async fn append(session: &Session, dir: &str, value: &[u8]) -> Entry {
    append_kind(session, dir, EntryKind::Dlm, value).await
}

async fn read(session: &Session, dir: &str) -> Queue {
    bounded("read the queue", backend(session).read_queue(dir))
        .await
        .expect("read the queue")
}

fn slot<'a>(queue: &'a Queue, entry: &Entry) -> &'a Slot {
    queue
        .slots
        .iter()
        .find(|s| s.entry.order == entry.order)
        .unwrap_or_else(|| panic!("{} is not in {queue:?}", entry.key))
}

fn version(queue: &Queue, entry: &Entry) -> i64 {
    slot(queue, entry).version
}

async fn update(session: &Session, update: QueueUpdate<'_>) -> Option<u64> {
    bounded("update the queue", backend(session).update_queue(&update))
        .await
        .expect("update the queue")
}

/// Deletes `entry` from `dir`, on the versions in `unchanged`.
async fn delete(session: &Session, dir: &str, unchanged: &[(&Entry, i64)], entry: &Entry) -> Option<u64> {
    update(
        session,
        QueueUpdate {
            dir,
            unchanged,
            present: &[],
            set: &[],
            delete: &[entry],
            block: None,
        },
    )
    .await
}

/// A change of values (and the block), on the versions `queue` read.
async fn set(
    session: &Session,
    dir: &str,
    queue: &Queue,
    set: &[(&Entry, &[u8])],
    block: Option<&[u8]>,
) -> Option<u64> {
    let unchanged: Vec<(&Entry, i64)> = queue.slots.iter().map(|s| (&s.entry, s.version)).collect();
    update(
        session,
        QueueUpdate {
            dir,
            unchanged: &unchanged,
            present: &[],
            set,
            delete: &[],
            block,
        },
    )
    .await
}

/// Waits until `count` waits are blocked on the server's named locks.
async fn waiting(db: &Db, count: u64) {
    until("the watchers block on the server", || db.locks().waiting >= count).await;
}

/// Reads `dir` until it holds `count` entries: a connection ended on the
/// server lets go of its named locks a moment after the kill returns.
async fn read_until(session: &Session, dir: &str, count: usize) -> Queue {
    bounded("the queue settles", async {
        loop {
            let queue = read(session, dir).await;
            if queue.slots.len() == count {
                return queue;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// Ends `session`'s connection that holds its entries, as a crash or a
/// reset would.
fn cut(db: &Db, session: &Session) {
    let id = session.id();
    if db.is_postgres() {
        db.sql(&format!(
            "SELECT pg_terminate_backend(pid, 5000) FROM lockline_sessions WHERE id = '{id}';"
        ));
    } else {
        let conn = db.sql(&format!("SELECT conn FROM lockline_sessions WHERE id = '{id}'"));
        db.sql(&format!("KILL CONNECTION {}", conn.trim()));
    }
}

async fn read_queue_gives_every_entry_in_creation_order_with_its_value(db: Db) {
    let (a, b) = (open(&db).await, open(&db).await);
    let first = append(&a, "modes/order", b"a1").await;
    let second = append(&b, "modes/order", b"b1").await;
    let third = append(&a, "modes/order", &[0, 255, 7]).await;
    // Another name's entries and another kind's value stay out of it.
    append(&b, "modes/other", b"elsewhere").await;
    let candidate = append_kind(&b, "modes/order", EntryKind::Election, b"proclaimed").await;
    let queue = read(&a, "modes/order").await;
    let keys: Vec<&str> = queue.slots.iter().map(|s| s.entry.key.as_str()).collect();
    assert_eq!(
        keys,
        [&first.key, &second.key, &third.key, &candidate.key].map(String::as_str),
        "creation order"
    );
    let values: Vec<&[u8]> = queue.slots.iter().map(|s| s.value.as_slice()).collect();
    assert_eq!(values, [&b"a1"[..], b"b1", &[0, 255, 7], b""]);
    assert_eq!(queue.slots[0].entry, first);
    assert_eq!(queue.slots[1].entry.owner.as_deref(), Some(b.id()));
    assert_eq!(queue.slots[1].entry.kind, EntryKind::Dlm);
    assert_eq!(queue.slots[3].entry.kind, EntryKind::Election);
    assert_eq!(queue.block, None, "no block was written");
    // Appended entries were written at their creation, in order.
    let changed: Vec<u64> = queue.slots.iter().map(|s| s.changed).collect();
    assert!(changed.windows(2).all(|w| w[0] < w[1]), "{changed:?}");
    assert_eq!(read(&b, "modes/nothing").await, Queue::default());
}

async fn an_update_applies_when_every_version_holds_and_its_token_rises(db: Db) {
    let (a, b) = (open(&db).await, open(&db).await);
    let dir = "modes/apply";
    let holder = append(&a, dir, b"PR granted").await;
    let waiter = append(&b, dir, b"EX waiting").await;
    let before = read(&a, dir).await;
    let highest = before.slots.iter().map(|s| s.changed).max().expect("slots");
    // A waiter marks the holder it waits on, and writes the block.
    let first = set(&b, dir, &before, &[(&holder, b"PR granted, blocking")], Some(b"lvb-1"))
        .await
        .expect("every version held");
    assert!(first > highest, "token {first} not above every changed {highest}");
    let after = read(&b, dir).await;
    let marked = slot(&after, &holder);
    assert_eq!(marked.value, b"PR granted, blocking");
    assert_eq!(marked.changed, first, "a set entry reads back with the update's token");
    assert_ne!(marked.version, version(&before, &holder), "a write changes the version");
    assert_eq!(
        slot(&after, &waiter),
        slot(&before, &waiter),
        "an entry not set is left alone"
    );
    assert_eq!(after.block.as_deref(), Some(&b"lvb-1"[..]));
    // The holder lets go, granting the waiter: its own entry deleted, the
    // waiter's set, in one step.
    let unchanged: Vec<(&Entry, i64)> = after.slots.iter().map(|s| (&s.entry, s.version)).collect();
    let second = update(
        &a,
        QueueUpdate {
            dir,
            unchanged: &unchanged,
            present: &[],
            set: &[(&waiter, b"EX granted")],
            delete: &[&holder],
            block: None,
        },
    )
    .await
    .expect("every version held");
    assert!(second > first, "tokens rise: {first} then {second}");
    let last = read(&b, dir).await;
    assert_eq!(last.slots.len(), 1, "{last:?}");
    assert_eq!(last.slots[0].value, b"EX granted");
    assert_eq!(last.slots[0].changed, second);
    assert_eq!(last.block.as_deref(), Some(&b"lvb-1"[..]), "no block given: left alone");
    assert_eq!(db.entries(), 1, "the holder's row is gone");
    // A later entry's creation is above the tokens before it, and so is
    // the next token.
    let late = append(&a, dir, b"NL").await;
    let queue = read(&a, dir).await;
    assert!(slot(&queue, &late).changed > second);
    let third = set(&a, dir, &queue, &[], None).await.expect("no condition failed");
    assert!(third > slot(&queue, &late).changed && third > second);
    // The entry the holder dropped still answers for a release: its guard
    // went with it.
    assert!(!bounded("remove", backend(&a).remove(&holder)).await.expect("remove"));
}

async fn a_stale_version_fails_the_update_and_writes_nothing(db: Db) {
    let (a, b) = (open(&db).await, open(&db).await);
    let dir = "modes/stale";
    let mine = append(&a, dir, b"mine").await;
    let theirs = append(&b, dir, b"theirs").await;
    let seen = read(&a, dir).await;
    // Someone writes `theirs` after `a` read it.
    set(&b, dir, &seen, &[(&theirs, b"moved on")], None)
        .await
        .expect("applied");
    let now = read(&a, dir).await;
    assert_eq!(
        set(
            &a,
            dir,
            &seen,
            &[(&mine, b"decided on a stale read")],
            Some(b"stale block")
        )
        .await,
        None,
        "a version that moved fails the update"
    );
    let after = read(&a, dir).await;
    assert_eq!(after, now, "a failed update writes nothing");
    assert_eq!(after.block, None);
    // A check of one version alone, with nothing written, fails the same.
    let unchanged = [(&theirs, version(&seen, &theirs))];
    let failed = update(
        &a,
        QueueUpdate {
            dir,
            unchanged: &unchanged,
            present: &[],
            set: &[],
            delete: &[&mine],
            block: None,
        },
    )
    .await;
    assert_eq!(failed, None);
    assert_eq!(read(&a, dir).await, now, "the delete was not applied");
    // On the versions read now, it applies.
    assert!(set(&a, dir, &now, &[(&mine, b"fresh")], None).await.is_some());
}

async fn a_deleted_entry_fails_the_update(db: Db) {
    let (a, b) = (open(&db).await, open(&db).await);
    let dir = "modes/deleted";
    let mine = append(&a, dir, b"mine").await;
    let theirs = append(&b, dir, b"theirs").await;
    let seen = read(&a, dir).await;
    assert!(bounded("remove", backend(&b).remove(&theirs)).await.expect("remove"));
    assert_eq!(
        set(&a, dir, &seen, &[(&mine, b"after a read that had theirs")], Some(b"x")).await,
        None
    );
    let now = read(&a, dir).await;
    assert_eq!(now.slots.len(), 1);
    assert_eq!(now.slots[0].value, b"mine");
    assert_eq!(now.block, None);
    // The same entry, not its name: a newer entry of the same session
    // under the name is another entry.
    let again = append(&b, dir, b"theirs").await;
    assert_ne!(again.key, theirs.key);
    assert_eq!(
        set(&a, dir, &seen, &[(&mine, b"stale")], None).await,
        None,
        "the entry deleted is not its successor"
    );
    // Deleting an entry that is gone already writes the rest.
    let now = read(&a, dir).await;
    let unchanged: Vec<(&Entry, i64)> = now.slots.iter().map(|s| (&s.entry, s.version)).collect();
    let applied = update(
        &a,
        QueueUpdate {
            dir,
            unchanged: &unchanged,
            present: &[],
            set: &[(&mine, b"set")],
            delete: &[&theirs],
            block: None,
        },
    )
    .await;
    assert!(applied.is_some());
    assert_eq!(slot(&read(&a, dir).await, &mine).value, b"set");
}

async fn a_present_entry_holds_at_any_version(db: Db) {
    let (a, b) = (open(&db).await, open(&db).await);
    let dir = "modes/present";
    let holder = append(&a, dir, b"EX granted").await;
    let other = append(&b, dir, b"PR waiting").await;
    let seen = read(&a, dir).await;
    // Another session marks the holder after its read: a release asked
    // only that the entry be there still applies, with its block.
    set(&b, dir, &seen, &[(&holder, b"EX granted, blocking")], None)
        .await
        .expect("applied");
    let held = [&holder];
    let release = |block: &'static [u8]| QueueUpdate {
        dir,
        unchanged: &[],
        present: &held,
        set: &[],
        delete: &held,
        block: Some(block),
    };
    let token = update(&a, release(b"written at release"))
        .await
        .expect("present at any version");
    let after = read(&b, dir).await;
    assert_eq!(after.slots.len(), 1);
    assert_eq!(after.slots[0].entry, other);
    assert_eq!(after.block.as_deref(), Some(&b"written at release"[..]));
    assert!(token > slot(&seen, &other).changed);
    // Gone: the same release fails, and writes nothing.
    assert_eq!(update(&a, release(b"again")).await, None);
    assert_eq!(read(&b, dir).await, after);
    // A dead entry is not there either.
    let c = open(&db).await;
    let doomed = append(&c, dir, b"PR granted").await;
    cut(&db, &c);
    read_until(&b, dir, 1).await;
    let present = [&doomed];
    let failed = update(
        &b,
        QueueUpdate {
            dir,
            unchanged: &[],
            present: &present,
            set: &[(&other, b"PR granted")],
            delete: &[],
            block: None,
        },
    )
    .await;
    assert_eq!(failed, None);
    assert_eq!(slot(&read(&b, dir).await, &other).value, b"PR waiting");
}

async fn entries_of_a_lost_session_fail_the_update(db: Db) {
    let (a, b) = (open(&db).await, open(&db).await);
    let dir = "modes/lost";
    let mine = append(&a, dir, b"mine").await;
    let theirs = append(&b, dir, b"theirs").await;
    let seen = read(&a, dir).await;
    assert_eq!(seen.slots.len(), 2);
    cut(&db, &b);
    // Its guard went with its connection: the entry is gone for every read,
    // and a condition on it fails.
    let now = read_until(&a, dir, 1).await;
    assert_eq!(now.slots[0].entry, mine);
    assert_eq!(set(&a, dir, &seen, &[(&mine, b"granted")], None).await, None);
    assert_eq!(slot(&read(&a, dir).await, &mine).value, b"mine");
    // An update on what is there now applies, and deletes the dead row
    // (waiting for a fenced commit of its owner in flight).
    assert!(set(&a, dir, &now, &[(&mine, b"granted")], None).await.is_some());
    assert_eq!(db.entries(), 1, "the dead entry's row is gone");
    // The lost session's own update fails too (its connection is gone).
    let unchanged = [(&theirs, version(&seen, &theirs))];
    let result = bounded(
        "update on a lost session",
        backend(&b).update_queue(&QueueUpdate {
            dir,
            unchanged: &unchanged,
            present: &[],
            set: &[(&theirs, b"still mine?")],
            delete: &[],
            block: None,
        }),
    )
    .await;
    assert!(
        !matches!(result, Ok(Some(_))),
        "a lost session's entry was written: {result:?}"
    );
}

async fn another_sessions_entry_keeps_its_owner_when_set(db: Db) {
    let (a, b) = (open(&db).await, open(&db).await);
    let dir = "modes/owner";
    let theirs = append(&b, dir, b"theirs").await;
    let seen = read(&a, dir).await;
    set(&a, dir, &seen, &[(&theirs, b"marked by a")], None)
        .await
        .expect("applied");
    let now = read(&a, dir).await;
    assert_eq!(now.slots[0].entry.owner.as_deref(), Some(b.id()), "the owner stays");
    assert_eq!(now.slots[0].entry, theirs);
    assert_eq!(now.slots[0].value, b"marked by a");
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM lockline_entries WHERE session = '{}'",
            b.id()
        )),
        1
    );
    // Still bound to its owner's session: it goes when that session ends,
    // and when its connection does.
    bounded("close", b.close()).await.expect("close");
    assert_eq!(read(&a, dir).await.slots.len(), 0);
    let c = open(&db).await;
    let later = append(&c, dir, b"c").await;
    let seen = read(&a, dir).await;
    set(&a, dir, &seen, &[(&later, b"marked")], None)
        .await
        .expect("applied");
    cut(&db, &c);
    read_until(&a, dir, 0).await;
}

async fn the_value_block_round_trips(db: Db) {
    let a = open(&db).await;
    let dir = "modes/block";
    let mut block: Vec<u8> = (0..=255u8).collect();
    block.extend(std::iter::repeat_n(0xa5, 1024));
    let none = Queue::default();
    set(&a, dir, &none, &[], Some(&block)).await.expect("applied");
    assert_eq!(read(&a, dir).await.block, Some(block.clone()));
    // Not listed as an entry, and left alone by an update that gives none.
    let holder = append(&a, dir, b"PW").await;
    let queue = read(&a, dir).await;
    assert_eq!(queue.slots.len(), 1);
    set(&a, dir, &queue, &[(&holder, b"PW released")], None)
        .await
        .expect("applied");
    assert_eq!(read(&a, dir).await.block, Some(block));
    // An empty block is a block.
    let queue = read(&a, dir).await;
    set(&a, dir, &queue, &[], Some(b"")).await.expect("applied");
    assert_eq!(read(&a, dir).await.block, Some(Vec::new()));
    // Per name.
    assert_eq!(read(&a, "modes/block2").await.block, None);
    assert_eq!(read(&a, "modes/bloc").await.block, None);
}

/// Watches `entry` from `session` in a task, as seen in `value`.
fn watch(session: &Session, entry: &Entry, value: &[u8]) -> tokio::task::JoinHandle<lockline::Result<Option<Vec<u8>>>> {
    let backend = Arc::clone(backend(session));
    let (entry, value) = (entry.clone(), value.to_vec());
    tokio::spawn(async move { backend.watch_value(&entry, &value).await })
}

async fn woken(watch: tokio::task::JoinHandle<lockline::Result<Option<Vec<u8>>>>) -> Option<Vec<u8>> {
    tokio::time::timeout(WAKE, watch)
        .await
        .expect("the watch did not wake")
        .expect("the watch task")
        .expect("the watch")
}

async fn a_watch_wakes_when_another_session_writes_the_entry(db: Db) {
    let (owner, watcher, writer) = (open(&db).await, open(&db).await, open(&db).await);
    let dir = "modes/watch-other";
    let entry = append(&owner, dir, b"PR granted").await;
    let watching = watch(&watcher, &entry, b"PR granted");
    waiting(&db, 1).await;
    let seen = read(&writer, dir).await;
    set(&writer, dir, &seen, &[(&entry, b"PR granted, blocking")], None)
        .await
        .expect("applied");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"PR granted, blocking"[..]));
    // The owner's own watch of its entry (it learns it is wanted).
    let watching = watch(&owner, &entry, b"PR granted, blocking");
    waiting(&db, 1).await;
    let seen = read(&writer, dir).await;
    set(&writer, dir, &seen, &[(&entry, b"PR granted, wanted twice")], None)
        .await
        .expect("applied");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"PR granted, wanted twice"[..]));
    // A value already moved on answers at once.
    let watching = watch(&watcher, &entry, b"PR granted");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"PR granted, wanted twice"[..]));
}

/// `watch_value_until` answers only a value its filter wants (or the
/// entry's removal). On PostgreSQL the notice of another session's write
/// carries the value, and the watcher goes on waiting on the same
/// statement: its wait's start stays where it was.
async fn a_watch_until_goes_past_unwanted_values_of_another_session(db: Db) {
    let (owner, watcher, writer) = (open(&db).await, open(&db).await, open(&db).await);
    let dir = "modes/watch-until";
    let entry = append(&owner, dir, b"start").await;
    let marker_dir = "modes/watch-until-marker";
    let marker = append(&owner, marker_dir, b"start").await;
    let watch_until = |dir: &'static str, entry: &Entry, wanted: fn(&[u8]) -> bool| {
        let backend = Arc::clone(backend(&watcher));
        let entry = entry.clone();
        tokio::spawn(async move {
            let seen = bounded("read the entry", backend.read_queue(dir)).await.expect("read");
            let value = slot(&seen, &entry).value.clone();
            backend.watch_value_until(&entry, &value, &wanted).await
        })
    };
    let watching = watch_until(dir, &entry, |v| v.starts_with(b"wanted"));
    waiting(&db, 1).await;
    // A second watch of the same session, of another entry: its notices
    // come on the same listening connection, after those sent before them.
    let marked = watch_until(marker_dir, &marker, |v| v != b"start");
    waiting(&db, 2).await;
    // The wait statements in flight, by connection and start.
    let started = |db: &Db| -> std::collections::BTreeSet<String> {
        db.sql(
            "SELECT pid || ' ' || query_start FROM pg_stat_activity WHERE query LIKE '%lockline_watch%' \
             AND state = 'active' AND pid <> pg_backend_pid();",
        )
        .lines()
        .map(str::to_owned)
        .collect()
    };
    let before = db.is_postgres().then(|| started(&db));
    for value in [&b"unwanted-1"[..], b"unwanted-2"] {
        let seen = read(&writer, dir).await;
        set(&writer, dir, &seen, &[(&entry, value)], None)
            .await
            .expect("applied");
    }
    // Once the marker's write, sent after both, has answered its watch, the
    // watcher has been told of both unwanted values.
    let seen = read(&writer, marker_dir).await;
    set(&writer, marker_dir, &seen, &[(&marker, b"go")], None)
        .await
        .expect("applied");
    assert_eq!(woken(marked).await.as_deref(), Some(&b"go"[..]));
    assert!(!watching.is_finished(), "an unwanted value answered the watch");
    if let Some(before) = before {
        // On PostgreSQL the notices carried the values: the first watch
        // went on waiting on the statement it had.
        // (The marker's wait, answered by its notice, is being cancelled.)
        until("one wait statement left", || started(&db).len() == 1).await;
        let now = started(&db);
        assert!(
            now.is_subset(&before),
            "the wait was made again for a value the watcher does not want: {now:?}, before {before:?}"
        );
    }
    let seen = read(&writer, dir).await;
    set(&writer, dir, &seen, &[(&entry, b"wanted")], None)
        .await
        .expect("applied");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"wanted"[..]));
    // A removal answers whatever the filter.
    let watching = watch_until(dir, &entry, |_| false);
    waiting(&db, 1).await;
    let seen = read(&writer, dir).await;
    let unchanged: Vec<(&Entry, i64)> = seen.slots.iter().map(|s| (&s.entry, s.version)).collect();
    delete(&writer, dir, &unchanged, &entry).await.expect("deleted");
    assert_eq!(woken(watching).await, None);
}

async fn a_watch_wakes_when_the_owner_writes_or_removes_the_entry(db: Db) {
    let (owner, watcher, marker) = (open(&db).await, open(&db).await, open(&db).await);
    let dir = "modes/watch-owner";
    let entry = append(&owner, dir, b"EX").await;
    // Written by another session first: the owner's value lock stays
    // where it was, and its next write still moves it.
    let seen = read(&marker, dir).await;
    set(&marker, dir, &seen, &[(&entry, b"EX granted")], None)
        .await
        .expect("applied");
    let watching = watch(&watcher, &entry, b"EX granted");
    waiting(&db, 1).await;
    // A down-conversion by the holder itself.
    let seen = read(&owner, dir).await;
    set(&owner, dir, &seen, &[(&entry, b"PR granted")], None)
        .await
        .expect("applied");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"PR granted"[..]));
    // Twice: the owner holds the lock of the new version.
    let watching = watch(&watcher, &entry, b"PR granted");
    waiting(&db, 1).await;
    let seen = read(&owner, dir).await;
    set(&owner, dir, &seen, &[(&entry, b"NL granted")], None)
        .await
        .expect("applied");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"NL granted"[..]));
    // Its release by an update.
    let watching = watch(&watcher, &entry, b"NL granted");
    waiting(&db, 1).await;
    let seen = read(&owner, dir).await;
    let unchanged = [(&entry, version(&seen, &entry))];
    delete(&owner, dir, &unchanged, &entry).await.expect("applied");
    assert_eq!(woken(watching).await, None);
    // And by a plain removal.
    let entry = append(&owner, dir, b"CR granted").await;
    let watching = watch(&watcher, &entry, b"CR granted");
    waiting(&db, 1).await;
    assert!(bounded("remove", backend(&owner).remove(&entry)).await.expect("remove"));
    assert_eq!(woken(watching).await, None);
    until("no wait is left on the server", || db.locks().waiting == 0).await;
}

/// A watch of an entry whose value is the one the session's last queue
/// read saw starts its wait where that read found the entry, with no read
/// of its own: a change since (by the owner, or by another session, even
/// one that wrote the same value back) is still answered or watched past,
/// never missed; and a watch as seen elsewhere (a value other than the
/// read's) does not start from the read at all, so it never answers the
/// read's older value.
async fn a_watch_starts_from_the_sessions_queue_read_only_at_the_value_it_saw(db: Db) {
    let (owner, watcher, writer) = (open(&db).await, open(&db).await, open(&db).await);
    let dir = "modes/watch-after-read";
    let entry = append(&owner, dir, b"PR granted").await;
    // The read the watch starts from, then a write of the owner since.
    let _ = read(&watcher, dir).await;
    let seen = read(&owner, dir).await;
    set(&owner, dir, &seen, &[(&entry, b"EX granted")], None)
        .await
        .expect("applied");
    let watching = watch(&watcher, &entry, b"PR granted");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"EX granted"[..]));
    // The session read "EX granted"; the watcher has seen a later value.
    let _ = read(&watcher, dir).await;
    let seen = read(&owner, dir).await;
    set(&owner, dir, &seen, &[(&entry, b"CR granted")], None)
        .await
        .expect("applied");
    let watching = watch(&watcher, &entry, b"CR granted");
    waiting(&db, 1).await;
    assert!(!watching.is_finished(), "answered a value older than the one seen");
    let seen = read(&owner, dir).await;
    set(&owner, dir, &seen, &[(&entry, b"NL granted")], None)
        .await
        .expect("applied");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"NL granted"[..]));
    // Another session writes it twice since the read, back to the value
    // the read saw: watched past, and the removal answers.
    let _ = read(&watcher, dir).await;
    for value in [&b"NL granted, blocking"[..], &b"NL granted"[..]] {
        let seen = read(&writer, dir).await;
        set(&writer, dir, &seen, &[(&entry, value)], None)
            .await
            .expect("applied");
    }
    let watching = watch(&watcher, &entry, b"NL granted");
    waiting(&db, 1).await;
    assert!(!watching.is_finished(), "answered a value it had seen");
    let seen = read(&owner, dir).await;
    let unchanged = [(&entry, version(&seen, &entry))];
    delete(&owner, dir, &unchanged, &entry).await.expect("applied");
    assert_eq!(woken(watching).await, None);
    until("no wait is left on the server", || db.locks().waiting == 0).await;
}

async fn a_watch_wakes_when_another_session_deletes_the_entry(db: Db) {
    let (owner, watcher, deleter) = (open(&db).await, open(&db).await, open(&db).await);
    let dir = "modes/watch-deleted";
    let entry = append(&owner, dir, b"granted").await;
    let watching = watch(&watcher, &entry, b"granted");
    waiting(&db, 1).await;
    let seen = read(&deleter, dir).await;
    let unchanged = [(&entry, version(&seen, &entry))];
    delete(&deleter, dir, &unchanged, &entry).await.expect("applied");
    assert_eq!(woken(watching).await, None);
    // By a plain removal from another session too.
    let entry = append(&owner, dir, b"granted").await;
    let watching = watch(&watcher, &entry, b"granted");
    waiting(&db, 1).await;
    assert!(bounded("remove", backend(&deleter).remove(&entry))
        .await
        .expect("remove"));
    assert_eq!(woken(watching).await, None);
}

async fn a_watch_wakes_when_the_owner_is_lost(db: Db) {
    let (owner, watcher) = (open(&db).await, open(&db).await);
    let dir = "modes/watch-lost";
    let entry = append(&owner, dir, b"EX granted").await;
    let watching = watch(&watcher, &entry, b"EX granted");
    waiting(&db, 1).await;
    cut(&db, &owner);
    assert_eq!(woken(watching).await, None);
}

async fn every_watcher_of_an_entry_wakes_on_one_write(db: Db) {
    let owner = open(&db).await;
    let writer = open(&db).await;
    let dir = "modes/watch-many";
    let entry = append(&owner, dir, b"EX granted").await;
    let mut watchers = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(open(&db).await);
    }
    for session in &sessions {
        watchers.push(watch(session, &entry, b"EX granted"));
        watchers.push(watch(session, &entry, b"EX granted"));
    }
    waiting(&db, 6).await;
    let seen = read(&writer, dir).await;
    set(&writer, dir, &seen, &[(&entry, b"EX granted, 6 waiting")], None)
        .await
        .expect("applied");
    for watching in watchers {
        assert_eq!(woken(watching).await.as_deref(), Some(&b"EX granted, 6 waiting"[..]));
    }
    until("no wait is left on the server", || db.locks().waiting == 0).await;
}

async fn a_dropped_watch_leaves_no_wait_on_the_server(db: Db) {
    let (owner, watcher) = (open(&db).await, open(&db).await);
    let dir = "modes/watch-dropped";
    let entry = append(&owner, dir, b"granted").await;
    let held = db.locks().held;
    let watching = watch(&watcher, &entry, b"granted");
    waiting(&db, 1).await;
    watching.abort();
    until("the dropped watch's wait ends on the server", || {
        let locks = db.locks();
        locks.waiting == 0 && locks.held == held
    })
    .await;
    // The session watches again, and wakes.
    let watching = watch(&watcher, &entry, b"granted");
    waiting(&db, 1).await;
    let seen = read(&owner, dir).await;
    set(&owner, dir, &seen, &[(&entry, b"converted")], None)
        .await
        .expect("applied");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"converted"[..]));
}

async fn lock_mode_entries_are_abandoned_listed_and_waited_on(db: Db) {
    let (a, b) = (open(&db).await, open(&db).await);
    let dir = "modes/kinds";
    let holder = append(&a, dir, b"EX").await;
    let listed = bounded("list", backend(&b).list(dir)).await.expect("list");
    assert_eq!(listed, std::slice::from_ref(&holder));
    assert_eq!(listed[0].kind, EntryKind::Dlm);
    assert_eq!(
        bounded("get", backend(&b).get_value(&holder)).await.expect("get"),
        Some(b"EX".to_vec())
    );
    let attempt = "abandoned-attempt";
    let request = AppendRequest {
        dir,
        kind: EntryKind::Dlm,
        attempt,
        value: b"PR",
        conflicts: Conflicts::All,
        nearest: 0,
    };
    bounded("append", backend(&b).append(&request)).await.expect("append");
    bounded("abandon", backend(&b).abandon(dir, EntryKind::Dlm, attempt))
        .await
        .expect("abandon");
    assert_eq!(read(&a, dir).await.slots.len(), 1);
    let gone = {
        let backend = Arc::clone(backend(&b));
        let holder = holder.clone();
        tokio::spawn(async move { backend.wait_gone(&holder).await })
    };
    waiting(&db, 1).await;
    assert!(bounded("remove", backend(&a).remove(&holder)).await.expect("remove"));
    tokio::time::timeout(WAKE, gone)
        .await
        .expect("wait_gone woke")
        .expect("task")
        .expect("wait_gone");
    until("no lock but the sessions' own", || db.locks().waiting == 0).await;
    assert_eq!(db.entries(), 0);
}

/// PostgreSQL: the connection that hears of other sessions' writes is made
/// again when it ends, and its watchers read their entries again, so a
/// write meanwhile is not missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_its_listening_connections_end() {
    let db = Db::postgres();
    let (owner, watcher, writer) = (open(&db).await, open(&db).await, open(&db).await);
    let dir = "modes/listener";
    let entry = append(&owner, dir, b"PR granted").await;
    let watching = watch(&watcher, &entry, b"PR granted");
    waiting(&db, 1).await;
    let listening = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lockline notices'";
    until("the watcher listens", || db.count(listening) == 1).await;
    db.sql("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = 'lockline notices';");
    let seen = read(&writer, dir).await;
    set(&writer, dir, &seen, &[(&entry, b"PR granted, blocking")], None)
        .await
        .expect("applied");
    assert_eq!(woken(watching).await.as_deref(), Some(&b"PR granted, blocking"[..]));
    // And it hears the next write on the connection made again.
    let watching = watch(&watcher, &entry, b"PR granted, blocking");
    waiting(&db, 1).await;
    until("the watcher listens again", || db.count(listening) == 1).await;
    let seen = read(&writer, dir).await;
    set(&writer, dir, &seen, &[(&entry, b"PR granted, blocked twice")], None)
        .await
        .expect("applied");
    assert_eq!(
        woken(watching).await.as_deref(),
        Some(&b"PR granted, blocked twice"[..])
    );
}
