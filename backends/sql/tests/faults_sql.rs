//! The SQL backend when things go wrong, on PostgreSQL and on MariaDB: a
//! killed holder, a silently partitioned one, a paused one with a fenced
//! transaction open, a database restart, a crowd of cancelled waiters.

use std::time::{Duration, Instant};

use lockline::backend::{AppendRequest, Conflicts};
use lockline::conformance::{bounded, until};
use lockline::{Client, EntryKind, Error, LockMode, Session, SessionState};
use lockline_sql::Sql;
use lockline_testkit::TcpProxy;

#[macro_use]
mod support;

use support::db::{spawn_probe, Db};
use support::options;

on_both!(
    a_killed_holder_is_replaced_within_a_second,
    a_blackholed_holder_is_told_before_the_next_grant,
    a_restart_ends_every_session_and_tokens_keep_growing,
    a_thousand_cancelled_waiters_leave_nothing_on_the_server,
    a_paused_holder_cannot_commit_after_the_next_grant,
    a_healthy_holder_commits_its_fenced_transaction,
    a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only,
    a_restart_grants_nothing_before_an_old_holder_hears_lost,
    without_the_restart_grace_a_restart_grants_at_once,
    a_step_of_the_database_clock_does_not_shorten_the_restart_grace,
    a_second_restart_in_a_grace_keeps_the_longer_grace,
    with_the_reset_grace_a_holder_whose_connection_is_reset_hears_lost_first,
    with_the_reset_grace_a_cut_off_holder_is_outlived,
    a_retried_append_finds_the_entry_its_first_try_made,
    a_crash_right_after_an_ex_grant_leaves_the_value_block_not_valid,
    a_crash_right_after_an_ex_hand_over_leaves_the_value_block_not_valid,
);

/// A holder process killed outright: the server sees its connection reset
/// and frees its guard, so the next waiter is granted at once (well within
/// a second), woken once.
async fn a_killed_holder_is_replaced_within_a_second(db: Db) {
    let url = db.url();
    let (mut holder, first) = spawn_probe(&url, "killed", "hold", 30_000);
    let token: u64 = first
        .strip_prefix("held ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the probe said {first:?}"));
    let client = Client::new(Sql::new(url));
    let session = client.session_with(options(30_000)).await.expect("session");
    let waiter = {
        let mutex = session.mutex("killed").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    client.wait_for_stats(|s| s.waits >= 1).await;
    let killed_at = Instant::now();
    holder.signal_and_wait(libc::SIGKILL).expect("kill the holder");
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    let took = granted_at - killed_at;
    assert!(
        took < Duration::from_secs(1),
        "the next holder was granted {took:?} after the holder was killed"
    );
    assert!(guard.token().get() > token);
    assert_eq!(client.stats().wakeups, 1, "{:?}", client.stats());
    guard.release().await.expect("release");
    until("the dead holder's row is gone", || db.entries() == 0).await;
}

/// A silent partition (packets dropped, no reset; the server's TCP
/// keepalives at their defaults): the holder is told at `ttl - margin`
/// after its last answered renewal, before the waiter ends its connection
/// at the TTL by the database's clock and is granted, within TTL + slack.
async fn a_blackholed_holder_is_told_before_the_next_grant(db: Db) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    let near = Client::new(Sql::new(db.url()));
    let ttl = 2000;
    let holder_session = far.session_with(options(ttl)).await.expect("session");
    let held = holder_session
        .mutex("partition")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let other = near.session_with(options(ttl)).await.expect("session");
    let waiter = {
        let mutex = other.mutex("partition").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    near.wait_for_stats(|s| s.waits >= 1).await;
    let cut_at = Instant::now();
    proxy.blackhole();
    bounded("the holder hears of it", held.lost()).await;
    let lost_at = Instant::now();
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        lost_at <= granted_at,
        "the next holder was granted {:?} before the partitioned holder was told",
        lost_at - granted_at
    );
    let took = granted_at - cut_at;
    assert!(
        took < Duration::from_millis(ttl) + Duration::from_secs(3),
        "the next holder was granted {took:?} after the partition (TTL {ttl} ms)"
    );
    assert!(guard.token() > held.token());
    assert_eq!(holder_session.state(), SessionState::Lost);
    guard.release().await.expect("release");
    proxy.heal();
    drop(holder_session);
}

/// A database crash and restart: every connection is gone with its guards.
/// Holders hear `lost()`, waiters fail with `SessionLost`, nothing hangs; no
/// row left from before blocks anyone; and the tokens handed out after the
/// restart are above every token handed out before (the id counter of an
/// unlogged table restarts after a crash: the backend moves it past the
/// server's clock at the first session after each start).
async fn a_restart_ends_every_session_and_tokens_keep_growing(mut db: Db) {
    let client = Client::new(Sql::new(db.url()));
    let (a, b) = (
        client.session_with(options(3000)).await.expect("session"),
        client.session_with(options(3000)).await.expect("session"),
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
    client.wait_for_stats(|s| s.waits >= 1).await;
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

fn create_probe_table(db: &Db) {
    db.sql("CREATE TABLE probe_writes (token bigint NOT NULL)");
}

/// A holder paused (SIGSTOP) past its TTL with a fenced transaction open:
/// the next holder is granted meanwhile, and when the paused holder wakes
/// and commits, its commit is refused and nothing it wrote lands.
async fn a_paused_holder_cannot_commit_after_the_next_grant(db: Db) {
    create_probe_table(&db);
    let url = db.url();
    let (mut probe, first) = spawn_probe(&url, "fenced", "fenced", 2000);
    let stale: i64 = first
        .strip_prefix("ready ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the probe said {first:?}"));
    probe.signal(libc::SIGSTOP).expect("pause the holder");
    let client = Client::new(Sql::new(url));
    let session = client.session_with(options(2000)).await.expect("session");
    let next = bounded(
        "the next holder is granted",
        session.mutex("fenced").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    assert!(next.token().get() > u64::try_from(stale).expect("token"));
    probe.signal(libc::SIGCONT).expect("resume the holder");
    probe.send_line("commit").expect("tell it to commit");
    let said = probe.line(Duration::from_secs(20)).expect("the probe's answer");
    let said = if said == "lost" {
        probe.line(Duration::from_secs(20)).expect("the probe's answer")
    } else {
        said
    };
    assert!(
        said.starts_with("refused: LockLost") || said.starts_with("refused: SessionLost"),
        "a paused holder's fenced commit must be refused, it said {said:?}"
    );
    assert_eq!(
        db.count(&format!("SELECT count(*) FROM probe_writes WHERE token = {stale}")),
        0,
        "the stale holder's write landed"
    );
    next.release().await.expect("release");
}

/// A holder that keeps its lock commits its fenced transaction.
async fn a_healthy_holder_commits_its_fenced_transaction(db: Db) {
    create_probe_table(&db);
    let (mut probe, first) = spawn_probe(&db.url(), "healthy", "fenced", 10_000);
    let token: i64 = first
        .strip_prefix("ready ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the probe said {first:?}"));
    probe.send_line("commit").expect("tell it to commit");
    assert_eq!(probe.line(Duration::from_secs(20)).as_deref(), Some("committed"));
    assert_eq!(
        db.count(&format!("SELECT count(*) FROM probe_writes WHERE token = {token}")),
        1
    );
}

/// With a lock-delay, a waiter behind a holder whose process was killed
/// (SIGKILL: the server frees its guard at once) is granted no sooner than
/// the delay after the kill; behind a holder cut off silently (ended by the
/// waiter at its TTL), no sooner than the delay after that end; behind a
/// clean release, at once.
async fn a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only(db: Db) {
    let delay = Duration::from_millis(1500);
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()));
    let waiting = client
        .session_with(options(2000).with_lock_delay(delay))
        .await
        .expect("session");
    let granted = |name: &str| {
        let mutex = waiting.mutex(name).expect("mutex");
        async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        }
    };

    // A killed holder process.
    let (mut holder, first) = spawn_probe(&url, "delay/killed", "hold", 30_000);
    assert!(first.starts_with("held "), "{first}");
    let waiter = tokio::spawn(granted("delay/killed"));
    client.wait_for_stats(|s| s.waits >= 1).await;
    let killed_at = Instant::now();
    holder.signal_and_wait(libc::SIGKILL).expect("kill the holder");
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(at - killed_at >= delay, "granted {:?} after the kill", at - killed_at);
    guard.expect("lock").release().await.expect("release");

    // A holder cut off silently: ended at its TTL, then the lock-delay.
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    let cut = far.session_with(options(2000)).await.expect("session");
    let held = cut.mutex("delay/cut").expect("mutex").lock().await.expect("lock");
    let waits = client.stats().waits;
    let waiter = tokio::spawn(granted("delay/cut"));
    client.wait_for_stats(|s| s.waits > waits).await;
    let cut_at = Instant::now();
    proxy.blackhole();
    bounded("the holder hears of it", held.lost()).await;
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    // The server ends the holder at its TTL from its last heartbeat, at most
    // a keepalive interval (a third of the TTL) before the cut.
    assert!(
        at - cut_at >= Duration::from_millis(2000 * 2 / 3) + delay,
        "granted {:?} after the cut: the TTL (2 s, less a keepalive interval) and the lock-delay ({delay:?}) had not both passed",
        at - cut_at
    );
    guard.expect("lock").release().await.expect("release");
    proxy.heal();

    // A clean release: at once.
    let delays = client.stats().lock_delays;
    let releasing = client.session_with(options(2000)).await.expect("session");
    let holder = releasing
        .mutex("delay/clean")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let waits = client.stats().waits;
    let waiter = tokio::spawn(granted("delay/clean"));
    client.wait_for_stats(|s| s.waits > waits).await;
    let released_at = Instant::now();
    holder.release().await.expect("release");
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(
        at - released_at < delay,
        "a clean release was held back {:?}",
        at - released_at
    );
    assert_eq!(
        client.stats().lock_delays,
        delays,
        "a lock-delay began after a clean release"
    );
    guard.expect("lock").release().await.expect("release");
}

/// A database restart while a holder's path to it is silent (it hears of
/// nothing until its loss deadline): a session opened after the restart
/// grants nothing until the longest TTL of the sessions before it has
/// passed since the start, so the old holder hears `lost()` first.
async fn a_restart_grants_nothing_before_an_old_holder_hears_lost(db: Db) {
    let (lost_at, granted_at, _) = restart_beside_a_silent_holder(db, Sql::new).await;
    assert!(
        lost_at <= granted_at,
        "the next holder was granted {:?} before the old holder was told",
        lost_at - granted_at
    );
}

/// The same with `Sql::without_restart_grace`: the grant comes at once
/// after the restart (well within the TTL), the documented window.
async fn without_the_restart_grace_a_restart_grants_at_once(db: Db) {
    let (_, granted_at, back_at) =
        restart_beside_a_silent_holder(db, |url| Sql::new(url).without_restart_grace()).await;
    let took = granted_at - back_at;
    assert!(
        took < Duration::from_millis(1500),
        "without the grace the grant came {took:?} after the server was back"
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
    let asked = Instant::now();
    let guard = bounded("the lock after the grace", later.mutex("after").expect("mutex").lock())
        .await
        .expect("lock");
    assert!(
        asked.elapsed() < Duration::from_millis(3000),
        "a session opened after the grace ended waited {:?} (the grace is 3 s)",
        asked.elapsed()
    );
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

/// Crashes and restarts the database off the async workers.
async fn crash_and_restart(mut db: Db) -> Db {
    let restarted = tokio::task::spawn_blocking(move || {
        db.crash_and_restart();
        db
    });
    bounded("the database restarts", restarted).await.expect("restart")
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
async fn restart_beside_a_silent_holder(db: Db, sql: impl Fn(String) -> Sql) -> (Instant, Instant, Instant) {
    let_the_start_age(&db).await;
    let url = db.url();
    let (proxy, holder, lost) = silent_holder(&db, &sql, 3000, "grace").await;
    let db = crash_and_restart(db).await;
    let back_at = Instant::now();
    let near = Client::new(sql(url));
    let fresh = bounded("a new session", near.session_with(options(3000)))
        .await
        .expect("a new session");
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
    (lost_at, granted_at, back_at)
}

/// With `Sql::with_reset_grace`: the connection that holds a live holder's
/// lock is ended by the server (an administrator's terminate, a reset), which
/// frees the lock at once; the waiter goes past it only once the holder has
/// heard `lost()` and ended its session (at its next heartbeat).
async fn with_the_reset_grace_a_holder_whose_connection_is_reset_hears_lost_first(db: Db) {
    let url = db.url();
    let holders = Client::new(Sql::new(url.clone()));
    let waiters = Client::new(Sql::new(url).with_reset_grace());
    let holder = holders.session_with(options(3000)).await.expect("session");
    let held = holder.mutex("reset").expect("mutex").lock().await.expect("lock");
    let waiter_session = waiters.session_with(options(3000)).await.expect("session");
    let waiter = {
        let mutex = waiter_session.mutex("reset").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    waiters.wait_for_stats(|s| s.waits >= 1).await;
    let id = holder.id().to_owned();
    if db.is_postgres() {
        db.sql(&format!(
            "SELECT pg_terminate_backend(pid) FROM lockline_sessions WHERE id = '{id}'"
        ));
    } else {
        let conn = db.sql(&format!("SELECT conn FROM lockline_sessions WHERE id = '{id}'"));
        db.sql(&format!("KILL CONNECTION {}", conn.trim()));
    }
    let reset_at = Instant::now();
    bounded("the holder hears of it", held.lost()).await;
    let lost_at = Instant::now();
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        lost_at <= granted_at,
        "with the reset grace the next holder was granted {:?} before the reset holder was told",
        lost_at - granted_at
    );
    let took = granted_at - reset_at;
    assert!(
        took < Duration::from_secs(3),
        "the next holder was granted {took:?} after the reset (TTL 3 s): the holder ends its session at its next heartbeat"
    );
    guard.release().await.expect("release");
}

/// With `Sql::with_reset_grace`: every connection of a holder is reset and
/// new ones refused (a crash or a partition that resets), so it can neither
/// renew nor end its session: the waiter goes past it once its heartbeat
/// has stood still for its TTL, after the holder's `lost()`.
async fn with_the_reset_grace_a_cut_off_holder_is_outlived(db: Db) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    let waiters = Client::new(Sql::new(db.url()).with_reset_grace());
    let ttl = 2000;
    let holder = far.session_with(options(ttl)).await.expect("session");
    let held = holder.mutex("cut").expect("mutex").lock().await.expect("lock");
    let waiter_session = waiters.session_with(options(ttl)).await.expect("session");
    let waiter = {
        let mutex = waiter_session.mutex("cut").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    waiters.wait_for_stats(|s| s.waits >= 1).await;
    let cut_at = Instant::now();
    proxy.block();
    bounded("the holder hears of it", held.lost()).await;
    let lost_at = Instant::now();
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        lost_at <= granted_at,
        "with the reset grace the next holder was granted {:?} before the cut-off holder was told",
        lost_at - granted_at
    );
    let took = granted_at - cut_at;
    assert!(
        took >= Duration::from_millis(ttl) - Duration::from_millis(ttl / 3),
        "granted {took:?} after the cut: the reset holder was not outlived"
    );
    guard.release().await.expect("release");
    proxy.unblock();
}

/// The value block after a crash that takes an EX holder's lock: not valid,
/// with the value last written. Here the holder is the first since the
/// block was last written with no holder named, and the crash comes right
/// after its grant: the grant's naming of it reached the disk before the
/// grant was told (on PostgreSQL a write that names a holder where none was
/// waits for the disk; a crash that lost it would leave the value valid).
async fn a_crash_right_after_an_ex_grant_leaves_the_value_block_not_valid(db: Db) {
    let client = Client::new(Sql::new(db.url()).without_restart_grace());
    let session = client.session_with(options(3000)).await.expect("session");
    let resource = session.resource("crash/grant").expect("resource");
    let mut first = resource.lock(LockMode::Ex).await.expect("lock");
    first.set_value(b"v1").expect("set the value");
    first.release().await.expect("release");
    let held = resource.lock(LockMode::Ex).await.expect("lock again");
    assert!(held.value().valid, "the value block after a release is valid");
    crash_and_restart_then_read_block(db, &client, held, "crash/grant").await;
}

/// The same when the crash comes right after a hand-over from one EX
/// holder to the next that left the value as it was: the block names one
/// of the two, both gone with the crash (on PostgreSQL that write need not
/// wait for the disk: lost, it leaves the block naming the first holder).
async fn a_crash_right_after_an_ex_hand_over_leaves_the_value_block_not_valid(db: Db) {
    let client = Client::new(Sql::new(db.url()).without_restart_grace());
    let (a, b) = (
        client.session_with(options(3000)).await.expect("session"),
        client.session_with(options(3000)).await.expect("session"),
    );
    let mut first = a
        .resource("crash/hand-over")
        .expect("resource")
        .lock(LockMode::Ex)
        .await
        .expect("lock");
    first.set_value(b"v1").expect("set the value");
    first.release().await.expect("release");
    let first = a
        .resource("crash/hand-over")
        .expect("resource")
        .lock(LockMode::Ex)
        .await
        .expect("lock");
    let waiter = {
        let resource = b.resource("crash/hand-over").expect("resource");
        tokio::spawn(async move { resource.lock(LockMode::Ex).await })
    };
    client.wait_for_stats(|s| s.waits >= 1).await;
    first.release().await.expect("release");
    let next = bounded("the hand-over", waiter).await.expect("task").expect("lock");
    assert!(next.value().valid, "the value block after a hand-over is valid");
    crash_and_restart_then_read_block(db, &client, next, "crash/hand-over").await;
}

/// Crashes the database with `held` holding `name` in EX, then takes the
/// lock in EX in a new session: its value must be `v1`, not valid.
async fn crash_and_restart_then_read_block(db: Db, client: &Client, held: lockline::ResourceGuard, name: &str) {
    let crashed = crash_and_restart(db).await;
    bounded("the holder hears of it", held.lost()).await;
    let fresh = bounded("a new session", client.session_with(options(3000)))
        .await
        .expect("a new session");
    let again = bounded(
        "the lock after the crash",
        fresh.resource(name).expect("resource").lock(LockMode::Ex),
    )
    .await
    .expect("lock after the crash");
    let value = again.value();
    assert_eq!(value.bytes, b"v1", "the value last written is kept");
    assert!(
        !value.valid,
        "an EX holder lost its lock in the crash: the value block must read not valid, got {value:?}"
    );
    drop(crashed);
}
