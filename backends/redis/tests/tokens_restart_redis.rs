//! Fencing tokens across a restart of a server without persistence: the
//! counter `{n}:seq` is lost with the data, and the next one is started from
//! the server's clock, so the next holder's token is above every token
//! handed out before (not 1 again). The holder the server forgot is still
//! told `lost()`.

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions, SessionState};
use lockline_redis::Redis;
use lockline_testkit::RedisServer;
use redis::AsyncCommands;

mod support;

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(3))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_without_persistence_tokens_stay_above_every_earlier_one() {
    let mut server = RedisServer::start().expect("start redis"); // no AOF, no RDB
    let client = Client::new(Redis::new(server.url()));
    let old = client.session_with(options()).await.expect("session");

    // Several holders one after the other, of a mutex and of a write lock
    // and a read lock on another name (one counter a name, whatever the kind).
    let mut earlier = Vec::new();
    for _ in 0..3 {
        let guard = old.mutex("tokens").unwrap().lock().await.expect("lock");
        earlier.push(guard.token().get());
        guard.release().await.expect("release");
    }
    let rw = old.rwlock("tokens-rw").unwrap();
    let write = rw.write().await.expect("write lock");
    let write_token = write.token().get();
    write.release().await.expect("release");
    let read = rw.read().await.expect("read lock");
    assert!(read.token().get() > write_token);
    let read_token = read.token().get();
    // The last holder keeps the lock across the restart.
    let held = old.mutex("tokens").unwrap().lock().await.expect("lock");
    earlier.push(held.token().get());
    assert!(
        earlier.windows(2).all(|w| w[0] < w[1]),
        "tokens must grow from holder to holder: {earlier:?}"
    );
    let highest = *earlier.last().unwrap();

    server.member().kill().expect("kill redis");
    server.restart().expect("restart redis");
    let mut side = support::side(&server.url()).await;
    let counters: Vec<Option<String>> = vec![
        side.get("{tokens}:seq").await.unwrap(),
        side.get("{tokens-rw}:seq").await.unwrap(),
    ];
    assert_eq!(counters, [None, None], "the restart must have lost the counters");

    // A new holder on the restarted server, possibly before the old one has
    // heard of its loss: its token is above every earlier one, so a fenced
    // resource turns the old holder away and accepts the new one.
    let fresh = client
        .session_with(options())
        .await
        .expect("a session on the restarted server");
    let mut later = Vec::new();
    for _ in 0..3 {
        let guard = bounded("lock after the restart", fresh.mutex("tokens").unwrap().lock())
            .await
            .expect("lock after the restart");
        later.push(guard.token().get());
        guard.release().await.expect("release");
    }
    assert!(
        later[0] > highest,
        "the first token after the restart ({}) must be above every earlier one (up to {highest}): before {earlier:?}, after {later:?}",
        later[0]
    );
    assert!(later.windows(2).all(|w| w[0] < w[1]), "after the restart: {later:?}");
    let write = fresh.rwlock("tokens-rw").unwrap().write().await.expect("write lock");
    assert!(
        write.token().get() > read_token,
        "a write lock after the restart ({}) must be above the read lock's token before it ({read_token})",
        write.token().get()
    );
    write.release().await.expect("release");

    // The server forgot the old session: its holders hear `lost()`.
    bounded("the old holder hears of its loss", held.lost()).await;
    assert!(!held.is_held());
    bounded("the old reader hears of its loss", read.lost()).await;
    assert_eq!(old.state(), SessionState::Lost);
}

/// A missing counter is started from the server's clock; one that exists is
/// incremented as before, the clock only starting a missing one. Tokens of one lock go up by one from grant to grant while
/// the server keeps its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_counter_starts_at_the_clock_and_an_existing_one_is_incremented_by_one() {
    let server = RedisServer::start().expect("start redis");
    let mut side = support::side(&server.url()).await;
    let client = Client::new(Redis::new(server.url()));
    let session = client.session_with(options()).await.expect("session");
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut side).await.unwrap();
    let first = session.mutex("steps").unwrap().lock().await.expect("lock");
    let t1 = first.token().get();
    // A lock's first token comes from the server's clock, in microseconds.
    assert!(
        t1 > seconds * 1_000_000 + micros,
        "first token {t1}, server clock {seconds}.{micros:06}"
    );
    first.release().await.expect("release");
    let second = session.mutex("steps").unwrap().lock().await.expect("lock");
    assert_eq!(second.token().get(), t1 + 1);
    let counter: u64 = side.get("{steps}:seq").await.unwrap();
    assert_eq!(counter, t1 + 1);
    second.release().await.expect("release");
    // A counter set by hand (another client, or one from before this
    // version) is incremented from where it is, not lifted to the clock.
    let _: () = side.set("{small}:seq", 41).await.unwrap();
    let guard = session.mutex("small").unwrap().lock().await.expect("lock");
    assert_eq!(guard.token().get(), 42);
    guard.release().await.expect("release");
}
