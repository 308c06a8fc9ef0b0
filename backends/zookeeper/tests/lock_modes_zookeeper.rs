//! The lock-mode primitives on a real ZooKeeper: `read_queue` (one
//! consistent multi-read of the queue and its value block) and
//! `update_queue` (one conditional `multi` whose zxid is the token), with the
//! other primitives on `_c_<attempt>-dlm-<seq>` entries.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lockline::backend::{AppendRequest, BackendSession, Conflicts, Entry, EntryKind, Queue, QueueUpdate, WAITING_EX};
use lockline::conformance::bounded;
use lockline::{Client, Error, Session};
use lockline_testkit::{TcpProxy, ZkEnsemble};
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

use support::{children, side_client};

/// ZooKeeper's opcodes for a `multi` and a multi-read.
const MULTI: i32 = 14;
const MULTI_READ: i32 = 22;
/// ZooKeeper's opcode for a `getData`.
const GET_DATA: i32 = 4;
/// What the session's own keepalive sends on its own schedule.
const PING: i32 = 11;
const SYNC: i32 = 9;

/// The requests sent through `proxy` since `before`, by opcode, but those
/// the session's keepalive sends on its own schedule.
fn requests_since(proxy: &TcpProxy, before: &lockline_testkit::ZkCounts) -> std::collections::BTreeMap<i32, u64> {
    let mut counts = proxy.zk_counts().since(before);
    counts.requests.remove(&PING);
    counts.requests.remove(&SYNC);
    counts.requests
}

async fn session(ensemble: &ZkEnsemble) -> Session {
    Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session()
        .await
        .expect("session")
}

fn remote(session: &Session) -> &Arc<dyn BackendSession> {
    session.backend_session()
}

async fn append(session: &Session, dir: &str, attempt: &str, value: &[u8]) -> Entry {
    let request = AppendRequest {
        dir,
        kind: EntryKind::Dlm,
        attempt,
        value,
        conflicts: Conflicts::All,
        nearest: 0,
    };
    bounded("append", remote(session).append(&request))
        .await
        .expect("append")
        .entry
}

async fn read(session: &Session, dir: &str) -> Queue {
    bounded("read_queue", remote(session).read_queue(dir))
        .await
        .expect("read_queue")
}

/// Applies an update; `None` when a condition failed.
async fn update(
    session: &Session,
    dir: &str,
    unchanged: &[(&Entry, i64)],
    set: &[(&Entry, &[u8])],
    delete: &[&Entry],
    block: Option<&[u8]>,
) -> Option<u64> {
    let update = QueueUpdate {
        dir,
        unchanged,
        present: &[],
        set,
        delete,
        block,
    };
    bounded("update_queue", remote(session).update_queue(&update))
        .await
        .expect("update_queue")
}

/// The version `queue` gives `entry`.
fn version(queue: &Queue, entry: &Entry) -> i64 {
    slot(queue, entry).version
}

fn slot<'a>(queue: &'a Queue, entry: &Entry) -> &'a lockline::backend::Slot {
    queue
        .slots
        .iter()
        .find(|s| s.entry.key == entry.key)
        .unwrap_or_else(|| panic!("{} not in the queue", entry.key))
}

fn keys(queue: &Queue) -> Vec<&str> {
    queue.slots.iter().map(|s| s.entry.key.as_str()).collect()
}

fn highest_changed(queue: &Queue) -> u64 {
    queue.slots.iter().map(|s| s.changed).max().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_queue_gives_every_entry_in_creation_order_with_its_value_and_stat() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    let a = session(&ensemble).await;
    let b = session(&ensemble).await;
    let reader = session(&ensemble).await;
    let first = append(&a, "res/order", "a1", b"first").await;
    let second = append(&b, "res/order", "b1", b"second").await;
    let third = append(&a, "res/order", "a2", b"third").await;
    assert!(first.key.starts_with("/res/order/_c_a1-dlm-"), "{}", first.key);

    // A session that never looked at the resource, and the ones that did.
    for session in [&reader, &a, &b] {
        let queue = read(session, "res/order").await;
        assert_eq!(keys(&queue), [&first.key, &second.key, &third.key]);
        let values: Vec<&[u8]> = queue.slots.iter().map(|s| s.value.as_slice()).collect();
        assert_eq!(values, [&b"first"[..], b"second", b"third"]);
        assert_eq!(queue.block, None);
        for (slot, (entry, owner)) in queue.slots.iter().zip([(&first, &a), (&second, &b), (&third, &a)]) {
            assert_eq!(slot.entry.kind, EntryKind::Dlm);
            assert_eq!(slot.entry.order, entry.order);
            assert_eq!(slot.entry.token, entry.token, "the token is the czxid");
            assert_eq!(slot.entry.owner.as_deref(), Some(owner.id()));
            assert_eq!(slot.version, 0);
            // A fresh entry was last written when it was created.
            assert_eq!(slot.changed, entry.token.get());
            let (_, stat) = side.get_data(&entry.key).await.expect("stat");
            assert_eq!(
                (slot.version, slot.changed),
                (i64::from(stat.version), stat.mzxid as u64)
            );
        }
    }
    // `list` agrees, and knows the kind.
    let listed = remote(&reader).list("res/order").await.expect("list");
    assert_eq!(
        listed.iter().map(|e| (e.key.as_str(), e.kind)).collect::<Vec<_>>(),
        [
            (first.key.as_str(), EntryKind::Dlm),
            (second.key.as_str(), EntryKind::Dlm),
            (third.key.as_str(), EntryKind::Dlm)
        ]
    );
    // An empty name: no entries, no block.
    assert_eq!(read(&reader, "res/nothing").await, Queue::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_recipes_entries_are_listed_with_an_empty_value() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    let a = session(&ensemble).await;
    let dlm = append(&a, "res/mixed", "a1", b"state").await;
    // A kazoo-named contender with data, made by hand.
    let (_, sequence) = side
        .create(
            "/res/mixed/f00d__lock__",
            b"kazoo's identifier",
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("create a kazoo node");
    let queue = read(&a, "res/mixed").await;
    assert_eq!(queue.slots.len(), 2);
    assert_eq!(queue.slots[0].entry.key, dlm.key);
    assert_eq!(queue.slots[0].value, b"state");
    assert_eq!(queue.slots[1].entry.key, format!("/res/mixed/f00d__lock__{sequence}"));
    assert_eq!(queue.slots[1].entry.kind, EntryKind::Mutex);
    assert!(queue.slots[1].value.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_applies_only_at_the_versions_read() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let a = session(&ensemble).await;
    let b = session(&ensemble).await;
    let first = append(&a, "res/cas", "a1", b"a:wait").await;
    let second = append(&b, "res/cas", "b1", b"b:wait").await;
    let before = read(&a, "res/cas").await;
    let (v1, v2) = (version(&before, &first), version(&before, &second));

    let token = update(
        &a,
        "res/cas",
        &[(&first, v1), (&second, v2)],
        &[(&first, b"a:granted")],
        &[],
        None,
    )
    .await
    .expect("applied at the versions read");
    let after = read(&b, "res/cas").await;
    assert_eq!(slot(&after, &first).value, b"a:granted");
    assert_eq!(slot(&after, &first).changed, token);
    assert_ne!(version(&after, &first), v1, "a write changes the version");
    assert_eq!(version(&after, &second), v2, "a check does not");

    // The same update from the stale read: a condition fails, nothing is
    // written (not the other entry's value, not the block).
    assert_eq!(
        update(
            &b,
            "res/cas",
            &[(&first, v1), (&second, v2)],
            &[(&second, b"b:granted")],
            &[],
            Some(b"block"),
        )
        .await,
        None
    );
    // A stale version on an entry that is only checked fails it too.
    assert_eq!(
        update(
            &b,
            "res/cas",
            &[(&second, v2), (&first, v1)],
            &[(&second, b"b:granted")],
            &[],
            None,
        )
        .await,
        None
    );
    assert_eq!(read(&a, "res/cas").await, after);
    // A version no node can have.
    assert_eq!(
        update(&b, "res/cas", &[(&second, i64::MAX)], &[(&second, b"x")], &[], None).await,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_present_entry_may_be_at_any_version_but_must_exist() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let holder = session(&ensemble).await;
    let waiter = session(&ensemble).await;
    let held = append(&holder, "res/present", "h1", b"h:EX").await;
    let waiting = append(&waiter, "res/present", "w1", b"w:EX").await;
    let queue = read(&waiter, "res/present").await;
    // The waiter marks the holder after the holder's last read.
    update(
        &waiter,
        "res/present",
        &[(&held, version(&queue, &held)), (&waiting, version(&queue, &waiting))],
        &[(&held, b"h:EX:blocking")],
        &[],
        None,
    )
    .await
    .expect("marked");
    // The holder's down-conversion: whatever the version, while it exists.
    let present = |set: &'static [u8], delete: bool, block: Option<&'static [u8]>| {
        let remote = Arc::clone(remote(&holder));
        let entry = held.clone();
        async move {
            let entries = [&entry];
            let sets = [(&entry, set)];
            let update = QueueUpdate {
                dir: "res/present",
                unchanged: &[],
                present: &entries,
                set: if delete { &[] } else { &sets },
                delete: if delete { &entries } else { &[] },
                block,
            };
            bounded("update_queue", remote.update_queue(&update))
                .await
                .expect("update_queue")
        }
    };
    let token = present(b"h:PR", false, None).await.expect("applied");
    let queue = read(&waiter, "res/present").await;
    assert_eq!(slot(&queue, &held).value, b"h:PR");
    assert_eq!(slot(&queue, &held).changed, token);
    // Its release with a value block.
    let released = present(b"", true, Some(b"lvb")).await.expect("released");
    assert!(released > token);
    let queue = read(&waiter, "res/present").await;
    assert_eq!(keys(&queue), [&waiting.key]);
    assert_eq!(queue.block.as_deref(), Some(&b"lvb"[..]));
    // Gone: the condition fails.
    assert_eq!(present(b"h:NL", false, None).await, None);
    assert_eq!(present(b"", true, Some(b"other")).await, None);
    assert_eq!(read(&waiter, "res/present").await.block.as_deref(), Some(&b"lvb"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_fails_on_a_deleted_entry() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    let a = session(&ensemble).await;
    let b = session(&ensemble).await;
    let first = append(&a, "res/gone", "a1", b"a").await;
    let second = append(&b, "res/gone", "b1", b"b").await;
    let queue = read(&b, "res/gone").await;
    let (v1, v2) = (version(&queue, &first), version(&queue, &second));
    assert!(remote(&a).remove(&first).await.expect("remove"));
    assert_eq!(
        update(
            &b,
            "res/gone",
            &[(&first, v1), (&second, v2)],
            &[(&second, b"b:granted")],
            &[],
            Some(b"block"),
        )
        .await,
        None
    );
    // Deleting it again fails the same way.
    assert_eq!(
        update(&b, "res/gone", &[(&first, v1)], &[], &[&first], None).await,
        None
    );
    let queue = read(&b, "res/gone").await;
    assert_eq!(keys(&queue), [&second.key]);
    assert_eq!(queue.slots[0].value, b"b");
    assert_eq!(queue.block, None);
    assert_eq!(children(&side, "/res/gone").await.len(), 1, "nothing created");
}

/// Every client reaches the server through its own proxy, so that a
/// session can be expired without its client winning it back first.
struct Proxied {
    ensemble: ZkEnsemble,
    proxy: TcpProxy,
}

impl Proxied {
    fn start() -> Self {
        let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
        let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
        Proxied { ensemble, proxy }
    }

    async fn session(&self) -> Session {
        Client::new(ZooKeeper::new(self.proxy.address()))
            .session()
            .await
            .expect("session")
    }

    /// Cuts the proxied clients off, ends `victim`'s session from a
    /// connection of its own (attach with its id and password, close),
    /// and lets the clients back.
    async fn expire(&self, victim: &Session) {
        let info = lockline_zookeeper::session_info(victim).expect("a live ZooKeeper session");
        self.proxy.block();
        let mut closed = false;
        for _ in 0..20 {
            let attached = zk::Client::connector()
                .with_session(info.clone())
                .with_connection_timeout(Duration::from_secs(2))
                .connect(&self.ensemble.connect_string())
                .await;
            match attached {
                Ok(client) => drop(client),
                Err(zk::Error::SessionExpired) => {
                    closed = true;
                    break;
                }
                Err(_) => {}
            }
        }
        self.proxy.unblock();
        assert!(closed, "could not end session {}", victim.id());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_fails_once_the_owner_session_is_lost() {
    let fixture = Proxied::start();
    let a = fixture.session().await;
    let b = session(&fixture.ensemble).await;
    let first = append(&a, "res/lost", "a1", b"a:granted").await;
    let second = append(&b, "res/lost", "b1", b"b:wait").await;
    let queue = read(&a, "res/lost").await;
    let (v1, v2) = (version(&queue, &first), version(&queue, &second));
    fixture.expire(&a).await;

    // Another session: the lost session's entry is gone, the condition fails.
    assert_eq!(
        update(
            &b,
            "res/lost",
            &[(&first, v1), (&second, v2)],
            &[(&first, b"a:wanted")],
            &[],
            None,
        )
        .await,
        None
    );
    // The lost session itself writes nothing: its entries are gone and it
    // sends nothing once it knows.
    bounded("a learns it is lost", a.lost()).await;
    let own = remote(&a)
        .update_queue(&QueueUpdate {
            dir: "res/lost",
            unchanged: &[(&first, v1)],
            present: &[],
            set: &[(&first, b"a:converting")],
            delete: &[],
            block: Some(b"block"),
        })
        .await;
    assert!(matches!(own, Ok(None) | Err(Error::SessionLost { .. })), "{own:?}");
    let queue = read(&b, "res/lost").await;
    assert_eq!(keys(&queue), [&second.key]);
    assert_eq!(queue.block, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_of_another_sessions_entries_keep_their_owner() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    let holder = session(&ensemble).await;
    let waiter = session(&ensemble).await;
    let held = append(&holder, "res/mark", "h1", b"holder:EX:granted").await;
    let waiting = append(&waiter, "res/mark", "w1", b"waiter:PR").await;
    let queue = read(&waiter, "res/mark").await;
    // The waiter marks the holder it waits on (a blocking notification).
    let token = update(
        &waiter,
        "res/mark",
        &[(&held, version(&queue, &held)), (&waiting, version(&queue, &waiting))],
        &[(&held, b"holder:EX:granted:blocking")],
        &[],
        None,
    )
    .await
    .expect("applied");
    let (data, stat) = side.get_data(&held.key).await.expect("the holder's node");
    assert_eq!(data, b"holder:EX:granted:blocking");
    assert_eq!(stat.mzxid as u64, token);
    assert_eq!(
        format!("{:x}", stat.ephemeral_owner),
        holder.id(),
        "still the holder's ephemeral node"
    );
    let queue = read(&waiter, "res/mark").await;
    assert_eq!(slot(&queue, &held).entry.owner.as_deref(), Some(holder.id()));

    // It still goes with its owner's session.
    let (_, _, gone) = side.get_and_watch_data(&held.key).await.expect("watch");
    holder.close().await.expect("close");
    bounded("the holder's node goes", gone.changed()).await;
    assert_eq!(keys(&read(&waiter, "res/mark").await), [&waiting.key]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_above_everything_seen_whatever_the_update_writes() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    let a = session(&ensemble).await;
    let b = session(&ensemble).await;
    let x = append(&a, "res/tokens", "x", b"x0").await;
    let y = append(&b, "res/tokens", "y", b"y0").await;
    let z = append(&b, "res/tokens", "z", b"z0").await;
    let mut last = 0;
    // Each kind of update: the token is above every `changed` read before
    // it and every earlier token; an entry it set reads back with it.
    let mut check = |queue: &Queue, token: u64| {
        assert!(token > highest_changed(queue), "{token} vs {queue:?}");
        assert!(token > last, "{token} after {last}");
        last = token;
    };

    let queue = read(&a, "res/tokens").await;
    let set = update(
        &a,
        "res/tokens",
        &[(&y, version(&queue, &y))],
        &[(&y, b"y1")],
        &[],
        None,
    )
    .await
    .expect("a set");
    check(&queue, set);
    assert_eq!(slot(&read(&b, "res/tokens").await, &y).changed, set);

    let queue = read(&a, "res/tokens").await;
    let block = update(&a, "res/tokens", &[(&x, version(&queue, &x))], &[], &[], Some(b"lvb1"))
        .await
        .expect("the block alone, created");
    check(&queue, block);
    let queue = read(&a, "res/tokens").await;
    let block = update(&a, "res/tokens", &[(&x, version(&queue, &x))], &[], &[], Some(b"lvb2"))
        .await
        .expect("the block alone, set");
    check(&queue, block);

    let queue = read(&b, "res/tokens").await;
    let checked = update(&b, "res/tokens", &[(&x, version(&queue, &x))], &[], &[], None)
        .await
        .expect("only a check");
    check(&queue, checked);

    let queue = read(&b, "res/tokens").await;
    let deleted = update(
        &b,
        "res/tokens",
        &[(&z, version(&queue, &z)), (&x, version(&queue, &x))],
        &[],
        &[&z],
        None,
    )
    .await
    .expect("a delete");
    check(&queue, deleted);

    let queue = read(&a, "res/tokens").await;
    let everything = update(
        &a,
        "res/tokens",
        &[(&x, version(&queue, &x)), (&y, version(&queue, &y))],
        &[(&x, b"x1"), (&y, b"y2")],
        &[],
        Some(b"lvb3"),
    )
    .await
    .expect("sets and the block");
    check(&queue, everything);
    let queue = read(&b, "res/tokens").await;
    assert_eq!(slot(&queue, &x).changed, everything);
    assert_eq!(slot(&queue, &y).changed, everything);
    assert_eq!(queue.block.as_deref(), Some(&b"lvb3"[..]));

    // The stamp node never shows; the block is a child no recipe lists.
    let mut left = children(&side, "/res/tokens").await;
    left.retain(|c| !c.starts_with("_c_"));
    assert_eq!(left, ["lockline-value-block"]);
    assert_eq!(remote(&a).list("res/tokens").await.expect("list").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_block_round_trips_and_outlives_the_entries() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let a = session(&ensemble).await;
    let b = session(&ensemble).await;
    let entry = append(&a, "res/lvb", "a1", b"a").await;
    assert_eq!(read(&b, "res/lvb").await.block, None);
    let mut block = vec![7u8; 1024];
    block.extend_from_slice(b"header");
    for value in [&block[..], b"", b"\x00\xff"] {
        let queue = read(&b, "res/lvb").await;
        update(
            &b,
            "res/lvb",
            &[(&entry, version(&queue, &entry))],
            &[],
            &[],
            Some(value),
        )
        .await
        .expect("written");
        assert_eq!(read(&a, "res/lvb").await.block.as_deref(), Some(value));
    }
    // A block written empty is written: `Some(empty)`, not `None`.
    assert_eq!(read(&b, "res/lvb").await.block.as_deref(), Some(&b"\x00\xff"[..]));
    // The last entry goes; the block stays for the next holder.
    let queue = read(&a, "res/lvb").await;
    update(
        &a,
        "res/lvb",
        &[(&entry, version(&queue, &entry))],
        &[],
        &[&entry],
        None,
    )
    .await
    .expect("deleted");
    let queue = read(&b, "res/lvb").await;
    assert!(queue.slots.is_empty());
    assert_eq!(queue.block.as_deref(), Some(&b"\x00\xff"[..]));
    let next = append(&b, "res/lvb", "b1", b"b").await;
    let queue = read(&b, "res/lvb").await;
    assert_eq!(keys(&queue), [&next.key]);
    assert_eq!(queue.block.as_deref(), Some(&b"\x00\xff"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_writes_the_block_whatever_this_session_last_saw() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let a = session(&ensemble).await;
    let b = session(&ensemble).await;
    let entry = append(&a, "res/guess", "a1", b"a").await;
    // Both read: no block. `b` creates it; `a` still believes it missing.
    let seen_by_a = read(&a, "res/guess").await;
    let seen_by_b = read(&b, "res/guess").await;
    update(
        &b,
        "res/guess",
        &[(&entry, version(&seen_by_b, &entry))],
        &[],
        &[],
        Some(b"by b"),
    )
    .await
    .expect("created");
    update(
        &a,
        "res/guess",
        &[(&entry, version(&seen_by_a, &entry))],
        &[],
        &[],
        Some(b"by a"),
    )
    .await
    .expect("set, after a create that found the node");
    assert_eq!(read(&b, "res/guess").await.block.as_deref(), Some(&b"by a"[..]));
    // A session that never read guesses the node exists; the resource
    // whose block was never written proves it wrong.
    let c = session(&ensemble).await;
    let other = append(&a, "res/guess2", "a2", b"a").await;
    update(&c, "res/guess2", &[(&other, 0)], &[], &[], Some(b"by c"))
        .await
        .expect("created after a set that found no node");
    assert_eq!(read(&a, "res/guess2").await.block.as_deref(), Some(&b"by c"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_changes_it_did_not_see_is_still_the_whole_queue() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let a = session(&ensemble).await;
    let b = session(&ensemble).await;
    let first = append(&a, "res/churn", "a1", b"1").await;
    let second = append(&b, "res/churn", "b1", b"2").await;
    assert_eq!(keys(&read(&a, "res/churn").await), [&first.key, &second.key]);
    // `a` remembers two children; one goes, two come.
    assert!(remote(&b).remove(&second).await.expect("remove"));
    let third = append(&b, "res/churn", "b2", b"3").await;
    let fourth = append(&b, "res/churn", "b3", b"4").await;
    let queue = read(&a, "res/churn").await;
    assert_eq!(keys(&queue), [&first.key, &third.key, &fourth.key]);
    let values: Vec<&[u8]> = queue.slots.iter().map(|s| s.value.as_slice()).collect();
    assert_eq!(values, [&b"1"[..], b"3", b"4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_primitive_is_one_request_when_the_queue_is_as_last_seen() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let a = Client::new(ZooKeeper::new(proxy.address()))
        .session()
        .await
        .expect("session");
    let b = session(&ensemble).await;
    let held = append(&b, "res/trips", "b1", b"b").await;
    let requests = |before: &lockline_testkit::ZkCounts| requests_since(&proxy, before);

    // The append's listing is the guess: the read after it is one multi-read.
    let mine = append(&a, "res/trips", "a1", b"a").await;
    let before = proxy.zk_counts();
    let queue = read(&a, "res/trips").await;
    assert_eq!(keys(&queue), [&held.key, &mine.key]);
    assert_eq!(requests(&before), [(MULTI_READ, 1)].into());

    let before = proxy.zk_counts();
    update(
        &a,
        "res/trips",
        &[(&held, version(&queue, &held)), (&mine, version(&queue, &mine))],
        &[(&mine, b"a:granted")],
        &[],
        Some(b"lvb"),
    )
    .await
    .expect("applied");
    assert_eq!(requests(&before), [(MULTI, 1)].into(), "the block's first write too");

    // A contender this session has not seen: one more multi-read.
    let late = append(&b, "res/trips", "b2", b"late").await;
    let before = proxy.zk_counts();
    let queue = read(&a, "res/trips").await;
    assert_eq!(keys(&queue), [&held.key, &mine.key, &late.key]);
    assert_eq!(requests(&before), [(MULTI_READ, 2)].into());
    // A contender gone since: still one.
    assert!(remote(&b).remove(&held).await.expect("remove"));
    let before = proxy.zk_counts();
    let queue = read(&a, "res/trips").await;
    assert_eq!(keys(&queue), [&mine.key, &late.key]);
    assert_eq!(requests(&before), [(MULTI_READ, 1)].into());
    // A delete-only update.
    let before = proxy.zk_counts();
    update(&a, "res/trips", &[(&mine, version(&queue, &mine))], &[], &[&mine], None)
        .await
        .expect("deleted");
    assert_eq!(requests(&before), [(MULTI, 1)].into());
    // A check-only update (the stamp rides in the same multi).
    let queue = read(&a, "res/trips").await;
    let before = proxy.zk_counts();
    update(&a, "res/trips", &[(&late, version(&queue, &late))], &[], &[], None)
        .await
        .expect("checked");
    assert_eq!(requests(&before), [(MULTI, 1)].into());

    // A handoff: `a` waits on `late` until it changes or goes; `b`
    // releases it. The wake and the read after it are one multi-read.
    let next = append(&a, "res/trips", "a2", b"a").await;
    let watcher = Arc::clone(remote(&a));
    let watched = late.clone();
    let waiting = tokio::spawn(async move { watcher.watch_value(&watched, b"late").await });
    let id = a.id().to_owned();
    lockline::conformance::until("the waiter's watch is set", || ensemble.watches(0, &late.key, &id)).await;
    let before = proxy.zk_counts();
    assert!(remote(&b).remove(&late).await.expect("release"));
    assert_eq!(bounded("woken", waiting).await.expect("task").expect("watch"), None);
    let queue = read(&a, "res/trips").await;
    assert_eq!(keys(&queue), [&next.key]);
    assert_eq!(requests(&before), [(MULTI_READ, 1)].into());
    // Once: the next read asks the server.
    let before = proxy.zk_counts();
    assert_eq!(read(&a, "res/trips").await, queue);
    assert_eq!(requests(&before), [(MULTI_READ, 1)].into());
}

/// A watch of a request that waits for EX and was never granted passes
/// its grant with the one `getData` that sets the watch again (the grant
/// leaves it blocking), not a multi-read of the queue; it still ends when
/// the entry goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_a_waiting_ex_request_passes_its_grant_with_one_get_data() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let a = Client::new(ZooKeeper::new(proxy.address()))
        .session()
        .await
        .expect("session");
    let b = session(&ensemble).await;
    let requests = |before: &lockline_testkit::ZkCounts| requests_since(&proxy, before);
    let waiting = [WAITING_EX, &b"0 0 0 0 00000000"[..]].concat();
    let request = append(&b, "res/ex", "b1", &waiting).await;
    let queue = read(&b, "res/ex").await;
    let watcher = Arc::clone(remote(&a));
    let (entry, seen) = (request.clone(), waiting.clone());
    let watching = tokio::spawn(async move { watcher.watch_value_until(&entry, &seen, &|_| false).await });
    let id = a.id().to_owned();
    lockline::conformance::until("the watch is set", || ensemble.watches(0, &request.key, &id)).await;
    let before = proxy.zk_counts();
    let granted = b"dlm2 EX EX 0 0 0 0 00000000";
    update(
        &b,
        "res/ex",
        &[(&request, version(&queue, &request))],
        &[(&request, granted)],
        &[],
        None,
    )
    .await
    .expect("granted");
    lockline::conformance::until("the grant is read", || requests(&before).get(&GET_DATA) == Some(&1)).await;
    lockline::conformance::until("the watch is set again", || ensemble.watches(0, &request.key, &id)).await;
    assert_eq!(requests(&before), [(GET_DATA, 1)].into(), "one getData, no multi-read");
    assert!(!watching.is_finished(), "the grant is not wanted");
    let queue = read(&b, "res/ex").await;
    update(
        &b,
        "res/ex",
        &[(&request, version(&queue, &request))],
        &[],
        &[&request],
        None,
    )
    .await
    .expect("deleted");
    assert_eq!(
        bounded("woken by the delete", watching)
            .await
            .expect("task")
            .expect("watch"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_value_wakes_on_a_change_by_another_session_and_on_removal() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let a = session(&ensemble).await;
    let b = session(&ensemble).await;
    let held = append(&a, "res/watch", "a1", b"a:EX").await;
    let waiting = append(&b, "res/watch", "b1", b"b:PR").await;
    // `b` waits on `held` until it changes; `a` down-converts.
    let watcher = Arc::clone(remote(&b));
    let entry = held.clone();
    let woken = tokio::spawn(async move { watcher.watch_value(&entry, b"a:EX").await });
    let queue = read(&a, "res/watch").await;
    // The wait is on the server once the watch is: wait for it there.
    let id = b.id().to_owned();
    lockline::conformance::until("the waiter's watch is set", || ensemble.watches(0, &held.key, &id)).await;
    update(
        &a,
        "res/watch",
        &[(&held, version(&queue, &held)), (&waiting, version(&queue, &waiting))],
        &[(&held, b"a:PR")],
        &[],
        None,
    )
    .await
    .expect("applied");
    let value = bounded("woken by the change", woken)
        .await
        .expect("task")
        .expect("watch");
    assert_eq!(value.as_deref(), Some(&b"a:PR"[..]));
    // Unchanged: at once. Gone: `None`.
    assert_eq!(
        remote(&b).watch_value(&held, b"a:EX").await.expect("watch").as_deref(),
        Some(&b"a:PR"[..])
    );
    let watcher = Arc::clone(remote(&b));
    let entry = held.clone();
    let woken = tokio::spawn(async move { watcher.watch_value(&entry, b"a:PR").await });
    lockline::conformance::until("the waiter's watch is set", || ensemble.watches(0, &held.key, &id)).await;
    let queue = read(&a, "res/watch").await;
    update(&a, "res/watch", &[(&held, version(&queue, &held))], &[], &[&held], None)
        .await
        .expect("deleted");
    assert_eq!(
        bounded("woken by the delete", woken)
            .await
            .expect("task")
            .expect("watch"),
        None
    );
    assert_eq!(remote(&b).get_value(&held).await.expect("get"), None);
    assert_eq!(
        remote(&b).get_value(&waiting).await.expect("get").as_deref(),
        Some(&b"b:PR"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_removes_the_attempts_entry_and_leaves_the_block() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    let a = session(&ensemble).await;
    let kept = append(&a, "res/abandon", "keep", b"k").await;
    let queue = read(&a, "res/abandon").await;
    update(
        &a,
        "res/abandon",
        &[(&kept, version(&queue, &kept))],
        &[],
        &[],
        Some(b"lvb"),
    )
    .await
    .expect("block");
    let dropped = append(&a, "res/abandon", "drop", b"d").await;
    remote(&a)
        .abandon("res/abandon", EntryKind::Dlm, "drop")
        .await
        .expect("abandon");
    let queue = read(&a, "res/abandon").await;
    assert_eq!(keys(&queue), [&kept.key]);
    assert_eq!(queue.block.as_deref(), Some(&b"lvb"[..]));
    assert!(!remote(&a).remove(&dropped).await.expect("remove"));
    assert!(remote(&a).remove(&kept).await.expect("remove"));
    assert_eq!(children(&side, "/res/abandon").await, ["lockline-value-block"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_node_names_are_refused_as_lock_names_and_fenced_write_keys() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let a = session(&ensemble).await;
    for name in ["res/lockline-value-block", "lockline-stamp", "res/lockline-stamp/x"] {
        match a.mutex(name) {
            Err(Error::InvalidName { .. }) => {}
            other => panic!("{name:?} must be refused, got {other:?}"),
        }
    }
    let guard = bounded("lock", a.mutex("fence").expect("mutex").lock())
        .await
        .expect("lock");
    for key in ["/res/lockline-value-block", "/res/lockline-stamp"] {
        match guard.write_if_held([lockline::Write::put(key, "x")]).await {
            Err(Error::InvalidName { name, .. }) => assert_eq!(name, key),
            other => panic!("{key:?} must be refused, got {other:?}"),
        }
    }
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_kept_by_a_wake_never_hides_this_sessions_own_writes() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let a = session(&ensemble).await;
    let b = session(&ensemble).await;
    let held = append(&b, "res/kept", "b1", b"b").await;
    let mine = append(&a, "res/kept", "a1", b"a").await;
    let watcher = Arc::clone(remote(&a));
    let watched = held.clone();
    let waiting = tokio::spawn(async move { watcher.watch_value(&watched, b"b").await });
    let id = a.id().to_owned();
    lockline::conformance::until("the waiter's watch is set", || ensemble.watches(0, &held.key, &id)).await;
    assert!(remote(&b).remove(&held).await.expect("release"));
    assert_eq!(bounded("woken", waiting).await.expect("task").expect("watch"), None);
    // The wake kept the queue it read; this session writes before it reads.
    update(
        &a,
        "res/kept",
        &[(&mine, 0)],
        &[(&mine, b"a:granted")],
        &[],
        Some(b"lvb"),
    )
    .await
    .expect("granted");
    let queue = read(&a, "res/kept").await;
    assert_eq!(keys(&queue), [&mine.key]);
    assert_eq!(queue.slots[0].value, b"a:granted");
    assert_eq!(queue.block.as_deref(), Some(&b"lvb"[..]));
}

/// `x` and `/x` are one path, so one resource: a multi-resource lock (and a
/// multi-lock) given both is refused as given one name twice, and two of
/// them over `a` and `b` spelt with and without the leading `/` take the
/// two in one order, so they never deadlock (each waits for the other's
/// release, then holds both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_and_without_a_leading_slash_are_one_lock_to_multi_locks() {
    use lockline::LockMode::Ex;
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let (one, two) = (session(&ensemble).await, session(&ensemble).await);
    for refused in [
        one.multi_resource([("x", Ex), ("/x", Ex)]).map(|_| ()),
        one.multi_lock(["/y", "y"]).map(|_| ()),
    ] {
        match refused {
            Err(Error::InvalidOptions { reason }) => assert!(reason.contains("one"), "{reason}"),
            other => panic!("two spellings of one path must be refused: {other:?}"),
        }
    }
    let first = one.multi_resource([("/b", Ex), ("a", Ex)]).expect("multi-resource");
    let second = two.multi_resource([("b", Ex), ("/a", Ex)]).expect("multi-resource");
    for _ in 0..20 {
        tokio::join!(
            async {
                let held = bounded("the first multi-resource", first.lock()).await.expect("lock");
                tokio::task::yield_now().await;
                held.release().await.expect("release");
            },
            async {
                let held = bounded("the second multi-resource", second.lock()).await.expect("lock");
                tokio::task::yield_now().await;
                held.release().await.expect("release");
            },
        );
    }
    let first = one.multi_lock(["/d", "c"]).expect("multi-lock");
    let second = two.multi_lock(["d", "/c"]).expect("multi-lock");
    for _ in 0..20 {
        tokio::join!(
            async {
                let held = bounded("the first multi-lock", first.lock()).await.expect("lock");
                tokio::task::yield_now().await;
                held.release().await.expect("release");
            },
            async {
                let held = bounded("the second multi-lock", second.lock()).await.expect("lock");
                tokio::task::yield_now().await;
                held.release().await.expect("release");
            },
        );
    }
}
