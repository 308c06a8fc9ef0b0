//! Futures dropped at every step: locks, acquires, a session's first
//! acquire.

use super::*;

/// `lock()` futures dropped at staggered moments: while the append is on
/// its way, while waiting, and around the holder's release (being woken,
/// being granted). Afterwards: no row, no server-side wait, no named lock
/// (but MariaDB's per-session lock), and the lock is free for anyone.
async fn locks_dropped_at_every_step_leave_nothing(db: Db) {
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()));
    let h = client.session_with(options(10_000)).await.expect("session");
    let waiters = Client::new(Sql::new(url.clone()).with_wait_connections(2));
    let w = waiters.session_with(options(10_000)).await.expect("session");
    // One acquire run through first: a drop during a statement's first use
    // on MariaDB breaks the session (a_dropped_first_acquire_keeps_the_session).
    w.mutex("dropped")
        .expect("mutex")
        .lock()
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    // Dropped while the append is on its way (or just after).
    for i in 0..40u64 {
        let task = {
            let mutex = w.mutex("dropped").expect("mutex");
            tokio::spawn(async move { mutex.lock().await })
        };
        tokio::time::sleep(Duration::from_micros(i * 100)).await;
        task.abort();
        if let Ok(Ok(guard)) = task.await {
            drop(guard);
        }
    }
    // Dropped while waiting, and around the release it waits for.
    for i in 0..40u64 {
        let held = h.mutex("dropped").expect("mutex").lock().await.expect("lock");
        let before = waiters.stats().waits;
        let task = {
            let mutex = w.mutex("dropped").expect("mutex");
            tokio::spawn(async move { mutex.lock().await })
        };
        let waited = within(Duration::from_secs(5), waiters.wait_for_stats(|s| s.waits > before)).await;
        let release = tokio::spawn(async move { held.release().await });
        tokio::time::sleep(Duration::from_micros((i % 20) * 150)).await;
        task.abort();
        if let Ok(Ok(guard)) = task.await {
            drop(guard);
        }
        step("the release", release).await.expect("task").expect("release");
        assert!(
            waited.is_some(),
            "round {i}: the waiter never waited ({:?}, {:?}, rows {})",
            waiters.stats(),
            w.state(),
            db.entries()
        );
    }
    step("the waiter's session's cleanup", w.flush()).await;
    step("the holder's session's cleanup", h.flush()).await;
    let mut side = Side::connect(&url).await;
    side.until("no row is left", "SELECT count(*) FROM lockline_entries", |n| n == 0)
        .await;
    let per_session = if db.is_postgres() { 0 } else { 1 };
    let locks = db.locks();
    assert_eq!(
        (locks.held, locks.waiting),
        (2 * per_session, 0),
        "named locks held and waited for after every dropped lock() was cleaned up"
    );
    let other = client.session_with(options(10_000)).await.expect("session");
    let free = other
        .mutex("dropped")
        .expect("mutex")
        .try_lock()
        .await
        .expect("try_lock");
    assert!(free.is_some(), "a dropped lock() left a grant behind");
    assert_eq!(w.state(), SessionState::Live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_locks_dropped_at_every_step_leave_nothing() {
    locks_dropped_at_every_step_leave_nothing(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_locks_dropped_at_every_step_leave_nothing() {
    locks_dropped_at_every_step_leave_nothing(Db::mariadb()).await;
}

/// One task of a session holds a lock that another session waits for;
/// another task of the same session gives up acquiring a second lock at
/// staggered moments (a dropped `lock()`, as `tokio::select!`, a timeout
/// or an aborted task does). Whatever that costs the session, the held
/// lock must never be granted to the waiter before its holder hears lost().
async fn a_dropped_acquire_never_grants_the_session_s_locks_unannounced(db: Db) {
    attack_kit::log_warnings();
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()));
    let s = client.session_with(options(10_000)).await.expect("session");
    let held = Arc::new(s.mutex("held-by-s").expect("mutex").lock().await.expect("lock"));
    let other = Client::new(Sql::new(url.clone()));
    let o = other.session_with(options(10_000)).await.expect("session");
    let waiter = {
        let mutex = o.mutex("held-by-s").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    lockline::conformance::wait_for_stats(&other, |s| s.waits >= 1).await;
    let lost = {
        let held = Arc::clone(&held);
        tokio::spawn(async move {
            held.lost().await;
            Instant::now()
        })
    };
    for i in 0..60u64 {
        if waiter.is_finished() || s.state() != SessionState::Live {
            break;
        }
        let task = {
            let mutex = s.mutex("given-up").expect("mutex");
            tokio::spawn(async move { mutex.lock().await })
        };
        tokio::time::sleep(Duration::from_micros((i % 30) * 100)).await;
        task.abort();
        if let Ok(Ok(guard)) = task.await {
            guard.release().await.expect("release");
        }
    }
    match within(Duration::from_secs(8), waiter).await {
        None => {
            // The session kept its connection: the lock stayed held.
            assert!(held.is_held());
        }
        Some(granted) => {
            let (granted_at, guard) = granted.expect("task");
            let lost_at = step("the holder hears of it", lost).await.expect("task");
            assert!(
                lost_at <= granted_at,
                "the waiter was granted {:?} before the holder heard lost(): the session's connection broke \
                 when another of its acquires was dropped",
                lost_at - granted_at
            );
            guard.expect("lock").release().await.expect("release");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_dropped_acquire_never_grants_the_session_s_locks_unannounced() {
    a_dropped_acquire_never_grants_the_session_s_locks_unannounced(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_dropped_acquire_never_grants_the_session_s_locks_unannounced() {
    a_dropped_acquire_never_grants_the_session_s_locks_unannounced(Db::mariadb()).await;
}

/// The first acquire of a fresh session, given up at a staggered moment
/// (a dropped `lock()`: a `lock_timeout` running out, a `select!`, an
/// aborted task): the session must stay live and able to lock at once.
async fn a_dropped_first_acquire_keeps_the_session(db: Db) {
    let client = Client::new(Sql::new(db.url()));
    let mut broken = Vec::new();
    for i in 0..30u64 {
        let w = client.session_with(options(10_000)).await.expect("session");
        let task = {
            let mutex = w.mutex("first").expect("mutex");
            tokio::spawn(async move { mutex.lock().await })
        };
        tokio::time::sleep(Duration::from_micros(i * 20)).await;
        task.abort();
        let _ = task.await;
        let again = async { w.mutex("first")?.lock().await };
        match within(Duration::from_secs(3), again).await {
            Some(Ok(guard)) => guard.release().await.expect("release"),
            Some(Err(error)) => broken.push(format!("{} us: {error}", i * 20)),
            None => broken.push(format!("{} us: no grant within 3 s ({:?})", i * 20, w.state())),
        }
        let _ = w.close().await;
    }
    assert!(
        broken.is_empty(),
        "{} of 30 sessions broken by a dropped first acquire: {broken:#?}",
        broken.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_dropped_first_acquire_keeps_the_session() {
    a_dropped_first_acquire_keeps_the_session(Db::postgres()).await;
}

// Was a defect, now fixed (cancel safety, availability; MariaDB/MySQL): dropping a session's
// acquire while one of its statements runs for the first time on the owning
// connection (sqlx prepares each statement on first use) leaves the
// connection out of step with the server: 11 to 20 of 60 fresh sessions
// here (drops 0 to 1.2 ms in) either hang every later statement (the server shows the connection idle
// while the client waits for an answer; heartbeats time out until the loss
// deadline) or lose the connection at once; either way every lock the
// session holds is lost. The acquire runs its statements inline in the
// caller's future (session.rs `append` through `on_owner!`), so a
// `lock_timeout`, `select!` or aborted task cancels them mid-protocol;
// sqlx-mysql 0.9 recovers from a dropped execute but not from a dropped
// prepare. (PostgreSQL: no session broken.) Running each statement to
// completion in a task of its own, as the waits already do, would avoid it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_dropped_first_acquire_keeps_the_session() {
    a_dropped_first_acquire_keeps_the_session(Db::mariadb()).await;
}
