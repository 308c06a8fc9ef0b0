//! Safety under faults on ZooKeeper: a holder cut off by a *silent* partition
//! learns of its loss before the server can grant the lock to anyone else; a
//! lost session is ended on the server; a response lost at any step of an
//! append never leaves a second node; background cleanup outlasts an outage.

use std::time::{Duration, Instant};

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions, SessionState};
use lockline_testkit::{TcpProxy, ZkEnsemble};
use lockline_zookeeper::zookeeper_client::{self as zk, EventType};
use lockline_zookeeper::ZooKeeper;

mod support;
use support::{children, side_client, CREATE, EXISTS, LIST};

/// One holder behind a proxy that goes silent, one waiter on a direct
/// connection: returns (holder's `lost()` after the cut, waiter's grant after
/// the cut).
async fn silent_partition(ensemble: &ZkEnsemble, name: &str, options: SessionOptions) -> (Duration, Duration) {
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let holder = Client::new(ZooKeeper::new(proxy.address()))
        .session_with(options.clone())
        .await
        .expect("holder session");
    let waiter = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let waiter_session = waiter.session_with(options).await.expect("waiter session");
    let guard = holder.mutex(name).expect("mutex").lock().await.expect("lock");
    let mutex = waiter_session.mutex(name).expect("mutex");
    let queued = tokio::spawn(async move { mutex.lock().await.map(|g| (Instant::now(), g)) });
    lockline::conformance::wait_for_stats(&waiter, |s| s.waits == 1).await;

    let mut states = holder.watch_state();
    let seen = tokio::spawn(async move {
        let mut seen = vec![*states.borrow_and_update()];
        while *seen.last().unwrap_or(&SessionState::Lost) != SessionState::Lost {
            if states.changed().await.is_err() {
                break;
            }
            let state = *states.borrow_and_update();
            if seen.last() != Some(&state) {
                seen.push(state);
            }
        }
        seen
    });
    proxy.blackhole();
    let cut = Instant::now();
    let lost = async {
        guard.lost().await;
        Instant::now()
    };
    let (lost_at, granted) = tokio::join!(
        bounded("the holder learns", lost),
        bounded("the waiter's grant", queued)
    );
    let (granted_at, next) = granted
        .expect("task")
        .expect("granted once the server expired the holder");
    assert!(!guard.is_held());
    assert_eq!(holder.state(), SessionState::Lost);
    let seen = bounded("the state history", seen).await.expect("task");
    assert_eq!(
        seen,
        [SessionState::Live, SessionState::Suspended, SessionState::Lost],
        "{name}: states under a silent partition"
    );
    next.release().await.expect("release");
    drop(proxy);
    (lost_at - cut, granted_at - cut)
}

/// DESIGN §6.9: the loss deadline counts from the last confirmation the server
/// gave, so a silent partition (no reset; the client library notices only
/// after its own timeout) is declared lost before the server expires the
/// session and grants the next waiter. Default options and TTLs of 2 and 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_partition_is_lost_before_the_lock_is_granted_again() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let cases = [
        ("silent/default", SessionOptions::new()),
        ("silent/ttl2", SessionOptions::new().with_ttl(Duration::from_secs(2))),
        ("silent/ttl3", SessionOptions::new().with_ttl(Duration::from_secs(3))),
    ];
    let runs = cases
        .clone()
        .map(|(name, options)| silent_partition(&ensemble, name, options));
    let [default, two, three] = runs;
    let results = tokio::join!(default, two, three);
    for ((name, _), (lost, granted)) in cases.iter().zip([results.0, results.1, results.2]) {
        println!("{name}: lost() {lost:?} after the cut, next grant {granted:?} after it");
        assert!(
            lost < granted,
            "{name}: lost() fired {lost:?} after the cut, but the lock was granted again at {granted:?}"
        );
    }
}

/// DESIGN §6.11: a session declared lost is closed on the server even if the
/// partition heals before the server would have expired it, so its node does
/// not come back to block others; and closing it keeps it `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_is_ended_on_the_server_when_the_partition_heals() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let options = SessionOptions::new()
        .with_ttl(Duration::from_secs(8))
        .with_safety_margin(Duration::from_secs(4));
    let session = Client::new(ZooKeeper::new(proxy.address()))
        .session_with(options)
        .await
        .expect("session");
    let guard = session.mutex("heal/lock").expect("mutex").lock().await.expect("lock");
    let side = side_client(&ensemble).await;
    let (stat, deleted) = side.check_and_watch_stat(guard.key()).await.expect("watch the node");
    assert!(stat.is_some());

    proxy.blackhole();
    let cut = Instant::now();
    bounded("declared lost", guard.lost()).await;
    // Heal well before the server's 8 s timeout: the same session could
    // re-attach, but must not.
    assert!(cut.elapsed() < Duration::from_secs(6), "lost after {:?}", cut.elapsed());
    proxy.heal();
    let event = bounded("the lost session's node is deleted", deleted.changed()).await;
    assert_eq!(event.event_type, EventType::NodeDeleted);
    assert!(
        cut.elapsed() < Duration::from_secs(8),
        "deleted only by the server's expiry, {:?} after the cut",
        cut.elapsed()
    );
    assert_eq!(session.state(), SessionState::Lost);
    session.close().await.expect("close");
    assert_eq!(
        session.state(),
        SessionState::Lost,
        "close() turned a lost session into a closed one"
    );
    let other = Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session()
        .await
        .expect("session");
    let next = bounded("the next contender", other.mutex("heal/lock").expect("mutex").lock())
        .await
        .expect("lock");
    next.release().await.expect("release");
}

/// Opens a session through a ZooKeeper-aware proxy with short timeouts.
async fn through(proxy: &TcpProxy) -> lockline::Session {
    Client::new(ZooKeeper::new(proxy.address()))
        .session_with(
            SessionOptions::new()
                .with_ttl(Duration::from_secs(10))
                .with_request_timeout(Duration::from_secs(2)),
        )
        .await
        .expect("session")
}

/// DESIGN §6.10: the create succeeds but the answer to the listing that
/// follows it is lost, twice (the retry's own look-up too): the retry must
/// find the node it made, not make a second one and wait on the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_listing_after_the_create_never_makes_a_second_node() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let session = through(&proxy).await;
    proxy.lose_zk_responses(LIST, "/retry/list", 2);
    let guard = session
        .mutex("retry/list")
        .expect("mutex")
        .lock_timeout(Duration::from_secs(8))
        .await
        .expect("a free lock is granted despite the lost answers");
    assert_eq!(proxy.zk_losses_pending(), 0, "the faults were not injected");
    let side = side_client(&ensemble).await;
    let nodes = children(&side, "/retry/list").await;
    assert_eq!(nodes.len(), 1, "one attempt made several nodes: {nodes:?}");
    assert_eq!(guard.key(), format!("/retry/list/{}", nodes[0]));
    guard.release().await.expect("release");
    assert!(children(&side, "/retry/list").await.is_empty());
}

/// DESIGN §6.10: the create's answer is lost, and the retry's look-up of the
/// node it may have made fails: a failed look-up is an error to retry, never
/// "no node yet".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_look_up_after_a_lost_create_never_makes_a_second_node() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let session = through(&proxy).await;
    let side = side_client(&ensemble).await;
    // The directory exists, so the first create is the one that makes the node.
    side.mkdir(
        "/retry/lookup",
        &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
    )
    .await
    .expect("mkdir");
    proxy.lose_zk_responses(CREATE, "/retry/lookup/", 1);
    proxy.lose_zk_responses(EXISTS, "/retry/lookup/", 1);
    let granted = session
        .mutex("retry/lookup")
        .expect("mutex")
        .lock_timeout(Duration::from_secs(8))
        .await;
    let guard = match granted {
        Ok(guard) => guard,
        Err(error) => panic!(
            "a free lock was not granted ({error}); nodes: {:?}",
            children(&side, "/retry/lookup").await
        ),
    };
    assert_eq!(proxy.zk_losses_pending(), 0, "the faults were not injected");
    let nodes = children(&side, "/retry/lookup").await;
    assert_eq!(nodes.len(), 1, "one attempt made several nodes: {nodes:?}");
    guard.release().await.expect("release");
}

/// DESIGN §6.10: an acquire cancelled after its create was applied but
/// before its answer arrived leaves no node, whatever the attempt made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_with_a_lost_create_leaves_no_node() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let session = through(&proxy).await;
    let side = side_client(&ensemble).await;
    side.mkdir(
        "/retry/cancel",
        &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
    )
    .await
    .expect("mkdir");
    let (_, _, created) = side.get_and_watch_children("/retry/cancel").await.expect("watch");
    proxy.lose_zk_responses(CREATE, "/retry/cancel/", 1);
    let mutex = session.mutex("retry/cancel").expect("mutex");
    let acquire = tokio::spawn(async move { mutex.lock().await });
    bounded("the node is created", created.changed()).await;
    acquire.abort();
    let _ = acquire.await;
    bounded("background cleanup", session.flush()).await;
    assert!(
        children(&side, "/retry/cancel").await.is_empty(),
        "a cancelled acquire left its node"
    );
}

/// DESIGN §6.13: a guard dropped while the server is unreachable for longer
/// than a few retries is still removed once it comes back (cleanup lives as
/// long as the session), and the next contender is not blocked by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_removed_after_an_outage() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let client = Client::new(ZooKeeper::new(proxy.address()));
    let session = client
        .session_with(
            SessionOptions::new()
                .with_ttl(Duration::from_secs(30))
                .with_request_timeout(Duration::from_secs(1)),
        )
        .await
        .expect("session");
    let guard = session.mutex("outage/lock").expect("mutex").lock().await.expect("lock");
    let key = guard.key().to_owned();
    let side = side_client(&ensemble).await;
    let (_, deleted) = side.check_and_watch_stat(&key).await.expect("watch the node");
    proxy.block();
    let cut = Instant::now();
    drop(guard);
    // The outage: long enough for many failed tries, short of the loss deadline.
    lockline::conformance::wait_for_stats(&client, |s| s.cleanup_failures >= 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(session.state(), SessionState::Suspended);
    proxy.unblock();
    // A release sets the node's data and deletes it in one transaction (the
    // release mark): the watch fires on the change, and the node is gone.
    let event = bounded("the dropped guard's node is deleted", deleted.changed()).await;
    assert!(
        matches!(event.event_type, EventType::NodeDeleted | EventType::NodeDataChanged),
        "{event:?}"
    );
    assert_eq!(side.check_stat(&key).await.expect("stat"), None, "the node is gone");
    bounded("background cleanup", session.flush()).await;
    assert!(
        !session.state().is_over(),
        "{:?} after an outage of {:?}",
        session.state(),
        cut.elapsed()
    );
    // The same session takes the lock again at once: it never waits on its own leftover.
    let again = bounded(
        "the same session again",
        session.mutex("outage/lock").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    again.release().await.expect("release");
}
