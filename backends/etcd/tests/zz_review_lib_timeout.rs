//! Review probes: `lock_timeout(Duration::ZERO)` grants a free lock and fails
//! at once on a taken one leaving no entry; nested acquires of one session
//! say "held by this session".

use std::time::{Duration, Instant};

use lockline::{Client, Error, SessionOptions};

async fn probe(a: Client, b: Client) {
    let options = SessionOptions::new().with_ttl(Duration::from_secs(10));
    let sa = a.session_with(options.clone()).await.expect("session");
    let sb = b.session_with(options).await.expect("session");
    let ma = sa.mutex("review/zero").expect("mutex");
    let mb = sb.mutex("review/zero").expect("mutex");
    for round in 0..30 {
        // Free: granted, whoever released last.
        let started = Instant::now();
        let g = ma
            .lock_timeout(Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("round {round}: a free lock must be granted by lock_timeout(0): {e}"));
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "round {round}: {took:?}");
        // Taken by another session: Timeout at once, no entry left.
        let started = Instant::now();
        match mb.lock_timeout(Duration::ZERO).await {
            Err(Error::Timeout {
                held_by_this_session: false,
                ..
            }) => {}
            other => panic!("round {round}: expected Timeout, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        // Nested on the holder's own session.
        let nested = ma.lock_timeout(Duration::ZERO).await.expect_err("nested");
        assert!(nested.to_string().contains("held by this session"), "{nested}");
        assert!(ma.try_lock().await.expect("try_lock").is_none(), "nested try_lock");
        let nested = ma.lock_timeout(Duration::from_millis(50)).await.expect_err("nested");
        assert!(nested.to_string().contains("held by this session"), "{nested}");
        sb.flush().await;
        sa.flush().await;
        let queue = sb.queue("review/zero").await.expect("queue");
        assert_eq!(queue.len(), 1, "round {round}: entries left: {queue:?}");
        // Alternate who holds: b takes it right after a's release.
        g.release().await.expect("release");
        let g = mb
            .lock_timeout(Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("round {round}: free right after another session's release: {e}"));
        g.release().await.expect("release");
    }
    // A waiter of the same session (not a holder) blocks a nested acquire too.
    let held = mb.lock().await.expect("b holds");
    let waiting = {
        let ma = ma.clone();
        tokio::spawn(async move { ma.lock().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = ma.lock_timeout(Duration::ZERO).await.expect_err("waits");
    eprintln!("nested behind this session's own waiter: {e}");
    held.release().await.expect("release");
    let g = waiting.await.expect("task").expect("lock");
    g.release().await.expect("release");
    sa.flush().await;
    assert!(sb.queue("review/zero").await.expect("queue").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_zero_on_etcd() {
    let cluster = lockline_testkit::EtcdCluster::start().expect("etcd");
    let a = Client::new(lockline_etcd::Etcd::new(cluster.endpoints()));
    let b = Client::new(lockline_etcd::Etcd::new(cluster.endpoints()));
    probe(a, b).await;
}
