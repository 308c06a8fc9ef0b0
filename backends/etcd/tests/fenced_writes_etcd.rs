//! Fenced writes on etcd: what a holder writes is a plain etcd key, seen by
//! any etcd client, with no lease (it outlives the session); a stale holder's
//! write is refused by the server's compare, not by the client.

use lockline::conformance::bounded;
use lockline::{Client, Error, Write};
use lockline_etcd::etcd_client;
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

async fn plain_get(cluster: &EtcdCluster, key: &str) -> Option<(Vec<u8>, i64)> {
    let mut side = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect a plain etcd client");
    let response = side.get(key, None).await.expect("get");
    response.kvs().first().map(|kv| (kv.value().to_vec(), kv.lease()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_are_plain_keys_for_other_etcd_clients() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let guard = bounded("lock", session.mutex("billing/nightly").expect("mutex").lock())
        .await
        .expect("lock");
    bounded(
        "write",
        guard.write_if_held([
            Write::put("billing/state/last-run", "2024-05-01"),
            Write::put("/billing/epoch", guard.token().to_string()),
        ]),
    )
    .await
    .expect("write");
    let (value, lease) = plain_get(&cluster, "billing/state/last-run")
        .await
        .expect("the key exists");
    assert_eq!(value, b"2024-05-01");
    assert_eq!(lease, 0, "guarded state must not be bound to the session's lease");
    let (epoch, _) = plain_get(&cluster, "/billing/epoch").await.expect("the key exists");
    assert_eq!(epoch, guard.token().to_string().into_bytes());

    // A key someone else wrote is read back by lockline.
    let mut side = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect");
    side.put("billing/state/owner", "ops", None).await.expect("put");
    assert_eq!(
        session.read("billing/state/owner").await.expect("read"),
        Some(b"ops".to_vec())
    );

    // Under the lock's own prefix Go's contenders would see a holder: refused.
    match guard.write_if_held([Write::put("billing/nightly/state", "x")]).await {
        Err(Error::InvalidName { name, .. }) => assert_eq!(name, "billing/nightly/state"),
        other => panic!("a key under the lock's prefix must be refused, got {other:?}"),
    }
    assert_eq!(plain_get(&cluster, "billing/nightly/state").await, None);

    guard.release().await.expect("release");
    session.close().await.expect("close");
    // The lease is revoked; the guarded state stays.
    assert!(plain_get(&cluster, "billing/state/last-run").await.is_some());
}

/// A paused holder whose lease was revoked and whose lock another session
/// took writes nothing: its transaction's compare fails on the server even
/// though its client has not noticed the loss yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_lost_its_lease_writes_nothing() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (a, b) = (
        Client::new(Etcd::new(cluster.endpoints())),
        Client::new(Etcd::new(cluster.endpoints())),
    );
    let (sa, sb) = (a.session().await.expect("session"), b.session().await.expect("session"));
    let stale = bounded("lock", sa.mutex("jobs").expect("mutex").lock())
        .await
        .expect("lock");
    let mut side = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect");
    side.lease_revoke(i64::from_str_radix(sa.id(), 16).expect("hex"))
        .await
        .expect("revoke");
    let newer = bounded("lock", sb.mutex("jobs").expect("mutex").lock())
        .await
        .expect("lock");
    // Straight to the server, whatever the client knows by now.
    let applied = sa
        .backend_session()
        .write_if_held(stale.entry(), &[Write::put("jobs-state", "stale")])
        .await
        .expect("the request is answered");
    assert!(!applied);
    assert_eq!(plain_get(&cluster, "jobs-state").await, None);
    newer
        .write_if_held([Write::put("jobs-state", "newer")])
        .await
        .expect("write");
    assert_eq!(
        plain_get(&cluster, "jobs-state").await.map(|(v, _)| v),
        Some(b"newer".to_vec())
    );
    newer.release().await.expect("release");
}

/// A fenced write never creates a key with the shape of another lock's
/// entry: such a key would stand in that lock's queue as a holder nobody
/// releases. Reading such keys stays allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_shaped_like_another_locks_entries_are_refused() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let session = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let guard = session.mutex("mine").expect("mutex").lock().await.expect("lock");
    for key in [
        "other/1",
        "jobs/cafe",
        "db/read/1f-x",
        "a/b/write/2a-attempt",
        "x/semaphore/3-y",
    ] {
        match guard.write_if_held([Write::put(key, "x")]).await {
            Err(Error::InvalidName { name, reason }) => {
                assert_eq!(name, key);
                assert!(reason.contains("would block"), "{reason}");
            }
            other => panic!("{key}: expected InvalidName, got {other:?}"),
        }
    }
    // Nothing was written, and the other locks are free.
    assert!(session.queue("other").await.expect("queue").is_empty());
    let other = session
        .mutex("other")
        .expect("mutex")
        .try_lock()
        .await
        .expect("try_lock");
    assert!(other.is_some(), "lock `other` is free");
    // Keys of other shapes are fine, and any key may be read.
    guard
        .write_if_held([Write::put("config/epoch", "1"), Write::put("jobs/last-run", "x")])
        .await
        .expect("ordinary keys");
    assert_eq!(session.read("other/1").await.expect("read"), None);
}

/// Faults in the middle of a fenced write, on a connection that goes silent
/// (nothing reset): a write whose `Txn` never reaches the server, and one
/// whose answer is lost after the server applied it. Each is `Unavailable`
/// within the request timeout, the lock is still held, and the same batch
/// tried again lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_off_midway_is_unavailable_and_safe_to_retry() {
    use std::time::{Duration, Instant};
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = lockline_testkit::TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let options = lockline::SessionOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_request_timeout(Duration::from_secs(1));
    let session = Client::new(Etcd::new([format!("http://{}", proxy.address())]))
        .session_with(options)
        .await
        .expect("session");
    let guard = session.mutex("cut/lock").expect("mutex").lock().await.expect("lock");

    // The request goes nowhere.
    proxy.blackhole();
    let started = Instant::now();
    let cut = bounded("write", guard.write_if_held([Write::put("cut/state", "1")])).await;
    assert!(matches!(cut, Err(Error::Unavailable { .. })), "{cut:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    proxy.heal();
    // Healed, the request held in the partition may still arrive. A write
    // that goes through settles it and makes sure the connection answers
    // again, so that the next request does reach the server (a request sent
    // on a connection that the cut left broken may never arrive).
    bounded("a write goes through again", async {
        while guard.write_if_held([Write::put("cut/state", "1")]).await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    // The server applies the write; its answer is lost.
    proxy.set_responses_dropped(true);
    let lost = bounded("write", guard.write_if_held([Write::put("cut/state", "2")])).await;
    assert!(matches!(lost, Err(Error::Unavailable { .. })), "{lost:?}");
    assert_eq!(
        plain_get(&cluster, "cut/state").await.map(|(v, _)| v),
        Some(b"2".to_vec()),
        "it landed"
    );
    proxy.set_responses_dropped(false);

    assert!(guard.is_held(), "a fault in transit is not a loss");
    bounded("retry", guard.write_if_held([Write::put("cut/state", "2")]))
        .await
        .expect("the same batch tried again");
    assert_eq!(
        plain_get(&cluster, "cut/state").await.map(|(v, _)| v),
        Some(b"2".to_vec())
    );
    guard.release().await.expect("release");
}
