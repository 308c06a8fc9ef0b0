//! A silent partition: the holder told before the next grant, the session
//! suspended before it is lost, and `close()` confirmed by the server or an
//! error.

use super::*;

/// A silent partition: the holder declares the lock lost at `ttl - margin`
/// after its last confirmed renewal, before the server lets anyone else in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_holder_is_told_before_the_next_grant() {
    let (server, proxy, holder_session) = session_behind_a_proxy(options(2000)).await;
    let near = Client::new(Redis::new(server.url()));
    let held = holder_session
        .mutex("partition")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let other = near.session_with(options(2000)).await.expect("session");
    let waiter = {
        let mutex = other.mutex("partition").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    lockline::conformance::wait_for_stats(&near, |s| s.waits >= 1).await;
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
    guard.release().await.expect("release");
    proxy.heal();
}

/// A renewal that goes unanswered for a keepalive interval suspends the
/// session while it is still awaited: with a request timeout longer than the
/// loss deadline (as with the default options) a silent partition is
/// reported as `Suspended` first, then `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_partition_suspends_the_session_before_it_is_lost() {
    let (_server, proxy, session) = session_behind_a_proxy(
        SessionOptions::new()
            .with_ttl(Duration::from_secs(3))
            .with_connect_timeout(Duration::from_secs(2))
            .with_request_timeout(Duration::from_secs(5)),
    )
    .await;

    let held = session.mutex("suspend").expect("mutex").lock().await.expect("lock");
    let mut states = session.watch_state();
    proxy.blackhole();
    bounded(
        "Suspended",
        states.wait_for(|state| matches!(state, SessionState::Suspended | SessionState::Lost)),
    )
    .await
    .expect("state");
    assert_eq!(
        *states.borrow(),
        SessionState::Suspended,
        "lost without being suspended first"
    );
    bounded("Lost", states.wait_for(|state| *state == SessionState::Lost))
        .await
        .expect("state");
    bounded("the holder hears of it", held.lost()).await;
    proxy.heal();
}

/// `close()` is `Ok` only once the server deleted the session's entries and
/// key: during a silent partition it is `Unavailable`, asked again it asks
/// the server again, and once the partition heals it confirms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_is_confirmed_by_the_server_or_an_error() {
    let (server, proxy, session) = session_behind_a_proxy(options(30_000)).await;
    let _guard = session.mutex("close").expect("mutex").lock().await.expect("lock");
    proxy.blackhole();
    for attempt in 0..2 {
        match bounded("close", session.close()).await {
            Err(Error::Unavailable { .. }) => {}
            other => panic!("close {attempt} during the partition must be Unavailable, got {other:?}"),
        }
    }
    proxy.heal();
    bounded("close", session.close())
        .await
        .expect("confirmed once the server answers");
    let mut side = support::side(&server.url()).await;
    let left = support::scan(&mut side, "*").await;
    assert_eq!(
        left,
        vec!["{close}:run".to_owned(), "{close}:seq".to_owned()],
        "only the counter and its epoch are left"
    );
}
