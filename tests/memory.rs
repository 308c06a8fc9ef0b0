//! Behaviour specific to the in-process backend.

use std::time::Duration;

use lockline::backend::{AppendRequest, Conflicts};
use lockline::{Client, EntryKind, MemoryBackend, SessionOptions, SessionState};

/// A session whose every handle is gone without `close()` (a crashed process)
/// expires one TTL later, and its entries go with it.
#[tokio::test(start_paused = true)]
async fn an_abandoned_session_expires_after_its_ttl() {
    let store = MemoryBackend::new();
    let ttl = Duration::from_secs(3);
    let crashed = Client::new(store.clone())
        .session_with(SessionOptions::new().with_ttl(ttl))
        .await
        .expect("session");
    let request = AppendRequest {
        dir: "crash",
        kind: EntryKind::Mutex,
        attempt: "a1",
        value: b"",
        conflicts: Conflicts::All,
        nearest: 1,
    };
    crashed.backend_session().append(&request).await.expect("append");
    assert_eq!(store.keys("crash").len(), 1);
    drop(crashed);

    let survivor = Client::new(store.clone()).session().await.expect("session");
    let started = tokio::time::Instant::now();
    let guard = survivor.mutex("crash").expect("mutex").lock().await.expect("lock");
    assert!(
        started.elapsed() >= ttl,
        "granted after {:?}, before the TTL",
        started.elapsed()
    );
    assert_eq!(store.keys("crash"), vec![guard.key().to_owned()]);
}

#[tokio::test]
async fn expire_ends_a_session_and_its_entries() {
    let store = MemoryBackend::new();
    let session = Client::new(store.clone()).session().await.expect("session");
    let _guard = session.mutex("x").expect("mutex").lock().await.expect("lock");
    assert!(store.expire(session.id()));
    assert_eq!(session.state(), SessionState::Lost);
    assert!(store.keys("x").is_empty());
    assert!(!store.expire(session.id()), "a session expires once");
}

#[tokio::test]
async fn separate_stores_do_not_contend() {
    let a = Client::memory().session().await.expect("session");
    let b = Client::memory().session().await.expect("session");
    let _held = a.mutex("same").expect("mutex").lock().await.expect("lock");
    assert!(b.mutex("same").expect("mutex").try_lock().await.expect("try").is_some());
}
