//! Attacks on the requests a wait was cut down to (the watch on a
//! contender's own node left to fire in a task of its own, the predecessor's
//! data watch, and a predecessor found gone across a reconnection), against
//! a real server: watches and tasks left behind over many cycles, a
//! predecessor whose data changes without a release (a peer's write, a
//! lock-delayed waiter's mark), a large value on a predecessor, lock-delay
//! with readers and writers, and a cancelled wait.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, until};
use lockline::{Client, Session, SessionOptions};
use lockline_testkit::{TcpProxy, ZkEnsemble};
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

mod support;
use support::{children, side_client};

fn options(ttl_secs: u64) -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(ttl_secs))
}

/// The server's total watch count (`wchs`: "Total watches:N").
fn total_watches(ensemble: &ZkEnsemble) -> u64 {
    let summary = ensemble.four_letter(0, "wchs").expect("wchs");
    summary
        .lines()
        .find_map(|line| line.trim().strip_prefix("Total watches:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no watch total in {summary:?}"))
}

/// Tasks alive on this test's runtime.
fn alive_tasks() -> usize {
    tokio::runtime::Handle::current().metrics().num_alive_tasks()
}

/// Ends `session` on the server as an expiry does (its nodes go with it,
/// no release mark): attaches with its id and password through a direct
/// connection and closes it, while the session's own client is cut off by
/// `proxy`.
async fn expire(ensemble: &ZkEnsemble, proxy: &TcpProxy, session: &Session) {
    let info = lockline_zookeeper::session_info(session).expect("a live ZooKeeper session");
    proxy.block();
    let mut closed = false;
    for _ in 0..20 {
        let attached = zk::Client::connector()
            .with_session(info.clone())
            .with_connection_timeout(Duration::from_secs(2))
            .connect(&ensemble.connect_string())
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
    proxy.unblock();
    assert!(closed, "could not close session {}", session.id());
}

/// Many acquire/release cycles on one session, uncontended and handed over
/// between two sessions, leave no watch on the server and no task in the
/// process behind them (each own-node watch left to fire must fire), and a
/// holder after all of them still hears at once that someone else deleted
/// its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_cycles_leave_no_watch_or_task_behind() {
    const CYCLES: usize = 300;
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let a = client.session_with(options(10)).await.expect("session a");
    let b = client.session_with(options(10)).await.expect("session b");
    // Let every connection's background tasks start.
    let (ma, mb) = (
        a.mutex("cycles/one").expect("mutex"),
        b.mutex("cycles/one").expect("mutex"),
    );
    ma.lock().await.expect("warm-up").release().await.expect("release");
    until("the warm-up's watches fired", || total_watches(&ensemble) == 0).await;
    let tasks = alive_tasks();

    for _ in 0..CYCLES {
        ma.lock().await.expect("lock").release().await.expect("release");
    }
    // Handed over: b waits behind a (its own-node watch is set while it
    // waits and handed on to its hold), then releases.
    for _ in 0..CYCLES / 3 {
        let held = ma.lock().await.expect("lock a");
        let waits = client.stats().waits;
        let waiter = tokio::spawn({
            let mb = mb.clone();
            async move { mb.lock().await }
        });
        lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
        held.release().await.expect("release a");
        let guard = bounded("b is granted", waiter).await.expect("task").expect("lock b");
        guard.release().await.expect("release b");
    }
    until("every own-node watch has fired on the server", || {
        total_watches(&ensemble) == 0
    })
    .await;
    until("every own-node watch task has ended", || alive_tasks() <= tasks).await;

    // After all that, a holder still hears of a deletion by someone else.
    let guard = ma.lock().await.expect("lock");
    until("the holder's own-node watch is set", || {
        ensemble.watches(0, guard.key(), a.id())
    })
    .await;
    side.delete(guard.key(), None).await.expect("delete the holder's node");
    bounded("lost() after a deletion by someone else", guard.lost()).await;
    assert!(!guard.is_held());
}

/// Whether the server holds any watch of the session `id` (`wchc`: each
/// session id on a line, followed by the paths it watches, one a line; a
/// session whose watches are all gone may stay listed with none).
fn session_watches(ensemble: &ZkEnsemble, id: &str) -> bool {
    let listing = ensemble.four_letter(0, "wchc").expect("wchc");
    let watcher = format!("0x{}", id.trim_start_matches("0x"));
    let mut lines = listing
        .lines()
        .skip_while(|line| !line.trim().eq_ignore_ascii_case(&watcher));
    lines.next().is_some() && lines.next().is_some_and(|path| path.trim_start().starts_with('/'))
}

/// A kazoo-style peer's node just ahead of a lockline waiter with a
/// lock-delay, whose data the peer rewrites (a megabyte each time) without
/// leaving: the waiter's data watch fires on each write; it must look again
/// and wait on the same node, never be granted beside it, and read the
/// megabyte without a failure. The peer's plain delete then counts as a
/// loss (documented: other clients' releases look like losses), one delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_rewriting_its_node_is_not_a_departure() {
    const WRITES: u64 = 3;
    let delay = Duration::from_millis(800);
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let peer = side_client(&ensemble).await;
    let all = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    peer.create("/peer", b"", &all).await.expect("create /peer");
    peer.create("/peer/data", b"", &all).await.expect("create /peer/data");
    let sequential = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    peer.create(
        "/peer/data/0123456789abcdef0123456789abcdef__lock__",
        b"kazoo",
        &sequential,
    )
    .await
    .expect("the peer's node");
    let names = children(&peer, "/peer/data").await;
    assert_eq!(names.len(), 1, "{names:?}");
    let node = format!("/peer/data/{}", names[0]);

    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client
        .session_with(options(10).with_lock_delay(delay))
        .await
        .expect("session");
    let mutex = session.mutex("peer/data").expect("mutex");
    let waiter = tokio::spawn(async move {
        let guard = mutex.lock().await;
        (Instant::now(), guard)
    });
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    until("the waiter's watch is on the peer's node", || {
        ensemble.watches(0, &node, session.id())
    })
    .await;
    // Just under what the server takes in one request (jute.maxbuffer).
    let large = vec![b'x'; 1_040_000];
    for write in 1..=WRITES {
        let started = Instant::now();
        peer.set_data(&node, &large, None)
            .await
            .expect("the peer writes its node");
        lockline::conformance::wait_for_stats(&client, |s| s.waits > write).await;
        until("the waiter's watch is back on the peer's node", || {
            ensemble.watches(0, &node, session.id())
        })
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "re-watching a node holding a megabyte took {:?}",
            started.elapsed()
        );
        assert!(
            !waiter.is_finished(),
            "granted beside the peer's node after its write {write}"
        );
    }
    let stats = client.stats();
    assert_eq!(stats.wakeups, WRITES, "one wake per write of the peer's node");
    assert_eq!(stats.lock_delays, 0);
    let deleted_at = Instant::now();
    peer.delete(&node, None).await.expect("the peer lets go");
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(at >= deleted_at + delay, "a plain delete is a loss: held back");
    assert_eq!(client.stats().lock_delays, 1);
    guard.release().await.expect("release");
}

/// A holder lost (its session ended on the server); a waiter with a
/// lock-delay next in line is held back and marks its node meanwhile; a
/// second waiter with a lock-delay behind it is woken by the mark (and by
/// its removal) through its data watch: it must look again and wait on,
/// not be granted beside the first, and once the first releases, be
/// granted at once, never held back for that release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_waiters_mark_is_not_a_departure() {
    let delay = Duration::from_millis(1200);
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let far = Client::new(ZooKeeper::new(proxy.address()));
    let holder = far.session_with(options(10)).await.expect("holder session");
    let held = holder.mutex("delay/chain").expect("mutex").lock().await.expect("lock");
    let delayed = |client: &Client| {
        let client = client.clone();
        async move {
            client
                .session_with(options(10).with_lock_delay(delay))
                .await
                .expect("session")
        }
    };
    let (c1, c2) = (
        Client::new(ZooKeeper::new(ensemble.connect_string())),
        Client::new(ZooKeeper::new(ensemble.connect_string())),
    );
    let (s1, s2) = (delayed(&c1).await, delayed(&c2).await);
    let first = {
        let mutex = s1.mutex("delay/chain").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    lockline::conformance::wait_for_stats(&c1, |s| s.waits >= 1).await;
    until("the first waiter's watch is on the holder's node", || {
        ensemble.watches(0, held.key(), s1.id())
    })
    .await;
    let second = {
        let mutex = s2.mutex("delay/chain").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    lockline::conformance::wait_for_stats(&c2, |s| s.waits >= 1).await;

    // Owed from the start of the expiry: the loss happens inside it.
    let expired_at = Instant::now();
    expire(&ensemble, &proxy, &holder).await;
    lockline::conformance::wait_for_stats(&c1, |s| s.lock_delays == 1).await;
    // The mark woke the second waiter: it looked again and waits on.
    lockline::conformance::wait_for_stats(&c2, |s| s.waits >= 2).await;
    assert!(
        !second.is_finished(),
        "the second waiter was granted on the first's mark"
    );
    let (at, guard) = bounded("the first waiter is granted", first).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        at + Duration::from_millis(300) >= expired_at + delay,
        "the first waiter was granted {:?} after the loss, within its lock-delay",
        at.saturating_duration_since(expired_at)
    );
    // The first's unmark woke the second again: it waits on.
    lockline::conformance::wait_for_stats(&c2, |s| s.waits >= 3).await;
    assert!(!second.is_finished(), "the second waiter was granted beside the first");
    assert!(guard.is_held());
    let released_at = Instant::now();
    guard.release().await.expect("release");
    let (at, second) = bounded("the second waiter is granted", second).await.expect("task");
    let second = second.expect("lock");
    assert!(
        at - released_at < delay,
        "held back {:?} after a release",
        at - released_at
    );
    assert_eq!(c2.stats().lock_delays, 0, "a lock-delay began after a release");
    second.release().await.expect("release");
    drop(held);
}

/// Readers with a lock-delay behind a writer: a writer's release holds none
/// back; a writer lost with its session holds each back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_behind_a_writer_under_lock_delay() {
    let delay = Duration::from_millis(1000);
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let far = Client::new(ZooKeeper::new(proxy.address()));
    let readers: Vec<(Client, Session)> = {
        let mut readers = Vec::new();
        for _ in 0..2 {
            let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
            let session = client
                .session_with(options(10).with_lock_delay(delay))
                .await
                .expect("reader session");
            readers.push((client, session));
        }
        readers
    };
    for lose in [false, true] {
        let writer = far.session_with(options(10)).await.expect("writer session");
        let write = writer.rwlock("delay/rw").expect("rwlock").write().await.expect("write");
        let mut waiting = Vec::new();
        for (client, session) in &readers {
            let waits = client.stats().waits;
            let rw = session.rwlock("delay/rw").expect("rwlock");
            waiting.push(tokio::spawn(async move {
                let guard = rw.read().await;
                (Instant::now(), guard)
            }));
            lockline::conformance::wait_for_stats(client, |s| s.waits > waits).await;
            until("the reader's watch is on the writer's node", || {
                ensemble.watches(0, write.key(), session.id())
            })
            .await;
        }
        let delays: Vec<u64> = readers.iter().map(|(c, _)| c.stats().lock_delays).collect();
        let gone_at = Instant::now();
        if lose {
            expire(&ensemble, &proxy, &writer).await;
        } else {
            write.release().await.expect("release");
        }
        for (i, reader) in waiting.into_iter().enumerate() {
            let (at, guard) = bounded("the reader is granted", reader).await.expect("task");
            let guard = guard.expect("read");
            let held_back = readers[i].0.stats().lock_delays - delays[i];
            if lose {
                assert_eq!(held_back, 1, "reader {i} was not held back after the writer's loss");
                assert!(at >= gone_at + delay - Duration::from_millis(300));
            } else {
                assert_eq!(held_back, 0, "reader {i} was held back after the writer's release");
                assert!(at - gone_at < delay);
            }
            guard.release().await.expect("release");
        }
    }
}

/// A dropped `lock()` future mid-wait leaves no node and no watch of its
/// session on the server, and the contender queued behind it is granted on
/// the holder's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_no_node_and_no_watch() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let (a, b, c) = (
        client.session().await.expect("a"),
        client.session().await.expect("b"),
        client.session().await.expect("c"),
    );
    let held = a.mutex("cancel/one").expect("mutex").lock().await.expect("lock");
    let waits = client.stats().waits;
    let cancelled = {
        let mutex = b.mutex("cancel/one").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
    until("b's watches are set", || ensemble.watches(0, held.key(), b.id())).await;
    assert!(session_watches(&ensemble, b.id()));
    let waits = client.stats().waits;
    let queued = {
        let mutex = c.mutex("cancel/one").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
    cancelled.abort();
    assert!(cancelled.await.is_err_and(|e| e.is_cancelled()));
    bounded("b's node is removed", async {
        loop {
            let (listed, watcher) = side
                .list_and_watch_children("/cancel/one")
                .await
                .expect("list and watch");
            if listed.len() == 2 {
                break;
            }
            watcher.changed().await;
        }
    })
    .await;
    until("no watch of b's session is left", || {
        !session_watches(&ensemble, b.id())
    })
    .await;
    held.release().await.expect("release");
    let guard = bounded("c is granted", queued).await.expect("task").expect("lock");
    assert_eq!(children(&side, "/cancel/one").await.len(), 1);
    guard.release().await.expect("release");
}

/// A peer's node this session may not read (an ACL: creator only, as a
/// kazoo or Curator client with a digest ACL sets) just ahead of a lockline
/// waiter. The server (3.8) delivers a watch's events only to a watcher
/// allowed to READ the node, so no watch of the waiter's would ever fire: it
/// used to fall back to an exists-watch and wait for ever after the peer's
/// node was gone. The acquire is now refused with `PermissionDenied` naming
/// the node, as Curator's waiter fails, and leaves no node behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_an_unreadable_peer_node_is_refused() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let peer = zk::Client::connector()
        .with_auth("digest", b"peer:secret")
        .connect(&ensemble.connect_string())
        .await
        .expect("peer client");
    let all = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    peer.create("/sealed", b"", &all).await.expect("create /sealed");
    peer.create("/sealed/one", b"", &all).await.expect("create /sealed/one");
    let sealed = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::creator_all());
    peer.create(
        "/sealed/one/0123456789abcdef0123456789abcdef__lock__",
        b"kazoo",
        &sealed,
    )
    .await
    .expect("the peer's node");
    let names = children(&peer, "/sealed/one").await;
    let node = format!("/sealed/one/{}", names[0]);

    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let mutex = session.mutex("sealed/one").expect("mutex");
    let Ok(refused) = tokio::time::timeout(Duration::from_secs(10), mutex.lock()).await else {
        panic!("an acquire behind an unreadable node must be refused, not wait for ever");
    };
    match refused {
        Err(lockline::Error::PermissionDenied { key, .. }) => assert_eq!(key, node),
        other => panic!("expected PermissionDenied naming {node}: {other:?}"),
    }
    until("the refused acquire's node is gone", || {
        ensemble
            .four_letter(0, "dump")
            .is_some_and(|dump| dump.matches("/sealed/one/").count() <= 1)
    })
    .await;
    assert_eq!(
        children(&peer, "/sealed/one").await,
        names,
        "only the peer's node is left"
    );
    peer.delete(&node, None).await.expect("the peer lets go");
    mutex
        .lock()
        .await
        .expect("lock once free")
        .release()
        .await
        .expect("release");
}

/// A holder lost (its session ended on the server) while the lock-delayed
/// waiter was cut off: the waiter hears of it only when it reconnects, and
/// must still be held back for its lock-delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_heard_across_a_reconnection_is_a_loss() {
    let delay = Duration::from_millis(1000);
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let (holder_proxy, waiter_proxy) = (
        TcpProxy::start(&ensemble.address(0)).expect("proxy"),
        TcpProxy::start(&ensemble.address(0)).expect("proxy"),
    );
    let holder = Client::new(ZooKeeper::new(holder_proxy.address()))
        .session_with(options(10))
        .await
        .expect("holder session");
    let held = holder.mutex("delay/across").expect("mutex").lock().await.expect("lock");
    let client = Client::new(ZooKeeper::new(waiter_proxy.address()));
    let session = client
        .session_with(options(10).with_lock_delay(delay))
        .await
        .expect("session");
    let mutex = session.mutex("delay/across").expect("mutex");
    let waiter = tokio::spawn(async move {
        let guard = mutex.lock().await;
        (Instant::now(), guard)
    });
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    until("the waiter's watch is on the holder's node", || {
        ensemble.watches(0, held.key(), session.id())
    })
    .await;
    waiter_proxy.block();
    // Owed from the start of the expiry: the loss happens inside it.
    let expired_at = Instant::now();
    expire(&ensemble, &holder_proxy, &holder).await;
    waiter_proxy.unblock();
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert_eq!(
        client.stats().lock_delays,
        1,
        "a loss heard across a reconnection was taken for a release"
    );
    assert!(
        at >= expired_at + delay,
        "granted {:?} after the loss",
        at.saturating_duration_since(expired_at)
    );
    guard.release().await.expect("release");
}

/// Elections under lock-delay: a leader that proclaims a new value (its
/// node's data changes) while a candidate waits is not a departure; a
/// leader lost with its session holds the next candidate back for its
/// lock-delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_under_lock_delay() {
    let delay = Duration::from_millis(1000);
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let leading = Client::new(ZooKeeper::new(proxy.address()))
        .session_with(options(10))
        .await
        .expect("leader session");
    let leader = leading
        .election("delay/elect")
        .expect("election")
        .campaign(b"first")
        .await
        .expect("campaign");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client
        .session_with(options(10).with_lock_delay(delay))
        .await
        .expect("session");
    let election = session.election("delay/elect").expect("election");
    let candidate = tokio::spawn(async move {
        let leadership = election.campaign(b"second").await;
        (Instant::now(), leadership)
    });
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    until("the candidate's watch is on the leader's node", || {
        ensemble.watches(0, leader.key(), session.id())
    })
    .await;
    leader.proclaim(b"first, again").await.expect("proclaim");
    assert_eq!(
        leading
            .election("delay/elect")
            .expect("election")
            .leader()
            .await
            .expect("leader")
            .map(|l| l.value().to_vec()),
        Some(b"first, again".to_vec())
    );
    until("the candidate's watch is back on the leader's node", || {
        ensemble.watches(0, leader.key(), session.id())
    })
    .await;
    assert!(!candidate.is_finished(), "a proclaim was taken for a departure");
    assert_eq!(client.stats().lock_delays, 0);
    // The loss happens somewhere inside `expire` (it cuts the proxy, then
    // has the session ended, which a loaded machine can take longer than
    // the delay): the lock-delay is owed from its start, not its end.
    let expiring_at = Instant::now();
    expire(&ensemble, &proxy, &leading).await;
    let (at, leadership) = bounded("the candidate leads", candidate).await.expect("task");
    let leadership = leadership.expect("campaign");
    assert_eq!(client.stats().lock_delays, 1);
    assert!(
        at + Duration::from_millis(300) >= expiring_at + delay,
        "led {:?} after the expiry began",
        at.saturating_duration_since(expiring_at)
    );
    leadership.resign().await.expect("resign");
}
