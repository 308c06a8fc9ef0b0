//! A release retried after its first try was cut off: its answer lost,
//! its session ended meanwhile, or its entry deleted by another client.

use super::*;

/// A single-node etcd, a proxy in front of it, and a session through the
/// proxy (TTL 30 s) with the given request timeout, on a backend whose
/// releases all write the hand-over marker (the evidence of a release
/// retried after a cut-off try).
async fn behind_a_proxy(request_timeout: Duration) -> (EtcdCluster, TcpProxy, lockline::Session) {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let session = Client::new(Etcd::new([format!("http://{}", proxy.address())]).with_release_markers())
        .session_with(options(30).with_request_timeout(request_timeout))
        .await
        .expect("session");
    (cluster, proxy, session)
}

/// Holds a lock through a proxy, releases it with the server's answers
/// dropped, waits until the server has applied the removal, runs `meanwhile`
/// (given the cluster and the session), then cuts the connection before any
/// answer came back: the release sees a transport error and tries again on a
/// new connection. Returns what the release reported; asserts nothing is left.
async fn release_with_its_answer_lost<F, Fut>(meanwhile: F) -> lockline::Result<()>
where
    F: FnOnce(EtcdCluster, lockline::Session) -> Fut,
    Fut: std::future::Future<Output = (EtcdCluster, lockline::Session)>,
{
    let (cluster, proxy, session) = behind_a_proxy(Duration::from_secs(3)).await;
    let guard = session.mutex("lost-answer").expect("mutex").lock().await.expect("lock");
    let key = session.queue("lost-answer").await.expect("queue")[0].key.clone();

    proxy.set_responses_dropped(true);
    let release = tokio::spawn(guard.release());
    let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    bounded("the removal applied", async {
        while !side.get(key.as_str(), None).await.expect("get").kvs().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let (_cluster, _session) = meanwhile(cluster, session).await;
    proxy.block();
    proxy.set_responses_dropped(false);
    proxy.unblock();
    let released = bounded("release", release).await.expect("task");
    assert!(side.get(key.as_str(), None).await.expect("get").kvs().is_empty());
    released
}

/// A release whose removal the server applied but whose answer was lost is
/// tried again; that retry finds the entry gone — removed by the first try —
/// and the release is reported as done, not as a lost lock (a flaky
/// `LockLost` at the end of a fault test was this).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_answer_was_lost_is_not_reported_as_a_lost_lock() {
    release_with_its_answer_lost(|cluster, session| async { (cluster, session) })
        .await
        .expect("a release whose first try removed the entry is a release");
}

/// The same lost answer, but the session's lease is revoked meanwhile: the
/// retry's empty-handed removal is not taken for a release, since the
/// server no longer confirms the session (its end may be what removed the
/// entry, and others may have been granted since).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_release_on_a_session_that_ended_is_not_a_release() {
    let released = release_with_its_answer_lost(|cluster, session| async move {
        revoke(&cluster, &session).await;
        (cluster, session)
    })
    .await;
    assert!(
        matches!(released, Err(Error::SessionLost { .. } | Error::Unavailable { .. })),
        "a session the server no longer has must not report a release: {released:?}"
    );
}

/// A release cut off in transit while another client deleted its entry: the
/// retry finds the entry gone, and the session's hand-over marker, read as
/// of the entry's deletion, was not written by it, so the release answers
/// `LockLost` instead of reporting a release (it did before). The session released the same lock
/// once before, so the marker exists with an older removal's revision.
/// Its backend is built `with_release_markers()`: without it, and without a
/// lock-delayed contender on the lock, a release leaves no trace of who
/// deleted the entry, and is reported as done (as Go's `Unlock` is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_release_whose_entry_another_client_deleted_is_a_lost_lock() {
    let (cluster, proxy, session) = behind_a_proxy(Duration::from_secs(3)).await;
    let mutex = session.mutex("deleted-meanwhile").expect("mutex");
    mutex
        .lock()
        .await
        .expect("lock")
        .release()
        .await
        .expect("first release");
    let guard = mutex.lock().await.expect("lock again");
    let key = guard.key().to_owned();
    let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");

    // The release's first try is kept back by the proxy, never to arrive.
    proxy.set_requests_held(true);
    let release = tokio::spawn(guard.release());
    bounded("the release sent into the proxy", async {
        while proxy.held_request_bytes() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Another client deletes the entry meanwhile; then the connection the
    // first try went out on is cut, and the retry gets through.
    side.delete(key.as_str(), None).await.expect("delete");
    proxy.orphan_connections();
    proxy.set_requests_held(false);
    let released = bounded("release", release).await.expect("task");
    assert!(
        matches!(released, Err(Error::LockLost { .. })),
        "an entry another client deleted must not be reported as released: {released:?}"
    );
    assert_eq!(session.state(), lockline::SessionState::Live);
}

/// The same foreign delete under a silent partition (a proxy that drops
/// every byte and resets nothing): the release's request goes unanswered
/// for the request timeout, and the release must not be reported as done;
/// it fails as `Unavailable` (or `LockLost`), never `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_cut_off_release_whose_entry_another_client_deleted_is_not_a_release() {
    let (cluster, proxy, session) = behind_a_proxy(Duration::from_secs(2)).await;
    let guard = session
        .mutex("silent-delete")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let key = guard.key().to_owned();
    let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    proxy.blackhole();
    let release = tokio::spawn(guard.release());
    side.delete(key.as_str(), None).await.expect("delete");
    let released = bounded("release", release).await.expect("task");
    proxy.heal();
    assert!(
        matches!(released, Err(Error::Unavailable { .. } | Error::LockLost { .. })),
        "a release the server never confirmed, of an entry another client deleted, must not be Ok: {released:?}"
    );
}
