//! Appends and the keys they make: one arriving after its cancellation, a
//! mutex and an election of one name on one session, and a slow append
//! within its own session's request timeout.

use super::*;

/// An acquire cancelled while its append is on its way leaves no key, even
/// when that append reaches the server only after the cancellation's cleanup
/// has run (it travelled another path: here a connection that died with the
/// request still in the network).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_arriving_after_its_cancellation_creates_no_key() {
    // A long TTL: no renewal or HTTP/2 ping rides the connection meanwhile.
    let (cluster, proxy, _client, session) =
        one_node_through_a_proxy(options(30).with_request_timeout(Duration::from_secs(2))).await;
    let checker = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let name = "late-append/lock";

    proxy.set_requests_held(true);
    let mutex = session.mutex(name).expect("mutex");
    let acquire = tokio::spawn(async move { mutex.lock().await });
    until("the append is sent", || proxy.held_requests() > 0).await;
    // The connection dies with the append still on its way to the server.
    proxy.orphan_connections();
    acquire.abort();
    assert!(
        bounded("the acquire ends", acquire).await.is_err(),
        "the acquire was granted"
    );
    // The cleanup reaches the server first...
    proxy.set_requests_held(false);
    bounded("cleanup", session.flush()).await;
    assert!(
        checker
            .mutex(name)
            .expect("mutex")
            .contenders()
            .await
            .expect("list")
            .is_empty(),
        "the cleanup left a key"
    );
    // ... then the append does.
    proxy.deliver_orphans();
    until("the server answers the late append", || proxy.orphan_answer_bytes() > 0).await;
    let left = checker.mutex(name).expect("mutex").contenders().await.expect("list");
    assert!(left.is_empty(), "the late append created {left:?}");

    // The session can still take the lock (the marker fences one attempt only).
    let guard = bounded("lock", session.mutex(name).expect("mutex").lock())
        .await
        .expect("lock");
    guard.release().await.expect("release");
}

/// A mutex and an election of one name on one session would share the one
/// key `<name>/<lease>`: the second is refused with a typed error naming the
/// name (never granted on the first's key), the first keeps its key, and once
/// the first is gone the other can be used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_and_an_election_of_one_name_do_not_share_a_key() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session_with(options(5)).await.expect("session");
    let name = "shared/name";
    let guard = session.mutex(name).expect("mutex").lock().await.expect("lock");
    let campaign = bounded("campaign", session.election(name).expect("election").campaign(b"v")).await;
    match campaign {
        Err(Error::InvalidName { name: refused, .. }) => assert_eq!(refused, name),
        other => panic!("an election beside a held mutex of one name: {other:?}"),
    }
    bounded("cleanup", session.flush()).await;
    assert!(guard.is_held());
    let keys = session.mutex(name).expect("mutex").contenders().await.expect("list");
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(keys[0].key, guard.key());
    guard.release().await.expect("release");

    let leading = bounded("campaign", session.election(name).expect("election").campaign(b"v"))
        .await
        .expect("campaign once the mutex is released");
    match bounded("lock", session.mutex(name).expect("mutex").lock()).await {
        Err(Error::InvalidName { name: refused, .. }) => assert_eq!(refused, name),
        other => panic!("a mutex beside a leading candidate of one name: {other:?}"),
    }
    bounded("cleanup", session.flush()).await;
    assert!(leading.is_held());
    leading.resign().await.expect("resign");
    let guard = bounded("lock", session.mutex(name).expect("mutex").lock())
        .await
        .expect("lock once the election resigned");
    guard.release().await.expect("release");
}

/// Connection settings follow each session's options: a session opened after
/// one with a 300 ms request timeout still gets its own 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_gets_its_own_request_timeout() {
    let (_cluster, proxy, client, _quick) =
        one_node_through_a_proxy(options(3).with_request_timeout(Duration::from_millis(300))).await;
    let patient = client.session_with(SessionOptions::new()).await.expect("session");
    assert_eq!(patient.options().request_timeout(), Duration::from_secs(5));
    let mutex = patient.mutex("timeouts/lock").expect("mutex");
    proxy.set_requests_held(true);
    let attempt = tokio::spawn(async move { mutex.try_lock().await });
    // A slow path: longer than the first session's request timeout, well
    // within this one's.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.set_requests_held(false);
    let got = bounded("try_lock", attempt).await.expect("task");
    match got {
        Ok(Some(guard)) => guard.release().await.expect("release"),
        other => panic!("a 1.5 s delay failed a session whose request timeout is 5 s: {other:?}"),
    }
}
