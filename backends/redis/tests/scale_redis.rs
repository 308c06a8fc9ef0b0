//! Many locks on one session, and a pub/sub connection that drops while a
//! waiter waits.

use std::time::{Duration, Instant};

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions};
use lockline_redis::Redis;
use lockline_testkit::RedisServer;
use redis::AsyncCommands;

mod support;

/// 10,000 locks held on one session: every entry is renewed with the
/// session (each one's TTL is refreshed within a keepalive interval), and
/// releasing them leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_locks_on_one_session_are_all_renewed() {
    const LOCKS: usize = 10_000;
    let server = RedisServer::start().expect("start redis");
    let client = Client::new(Redis::new(server.url()));
    let ttl = Duration::from_secs(6);
    let session = client
        .session_with(SessionOptions::new().with_ttl(ttl))
        .await
        .expect("session");
    let started = Instant::now();
    let mut guards = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        let guard = session
            .mutex(&format!("scale/{i}"))
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        guards.push(guard);
    }
    eprintln!("{LOCKS} locks acquired in {:?}", started.elapsed());
    // Wait past the first entries' half-life: only renewals keep them long.
    let mut side = support::side(&server.url()).await;
    let first = "{scale/0}:e:";
    let key = support::scan(&mut side, &format!("{first}*"))
        .await
        .pop()
        .expect("the first entry");
    // The other entries checked, found before the wait: a scan of 10,000
    // keys after it, on a loaded machine, took long enough for a renewed
    // TTL to run down below the check's margin.
    let mut others = Vec::new();
    for i in [1, LOCKS / 2, LOCKS - 1] {
        let other = support::scan(&mut side, &format!("{{scale/{i}}}:e:*"))
            .await
            .pop()
            .expect("an entry");
        others.push((i, other));
    }
    let appended_ttl: i64 = side.pttl(&key).await.expect("pttl");
    let renewed = bounded("a renewal", async {
        loop {
            let left: i64 = side.pttl(&key).await.expect("pttl");
            if left > appended_ttl {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    renewed.await;
    // Every entry, the last acquired included, was renewed together with it.
    for (i, key) in &others {
        let left: i64 = side.pttl(key).await.expect("pttl");
        assert!(
            left > i64::try_from(ttl.as_millis()).expect("ms") - 2_500,
            "entry {i} was not renewed: {left} ms left"
        );
    }
    assert!(guards.iter().all(|g| g.is_held()));
    for guard in guards {
        guard.release().await.expect("release");
    }
    session.close().await.expect("close");
    let entries = support::scan(&mut side, "{scale/*}:e:*").await;
    assert!(entries.is_empty(), "{} entries left", entries.len());
}

/// The session's pub/sub connection is killed while a waiter waits, and the
/// holder releases while it is down: the release's message is lost, and the
/// waiter is granted anyway once the connection is back (it looks again),
/// long before the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_pubsub_connection_drops_is_granted_anyway() {
    let server = RedisServer::start().expect("start redis");
    let options = SessionOptions::new().with_ttl(Duration::from_secs(30));
    let holder = Client::new(Redis::new(server.url()))
        .session_with(options.clone())
        .await
        .expect("session");
    let client = Client::new(Redis::new(server.url()));
    let waiting = client.session_with(options).await.expect("session");
    let held = holder.mutex("dropped").expect("mutex").lock().await.expect("lock");
    let waiter = {
        let mutex = waiting.mutex("dropped").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    let mut side = support::side(&server.url()).await;
    // Kill every pub/sub connection, then release before they are back.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut side)
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1, "no pub/sub connection to kill");
    held.release().await.expect("release");
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted after the reconnection, not at the holder's TTL")
        .expect("task")
        .expect("lock");
    granted.release().await.expect("release");
}
