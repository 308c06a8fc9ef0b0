//! A value too large for the server is refused at once with a typed error,
//! never retried until the caller gives up.

use lockline::conformance::values_too_large_are_refused;
use lockline::Client;
use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_too_large_for_the_server_are_refused_at_once() {
    let cluster = ZkEnsemble::start().expect("start ZooKeeper");
    values_too_large_are_refused(&Client::new(ZooKeeper::new(cluster.connect_string())), "/large/state").await;
}

/// Many small writes whose paths and values fit but whose `multi` packet
/// (each operation's header and ACLs) would not: refused up front as too
/// large, the session untouched (found by review: the server dropped the
/// connection and the batch was retried for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_too_large_on_the_wire_is_refused_at_once() {
    let cluster = ZkEnsemble::start().expect("start ZooKeeper");
    let session = Client::new(ZooKeeper::new(cluster.connect_string()))
        .session()
        .await
        .expect("session");
    let guard = session.mutex("/large/many").expect("mutex").lock().await.expect("lock");
    let batch: Vec<lockline::Write> = (0..25_000)
        .map(|i| lockline::Write::put(format!("/many/{i}"), "v"))
        .collect();
    match guard.write_if_held(batch).await {
        Err(lockline::Error::InvalidOptions { reason }) => assert!(reason.contains("too large"), "{reason}"),
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    assert_eq!(session.state(), lockline::SessionState::Live);
    assert!(guard.is_held());
    guard
        .write_if_held((0..100).map(|i| lockline::Write::put(format!("/many/{i}"), "v")))
        .await
        .expect("a batch that fits");
    guard.release().await.expect("release");
}

/// The size check counts what the client library adds: the chroot before
/// every path, and the ACLs of every created node (found by review: 2,000
/// long paths under a long chroot passed the check and dropped the
/// connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_size_check_counts_the_chroot() {
    let cluster = ZkEnsemble::start().expect("start ZooKeeper");
    let chroot = format!("/{}", "c".repeat(200));
    let session = Client::new(ZooKeeper::new(format!("{}{chroot}", cluster.connect_string())))
        .session()
        .await
        .expect("session");
    let guard = session
        .mutex("/large/chroot")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let batch: Vec<lockline::Write> = (0..2_000)
        .map(|i| lockline::Write::put(format!("/p/{i:0>390}"), "v"))
        .collect();
    match guard.write_if_held(batch).await {
        Err(lockline::Error::InvalidOptions { reason }) => assert!(reason.contains("too large"), "{reason}"),
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    assert_eq!(session.state(), lockline::SessionState::Live);
    guard.release().await.expect("release");
}
