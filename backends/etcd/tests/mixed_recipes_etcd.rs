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

/// A lock-mode resource and any other recipe never share a name: a Go-layout
/// key (as `etcdctl lock` writes it) or a lockline mutex holder makes a
/// lock-mode request fail, and a lock-mode holder makes a mutex fail, each
/// leaving no entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_mode_resource_and_another_recipe_never_share_a_name() {
    use lockline::LockMode;
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let holder = client.session().await.expect("session");
    let other = client.session().await.expect("session");

    // A Go-layout key of another client's lease.
    let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    let lease = side.lease_grant(60, None).await.expect("grant").id();
    side.put(
        format!("mixed/go/{lease:x}"),
        "",
        Some(lockline_etcd::etcd_client::PutOptions::new().with_lease(lease)),
    )
    .await
    .expect("put");
    let refused = other
        .resource("mixed/go")
        .expect("resource")
        .try_lock(LockMode::Nl)
        .await;
    assert!(matches!(refused, Err(Error::InvalidName { .. })), "{refused:?}");

    // A lockline mutex holder.
    let guard = holder.mutex("mixed/c").expect("mutex").lock().await.expect("lock");
    let refused = other.resource("mixed/c").expect("resource").lock(LockMode::Cr).await;
    assert!(matches!(refused, Err(Error::InvalidName { .. })), "{refused:?}");
    guard.release().await.expect("release");

    // A lock-mode holder: a mutex refuses to queue behind it.
    let held = holder
        .resource("mixed/d")
        .expect("resource")
        .lock(LockMode::Pr)
        .await
        .expect("lock");
    let refused = other.mutex("mixed/d").expect("mutex").lock().await;
    assert!(matches!(refused, Err(Error::InvalidName { .. })), "{refused:?}");
    other.flush().await;
    holder.flush().await;
    for name in ["mixed/c", "mixed/d"] {
        let left = side
            .get(
                format!("{name}/"),
                Some(lockline_etcd::etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .expect("get");
        let expected = usize::from(name == "mixed/d");
        assert_eq!(left.kvs().len(), expected, "{name}: {:?}", left.kvs());
    }
    held.release().await.expect("release");
}
