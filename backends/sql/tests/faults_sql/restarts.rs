//! A database restart: every session ends and tokens keep growing, and the
//! restart grace holds the next grant back until an old holder on a silent
//! path has heard `lost()` (a clock step, MariaDB's start, a second
//! restart in a grace).

use super::*;

on_both!(
    a_restart_ends_every_session_and_tokens_keep_growing,
    a_restart_grants_nothing_before_an_old_holder_hears_lost,
    without_the_restart_grace_a_restart_grants_at_once,
    a_step_of_the_database_clock_does_not_shorten_the_restart_grace,
    a_second_restart_in_a_grace_keeps_the_longer_grace,
);

/// A database crash and restart: every connection is gone with its guards.
/// Holders hear `lost()`, waiters fail with `SessionLost`, nothing hangs; no
/// row left from before blocks anyone; and the tokens handed out after the
/// restart are above every token handed out before (the id counter of an
/// unlogged table restarts after a crash: the backend moves it past the
/// server's clock at the first session after each start).
async fn a_restart_ends_every_session_and_tokens_keep_growing(mut db: Db) {
    let client = Client::new(Sql::new(db.url()));
    // 6 s sessions: a loaded run lost a 3 s one to starved renewals in the
    // 40 rounds before the crash (the restart grace is that TTL, so the
    // lock after the restart waits up to 6 s).
    let (a, b) = (
        client.session_with(options(6000)).await.expect("session"),
        client.session_with(options(6000)).await.expect("session"),
    );
    let mut highest = 0;
    for round in 0..40 {
        let guard = a
            .mutex(&format!("before/{round}"))
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        highest = highest.max(guard.token().get());
        guard.release().await.expect("release");
    }
    let held = a.mutex("restart").expect("mutex").lock().await.expect("lock");
    highest = highest.max(held.token().get());
    let waiter = {
        let mutex = b.mutex("restart").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    let crashed = tokio::task::spawn_blocking(move || {
        db.crash_and_restart();
        db
    });
    bounded("the holder hears of it", held.lost()).await;
    match bounded("the waiter fails", waiter).await.expect("task") {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("a waiter whose connection died must fail with SessionLost, got {other:?}"),
    }
    let db = crashed.await.expect("restart");
    assert_eq!(a.state(), SessionState::Lost);
    assert_eq!(b.state(), SessionState::Lost);
    let fresh = bounded("a new session", client.session_with(options(3000)))
        .await
        .expect("a new session");
    let again = bounded("the lock again", fresh.mutex("restart").expect("mutex").lock())
        .await
        .expect("lock again");
    assert!(
        again.token().get() > highest,
        "token {} after the restart is not above {highest} from before",
        again.token()
    );
    again.release().await.expect("release");
    fresh.close().await.expect("close");
    until("no row is left", || db.entries() == 0).await;
}

/// A database restart while a holder's path to it is silent (it hears of
/// nothing until its loss deadline): a session opened after the restart
/// grants nothing until the longest TTL of the sessions before it has
/// passed since the start, so the old holder hears `lost()` first.
async fn a_restart_grants_nothing_before_an_old_holder_hears_lost(db: Db) {
    let (lost_at, granted_at, _, held_back) = restart_beside_a_silent_holder(db, Sql::new).await;
    assert!(
        held_back.is_some(),
        "with the grace the session opened after the restart holds nothing back"
    );
    assert!(
        lost_at <= granted_at,
        "the next holder was granted {:?} before the old holder was told",
        lost_at - granted_at
    );
}

/// The same with `Sql::without_restart_grace`: the grant comes at once
/// after the restart, the documented window. With the grace the session
/// opened once the server was back holds its grants back until the old
/// holder's TTL (3 s) has passed; without it, it holds nothing back (the
/// session says so itself: not a timing, which a loaded machine stretches).
async fn without_the_restart_grace_a_restart_grants_at_once(db: Db) {
    let (_, _, _, held_back) = restart_beside_a_silent_holder(db, |url| Sql::new(url).without_restart_grace()).await;
    assert_eq!(
        held_back, None,
        "without the grace a session opened after the restart holds its grants back"
    );
}

/// A forward step of the database's clock in a restart grace (here the
/// grace's start moved a minute back, which is how a step of +60 s reads)
/// shortens nothing: a session opened in the grace waits all of it by its
/// own clock, so the old holder hears `lost()` before the next grant. And a
/// session that waited the grace out ends it: one opened after is granted
/// at once.
async fn a_step_of_the_database_clock_does_not_shorten_the_restart_grace(db: Db) {
    let_the_start_age(&db).await;
    let (proxy, holder, lost) = silent_holder(&db, Sql::new, 3000, "stepped").await;
    let db = crash_and_restart(db).await;
    let near = Client::new(Sql::new(db.url()));
    // The first session after the restart begins the grace.
    let opener = bounded("a first session", near.session_with(options(3000)))
        .await
        .expect("a first session");
    let step = if db.is_postgres() {
        "UPDATE lockline_meta SET grace_from = grace_from - interval '60 seconds' WHERE grace_ms > 0"
    } else {
        "UPDATE lockline_meta SET grace_from_us = grace_from_us - 60000000 WHERE grace_ms > 0"
    };
    db.sql(step);
    let stepped = bounded("a session after the step", near.session_with(options(3000)))
        .await
        .expect("a session after the step");
    let guard = granted_after_the_old_holder_heard(&stepped, "stepped", lost, "a step of the clock").await;
    guard.release().await.expect("release");
    // Waited out: closing ends it on the server.
    stepped.close().await.expect("close");
    assert_eq!(
        db.count("SELECT grace_ms FROM lockline_meta"),
        0,
        "the grace was not ended"
    );
    let later = bounded("a session after the grace", near.session_with(options(3000)))
        .await
        .expect("a session after the grace");
    // The session itself says whether it holds grants back, and until when
    // (not a timing: on a loaded machine a first lock can take as long as
    // the grace).
    assert_eq!(
        later.backend_session().grant_not_before(),
        None,
        "a session opened after the grace ended holds its grants back"
    );
    let guard = bounded("the lock after the grace", later.mutex("after").expect("mutex").lock())
        .await
        .expect("lock");
    guard.release().await.expect("release");
    later.close().await.expect("close");
    opener.close().await.expect("close");
    proxy.heal();
    drop(holder);
}

/// Waits until the server's start is older than 3 s: MariaDB's start is
/// read as its clock minus its whole-second `Uptime`, so a start within
/// 2.5 s of the one before is taken for the same (docs/sql.md).
async fn let_the_start_age(db: &Db) {
    if !db.is_postgres() {
        until("the server has been up 3 s", || {
            db.count("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'") >= 3
        })
        .await;
    }
}

/// A holder of `name` with a TTL of `ttl_ms`, through a proxy that has just
/// gone silent: the proxy, the holder's session, and when it hears `lost()`.
async fn silent_holder(
    db: &Db,
    sql: impl Fn(String) -> Sql,
    ttl_ms: u64,
    name: &str,
) -> (TcpProxy, Session, tokio::task::JoinHandle<Instant>) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(sql(db.url_via(&proxy.address())));
    let holder = far.session_with(options(ttl_ms)).await.expect("session");
    let held = holder.mutex(name).expect("mutex").lock().await.expect("lock");
    proxy.blackhole();
    let lost = tokio::spawn(async move {
        held.lost().await;
        Instant::now()
    });
    (proxy, holder, lost)
}

/// Locks `name` on `session` and checks that the old holder (`lost`: when
/// it heard `lost()`) was told before this grant, `after` what.
async fn granted_after_the_old_holder_heard(
    session: &Session,
    name: &str,
    lost: tokio::task::JoinHandle<Instant>,
    after: &str,
) -> lockline::MutexGuard {
    let guard = bounded("the lock", session.mutex(name).expect("mutex").lock())
        .await
        .expect("lock");
    let granted_at = Instant::now();
    let lost_at = bounded("the old holder hears of it", lost).await.expect("task");
    assert!(
        lost_at <= granted_at,
        "after {after} the next holder was granted {:?} before the old holder was told",
        lost_at - granted_at
    );
    guard
}

/// MariaDB tells a server's start by its clock less its whole-second
/// `Uptime`, and takes a start within 2.5 s of the one it knows for the
/// same. A restart it would so take (here: the start it knows set to the
/// new one's) is told anyway, by the run marker a restart empties (a MEMORY
/// table): the grace holds the next grant back until the old holder has
/// heard `lost()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_tells_a_restart_its_start_cannot_tell() {
    let db = Db::mariadb();
    let (proxy, holder, lost) = silent_holder(&db, Sql::new, 3000, "marked").await;
    let db = crash_and_restart(db).await;
    db.sql(
        "UPDATE lockline_meta SET started_us = \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) - 1000000 * \
         (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME')",
    );
    let near = Client::new(Sql::new(db.url()));
    let fresh = bounded("a new session", near.session_with(options(3000)))
        .await
        .expect("a new session");
    let guard = granted_after_the_old_holder_heard(&fresh, "marked", lost, "a restart").await;
    guard.release().await.expect("release");
    fresh.close().await.expect("close");
    proxy.heal();
    drop(holder);
}

/// A start that only looks new to MariaDB (its run marker emptied, as a
/// peer's replicated `DELETE` of a MEMORY table or a step of the clock would
/// make it look) costs a grace but forgets nothing: the TTLs of the sessions
/// still alive stay the run's, so a real restart after it still waits for
/// them. And a run this server did not begin (its marker names an older run
/// than the meta row: a switchover and back) is a new start too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_start_that_only_looks_new_forgets_no_live_session() {
    let db = Db::mariadb();
    let client = Client::new(Sql::new(db.url()));
    let long = bounded("a long session", client.session_with(options(12_000)))
        .await
        .expect("session");
    db.sql("DELETE FROM lockline_run");
    let short = bounded("a short session", client.session_with(options(2000)))
        .await
        .expect("session");
    assert_eq!(
        db.count("SELECT run_max_ttl_ms FROM lockline_meta"),
        12_000,
        "the live session's TTL was forgotten"
    );
    assert_eq!(db.count("SELECT grace_ms FROM lockline_meta"), 12_000, "no grace began");
    let run = db.sql("SELECT run_id FROM lockline_meta");
    // Another server's run took over and handed back.
    db.sql("UPDATE lockline_meta SET run_id = 'elsewhere', grace_ms = 0");
    let again = bounded("a session after the switch back", client.session_with(options(2000)))
        .await
        .expect("session");
    let now = db.sql("SELECT run_id FROM lockline_meta");
    assert!(
        now.trim() != "elsewhere" && now.trim() != run.trim(),
        "no new run began: {now:?}"
    );
    assert_eq!(db.count("SELECT grace_ms FROM lockline_meta"), 12_000, "no grace began");
    for session in [again, short, long] {
        session.close().await.expect("close");
    }
}

/// A holder with a long TTL (12 s) on a silent path, the database restarted,
/// a session with a short TTL (2 s) opened in the grace, and the database
/// restarted again: the second grace keeps the first one's length (the
/// longest TTL of the run before it, 12 s), not the short TTL of the run
/// between, so the old holder still hears `lost()` before the next grant.
async fn a_second_restart_in_a_grace_keeps_the_longer_grace(db: Db) {
    let_the_start_age(&db).await;
    let (proxy, holder, lost) = silent_holder(&db, Sql::new, 12_000, "twice").await;
    let db = crash_and_restart(db).await;
    let near = Client::new(Sql::new(db.url()));
    let between = bounded("a session between the restarts", near.session_with(options(2000)))
        .await
        .expect("a session between the restarts");
    let_the_start_age(&db).await;
    let db = crash_and_restart(db).await;
    let after = bounded("a session after the second restart", near.session_with(options(2000)))
        .await
        .expect("a session after the second restart");
    let guard = granted_after_the_old_holder_heard(&after, "twice", lost, "a second restart").await;
    guard.release().await.expect("release");
    after.close().await.expect("close");
    drop(between);
    proxy.heal();
    drop(holder);
    drop(db);
}

/// A holder (TTL 3 s) behind a proxy that goes silent, the database
/// crashed and restarted, then a fresh session locks the same name: when
/// the old holder heard `lost()`, when the fresh one was granted, and when
/// the server was back.
async fn restart_beside_a_silent_holder(
    db: Db,
    sql: impl Fn(String) -> Sql,
) -> (Instant, Instant, Instant, Option<tokio::time::Instant>) {
    let_the_start_age(&db).await;
    let url = db.url();
    let (proxy, holder, lost) = silent_holder(&db, &sql, 3000, "grace").await;
    let db = crash_and_restart(db).await;
    let back_at = Instant::now();
    let near = Client::new(sql(url));
    let fresh = bounded("a new session", near.session_with(options(3000)))
        .await
        .expect("a new session");
    let held_back = fresh.backend_session().grant_not_before();
    let guard = bounded(
        "the lock after the restart",
        fresh.mutex("grace").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    let granted_at = Instant::now();
    let lost_at = bounded("the old holder hears of it", lost).await.expect("task");
    guard.release().await.expect("release");
    fresh.close().await.expect("close");
    proxy.heal();
    drop(holder);
    drop(db);
    (lost_at, granted_at, back_at, held_back)
}
