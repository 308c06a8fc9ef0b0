//! Appends that never finished: a thousand cancelled waiters leave
//! nothing on the server, and an append tried again finds the entry its
//! first try made.

use super::*;

on_both!(
    a_thousand_cancelled_waiters_leave_nothing_on_the_server,
    a_retried_append_finds_the_entry_its_first_try_made,
);

/// 1,000 waiters queued behind a holder, from 4 sessions with 4 wait
/// connections each, all cancelled: no row, no wait and no named lock but
/// the holder's guard is left on the server. (Write locks: a mutex's
/// contenders of one session queue in the process first, one entry each.)
async fn a_thousand_cancelled_waiters_leave_nothing_on_the_server(db: Db) {
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()).with_wait_connections(4));
    let holder = client.session_with(options(10_000)).await.expect("session");
    let held = holder.rwlock("crowd").expect("rwlock").write().await.expect("lock");
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(client.session_with(options(10_000)).await.expect("session"));
    }
    let mut waiters = Vec::new();
    for i in 0..1000 {
        let lock = sessions[i % 4].rwlock("crowd").expect("rwlock");
        waiters.push(tokio::spawn(async move { lock.write().await }));
    }
    until("every waiter has queued", || db.entries() == 1001).await;
    // Each session blocks on the server with its 4 wait connections.
    until("the sessions wait on the server", || db.locks().waiting == 16).await;
    for waiter in &waiters {
        waiter.abort();
    }
    // None can end on its own: the holder holds, and a waiter's errors
    // while it queues (a request timed out) are retried.
    for (i, waiter) in waiters.into_iter().enumerate() {
        match waiter.await {
            Err(e) if e.is_cancelled() => {}
            Ok(Ok(guard)) => panic!(
                "waiter {i} was granted (token {}) while {} held",
                guard.token(),
                held.token()
            ),
            Ok(Err(error)) => panic!("waiter {i} failed before it was aborted: {error}"),
            Err(e) => panic!("waiter {i} panicked: {e}"),
        }
    }
    until("the cancelled waiters' rows are gone", || db.entries() == 1).await;
    // On MariaDB each session's connection also holds a lock of its own.
    let per_session = if db.is_postgres() { 0 } else { 5 };
    until("no wait is left on the server", || {
        let locks = db.locks();
        locks.waiting == 0 && locks.held == 1 + per_session
    })
    .await;
    held.release().await.expect("release");
    until("no row is left", || db.entries() == 0).await;
    until("no lock is left but the sessions' own", || {
        let locks = db.locks();
        locks.waiting == 0 && locks.held == per_session
    })
    .await;
    assert!(sessions.iter().all(|s| s.state() == SessionState::Live));
}

/// An append whose answer never came (the request timed out after the
/// server committed it) is sent again with the same attempt id, as the core
/// does: the retry finds the entry the first try made, with its token and
/// its place behind the holder. Never a second entry, and never an entry
/// that seems first in line (a false grant).
async fn a_retried_append_finds_the_entry_its_first_try_made(db: Db) {
    let client = Client::new(Sql::new(db.url()));
    let holder = client.session_with(options(10_000)).await.expect("session");
    let held = holder.mutex("retried").expect("mutex").lock().await.expect("lock");
    let waiting = client.session_with(options(10_000)).await.expect("session");
    let request = AppendRequest {
        dir: "retried",
        kind: EntryKind::Mutex,
        attempt: "a-retried-attempt",
        value: b"",
        conflicts: Conflicts::All,
        nearest: 1,
    };
    let first = bounded("append", waiting.backend_session().append(&request))
        .await
        .expect("append");
    let again = bounded("append again", waiting.backend_session().append(&request))
        .await
        .expect("append again");
    assert_eq!(
        again.entry.key, first.entry.key,
        "the retry made or named another entry"
    );
    assert_eq!(again.entry.token, first.entry.token);
    assert!(
        again.entry.token > held.token(),
        "{:?} is not behind the holder",
        again.entry
    );
    for appended in [&first, &again] {
        let nearest: Vec<&str> = appended.nearest.iter().flatten().map(|e| e.key.as_str()).collect();
        assert_eq!(
            nearest,
            vec![held.key()],
            "the holder is not ahead of {:?}",
            appended.entry
        );
    }
    assert_eq!(db.entries(), 2, "one entry for the holder, one for the attempt");
    assert!(waiting.backend_session().remove(&first.entry).await.expect("remove"));
    held.release().await.expect("release");
    until("no row is left", || db.entries() == 0).await;
}
