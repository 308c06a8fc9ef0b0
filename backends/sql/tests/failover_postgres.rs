//! A failover of PostgreSQL: a primary with a streaming standby, clients
//! reaching it through a proxy that plays a virtual IP, the primary crashed
//! (SIGKILL of every process of it), the standby promoted and the proxy
//! moved to it.
//!
//! On the promoted standby lockline's unlogged tables (entries, sessions)
//! are empty, their identity counter starts over, and no advisory lock of
//! the old primary exists; its logged tables (`lockline_meta`,
//! `lockline_data`, the application's) hold what the standby received.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, until};
use lockline::{Client, Error, SessionOptions, SessionState};
use lockline_sql::{FencedTransaction, Sql};
use lockline_testkit::{PgOptions, PgServer, Replication, TcpProxy};

/// The TTL of the sessions open before the failover: the longest of the
/// old primary's run, so the restart grace after the failover.
const TTL_MS: u64 = 3000;

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_millis(TTL_MS))
        .with_connect_timeout(Duration::from_secs(5))
        .with_request_timeout(Duration::from_secs(2))
}

/// `url` with its `127.0.0.1:PORT` replaced by `address`.
fn via(url: &str, port: u16, address: &str) -> String {
    url.replace(&format!("127.0.0.1:{port}"), address)
}

fn count(server: &PgServer, query: &str) -> i64 {
    let out = server.psql(query).unwrap_or_else(|e| panic!("{query}: {e}"));
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{query} answered {out:?}: {e}"))
}

/// A primary and its standby (fsync off: no test survives a machine crash),
/// and a proxy in front of the primary that the clients use as its address.
fn primary_and_standby(replication: Replication) -> (PgServer, PgServer, TcpProxy) {
    let primary = PgServer::start_with(&PgOptions {
        durable: false,
        ..PgOptions::default()
    })
    .expect("start the primary");
    let standby = primary.start_standby(replication).expect("start the standby");
    let vip = TcpProxy::start(&format!("127.0.0.1:{}", primary.port())).expect("proxy");
    (primary, standby, vip)
}

/// A synchronous standby that has made no restartpoint since lockline's
/// tables were created: the promoted standby's copy of the entries' id
/// counter (an unlogged sequence) is unreadable (a PostgreSQL 15 bug), and
/// the first session opened after the promotion makes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_synchronous_standby_ends_every_session_and_fences_the_old_holder() {
    failover(Replication::Synchronous, Restartpoint::None).await;
}

/// An asynchronous standby that has replayed everything and made a
/// restartpoint since the tables were created (as a standby does within
/// `checkpoint_timeout`): the counter is readable and moved past the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_an_asynchronous_standby_ends_every_session_and_fences_the_old_holder() {
    failover(Replication::Asynchronous, Restartpoint::SinceTheTables).await;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restartpoint {
    /// None since lockline's tables were created.
    None,
    /// One after lockline's tables were created.
    SinceTheTables,
}

/// Before the failover: tokens handed out, a holder with a fenced
/// transaction open on the application's table, two waiters behind it, and
/// a second holder whose path to the database has gone silent (it hears of
/// nothing until its loss deadline). Then the primary crashes, the standby
/// (up for longer than any TTL by then, as a standby in production is) is
/// promoted, and the proxy follows it. After it:
///
/// - the holder is told `lost()` and the waiters fail with `SessionLost`,
///   within the TTL and some slack of the crash;
/// - a fenced transaction committed before the crash is on the new
///   primary;
/// - the open fenced transaction never commits: its commit fails, a fenced
///   transaction the old holder begins on the new primary is refused with
///   `LockLost`, and nothing it wrote is in the application's table;
/// - a fresh session with `Sql::new(url)`'s defaults is granted both locks
///   within the restart grace and some slack of the promotion, with tokens
///   above every token handed out before;
/// - the silent holder hears `lost()` before its lock is granted again:
///   the promoted standby counts the restart grace from its promotion, not
///   from its own start.
async fn failover(replication: Replication, restartpoint: Restartpoint) {
    let (mut primary, standby, vip) = primary_and_standby(replication);
    let url = via(&primary.url(), primary.port(), &vip.address());
    primary
        .psql("CREATE TABLE ledger (token bigint NOT NULL, note text NOT NULL);")
        .expect("create the application's table");

    let client = Client::new(Sql::new(url.clone()));
    let holder = client.session_with(options()).await.expect("session");
    let mut highest = 0;
    for round in 0..20 {
        let guard = holder
            .mutex(&format!("before/{round}"))
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        highest = highest.max(guard.token().get());
        guard.release().await.expect("release");
    }
    let pool = sqlx::PgPool::connect(&url).await.expect("the application's pool");
    let committing = holder.mutex("committed").expect("mutex").lock().await.expect("lock");
    highest = highest.max(committing.token().get());
    let mut committed = FencedTransaction::begin_postgres(&committing, &pool)
        .await
        .expect("begin a fenced transaction");
    sqlx::query("INSERT INTO ledger (token, note) VALUES ($1, 'committed')")
        .bind(i64::try_from(committing.token().get()).expect("token"))
        .execute(&mut *committed)
        .await
        .expect("write in the fenced transaction");
    committed.commit().await.expect("a healthy holder commits");
    committing.release().await.expect("release");
    let held = holder.mutex("failover").expect("mutex").lock().await.expect("lock");
    highest = highest.max(held.token().get());
    let mut fenced = FencedTransaction::begin_postgres(&held, &pool)
        .await
        .expect("begin a fenced transaction");
    sqlx::query("INSERT INTO ledger (token, note) VALUES ($1, 'before')")
        .bind(i64::try_from(held.token().get()).expect("token"))
        .execute(&mut *fenced)
        .await
        .expect("write in the fenced transaction");

    let mut waiters = Vec::new();
    for _ in 0..2 {
        let session = client.session_with(options()).await.expect("session");
        let mutex = session.mutex("failover").expect("mutex");
        waiters.push((session, tokio::spawn(async move { mutex.lock().await })));
    }
    bounded("both waiters wait", client.wait_for_stats(|s| s.waits >= 2)).await;

    let silent_path = TcpProxy::start(&format!("127.0.0.1:{}", primary.port())).expect("proxy");
    let far = Client::new(Sql::new(via(&primary.url(), primary.port(), &silent_path.address())));
    let silent = far.session_with(options()).await.expect("session");
    let silent_held = silent.mutex("grace").expect("mutex").lock().await.expect("lock");
    highest = highest.max(silent_held.token().get());

    // A standby in production has run for hours: let this one's start be
    // older than any TTL, so a grace counted from it would be over.
    until("the standby has been up longer than the TTL", || {
        count(
            &standby,
            "SELECT (extract(epoch from now() - pg_postmaster_start_time()) * 1000)::bigint;",
        ) > i64::try_from(TTL_MS).expect("ttl") + 1000
    })
    .await;
    if replication == Replication::Asynchronous || restartpoint == Restartpoint::SinceTheTables {
        // Asynchronous: what this test asserts needs the meta row of the
        // longest TTL on the standby (docs/sql.md, "Failover"), so it waits
        // until the standby has replayed the primary's writes. A standby
        // makes a restartpoint when asked only after replaying a checkpoint.
        if restartpoint == Restartpoint::SinceTheTables {
            primary.psql("CHECKPOINT;").expect("checkpoint the primary");
        }
        let lsn = primary
            .psql("SELECT pg_current_wal_lsn();")
            .expect("the primary's position");
        let lsn = lsn.trim().to_owned();
        until("the standby has replayed the primary's writes", || {
            count(
                &standby,
                &format!("SELECT (pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn)::int;"),
            ) == 1
        })
        .await;
        if restartpoint == Restartpoint::SinceTheTables {
            standby.psql("CHECKPOINT;").expect("a restartpoint of the standby");
        }
    }

    silent_path.blackhole();
    let silent_lost = tokio::spawn(async move {
        silent_held.lost().await;
        (Instant::now(), silent_held)
    });
    let crashed_at = Instant::now();
    let failed_over = tokio::task::spawn_blocking(move || {
        primary.crash().expect("crash the primary");
        standby.promote().expect("promote the standby");
        vip.retarget(&format!("127.0.0.1:{}", standby.port()))
            .expect("retarget");
        (primary, standby, vip, Instant::now())
    });

    bounded("the holder hears of it", held.lost()).await;
    let held_lost_at = Instant::now();
    assert!(!held.is_held());
    for (session, waiter) in waiters {
        match bounded("the waiter fails", waiter).await.expect("task") {
            Err(Error::SessionLost { .. }) => {}
            other => panic!("a waiter whose database failed over must fail with SessionLost, got {other:?}"),
        }
        assert_eq!(session.state(), SessionState::Lost);
    }
    let waiters_failed_at = Instant::now();
    let slack = Duration::from_secs(3);
    for (what, at) in [
        ("the holder's lost()", held_lost_at),
        ("the waiters' SessionLost", waiters_failed_at),
    ] {
        assert!(
            at - crashed_at < Duration::from_millis(TTL_MS) + slack,
            "{what} came {:?} after the crash (TTL {TTL_MS} ms)",
            at - crashed_at
        );
    }
    assert_eq!(holder.state(), SessionState::Lost);
    let commit = fenced.commit().await;
    assert!(
        commit.is_err(),
        "a fenced transaction begun on the old primary committed after its crash"
    );

    let (_primary, standby, vip, promoted_at) = bounded("the failover", failed_over).await.expect("failover");

    // The old holder, told it lost its lock, tries again on the new primary
    // anyway: refused.
    let mut stale = FencedTransaction::begin_postgres(&held, &pool)
        .await
        .expect("begin a fenced transaction on the new primary");
    sqlx::query("INSERT INTO ledger (token, note) VALUES ($1, 'after')")
        .bind(i64::try_from(held.token().get()).expect("token"))
        .execute(&mut *stale)
        .await
        .expect("write in the fenced transaction");
    match stale.commit().await {
        Err(Error::LockLost { .. }) => {}
        other => {
            panic!("a stale holder's fenced commit on the new primary must be refused with LockLost, got {other:?}")
        }
    }
    assert_eq!(
        count(&standby, "SELECT count(*) FROM ledger WHERE note <> 'committed';"),
        0,
        "a write of the old holder's fenced transactions is on the new primary"
    );
    // Synchronous: the commit returned once the standby had it. (The
    // asynchronous case waited for the standby to replay it.)
    assert_eq!(
        count(&standby, "SELECT count(*) FROM ledger WHERE note = 'committed';"),
        1,
        "a fenced transaction committed before the failover is not on the new primary"
    );

    let near = Client::new(Sql::new(url));
    let fresh = bounded("a new session", near.session()).await.expect("a new session");
    let again = bounded("the lock again", fresh.mutex("failover").expect("mutex").lock())
        .await
        .expect("lock again");
    let grace = bounded(
        "the silent holder's lock again",
        fresh.mutex("grace").expect("mutex").lock(),
    )
    .await
    .expect("lock again");
    let granted_at = Instant::now();
    let (silent_lost_at, silent_held) = bounded("the silent holder hears of it", silent_lost)
        .await
        .expect("task");
    assert!(
        silent_lost_at <= granted_at,
        "the silent holder's lock was granted again {:?} before it was told",
        silent_lost_at - granted_at
    );
    assert!(
        granted_at - promoted_at < Duration::from_millis(TTL_MS) + slack,
        "the locks were granted {:?} after the promotion (restart grace {TTL_MS} ms)",
        granted_at - promoted_at
    );
    for token in [again.token(), grace.token()] {
        assert!(
            token.get() > highest,
            "token {token} after the failover is not above {highest} from before"
        );
    }
    assert!(grace.token() > silent_held.token());
    again.release().await.expect("release");
    grace.release().await.expect("release");
    fresh.close().await.expect("close");
    until("no row is left", || {
        count(&standby, "SELECT count(*) FROM lockline_entries;") == 0
    })
    .await;
    silent_path.heal();
    drop((silent, holder, vip));
}

/// Tables a DBA made (the DDL script) for a user who owns none of them,
/// and a standby promoted before its first restartpoint since: the id
/// counter cannot be read there, and only the table's owner can make it
/// again. The user's first session is refused with `PermissionDenied`
/// naming the statement; once the owner has run it (and granted the new
/// sequence), sessions open and tokens are above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_that_lost_the_counter_of_a_dbas_tables_needs_their_owner() {
    let (mut primary, standby, vip) = primary_and_standby(Replication::Synchronous);
    let ddl = Sql::new(primary.url()).ddl().expect("ddl");
    primary.psql(&ddl).expect("run the DDL script");
    primary.create_user("app", "secret").expect("create user");
    let grants = "GRANT SELECT, INSERT, UPDATE, DELETE ON lockline_entries, lockline_sessions, lockline_meta, lockline_data, lockline_blocks TO app; \
                  GRANT USAGE, SELECT, UPDATE ON SEQUENCE lockline_entries_id_seq TO app;";
    primary.psql(grants).expect("grant");
    let url = via(
        &primary.url_for("app", "secret", "postgres"),
        primary.port(),
        &vip.address(),
    );
    let app = Client::new(Sql::new(url).without_creating_tables());
    let before = app.session_with(options()).await.expect("session");
    let guard = before.mutex("dba").expect("mutex").lock().await.expect("lock");
    let highest = guard.token().get();
    guard.release().await.expect("release");
    before.close().await.expect("close");

    let (_primary, standby, vip) = bounded(
        "the failover",
        tokio::task::spawn_blocking(move || {
            primary.crash().expect("crash the primary");
            standby.promote().expect("promote the standby");
            vip.retarget(&format!("127.0.0.1:{}", standby.port()))
                .expect("retarget");
            (primary, standby, vip)
        }),
    )
    .await
    .expect("failover");

    match app.session_with(options()).await {
        Err(Error::PermissionDenied { reason, .. }) => assert!(
            reason.contains("ALTER TABLE") && reason.contains("DROP IDENTITY"),
            "the refusal must name the statement to run: {reason}"
        ),
        other => panic!("a session of a user who does not own the tables must be refused, got {other:?}"),
    }
    standby
        .psql(&format!(
            "ALTER TABLE lockline_entries ALTER COLUMN id DROP IDENTITY, ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY; {grants}"
        ))
        .expect("the owner makes the counter again");
    let after = bounded("a session after the fix", app.session_with(options()))
        .await
        .expect("session");
    let guard = bounded("the lock after the fix", after.mutex("dba").expect("mutex").lock())
        .await
        .expect("lock");
    assert!(
        guard.token().get() > highest,
        "token {} after the failover is not above {highest} from before",
        guard.token()
    );
    guard.release().await.expect("release");
    after.close().await.expect("close");
    drop(vip);
}

/// A crashed backend while the synchronous standby is down: the postmaster
/// reinitializes (unlogged tables and the counter emptied, its start
/// unchanged), and the first session's open moves the counter at once (a
/// sequence's `setval`) while its grace commits only when the standby is
/// back. A second opener must not take the moved counter for no restart: it
/// waits for that commit (its open fails with `Unavailable` after the
/// holding connection's lock timeout, and is tried again), and no grant
/// comes before the old holder's `lost()`. The randomized fault test found
/// a grant 0.3 s after a backend's crash, the standby reconnecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_held_up_by_a_synchronous_standby_is_not_skipped() {
    let (primary, mut standby, _vip) = primary_and_standby(Replication::Synchronous);
    let address = format!("127.0.0.1:{}", primary.port());
    let far = TcpProxy::start(&address).expect("proxy");
    let url = primary.url();
    let holder = Client::new(Sql::new(url.replace(&address, &far.address())))
        .session_with(options())
        .await
        .expect("session");
    let held = holder.mutex("held-up").expect("mutex").lock().await.expect("lock");
    far.blackhole();
    let lost = tokio::spawn(async move {
        held.lost().await;
        Instant::now()
    });
    standby.member().kill().expect("stop the standby");
    // A backend killed as the OOM killer would: the postmaster ends every
    // session and reinitializes.
    let pid = primary
        .psql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() LIMIT 1;")
        .expect("a backend");
    let pid: libc::pid_t = pid.trim().parse().expect("a pid");
    // SAFETY: kill(2) on a backend of the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill backend {pid}");
    let counter = "SELECT pg_sequence_last_value(pg_get_serial_sequence('lockline_entries', 'id')) IS NULL;";
    until("the server is back, its counter emptied", || {
        primary.psql(counter).is_ok_and(|out| out.trim() == "t")
    })
    .await;
    let near = Client::new(Sql::new(url));
    // Its open moves the counter, then waits for the standby to commit.
    let first = {
        let near = near.clone();
        tokio::spawn(async move { near.session_with(options()).await })
    };
    until("the first open moved the counter", || {
        primary.psql(counter).is_ok_and(|out| out.trim() == "f")
    })
    .await;
    let second = {
        let near = near.clone();
        tokio::spawn(async move {
            let session = loop {
                match near.session_with(options()).await {
                    Ok(session) => break session,
                    Err(Error::Unavailable { .. }) => continue,
                    Err(error) => return Err(error),
                }
            };
            let guard = session.mutex("held-up")?.lock().await?;
            Ok::<_, Error>((Instant::now(), guard, session))
        })
    };
    // Down for a second more, then back: the first open commits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let standby = tokio::task::spawn_blocking(move || {
        standby.restart().expect("the standby again");
        standby
    })
    .await
    .expect("standby");
    let (granted_at, guard, session) = bounded("the second opener is granted", second)
        .await
        .expect("task")
        .expect("lock");
    let lost_at = bounded("the old holder hears of it", lost).await.expect("task");
    assert!(
        lost_at <= granted_at,
        "the next holder was granted {:?} before the old holder was told",
        lost_at - granted_at
    );
    guard.release().await.expect("release");
    session.close().await.expect("close");
    let first = bounded("the first open", first).await.expect("task").expect("session");
    first.close().await.expect("close");
    drop((holder, standby, far, primary));
}
