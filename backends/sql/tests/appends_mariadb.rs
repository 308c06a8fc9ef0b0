//! MariaDB/MySQL: nothing an append (or a session's opening) holds on the
//! server outlives its round trip, and nothing an append writes outlives
//! its entry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::Client;
use lockline_sql::Sql;
use lockline_testkit::TcpProxy;

mod attack_kit;
mod support;

use attack_kit::{options, step, within, Side};
use support::db::Db;

/// A contender whose guard connection goes silent (a NAT forgets that one
/// flow: no reset, its other connections fine) while its append is held
/// on the server, and whose held statement then fails there (here: its
/// row-lock wait runs out). Nothing of the append may stay locked on the
/// server waiting for a client that will never send another byte: another
/// client still appends to the lock and is granted it within a bound.
///
/// Was a defect, now fixed: the append was a transaction over several round
/// trips (the name's row of `lockline_names` locked, then the insert, then
/// COMMIT); the failed insert left the transaction open on a connection the
/// server still believes in, the name's row locked by it, and every later
/// append to the name retried its row-lock wait for ever (the contender's
/// session renews on its other connection, so nobody ends it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_append_leaves_the_lock_usable() {
    let db = Db::mariadb();
    let url = db.url();
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    let near = Client::new(Sql::new(url.clone()));
    // A session's first connection holds its guards.
    let guard_connection = proxy.connections_accepted();
    let frozen = far.session_with(options(2000)).await.expect("session");
    assert!(
        proxy.connections_accepted() >= guard_connection + 2,
        "a session opens its guard connection and its control connection"
    );
    let other = near.session_with(options(10_000)).await.expect("session");
    // The lock has been used before.
    other
        .mutex("frozen")
        .expect("mutex")
        .lock()
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    let mut looker = Side::connect(&url).await;
    let server_id = looker
        .int(&format!(
            "SELECT conn FROM lockline_sessions WHERE id = '{}'",
            frozen.id()
        ))
        .await;
    // Every insert into the entries table waits: next-key locks on the
    // whole attempt index, up to its end, from a transaction of the test.
    let mut side = Side::connect(&url).await;
    side.exec("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await;
    side.exec("BEGIN").await;
    side.exec("SELECT id FROM lockline_entries FORCE INDEX (entries_attempt) FOR UPDATE")
        .await;
    let stalled = {
        let mutex = frozen.mutex("frozen").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    looker
        .until(
            "the append waits on the server",
            // (Not INNODB_TRX: read more often than every 100 ms, it is
            // never refreshed.)
            &format!(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {server_id} \
                 AND INFO LIKE 'INSERT INTO `lockline`.`lockline_entries`%' AND TIME_MS > 100"
            ),
            |n| n > 0,
        )
        .await;
    proxy.freeze_connection(guard_connection);
    // The held statement fails on the server (its row-lock wait runs out);
    // its answer goes nowhere.
    looker
        .until(
            "the append's statement ends on the server",
            &format!(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {server_id} AND COMMAND = 'Sleep'"
            ),
            |n| n > 0,
        )
        .await;
    side.exec("COMMIT").await;
    let started = Instant::now();
    let next = within(Duration::from_secs(10), other.mutex("frozen").expect("mutex").lock()).await;
    let next = next.unwrap_or_else(|| {
        panic!(
            "the lock is unusable {:?} after a contender's connection went silent during its append (it never held it)",
            started.elapsed()
        )
    });
    let next = next.expect("lock");
    assert!(next.is_held());
    next.release().await.expect("release");
    stalled.abort();
    proxy.thaw_connection(guard_connection);
}

/// Ten thousand names locked and released, many at once from a few
/// sessions: afterwards no lockline table holds a row but the sessions'
/// and the layout's, and the server holds no named lock but the sessions'
/// own. (The names table this replaced kept a row per name ever locked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_names_leave_nothing_behind() {
    const NAMES: usize = 10_000;
    const SESSIONS: usize = 4;
    const TASKS_PER_SESSION: usize = 8;
    let db = Db::mariadb();
    let client = Client::new(Sql::new(db.url()));
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(client.session_with(options(30_000)).await.expect("session"));
    }
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for session in &sessions {
        for _ in 0..TASKS_PER_SESSION {
            let (session, next) = (session.clone(), Arc::clone(&next));
            tasks.push(tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n >= NAMES {
                        return;
                    }
                    let guard = session
                        .mutex(&format!("name/{n}"))
                        .expect("mutex")
                        .lock()
                        .await
                        .expect("lock");
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    let started = Instant::now();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(600), task)
            .await
            .expect("the names are locked and released in time")
            .expect("task");
    }
    eprintln!("{NAMES} names locked and released in {:?}", started.elapsed());
    let tables = db.sql(
        "SELECT table_name FROM information_schema.TABLES \
         WHERE table_schema = 'lockline' AND table_name LIKE 'lockline\\_%' ORDER BY table_name",
    );
    let tables: Vec<&str> = tables.lines().map(str::trim).filter(|t| !t.is_empty()).collect();
    assert!(tables.contains(&"lockline_entries"), "lockline's tables: {tables:?}");
    for table in &tables {
        let rows = db.count(&format!("SELECT COUNT(*) FROM `{table}`"));
        let expected = match *table {
            "lockline_sessions" => i64::try_from(SESSIONS).expect("count"),
            // The layout's row, and this run of the server's marker.
            "lockline_meta" | "lockline_run" => 1,
            _ => 0,
        };
        assert_eq!(
            rows, expected,
            "{table} holds {rows} rows after {NAMES} names were locked and released"
        );
    }
    let locks = db.locks();
    assert_eq!(
        (locks.held, locks.waiting),
        (SESSIONS as u64, 0),
        "named locks left on the server besides the sessions' own: {locks:?}"
    );
    for session in sessions {
        step("close", session.close()).await.expect("close");
    }
    assert_eq!(db.count("SELECT COUNT(*) FROM lockline_sessions"), 0);
}

/// The first session opened after a server restart moves the id counter
/// past the server's clock; a contender whose connection goes silent while
/// it does (here: while its step on the layout's row waits on the server)
/// must not keep every later session from opening.
///
/// Was a defect, now fixed: the move was a transaction over several round
/// trips that locked the layout's row first (`SELECT ... FOR UPDATE`); the
/// silent opener kept it locked on a connection the server still believes
/// in, with no session row for anyone to reap, and every later opener
/// failed its row-lock wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_first_open_after_a_restart_leaves_opening_possible() {
    let db = Db::mariadb();
    let url = db.url();
    // The tables exist and the counter was moved once; then the server
    // start recorded is not this one's (as after a restart).
    let first = Client::new(Sql::new(url.clone()))
        .session_with(options(10_000))
        .await
        .expect("session");
    first.close().await.expect("close");
    db.sql("UPDATE lockline_meta SET started_us = 0");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    let near = Client::new(Sql::new(url.clone()));
    // Every step that locks the layout's row waits, from a transaction of
    // the test.
    let mut side = Side::connect(&url).await;
    side.exec("BEGIN").await;
    side.exec("SELECT started_us FROM lockline_meta FOR UPDATE").await;
    let mut looker = Side::connect(&url).await;
    let opener_connection = proxy.connections_accepted();
    let opening = tokio::spawn(async move { far.session_with(options(10_000)).await });
    let waiting = "SELECT CAST(COALESCE(MAX(ID), 0) AS SIGNED) FROM information_schema.PROCESSLIST \
                   WHERE INFO LIKE '%lockline_meta%' AND COMMAND <> 'Sleep' AND TIME_MS > 100";
    let opener = looker
        .until("the opening waits on the server", waiting, |n| n > 0)
        .await;
    proxy.freeze_connection(opener_connection);
    side.exec("COMMIT").await;
    looker
        .until(
            "the opener's statement ends on the server",
            &format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {opener} AND COMMAND = 'Sleep'"),
            |n| n > 0,
        )
        .await;
    let started = Instant::now();
    let opened = within(Duration::from_secs(10), async {
        loop {
            match near.session_with(options(10_000)).await {
                Ok(session) => return session,
                Err(error) => eprintln!("open failed after {:?}: {error}", started.elapsed()),
            }
        }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no session opens {:?} after an opener's connection went silent",
            started.elapsed()
        )
    });
    let guard = opened.mutex("after").expect("mutex").lock().await.expect("lock");
    guard.release().await.expect("release");
    opening.abort();
    proxy.thaw_connection(opener_connection);
}
