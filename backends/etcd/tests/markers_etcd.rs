//! Markers of cancelled acquires stay out of every lock's way, and a reader
//! is refused beside a semaphore permit of its name.

use lockline::conformance::{bounded, until};
use lockline::{Client, Error};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

/// An acquire of the nested lock `app/jobs` cancelled while its append is in
/// flight leaves a marker that fences the late append; the marker lives in a
/// namespace of its own, so `etcdctl lock app` (which counts every key under
/// `app/`) is not blocked by it while the lockline session stays alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_markers_never_block_etcdctl_lock_on_a_parent_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let session = client.session().await.expect("session");
    let mutex = session.mutex("app/jobs").expect("mutex");
    // The append is sent but held on its way: cancel the acquire meanwhile.
    proxy.set_requests_held(true);
    let acquire = tokio::spawn(async move { mutex.lock().await });
    until("the append is on its way", || proxy.held_request_bytes() > 0).await;
    acquire.abort();
    let _ = acquire.await;
    proxy.set_requests_held(false);
    bounded("background cleanup", session.flush()).await;
    let keys = cluster.keys("").expect("keys");
    let marker = keys
        .iter()
        .find(|k| k.starts_with("__lockline_abandoned__/"))
        .unwrap_or_else(|| panic!("the cancelled attempt left no marker: {keys:?}"));
    assert!(
        keys.iter().all(|k| !k.starts_with("app/")),
        "a cancelled acquire left a key under app/: {keys:?}"
    );
    // Every lockline contender has gone; the lockline session is idle and live.
    let start = std::time::Instant::now();
    let status = std::process::Command::new("timeout")
        .arg("5")
        .arg("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", cluster.endpoints().join(",")))
        .args(["lock", "app", "true"])
        .status()
        .expect("etcdctl lock");
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
