//! etcd-specific behaviour: failover, lease revocation, unreachable and
//! vanishing servers, and scale on one session.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued, suspend_and_revive, until, ExclusionWorkload};
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

/// An acquire cancelled while its append is on its way leaves no key, even
/// when that append reaches the server only after the cancellation's cleanup
/// has run (it travelled another path: here a connection that died with the
/// request still in the network).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_arriving_after_its_cancellation_creates_no_key() {
    use lockline_testkit::TcpProxy;
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    // A long TTL: no renewal or HTTP/2 ping rides the connection meanwhile.
    let session = client
        .session_with(options(30).with_request_timeout(Duration::from_secs(2)))
        .await
        .expect("session");
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
    use lockline_testkit::TcpProxy;
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let _quick = client
        .session_with(options(3).with_request_timeout(Duration::from_millis(300)))
        .await
        .expect("session");
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

/// Under a silent partition (no byte either way, no reset) the holder's
/// session goes Live → Suspended → Lost, and `lost()` fires before the server
/// could expire the lease: a waiter on another connection is granted only
/// after it. After the partition heals, the lost session stays lost.
async fn silent_partition_is_suspended_then_lost_before_expiry(options: SessionOptions) {
    use lockline_testkit::TcpProxy;
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let holder = client.session_with(options.clone()).await.expect("session");
    let name = "partition/lock";
    let guard = holder.mutex(name).expect("mutex").lock().await.expect("lock");
    let waiters = Client::new(Etcd::new(cluster.endpoints()));
    let waiter_session = waiters.session().await.expect("session");
    let mutex = waiter_session.mutex(name).expect("mutex");
    let waiter = spawn_queued(&waiters, async move {
        let guard = mutex.lock().await;
        (Instant::now(), guard)
    })
    .await;

    let mut states = holder.watch_state();
    let mut seen = vec![*states.borrow_and_update()];
    proxy.blackhole();
    let cut = Instant::now();
    let mut suspended_at = None;
    while *seen.last().expect("a state") != SessionState::Lost {
        bounded("a state change", states.changed()).await.expect("state");
        let state = *states.borrow_and_update();
        if state == SessionState::Suspended && suspended_at.is_none() {
            suspended_at = Some(cut.elapsed());
        }
        if seen.last() != Some(&state) {
            seen.push(state);
        }
    }
    let lost_at = Instant::now();
    bounded("lost()", guard.lost()).await;
    assert!(!guard.is_held());
    assert_eq!(
        seen,
        [SessionState::Live, SessionState::Suspended, SessionState::Lost],
        "states under a silent partition"
    );
    let (granted_at, next) = bounded("the waiter is granted", waiter).await.expect("task");
    let next = next.expect("lock");
    assert!(granted_at > lost_at, "granted before the holder's lost()");
    println!(
        "ttl {:?}: suspended at +{:?}, lost at +{:?}, waiter granted at +{:?} (lost() {:?} before the grant)",
        options.ttl(),
        suspended_at.expect("suspended"),
        lost_at - cut,
        granted_at - cut,
        granted_at - lost_at
    );

    proxy.heal();
    assert!(matches!(holder.mutex(name), Err(Error::SessionLost { .. })));
    assert!(matches!(guard.release().await, Err(Error::SessionLost { .. })));
    assert_eq!(holder.state(), SessionState::Lost);
    assert!(next.is_held());
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_partition_with_default_options() {
    silent_partition_is_suspended_then_lost_before_expiry(SessionOptions::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_partition_with_a_3s_ttl() {
    silent_partition_is_suspended_then_lost_before_expiry(options(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_partition_with_a_2s_ttl() {
    silent_partition_is_suspended_then_lost_before_expiry(options(2)).await;
}

/// A conversion whose request is stuck in a silent partition ends with the
/// loss (`SessionLost`), when `lost()` resolves (the loss deadline, 2.4 s
/// with a TTL of 3 s), not when its request times out (60 s here, past the
/// step's bound): a converting holder cannot watch `lost()` itself (the
/// guard is borrowed). One that waited out its request went on holding
/// beside the next writer (the lock-mode fault test found it twice: a
/// down-conversion and an up-conversion each asked for as a quorum was
/// killed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversion_in_a_silent_partition_ends_with_the_loss() {
    use lockline::LockMode;
    use lockline_testkit::TcpProxy;
    let cluster = EtcdCluster::start().expect("start etcd");
    for (from, to) in [(LockMode::Ex, LockMode::Pr), (LockMode::Pr, LockMode::Ex)] {
        let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
        let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
        let session = client
            .session_with(options(3).with_request_timeout(Duration::from_secs(60)))
            .await
            .expect("session");
        let mut guard = session
            .resource(&format!("partition/modes-{from}-{to}"))
            .expect("resource")
            .lock(from)
            .await
            .expect("lock");
        proxy.blackhole();
        let converted = bounded("the conversion", guard.convert(to)).await;
        assert!(
            matches!(converted, Err(Error::SessionLost { .. })),
            "{from} to {to}: {converted:?}"
        );
        assert!(!guard.is_held());
        if !to.is_down_from(from) {
            assert_eq!(guard.mode(), from, "not converted up");
        }
        assert_eq!(session.state(), SessionState::Lost);
    }
}

/// A session declared lost stops renewing and revokes its lease as soon as
/// the server is reachable again: after a partition long enough to declare
/// the loss but shorter than the TTL, its keys go at once on heal, not when
/// the lease would have expired (nor later, renewed by a renewal that was
/// stuck in the partition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_revokes_its_lease_when_the_partition_heals() {
    use lockline_testkit::TcpProxy;
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    // Lost 3 s after the last confirmed renewal, long before the 10 s TTL.
    let ttl = Duration::from_secs(10);
    let holder = client
        .session_with(
            SessionOptions::new()
                .with_ttl(ttl)
                .with_safety_margin(Duration::from_secs(7))
                .with_keepalive_interval(Duration::from_secs(1))
                .with_request_timeout(Duration::from_secs(1)),
        )
        .await
        .expect("session");
    let lease = i64::from_str_radix(holder.id(), 16).expect("hex lease id");
    let name = "revoke-on-heal/lock";
    let guard = holder.mutex(name).expect("mutex").lock().await.expect("lock");
    let waiters = Client::new(Etcd::new(cluster.endpoints()));
    let waiter_session = waiters.session().await.expect("session");
    let mutex = waiter_session.mutex(name).expect("mutex");
    let waiter = spawn_queued(&waiters, async move {
        let guard = mutex.lock().await;
        (Instant::now(), guard)
    })
    .await;

    proxy.blackhole();
    let cut = Instant::now();
    bounded("lost()", guard.lost()).await;
    let lost_after = cut.elapsed();
    assert!(lost_after < Duration::from_secs(4), "lost after {lost_after:?}");
    proxy.heal();
    let healed = Instant::now();
    let (granted_at, next) = bounded("the waiter is granted", waiter).await.expect("task");
    let next = next.expect("lock");
    // The server last heard a renewal at most a keepalive interval before
    // the cut: left alone the lease would live until at least cut + 9 s.
    let natural_expiry = Duration::from_secs(9);
    println!(
        "lost at +{lost_after:?}, healed at +{:?}, waiter granted at +{:?} (the lease could not expire before +{natural_expiry:?})",
        healed - cut,
        granted_at - cut
    );
    assert!(
        granted_at - cut < natural_expiry - Duration::from_secs(1),
        "the lost session's key stayed until +{:?}",
        granted_at - cut
    );
    let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    let left = side.lease_time_to_live(lease, None).await.expect("time to live");
    assert!(
        left.ttl() <= 0,
        "the lost session's lease is still alive: {}s left",
        left.ttl()
    );
    assert_eq!(holder.state(), SessionState::Lost);
    // Closing a lost session does not turn its loss into a clean close.
    holder.close().await.expect("close");
    assert_eq!(*holder.watch_state().borrow(), SessionState::Lost);
    next.release().await.expect("release");
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
        let client = Client::new(Etcd::new(cluster.endpoints()));
        let session = client.session().await.expect("session");
        let mutex = session.mutex(&format!("isolated/{i}")).expect("mutex");
        let waiter = spawn_queued(&client, async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
        .await;
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

/// A session declared lost while one of its tasks waits in the same-session
/// queue behind a dropped guard (whose removal could not reach the server):
/// when the partition heals, before the server expires the lease, the waiting
/// task must fail with `SessionLost`, never be granted the dropped guard's
/// leftover key (its old token) as if it were its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_never_regrants_its_own_leftover() {
    use lockline_testkit::TcpProxy;
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let session = client
        .session_with(options(6).with_request_timeout(Duration::from_secs(1)))
        .await
        .expect("session");
    let mutex = session.mutex("regrant/lock").expect("mutex");
    let first = mutex.lock().await.expect("lock");
    let token = first.token();
    proxy.blackhole();
    // Queued in-process behind `first`, whose slot is handed on only once
    // its entry is gone (or the session over).
    let second = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock().await }
    });
    drop(first);
    let state = bounded("the session is declared lost", session.lost()).await;
    assert_eq!(state, SessionState::Lost);
    // The server still has the lease (6 s TTL): let the requests through.
    proxy.heal();
    let outcome = bounded("the queued acquire ends", second).await.expect("task");
    match outcome {
        Err(Error::SessionLost { .. }) => {}
        Ok(guard) => panic!(
            "a lost session was granted {} with token {} (the dropped guard's was {token})",
            guard.key(),
            guard.token()
        ),
        Err(other) => panic!("expected SessionLost, got {other}"),
    }
}

/// A holder whose server is down re-watches its entry with capped backoff
/// (100 ms doubling to 2 s), not every 100 ms: over 4 s of outage that is at
/// most 6 re-watches (it was 40 before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_re_watches_with_backoff_while_the_server_is_down() {
    use lockline_testkit::TcpProxy;
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let session = client.session_with(options(30)).await.expect("session");
    let guard = session
        .mutex("rewatch/lock")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    proxy.block();
    client.wait_for_stats(|s| s.rewatches >= 1).await;
    let outage = Instant::now();
    // The outage itself: a span of time, not an event to await.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let rewatches = client.stats().rewatches;
    assert!(
        rewatches <= 7,
        "{rewatches} re-watches in {:?} of outage",
        outage.elapsed()
    );
    proxy.unblock();
    assert!(guard.is_held(), "a 4 s outage of a 30 s session lost the lock");
    bounded("release", guard.release()).await.expect("release");
}

/// A single-node etcd, a proxy in front of it, and a session through the
/// proxy (TTL 30 s) with the given request timeout, on a backend whose
/// releases all write the hand-over marker (the evidence of a release
/// retried after a cut-off try).
async fn behind_a_proxy(request_timeout: Duration) -> (EtcdCluster, lockline_testkit::TcpProxy, lockline::Session) {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = lockline_testkit::TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
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

/// Set in the child process of
/// `a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only`: the
/// endpoints it takes its lock on.
const DELAY_CHILD: &str = "LOCKLINE_TEST_LOCK_DELAY_CHILD";

/// Lock-delay with real departures: a lock-delayed waiter behind
/// a holder process killed outright, or a holder silently cut off (a proxy
/// that drops every packet), is granted no sooner than the server's removal
/// of the holder's key (at its lease's TTL after the last renewal the server
/// received, at most one keepalive interval before the kill or the cut) and
/// the lock-delay after it; behind a clean release or close, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only() {
    if let Ok(endpoints) = std::env::var(DELAY_CHILD) {
        // The child: take the lock, say so, and hold it until killed.
        let session = Client::new(Etcd::new(endpoints.split(',').map(str::to_owned)))
            .session_with(options(2))
            .await
            .expect("session");
        let guard = session
            .mutex("delay/killed")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        println!("held {}", guard.key());
        std::future::pending::<()>().await;
    }
    let delay = Duration::from_secs(2);
    let ttl = Duration::from_secs(2);
    // The server removes a key no sooner than this after the kill or cut.
    let removal = ttl - options(2).keepalive_interval();
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let waiting = client
        .session_with(options(2).with_lock_delay(delay))
        .await
        .expect("session");
    let granted = |name: &str| {
        let mutex = waiting.mutex(name).expect("mutex");
        async move {
            let guard = mutex.lock().await;
            (tokio::time::Instant::now(), guard)
        }
    };

    // A holder process killed outright.
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"));
    child
        .args([
            "--exact",
            "a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only",
            "--nocapture",
        ])
        .env(DELAY_CHILD, cluster.endpoints().join(","));
    let mut holder = lockline_testkit::LineChild::spawn(child).expect("start the holder process");
    loop {
        match holder.line(Duration::from_secs(30)) {
            Some(line) if line.starts_with("held delay/killed/") => break,
            Some(_) => {}
            None => panic!("the holder process never said it held the lock"),
        }
    }
    let waiter = spawn_queued(&client, granted("delay/killed")).await;
    let killed_at = tokio::time::Instant::now();
    holder.signal_and_wait(libc::SIGKILL).expect("kill the holder");
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(
        at - killed_at >= removal + delay,
        "granted {:?} after the kill: the server's removal (≥ {removal:?}) and the lock-delay ({delay:?}) had not both passed",
        at - killed_at
    );
    assert_eq!(client.stats().lock_delays, 1, "{:?}", client.stats());
    guard.expect("lock").release().await.expect("release");

    // A holder cut off silently: its key goes at its lease's TTL, then the
    // lock-delay.
    let proxy = lockline_testkit::TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let far = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let cut = far.session_with(options(2)).await.expect("session");
    let held = cut.mutex("delay/cut").expect("mutex").lock().await.expect("lock");
    let waiter = spawn_queued(&client, granted("delay/cut")).await;
    let cut_at = tokio::time::Instant::now();
    proxy.blackhole();
    bounded("the holder hears of it", held.lost()).await;
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(
        at - cut_at >= removal + delay,
        "granted {:?} after the cut: the server's removal (≥ {removal:?}) and the lock-delay ({delay:?}) had not both passed",
        at - cut_at
    );
    assert_eq!(client.stats().lock_delays, 2, "{:?}", client.stats());
    let guard = guard.expect("lock");
    assert!(guard.token() > held.token());
    guard.release().await.expect("release");
    proxy.heal();
    drop(cut);

    // A clean release, then a clean close: handed on at once.
    for close in [false, true] {
        let name = format!("delay/clean-{close}");
        let releasing = Client::new(Etcd::new(cluster.endpoints()))
            .session_with(options(2))
            .await
            .expect("session");
        let holder = releasing.mutex(&name).expect("mutex").lock().await.expect("lock");
        let waiter = spawn_queued(&client, granted(&name)).await;
        let released_at = tokio::time::Instant::now();
        if close {
            releasing.close().await.expect("close");
        } else {
            holder.release().await.expect("release");
        }
        let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
        assert!(
            at - released_at < delay,
            "a clean {} was held back: granted {:?} after it",
            if close { "close" } else { "release" },
            at - released_at
        );
        guard.expect("lock").release().await.expect("release");
    }
    assert_eq!(
        client.stats().lock_delays,
        2,
        "a lock-delay began after a clean hand-over"
    );
}

/// The race a lock-delayed waiter's wait can lose: its predecessor goes
/// between the read that showed it and the start of the watch on it, so the
/// watch never sees the deletion. Its revision is replayed from the server's
/// history, and the hand-over markers still tell a release and a close from
/// a revoked lease; a release whose history is compacted away before the
/// read counts as a loss (a lock-delay at worst), and the read still
/// succeeds. Driven step by step through the backend session, so
/// that the deletion falls in that window every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_predecessor_gone_before_the_watch_began_still_tells_release_from_loss() {
    use lockline::backend::{AppendRequest, Conflicts, Departure, Earlier, EntryKind};
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let waiting = client
        .session_with(options(5).with_lock_delay(Duration::from_secs(5)))
        .await
        .expect("session");
    let remote = waiting.backend_session();
    for (round, ending) in ["release", "close", "revoke", "compacted"].into_iter().enumerate() {
        let name = format!("delay/early-{ending}");
        let holding = client.session_with(options(5)).await.expect("session");
        let held = holding.mutex(&name).expect("mutex").lock().await.expect("lock");
        let attempt = format!("race{round}");
        let request = AppendRequest {
            dir: &name,
            kind: EntryKind::Mutex,
            attempt: &attempt,
            value: b"",
            conflicts: Conflicts::All,
            nearest: 1,
        };
        let appended = remote.append(&request).await.expect("append");
        let mine = appended.entry;
        let before = appended.nearest.expect("the nearest entry, read with the append");
        assert_eq!(before.len(), 1, "{before:?}");
        let predecessor = before[0].clone();
        assert_eq!(predecessor.key, held.key());
        // Gone after that read, before any watch on it.
        match ending {
            "close" => holding.close().await.expect("close"),
            "revoke" => revoke(&cluster, &holding).await,
            _ => held.release().await.expect("release"),
        }
        bounded("the wait ends", remote.wait_gone(&predecessor))
            .await
            .expect("wait");
        if ending == "compacted" {
            let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
                .await
                .expect("side client");
            let now = side
                .get("x", None)
                .await
                .expect("read")
                .header()
                .expect("header")
                .revision();
            side.compact(now, None).await.expect("compact");
        }
        let read = bounded("the read after it", remote.earlier(&mine, Conflicts::All, 1))
            .await
            .expect("read");
        assert_eq!(read, Earlier::Entries(Vec::new()), "{ending}");
        let departure = remote.departure(&predecessor);
        match ending {
            "revoke" | "compacted" => assert!(matches!(departure, Departure::Lost { .. }), "{ending}: {departure:?}"),
            _ => assert_eq!(departure, Departure::Released, "a clean {ending}"),
        }
        assert!(remote.remove(&mine).await.expect("remove"));
    }
}
