//! Attacks on retried releases against a real Redis server: a release
//! retried after a cut-off first try answers `LockLost` when its entry went
//! by anything but its own removal, and only then.

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, Error, SessionOptions, SessionState};
use lockline_redis::Redis;
use lockline_testkit::{RedisServer, TcpProxy};

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(3))
}

/// Waits until the proxy holds more request bytes than `before`.
async fn sent_into(proxy: &TcpProxy, before: usize) {
    bounded("the release sent into the proxy", async {
        while proxy.held_request_bytes() == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Two permits of one session released at once, both first tries kept back
/// by the proxy; another client deletes one permit's entry meanwhile, then
/// the connection is cut and both retries go out. The deleted permit is a
/// lost lock, the other a release: what the session remembers of one
/// removal's answer does not leak into the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sibling_permits_retried_together_are_told_apart() {
    let server = RedisServer::start().expect("start redis");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", server.port())).expect("proxy");
    let session = Client::new(Redis::new(format!("redis://{}", proxy.address())))
        .session_with(options())
        .await
        .expect("session");
    let semaphore = session.semaphore("permits", 3).expect("semaphore");
    // One release first, so the removal script is loaded and each first try
    // below is a single request.
    semaphore
        .acquire()
        .await
        .expect("permit")
        .release()
        .await
        .expect("release");
    let deleted = semaphore.acquire().await.expect("permit");
    let kept = semaphore.acquire().await.expect("permit");
    let (deleted_key, kept_key) = (deleted.key().to_owned(), kept.key().to_owned());
    let exists = |key: &str| server.cli(&["EXISTS", key]).expect("EXISTS").trim() == "1";

    proxy.set_requests_held(true);
    let kept_release = tokio::spawn(kept.release());
    sent_into(&proxy, 0).await;
    let before = proxy.held_request_bytes();
    let deleted_release = tokio::spawn(deleted.release());
    sent_into(&proxy, before).await;
    server.cli(&["DEL", &deleted_key]).expect("DEL");
    proxy.orphan_connections();
    proxy.set_requests_held(false);

    let released = bounded("release", deleted_release).await.expect("task");
    assert!(
        matches!(released, Err(Error::LockLost { .. })),
        "a permit another client deleted must not be reported as released: {released:?}"
    );
    let kept_released = bounded("the other release", kept_release).await.expect("task");
    kept_released.expect("the permit nobody else touched is released");
    assert!(!exists(&kept_key) && !exists(&deleted_key));
    assert_eq!(session.state(), SessionState::Live);
}

/// An entry that expired during the fault (another client shortened its TTL)
/// rather than one deleted: its queue member is still there, so the retried
/// release answers `LockLost` as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_expired_during_the_fault_is_a_lost_lock() {
    let server = RedisServer::start().expect("start redis");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", server.port())).expect("proxy");
    let session = Client::new(Redis::new(format!("redis://{}", proxy.address())))
        .session_with(options())
        .await
        .expect("session");
    let mutex = session.mutex("expired").expect("mutex");
    mutex.lock().await.expect("lock").release().await.expect("release");
    let guard = mutex.lock().await.expect("lock again");
    let key = guard.key().to_owned();

    proxy.set_requests_held(true);
    let release = tokio::spawn(guard.release());
    sent_into(&proxy, 0).await;
    server.cli(&["PEXPIRE", &key, "1"]).expect("PEXPIRE");
    bounded("the entry expired", async {
        while server.cli(&["EXISTS", &key]).expect("EXISTS").trim() == "1" {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    proxy.orphan_connections();
    proxy.set_requests_held(false);
    let released = bounded("release", release).await.expect("task");
    assert!(
        matches!(released, Err(Error::LockLost { .. })),
        "an entry that expired under its holder must not be reported as released: {released:?}"
    );
    assert_eq!(session.state(), SessionState::Live);
}
