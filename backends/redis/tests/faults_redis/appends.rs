//! Acquires cancelled every way leave no key, and an append sent again
//! finds its own entry.

use super::*;

/// Dropped `lock()` futures, a `lock_timeout` that fires and `try_lock`
/// leave nothing behind (checked with SCAN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_no_key() {
    let server = RedisServer::start().expect("start redis");
    let client = Client::new(Redis::new(server.url()));
    let session = client.session_with(options(6000)).await.expect("session");
    let other = client.session_with(options(6000)).await.expect("session");
    let mutex = session.mutex("cancel").expect("mutex");
    let held = other.mutex("cancel").expect("mutex").lock().await.expect("lock");
    for _ in 0..20 {
        let attempt = mutex.lock();
        let _ = tokio::time::timeout(Duration::from_millis(3), attempt).await;
    }
    assert!(matches!(
        mutex.lock_timeout(Duration::from_millis(50)).await,
        Err(Error::Timeout { .. })
    ));
    assert!(mutex.try_lock().await.expect("try_lock").is_none());
    bounded("cleanup", session.flush()).await;
    let mut side = support::side(&server.url()).await;
    let entries = support::scan(&mut side, "{cancel}:e:*").await;
    assert_eq!(entries, vec![held.key().to_owned()], "only the holder's entry is left");
    let queue: Vec<String> = side.zrange("{cancel}:q", 0, -1).await.expect("zrange");
    assert_eq!(queue.len(), 1, "only the holder is queued: {queue:?}");
    held.release().await.expect("release");
    session.close().await.expect("close");
    other.close().await.expect("close");
    // The counter and its epoch stay; so, for a TTL, does the tombstone of
    // each acquire abandoned with its append in flight (so that a late
    // append creates nothing): every one of them expires.
    for key in support::scan(&mut side, "*").await {
        if key == "{cancel}:seq" || key == "{cancel}:run" {
            continue;
        }
        assert!(
            key.starts_with("{cancel}:x:"),
            "{key} is left after both sessions closed"
        );
        let left: i64 = side.pttl(&key).await.expect("pttl");
        assert!(left > 0, "the tombstone {key} does not expire ({left})");
    }
}

/// An append sent again with the same attempt id (its first answer lost)
/// finds the entry the first one made: one attempt, one place in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_append_finds_its_own_entry() {
    use lockline::backend::{AppendRequest, Conflicts, EntryKind};
    let server = RedisServer::start().expect("start redis");
    let session = Client::new(Redis::new(server.url()))
        .session_with(options(6000))
        .await
        .expect("session");
    let request = AppendRequest {
        dir: "retried",
        kind: EntryKind::Mutex,
        attempt: "attempt-1",
        value: b"",
        conflicts: Conflicts::All,
        nearest: 1,
    };
    let first = session.backend_session().append(&request).await.expect("append");
    let again = session.backend_session().append(&request).await.expect("append again");
    assert_eq!(first.entry, again.entry);
    let queue = session.queue("retried").await.expect("queue");
    assert_eq!(queue.len(), 1, "{queue:?}");
    session
        .backend_session()
        .abandon("retried", EntryKind::Mutex, "attempt-1")
        .await
        .expect("abandon");
    assert!(session.queue("retried").await.expect("queue").is_empty());
}
