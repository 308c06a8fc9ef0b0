//! The hand-over marker is pay-per-use: a release writes it only while a
//! contender with a lock-delay has flagged the lock. Without lock-delay a
//! release is the plain fenced delete (one revision, no key created); with a
//! lock-delayed waiter queued, the waiter still tells its predecessor's
//! release (or close) from its loss.

use std::time::{Duration, Instant};

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions};
use lockline_etcd::etcd_client::{self, GetOptions};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

mod support;

use support::{new_client, queue, revision, side};

fn options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(30))
}

/// Every key of the lock `plain/job` (its entries and whatever lies beside
/// it) and under `markers`.
async fn written(side: &mut etcd_client::Client, markers: &str) -> Vec<String> {
    let mut found = keys(side, "plain/job").await;
    if markers != "plain/job" {
        found.extend(keys(side, markers).await);
    }
    found
}

/// Every key whose name starts with `prefix`.
async fn keys(side: &mut etcd_client::Client, prefix: &str) -> Vec<String> {
    side.get(prefix, Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .expect("get")
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Without a lock-delay anywhere, a release is one revision that deletes the
/// entry and creates nothing: no hand-over marker beside the lock, or under
/// a marker prefix; also with a waiter queued behind the holder, whose grant
/// writes nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lock_delay_a_release_is_one_revision_and_no_marker() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut side = side(&cluster).await;
    for (backend, markers) in [
        (Etcd::new(cluster.endpoints()), "plain/job"),
        (
            Etcd::new(cluster.endpoints()).with_marker_prefix(lockline_etcd::MARKER_PREFIX),
            lockline_etcd::MARKER_PREFIX,
        ),
    ] {
        let holders = Client::new(backend.clone());
        let waiters = Client::new(backend);
        let holder = holders.session_with(options()).await.expect("session");
        let waiter = waiters.session_with(options()).await.expect("session");

        // Alone: the release deletes the entry in one revision.
        let guard = holder.mutex("plain/job").expect("mutex").lock().await.expect("lock");
        let before = revision(&mut side).await;
        guard.release().await.expect("release");
        assert_eq!(
            revision(&mut side).await,
            before + 1,
            "a release wrote more than one revision"
        );
        assert_eq!(
            written(&mut side, markers).await,
            Vec::<String>::new(),
            "a release left a key"
        );

        // With a waiter queued: the release is one revision, the grant none.
        let guard = holder.mutex("plain/job").expect("mutex").lock().await.expect("lock");
        let queued = queue(&waiters, &waiter, "plain/job").await;
        let before = revision(&mut side).await;
        guard.release().await.expect("release");
        let granted = bounded("the waiter's grant", queued)
            .await
            .expect("task")
            .expect("granted");
        assert_eq!(
            revision(&mut side).await,
            before + 1,
            "a release and the grant it handed over to wrote more than one revision"
        );
        let left = written(&mut side, markers).await;
        assert_eq!(left, vec![granted.key().to_owned()], "only the new holder's entry");
        granted.release().await.expect("release");
        assert_eq!(written(&mut side, markers).await, Vec::<String>::new());
        holder.close().await.expect("close");
        waiter.close().await.expect("close");
    }
}

/// A waiter with a lock-delay flags the lock when it queues; the holder's
/// release then writes its hand-over marker in the same revision as the
/// delete, and the waiter is granted at once (a release taken for a loss
/// would hold it back a minute, past the bound). So with a close right after
/// a release, and a close while holding. A holder whose lease is revoked by
/// someone else is a loss: the grant waits for the delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delayed_waiter_still_tells_a_release_from_a_loss() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut side = side(&cluster).await;
    let holders = new_client(&cluster);
    let waiters = new_client(&cluster);
    let waiter = waiters
        .session_with(options().with_lock_delay(Duration::from_secs(60)))
        .await
        .expect("lock-delayed session");
    let flag = format!("delayed/job\0lockline/lock-delay-{}", waiter.id());

    // 0: a plain release; 1: a release, then a close at once; 2: a close
    // while holding.
    for round in 0..3 {
        let holder = holders.session_with(options()).await.expect("session");
        let guard = holder.mutex("delayed/job").expect("mutex").lock().await.expect("lock");
        let queued = queue(&waiters, &waiter, "delayed/job").await;
        assert!(
            keys(&mut side, "delayed/job\0").await.contains(&flag),
            "the lock-delayed waiter left no flag {flag:?}"
        );
        let mut kept = None;
        match round {
            0 => guard.release().await.expect("release"),
            1 => {
                guard.release().await.expect("release");
                holder.close().await.expect("close");
            }
            _ => {
                kept = Some(guard);
                holder.close().await.expect("close");
            }
        }
        let granted = bounded("the lock-delayed waiter's grant after a hand-over", queued)
            .await
            .expect("task")
            .expect("granted");
        assert_eq!(
            waiters.stats().lock_delays,
            0,
            "round {round}: a hand-over was taken for a loss"
        );
        if round == 0 {
            let marker = format!("delayed/job\0lockline/released-{}", holder.id());
            assert!(
                keys(&mut side, "delayed/job\0").await.contains(&marker),
                "no hand-over marker {marker:?} with a lock-delayed waiter queued"
            );
        }
        granted.release().await.expect("release");
        drop(kept);
        if round == 0 {
            holder.close().await.expect("close");
        }
    }

    // A loss: the holder's lease revoked by another client.
    let delay = Duration::from_secs(2);
    let short = new_client(&cluster);
    let patient = short
        .session_with(options().with_lock_delay(delay))
        .await
        .expect("lock-delayed session");
    let holder = holders.session_with(options()).await.expect("session");
    let guard = holder.mutex("delayed/job").expect("mutex").lock().await.expect("lock");
    let queued = queue(&short, &patient, "delayed/job").await;
    let lease = i64::from_str_radix(holder.id(), 16).expect("hex lease id");
    let revoked = Instant::now();
    side.lease_revoke(lease).await.expect("revoke");
    let granted = bounded("the grant after the delay", queued)
        .await
        .expect("task")
        .expect("granted");
    assert!(
        revoked.elapsed() >= delay,
        "granted {:?} after a loss, before the lock-delay of {delay:?}",
        revoked.elapsed()
    );
    assert_eq!(short.stats().lock_delays, 1, "the loss began no lock-delay");
    drop(guard);
    granted.release().await.expect("release");
}

/// Without `with_release_markers()`, a lock-delayed waiter's flag is what
/// makes the release write its marker, and so what lets a release retried
/// after a cut-off first try tell another client's delete from its own
/// removal: with such a waiter queued, the retry that finds the entry
/// deleted by another client answers `LockLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flagged_lock_tells_a_retried_release_from_a_foreign_delete() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = lockline_testkit::TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let holder = Client::new(Etcd::new([format!("http://{}", proxy.address())]))
        .session_with(options().with_request_timeout(Duration::from_secs(3)))
        .await
        .expect("session");
    let waiters = new_client(&cluster);
    let waiter = waiters
        .session_with(options().with_lock_delay(Duration::from_secs(60)))
        .await
        .expect("lock-delayed session");
    let mut side = side(&cluster).await;

    let guard = holder.mutex("flagged/job").expect("mutex").lock().await.expect("lock");
    let key = guard.key().to_owned();
    let queued = queue(&waiters, &waiter, "flagged/job").await;

    // The release's first try is kept back by the proxy, never to arrive.
    proxy.set_requests_held(true);
    let release = tokio::spawn(guard.release());
    lockline::conformance::until("the release sent into the proxy", || proxy.held_requests() > 0).await;
    side.delete(key.as_str(), None).await.expect("delete");
    proxy.orphan_connections();
    proxy.set_requests_held(false);
    let released = bounded("release", release).await.expect("task");
    assert!(
        matches!(released, Err(lockline::Error::LockLost { .. })),
        "an entry another client deleted must not be reported as released: {released:?}"
    );
    // The waiter took the foreign delete for a loss.
    bounded("the lock-delay begins", waiters.wait_for_stats(|s| s.lock_delays >= 1)).await;
    queued.abort();
}
