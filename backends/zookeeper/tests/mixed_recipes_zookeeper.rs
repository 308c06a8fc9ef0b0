//! Recipes that cannot share a queue are refused on one path, whoever wrote
//! the other entry: lockline, or kazoo's `Lock` (`__lock__` nodes).

use std::time::Duration;

use lockline::{Client, Error};
use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_and_a_mutex_never_share_a_path() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let holder = client.session().await.expect("session");
    let other = client.session().await.expect("session");

    let guard = holder.mutex("mixed/a").expect("mutex").lock().await.expect("lock");
    let refused = other.semaphore("mixed/a", 2).expect("semaphore").try_acquire().await;
    assert!(matches!(refused, Err(Error::InvalidName { .. })), "{refused:?}");
    guard.release().await.expect("release");

    let permit = holder
        .semaphore("mixed/b", 2)
        .expect("semaphore")
        .acquire()
        .await
        .expect("acquire");
    let refused = other
        .mutex("mixed/b")
        .expect("mutex")
        .lock_timeout(Duration::from_secs(10))
        .await;
    assert!(matches!(refused, Err(Error::InvalidName { .. })), "{refused:?}");
    other.flush().await;
    let left = other
        .semaphore("mixed/b", 2)
        .expect("semaphore")
        .contenders()
        .await
        .expect("list");
    assert_eq!(left.len(), 1, "the refused contender left an entry: {left:?}");
    permit.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trailing_slash_is_refused_with_the_name_to_use() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let session = Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session()
        .await
        .expect("session");
    match session.mutex("/my-lock/") {
        Err(Error::InvalidName { reason, .. }) => assert!(reason.contains("\"/my-lock\""), "{reason}"),
        other => panic!("a trailing '/' must be refused on ZooKeeper, got {other:?}"),
    }
}
