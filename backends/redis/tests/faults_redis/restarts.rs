//! A server killed and restarted under a held and a queued lock: without
//! persistence every session is lost; with an append-only file the queue
//! survives.

use super::*;

/// What a lock's waiter answers.
type Waiter = tokio::task::JoinHandle<lockline::Result<lockline::MutexGuard>>;

/// On `server`, one session of a client holds `name` and another waits for
/// it (both with a TTL of `ttl_ms`); then the server is killed and
/// restarted. Returns the client, both sessions, the holder's guard and the
/// waiter.
async fn restarted_under_a_queue(
    server: &mut RedisServer,
    name: &str,
    ttl_ms: u64,
) -> (Client, Session, Session, lockline::MutexGuard, Waiter) {
    let client = Client::new(Redis::new(server.url()));
    let (a, b) = (
        client.session_with(options(ttl_ms)).await.expect("session"),
        client.session_with(options(ttl_ms)).await.expect("session"),
    );
    let held = a.mutex(name).expect("mutex").lock().await.expect("lock");
    let waiter = {
        let mutex = b.mutex(name).expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::until("the waiter queues", || client.stats().waits >= 1).await;
    server.member().kill().expect("kill redis");
    server.restart().expect("restart redis");
    (client, a, b, held, waiter)
}

/// A server restarted without persistence has forgotten every session:
/// holders hear `lost()`, waiters fail with `SessionLost`, nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_loses_every_session() {
    let mut server = RedisServer::start().expect("start redis");
    let (client, a, b, held, waiter) = restarted_under_a_queue(&mut server, "restart", 3000).await;
    bounded("the holder hears of it", held.lost()).await;
    assert!(!held.is_held());
    match bounded("the waiter fails", waiter).await.expect("task") {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("a waiter of a forgotten session must fail with SessionLost, got {other:?}"),
    }
    assert_eq!(a.state(), SessionState::Lost);
    assert_eq!(b.state(), SessionState::Lost);
    // A new session works on the restarted server.
    let fresh = client.session_with(options(3000)).await.expect("a new session");
    let again = fresh.mutex("restart").expect("mutex").lock().await.expect("lock again");
    again.release().await.expect("release");
}

/// With an append-only file the queue survives a restart within the TTL:
/// the holder keeps its lock and the waiter is granted after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_aof_the_queue_survives_a_restart() {
    let mut server = RedisServer::start_with(&RedisOptions {
        append_only: true,
        ..RedisOptions::default()
    })
    .expect("start redis");
    let (_client, a, _b, held, waiter) = restarted_under_a_queue(&mut server, "aof", 6000).await;
    // Renewals go on against the restarted server: the holder's entry, read
    // back from the append-only file, has its TTL raised again (the server
    // is another process, with no event to await: look every 20 ms).
    let mut side = support::side(&server.url()).await;
    let restored: i64 = side.pttl(held.key()).await.expect("pttl");
    assert!(restored > 0, "the entry did not survive the restart");
    bounded("a renewal on the restarted server", async {
        loop {
            let left: i64 = side.pttl(held.key()).await.expect("pttl");
            if left > restored {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(a.state(), SessionState::Live);
    assert!(held.is_held(), "the holder lost a lock the server kept");
    assert!(!waiter.is_finished(), "the waiter was granted while the lock was held");
    let token = held.token();
    held.release().await.expect("release");
    let granted = bounded("the waiter is granted", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(granted.token() > token);
    granted.release().await.expect("release");
}

/// A session opened before a restart without persistence asks for a lock
/// on the restarted server before any renewal found its key gone (TTL 30 s:
/// the first renewal is 10 s away). The server no longer knows the session,
/// so the request is refused with `SessionLost` and appends nothing: a
/// grant there would last only until that renewal, whose removal of the
/// entry would hand the lock on at the moment the holder hears `lost()`.
/// A session opened on the restarted server is granted the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_restarted_server_forgot_is_refused_its_next_lock() {
    let mut server = RedisServer::start().expect("start redis");
    let client = Client::new(Redis::new(server.url()));
    let forgotten = client.session_with(options(30_000)).await.expect("session");
    // The session's connection to the first server process is made and used.
    let warm = forgotten.mutex("warm").expect("mutex").lock().await.expect("lock");
    warm.release().await.expect("release");
    server.member().kill().expect("kill redis");
    server.restart().expect("restart redis");
    let asked = bounded("the forgotten session's lock", async {
        forgotten.mutex("after").expect("mutex").lock().await
    })
    .await;
    match asked {
        Err(Error::SessionLost { .. }) => {}
        Ok(guard) => panic!(
            "the restarted server granted a lock (token {}) to a session it does not know",
            guard.token()
        ),
        Err(other) => panic!("expected SessionLost, got {other:?}"),
    }
    assert_eq!(forgotten.state(), SessionState::Lost);
    let mut side = support::side(&server.url()).await;
    let keys: Vec<String> = side.keys("*after*").await.expect("keys");
    assert!(keys.is_empty(), "the refused request left {keys:?}");
    let fresh = client.session_with(options(3000)).await.expect("a new session");
    let granted = bounded("a new session's lock", async {
        fresh.mutex("after").expect("mutex").lock().await
    })
    .await
    .expect("lock");
    granted.release().await.expect("release");
}
