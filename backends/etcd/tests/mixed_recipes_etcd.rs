//! Recipes that cannot share a queue are refused on one name, whoever wrote
//! the other entry: lockline, or Go's `concurrency.Mutex` layout (a key
//! `<name>/<lease>` with no kind of its own).

use lockline::{Client, Error};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_and_a_mutex_never_share_a_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let holder = client.session().await.expect("session");
    let other = client.session().await.expect("session");

    // A mutex holder (lockline's, in Go's layout): a semaphore refuses to
    // queue behind it instead of granting a permit beside it.
    let guard = holder.mutex("mixed/a").expect("mutex").lock().await.expect("lock");
    let refused = other.semaphore("mixed/a", 2).expect("semaphore").try_acquire().await;
    assert!(matches!(refused, Err(Error::InvalidName { .. })), "{refused:?}");
    guard.release().await.expect("release");

    // A permit holder: a mutex refuses to queue behind it.
    let permit = holder
        .semaphore("mixed/b", 2)
        .expect("semaphore")
        .acquire()
        .await
        .expect("acquire");
    let refused = other.mutex("mixed/b").expect("mutex").lock().await;
    assert!(matches!(refused, Err(Error::InvalidName { .. })), "{refused:?}");
    other.flush().await;
    let left = other.mutex("mixed/b").expect("mutex").contenders().await.expect("list");
    assert_eq!(left.len(), 1, "the refused contender left an entry: {left:?}");
    permit.release().await.expect("release");
}
