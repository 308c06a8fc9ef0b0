//! The release's announcement of the new head, heard by a same-session
//! waiter of another kind while the mutex at the head is parked waiting for
//! a foreign owner of the plain key `n` (no keyspace events).
//!
//! Queue on `hp`: X (session S1, mutex, at the head but blocked by a foreign
//! `SET hp … NX PX`), Y (S2, write lock, waits on X), Z (S1, write lock,
//! waits on Y). The foreign client lets `hp` go and Y is cancelled. Y's
//! removal must not hand the lock to X on Z's channel (X does not listen
//! there, and would be granted later without the plain key): X takes `hp`
//! itself when it wakes, and a foreign `SET hp … NX` then fails while X holds
//! (found by review).

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions};
use lockline_redis::Redis;
use lockline_testkit::RedisServer;

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_waiting_for_the_plain_key_is_not_handed_the_lock_by_another_channel() {
    let server = RedisServer::start().expect("redis"); // no keyspace events
    let options = SessionOptions::new().with_ttl(Duration::from_secs(6));
    let client = Client::new(Redis::new(server.url()));
    let s1 = client.session_with(options.clone()).await.unwrap();
    let s2 = client.session_with(options.clone()).await.unwrap();
    let mut side = support::side(&server.url()).await;

    // A foreign single-key holder, 9 s lease.
    let ok: Option<String> = redis::cmd("SET")
        .arg("hp")
        .arg("foreign-1")
        .arg("NX")
        .arg("PX")
        .arg(9000)
        .query_async(&mut side)
        .await
        .unwrap();
    assert!(ok.is_some());

    let x = {
        let m = s1.mutex("hp").unwrap();
        tokio::spawn(async move { m.lock().await })
    };
    let watcher = client.session().await.unwrap();
    let queued = |n: usize| {
        let w = watcher.clone();
        async move {
            bounded("queue", async {
                while w.queue("hp").await.unwrap().len() < n {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
        }
    };
    queued(1).await;
    let y = {
        let rw = s2.rwlock("hp").unwrap();
        tokio::spawn(async move { rw.write().await.map(drop) })
    };
    queued(2).await;
    let z = {
        let rw = s1.rwlock("hp").unwrap();
        tokio::spawn(async move { rw.write().await })
    };
    queued(3).await;
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 3).await; // everyone parked

    // The foreign holder lets go; then Y is cancelled.
    let _: i64 = redis::cmd("DEL").arg("hp").query_async(&mut side).await.unwrap();
    y.abort();
    let _ = y.await;
    bounded("flush", s2.flush()).await;
    let owner: Option<String> = redis::cmd("GET").arg("hp").query_async(&mut side).await.unwrap();
    assert_eq!(owner, None, "Y's removal took the plain key for a head not listening");

    let guard = bounded("X is granted", x).await.unwrap().expect("lock");
    let owner: Option<String> = redis::cmd("GET").arg("hp").query_async(&mut side).await.unwrap();
    let granted_without_plain = owner.as_deref() != Some(guard.key());
    // A foreign single-key client tries now.
    let stolen: Option<String> = redis::cmd("SET")
        .arg("hp")
        .arg("foreign-2")
        .arg("NX")
        .arg("PX")
        .arg(30000)
        .query_async(&mut side)
        .await
        .unwrap();
    let x_held = guard.is_held();
    z.abort();
    assert!(
        !(granted_without_plain || stolen.is_some() && x_held),
        "a foreign single-key client and lockline mutex holder X held `hp` at once"
    );
}

/// The plain key a release takes for the next mutex holder lives as long as
/// that holder's entry, which its own session renews, not as long as the
/// releaser's TTL: with a 1 s releaser and a 30 s successor, the key must
/// not expire under the successor before its first renewal (found by
/// review: a foreign `SET NX` was granted beside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_key_taken_by_a_release_lives_as_long_as_the_new_holder() {
    let server = RedisServer::start().expect("redis");
    let client = Client::new(Redis::new(server.url()));
    let short = client
        .session_with(SessionOptions::new().with_ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    let long = client
        .session_with(SessionOptions::new().with_ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let mut side = support::side(&server.url()).await;

    let held = short.mutex("mixed-ttls").unwrap().lock().await.unwrap();
    let waiter = {
        let mutex = long.mutex("mixed-ttls").unwrap();
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    held.release().await.unwrap();
    let guard = bounded("granted", waiter).await.unwrap().unwrap();
    let owner: String = redis::cmd("GET")
        .arg("mixed-ttls")
        .query_async(&mut side)
        .await
        .unwrap();
    let plain_ttl: i64 = redis::cmd("PTTL")
        .arg("mixed-ttls")
        .query_async(&mut side)
        .await
        .unwrap();
    let entry_ttl: i64 = redis::cmd("PTTL").arg(&owner).query_async(&mut side).await.unwrap();
    assert!(
        plain_ttl > 1_000,
        "the plain key got the releaser's TTL ({plain_ttl} ms), not the new holder's"
    );
    assert!(
        plain_ttl + 1_000 >= entry_ttl,
        "the plain key ({plain_ttl} ms) expires well before the holder's entry ({entry_ttl} ms)"
    );
    let foreign: Option<String> = redis::cmd("SET")
        .arg("mixed-ttls")
        .arg("foreign")
        .arg("NX")
        .arg("PX")
        .arg(20_000)
        .query_async(&mut side)
        .await
        .unwrap();
    assert!(foreign.is_none(), "a foreign SET NX was granted beside the holder");
    guard.release().await.unwrap();
}
