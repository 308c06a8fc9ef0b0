//! Attacks on the lock-delay promise against a real Redis: a holder
//! lost while its lock-delayed waiter is briefly cut off from the server
//! (silently: its wait is cut short, and it never hears how the entry went).

use std::time::{Duration, Instant};

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions, SessionState};
use lockline_redis::Redis;
use lockline_testkit::{RedisServer, TcpProxy};

mod support;

fn options(ttl_ms: u64) -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_millis(ttl_ms))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(1))
}

/// The holder's session ends without a release (its key and entries gone as
/// at their TTL, nothing published) while the lock-delayed waiter's
/// connections are silently partitioned; the partition heals well within the
/// waiter's own TTL. It
/// must still be held back for its lock-delay: the holder was lost, not
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_during_the_waiters_disconnection_still_holds_it_back() {
    let delay = Duration::from_secs(4);
    let server = RedisServer::start().expect("start redis");
    let client = Client::new(Redis::new(server.url()));
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", server.port())).expect("proxy");
    let far = Client::new(Redis::new(format!("redis://{}", proxy.address())));
    let waiting = far
        .session_with(options(10_000).with_lock_delay(delay))
        .await
        .expect("session");
    let holder = client.session_with(options(10_000)).await.expect("session");
    let held = holder.mutex("interrupted").expect("mutex").lock().await.expect("lock");
    let waiter = {
        let mutex = waiting.mutex("interrupted").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    bounded("the waiter queues", far.wait_for_stats(|s| s.waits >= 1)).await;

    // Partition the waiter, end the holder's session meanwhile.
    proxy.blackhole();
    let mut state = waiting.watch_state();
    bounded(
        "the waiter's session notices the partition",
        state.wait_for(|s| *s != SessionState::Live),
    )
    .await
    .expect("state");
    let lost_at = Instant::now();
    support::expire(&[server.url()], holder.id()).await;
    bounded("the holder hears of it", held.lost()).await;
    proxy.heal();

    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        at - lost_at >= delay,
        "granted {:?} after the holder's session ended, within the lock-delay of {delay:?} (lock_delays: {})",
        at - lost_at,
        far.stats().lock_delays
    );
    guard.release().await.expect("release");
}
