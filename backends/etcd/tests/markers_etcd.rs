//! Markers of cancelled acquires stay out of the way of Go's and etcdctl's
//! contenders (of the same name by default; of every name under a marker
//! prefix of their own), and a reader is refused beside a semaphore permit
//! of its name.

use lockline::conformance::{bounded, until};
use lockline::{Client, Error, Session};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

/// Cancels an acquire of `name` while its append is held on its way to the
/// server, so that the attempt leaves its abandoned-attempt marker; returns
/// the still live session.
async fn cancel_an_append(cluster: &EtcdCluster, backend: impl Fn(String) -> Etcd, name: &str) -> (TcpProxy, Session) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(backend(format!("http://{}", proxy.address())));
    let session = client.session().await.expect("session");
    let mutex = session.mutex(name).expect("mutex");
    proxy.set_requests_held(true);
    let acquire = tokio::spawn(async move { mutex.lock().await });
    until("the append is on its way", || proxy.held_requests() > 0).await;
    acquire.abort();
    let _ = acquire.await;
    proxy.set_requests_held(false);
    bounded("background cleanup", session.flush()).await;
    (proxy, session)
}

/// `etcdctl lock NAME true` within 5 s.
fn etcdctl_lock(cluster: &EtcdCluster, name: &str) -> std::process::ExitStatus {
    std::process::Command::new("timeout")
        .arg("5")
        .arg("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", cluster.endpoints().join(",")))
        .args(["lock", name, "true"])
        .status()
        .expect("etcdctl lock")
}

/// By default the marker an abandoned acquire of `app/jobs` leaves lives
/// beside the lock, in the key range of its name (`app/jobs` NUL
/// `lockline/...`) but outside its prefix `app/jobs/`, so `etcdctl lock
/// app/jobs` (which counts every key under `app/jobs/`) is not blocked by
/// it while the lockline session stays alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_markers_beside_a_lock_never_block_etcdctl_lock_on_its_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (_proxy, session) = cancel_an_append(&cluster, |endpoint| Etcd::new([endpoint]), "app/jobs").await;
    let keys = cluster.keys("").expect("keys");
    let marker = keys
        .iter()
        .find(|k| k.starts_with("app/jobs\0lockline/"))
        .unwrap_or_else(|| panic!("the cancelled attempt left no marker beside app/jobs: {keys:?}"));
    assert!(
        keys.iter().all(|k| !k.starts_with("app/jobs/")),
        "a cancelled acquire left a key under app/jobs/: {keys:?}"
    );
    let start = std::time::Instant::now();
    let status = etcdctl_lock(&cluster, "app/jobs");
    assert!(
        status.success(),
        "etcdctl lock app/jobs waited {:?} behind lockline's marker {marker:?} ({status:?})",
        start.elapsed()
    );
    drop(session);
}

/// With markers under a prefix of their own ([`lockline_etcd::MARKER_PREFIX`])
/// they are under no lock's prefix at all: not even `etcdctl lock app`, a
/// parent of the lock `app/jobs`, is blocked by the marker an abandoned
/// acquire of `app/jobs` leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_markers_under_their_own_prefix_never_block_etcdctl_lock_on_a_parent_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let backend = |endpoint| Etcd::new([endpoint]).with_marker_prefix(lockline_etcd::MARKER_PREFIX);
    let (_proxy, session) = cancel_an_append(&cluster, backend, "app/jobs").await;
    let keys = cluster.keys("").expect("keys");
    let marker = keys
        .iter()
        .find(|k| k.starts_with(lockline_etcd::MARKER_PREFIX))
        .unwrap_or_else(|| panic!("the cancelled attempt left no marker: {keys:?}"));
    assert!(
        keys.iter().all(|k| !k.starts_with("app/")),
        "a cancelled acquire left a key under app/: {keys:?}"
    );
    let start = std::time::Instant::now();
    let status = etcdctl_lock(&cluster, "app");
    assert!(
        status.success(),
        "etcdctl lock app waited {:?} behind lockline's marker {marker:?} of the idle lock app/jobs ({status:?})",
        start.elapsed()
    );
    drop(session);
}

/// A semaphore never queues with another kind: a reader that finds a permit
/// of its name among the entries it reads is refused (etcd readers read every
/// entry of the name, not only writers').
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_is_refused_beside_a_semaphore_permit_of_its_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let a = client.session().await.expect("session");
    let b = client.session().await.expect("session");
    let permit = a
        .semaphore("mix/sem", 1)
        .expect("semaphore")
        .acquire()
        .await
        .expect("permit");
    let read = b.rwlock("mix/sem").expect("rwlock").try_read().await;
    assert!(
        matches!(read, Err(Error::InvalidName { .. }) | Ok(None)),
        "a reader was granted beside permit {}: {read:?}",
        permit.key()
    );
}

/// A marker prefix under which markers have the shape of a lock's entries
/// (`locks/read/`: an abandoned attempt's marker `locks/read/<lease
/// hex>-<attempt>` is a reader of the lock `locks`, which its writers would
/// wait on until the session ends) is refused when a session opens, before
/// anything is sent (found by fuzzing the layout).
#[tokio::test]
async fn a_marker_prefix_where_markers_look_like_entries_is_refused() {
    for prefix in ["locks/read/", "locks/write/", "a/semaphore/", "locks/read/ab"] {
        // Nothing listens there: the refusal comes before any connection.
        let client = Client::new(Etcd::new(["http://127.0.0.1:9"]).with_marker_prefix(prefix));
        match client.session().await {
            Err(Error::InvalidOptions { reason }) => {
                assert!(reason.contains("shape of entries of the lock"), "{prefix:?}: {reason}")
            }
            other => panic!("{prefix:?}: {other:?}"),
        }
    }
}
