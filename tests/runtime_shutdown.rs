//! A session and its locks live on the tokio runtime they were opened on:
//! their keepalive and the watches that report a loss are tasks of it. When
//! that runtime shuts down while a guard is still in use elsewhere, nothing
//! keeps the session alive any more, and the server will end it; the guard
//! must say its lock may be lost, never keep answering "held".

use std::time::Duration;

use lockline::{Client, SessionState};

#[test]
fn a_lock_whose_runtime_shut_down_is_reported_lost() {
    let opened_on = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (session, guard) = opened_on.block_on(async {
        let session = Client::memory().session().await.expect("session");
        let guard = session.mutex("shutdown").expect("mutex").lock().await.expect("lock");
        assert!(guard.is_held());
        (session, guard)
    });
    opened_on.shutdown_timeout(Duration::from_secs(5));

    let elsewhere = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    elsewhere.block_on(async {
        assert!(!guard.is_held(), "a lock nothing watches any more is not held");
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("lost() resolves once the runtime that watched the lock is gone");
        assert_eq!(session.state(), SessionState::Lost);
        let state = tokio::time::timeout(Duration::from_secs(5), session.lost())
            .await
            .expect("Session::lost() resolves too");
        assert_eq!(state, SessionState::Lost);
    });
}

#[test]
fn a_lock_whose_monitor_runtime_shut_down_is_reported_lost() {
    // The session lives on one runtime, the lock was taken on another one
    // that then shut down: the session is fine, but nothing watches this
    // lock's entry any more.
    let session_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let session = session_runtime.block_on(async { Client::memory().session().await.expect("session") });
    let lock_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let guard = lock_runtime.block_on(async { session.mutex("monitor").expect("mutex").lock().await.expect("lock") });
    lock_runtime.shutdown_timeout(Duration::from_secs(5));
    session_runtime.block_on(async {
        assert_eq!(session.state(), SessionState::Live, "the session itself still runs");
        assert!(!guard.is_held());
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("lost() resolves once nothing watches the lock");
        // The entry is still there: releasing it still works.
        guard.release().await.expect("release");
    });
}
