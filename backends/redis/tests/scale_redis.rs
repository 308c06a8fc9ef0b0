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
/// session (each one's TTL refreshed before it runs out), and
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
        let expiry = expiry_at_most(&mut side, &other).await;
        others.push((i, other, expiry));
    }
    let expiry = expiry_at_most(&mut side, &key).await;
    renewed(&mut side, &key, expiry).await;
    // Every entry, the last acquired included, is renewed before it runs
    // out. Not necessarily in the renewal seen above: a renewal is one
    // pipeline, in the order the session keeps its entries, not the order
    // they were taken in, and may still be on its way.
    for (i, key, before) in &others {
        eprintln!("entry {i}: waiting for its renewal");
        renewed(&mut side, key, *before).await;
    }
    assert!(guards.iter().all(|g| g.is_held()));
    for guard in guards {
        guard.release().await.expect("release");
    }
    session.close().await.expect("close");
    let entries = support::scan(&mut side, "{scale/*}:e:*").await;
    assert!(entries.is_empty(), "{} entries left", entries.len());
}

/// When `key` expires, at the latest: its TTL counted from when the
/// answer came (the server read it before).
async fn expiry_at_most(side: &mut redis::aio::MultiplexedConnection, key: &str) -> Instant {
    let left: i64 = side.pttl(key).await.expect("pttl");
    assert!(left > 0, "{key} has no TTL left ({left})");
    Instant::now() + Duration::from_millis(left.unsigned_abs())
}

/// Waits until `key` expires later than `expiry` (renewed since): each TTL
/// counted from before its request was sent, so that a slow answer never
/// passes for a renewal. Bounded, and failing if the key runs out first.
/// The server is another process, with no event to await: looked at every
/// 50 ms.
async fn renewed(side: &mut redis::aio::MultiplexedConnection, key: &str, expiry: Instant) {
    bounded("a renewal", async {
        loop {
            let asked = Instant::now();
            let left: i64 = side.pttl(key).await.expect("pttl");
            assert!(left > 0, "{key} ran out before it was renewed ({left})");
            if asked + Duration::from_millis(left.unsigned_abs()) > expiry {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
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
