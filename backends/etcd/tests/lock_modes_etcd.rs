//! The lock-mode primitives on a real etcd: `read_queue` and `update_queue`
//! driven through the backend session, checked against what a plain etcd
//! client sees on the server (keys, leases, revisions).

use std::sync::Arc;

use lockline::backend::{AppendRequest, BackendSession, Conflicts, Entry, EntryKind, QueueUpdate, Slot};
use lockline::conformance::bounded;
use lockline::{Client, Session};
use lockline_etcd::etcd_client::{self, GetOptions};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

async fn side(cluster: &EtcdCluster) -> etcd_client::Client {
    etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect a plain etcd client")
}

/// The key as a plain client reads it: (value, lease, create revision,
/// mod revision).
async fn plain(cluster: &EtcdCluster, key: &str) -> Option<(Vec<u8>, i64, i64, i64)> {
    let response = side(cluster).await.get(key, None).await.expect("get");
    response
        .kvs()
        .first()
        .map(|kv| (kv.value().to_vec(), kv.lease(), kv.create_revision(), kv.mod_revision()))
}

async fn revoke(cluster: &EtcdCluster, session: &Session) {
    let lease = i64::from_str_radix(session.id(), 16).expect("a lease id in hex");
    side(cluster).await.lease_revoke(lease).await.expect("revoke the lease");
}

async fn open(cluster: &EtcdCluster) -> Session {
    Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session")
}

/// A session whose every removal writes its hand-over marker
/// (`with_release_markers()`), so that `removed_by_me` can always tell.
async fn open_marking(cluster: &EtcdCluster) -> Session {
    Client::new(Etcd::new(cluster.endpoints()).with_release_markers())
        .session()
        .await
        .expect("session")
}

/// Appends a lock-mode entry as the core does.
async fn append(remote: &Arc<dyn BackendSession>, dir: &str, attempt: &str, value: &[u8]) -> Entry {
    let request = AppendRequest {
        dir,
        kind: EntryKind::Dlm,
        attempt,
        value,
        conflicts: Conflicts::All,
        nearest: 0,
    };
    bounded("append", remote.append(&request)).await.expect("append").entry
}

async fn update(
    remote: &Arc<dyn BackendSession>,
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
    bounded("update the queue", remote.update_queue(&update))
        .await
        .expect("update the queue")
}

fn slot<'a>(slots: &'a [Slot], entry: &Entry) -> &'a Slot {
    slots
        .iter()
        .find(|slot| slot.entry == *entry)
        .unwrap_or_else(|| panic!("{} is not in {slots:?}", entry.key))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_gives_every_entry_in_creation_order_with_its_value() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open(&cluster).await, open(&cluster).await);
    let dir = "modes/order";

    let empty = bounded("read", a.backend_session().read_queue(dir))
        .await
        .expect("read");
    assert!(empty.slots.is_empty() && empty.block.is_none(), "{empty:?}");

    let first = append(a.backend_session(), dir, "a1", b"first").await;
    let second = append(b.backend_session(), dir, "b1", b"second").await;
    let third = append(a.backend_session(), dir, "a2", b"").await;
    assert_eq!(first.key, format!("{dir}/dlm/{}-a1", a.id()));
    assert_eq!(first.owner.as_deref(), Some(a.id()));
    assert_eq!(second.owner.as_deref(), Some(b.id()));
    // Keys of a lock nested under the name, and another recipe's entry of
    // the name itself (Go's layout, as `etcdctl lock` writes it).
    let mut plain_client = side(&cluster).await;
    let lease = plain_client.lease_grant(60, None).await.expect("grant").id();
    let nested = format!("{dir}/inner/dlm/{lease:x}-x1");
    plain_client
        .put(
            nested.as_str(),
            "nested",
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("put");
    let go_key = format!("{dir}/{lease:x}");
    plain_client
        .put(
            go_key.as_str(),
            "",
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("put");

    let queue = bounded("read", b.backend_session().read_queue(dir))
        .await
        .expect("read");
    let keys: Vec<&str> = queue.slots.iter().map(|slot| slot.entry.key.as_str()).collect();
    assert_eq!(keys, [&*first.key, &*second.key, &*third.key, &*go_key], "{queue:?}");
    assert_eq!(queue.slots[3].entry.kind, EntryKind::Mutex);
    assert!(queue.slots[..3].iter().all(|slot| slot.entry.kind == EntryKind::Dlm));
    let values: Vec<&[u8]> = queue.slots.iter().map(|slot| slot.value.as_slice()).collect();
    assert_eq!(values, [&b"first"[..], b"second", b"", b""]);
    for (slot, entry) in queue.slots.iter().zip([&first, &second, &third]) {
        assert_eq!(slot.entry, *entry, "the entry as its append gave it");
        // Never written since its creation.
        assert_eq!(slot.version, entry.order);
        assert_eq!(slot.changed, entry.token.get());
    }
    assert!(queue.block.is_none());
    // The same entries as `list` gives them.
    let listed = a.backend_session().list(dir).await.expect("list");
    assert_eq!(
        listed,
        queue.slots.iter().map(|slot| slot.entry.clone()).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_sets_any_sessions_entries_keeping_their_lease_and_returns_a_rising_token() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open(&cluster).await, open(&cluster).await);
    let dir = "modes/set";
    let mine = append(b.backend_session(), dir, "b1", b"waiting").await;
    let holder = append(a.backend_session(), dir, "a1", b"granted").await;
    let queue = b.backend_session().read_queue(dir).await.expect("read");
    let seen_max = queue.slots.iter().map(|slot| slot.changed).max().expect("slots");

    // B marks A's entry (a waiter marks the holder it waits on) and its own.
    let (v_mine, v_holder) = (slot(&queue.slots, &mine).version, slot(&queue.slots, &holder).version);
    let token = update(
        b.backend_session(),
        dir,
        &[(&mine, v_mine), (&holder, v_holder)],
        &[(&holder, b"granted+blocking"), (&mine, b"waiting-on-a")],
        &[],
        Some(b"lvb-1"),
    )
    .await
    .expect("the versions held");
    assert!(token > seen_max, "{token} after {seen_max}");

    let queue = a.backend_session().read_queue(dir).await.expect("read");
    let (s_holder, s_mine) = (slot(&queue.slots, &holder), slot(&queue.slots, &mine));
    assert_eq!(s_holder.value, b"granted+blocking");
    assert_eq!(s_mine.value, b"waiting-on-a");
    assert_eq!((s_holder.changed, s_mine.changed), (token, token));
    assert_ne!(s_holder.version, v_holder, "a write changes the version");
    assert_eq!(queue.block.as_deref(), Some(&b"lvb-1"[..]));
    // The entries keep their owners' leases and creation order.
    let lease = |session: &Session| i64::from_str_radix(session.id(), 16).expect("hex");
    let (_, holder_lease, created, modified) = plain(&cluster, &holder.key).await.expect("exists");
    assert_eq!((holder_lease, created), (lease(&a), holder.order));
    assert_eq!(u64::try_from(modified).expect("revision"), token);
    let (_, mine_lease, _, _) = plain(&cluster, &mine.key).await.expect("exists");
    assert_eq!(mine_lease, lease(&b));
    assert_eq!(s_holder.entry.owner.as_deref(), Some(a.id()));

    // A second update: a token above the first and every changed.
    let again = update(
        a.backend_session(),
        dir,
        &[(&holder, s_holder.version)],
        &[(&holder, b"granted")],
        &[],
        None,
    )
    .await
    .expect("the version held");
    assert!(again > token, "{again} after {token}");
    // The block is written only when given.
    let queue = a.backend_session().read_queue(dir).await.expect("read");
    assert_eq!(queue.block.as_deref(), Some(&b"lvb-1"[..]));
    assert_eq!(slot(&queue.slots, &holder).changed, again);

    // The marked entry still goes with its owner's session.
    revoke(&cluster, &a).await;
    let queue = b.backend_session().read_queue(dir).await.expect("read");
    let keys: Vec<&str> = queue.slots.iter().map(|slot| slot.entry.key.as_str()).collect();
    assert_eq!(keys, [&*mine.key], "A's entry went with its lease");
    assert_eq!(
        queue.block.as_deref(),
        Some(&b"lvb-1"[..]),
        "the block outlives sessions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_writes_nothing_when_a_version_changed() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open(&cluster).await, open(&cluster).await);
    let dir = "modes/stale";
    let ea = append(a.backend_session(), dir, "a1", b"a").await;
    let eb = append(b.backend_session(), dir, "b1", b"b").await;
    let read = a.backend_session().read_queue(dir).await.expect("read");
    let (va, vb) = (slot(&read.slots, &ea).version, slot(&read.slots, &eb).version);

    // B changes its own entry after A's read.
    update(
        b.backend_session(),
        dir,
        &[(&eb, vb)],
        &[(&eb, b"b2")],
        &[],
        Some(b"from-b"),
    )
    .await
    .expect("B's update");
    let before = a.backend_session().read_queue(dir).await.expect("read");

    // A's update on its stale read: refused as a whole.
    let refused = update(
        a.backend_session(),
        dir,
        &[(&ea, va), (&eb, vb)],
        &[(&ea, b"a2"), (&eb, b"marked")],
        &[&eb],
        Some(b"from-a"),
    )
    .await;
    assert_eq!(refused, None);
    let after = a.backend_session().read_queue(dir).await.expect("read");
    assert_eq!(after, before, "nothing was written");
    assert_eq!(after.block.as_deref(), Some(&b"from-b"[..]));

    // The same update on a fresh read goes through.
    let (va, vb) = (slot(&after.slots, &ea).version, slot(&after.slots, &eb).version);
    let token = update(
        a.backend_session(),
        dir,
        &[(&ea, va), (&eb, vb)],
        &[(&ea, b"a2")],
        &[&eb],
        Some(b"from-a"),
    )
    .await
    .expect("fresh versions");
    let after = a.backend_session().read_queue(dir).await.expect("read");
    assert_eq!(after.slots.len(), 1);
    assert_eq!(
        (after.slots[0].value.as_slice(), after.slots[0].changed),
        (&b"a2"[..], token)
    );
    assert_eq!(after.block.as_deref(), Some(&b"from-a"[..]));
    assert_eq!(plain(&cluster, &eb.key).await, None, "deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_on_a_deleted_entry_writes_nothing() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open(&cluster).await, open(&cluster).await);
    let dir = "modes/deleted";
    let ea = append(a.backend_session(), dir, "a1", b"a").await;
    let eb = append(b.backend_session(), dir, "b1", b"b").await;
    let read = a.backend_session().read_queue(dir).await.expect("read");
    let (va, vb) = (slot(&read.slots, &ea).version, slot(&read.slots, &eb).version);

    assert!(b.backend_session().remove(&eb).await.expect("remove"));
    // Conditioned on the deleted entry, setting only the other one.
    let refused = update(
        a.backend_session(),
        dir,
        &[(&ea, va), (&eb, vb)],
        &[(&ea, b"granted")],
        &[],
        Some(b"x"),
    )
    .await;
    assert_eq!(refused, None);
    // Setting the deleted entry never creates it again.
    let refused = update(a.backend_session(), dir, &[(&eb, vb)], &[(&eb, b"marked")], &[], None).await;
    assert_eq!(refused, None);
    assert_eq!(plain(&cluster, &eb.key).await, None);
    let queue = a.backend_session().read_queue(dir).await.expect("read");
    assert_eq!(queue.slots.len(), 1);
    assert_eq!(queue.slots[0].value, b"a");
    assert_eq!(queue.block, None);
}

/// A session whose lease is gone: its entries went with it, so an update
/// conditioned on them writes nothing, whoever sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_on_a_lost_sessions_entry_writes_nothing() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open(&cluster).await, open(&cluster).await);
    let dir = "modes/lost";
    let ea = append(a.backend_session(), dir, "a1", b"a").await;
    let eb = append(b.backend_session(), dir, "b1", b"b").await;
    let read = a.backend_session().read_queue(dir).await.expect("read");
    let (va, vb) = (slot(&read.slots, &ea).version, slot(&read.slots, &eb).version);

    revoke(&cluster, &a).await;
    // Straight to the server, whatever A's client knows by now.
    let own = bounded(
        "update",
        a.backend_session().update_queue(&QueueUpdate {
            dir,
            unchanged: &[(&ea, va)],
            present: &[],
            set: &[(&ea, b"granted")],
            delete: &[],
            block: Some(b"stale"),
        }),
    )
    .await;
    assert!(matches!(own, Ok(None)), "{own:?}");
    let other = update(
        b.backend_session(),
        dir,
        &[(&ea, va), (&eb, vb)],
        &[(&ea, b"marked"), (&eb, b"granted")],
        &[],
        None,
    )
    .await;
    assert_eq!(other, None);
    assert_eq!(plain(&cluster, &ea.key).await, None, "not created again");
    let queue = b.backend_session().read_queue(dir).await.expect("read");
    assert_eq!(queue.slots.len(), 1);
    assert_eq!(queue.slots[0].value, b"b");
    assert_eq!(queue.block, None);
}

/// The block is up to a KiB of any bytes, at a key beside the lock that no
/// listing of the lock (lockline's, Go's, `etcdctl lock`'s) shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_block_round_trips_beside_the_lock() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let a = open(&cluster).await;
    let dir = "modes/block";
    let entry = append(a.backend_session(), dir, "a1", b"").await;
    let block: Vec<u8> = (0..1100u32).map(|i| (i.wrapping_mul(31) % 256) as u8).collect();
    let read = a.backend_session().read_queue(dir).await.expect("read");
    update(
        a.backend_session(),
        dir,
        &[(&entry, read.slots[0].version)],
        &[],
        &[],
        Some(&block),
    )
    .await
    .expect("update");
    let queue = a.backend_session().read_queue(dir).await.expect("read");
    assert_eq!(queue.block.as_deref(), Some(block.as_slice()));
    assert_eq!(queue.slots.len(), 1, "the block is no entry: {queue:?}");
    // An entry set to nothing is kept (empty value), the block emptied too.
    let token = update(
        a.backend_session(),
        dir,
        &[(&entry, queue.slots[0].version)],
        &[(&entry, b"")],
        &[],
        Some(b""),
    )
    .await
    .expect("update");
    let queue = a.backend_session().read_queue(dir).await.expect("read");
    assert_eq!(queue.block.as_deref(), Some(&b""[..]));
    assert_eq!(
        (queue.slots[0].value.as_slice(), queue.slots[0].changed),
        (&b""[..], token)
    );

    // Where it lives: beside the name, outside `NAME/`, with no lease.
    let key = format!("{dir}\0lockline/block");
    let (_, lease, _, _) = plain(&cluster, &key).await.expect("the block key");
    assert_eq!(lease, 0, "the block outlives sessions");
    let under = side(&cluster)
        .await
        .get(
            format!("{dir}/"),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("get");
    let listed: Vec<&[u8]> = under.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(listed, [entry.key.as_bytes()], "Go's mutex sees only the entry");
    assert!(a.backend_session().list(dir).await.expect("list").len() == 1);

    // A fenced write can never forge it.
    let guard = a.mutex("modes/other").expect("mutex").lock().await.expect("lock");
    let forged = guard
        .write_if_held([lockline::Write::put(key.as_str(), "forged")])
        .await;
    assert!(matches!(forged, Err(lockline::Error::InvalidName { .. })), "{forged:?}");
    guard.release().await.expect("release");
}

/// An update that writes nothing still gets a revision of its own: its
/// token is above every token and every change before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_that_writes_nothing_still_gets_a_token_of_its_own() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let a = open(&cluster).await;
    let dir = "modes/nothing";
    let entry = append(a.backend_session(), dir, "a1", b"x").await;
    let read = a.backend_session().read_queue(dir).await.expect("read");
    let version = read.slots[0].version;
    let first = update(
        a.backend_session(),
        dir,
        &[(&entry, version)],
        &[(&entry, b"y")],
        &[],
        None,
    )
    .await
    .expect("update");
    let read = a.backend_session().read_queue(dir).await.expect("read");
    let version = read.slots[0].version;
    let second = update(a.backend_session(), dir, &[(&entry, version)], &[], &[], None)
        .await
        .expect("update");
    assert!(second > first, "{second} after {first}");
    let third = update(a.backend_session(), dir, &[], &[], &[], None)
        .await
        .expect("update");
    assert!(third > second, "{third} after {second}");
    // The entry is untouched by them.
    let read = a.backend_session().read_queue(dir).await.expect("read");
    assert_eq!((read.slots[0].version, read.slots[0].changed), (version, first));
    assert_eq!(read.slots.len(), 1);
}

/// One transaction carries an update of a hundred entries (etcd takes 128
/// comparisons and 128 writes per transaction by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_entries_are_read_and_updated_at_once() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let a = open(&cluster).await;
    let dir = "modes/many";
    let mut entries = Vec::new();
    for i in 0..100 {
        let value = format!("v{i}");
        entries.push(append(a.backend_session(), dir, &format!("a{i}"), value.as_bytes()).await);
    }
    let read = a.backend_session().read_queue(dir).await.expect("read");
    assert_eq!(
        read.slots.iter().map(|slot| &slot.entry).collect::<Vec<_>>(),
        entries.iter().collect::<Vec<_>>()
    );
    let unchanged: Vec<(&Entry, i64)> = read.slots.iter().map(|slot| (&slot.entry, slot.version)).collect();
    let values: Vec<Vec<u8>> = (0..100).map(|i| format!("w{i}").into_bytes()).collect();
    let set: Vec<(&Entry, &[u8])> = entries.iter().zip(&values).map(|(e, v)| (e, v.as_slice())).collect();
    let token = update(a.backend_session(), dir, &unchanged, &set, &[], Some(b"b"))
        .await
        .expect("update");
    let read = a.backend_session().read_queue(dir).await.expect("read");
    assert!(read.slots.iter().all(|slot| slot.changed == token));
    assert_eq!(
        read.slots.iter().map(|slot| slot.value.clone()).collect::<Vec<_>>(),
        values
    );
}

/// The other primitives work on lock-mode entries as on any: `abandon`,
/// `remove`, `get_value`, `wait_gone`; and a removal through an update
/// tells a release from someone else's delete as `remove` does (with the
/// hand-over marker written by every removal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_mode_entries_are_removed_abandoned_and_waited_on_like_any() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open_marking(&cluster).await, open_marking(&cluster).await);
    let (ra, rb) = (a.backend_session(), b.backend_session());
    let dir = "modes/primitives";

    let abandoned = append(ra, dir, "gone1", b"x").await;
    ra.abandon(dir, EntryKind::Dlm, "gone1").await.expect("abandon");
    assert_eq!(plain(&cluster, &abandoned.key).await, None);
    assert_eq!(ra.get_value(&abandoned).await.expect("get"), None);

    let ea = append(ra, dir, "a1", b"a").await;
    let eb = append(rb, dir, "b1", b"b").await;
    assert_eq!(rb.get_value(&ea).await.expect("get"), Some(b"a".to_vec()));
    let waiting = {
        let rb = Arc::clone(rb);
        let ea = ea.clone();
        tokio::spawn(async move { rb.wait_gone(&ea).await })
    };
    // A removes its own entry through an update: the wait ends, and the
    // removal reads back as A's own.
    let read = ra.read_queue(dir).await.expect("read");
    update(ra, dir, &[(&ea, slot(&read.slots, &ea).version)], &[], &[&ea], None)
        .await
        .expect("update");
    bounded("the wait ends", waiting)
        .await
        .expect("join")
        .expect("wait_gone");
    assert_eq!(
        bounded("removed by A?", ra.removed_by_me(&ea)).await.expect("answer"),
        Some(true)
    );
    // A deletes B's entry through an update: for B, not its own removal.
    let read = ra.read_queue(dir).await.expect("read");
    update(ra, dir, &[(&eb, slot(&read.slots, &eb).version)], &[], &[&eb], None)
        .await
        .expect("update");
    assert_eq!(
        bounded("removed by B?", rb.removed_by_me(&eb)).await.expect("answer"),
        Some(false)
    );
    let ec = append(rb, dir, "b2", b"c").await;
    assert!(rb.remove(&ec).await.expect("remove"));
    assert!(ra.read_queue(dir).await.expect("read").slots.is_empty());
}

/// A holder waiting on its own entry hears another session's mark at once,
/// whether the mark lands before or after its watch starts, and hears the
/// entry go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_watch_hears_another_sessions_mark_and_the_entry_going() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open(&cluster).await, open(&cluster).await);
    let (ra, rb) = (Arc::clone(a.backend_session()), Arc::clone(b.backend_session()));
    let dir = "modes/watch";
    let held = append(&ra, dir, "a1", b"granted").await;

    // The mark lands after A's read, before or after its watch starts.
    for round in 0..3u8 {
        let read = ra.read_queue(dir).await.expect("read");
        let seen = slot(&read.slots, &held).value.clone();
        let watching = {
            let (ra, held, seen) = (Arc::clone(&ra), held.clone(), seen.clone());
            tokio::spawn(async move { ra.watch_value(&held, &seen).await })
        };
        let marked = format!("blocking-{round}").into_bytes();
        let read = rb.read_queue(dir).await.expect("read");
        update(
            &rb,
            dir,
            &[(&held, slot(&read.slots, &held).version)],
            &[(&held, &marked)],
            &[],
            None,
        )
        .await
        .expect("mark");
        let heard = bounded("the mark is heard", watching)
            .await
            .expect("join")
            .expect("watch_value");
        assert_eq!(heard, Some(marked));
    }
    // The mark landed before the watch was asked for: the first answer.
    let read = ra.read_queue(dir).await.expect("read");
    let seen = slot(&read.slots, &held).value.clone();
    let read = rb.read_queue(dir).await.expect("read");
    update(
        &rb,
        dir,
        &[(&held, slot(&read.slots, &held).version)],
        &[(&held, b"late")],
        &[],
        None,
    )
    .await
    .expect("mark");
    let heard = bounded("the earlier mark", ra.watch_value(&held, &seen))
        .await
        .expect("watch_value");
    assert_eq!(heard.as_deref(), Some(&b"late"[..]));

    // After its own update, the writer's watch waits for the next change.
    let read = ra.read_queue(dir).await.expect("read");
    update(
        &ra,
        dir,
        &[(&held, slot(&read.slots, &held).version)],
        &[(&held, b"mine")],
        &[],
        None,
    )
    .await
    .expect("update");
    let watching = {
        let (ra, held) = (Arc::clone(&ra), held.clone());
        tokio::spawn(async move { ra.watch_value(&held, b"mine").await })
    };
    revoke(&cluster, &a).await;
    let heard = bounded("the entry goes", watching)
        .await
        .expect("join")
        .expect("watch_value");
    assert_eq!(heard, None);
}

/// A lock-mode append reads the queue in its own transaction: the queue
/// as a read right after it gives it, the new entry last; with a
/// lock-delay (whose read also asks how waited-on entries went) it leaves
/// the read to `read_queue`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_mode_append_reads_its_queue_in_the_same_transaction() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open(&cluster).await, open(&cluster).await);
    let dir = "modes/append-read";
    let first = append(a.backend_session(), dir, "a1", b"first").await;
    update(a.backend_session(), dir, &[], &[], &[], Some(b"block"))
        .await
        .expect("block");
    let request = AppendRequest {
        dir,
        kind: EntryKind::Dlm,
        attempt: "b1",
        value: b"second",
        conflicts: Conflicts::All,
        nearest: 0,
    };
    let appended = bounded("append", b.backend_session().append(&request))
        .await
        .expect("append");
    let queue = appended.queue.expect("the queue, read with the append");
    let read = bounded("read", b.backend_session().read_queue(dir))
        .await
        .expect("read");
    assert_eq!(queue, read);
    let keys: Vec<&Entry> = queue.slots.iter().map(|slot| &slot.entry).collect();
    assert_eq!(keys, [&first, &appended.entry]);
    assert_eq!(queue.block.as_deref(), Some(&b"block"[..]));

    let delayed = Client::new(Etcd::new(cluster.endpoints()))
        .session_with(lockline::SessionOptions::new().with_lock_delay(std::time::Duration::from_millis(200)))
        .await
        .expect("session");
    let request = AppendRequest {
        attempt: "c1",
        ..request
    };
    let appended = bounded("append", delayed.backend_session().append(&request))
        .await
        .expect("append");
    assert_eq!(appended.queue, None);
}

/// `watch_value_until` watches past the values it does not want, on the
/// one watch, and returns the first it wants, or `None` once the entry
/// goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_watch_until_watches_past_unwanted_values() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open(&cluster).await, open(&cluster).await);
    let (ra, rb) = (Arc::clone(a.backend_session()), Arc::clone(b.backend_session()));
    let dir = "modes/watch-until";
    let held = append(&ra, dir, "a1", b"start").await;
    let watching = {
        let (rb, held) = (Arc::clone(&rb), held.clone());
        tokio::spawn(async move {
            rb.watch_value_until(&held, b"start", &|v| v.starts_with(b"wanted"))
                .await
        })
    };
    for value in [&b"unwanted-1"[..], b"unwanted-2", b"wanted"] {
        let read = ra.read_queue(dir).await.expect("read");
        update(
            &ra,
            dir,
            &[(&held, slot(&read.slots, &held).version)],
            &[(&held, value)],
            &[],
            None,
        )
        .await
        .expect("write");
    }
    let heard = bounded("the wanted value", watching)
        .await
        .expect("join")
        .expect("watch");
    assert_eq!(heard.as_deref(), Some(&b"wanted"[..]));

    let watching = {
        let (rb, held) = (Arc::clone(&rb), held.clone());
        tokio::spawn(async move { rb.watch_value_until(&held, b"wanted", &|_| false).await })
    };
    let read = ra.read_queue(dir).await.expect("read");
    update(
        &ra,
        dir,
        &[(&held, slot(&read.slots, &held).version)],
        &[(&held, b"other")],
        &[],
        None,
    )
    .await
    .expect("write");
    let read = ra.read_queue(dir).await.expect("read");
    update(
        &ra,
        dir,
        &[(&held, slot(&read.slots, &held).version)],
        &[],
        &[&held],
        None,
    )
    .await
    .expect("delete");
    let heard = bounded("the entry goes", watching).await.expect("join").expect("watch");
    assert_eq!(heard, None);
}

/// Under a namespace, the entries and the block are under the prefix; the
/// resource is named without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_and_block_live_under_the_namespace() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let a = Client::new(Etcd::new(cluster.endpoints()).with_namespace("billing/"))
        .session()
        .await
        .expect("session");
    let dir = "modes/ns";
    let entry = append(a.backend_session(), dir, "a1", b"x").await;
    assert_eq!(entry.key, format!("billing/{dir}/dlm/{}-a1", a.id()));
    let read = a.backend_session().read_queue(dir).await.expect("read");
    assert_eq!(read.slots.len(), 1);
    update(
        a.backend_session(),
        dir,
        &[(&entry, read.slots[0].version)],
        &[],
        &[],
        Some(b"lvb"),
    )
    .await
    .expect("update");
    let (block, ..) = plain(&cluster, &format!("billing/{dir}\0lockline/block"))
        .await
        .expect("the block under the namespace");
    assert_eq!(block, b"lvb");
    assert_eq!(
        a.backend_session()
            .read_queue(dir)
            .await
            .expect("read")
            .block
            .as_deref(),
        Some(&b"lvb"[..])
    );
}

/// A holder's release conditioned on its entry being present at any
/// version goes through though a waiter marked the entry since the
/// holder's read; it writes nothing once the entry is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_a_present_entry_ignores_marks_but_not_its_absence() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (open(&cluster).await, open(&cluster).await);
    let (ra, rb) = (a.backend_session(), b.backend_session());
    let dir = "modes/present";
    let held = append(ra, dir, "a1", b"EX granted").await;
    let waiter = append(rb, dir, "b1", b"PR waiting").await;
    let read = rb.read_queue(dir).await.expect("read");
    // B marks the holder after A's read (A's version is stale now).
    update(
        rb,
        dir,
        &[(&held, slot(&read.slots, &held).version)],
        &[(&held, b"EX granted, blocking PR")],
        &[],
        None,
    )
    .await
    .expect("mark");
    let leaving = [&held];
    let release = QueueUpdate {
        dir,
        unchanged: &[],
        present: &leaving,
        set: &[],
        delete: &leaving,
        block: Some(b"lvb from A"),
    };
    let token = bounded("release", ra.update_queue(&release))
        .await
        .expect("release")
        .expect("the entry was present");
    let queue = rb.read_queue(dir).await.expect("read");
    assert_eq!(queue.slots.len(), 1);
    assert_eq!(queue.slots[0].entry, waiter);
    assert_eq!(queue.block.as_deref(), Some(&b"lvb from A"[..]));
    assert!(token > queue.slots[0].changed);
    // Again: the entry is gone, nothing is written.
    let again = bounded("release again", ra.update_queue(&release))
        .await
        .expect("answered");
    assert_eq!(again, None);
    assert_eq!(rb.read_queue(dir).await.expect("read"), queue);
}

/// With a lock-delay, a waiter tells a holder's release through an update
/// (which writes the value block) from a loss, from its value watch and
/// the read after it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_a_lock_delay_tells_a_release_by_update_from_a_loss() {
    use lockline::backend::Departure;
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let waiting = client
        .session_with(lockline::SessionOptions::new().with_lock_delay(std::time::Duration::from_secs(5)))
        .await
        .expect("session");
    let rw = Arc::clone(waiting.backend_session());
    for lost in [false, true] {
        let dir = if lost {
            "modes/delay-lost"
        } else {
            "modes/delay-released"
        };
        let holding = open(&cluster).await;
        let rh = Arc::clone(holding.backend_session());
        let held = append(&rh, dir, "h1", b"EX").await;
        let mine = append(&rw, dir, "w1", b"PR").await;
        let read = rw.read_queue(dir).await.expect("read");
        let seen = slot(&read.slots, &held).value.clone();
        let watching = {
            let (rw, held) = (Arc::clone(&rw), held.clone());
            tokio::spawn(async move { rw.watch_value(&held, &seen).await })
        };
        if lost {
            revoke(&cluster, &holding).await;
        } else {
            let leaving = [&held];
            let release = QueueUpdate {
                dir,
                unchanged: &[],
                present: &leaving,
                set: &[],
                delete: &leaving,
                block: Some(b"lvb"),
            };
            rh.update_queue(&release).await.expect("release").expect("present");
        }
        let heard = bounded("the holder goes", watching)
            .await
            .expect("join")
            .expect("watch_value");
        assert_eq!(heard, None);
        let queue = rw.read_queue(dir).await.expect("read");
        assert_eq!(queue.slots.len(), 1);
        assert_eq!(queue.slots[0].entry, mine);
        match (lost, rw.departure(&held)) {
            (false, Departure::Released) | (true, Departure::Lost { .. }) => {}
            (lost, departure) => panic!("lost: {lost}, departure: {departure:?}"),
        }
    }
}
