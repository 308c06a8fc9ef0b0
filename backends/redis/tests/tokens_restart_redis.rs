//! Fencing tokens across a restart of a server without persistence: the
//! counter `{n}:seq` is lost with the data, and the next one is started from
//! the server's clock, so the next holder's token is above every token
//! handed out before (not 1 again). The holder the server forgot is still
//! told `lost()`.

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions, SessionState};
use lockline_redis::Redis;
use lockline_testkit::{AppendFsync, RedisOptions, RedisServer};
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
/// incremented by one a grant within one server process. A counter without
/// the epoch of this process (`{n}:run`; here one set by hand, which cannot
/// be told from one a lossy restart brought back below tokens already
/// handed out) is lifted to the clock once, never lowered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_counter_starts_at_the_clock_and_an_existing_one_is_incremented_by_one() {
    let server = RedisServer::start().expect("start redis");
    let mut side = support::side(&server.url()).await;
    let client = Client::new(Redis::new(server.url()));
    let session = client.session_with(options()).await.expect("session");
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut side).await.unwrap();
    let clock = seconds * 1_000_000 + micros;
    let first = session.mutex("steps").unwrap().lock().await.expect("lock");
    let t1 = first.token().get();
    // A lock's first token comes from the server's clock, in microseconds.
    assert!(t1 > clock, "first token {t1}, server clock {seconds}.{micros:06}");
    first.release().await.expect("release");
    let second = session.mutex("steps").unwrap().lock().await.expect("lock");
    assert_eq!(second.token().get(), t1 + 1);
    let counter: u64 = side.get("{steps}:seq").await.unwrap();
    assert_eq!(counter, t1 + 1);
    second.release().await.expect("release");
    // A counter set by hand, below the clock and with no epoch: lifted to
    // the clock, then incremented by one.
    let _: () = side.set("{small}:seq", 41).await.unwrap();
    let guard = session.mutex("small").unwrap().lock().await.expect("lock");
    let lifted = guard.token().get();
    assert!(
        lifted > clock,
        "a counter with no epoch must be lifted to the clock: {lifted}"
    );
    guard.release().await.expect("release");
    let guard = session.mutex("small").unwrap().lock().await.expect("lock");
    assert_eq!(guard.token().get(), lifted + 1);
    guard.release().await.expect("release");
    // One above the clock is kept: a lift never lowers a counter.
    let high = 9_000_000_000_000_000_u64;
    let _: () = side.set("{high}:seq", high).await.unwrap();
    let guard = session.mutex("high").unwrap().lock().await.expect("lock");
    assert_eq!(guard.token().get(), high + 1);
    guard.release().await.expect("release");
}

/// Waits until the append-only file `path` holds `count` increments of
/// `counter` (the server is another process, with no event to await: look
/// every 20 ms), and returns its length then: the end of a write of whole
/// commands.
async fn written(path: &std::path::Path, counter: &str, count: usize) -> u64 {
    let incr = format!("*2\r\n$4\r\nINCR\r\n${}\r\n{counter}\r\n", counter.len());
    bounded("the grants written to the append-only file", async {
        loop {
            let bytes = std::fs::read(path).expect("read the AOF");
            let text = String::from_utf8_lossy(&bytes);
            if text.matches(&incr).count() >= count {
                return u64::try_from(bytes.len()).expect("a file length");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// A server with an append-only file fsynced once a second (`appendfsync
/// everysec`, Redis's default once AOF is on) acknowledges writes it has
/// not yet made durable: a machine that loses what was not fsynced (a
/// power loss, a kernel crash, a VM reset) brings the server back without
/// its last writes, the lock's counter among them, below tokens already
/// handed out. A SIGKILL alone loses nothing the server had written to the
/// operating system, so the test kills the server right after a burst of
/// grants and cuts the append-only file back to where it ended before the
/// burst, as that machine would, then starts the server again on the same
/// port and data.
///
/// Every token granted after the restart is above every token granted
/// before it, to the session that held across the restart (it renews on a
/// new connection, and so appends before any renewal of its own could have
/// noticed anything) and to a new one; the holder whose entry the restart
/// lost is told `lost()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_that_lost_the_last_writes_tokens_stay_above_every_earlier_one() {
    let mut server = RedisServer::start_with(&RedisOptions {
        append_only: true,
        append_fsync: AppendFsync::EverySec,
        ..RedisOptions::default()
    })
    .expect("start redis");
    let client = Client::new(Redis::new(server.url()));
    // A TTL long enough for the session key, written before the burst, to
    // outlive the test: the old session carries on after the restart.
    let long = options().with_ttl(Duration::from_secs(30));
    let old = client.session_with(long.clone()).await.expect("session");
    let mut before = Vec::new();
    for _ in 0..3 {
        let guard = old.mutex("lossy").unwrap().lock().await.expect("lock");
        before.push(guard.token().get());
        guard.release().await.expect("release");
    }
    // What a machine crash keeps: the file up to here, once it holds these
    // three grants (an everysec server may acknowledge a write before it
    // writes it to the file, while an fsync is in progress).
    let tail = server.append_only_tail().expect("the append-only file");
    let kept = written(&tail, "{lossy}:seq", 3).await;
    // The burst the crash loses, the last grant still held.
    for _ in 0..50 {
        let guard = old.mutex("lossy").unwrap().lock().await.expect("lock");
        before.push(guard.token().get());
        guard.release().await.expect("release");
    }
    let held = old.mutex("lossy").unwrap().lock().await.expect("lock");
    before.push(held.token().get());
    assert!(before.windows(2).all(|w| w[0] < w[1]), "before the restart: {before:?}");
    let highest = *before.iter().max().unwrap();
    let run_before = server.run_id().expect("run_id");

    server.member().kill().expect("kill redis");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&tail)
        .expect("open the AOF");
    file.set_len(kept).expect("cut the AOF");
    drop(file);
    server.restart().expect("restart redis");
    assert_ne!(
        server.run_id().expect("run_id"),
        run_before,
        "a restart changes the run_id"
    );
    let mut side = support::side(&server.url()).await;
    let counter: u64 = side.get("{lossy}:seq").await.expect("the counter survived");
    assert!(
        counter < highest,
        "the restart must have brought the counter back below tokens handed out ({counter} < {highest})"
    );

    // The holder the restart forgot hears of it at its next renewal.
    bounded("the old holder hears of its loss", held.lost()).await;
    assert!(!held.is_held());
    let fresh = client.session_with(options()).await.expect("a new session");
    let mut after = Vec::new();
    for session in [&old, &fresh, &old] {
        let guard = bounded("lock after the restart", session.mutex("lossy").unwrap().lock())
            .await
            .expect("lock after the restart");
        after.push(guard.token().get());
        guard.release().await.expect("release");
    }
    for token in &after {
        assert!(
            *token > highest,
            "token {token} after the restart is not above every earlier one (up to {highest}): before {before:?}, after {after:?}"
        );
    }
    // Lifted once: within the restarted process, one a grant again.
    assert!(
        after.windows(2).all(|w| w[1] == w[0] + 1),
        "after the restart: {after:?}"
    );
    assert_eq!(old.state(), SessionState::Live, "the old session outlived the restart");
}

/// A user the server does not allow `INFO` (an ACL with `-@dangerous`, a
/// common hardening) still opens sessions and takes locks, its tokens
/// growing by one a grant: the server's epoch is then unknown, and only the
/// lift after a restart that lost the last writes is not had (the crate's
/// docs say so), nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_not_allowed_info_still_takes_locks() {
    let server = RedisServer::start().expect("start redis");
    server
        .cli(&[
            "ACL",
            "SETUSER",
            "locker",
            "on",
            ">secret",
            "+@all",
            "-@dangerous",
            "~*",
            "&*",
        ])
        .expect("ACL SETUSER");
    let url = format!("redis://locker:secret@127.0.0.1:{}", server.port());
    let session = Client::new(Redis::new(url))
        .session_with(options())
        .await
        .expect("a session without INFO");
    let first = session.mutex("no-info").unwrap().lock().await.expect("lock");
    let t1 = first.token().get();
    first.release().await.expect("release");
    let second = session.mutex("no-info").unwrap().lock().await.expect("lock");
    assert_eq!(second.token().get(), t1 + 1);
    second.release().await.expect("release");
    let mut side = support::side(&server.url()).await;
    let epoch: Option<String> = side.get("{no-info}:run").await.expect("get");
    assert_eq!(epoch, None, "no epoch is recorded when it is unknown");
}
