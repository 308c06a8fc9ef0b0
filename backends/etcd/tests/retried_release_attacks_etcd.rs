//! Attacks on retried releases and tokens against a real etcd: a release
//! retried after a cut-off first try tells its own removal (its answer lost)
//! from another client's delete by the session's hand-over marker, read as
//! of the entry's deletion (written by every release of a backend built
//! `with_release_markers()`; by default only while a lock-delayed contender
//! flagged the lock), and an append takes its entry's create revision from
//! its transaction's header.

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, Error, Session, SessionOptions, SessionState};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_request_timeout(Duration::from_secs(3))
}

async fn side(cluster: &EtcdCluster) -> lockline_etcd::etcd_client::Client {
    lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client")
}

async fn through(proxy: &TcpProxy, backend: impl FnOnce(Etcd) -> Etcd) -> Session {
    Client::new(backend(Etcd::new([format!("http://{}", proxy.address())])))
        .session_with(options())
        .await
        .expect("session")
}

async fn key_exists(side: &mut lockline_etcd::etcd_client::Client, key: &str) -> bool {
    !side.get(key, None).await.expect("get").kvs().is_empty()
}

/// Releases `guard` with its first try kept back by the proxy, has another
/// client delete its entry meanwhile, then cuts the connection so that the
/// retry gets through; returns what the release answered. Requests already
/// held when it is called stay held and go out with the retry.
async fn release_deleted_meanwhile<F>(
    proxy: &TcpProxy,
    side: &mut lockline_etcd::etcd_client::Client,
    key: &str,
    release: F,
) -> lockline::Result<()>
where
    F: std::future::Future<Output = lockline::Result<()>> + Send + 'static,
{
    proxy.set_requests_held(true);
    let before = proxy.held_request_bytes();
    let release = tokio::spawn(release);
    bounded("the release sent into the proxy", async {
        while proxy.held_request_bytes() == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    side.delete(key, None).await.expect("delete");
    proxy.orphan_connections();
    proxy.set_requests_held(false);
    bounded("release", release).await.expect("task")
}

/// A session with one hand-over marker for every lock (`with_marker_prefix`)
/// holds a lock for long while it takes and releases other locks, as a worker
/// holding a leadership lock does with its jobs. Each of those releases writes
/// the one marker. Another client deletes the long-held entry while its
/// release is cut off in transit: the retry must answer `LockLost`.
///
/// With 15 and with 16 releases since the entry was created (an earlier
/// retry walked back through at most 16 of the marker's versions and, past
/// them, reported the deleted entry released; the retry now reads the marker
/// as of the deletion, whatever was written since).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_delete_is_lost_whatever_the_session_released_since() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let session = through(&proxy, |etcd| {
        etcd.with_marker_prefix("lockline-markers/").with_release_markers()
    })
    .await;
    let mut side = side(&cluster).await;
    for others in [15, 16] {
        let name = format!("leader-{others}");
        let guard = session.mutex(&name).expect("mutex").lock().await.expect("lock");
        let key = guard.key().to_owned();
        for job in 0..others {
            let job = session.mutex(&format!("job-{others}-{job}")).expect("mutex");
            job.lock()
                .await
                .expect("job lock")
                .release()
                .await
                .expect("job release");
        }
        let released = release_deleted_meanwhile(&proxy, &mut side, &key, guard.release()).await;
        assert!(
            matches!(released, Err(Error::LockLost { .. })),
            "after {others} other releases of the session, an entry another client deleted \
             must not be reported as released: {released:?}"
        );
        assert_eq!(session.state(), SessionState::Live);
    }
}

/// The worse mistake, a false `LockLost`: two read locks of one session on one
/// lock share a hand-over marker. Both releases reach the server and remove
/// their entries, their answers lost; the second overwrote the marker the
/// first wrote. Both retries find their entries gone and must still report a
/// release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_of_two_readers_sharing_a_marker_are_releases() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let session = through(&proxy, Etcd::with_release_markers).await;
    let mut side = side(&cluster).await;
    let lock = session.rwlock("shared-marker").expect("rwlock");
    let first = lock.read().await.expect("read");
    let second = lock.read().await.expect("read");
    let keys = [first.key().to_owned(), second.key().to_owned()];

    proxy.set_responses_dropped(true);
    let mut releases = Vec::new();
    for (guard, key) in [(first, &keys[0]), (second, &keys[1])] {
        releases.push(tokio::spawn(guard.release()));
        // One after the other, so the second removal's marker is the newer.
        bounded("the removal applied", async {
            while key_exists(&mut side, key).await {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }
    proxy.block();
    proxy.set_responses_dropped(false);
    proxy.unblock();
    for release in releases {
        let released = bounded("release", release).await.expect("task");
        released.expect("a release whose first try removed the entry is a release");
    }
    assert_eq!(session.state(), SessionState::Live);
}

/// Two permits of one session released at once, both first tries cut off;
/// another client deleted one of them meanwhile. The other's retry writes the
/// shared marker while (or before) the first's retry reads it: the deleted
/// permit is a lost lock, the other a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sibling_retry_overwriting_the_marker_hides_no_foreign_delete() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let session = through(&proxy, Etcd::with_release_markers).await;
    let mut side = side(&cluster).await;
    let semaphore = session.semaphore("permits", 3).expect("semaphore");
    // One release first, so the marker has an older version.
    semaphore
        .acquire()
        .await
        .expect("permit")
        .release()
        .await
        .expect("release");
    let deleted = semaphore.acquire().await.expect("permit");
    let kept = semaphore.acquire().await.expect("permit");
    let (deleted_key, kept_key) = (deleted.key().to_owned(), kept.key().to_owned());

    proxy.set_requests_held(true);
    let kept_release = tokio::spawn(kept.release());
    bounded("the other release sent into the proxy", async {
        while proxy.held_request_bytes() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let released = release_deleted_meanwhile(&proxy, &mut side, &deleted_key, deleted.release()).await;
    let kept_released = bounded("the other release", kept_release).await.expect("task");
    assert!(
        matches!(released, Err(Error::LockLost { .. })),
        "a permit another client deleted must not be reported as released: {released:?}"
    );
    kept_released.expect("the permit nobody else touched is released");
    assert!(!key_exists(&mut side, &kept_key).await);
    assert_eq!(session.state(), SessionState::Live);
}

/// The fencing token of an append is its key's real create revision, read
/// back with a raw client, for many concurrent appends through every member
/// of a three-member cluster under a namespace: the transaction's header
/// revision is its put's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_create_revisions_on_a_cluster_under_a_namespace() {
    let cluster = EtcdCluster::start_cluster(3).expect("start etcd");
    let mut sessions = Vec::new();
    for member in 0..3 {
        let backend = Etcd::new([cluster.endpoint(member)]).with_namespace("tenant/");
        sessions.push(Client::new(backend).session_with(options()).await.expect("session"));
    }
    let mut side = side(&cluster).await;
    // Other writes interleave with the appends, so revisions move between a
    // transaction's put and any read after it.
    let noise = {
        let mut writer = lockline_etcd::etcd_client::Client::connect([cluster.endpoint(1)], None)
            .await
            .expect("writer");
        tokio::spawn(async move {
            for i in 0..200 {
                writer.put(format!("noise/{i}"), "x", None).await.expect("put");
            }
        })
    };
    let mut acquires = Vec::new();
    for _ in 0..8 {
        for session in &sessions {
            let semaphore = session.semaphore("tokens", 64).expect("semaphore");
            let lock = session.rwlock("tokens-rw").expect("rwlock");
            acquires.push(tokio::spawn(async move {
                let permit = semaphore.acquire().await.expect("permit");
                let read = lock.read().await.expect("read");
                let out = [
                    (permit.key().to_owned(), permit.token().get()),
                    (read.key().to_owned(), read.token().get()),
                ];
                (out, permit, read)
            }));
        }
    }
    let mut held = Vec::new();
    let mut checked = 0;
    for acquire in acquires {
        let (out, permit, read) = bounded("acquire", acquire).await.expect("task");
        for (key, token) in out {
            assert!(key.starts_with("tenant/"), "{key}");
            let response = side.get(key.as_str(), None).await.expect("get");
            let kv = response.kvs().first().expect("the entry exists");
            assert_eq!(
                u64::try_from(kv.create_revision()).expect("revision"),
                token,
                "the token of {key} is its create revision"
            );
            checked += 1;
        }
        held.push((permit, read));
    }
    assert_eq!(checked, 2 * 8 * 3);
    noise.await.expect("noise");
    for (permit, read) in held {
        permit.release().await.expect("release");
        read.release().await.expect("release");
    }
}
