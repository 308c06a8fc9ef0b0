//! etcd-specific behaviour: failover, lease revocation, unreachable and
//! vanishing servers, and scale on one session.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued, suspend_and_revive, ExclusionWorkload};
use lockline::{Client, Error, SessionOptions, SessionState};
use lockline_etcd::Etcd;
use lockline_testkit::{free_port, EtcdCluster};

fn options(ttl_secs: u64) -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(ttl_secs))
}

async fn revoke(cluster: &EtcdCluster, session: &lockline::Session) {
    let lease = i64::from_str_radix(session.id(), 16).expect("hex lease id");
    let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    side.lease_revoke(lease).await.expect("revoke");
}

fn leader(cluster: &EtcdCluster) -> usize {
    (0..cluster.size())
        .find(|&i| {
            cluster
                .metrics(i)
                .is_some_and(|m| m.lines().any(|l| l.trim() == "etcd_server_is_leader 1"))
        })
        .expect("a leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_keeps_exclusion_and_drains_the_queue() {
    let mut cluster = EtcdCluster::start_cluster(3).expect("start etcd");
    let name = "failover/lock";
    const WORKERS: usize = 5;
    const ROUNDS: usize = 12;
    let mut mutexes = Vec::new();
    for _ in 0..WORKERS {
        let client = Client::new(Etcd::new(cluster.endpoints()));
        let session = client.session_with(options(5)).await.expect("session");
        let mutex = session.mutex(name).expect("mutex");
        mutexes.push(mutex);
    }
    let mut workload = ExclusionWorkload::start(mutexes, ROUNDS);
    // Break the cluster while locks are held and queued.
    workload.granted(WORKERS).await;
    let killed = leader(&cluster);
    cluster.member(killed).kill().expect("kill the leader");
    assert_eq!(workload.finish().await, WORKERS * ROUNDS);
    let survivors: Vec<String> = (0..3).filter(|&i| i != killed).map(|i| cluster.endpoint(i)).collect();
    let check = Client::new(Etcd::new(survivors)).session().await.expect("session");
    let left = check.mutex(name).expect("mutex").contenders().await.expect("list");
    assert!(left.is_empty(), "keys left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_lease_is_noticed_within_a_second() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let holder_session = client.session_with(options(5)).await.expect("session");
    let guard = holder_session
        .mutex("revoke")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    revoke(&cluster, &holder_session).await;
    tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("lost() within 1 s of the revocation");
    assert!(!guard.is_held());
    assert!(matches!(guard.release().await, Err(Error::SessionLost { .. })));

    // A queued waiter whose lease is revoked fails at once.
    let other = client.session_with(options(5)).await.expect("session");
    let holder = other.mutex("revoke").expect("mutex").lock().await.expect("lock");
    let waiter_session = client.session_with(options(5)).await.expect("session");
    let mutex = waiter_session.mutex("revoke").expect("mutex");
    let waiter = spawn_queued(&client, async move { mutex.lock().await }).await;
    revoke(&cluster, &waiter_session).await;
    let result = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("the waiter fails within 1 s")
        .expect("task");
    assert!(matches!(result, Err(Error::SessionLost { .. })), "{result:?}");
    assert!(holder.is_held());
    holder.release().await.expect("release");
}

#[tokio::test]
async fn unreachable_cluster_fails_within_the_connect_timeout() {
    let port = free_port().expect("port");
    let client = Client::new(Etcd::new([format!("http://127.0.0.1:{port}")]));
    let started = Instant::now();
    let result = client
        .session_with(options(5).with_connect_timeout(Duration::from_secs(1)))
        .await;
    assert!(matches!(result, Err(Error::Unavailable { .. })), "{result:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_server_ends_holders_and_waiters() {
    let mut cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let ttl = options(2).with_request_timeout(Duration::from_millis(500));
    let a = client.session_with(ttl.clone()).await.expect("session");
    let b = client.session_with(ttl).await.expect("session");
    let guard = a.mutex("vanish").expect("mutex").lock().await.expect("lock");
    let mutex = b.mutex("vanish").expect("mutex");
    let waiter = spawn_queued(&client, async move { mutex.lock().await }).await;
    cluster.member(0).kill().expect("kill etcd");
    bounded("the holder learns", guard.lost()).await;
    assert!(!guard.is_held());
    assert_eq!(a.state(), SessionState::Lost);
    let result = bounded("the waiter ends", waiter).await.expect("task");
    assert!(matches!(result, Err(Error::SessionLost { .. })), "{result:?}");
    // New calls fail with a typed error, not a hang.
    let fresh = client
        .session_with(options(2).with_connect_timeout(Duration::from_secs(1)))
        .await;
    assert!(matches!(fresh, Err(Error::Unavailable { .. })), "{fresh:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_locks_on_one_session_share_one_lease_and_one_watch_stream() {
    const LOCKS: usize = 10_000;
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session_with(options(10)).await.expect("session");
    let mut guards = Vec::with_capacity(LOCKS);
    let mut batch = tokio::task::JoinSet::new();
    for i in 0..LOCKS {
        let mutex = session.mutex(&format!("scale/{i}")).expect("mutex");
        batch.spawn(async move { mutex.lock().await });
        if batch.len() == 256 || i == LOCKS - 1 {
            while let Some(result) = batch.join_next().await {
                guards.push(result.expect("task").expect("lock"));
            }
        }
    }
    assert_eq!(guards.len(), LOCKS);
    assert!(guards.iter().all(|g| g.is_held()));
    let gauge = |name: &str| -> usize {
        let metrics = cluster.metrics(0).expect("metrics");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()))
            .unwrap_or_else(|| panic!("{name} not in /metrics")) as usize
    };
    // Each guard registers its loss watch from a background task: give the
    // server's gauge time to count them all (a server-side number has no event
    // to await; bounded at 20 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    while gauge("etcd_debugging_mvcc_watcher_total ") < LOCKS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One lease (ours), one watch stream carrying one watch per held lock.
    assert_eq!(gauge("etcd_debugging_lease_granted_total "), 1);
    assert_eq!(gauge("etcd_debugging_mvcc_watch_stream_total "), 1);
    assert!(gauge("etcd_debugging_mvcc_watcher_total ") >= LOCKS);
    let mut releases = tokio::task::JoinSet::new();
    for guard in guards {
        releases.spawn(guard.release());
        if releases.len() == 256 {
            while let Some(released) = releases.join_next().await {
                released.expect("task").expect("release");
            }
        }
    }
    while let Some(released) = releases.join_next().await {
        released.expect("task").expect("release");
    }
    let left = session.mutex("scale").expect("mutex").contenders().await.expect("list");
    assert!(left.is_empty());
}

/// Keepalives that fail make the session `Suspended` (its locks maybe still
/// held); a confirmed renewal makes it `Live` again with its locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_keepalives_suspend_and_a_renewal_revives() {
    use lockline_testkit::TcpProxy;
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let session = client
        .session_with(options(6).with_request_timeout(Duration::from_millis(500)))
        .await
        .expect("session");
    let guard = suspend_and_revive(&session, "suspend/lock", || proxy.block(), || proxy.unblock()).await;
    guard.release().await.expect("release");
}
