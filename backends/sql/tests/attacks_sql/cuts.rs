//! Silent cuts of a connection at each step (a heartbeat, a release, a
//! cancelled wait, ending a silent holder, a commit), and a holder that
//! hears nothing: told before the next grant, the lock usable.

use super::*;

/// The TTL of a waiter on a good connection, in ms: what these cases bound
/// counts from the cut holder's TTL, and a loaded machine can starve a
/// short-lived waiter's renewals before it even queues (its session lost,
/// it never waits).
const WAITER_TTL: u64 = 8000;

/// A session with a TTL of `ttl` ms through a proxy of its own, which can
/// cut it off from `db`: the proxy, and the session.
async fn behind_a_proxy(db: &Db, ttl: u64) -> (TcpProxy, lockline::Session) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let session = Client::new(Sql::new(db.url_via(&proxy.address())))
        .session_with(options(ttl))
        .await
        .expect("session");
    (proxy, session)
}

/// A waiter (W1) is silently cut off while it ends a silent holder's (H)
/// session, at the start of that step (the test's own transaction keeps
/// the step waiting on H's session row until the cut). The next waiter
/// (W2), on a good connection, must still be granted: W1 is no holder, and
/// both H and W1 have stopped renewing.
async fn a_cut_while_ending_a_silent_holder_leaves_the_lock_usable(db: Db) {
    attack_kit::log_warnings();
    let url = db.url();
    // Long enough for H's and W1's sessions to outlive a slow start on a
    // loaded machine (the cuts, not starved renewals, must end them).
    let ttl = 4000;
    let (to_h, h) = behind_a_proxy(&db, ttl).await;
    let to_w1 = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let w1_client = Client::new(Sql::new(db.url_via(&to_w1.address())));
    let w1 = w1_client.session_with(options(ttl)).await.expect("session");
    let w2_client = Client::new(Sql::new(url.clone()));
    let w2 = w2_client.session_with(options(WAITER_TTL)).await.expect("session");
    let held = h.mutex("reaped").expect("mutex").lock().await.expect("lock");
    let w1_wait = {
        let mutex = w1.mutex("reaped").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&w1_client, |s| s.waits >= 1).await;
    let w2_wait = {
        let mutex = w2.mutex("reaped").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&w2_client, |s| s.waits >= 1).await;
    let mut side = Side::connect(&url).await;
    let mut looker = Side::connect(&url).await;
    side.exec("BEGIN").await;
    side.exec(&format!(
        "SELECT 1 FROM lockline_sessions WHERE id = '{}' FOR UPDATE",
        h.id()
    ))
    .await;
    let reaping = if db.is_postgres() {
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT %reap%'"
    } else {
        // The reap runs statement by statement: the step that waits on the
        // session row is its first, the claim that moves the row's
        // heartbeat count below zero (after it, no renewal succeeds).
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%UPDATE `lockline`.`lockline_sessions` SET beat = LEAST%'"
    };
    to_h.blackhole();
    looker
        .until("W1 ends the silent holder's session", reaping, |n| n > 0)
        .await;
    to_w1.blackhole();
    side.exec("COMMIT").await;
    step("the silent holder hears of it", held.lost()).await;
    let cut_at = Instant::now();
    let granted = within(Duration::from_secs(15), w2_wait).await;
    w1_wait.abort();
    let granted = granted.unwrap_or_else(|| {
        panic!(
            "W2 is not granted {:?} after its predecessor was cut off while ending a silent holder's session",
            cut_at.elapsed()
        )
    });
    granted.expect("task").expect("lock").release().await.expect("release");
    to_h.heal();
    to_w1.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_cut_while_ending_a_silent_holder_leaves_the_lock_usable() {
    a_cut_while_ending_a_silent_holder_leaves_the_lock_usable(Db::postgres()).await;
}

// Was a defect (liveness, MariaDB/MySQL): `reap` was an explicit
// transaction over several round trips (SELECT ... FOR UPDATE of the silent
// owner's session row, IS_USED_LOCK, KILL, DELETE, DELETE, COMMIT); cut
// silently after the FOR UPDATE, it kept the owner's session row locked for
// as long as the server believed in the connection, and every later try to
// end the silent holder failed with a lock wait timeout. It now runs
// statement by statement and holds nothing between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_cut_while_ending_a_silent_holder_leaves_the_lock_usable() {
    a_cut_while_ending_a_silent_holder_leaves_the_lock_usable(Db::mariadb()).await;
}

/// Waits until `looker` sees a statement of lockline's, matched by `pg`
/// (a `query LIKE` pattern) or `my` (an `INFO LIKE` pattern), waiting on
/// the server.
async fn until_waiting(db: &Db, looker: &mut Side, what: &str, pg: &str, my: &str) {
    let sql = if db.is_postgres() {
        format!("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '{pg}'")
    } else {
        format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '{my}'")
    };
    looker.until(what, &sql, |n| n > 0).await;
}

/// `FOR SHARE` on PostgreSQL, `LOCK IN SHARE MODE` on MariaDB.
fn for_share(db: &Db) -> &'static str {
    if db.is_postgres() {
        "FOR SHARE"
    } else {
        "LOCK IN SHARE MODE"
    }
}

/// A holder silently cut off while its heartbeat is on the server (held
/// there by a row lock of the test's own until the cut, then applied: the
/// server renewed the session, the holder never hears it): lost() before
/// the next grant, which comes within TTL + slack.
async fn a_cut_during_a_heartbeat_is_told_before_the_next_grant(db: Db) {
    let url = db.url();
    // The holder's session outlives a slow start on a loaded machine.
    let ttl = 4000;
    let (proxy, h) = behind_a_proxy(&db, ttl).await;
    let held = h.mutex("beat").expect("mutex").lock().await.expect("lock");
    let near = Client::new(Sql::new(url.clone()));
    let w = near.session_with(options(WAITER_TTL)).await.expect("session");
    let waiter = {
        let mutex = w.mutex("beat").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    lockline::conformance::wait_for_stats(&near, |s| s.waits >= 1).await;
    let mut side = Side::connect(&url).await;
    let mut looker = Side::connect(&url).await;
    side.exec("BEGIN").await;
    side.exec(&format!(
        "SELECT 1 FROM lockline_sessions WHERE id = '{}' FOR UPDATE",
        h.id()
    ))
    .await;
    until_waiting(
        &db,
        &mut looker,
        "the heartbeat waits on the server",
        "UPDATE %lockline_sessions%",
        "UPDATE `lockline`.`lockline_sessions`%",
    )
    .await;
    let cut_at = Instant::now();
    proxy.blackhole();
    side.exec("COMMIT").await;
    step("the holder hears of it", held.lost()).await;
    let lost_at = Instant::now();
    let (granted_at, guard) = step("the waiter is granted", waiter).await.expect("task");
    guard.expect("lock").release().await.expect("release");
    assert!(
        lost_at <= granted_at,
        "granted {:?} before lost()",
        lost_at - granted_at
    );
    assert!(
        granted_at - cut_at < Duration::from_millis(ttl) + Duration::from_secs(5),
        "granted {:?} after the cut",
        granted_at - cut_at
    );
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_cut_during_a_heartbeat_is_told_before_the_next_grant() {
    a_cut_during_a_heartbeat_is_told_before_the_next_grant(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_cut_during_a_heartbeat_is_told_before_the_next_grant() {
    a_cut_during_a_heartbeat_is_told_before_the_next_grant(Db::mariadb()).await;
}

/// A holder of two locks silently cut off while the release of one is on
/// the server (held there by a row lock of the test's own, then applied):
/// its release returns (an error is fine), the released lock goes to its
/// waiter within TTL + slack, and the other lock's holder hears lost()
/// before that lock's next grant.
async fn a_cut_during_a_release_is_safe(db: Db) {
    let url = db.url();
    // The holder's session outlives a slow start on a loaded machine.
    let ttl = 4000;
    let (proxy, h) = behind_a_proxy(&db, ttl).await;
    let released = h.mutex("rel/released").expect("mutex").lock().await.expect("lock");
    let kept = h.mutex("rel/kept").expect("mutex").lock().await.expect("lock");
    let near = Client::new(Sql::new(url.clone()));
    let w = near.session_with(options(WAITER_TTL)).await.expect("session");
    let spawn_wait = |name: &'static str| {
        let mutex = w.mutex(name).expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    let on_released = spawn_wait("rel/released");
    let on_kept = spawn_wait("rel/kept");
    let kept_lost = tokio::spawn(async move {
        kept.lost().await;
        Instant::now()
    });
    lockline::conformance::wait_for_stats(&near, |s| s.waits >= 2).await;
    let mut side = Side::connect(&url).await;
    let mut looker = Side::connect(&url).await;
    side.exec("BEGIN").await;
    side.exec(&format!(
        "SELECT 1 FROM lockline_entries WHERE id = {} {}",
        released.token(),
        for_share(&db)
    ))
    .await;
    let release = tokio::spawn(async move { released.release().await });
    until_waiting(
        &db,
        &mut looker,
        "the release waits on the server",
        "CALL %release%",
        // The delete inside the remove procedure, waiting on the row.
        "%DELETE FROM `lockline`.`lockline_entries` WHERE id = %",
    )
    .await;
    let cut_at = Instant::now();
    proxy.blackhole();
    side.exec("COMMIT").await;
    let outcome = step("the cut release returns", release).await.expect("task");
    eprintln!("the cut release: {outcome:?}");
    let lost_at = step("the other lock's holder hears of it", kept_lost)
        .await
        .expect("task");
    let (granted_at, guard) = step("the released lock's waiter", on_released).await.expect("task");
    guard.expect("lock").release().await.expect("release");
    assert!(
        granted_at - cut_at < Duration::from_millis(ttl) + Duration::from_secs(5),
        "the released lock was granted {:?} after the cut",
        granted_at - cut_at
    );
    let (granted_at, guard) = step("the kept lock's waiter", on_kept).await.expect("task");
    guard.expect("lock").release().await.expect("release");
    assert!(
        lost_at <= granted_at,
        "the kept lock was granted {:?} before lost()",
        lost_at - granted_at
    );
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_cut_during_a_release_is_safe() {
    a_cut_during_a_release_is_safe(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_cut_during_a_release_is_safe() {
    a_cut_during_a_release_is_safe(Db::mariadb()).await;
}

/// A waiter silently cut off and then cancelled (its `lock()` dropped, so
/// its cancel of the server-side wait cannot get through): it is never
/// granted, and the waiter behind it gets the lock within its TTL + slack
/// of the holder's release.
async fn a_cut_during_a_cancelled_wait_leaves_the_lock_usable(db: Db) {
    let url = db.url();
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    // The sessions outlive a slow start on a loaded machine.
    let ttl = 4000;
    let near = Client::new(Sql::new(url.clone()));
    let h = near.session_with(options(ttl)).await.expect("session");
    let held = h.mutex("cancelled").expect("mutex").lock().await.expect("lock");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    let w1 = far.session_with(options(ttl)).await.expect("session");
    let cut_wait = {
        let mutex = w1.mutex("cancelled").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&far, |s| s.waits >= 1).await;
    let w2_client = Client::new(Sql::new(url.clone()));
    let w2 = w2_client.session_with(options(ttl)).await.expect("session");
    let behind = {
        let mutex = w2.mutex("cancelled").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&w2_client, |s| s.waits >= 1).await;
    proxy.blackhole();
    cut_wait.abort();
    assert!(cut_wait.await.is_err_and(|e| e.is_cancelled()));
    held.release().await.expect("release");
    let released_at = Instant::now();
    let granted = step("the waiter behind is granted", behind)
        .await
        .expect("task")
        .expect("lock");
    assert!(
        released_at.elapsed() < Duration::from_millis(ttl) + Duration::from_secs(5),
        "granted {:?} after the release",
        released_at.elapsed()
    );
    assert_eq!(far.stats().grants, 0, "the cancelled waiter was granted");
    granted.release().await.expect("release");
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_cut_during_a_cancelled_wait_leaves_the_lock_usable() {
    a_cut_during_a_cancelled_wait_leaves_the_lock_usable(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_cut_during_a_cancelled_wait_leaves_the_lock_usable() {
    a_cut_during_a_cancelled_wait_leaves_the_lock_usable(Db::mariadb()).await;
}

/// A holder silently cut off (its lockline connection) while its
/// application's connection stays healthy, with a fenced transaction open:
/// once the next holder is granted, the old holder's commit is refused and
/// nothing it wrote lands.
async fn a_cut_holder_cannot_commit_after_the_next_grant(db: Db) {
    let url = db.url();
    let mut side = Side::connect(&url).await;
    side.exec("CREATE TABLE attack_writes (token bigint NOT NULL)").await;
    // Long enough for the holder's session to outlive a slow start on a
    // loaded machine (the cut, not a starved renewal, must end it).
    let ttl = 4000;
    let (proxy, h) = behind_a_proxy(&db, ttl).await;
    let held = h.mutex("fenced-cut").expect("mutex").lock().await.expect("lock");
    let token = i64::try_from(held.token().get()).expect("token");
    let near = Client::new(Sql::new(url.clone()));
    let w = near.session_with(options(WAITER_TTL)).await.expect("session");
    let waiter = {
        let mutex = w.mutex("fenced-cut").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&near, |s| s.waits >= 1).await;
    let committed = if db.is_postgres() {
        let pool = sqlx::PgPool::connect(&url).await.expect("pool");
        let mut tx = lockline_sql::FencedTransaction::begin_postgres(&held, &pool)
            .await
            .expect("begin");
        sqlx::query("INSERT INTO attack_writes (token) VALUES ($1)")
            .bind(token)
            .execute(&mut *tx)
            .await
            .expect("insert");
        proxy.blackhole();
        let next = step("the next holder", waiter).await.expect("task").expect("lock");
        let committed = step("the stale commit", tx.commit()).await;
        next.release().await.expect("release");
        committed
    } else {
        let pool = sqlx::MySqlPool::connect(&url).await.expect("pool");
        let mut tx = lockline_sql::FencedTransaction::begin_mysql(&held, &pool)
            .await
            .expect("begin");
        sqlx::query("INSERT INTO attack_writes (token) VALUES (?)")
            .bind(token)
            .execute(&mut *tx)
            .await
            .expect("insert");
        proxy.blackhole();
        let next = step("the next holder", waiter).await.expect("task").expect("lock");
        let committed = step("the stale commit", tx.commit()).await;
        next.release().await.expect("release");
        committed
    };
    assert!(
        committed.is_err(),
        "a cut holder committed its fenced transaction after the next grant"
    );
    assert_eq!(
        side.int("SELECT count(*) FROM attack_writes").await,
        0,
        "the stale write landed"
    );
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_cut_holder_cannot_commit_after_the_next_grant() {
    a_cut_holder_cannot_commit_after_the_next_grant(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_cut_holder_cannot_commit_after_the_next_grant() {
    a_cut_holder_cannot_commit_after_the_next_grant(Db::mariadb()).await;
}

/// A one-way partition: the holder's requests reach the server (its
/// heartbeats keep renewing its session there) but no answer comes back.
/// The holder must still hear lost() before anyone else is granted.
async fn a_holder_that_hears_nothing_is_told_before_the_next_grant(db: Db) {
    let url = db.url();
    // Long enough that a loaded machine does not end the holder's session
    // before the cut (the case measures an order, not a time).
    let ttl = 4000;
    let (proxy, h) = behind_a_proxy(&db, ttl).await;
    let held = h.mutex("one-way").expect("mutex").lock().await.expect("lock");
    let near = Client::new(Sql::new(url.clone()));
    let w = near.session_with(options(WAITER_TTL)).await.expect("session");
    let waiter = {
        let mutex = w.mutex("one-way").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    lockline::conformance::wait_for_stats(&near, |s| s.waits >= 1).await;
    proxy.set_responses_dropped(true);
    let lost = tokio::spawn(async move {
        held.lost().await;
        Instant::now()
    });
    let (granted_at, guard) = step("the waiter is granted", waiter).await.expect("task");
    let lost_at = step("the holder hears of it", lost).await.expect("task");
    assert!(
        lost_at <= granted_at,
        "granted {:?} before lost()",
        lost_at - granted_at
    );
    guard.expect("lock").release().await.expect("release");
    proxy.set_responses_dropped(false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_holder_that_hears_nothing_is_told_before_the_next_grant() {
    a_holder_that_hears_nothing_is_told_before_the_next_grant(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_holder_that_hears_nothing_is_told_before_the_next_grant() {
    a_holder_that_hears_nothing_is_told_before_the_next_grant(Db::mariadb()).await;
}
