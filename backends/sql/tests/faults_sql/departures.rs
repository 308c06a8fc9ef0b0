//! A holder that goes without a release: killed outright (replaced within a
//! second) or silently partitioned (told before the next grant), and the
//! lock-delay after each, none after a clean release.

use super::*;

on_both!(
    a_killed_holder_is_replaced_within_a_second,
    a_blackholed_holder_is_told_before_the_next_grant,
    a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only,
);

/// A holder process killed outright: the server sees its connection reset
/// and frees its guard, so the next waiter is granted at once (well within
/// a second), woken once.
async fn a_killed_holder_is_replaced_within_a_second(db: Db) {
    let url = db.url();
    let (mut holder, first) = spawn_probe(&url, "killed", "hold", 30_000);
    let token: u64 = first
        .strip_prefix("held ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the probe said {first:?}"));
    let client = Client::new(Sql::new(url));
    let session = client.session_with(options(30_000)).await.expect("session");
    let waiter = timed_waiter(&client, &session, "killed").await;
    let killed_at = Instant::now();
    holder.signal_and_wait(libc::SIGKILL).expect("kill the holder");
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    let took = granted_at - killed_at;
    assert!(
        took < Duration::from_secs(1),
        "the next holder was granted {took:?} after the holder was killed"
    );
    assert!(guard.token().get() > token);
    assert_eq!(client.stats().wakeups, 1, "{:?}", client.stats());
    guard.release().await.expect("release");
    until("the dead holder's row is gone", || db.entries() == 0).await;
}

/// A silent partition (packets dropped, no reset; the server's TCP
/// keepalives at their defaults): the holder is told at `ttl - margin`
/// after its last answered renewal, before the waiter ends its connection
/// at the TTL by the database's clock and is granted, within TTL + slack.
async fn a_blackholed_holder_is_told_before_the_next_grant(db: Db) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    let near = Client::new(Sql::new(db.url()));
    // Long enough that a loaded machine's holder still holds when the
    // waiter queues (with 2 s one was seen lose its lock before that).
    let ttl = 4000;
    let holder_session = far.session_with(options(ttl)).await.expect("session");
    let held = holder_session
        .mutex("partition")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let other = near.session_with(options(ttl)).await.expect("session");
    let waiter = timed_waiter(&near, &other, "partition").await;
    let cut_at = Instant::now();
    proxy.blackhole();
    bounded("the holder hears of it", held.lost()).await;
    let lost_at = Instant::now();
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        lost_at <= granted_at,
        "the next holder was granted {:?} before the partitioned holder was told",
        lost_at - granted_at
    );
    let took = granted_at - cut_at;
    assert!(
        took < Duration::from_millis(ttl) + Duration::from_secs(3),
        "the next holder was granted {took:?} after the partition (TTL {ttl} ms)"
    );
    assert!(guard.token() > held.token());
    assert_eq!(holder_session.state(), SessionState::Lost);
    guard.release().await.expect("release");
    proxy.heal();
    drop(holder_session);
}

/// With a lock-delay, a waiter behind a holder whose process was killed
/// (SIGKILL: the server frees its guard at once) is granted no sooner than
/// the delay after the kill; behind a holder cut off silently (ended by the
/// waiter at its TTL), no sooner than the delay after that end; behind a
/// clean release, at once.
async fn a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only(db: Db) {
    let delay = Duration::from_millis(1500);
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()));
    let waiting = client
        .session_with(options(2000).with_lock_delay(delay))
        .await
        .expect("session");
    let granted = |name: &str| {
        let mutex = waiting.mutex(name).expect("mutex");
        async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        }
    };

    // A killed holder process.
    let (mut holder, first) = spawn_probe(&url, "delay/killed", "hold", 30_000);
    assert!(first.starts_with("held "), "{first}");
    let waiter = tokio::spawn(granted("delay/killed"));
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    let killed_at = Instant::now();
    holder.signal_and_wait(libc::SIGKILL).expect("kill the holder");
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(at - killed_at >= delay, "granted {:?} after the kill", at - killed_at);
    guard.expect("lock").release().await.expect("release");

    // A holder cut off silently: ended at its TTL, then the lock-delay.
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    // As in the blackholed case: the holder must still hold when the
    // waiter queues, on a loaded machine too.
    let cut_ttl = 4000;
    let cut = far.session_with(options(cut_ttl)).await.expect("session");
    let held = cut.mutex("delay/cut").expect("mutex").lock().await.expect("lock");
    let waits = client.stats().waits;
    let waiter = tokio::spawn(granted("delay/cut"));
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
    let cut_at = Instant::now();
    proxy.blackhole();
    bounded("the holder hears of it", held.lost()).await;
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    // The server ends the holder at its TTL from its last heartbeat, at most
    // a keepalive interval (a third of the TTL) before the cut.
    assert!(
        at - cut_at >= Duration::from_millis(cut_ttl * 2 / 3) + delay,
        "granted {:?} after the cut: the TTL ({cut_ttl} ms, less a keepalive interval) and the lock-delay ({delay:?}) had not both passed",
        at - cut_at
    );
    guard.expect("lock").release().await.expect("release");
    proxy.heal();

    // A clean release: at once.
    let delays = client.stats().lock_delays;
    let releasing = client.session_with(options(2000)).await.expect("session");
    let holder = releasing
        .mutex("delay/clean")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let waits = client.stats().waits;
    let waiter = tokio::spawn(granted("delay/clean"));
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
    let released_at = Instant::now();
    holder.release().await.expect("release");
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(
        at - released_at < delay,
        "a clean release was held back {:?}",
        at - released_at
    );
    assert_eq!(
        client.stats().lock_delays,
        delays,
        "a lock-delay began after a clean release"
    );
    guard.expect("lock").release().await.expect("release");
}
