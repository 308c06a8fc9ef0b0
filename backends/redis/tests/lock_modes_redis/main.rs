//! The lock-mode primitives on real Redis servers, on one node and on a
//! 3-master cluster: `read_queue` and `update_queue` (one script each, on
//! the lock's slot), and the waits a lock-mode contender makes on an
//! entry's value (`watch_value`) or its going (`wait_gone`).
//!
//! Each case runs twice, as `node::<case>` and `cluster::<case>`, each on
//! servers of its own. `messages` holds the cases of what an update's
//! messages say (the value written, the queue a hand-over left).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lockline::backend::{
    AppendRequest, Backend, BackendSession, Conflicts, Entry, EntryKind, Queue, QueueUpdate, Slot, WAITING_EX,
};
use lockline::conformance::bounded;
use lockline::{Error, SessionOptions, SessionState};
use lockline_redis::Redis;
use lockline_testkit::{RedisCluster, RedisServer};

#[path = "../support/mod.rs"]
mod support;

mod messages;
use messages::*;

/// The resource every case uses (each case has servers of its own).
const DIR: &str = "modes/resource";

enum Servers {
    Node(Box<RedisServer>),
    Cluster(RedisCluster),
}

struct Fixture {
    servers: Servers,
}

impl Fixture {
    fn node() -> Self {
        Fixture {
            servers: Servers::Node(Box::new(RedisServer::start().expect("start redis"))),
        }
    }

    fn cluster() -> Self {
        Fixture {
            servers: Servers::Cluster(RedisCluster::start(3).expect("start a Redis Cluster")),
        }
    }

    fn urls(&self) -> Vec<String> {
        match &self.servers {
            Servers::Node(server) => vec![server.url()],
            Servers::Cluster(cluster) => cluster.urls(),
        }
    }

    fn backend(&self) -> Redis {
        match &self.servers {
            Servers::Node(server) => Redis::new(server.url()),
            Servers::Cluster(cluster) => Redis::cluster(cluster.urls()),
        }
    }

    /// A backend session (no core on top: these are the primitives).
    async fn open(&self, ttl: Duration) -> Arc<dyn BackendSession> {
        let options = SessionOptions::new().with_ttl(ttl);
        bounded("open a session", self.backend().open_session(&options))
            .await
            .expect("session")
    }

    /// Three sessions whose TTLs are far beyond a case's bound: only
    /// messages wake their waits.
    async fn three_sessions(
        &self,
    ) -> (
        Arc<dyn BackendSession>,
        Arc<dyn BackendSession>,
        Arc<dyn BackendSession>,
    ) {
        let ttl = Duration::from_secs(120);
        (self.open(ttl).await, self.open(ttl).await, self.open(ttl).await)
    }

    /// Runs one command on the node that holds `key`.
    async fn query<T: redis::FromRedisValue>(&self, key: &str, cmd: &redis::Cmd) -> T {
        let mut side = support::side(&self.owner_of(key).await).await;
        cmd.query_async(&mut side).await.expect("a side command")
    }

    /// Waits until `channel` has `count` subscribers, summed over the nodes
    /// (a session's pub/sub connection may be on any node of a cluster).
    /// The server is another process, with no event to await: look every
    /// 10 ms.
    async fn subscribed(&self, channel: &str, count: i64) {
        let mut sides = Vec::new();
        for url in self.urls() {
            sides.push(support::side(&url).await);
        }
        bounded("the subscriptions", async {
            loop {
                let mut subscribers = 0;
                for side in &mut sides {
                    let (_, n): (String, i64) = redis::cmd("PUBSUB")
                        .arg("NUMSUB")
                        .arg(channel)
                        .query_async(side)
                        .await
                        .expect("PUBSUB NUMSUB");
                    subscribers += n;
                }
                if subscribers >= count {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }

    /// Every message on the resource's entry channels, heard on the node
    /// of its slot (that of `entry`), subscribed before this returns.
    async fn every_entry_message(&self, entry: &Entry) -> impl futures::Stream<Item = redis::Msg> + Unpin {
        let owner = self.owner_of(&entry.key).await;
        let mut pubsub = redis::Client::open(owner.as_str())
            .expect("url")
            .get_async_pubsub()
            .await
            .expect("pubsub");
        pubsub.psubscribe("{modes/resource}:c:*").await.expect("psubscribe");
        pubsub.into_on_message()
    }

    /// The URL of the node that holds `key`'s slot (the only node on a
    /// single node): the one that does not redirect.
    async fn owner_of(&self, key: &str) -> String {
        for url in self.urls() {
            let mut side = support::side(&url).await;
            let answer: redis::RedisResult<String> = redis::cmd("TYPE").arg(key).query_async(&mut side).await;
            if answer.is_ok() {
                return url;
            }
        }
        panic!("no node holds the slot of {key}");
    }
}

/// A lock-mode append to the case's resource, with a window of `nearest`
/// (0: the whole queue).
fn request<'a>(attempt: &'a str, value: &'a [u8], nearest: usize) -> AppendRequest<'a> {
    AppendRequest {
        dir: DIR,
        kind: EntryKind::Dlm,
        attempt,
        value,
        conflicts: Conflicts::All,
        nearest,
    }
}

async fn append(session: &Arc<dyn BackendSession>, attempt: &str, value: &[u8]) -> Entry {
    bounded("append", session.append(&request(attempt, value, 0)))
        .await
        .expect("append")
        .entry
}

async fn read(session: &Arc<dyn BackendSession>) -> Queue {
    bounded("read the queue", session.read_queue(DIR))
        .await
        .expect("read the queue")
}

async fn update(session: &Arc<dyn BackendSession>, update: &QueueUpdate<'_>) -> Option<u64> {
    bounded("update the queue", session.update_queue(update))
        .await
        .expect("update the queue")
}

/// A watch of `held` (an entry whose key ends in `held`, at the value
/// `start`) by `session` that wants a value starting with `wanted`,
/// subscribed before this returns.
async fn watch_for_wanted(
    fixture: &Fixture,
    session: &Arc<dyn BackendSession>,
    held: &Entry,
) -> tokio::task::JoinHandle<lockline::Result<Option<Vec<u8>>>> {
    let watching = {
        let (session, held) = (Arc::clone(session), held.clone());
        tokio::spawn(async move {
            session
                .watch_value_until(&held, b"start", &|v| v.starts_with(b"wanted"))
                .await
        })
    };
    fixture.subscribed("{modes/resource}:c:held", 1).await;
    watching
}

/// Sets `held` to two values a [`watch_for_wanted`] does not want, then
/// to one it wants, and waits for the watch to answer that one.
async fn two_unwanted_then_wanted(
    session: &Arc<dyn BackendSession>,
    held: &Entry,
    watching: tokio::task::JoinHandle<lockline::Result<Option<Vec<u8>>>>,
) {
    for value in [&b"unwanted-1"[..], b"unwanted-2", b"wanted"] {
        set_by_update(session, held, value).await;
    }
    let heard = bounded("the wanted value", watching)
        .await
        .expect("join")
        .expect("watch");
    assert_eq!(heard.as_deref(), Some(&b"wanted"[..]));
}

/// Sets `entry`'s value by an update of `session` (the entry present, at
/// any version).
async fn set_by_update(session: &Arc<dyn BackendSession>, entry: &Entry, value: &[u8]) {
    let values = [(entry, value)];
    let change = QueueUpdate {
        dir: DIR,
        unchanged: &[],
        present: &[entry],
        set: &values,
        delete: &[],
        block: None,
    };
    update(session, &change).await.expect("applied");
}

fn slot<'a>(queue: &'a Queue, entry: &Entry) -> &'a Slot {
    queue
        .slots
        .iter()
        .find(|slot| slot.entry.key == entry.key)
        .unwrap_or_else(|| panic!("{} is not in the queue {queue:?}", entry.key))
}

fn entries(queue: &Queue) -> Vec<Entry> {
    queue.slots.iter().map(|slot| slot.entry.clone()).collect()
}

fn values(queue: &Queue) -> Vec<&[u8]> {
    queue.slots.iter().map(|slot| slot.value.as_slice()).collect()
}

const TTL: Duration = Duration::from_secs(10);

/// One read gives every entry, first-created first, with its value; an
/// entry no update has set reads back with `changed` (and version) of its
/// creation; no block was written.
async fn read_queue_gives_entries_in_creation_order_with_values(fixture: &Fixture) {
    let (a, b) = (fixture.open(TTL).await, fixture.open(TTL).await);
    let first = append(&a, "first", b"granted PR").await;
    let second = append(&b, "second", b"waiting EX").await;
    let third = append(&a, "third", b"").await;
    assert!(first.order < second.order && second.order < third.order);
    let queue = read(&b).await;
    assert_eq!(entries(&queue), vec![first.clone(), second.clone(), third.clone()]);
    assert_eq!(values(&queue), vec![&b"granted PR"[..], b"waiting EX", b""]);
    for slot in &queue.slots {
        assert_eq!(slot.entry.kind, EntryKind::Dlm);
        assert_eq!(slot.changed, slot.entry.order.unsigned_abs(), "changed of its creation");
        assert_eq!(slot.version, slot.entry.order);
    }
    assert_eq!(slot(&queue, &second).entry.owner.as_deref(), Some(b.id()));
    assert_eq!(queue.block, None);
    // `list` sees the same entries.
    let listed = bounded("list", a.list(DIR)).await.expect("list");
    assert_eq!(listed, entries(&queue));
}

/// A lock-mode append reads the queue in its own script, as a read right
/// after it gives it (its entry last, the block); another kind's append
/// does not.
async fn an_append_reads_its_queue_in_the_same_script(fixture: &Fixture) {
    let (a, b) = (fixture.open(TTL).await, fixture.open(TTL).await);
    let first = append(&a, "first", b"granted EX").await;
    let block_update = QueueUpdate {
        dir: DIR,
        unchanged: &[],
        present: &[],
        set: &[],
        delete: &[],
        block: Some(b"block"),
    };
    update(&a, &block_update).await.expect("block");
    let mut request = request("second", b"waiting EX", 0);
    let appended = bounded("append", b.append(&request)).await.expect("append");
    let queue = appended.queue.expect("the queue, read with the append");
    assert_eq!(queue, read(&b).await);
    assert_eq!(entries(&queue), vec![first, appended.entry]);
    assert_eq!(queue.block.as_deref(), Some(&b"block"[..]));
    request.kind = EntryKind::Mutex;
    request.dir = "plain-append";
    let appended = bounded("append", b.append(&request)).await.expect("append");
    assert_eq!(appended.queue, None);
}

/// An append with a window (`AppendRequest::nearest`) reads back that many
/// live entries before its own, passing over (and reaping) one that
/// expired, then its own; a window wider than the queue reads all of it.
async fn an_append_reads_a_window_of_its_queue(fixture: &Fixture) {
    let (a, b) = (fixture.open(TTL).await, fixture.open(TTL).await);
    let mut before = Vec::new();
    for attempt in ["w1", "w2", "w3", "w4", "w5", "w6"] {
        before.push(append(&a, attempt, b"waiting EX").await);
    }
    // w5's entry expires (its hash gone, its member still queued).
    let expired = "{modes/resource}:e:w5";
    let deleted: i64 = fixture.query(expired, redis::cmd("DEL").arg(expired)).await;
    assert_eq!(deleted, 1);
    let mut request = request("w7", b"waiting EX", 2);
    let appended = bounded("append", b.append(&request)).await.expect("append");
    let window = appended.queue.expect("the window, read with the append");
    assert_eq!(
        entries(&window),
        vec![before[3].clone(), before[5].clone(), appended.entry.clone()],
        "w4 and w6 before it, w5 passed over"
    );
    let whole = read(&b).await;
    assert_eq!(entries(&whole).len(), 6, "w5 reaped: {:?}", entries(&whole));
    assert!(!entries(&whole).contains(&before[4]));
    request.attempt = "w8";
    request.nearest = 100;
    let appended = bounded("append", b.append(&request)).await.expect("append");
    let all = appended.queue.expect("the queue, read with the append");
    assert_eq!(all, read(&b).await);
    assert_eq!(entries(&all).len(), 7);
}

/// `watch_value_until` watches past the values it does not want and
/// returns the first it wants, or `None` once the entry goes.
async fn a_value_watch_until_watches_past_unwanted_values(fixture: &Fixture) {
    let ttl = Duration::from_secs(120);
    let (a, b) = (fixture.open(ttl).await, fixture.open(ttl).await);
    let held = append(&a, "held", b"start").await;
    let watching = watch_for_wanted(fixture, &b, &held).await;
    two_unwanted_then_wanted(&a, &held, watching).await;

    let watching = {
        let (b, held) = (Arc::clone(&b), held.clone());
        tokio::spawn(async move { b.watch_value_until(&held, b"wanted", &|_| false).await })
    };
    fixture.subscribed("{modes/resource}:c:held", 1).await;
    set_by_update(&a, &held, b"other").await;
    let gone = QueueUpdate {
        dir: DIR,
        unchanged: &[],
        present: &[&held],
        set: &[],
        delete: &[&held],
        block: None,
    };
    update(&a, &gone).await.expect("deleted");
    let heard = bounded("the entry goes", watching).await.expect("join").expect("watch");
    assert_eq!(heard, None);
}

/// One update sets values of entries of any session, deletes, writes the
/// block, and returns a token above every `changed` seen and every token
/// before; every entry it set reads back with `changed` = the token, and
/// keeps its owner.
async fn update_applies_everything_with_a_rising_token(fixture: &Fixture) {
    let (a, b, c) = (
        fixture.open(TTL).await,
        fixture.open(TTL).await,
        fixture.open(TTL).await,
    );
    let holder = append(&b, "holder", b"granted PR").await;
    let other = append(&c, "other", b"waiting CR").await;
    let mine = append(&a, "mine", b"waiting EX").await;
    let before = read(&a).await;
    let highest = before.slots.iter().map(|slot| slot.changed).max().expect("slots");
    let version = |entry: &Entry| slot(&before, entry).version;
    let token = update(
        &a,
        &QueueUpdate {
            dir: DIR,
            present: &[],
            unchanged: &[
                (&holder, version(&holder)),
                (&other, version(&other)),
                (&mine, version(&mine)),
            ],
            set: &[(&holder, b"granted PR, blocks EX"), (&mine, b"waiting EX on holder")],
            delete: &[&other],
            block: Some(b"lvb 1"),
        },
    )
    .await
    .expect("the update applies");
    assert!(token > highest, "token {token} not above every changed ({highest})");
    let after = read(&c).await;
    assert_eq!(entries(&after), vec![holder.clone(), mine.clone()]);
    assert_eq!(
        values(&after),
        vec![&b"granted PR, blocks EX"[..], b"waiting EX on holder"]
    );
    for slot in &after.slots {
        assert_eq!(slot.changed, token);
        assert_ne!(slot.version, version(&slot.entry), "a write changes the version");
    }
    assert_eq!(
        slot(&after, &holder).entry.owner.as_deref(),
        Some(b.id()),
        "keeps its owner"
    );
    assert_eq!(after.block.as_deref(), Some(&b"lvb 1"[..]));
    // The next update's token is above the first; the block stays.
    let next = update(
        &b,
        &QueueUpdate {
            dir: DIR,
            present: &[],
            unchanged: &[(&holder, slot(&after, &holder).version)],
            set: &[(&holder, b"granted PR")],
            delete: &[],
            block: None,
        },
    )
    .await
    .expect("the next update applies");
    assert!(next > token);
    let last = read(&a).await;
    assert_eq!(slot(&last, &holder).changed, next);
    assert_eq!(slot(&last, &mine).changed, token, "an entry not set keeps its changed");
    assert_eq!(last.block.as_deref(), Some(&b"lvb 1"[..]));
    // An entry appended later comes after both tokens in the lock's order.
    let late = append(&c, "late", b"").await;
    assert!(late.order.unsigned_abs() > next);
}

/// An update made from a read that another update overtook (a version
/// changed) writes nothing.
async fn a_changed_version_fails_the_update(fixture: &Fixture) {
    let (a, b) = (fixture.open(TTL).await, fixture.open(TTL).await);
    let holder = append(&a, "holder", b"granted EX").await;
    let waiter = append(&b, "waiter", b"waiting PR").await;
    let seen = read(&a).await;
    let unchanged = [
        (&holder, slot(&seen, &holder).version),
        (&waiter, slot(&seen, &waiter).version),
    ];
    let first = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &unchanged,
        set: &[(&waiter, b"waiting PR on holder")],
        delete: &[],
        block: None,
    };
    assert!(update(&b, &first).await.is_some());
    // The same conditions again: the waiter's version moved.
    let stale = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &unchanged,
        set: &[(&holder, b"released")],
        delete: &[&waiter],
        block: Some(b"stale"),
    };
    assert_eq!(update(&a, &stale).await, None);
    let now = read(&b).await;
    assert_eq!(entries(&now), vec![holder.clone(), waiter.clone()], "nothing deleted");
    assert_eq!(
        values(&now),
        vec![&b"granted EX"[..], b"waiting PR on holder"],
        "nothing set"
    );
    assert_eq!(now.block, None, "no block written");
    // At the versions read now it applies.
    let fresh = [
        (&holder, slot(&now, &holder).version),
        (&waiter, slot(&now, &waiter).version),
    ];
    assert!(update(
        &a,
        &QueueUpdate {
            unchanged: &fresh,
            ..stale
        }
    )
    .await
    .is_some());
    let done = read(&b).await;
    assert_eq!(entries(&done), vec![holder]);
    assert_eq!(done.block.as_deref(), Some(&b"stale"[..]));
}

/// An entry that needs only be present holds up nothing when others'
/// marks moved its version (a holder's release), and fails the update once
/// it is gone.
async fn a_present_entry_is_checked_at_any_version(fixture: &Fixture) {
    let (a, b) = (fixture.open(TTL).await, fixture.open(TTL).await);
    let holder = append(&a, "holder", b"granted EX").await;
    let waiter = append(&b, "waiter", b"waiting EX").await;
    let seen = read(&a).await;
    let held_at = slot(&seen, &holder).version;
    // The waiter marks the holder: the holder's version moves.
    let mark = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[(&holder, held_at), (&waiter, slot(&seen, &waiter).version)],
        set: &[(&holder, b"granted EX, blocks EX")],
        delete: &[],
        block: None,
    };
    assert!(update(&b, &mark).await.is_some());
    // Conditioned on the version it read, the holder's release would fail;
    // needing its entry only present, it applies.
    let stale = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[(&holder, held_at)],
        set: &[],
        delete: &[&holder],
        block: Some(b"written at release"),
    };
    assert_eq!(update(&a, &stale).await, None);
    let release = QueueUpdate {
        unchanged: &[],
        present: &[&holder],
        ..stale
    };
    let token = update(&a, &release).await.expect("the release applies");
    let now = read(&b).await;
    assert_eq!(entries(&now), vec![waiter.clone()]);
    assert_eq!(now.block.as_deref(), Some(&b"written at release"[..]));
    assert!(now.slots.iter().all(|slot| slot.changed < token));
    // Gone, it fails the same update; appended again, it is another entry.
    assert_eq!(update(&a, &release).await, None);
    let again = append(&a, "holder", b"waiting EX").await;
    assert_eq!(again.key, holder.key);
    let on_old = QueueUpdate {
        block: Some(b"not written"),
        ..release
    };
    assert_eq!(update(&a, &on_old).await, None);
    assert_eq!(read(&b).await.block.as_deref(), Some(&b"written at release"[..]));
}

/// An entry that was deleted, or deleted and appended again under the same
/// key (another entry: a new order), fails every update that names it.
async fn a_deleted_or_recreated_entry_fails_the_update(fixture: &Fixture) {
    let (a, b) = (fixture.open(TTL).await, fixture.open(TTL).await);
    let holder = append(&a, "holder", b"granted EX").await;
    let waiter = append(&b, "waiter", b"waiting EX").await;
    let seen = read(&a).await;
    let (held_at, waited_at) = (slot(&seen, &holder).version, slot(&seen, &waiter).version);
    assert!(bounded("remove", b.remove(&waiter)).await.expect("remove"));
    let on_both = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[(&holder, held_at), (&waiter, waited_at)],
        set: &[(&holder, b"granted EX, blocks EX")],
        delete: &[],
        block: Some(b"x"),
    };
    assert_eq!(update(&a, &on_both).await, None);
    // Deleting the entry that is gone fails too.
    let delete_gone = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[(&holder, held_at)],
        set: &[],
        delete: &[&waiter],
        block: None,
    };
    assert_eq!(update(&a, &delete_gone).await, None);
    // The same key appended again is another entry.
    let again = append(&b, "waiter", b"waiting EX").await;
    assert_eq!(again.key, waiter.key);
    assert!(again.order > waiter.order);
    assert_eq!(update(&a, &on_both).await, None);
    let set_old = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[(&holder, held_at)],
        set: &[(&waiter, b"marked")],
        delete: &[],
        block: None,
    };
    assert_eq!(update(&a, &set_old).await, None);
    let now = read(&a).await;
    assert_eq!(entries(&now), vec![holder.clone(), again.clone()]);
    assert_eq!(values(&now), vec![&b"granted EX"[..], b"waiting EX"]);
    assert_eq!(now.block, None);
    // The new entry, at its own version, can be set.
    let set_new = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[(&holder, held_at), (&again, slot(&now, &again).version)],
        set: &[(&again, b"marked")],
        delete: &[],
        block: None,
    };
    assert!(update(&a, &set_new).await.is_some());
}

/// A lost session's entries are gone: an update conditioned on them writes
/// nothing, and the lost session itself writes no more.
async fn a_lost_session_fails_the_update(fixture: &Fixture) {
    let ttl = Duration::from_secs(2);
    let (a, b) = (fixture.open(ttl).await, fixture.open(ttl).await);
    let holder = append(&b, "holder", b"granted EX").await;
    let waiter = append(&a, "waiter", b"waiting EX").await;
    let seen = read(&a).await;
    let versions = [
        (&holder, slot(&seen, &holder).version),
        (&waiter, slot(&seen, &waiter).version),
    ];
    support::expire(&fixture.urls(), b.id()).await;
    let mut state = b.state();
    bounded("the session is lost", state.wait_for(|s| *s == SessionState::Lost))
        .await
        .expect("state");
    let grant = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &versions,
        set: &[(&waiter, b"granted EX")],
        delete: &[&holder],
        block: None,
    };
    assert_eq!(update(&a, &grant).await, None);
    match bounded("the lost session's update", b.update_queue(&grant)).await {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("a lost session must not update, got {other:?}"),
    }
    let now = read(&a).await;
    assert_eq!(entries(&now), vec![waiter.clone()]);
    assert_eq!(values(&now), vec![&b"waiting EX"[..]]);
    // Conditioned on what is left, it applies.
    let alone = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[(&waiter, slot(&now, &waiter).version)],
        set: &[(&waiter, b"granted EX")],
        delete: &[],
        block: None,
    };
    assert!(update(&a, &alone).await.is_some());
}

/// A value set on another session's entry leaves it that session's: its
/// owner, its TTL, renewed by its owner; it still goes when its owner stops
/// renewing (as if its process died), seen by a waiter at its TTL.
async fn a_set_entry_keeps_its_owner_and_its_ttl(fixture: &Fixture) {
    let ttl = Duration::from_secs(2);
    let (a, b) = (fixture.open(ttl).await, fixture.open(ttl).await);
    let holder = append(&b, "holder", b"granted PR").await;
    let waiter = append(&a, "waiter", b"waiting EX").await;
    let seen = read(&a).await;
    let mark = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[
            (&holder, slot(&seen, &holder).version),
            (&waiter, slot(&seen, &waiter).version),
        ],
        set: &[(&holder, b"granted PR, blocks EX")],
        delete: &[],
        block: None,
    };
    assert!(update(&a, &mark).await.is_some());
    let now = read(&a).await;
    assert_eq!(slot(&now, &holder).entry.owner.as_deref(), Some(b.id()));
    let mut pttl = redis::cmd("PTTL");
    pttl.arg(&holder.key);
    let left: i64 = fixture.query(&holder.key, &pttl).await;
    assert!(
        left > 0 && left <= 2000,
        "the entry's TTL is its owner's, got {left} ms"
    );
    // Its owner renews it: the TTL is raised again.
    let mut side = support::side(&fixture.owner_of(&holder.key).await).await;
    support::renewed(&mut side, &holder.key).await;
    assert_eq!(
        bounded("get", a.get_value(&holder)).await.expect("get").as_deref(),
        Some(&b"granted PR, blocks EX"[..])
    );
    // Its owner's process "dies": nothing renews the entry any more, and a
    // waiter sees it go at its TTL.
    drop(b);
    bounded("the entry goes with its owner", a.wait_gone(&holder))
        .await
        .expect("wait_gone");
    assert_eq!(entries(&read(&a).await), vec![waiter]);
}

/// `watch_value` returns when the entry's value is set (the message on its
/// channel, well before any TTL), and `None` when an update deletes it;
/// `wait_gone` returns too. An update publishes only on the channels of the
/// entries it set or deleted: one message each.
async fn watches_wake_on_the_entry_they_watch_only(fixture: &Fixture) {
    // TTLs far beyond the case's bound: only the messages can wake.
    let (a, b, c) = fixture.three_sessions().await;
    let holder = append(&b, "holder", b"granted EX").await;
    let waiter = append(&a, "waiter", b"waiting PR").await;
    let bystander = append(&c, "bystander", b"waiting NL").await;
    let mut heard = fixture.every_entry_message(&holder).await;

    let watcher = {
        let (a, holder) = (Arc::clone(&a), holder.clone());
        tokio::spawn(async move { a.watch_value(&holder, b"granted EX").await })
    };
    let gone_watch = {
        let (c, waiter) = (Arc::clone(&c), waiter.clone());
        tokio::spawn(async move { c.watch_value(&waiter, b"waiting PR").await })
    };
    let gone_wait = {
        let (b, waiter) = (Arc::clone(&b), waiter.clone());
        tokio::spawn(async move { b.wait_gone(&waiter).await })
    };
    // The three waits have subscribed (one session's channel on the
    // holder's entry, two on the waiter's) before the update is made.
    fixture.subscribed("{modes/resource}:c:holder", 1).await;
    fixture.subscribed("{modes/resource}:c:waiter", 2).await;
    let seen = read(&a).await;
    let versions = [
        (&holder, slot(&seen, &holder).version),
        (&waiter, slot(&seen, &waiter).version),
        (&bystander, slot(&seen, &bystander).version),
    ];
    let token = update(
        &a,
        &QueueUpdate {
            dir: DIR,
            present: &[],
            unchanged: &versions,
            set: &[(&holder, b"granted EX, blocks PR")],
            delete: &[&waiter],
            block: Some(b"lvb"),
        },
    )
    .await
    .expect("applied");
    let woke = bounded("the watch wakes on the set", watcher)
        .await
        .expect("task")
        .expect("watch");
    assert_eq!(woke.as_deref(), Some(&b"granted EX, blocks PR"[..]));
    let gone = bounded("the watch wakes on the deletion", gone_watch)
        .await
        .expect("task")
        .expect("watch");
    assert_eq!(gone, None);
    bounded("wait_gone wakes on the deletion", gone_wait)
        .await
        .expect("task")
        .expect("wait_gone");

    // What the update published: one message on the set entry's channel
    // (with the value written), one on the deleted one's, none on the
    // bystander's. A message of our
    // own, published on the same node after it, ends the count.
    let mut publish = redis::cmd("PUBLISH");
    publish.arg("{modes/resource}:c:end").arg("end");
    let _: i64 = fixture.query(&holder.key, &publish).await;
    let mut messages = Vec::new();
    bounded("the messages", async {
        while let Some(message) = heard.next().await {
            let channel = message.get_channel_name().to_owned();
            if channel.ends_with(":c:end") {
                break;
            }
            let payload: String = message.get_payload().expect("payload");
            messages.push((channel, payload));
        }
    })
    .await;
    // A hand-over's `gone` carries the queue it left (two entries; see
    // `messages`), cut here to its first words.
    let messages: Vec<(String, String)> = messages
        .into_iter()
        .map(|(channel, payload)| match payload.strip_prefix("gone ~ q1 2 ") {
            Some(_) => (channel, "gone ~ q1 2".to_owned()),
            None => (channel, payload),
        })
        .collect();
    assert_eq!(
        messages,
        vec![
            (
                "{modes/resource}:c:holder".to_owned(),
                format!("value {token} granted EX, blocks PR")
            ),
            // Deleted by its own session: a release, not a loss.
            ("{modes/resource}:c:waiter".to_owned(), "gone ~ q1 2".to_owned()),
        ],
        "the update (token {token}) published on the set and deleted entries' channels only"
    );
}

/// The lock value block round-trips, binary and empty alike; an update
/// without one leaves it; it is no entry, and outlives the entries.
async fn the_block_round_trips(fixture: &Fixture) {
    let a = fixture.open(TTL).await;
    let only = append(&a, "only", b"granted EX").await;
    assert_eq!(read(&a).await.block, None);
    // A KiB and a header of any bytes, zeros included.
    let block: Vec<u8> = (0..1100u32).map(|i| (i % 256) as u8).collect();
    let version = slot(&read(&a).await, &only).version;
    let write = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[(&only, version)],
        set: &[],
        delete: &[],
        block: Some(&block),
    };
    assert!(update(&a, &write).await.is_some());
    let queue = read(&a).await;
    assert_eq!(queue.block.as_deref(), Some(block.as_slice()));
    assert_eq!(slot(&queue, &only).version, version, "a block write sets no entry");
    let keep = QueueUpdate {
        set: &[(&only, b"granted PR")],
        block: None,
        ..write
    };
    assert!(update(&a, &keep).await.is_some());
    let queue = read(&a).await;
    assert_eq!(queue.block.as_deref(), Some(block.as_slice()));
    assert_eq!(entries(&queue), vec![only.clone()], "the block is no entry");
    assert_eq!(bounded("list", a.list(DIR)).await.expect("list"), vec![only.clone()]);
    let empty = QueueUpdate {
        unchanged: &[(&only, slot(&queue, &only).version)],
        block: Some(b""),
        ..write
    };
    assert!(update(&a, &empty).await.is_some());
    assert_eq!(read(&a).await.block, Some(Vec::new()));
    assert!(bounded("remove", a.remove(&only)).await.expect("remove"));
    let left = read(&a).await;
    assert!(left.slots.is_empty());
    assert_eq!(left.block, Some(Vec::new()), "the block outlives the entries");
}

/// The other primitives work on a lock-mode entry: `set_value` (a write
/// like any other: a new version), `get_value`, `list` with its kind,
/// `abandon`; and the block's key is refused to fenced writes.
async fn other_primitives_work_on_lock_mode_entries(fixture: &Fixture) {
    let (a, b) = (fixture.open(TTL).await, fixture.open(TTL).await);
    let entry = append(&a, "entry", b"v1").await;
    let before = slot(&read(&b).await, &entry).clone();
    bounded("set", b.set_value(&entry, b"v2")).await.expect("set_value");
    assert_eq!(
        bounded("get", a.get_value(&entry)).await.expect("get").as_deref(),
        Some(&b"v2"[..])
    );
    let after = slot(&read(&b).await, &entry).clone();
    assert!(after.changed > before.changed);
    assert_ne!(after.version, before.version);
    let stale = QueueUpdate {
        dir: DIR,
        present: &[],
        unchanged: &[(&entry, before.version)],
        set: &[(&entry, b"v3")],
        delete: &[],
        block: None,
    };
    assert_eq!(update(&b, &stale).await, None);
    let listed = bounded("list", b.list(DIR)).await.expect("list");
    assert_eq!(listed.iter().map(|e| e.kind).collect::<Vec<_>>(), vec![EntryKind::Dlm]);
    bounded("abandon", a.abandon(DIR, EntryKind::Dlm, "entry"))
        .await
        .expect("abandon");
    assert_eq!(bounded("get", b.get_value(&entry)).await.expect("get"), None);
    assert!(read(&b).await.slots.is_empty());
    assert!(matches!(
        fixture.backend().validate_write_key("{modes/resource}:b"),
        Err(Error::InvalidName { .. })
    ));
}

macro_rules! on_node_and_cluster {
    ($($case:ident),* $(,)?) => {
        mod node {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Fixture::node()).await;
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Fixture::cluster()).await;
                }
            )*
        }
    };
}

on_node_and_cluster!(
    read_queue_gives_entries_in_creation_order_with_values,
    an_append_reads_its_queue_in_the_same_script,
    an_append_reads_a_window_of_its_queue,
    a_value_watch_until_watches_past_unwanted_values,
    update_applies_everything_with_a_rising_token,
    a_changed_version_fails_the_update,
    a_present_entry_is_checked_at_any_version,
    a_deleted_or_recreated_entry_fails_the_update,
    a_lost_session_fails_the_update,
    a_set_entry_keeps_its_owner_and_its_ttl,
    watches_wake_on_the_entry_they_watch_only,
    the_block_round_trips,
    other_primitives_work_on_lock_mode_entries,
    a_hand_over_tells_its_waiters_the_queue_it_left,
    a_hand_over_tells_its_waiters_a_prefix_through_a_waiting_ex,
    a_queue_heard_is_not_used_after_a_change_of_the_session,
    a_value_message_is_watched_past_without_a_look,
    an_older_hand_over_heard_last_is_not_read,
    an_older_hand_over_heard_last_is_not_kept,
    a_hand_over_grant_is_not_said_on_the_granted_entrys_channel,
);
