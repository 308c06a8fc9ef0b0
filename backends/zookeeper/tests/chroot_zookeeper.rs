//! A connect string's chroot (`host:port/apps/locks`) that does not exist is
//! created when the session opens, as Curator's namespace is; one that cannot
//! be created is an error naming it.

use std::time::Duration;

use lockline::{Client, Error, SessionOptions};
use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

mod support;
use support::{children, side_client};

fn options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_chroot_is_created_and_locks_live_under_it() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    assert_eq!(side.check_stat("/apps").await.expect("stat"), None);
    let connect = format!("{}/apps/team-a", ensemble.connect_string());
    let first = Client::new(ZooKeeper::new(connect.as_str()))
        .session_with(options())
        .await
        .expect("a session on a chroot that does not exist yet");
    let guard = first.mutex("jobs/nightly").expect("mutex").lock().await.expect("lock");
    // The node lives under the chroot, seen from the server's root.
    let nodes = children(&side, "/apps/team-a/jobs/nightly").await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert!(
        guard.key().starts_with("/jobs/nightly/"),
        "keys are relative to the chroot: {}",
        guard.key()
    );
    // A persistent chroot: it outlives the sessions that made it.
    let (_, stat) = side.get_data("/apps/team-a").await.expect("the chroot exists");
    assert_eq!(stat.ephemeral_owner, 0);
    // With the default ACL policy (`Open`), the chroot gets the policy's
    // ACL: anyone may do anything, as on the lock directories.
    let (acl, _) = side.get_acl("/apps/team-a").await.expect("acl");
    assert_eq!(acl, zk::Acls::anyone_all().to_vec(), "the chroot's ACL is the policy's");
    // A second client on the same chroot (which now exists) queues with the first.
    let second = Client::new(ZooKeeper::new(connect.as_str()))
        .session_with(options())
        .await
        .expect("session");
    let other = second.mutex("jobs/nightly").expect("mutex");
    assert!(
        other.try_lock().await.expect("try_lock").is_none(),
        "the same lock under one chroot"
    );
    guard.release().await.expect("release");
    let next = other
        .try_lock()
        .await
        .expect("try_lock")
        .expect("free after the release");
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chroot_that_cannot_be_created_is_an_error_naming_it() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = side_client(&ensemble).await;
    // A parent everyone may read but nobody may create children under.
    let read_only = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_read());
    side.create("/sealed", b"", &read_only).await.expect("create /sealed");
    let connect = format!("{}/sealed/apps", ensemble.connect_string());
    let error = Client::new(ZooKeeper::new(connect.as_str()))
        .session_with(options())
        .await
        .expect_err("the chroot cannot be created");
    match &error {
        Error::PermissionDenied { key, .. } => assert_eq!(key, "/sealed/apps"),
        other => panic!("expected PermissionDenied naming the chroot, got {other:?}"),
    }
    assert!(error.to_string().contains("/sealed/apps"), "{error}");
    assert!(error.to_string().contains("chroot"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chroot_in_the_reserved_subtree_is_refused() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    for chroot in ["/zookeeper", "/zookeeper/apps"] {
        let connect = format!("{}{chroot}", ensemble.connect_string());
        match Client::new(ZooKeeper::new(connect.as_str()))
            .session_with(options())
            .await
        {
            Err(Error::InvalidOptions { reason }) => assert!(reason.contains("reserves"), "{reason}"),
            other => panic!("{chroot}: expected InvalidOptions, got {other:?}"),
        }
    }
}

/// Below a chroot, `zookeeper` is an ordinary name: only the server's own
/// `/zookeeper` is reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_a_chroot_zookeeper_is_an_ordinary_name() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let plain = Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session_with(options())
        .await
        .expect("session");
    assert!(matches!(plain.mutex("zookeeper/x"), Err(Error::InvalidName { .. })));
    for connect in [
        format!("{}/apps", ensemble.connect_string()),
        format!("tcp://{}/apps", ensemble.address(0)),
    ] {
        let session = Client::new(ZooKeeper::new(connect.as_str()))
            .session_with(options())
            .await
            .expect("session");
        let guard = session.mutex("zookeeper/x").expect("mutex").lock().await.expect("lock");
        guard
            .write_if_held([lockline::Write::put("/zookeeper/state", "1")])
            .await
            .expect("a fenced write below the chroot");
        guard.release().await.expect("release");
    }
    let side = side_client(&ensemble).await;
    assert!(side.check_stat("/apps/zookeeper/state").await.expect("stat").is_some());
}
