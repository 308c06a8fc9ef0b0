//! The cluster's members: a leader killed under load, an unreachable or
//! vanished server, a member cut off from the rest, and ten thousand locks
//! on one session.

use super::*;

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

/// A Prometheus gauge or counter of member `i`.
fn metric(cluster: &EtcdCluster, i: usize, name: &str) -> f64 {
    let metrics = cluster.metrics(i).expect("metrics");
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|v| v.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("{name} not in /metrics of member {i}"))
}

/// Waiters whose watch runs on a member that is cut off from the rest of the
/// cluster (its clients still reach it) move to a healthy member: with
/// require-leader the isolated member ends their watches, and every waiter is
/// granted within the request timeout once its lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_an_isolated_member_move_to_a_healthy_one() {
    const WAITERS: usize = 6;
    let cluster = EtcdCluster::start_isolatable(3).expect("start etcd");
    let holders = Client::new(Etcd::new(cluster.endpoints()));
    let holder = holders.session_with(options(10)).await.expect("session");
    let mut guards = Vec::new();
    for i in 0..WAITERS {
        let guard = holder
            .mutex(&format!("isolated/{i}"))
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        guards.push(guard);
    }
    let streams = |i: usize| metric(&cluster, i, "etcd_debugging_mvcc_watch_stream_total") as usize;
    let before: Vec<usize> = (0..3).map(streams).collect();
    // One client (one connection, one watch stream) per waiter: each lands
    // on a member the client's balancer picks.
    let mut waiters = Vec::new();
    let mut sessions = Vec::new();
    for i in 0..WAITERS {
        let (session, waiter) = timed_waiter(&cluster, &format!("isolated/{i}")).await;
        waiters.push(waiter);
        sessions.push(session);
    }
    let added = || -> Vec<usize> { (0..3).map(|i| streams(i).saturating_sub(before[i])).collect() };
    until("every waiter's watch stream is open", || {
        added().iter().sum::<usize>() >= WAITERS
    })
    .await;
    let added = added();
    let victim = (0..3).max_by_key(|&i| added[i]).expect("a member");
    assert!(added[victim] >= 1);

    cluster.isolate(victim).expect("isolate");
    until("the isolated member has no leader", || {
        metric(&cluster, victim, "etcd_server_has_leader") == 0.0
    })
    .await;
    // The others have a leader (a new one if the victim led).
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    until("the healthy members have a leader", || {
        others
            .iter()
            .all(|&i| metric(&cluster, i, "etcd_server_has_leader") == 1.0)
    })
    .await;
    // Free every lock at once from the healthy side.
    let healthy: Vec<String> = others.iter().map(|&i| cluster.endpoint(i)).collect();
    let lease = i64::from_str_radix(holder.id(), 16).expect("hex lease id");
    let mut side = lockline_etcd::etcd_client::Client::connect(healthy, None)
        .await
        .expect("side client");
    // A loaded machine can make the new leader's first proposals time out:
    // try again until the lease is gone.
    bounded("revoke the holder's lease", async {
        loop {
            match side.lease_revoke(lease).await {
                Ok(_) => break,
                Err(error) if error.to_string().contains("lease not found") => break,
                Err(error) => {
                    println!("revoke: {error}; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
    .await;
    let freed = Instant::now();
    drop(guards);

    let mut worst = Duration::ZERO;
    for waiter in waiters {
        let (granted_at, guard) = bounded("a waiter is granted", waiter).await.expect("task");
        let guard = guard.expect("lock");
        worst = worst.max(granted_at - freed);
        assert!(guard.is_held());
    }
    let timeout = SessionOptions::new().request_timeout();
    println!(
        "{} of {WAITERS} watch streams on the isolated member {victim}; every waiter granted within {worst:?} of the release",
        added[victim]
    );
    assert!(
        worst < timeout,
        "a waiter took {worst:?}, longer than the request timeout {timeout:?}"
    );
    cluster.rejoin(victim).expect("rejoin");
}
