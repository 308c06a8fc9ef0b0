//! A lock directory whose ACL lets contenders create nodes but not delete
//! them: the holder's release is refused, and its node must not block the
//! lock for as long as the holder's process runs.

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions, SessionState};
use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(4))
        .with_connect_timeout(Duration::from_secs(3))
        .with_request_timeout(Duration::from_secs(3))
}

/// The release is refused (`PermissionDenied`, operation `delete`); the
/// background removal is refused too, so the session is given up: declared
/// lost and closed, which makes the server delete its node whatever the
/// ACLs. The next contender is granted at once after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_ends_the_session_and_frees_the_lock() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let admin = zk::Client::connect(&ensemble.connect_string()).await.expect("admin");
    admin
        .create(
            "/nodelete",
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::new(&[zk::Acl::new(
                zk::Permission::READ | zk::Permission::CREATE,
                zk::AuthId::anyone(),
            )])),
        )
        .await
        .expect("create /nodelete");

    let holder = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = holder.session_with(options()).await.expect("session");
    let guard = session.mutex("nodelete").expect("mutex").lock().await.expect("lock");
    let released = guard.release().await;
    assert!(
        matches!(
            &released,
            Err(lockline::Error::PermissionDenied {
                operation: "delete",
                ..
            })
        ),
        "{released:?}"
    );
    bounded("the refused removal ends", session.flush()).await;
    assert_eq!(holder.stats().cleanup_failures, 1, "{:?}", holder.stats());
    assert_eq!(bounded("the session ends", session.lost()).await, SessionState::Lost);

    let next = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let other = next.session_with(options()).await.expect("session");
    let granted = bounded(
        "the next contender is granted",
        other.mutex("nodelete").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    let children = admin.list_children("/nodelete").await.expect("list");
    assert_eq!(children.len(), 1, "the given-up session's node is gone: {children:?}");
    assert_eq!(format!("/nodelete/{}", children[0]), granted.key());
}
