//! Background cleanup lasts until the entry is gone or the session is over: a
//! server outage shorter than the session (reset, or silent) leaves no orphan
//! of guards dropped and acquires cancelled during it, on etcd (a mutex, a
//! write lock, a permit, a queued acquire, an acquire started during the
//! outage).

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions, SessionState};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

/// The keys under `prefix` but the markers (`NAME` NUL `lockline/...`,
/// bound to the session's lease and gone with it): what an outage must not
/// leave behind is an entry.
fn entries(cluster: &EtcdCluster, prefix: &str) -> Vec<String> {
    let keys = cluster.keys(prefix).expect("keys");
    keys.into_iter().filter(|key| !key.contains("\0lockline/")).collect()
}

async fn outage(silent: bool) {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let session = client
        .session_with(SessionOptions::new().with_ttl(Duration::from_secs(10)))
        .await
        .expect("session");
    let direct = Client::new(Etcd::new(cluster.endpoints()));
    let other = direct.session().await.expect("session");
    let m = session.mutex("outage/m").unwrap().lock().await.unwrap();
    let w = session.rwlock("outage/rw").unwrap().write().await.unwrap();
    let p = session.semaphore("outage/s", 1).unwrap().acquire().await.unwrap();
    let blocker = other.mutex("outage/q").unwrap().lock().await.unwrap();
    let s2 = session.clone();
    let queued = tokio::spawn(async move { s2.mutex("outage/q").unwrap().lock().await });
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    if silent {
        proxy.blackhole();
    } else {
        proxy.block();
    }
    drop(m);
    drop(w);
    drop(p);
    queued.abort();
    let s3 = session.clone();
    let during = tokio::spawn(async move { s3.mutex("outage/d").unwrap().lock().await });
    // The outage: 4 s in all, shorter than the 8 s loss deadline.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    during.abort();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    if silent {
        proxy.heal();
    } else {
        proxy.unblock();
    }
    bounded("flush", session.flush()).await;
    assert_ne!(
        session.state(),
        SessionState::Lost,
        "the outage was shorter than the loss deadline"
    );
    blocker.release().await.expect("release");
    let left = entries(&cluster, "outage");
    assert!(left.is_empty(), "left after a {}s outage: {left:?}", 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guards_and_cancelled_acquires_during_a_reset_outage() {
    outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guards_and_cancelled_acquires_during_a_silent_outage() {
    outage(true).await;
}

/// A guard dropped while the server is unreachable for longer than five
/// failed tries of its removal is still removed when the server comes back,
/// before the session's own end (background cleanup has no attempt limit),
/// and the same session takes the lock again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_removed_after_an_outage_longer_than_five_tries() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let session = client
        .session_with(
            SessionOptions::new()
                .with_ttl(Duration::from_secs(30))
                .with_request_timeout(Duration::from_secs(1)),
        )
        .await
        .expect("session");
    let guard = session.mutex("outage/long").unwrap().lock().await.unwrap();
    proxy.block();
    drop(guard);
    // Five removals have failed by now.
    lockline::conformance::wait_for_stats(&client, |s| s.cleanup_failures >= 1).await;
    // The outage goes on a little longer, far short of the 24 s loss deadline.
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.unblock();
    bounded("background cleanup", session.flush()).await;
    assert_ne!(session.state(), SessionState::Lost);
    let left = entries(&cluster, "outage/long");
    assert!(left.is_empty(), "the dropped guard's key outlived the outage: {left:?}");
    let again = bounded("the same session again", session.mutex("outage/long").unwrap().lock())
        .await
        .expect("lock");
    again.release().await.expect("release");
}
