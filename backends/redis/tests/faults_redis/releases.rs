//! A release tried again after its first try was cut off: its answer
//! lost, or its entry deleted by another client (cut off or silently).

use super::*;

/// What becomes of a release's first try in [`retried_release`].
#[derive(Clone, Copy, PartialEq)]
enum FirstTry {
    /// It reaches the server, which applies it; its answer is lost.
    AnswerLost,
    /// It is kept back and never arrives; another client deletes the entry
    /// meanwhile.
    KeptBackWhileDeleted,
}

/// Holds a lock through a proxy, releases it with its first try's fate set
/// by `first_try`, then cuts that try's connection and lets the retry
/// through; returns what the release answered and the session.
async fn retried_release(name: &str, first_try: FirstTry) -> (lockline::Result<()>, lockline::Session) {
    let (server, proxy, session) =
        session_behind_a_proxy(options(30_000).with_request_timeout(Duration::from_secs(3))).await;
    let mutex = session.mutex(name).expect("mutex");
    // One release first, so the server has the removal script loaded and the
    // first try below is a single request.
    mutex.lock().await.expect("lock").release().await.expect("release");
    let guard = mutex.lock().await.expect("lock again");
    let key = guard.key().to_owned();
    let exists = || -> bool { server.cli(&["EXISTS", &key]).expect("EXISTS").trim() == "1" };
    match first_try {
        FirstTry::AnswerLost => proxy.set_responses_dropped(true),
        FirstTry::KeptBackWhileDeleted => proxy.set_requests_held(true),
    }
    let release = tokio::spawn(guard.release());
    bounded("the first try sent", async {
        while match first_try {
            FirstTry::AnswerLost => exists(),
            FirstTry::KeptBackWhileDeleted => proxy.held_request_bytes() == 0,
        } {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    match first_try {
        FirstTry::AnswerLost => {
            proxy.block();
            proxy.set_responses_dropped(false);
            proxy.unblock();
        }
        FirstTry::KeptBackWhileDeleted => {
            server.cli(&["DEL", &key]).expect("DEL");
            proxy.orphan_connections();
            proxy.set_requests_held(false);
        }
    }
    let released = bounded("release", release).await.expect("task");
    assert!(!exists(), "the entry is gone");
    (released, session)
}

/// A release whose removal the server applied but whose answer was lost is
/// tried again; the retry finds the entry gone, with nothing saying anyone
/// but its owner removed it, and the release is reported as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_answer_was_lost_is_a_release() {
    let (released, _session) = retried_release("answer-lost", FirstTry::AnswerLost).await;
    released.expect("a release whose first try removed the entry is a release");
}

/// A release cut off in transit while another client deleted its entry: the
/// retry finds the entry gone but its queue member still there (a release
/// removes both in one script), so the release answers `LockLost` instead of
/// reporting a release (it did before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_release_whose_entry_another_client_deleted_is_a_lost_lock() {
    let (released, session) = retried_release("deleted-meanwhile", FirstTry::KeptBackWhileDeleted).await;
    assert!(
        matches!(released, Err(Error::LockLost { .. })),
        "an entry another client deleted must not be reported as released: {released:?}"
    );
    assert_eq!(session.state(), SessionState::Live);
}

/// The same foreign delete under a silent partition (a proxy that drops
/// every byte and resets nothing): the release's request goes unanswered,
/// and the release must not be reported as done; it fails as `Unavailable`
/// (or `LockLost`), never `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_cut_off_release_whose_entry_another_client_deleted_is_not_a_release() {
    let (server, proxy, session) =
        session_behind_a_proxy(options(30_000).with_request_timeout(Duration::from_secs(2))).await;
    let guard = session
        .mutex("silent-delete")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let key = guard.key().to_owned();
    proxy.blackhole();
    let release = tokio::spawn(guard.release());
    server.cli(&["DEL", &key]).expect("DEL");
    let released = bounded("release", release).await.expect("task");
    proxy.heal();
    assert!(
        matches!(released, Err(Error::Unavailable { .. } | Error::LockLost { .. })),
        "a release the server never confirmed, of an entry another client deleted, must not be Ok: {released:?}"
    );
}
