//! A session's lease revoked, its keepalives failing, its connection
//! silently cut or its server down: what the session reports, when its
//! holders hear of it, and what a lost session must never do.

use super::*;

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

/// Keepalives that fail make the session `Suspended` (its locks maybe still
/// held); a confirmed renewal makes it `Live` again with its locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_keepalives_suspend_and_a_renewal_revives() {
    let (_cluster, proxy, _client, session) =
        one_node_through_a_proxy(options(6).with_request_timeout(Duration::from_millis(500))).await;
    let guard = suspend_and_revive(&session, "suspend/lock", || proxy.block(), || proxy.unblock()).await;
    guard.release().await.expect("release");
}

/// Under a silent partition (no byte either way, no reset) the holder's
/// session goes Live → Suspended → Lost, and `lost()` fires before the server
/// could expire the lease: a waiter on another connection is granted only
/// after it. After the partition heals, the lost session stays lost.
async fn silent_partition_is_suspended_then_lost_before_expiry(options: SessionOptions) {
    let (cluster, proxy, _client, holder) = one_node_through_a_proxy(options.clone()).await;
    let name = "partition/lock";
    let guard = holder.mutex(name).expect("mutex").lock().await.expect("lock");
    let (_waiter_session, waiter) = timed_waiter(&cluster, name).await;

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
    let cluster = EtcdCluster::start().expect("start etcd");
    for (from, to) in [(LockMode::Ex, LockMode::Pr), (LockMode::Pr, LockMode::Ex)] {
        let (proxy, _client, session) =
            through_a_proxy(&cluster, options(3).with_request_timeout(Duration::from_secs(60))).await;
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
    // Lost 3 s after the last confirmed renewal, long before the 10 s TTL.
    let ttl = Duration::from_secs(10);
    let options = SessionOptions::new()
        .with_ttl(ttl)
        .with_safety_margin(Duration::from_secs(7))
        .with_keepalive_interval(Duration::from_secs(1))
        .with_request_timeout(Duration::from_secs(1));
    let (cluster, proxy, _client, holder) = one_node_through_a_proxy(options).await;
    let lease = i64::from_str_radix(holder.id(), 16).expect("hex lease id");
    let name = "revoke-on-heal/lock";
    let guard = holder.mutex(name).expect("mutex").lock().await.expect("lock");
    let (_waiter_session, waiter) = timed_waiter(&cluster, name).await;

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

/// A session declared lost while one of its tasks waits in the same-session
/// queue behind a dropped guard (whose removal could not reach the server):
/// when the partition heals, before the server expires the lease, the waiting
/// task must fail with `SessionLost`, never be granted the dropped guard's
/// leftover key (its old token) as if it were its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_never_regrants_its_own_leftover() {
    let (_cluster, proxy, _client, session) =
        one_node_through_a_proxy(options(6).with_request_timeout(Duration::from_secs(1))).await;
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
    let (_cluster, proxy, client, session) = one_node_through_a_proxy(options(30)).await;
    let guard = session
        .mutex("rewatch/lock")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    proxy.block();
    lockline::conformance::wait_for_stats(&client, |s| s.rewatches >= 1).await;
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
