//! ZooKeeper-specific behaviour: failover, container cleanup, unreachable
//! ensembles, and lost create responses.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, suspend_and_revive, ExclusionWorkload};
use lockline::{Client, Error, SessionOptions};
use lockline_testkit::{free_port, LineChild, TcpProxy, ZkEnsemble, ZkOptions};
use lockline_zookeeper::zookeeper_client::{self as zk, EventType};
use lockline_zookeeper::ZooKeeper;

mod support;
use support::{probe, side_client};

fn options(ttl_secs: u64) -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(ttl_secs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_keeps_exclusion_and_drains_the_queue() {
    let mut ensemble = ZkEnsemble::start_with(3, &ZkOptions::default()).expect("start ZooKeeper");
    let name = "failover/lock";
    const WORKERS: usize = 5;
    const ROUNDS: usize = 12;
    let mut mutexes = Vec::new();
    for _ in 0..WORKERS {
        let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
        let session = client.session_with(options(8)).await.expect("session");
        let mutex = session.mutex(name).expect("mutex");
        mutexes.push(mutex);
    }
    let mut workload = ExclusionWorkload::start(mutexes, ROUNDS);
    // Break the cluster while locks are held and queued.
    workload.granted(WORKERS).await;
    let leader = ensemble.wait_leader().expect("a leader");
    ensemble.member(leader).kill().expect("kill the leader");
    assert_eq!(workload.finish().await, WORKERS * ROUNDS);
    ensemble.wait_leader().expect("a new leader");
    let side = side_client(&ensemble).await;
    match side.list_children("/failover/lock").await {
        Ok(children) => assert!(children.is_empty(), "nodes left behind: {children:?}"),
        Err(zk::Error::NoNode) => {}
        Err(error) => panic!("list: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_directories_are_containers_the_server_removes_when_idle() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session_with(options(5)).await.expect("session");
    let guard = session
        .mutex("containers/job")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let side = side_client(&ensemble).await;
    let (stat, watcher) = side.check_and_watch_stat("/containers/job").await.expect("stat");
    assert!(
        stat.is_some_and(|s| s.ephemeral_owner == 0),
        "the directory is a persistent (container) node"
    );
    guard.release().await.expect("release");
    // The server's container sweep (every 500 ms in the test server) deletes it.
    let event = bounded("the container is cleaned up", watcher.changed()).await;
    assert_eq!(event.event_type, EventType::NodeDeleted);
    // And the lock still works afterwards: the directory is made again.
    let again = session
        .mutex("containers/job")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    again.release().await.expect("release");
}

#[tokio::test]
async fn unreachable_ensemble_fails_within_the_connect_timeout() {
    let port = free_port().expect("port");
    let client = Client::new(ZooKeeper::new(format!("127.0.0.1:{port}")));
    let started = Instant::now();
    let result = client
        .session_with(options(5).with_connect_timeout(Duration::from_secs(1)))
        .await;
    assert!(matches!(result, Err(Error::Unavailable { .. })), "{result:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_response_never_leaves_a_duplicate() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let client = Client::new(ZooKeeper::new(proxy.address()));
    let session = client
        .session_with(options(10).with_request_timeout(Duration::from_secs(1)))
        .await
        .expect("session");
    let side = side_client(&ensemble).await;
    side.mkdir(
        "/dup/lock",
        &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
    )
    .await
    .expect("mkdir");
    let (_, _, created) = side.get_and_watch_children("/dup/lock").await.expect("watch children");

    // The create reaches the server; its answer is lost with the connection.
    proxy.set_responses_dropped(true);
    let mutex = session.mutex("dup/lock").expect("mutex");
    let acquire = tokio::spawn(async move { mutex.lock().await });
    bounded("the node is created", created.changed()).await;
    let first = side.list_children("/dup/lock").await.expect("list");
    assert_eq!(first.len(), 1);
    proxy.block();
    proxy.set_responses_dropped(false);
    proxy.unblock();

    let guard = bounded("the retried acquire", acquire)
        .await
        .expect("task")
        .expect("lock");
    let children = side.list_children("/dup/lock").await.expect("list");
    assert_eq!(children, first, "a retried create left a duplicate");
    assert_eq!(guard.key(), format!("/dup/lock/{}", first[0]));
    guard.release().await.expect("release");
}

/// A disconnected session is `Suspended` (its locks maybe still held), and
/// `Live` again with its locks when the same session reconnects in time; one
/// that stays cut off is `Lost` before the server could expire it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnection_suspends_and_reconnection_revives_or_loses() {
    use lockline::SessionState;
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let client = Client::new(ZooKeeper::new(proxy.address()));
    let session = client.session_with(options(6)).await.expect("session");
    let guard = suspend_and_revive(&session, "suspend/lock", || proxy.block(), || proxy.unblock()).await;
    let side = side_client(&ensemble).await;
    assert_eq!(side.list_children("/suspend/lock").await.expect("list").len(), 1);

    // Cut off for good: lost a margin before the server's 6 s timeout.
    proxy.block();
    let cut = Instant::now();
    bounded("the holder learns", guard.lost()).await;
    assert_eq!(session.state(), SessionState::Lost);
    assert!(
        cut.elapsed() < Duration::from_secs(6),
        "declared lost after {:?}",
        cut.elapsed()
    );
}

/// How much sooner than the server's removal of a node, as a side client
/// dates it, the waiter may have heard of it: the server tells both of the
/// same transaction, in either order, and each hears it when its task runs.
const SAME_EVENT_SLACK: Duration = Duration::from_millis(100);

/// Dates the deletion of `key` (a node that exists now), from a task of its
/// own: when the side client hears of it.
async fn removal(side: &zk::Client, key: &str) -> tokio::task::JoinHandle<(Instant, EventType)> {
    let (stat, watcher) = side.check_and_watch_stat(key).await.expect("watch");
    assert!(stat.is_some(), "{key} exists");
    tokio::spawn(async move {
        let event = watcher.changed().await;
        (Instant::now(), event.event_type)
    })
}

/// With a lock-delay, a waiter behind a holder that the server removes with
/// its session, one cut off by a silent partition and one whose process was
/// killed, is granted no sooner than the delay after the server removed the
/// holder's node (its session timeout after the holder fell silent); behind
/// a clean release and behind a clean `close()`, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_holds_back_after_a_cut_off_or_killed_holder_only() {
    let delay = Duration::from_millis(1500);
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let waiting = client
        .session_with(options(10).with_lock_delay(delay))
        .await
        .expect("session");
    let granted = |name: &str| {
        let mutex = waiting.mutex(name).expect("mutex");
        async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        }
    };

    // A holder cut off silently: the server expires its session after the
    // 2 s timeout and deletes its node; the lock-delay counts from there.
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let far = Client::new(ZooKeeper::new(proxy.address()));
    let cut = far.session_with(options(2)).await.expect("session");
    let held = cut.mutex("delay/cut").expect("mutex").lock().await.expect("lock");
    let removed = removal(&side, held.key()).await;
    let (waits, delays) = (client.stats().waits, client.stats().lock_delays);
    let waiter = tokio::spawn(granted("delay/cut"));
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
    let cut_at = Instant::now();
    proxy.blackhole();
    bounded("the holder hears of it", held.lost()).await;
    let lost_at = Instant::now();
    let (removed_at, event) = bounded("the server removes the node", removed).await.expect("task");
    assert_eq!(event, EventType::NodeDeleted);
    assert!(
        removed_at >= lost_at,
        "the server removed the node {:?} after the cut, before the holder declared its loss ({:?})",
        removed_at - cut_at,
        lost_at - cut_at
    );
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(
        at + SAME_EVENT_SLACK >= removed_at + delay,
        "granted {:?} after the server removed the cut-off holder's node, within the lock-delay of {delay:?}",
        at.saturating_duration_since(removed_at)
    );
    assert_eq!(client.stats().lock_delays, delays + 1);
    guard.expect("lock").release().await.expect("release");
    proxy.heal();

    // A holder process killed (SIGKILL): its connection closes, its session
    // lives on until the server expires it (2 s), then the lock-delay.
    let mut command = std::process::Command::new(probe());
    command.args([&ensemble.connect_string(), "delay/killed", "hold", "2000"]);
    let mut holder = LineChild::spawn(command).expect("start the probe");
    assert_eq!(holder.line(Duration::from_secs(20)).as_deref(), Some("held"));
    let nodes = side.list_children("/delay/killed").await.expect("list");
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let removed = removal(&side, &format!("/delay/killed/{}", nodes[0])).await;
    let (waits, delays) = (client.stats().waits, client.stats().lock_delays);
    let waiter = tokio::spawn(granted("delay/killed"));
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
    let killed_at = Instant::now();
    holder.signal_and_wait(libc::SIGKILL).expect("kill the holder");
    let (removed_at, event) = bounded("the server removes the node", removed).await.expect("task");
    assert_eq!(event, EventType::NodeDeleted);
    assert!(
        removed_at - killed_at >= Duration::from_secs(1),
        "the killed holder's node went {:?} after the kill, before its session could expire",
        removed_at - killed_at
    );
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(
        at + SAME_EVENT_SLACK >= removed_at + delay,
        "granted {:?} after the server removed the killed holder's node, within the lock-delay of {delay:?}",
        at.saturating_duration_since(removed_at)
    );
    assert_eq!(client.stats().lock_delays, delays + 1);
    guard.expect("lock").release().await.expect("release");

    // A clean release, then a clean close: at once, no lock-delay.
    let delays = client.stats().lock_delays;
    for close in [false, true] {
        let name = if close { "delay/closed" } else { "delay/released" };
        let releasing = Client::new(ZooKeeper::new(ensemble.connect_string()))
            .session_with(options(10))
            .await
            .expect("session");
        let holder = releasing.mutex(name).expect("mutex").lock().await.expect("lock");
        let waits = client.stats().waits;
        let waiter = tokio::spawn(granted(name));
        lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
        let released_at = Instant::now();
        if close {
            releasing.close().await.expect("close");
            drop(holder);
        } else {
            holder.release().await.expect("release");
        }
        let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
        assert!(
            at - released_at < delay,
            "a clean {} was held back: granted {:?} after it",
            if close { "close" } else { "release" },
            at - released_at
        );
        guard.expect("lock").release().await.expect("release");
    }
    assert_eq!(
        client.stats().lock_delays,
        delays,
        "a lock-delay began after a clean hand-over"
    );
}
