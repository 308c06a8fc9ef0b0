//! Lock-delay after a holder cut off or expired, and none after a clean
//! release or close.

use super::*;

/// Lock-delay: a waiter is held back for the delay after a holder cut off
/// silently (a blackholing proxy: its entry expires on the server at its
/// TTL, and the delay counts from then) or whose session ended without a
/// release (its key and entries gone as at their TTL, nothing published),
/// and not after a clean release or close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_holds_back_after_a_cut_off_or_expired_holder_only() {
    let delay = Duration::from_millis(1500);
    let server = RedisServer::start().expect("start redis");
    let client = Client::new(Redis::new(server.url()));
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
    let mut side = support::side(&server.url()).await;

    // A holder cut off silently: its entry expires on the server at its
    // TTL (read right after the cut: that last renewal is the one the
    // server had), then the lock-delay.
    let (proxy, far) = through_a_proxy(&server);
    let cut = far.session_with(options(2000)).await.expect("session");
    let held = cut.mutex("delay/cut").expect("mutex").lock().await.expect("lock");
    let waiter = tokio::spawn(granted("delay/cut"));
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    proxy.blackhole();
    let asked = Instant::now();
    let left: i64 = side.pttl(held.key()).await.expect("pttl");
    assert!(left > 0, "the holder's entry has no TTL ({left})");
    // The server expires the entry no sooner than this (PTTL counts whole
    // milliseconds of the server's clock, read after `asked`).
    let expires = asked + Duration::from_millis(left.unsigned_abs()) - Duration::from_millis(1);
    bounded("the holder hears of it", held.lost()).await;
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        at >= expires + delay,
        "granted {:?} before the entry's expiry and the lock-delay ({delay:?}) had both passed",
        (expires + delay) - at
    );
    assert!(
        at - expires < delay + Duration::from_secs(1),
        "granted {:?} after the entry's expiry (lock-delay {delay:?})",
        at - expires
    );
    assert!(guard.token() > held.token());
    assert_eq!(client.stats().lock_delays, 1, "{:?}", client.stats());
    guard.release().await.expect("release");
    proxy.heal();

    // A session that ended without a release: its key and entries gone as
    // at their TTL, with nothing published.
    let ended = client.session_with(options(2000)).await.expect("session");
    let held = ended.mutex("delay/ended").expect("mutex").lock().await.expect("lock");
    let waits = client.stats().waits;
    let waiter = tokio::spawn(granted("delay/ended"));
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
    let ended_at = Instant::now();
    support::expire(&[server.url()], ended.id()).await;
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(
        at - ended_at >= delay,
        "granted {:?} after the session ended",
        at - ended_at
    );
    bounded("the holder hears of it", held.lost()).await;
    assert!(!held.is_held());
    assert_eq!(client.stats().lock_delays, 2, "{:?}", client.stats());
    guard.expect("lock").release().await.expect("release");

    // A clean release, then a clean close: handed on at once.
    for close in [false, true] {
        let name = if close { "delay/closed" } else { "delay/released" };
        let releasing = client.session_with(options(2000)).await.expect("session");
        let holder = releasing.mutex(name).expect("mutex").lock().await.expect("lock");
        let waits = client.stats().waits;
        let waiter = tokio::spawn(granted(name));
        lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
        let let_go = Instant::now();
        if close {
            releasing.close().await.expect("close");
            drop(holder);
        } else {
            holder.release().await.expect("release");
        }
        let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
        assert!(at - let_go < delay, "a clean {name} was held back {:?}", at - let_go);
        guard.expect("lock").release().await.expect("release");
    }
    assert_eq!(
        client.stats().lock_delays,
        2,
        "a lock-delay began after a clean hand-over: {:?}",
        client.stats()
    );
    // Neither left a lost mark; the lost ones did, for a minute.
    let marks = support::scan(&mut side, "{delay/*}:l:*").await;
    assert_eq!(marks.len(), 2, "{marks:?}");
    for mark in &marks {
        assert!(
            mark.starts_with("{delay/cut}:l:") || mark.starts_with("{delay/ended}:l:"),
            "{mark}"
        );
        let ttl: i64 = side.pttl(mark).await.expect("pttl");
        assert!(ttl > 0 && ttl <= 60_000, "the mark {mark} does not expire ({ttl})");
    }
}
