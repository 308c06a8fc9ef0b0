//! Fenced writes on ZooKeeper: paths are absolute under the connect string's
//! chroot, missing parents are created, a put creates or sets, and one
//! failing operation fails the whole `multi`.

mod support;

use lockline::conformance::bounded;
use lockline::{Client, Error, Write};
use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_that_are_not_absolute_znodes_are_refused() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let session = Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session()
        .await
        .expect("session");
    let guard = bounded("lock", session.mutex("jobs").expect("mutex").lock())
        .await
        .expect("lock");
    for bad in [
        "",
        "relative/path",
        "/",
        "/a/",
        "/a//b",
        "/a/./b",
        "/a/../b",
        "/zookeeper/quota",
        "/tab\tx",
    ] {
        match guard.write_if_held([Write::put(bad, "x")]).await {
            Err(Error::InvalidName { name, .. }) => assert_eq!(name, bad),
            other => panic!("{bad:?} must be refused, got {other:?}"),
        }
        match session.read(bad).await {
            Err(Error::InvalidName { .. }) => {}
            other => panic!("reading {bad:?} must be refused, got {other:?}"),
        }
    }
    // The lock's own directory and anything under it.
    for own in ["/jobs", "/jobs/state"] {
        match guard.write_if_held([Write::put(own, "x")]).await {
            Err(Error::InvalidName { .. }) => {}
            other => panic!("{own:?} must be refused, got {other:?}"),
        }
    }
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_land_under_the_chroot_with_their_parents() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = support::side_client(&ensemble).await;
    side.create(
        "/apps",
        b"",
        &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
    )
    .await
    .expect("create the chroot");
    let connect = format!("{}/apps", ensemble.connect_string());
    let session = Client::new(ZooKeeper::new(connect.as_str()))
        .session()
        .await
        .expect("session");
    let guard = bounded("lock", session.mutex("jobs").expect("mutex").lock())
        .await
        .expect("lock");
    bounded(
        "write",
        guard.write_if_held([
            Write::put("/state/a/b/c", "deep"),
            Write::put("/state/x", "1"),
            Write::put("/top", "2"),
        ]),
    )
    .await
    .expect("write");
    let (data, stat) = side
        .get_data("/apps/state/a/b/c")
        .await
        .expect("written under the chroot");
    assert_eq!(data, b"deep");
    assert_eq!(stat.ephemeral_owner, 0, "guarded state must be persistent");
    assert_eq!(side.get_data("/apps/state/x").await.expect("x").0, b"1");
    assert_eq!(side.get_data("/apps/top").await.expect("top").0, b"2");
    // A put on an existing node sets its data.
    bounded("write", guard.write_if_held([Write::put("/top", "3")]))
        .await
        .expect("write");
    assert_eq!(session.read("/top").await.expect("read"), Some(b"3".to_vec()));
    assert_eq!(side.get_data("/apps/top").await.expect("top").0, b"3");

    // A delete of a node with children fails the whole multi: the put before
    // it is not applied either.
    match guard
        .write_if_held([Write::put("/top", "4"), Write::delete("/state/a")])
        .await
    {
        Err(Error::InvalidOptions { reason }) => assert!(reason.contains("children"), "{reason}"),
        other => panic!("deleting a node with children must fail, got {other:?}"),
    }
    assert_eq!(
        side.get_data("/apps/top").await.expect("top").0,
        b"3",
        "part of a failed multi landed"
    );
    bounded(
        "write",
        guard.write_if_held([Write::delete("/state/a/b/c"), Write::delete("/state/missing")]),
    )
    .await
    .expect("delete");
    assert_eq!(side.check_stat("/apps/state/a/b/c").await.expect("stat"), None);
    guard.release().await.expect("release");
}

/// A fenced write never creates a node (nor a parent) named like a lock
/// contender: it would stand in its parent lock's queue as a holder nobody
/// releases, or make that lock refuse every acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_named_like_contenders_are_refused() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let session = Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session()
        .await
        .expect("session");
    let guard = session.mutex("mine").expect("mutex").lock().await.expect("lock");
    for key in [
        "/other/leases",
        "/other/0123456789abcdef0123456789abcdef",
        "/other/x-state-0000000001",
        "/other/_c_abc-lock-0000000001",
        "/other/locks/state",
    ] {
        match guard.write_if_held([Write::put(key, "x")]).await {
            Err(Error::InvalidName { name, reason }) => {
                assert_eq!(name, key);
                assert!(reason.contains("would block"), "{reason}");
            }
            other => panic!("{key}: expected InvalidName, got {other:?}"),
        }
    }
    let other = session
        .mutex("other")
        .expect("mutex")
        .try_lock()
        .await
        .expect("try_lock");
    assert!(other.is_some(), "lock `other` is free");
    drop(other);
    guard
        .write_if_held([Write::put("/app/config/epoch", "1")])
        .await
        .expect("ordinary paths");
    assert_eq!(session.read("/other/leases").await.expect("read"), None);
}

/// Faults at each step of a fenced write: the answer of its existence read
/// (multi-read) lost, then the answer of its `multi` lost after the server
/// applied it. Each is `Unavailable`, the session survives the reconnect
/// with the lock held, and the same batch tried again lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_is_lost_is_unavailable_and_safe_to_retry() {
    const MULTI: &[i32] = &[14];
    const MULTI_READ: &[i32] = &[22];
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = lockline_testkit::TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let session = Client::new(ZooKeeper::new(proxy.address()))
        .session()
        .await
        .expect("session");
    let guard = session.mutex("cut/lock").expect("mutex").lock().await.expect("lock");
    let side = support::side_client(&ensemble).await;

    for (step, opcodes, value) in [("the existence read", MULTI_READ, "1"), ("the multi", MULTI, "2")] {
        proxy.lose_zk_responses(opcodes, "", 1);
        let lost = bounded("write", guard.write_if_held([Write::put("/cut/state", value)])).await;
        assert!(matches!(lost, Err(Error::Unavailable { .. })), "{step}: {lost:?}");
        assert_eq!(proxy.zk_losses_pending(), 0, "{step}: the fault was not injected");
        assert!(guard.is_held(), "{step}: a lost answer is not a loss");
        bounded("retry", guard.write_if_held([Write::put("/cut/state", value)]))
            .await
            .unwrap_or_else(|e| panic!("{step}: the same batch tried again: {e}"));
        let (data, _) = side.get_data("/cut/state").await.expect("get");
        assert_eq!(data, value.as_bytes(), "{step}");
    }
    guard.release().await.expect("release");
}

/// A write the server refuses for a reason of the path (its parent is an
/// ephemeral node, which can have no children) says which path, so a log
/// line is enough to act on (found by review: only the server's words).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_names_its_path() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = support::side_client(&ensemble).await;
    side.create(
        "/eph",
        b"",
        &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all()),
    )
    .await
    .expect("create an ephemeral node");
    let session = Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session()
        .await
        .expect("session");
    let guard = bounded("lock", session.mutex("/jobs-eph").expect("mutex").lock())
        .await
        .expect("lock");
    let error = bounded("write", guard.write_if_held([Write::put("/eph/child", "x")]))
        .await
        .expect_err("an ephemeral node can have no children");
    assert!(error.to_string().contains("/eph"), "{error}");
    guard.release().await.expect("release");
}
