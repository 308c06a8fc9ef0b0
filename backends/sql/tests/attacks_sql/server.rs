//! What the server does on its own: a crashed backend, short server
//! timeouts, an application's advisory locks, a clean restart, a reset
//! connection.

use super::*;

/// One PostgreSQL backend SIGKILLed (the postmaster then ends every
/// connection, empties the unlogged tables and restarts their id counter
/// without a new start time): every session is lost, and tokens after are
/// above every token before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_crashed_backend_never_makes_a_token_repeat() {
    let db = Db::postgres();
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()));
    let a = client.session_with(options(10_000)).await.expect("session");
    let mut highest = 0;
    for round in 0..20 {
        let guard = a
            .mutex(&format!("crash/{round}"))
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        highest = highest.max(guard.token().get());
        guard.release().await.expect("release");
    }
    let held = a.mutex("crash/held").expect("mutex").lock().await.expect("lock");
    highest = highest.max(held.token().get());
    let mut side = Side::connect(&url).await;
    let pid = side
        .int(&format!(
            "SELECT pid::bigint FROM lockline_sessions WHERE id = '{}'",
            a.id()
        ))
        .await;
    drop(side);
    // SAFETY: kill(2) of one backend of the test's own server.
    assert_eq!(
        unsafe { libc::kill(libc::pid_t::try_from(pid).expect("pid"), libc::SIGKILL) },
        0
    );
    step("the holder hears of it", held.lost()).await;
    // The postmaster reinitializes: sessions open again once it accepts.
    let fresh = step("a new session after the reinitialization", async {
        loop {
            match client.session_with(options(10_000)).await {
                Ok(session) => return session,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await;
    let mut side = Side::connect(&url).await;
    let rows = side.int("SELECT count(*) FROM lockline_entries").await;
    let again = fresh.mutex("crash/held").expect("mutex").lock().await.expect("lock");
    assert!(
        again.token().get() > highest,
        "token {} after a backend's crash is not above {highest} from before ({rows} rows survived)",
        again.token()
    );
    again.release().await.expect("release");
}

/// Servers set to end idle sessions, idle transactions and long statements
/// within a second: a holder idle for 3 s keeps its lock, a waiter waits
/// for 3 s, and both sessions stay live; an idle wait connection is reused.
async fn short_server_timeouts_end_nothing(db: Db) {
    let client = Client::new(Sql::new(db.url()));
    let (h, w) = (
        client.session_with(options(6000)).await.expect("session"),
        client.session_with(options(6000)).await.expect("session"),
    );
    for round in 0..2 {
        let held = h
            .mutex(&format!("timeouts/{round}"))
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        let waiter = {
            let mutex = w.mutex(&format!("timeouts/{round}")).expect("mutex");
            tokio::spawn(async move { mutex.lock().await })
        };
        let early = within(Duration::from_secs(3), held.lost()).await;
        assert!(early.is_none(), "the idle holder lost its lock");
        assert!(!waiter.is_finished(), "the waiter was granted while the lock was held");
        held.release().await.expect("release");
        let next = step("the waiter", waiter).await.expect("task").expect("lock");
        next.release().await.expect("release");
    }
    assert_eq!((h.state(), w.state()), (SessionState::Live, SessionState::Live));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_short_server_timeouts_end_nothing() {
    let settings = [
        ("idle_session_timeout", "500ms"),
        ("idle_in_transaction_session_timeout", "500ms"),
        ("statement_timeout", "300ms"),
        ("lock_timeout", "200ms"),
    ];
    let server = lockline_testkit::PgServer::start_with(&lockline_testkit::PgOptions {
        durable: false,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    })
    .expect("start postgres");
    short_server_timeouts_end_nothing(Db::Pg(server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_short_server_timeouts_end_nothing() {
    let settings = [
        ("wait_timeout", "1"),
        ("interactive_timeout", "1"),
        ("max_statement_time", "0.3"),
        ("innodb_lock_wait_timeout", "1"),
        ("idle_transaction_timeout", "1"),
    ];
    let server = lockline_testkit::MariaDbServer::start_with(&lockline_testkit::MariaDbOptions {
        innodb_flush_log_at_trx_commit: 2,
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    })
    .expect("start mariadb");
    server.create_database("lockline").expect("create database");
    short_server_timeouts_end_nothing(Db::My(server)).await;
}

/// An application's own advisory locks (small keys, negative keys from
/// hashtext, two-int4 keys) held on the same server: lockline's locks work
/// as usual, and take none of those keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_application_s_advisory_locks_do_not_meet_lockline_s() {
    let db = Db::postgres();
    let url = db.url();
    let mut user = Side::connect(&url).await;
    user.exec(
        "SELECT pg_advisory_lock(k) FROM generate_series(0, 300) k; \
         SELECT pg_advisory_lock(hashtext('app-' || k)) FROM generate_series(0, 300) k; \
         SELECT pg_advisory_lock(i, j) FROM generate_series(0, 20) i, generate_series(0, 20) j;",
    )
    .await;
    let client = Client::new(Sql::new(url.clone()));
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(client.session_with(options(10_000)).await.expect("session"));
    }
    let mut tasks: Vec<tokio::task::JoinHandle<lockline::Result<()>>> = Vec::new();
    for session in &sessions {
        let mutex = session.mutex("app-keys").expect("mutex");
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                mutex.lock().await?.release().await?;
            }
            Ok(())
        }));
    }
    for task in tasks {
        step("lockline's contenders", task).await.expect("task").expect("lock");
    }
    let held: Vec<_> = {
        let mut held = Vec::new();
        for i in 0..50 {
            held.push(
                sessions[0]
                    .mutex(&format!("app/{i}"))
                    .expect("mutex")
                    .lock()
                    .await
                    .expect("lock"),
            );
        }
        held
    };
    let mut other = Side::connect(&url).await;
    let free = other
        .int("SELECT count(*) FROM generate_series(301, 5000) k WHERE pg_try_advisory_lock(k)")
        .await;
    assert_eq!(free, 4700, "lockline holds a small advisory-lock key");
    for guard in held {
        guard.release().await.expect("release");
    }
}

/// A clean restart (fast shutdown) of PostgreSQL, which keeps the unlogged
/// tables' rows: every session is lost, the rows left behind block nobody,
/// and tokens after are above every token before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_clean_restart_leaves_no_blocking_row() {
    let mut db = Db::postgres();
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()));
    let (a, b) = (
        client.session_with(options(10_000)).await.expect("session"),
        client.session_with(options(10_000)).await.expect("session"),
    );
    let held = a.mutex("clean").expect("mutex").lock().await.expect("lock");
    let highest = held.token().get();
    let waiter = {
        let mutex = b.mutex("clean").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    let Db::Pg(server) = &mut db else { unreachable!() };
    tokio::task::block_in_place(|| {
        server.stop().expect("stop");
        server.restart().expect("restart");
    });
    step("the holder hears of it", held.lost()).await;
    assert!(step("the waiter fails", waiter).await.expect("task").is_err());
    // Without the restart grace (which holds grants back for the TTL of
    // the sessions before, tested in faults_sql/restarts.rs): what is asked here is
    // whether a row left behind blocks anyone.
    let fresh = Client::new(Sql::new(url.clone()).without_restart_grace())
        .session_with(options(10_000))
        .await
        .expect("session");
    let again = within(Duration::from_secs(5), fresh.mutex("clean").expect("mutex").lock())
        .await
        .expect("a row left by the restart blocks the lock")
        .expect("lock");
    assert!(again.token().get() > highest);
    again.release().await.expect("release");
}

/// A holder whose connections are reset (a load balancer, a NAT or a proxy
/// in between dropping them; the test proxy's `block`, which cuts every
/// connection). The server frees a reset connection's locks at once, as it
/// frees a crashed holder's (which is what hands a SIGKILLed holder's lock
/// on within a second): it cannot tell the two apart. So the next grant may
/// come first, and the holder hears lost() at its next heartbeat, which
/// finds its connection gone: within a keepalive interval of the reset (the
/// SQL chapter says so; fencing tokens cover the window, as for a paused holder).
/// Unlike etcd and ZooKeeper, whose sessions outlive a connection.
async fn a_reset_holder_is_told_within_a_keepalive_interval(db: Db) {
    let url = db.url();
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let ttl = 3000;
    let h = Client::new(Sql::new(db.url_via(&proxy.address())))
        .session_with(options(ttl))
        .await
        .expect("session");
    let held = h.mutex("reset").expect("mutex").lock().await.expect("lock");
    let near = Client::new(Sql::new(url.clone()));
    let w = near.session_with(options(ttl)).await.expect("session");
    let waiter = {
        let mutex = w.mutex("reset").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&near, |s| s.waits >= 1).await;
    let lost = tokio::spawn(async move {
        held.lost().await;
        (Instant::now(), held.is_held(), held.token())
    });
    let reset_at = Instant::now();
    proxy.block();
    let guard = step("the waiter is granted", waiter)
        .await
        .expect("task")
        .expect("lock");
    let (lost_at, still_held, token) = step("the holder hears of it", lost).await.expect("task");
    assert!(!still_held);
    assert!(
        guard.token() > token,
        "the next holder's token is above the reset holder's"
    );
    let keepalive = options(ttl).keepalive_interval();
    assert!(
        lost_at - reset_at <= keepalive + Duration::from_secs(2),
        "the reset holder heard lost() {:?} after the reset (keepalive interval {keepalive:?})",
        lost_at - reset_at
    );
    guard.release().await.expect("release");
    proxy.unblock();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_reset_holder_is_told_within_a_keepalive_interval() {
    a_reset_holder_is_told_within_a_keepalive_interval(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_reset_holder_is_told_within_a_keepalive_interval() {
    a_reset_holder_is_told_within_a_keepalive_interval(Db::mariadb()).await;
}

/// Was a defect, now fixed: a value block written back with an older value.
/// A lock-mode release let go of its entry's guard inside its transaction,
/// before its commit; a read in that window had the rows before the
/// release (the entry, and the block naming it) with the guard free, so the
/// releasing PW or EX holder looked lost. The grant decided from that read
/// wrote the block as it had read it: the released value lost, the older
/// one back, marked not valid. The release now holds the guard (and the
/// value lock) until its transaction ends.
///
/// The window is held open here by a commit that waits for a synchronous
/// standby that never comes (as a slow WAL flush would, longer). X holds EX
/// with `v2` set (over `v1`); D, an NL holder behind it, converts to PR and
/// waits on X; R asks PW and waits on D. X's release reaches its commit;
/// then D's connection ends (no PW or EX holder is lost anywhere) and R
/// reads the queue inside the window. Once the commit goes through, R is
/// granted with `v2`, valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_read_in_a_release_s_commit_window_keeps_the_value_it_wrote() {
    use lockline::LockMode::{Ex, Nl, Pr, Pw};
    let db = Db::postgres();
    let url = db.url();
    let name = "commit-window/block";
    let client = Client::new(Sql::new(url.clone()));
    let options = || options(20_000).with_request_timeout(Duration::from_secs(10));
    let sx = client.session_with(options()).await.expect("session X");
    let sd = client.session_with(options()).await.expect("session D");
    let sr = client.session_with(options()).await.expect("session R");
    let mut side = Side::connect(&url).await;

    let mut first = sx.resource(name).unwrap().lock(Ex).await.expect("EX");
    first.set_value(b"v1").unwrap();
    first.release().await.expect("release");
    let mut x = sx.resource(name).unwrap().lock(Ex).await.expect("EX");
    x.set_value(b"v2").unwrap();
    let mut d = sd.resource(name).unwrap().lock(Nl).await.expect("NL");
    let converting = tokio::spawn(async move {
        let outcome = d.convert(Pr).await;
        (outcome, d)
    });
    let resource = sr.resource(name).unwrap();
    let requesting = tokio::spawn(async move { resource.lock(Pw).await });
    // D's conversion and R's request both wait on the server.
    side.until_at_least(
        "D and R wait on the server",
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%lockline_watch%' AND wait_event_type = 'Lock'",
        2,
    )
    .await;

    // Every commit that waits for its WAL now waits for a standby that is
    // never there. The setting reaches the backends with the reload's
    // signal, which nothing answers: the release below waits at its commit
    // only once it has (checked next).
    side.exec("ALTER SYSTEM SET synchronous_standby_names = 'never_there'")
        .await;
    side.exec("SELECT pg_reload_conf()").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let releasing = tokio::spawn(async move { x.release().await });
    side.until_at_least(
        "X's release waits at its commit",
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
        1,
    )
    .await;
    // D's connection ends: R's wait on D ends, and R reads the queue while
    // X's release waits at its commit. The window is held open a while,
    // whatever R does in it (it may decide and wait again, or be held back
    // by the release's turn on the name).
    side.exec(&format!(
        "SELECT pg_terminate_backend(pid, 5000) FROM lockline_sessions WHERE id = '{}'",
        sd.id()
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    side.exec("ALTER SYSTEM RESET synchronous_standby_names").await;
    side.exec("SELECT pg_reload_conf()").await;
    step("X's release", releasing)
        .await
        .expect("task")
        .expect("X's release, clean");
    let granted = step("R's request", requesting).await.expect("task").expect("PW");
    let _ = converting.await;
    let seen = granted.value();
    assert_eq!(
        (seen.bytes.as_slice(), seen.sequence, seen.valid),
        (&b"v2"[..], 2, true),
        "X released v2 cleanly and no PW or EX holder was lost"
    );
    granted.release().await.expect("release");
}
