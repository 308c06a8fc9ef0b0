//! A failover of MariaDB: a primary with a replica (asynchronous, by GTID),
//! clients reaching it through a proxy that plays a virtual IP, the primary
//! killed (SIGKILL), the replica promoted once it applied what it received,
//! and the proxy moved to it.
//!
//! Every InnoDB table of lockline is replicated, its entries and sessions
//! too, so the promoted replica has the old rows; the `GET_LOCK` guards are
//! not, so every old entry there is dead (its guard free).

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, until};
use lockline::{Client, Error, SessionOptions, SessionState};
use lockline_sql::{FencedTransaction, Sql};
use lockline_testkit::{MariaDbOptions, MariaDbServer, TcpProxy};

/// The TTL of the sessions open before the failover.
const TTL_MS: u64 = 3000;

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_millis(TTL_MS))
        .with_connect_timeout(Duration::from_secs(5))
        .with_request_timeout(Duration::from_secs(2))
}

fn count(server: &MariaDbServer, query: &str) -> i64 {
    let out = server.sql(query).unwrap_or_else(|e| panic!("{query}: {e}"));
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{query} answered {out:?}: {e}"))
}

fn uptime_s(server: &MariaDbServer) -> i64 {
    count(
        server,
        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'",
    )
}

/// Before the failover: tokens handed out, a holder with a fenced
/// transaction open, two waiters, and a holder whose path has gone silent.
/// Then the primary is killed, the replica promoted and the proxy moved.
/// After it:
///
/// - the holder is told `lost()` and the waiters fail with `SessionLost`
///   within the TTL and some slack of the kill;
/// - the open fenced transaction never commits, and one the old holder
///   begins on the new primary is refused with `LockLost`;
/// - a fresh session with `Sql::new(url)`'s defaults is granted both locks
///   (the old rows replicated there are dead and passed over), with tokens
///   above every token handed out before;
/// - the silent holder hears `lost()` before its lock is granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_ends_every_session_and_fences_the_old_holder() {
    let settings = |extra: &[(&str, &str)]| MariaDbOptions {
        innodb_flush_log_at_trx_commit: 2,
        settings: extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..MariaDbOptions::default()
    };
    let mut primary =
        MariaDbServer::start_with(&settings(&[("log-bin", "primary-bin"), ("server-id", "1")])).expect("primary");
    // lockline tells servers apart by their start, read to the second: a
    // replica started within 2.5 s of its primary is taken for it
    // (docs/sql.md, "Failover").
    until("the primary has been up 3 s", || uptime_s(&primary) >= 3).await;
    let replica = primary.start_replica(&settings(&[])).expect("replica");
    primary.create_database("lockline").expect("create database");
    primary
        .sql("CREATE TABLE lockline.ledger (token BIGINT NOT NULL, note VARCHAR(32) NOT NULL) ENGINE = InnoDB")
        .expect("create the application's table");
    let vip = TcpProxy::start(&format!("127.0.0.1:{}", primary.port())).expect("proxy");
    let primary_url = format!("{}/lockline", primary.url());
    let url = primary_url.replace(&format!("127.0.0.1:{}", primary.port()), &vip.address());

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
    let pool = sqlx::MySqlPool::connect(&url).await.expect("the application's pool");
    let held = holder.mutex("failover").expect("mutex").lock().await.expect("lock");
    highest = highest.max(held.token().get());
    let mut fenced = FencedTransaction::begin_mysql(&held, &pool)
        .await
        .expect("begin a fenced transaction");
    sqlx::query("INSERT INTO ledger (token, note) VALUES (?, 'before')")
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
    let far = Client::new(Sql::new(
        primary_url.replace(&format!("127.0.0.1:{}", primary.port()), &silent_path.address()),
    ));
    let silent = far.session_with(options()).await.expect("session");
    let silent_held = silent.mutex("grace").expect("mutex").lock().await.expect("lock");
    highest = highest.max(silent_held.token().get());
    // A replica in production has run for hours: let this one's start be
    // older than any TTL, so a grace counted from it would be over.
    until("the replica has been up longer than the TTL", || {
        uptime_s(&replica) * 1000 > i64::try_from(TTL_MS).expect("ttl") + 1000
    })
    .await;

    silent_path.blackhole();
    let silent_lost = tokio::spawn(async move {
        silent_held.lost().await;
        (Instant::now(), silent_held)
    });
    let crashed_at = Instant::now();
    let failed_over = tokio::task::spawn_blocking(move || {
        primary.member().kill().expect("kill the primary");
        replica.promote().expect("promote the replica");
        vip.retarget(&format!("127.0.0.1:{}", replica.port()))
            .expect("retarget");
        (primary, replica, vip, Instant::now())
    });

    bounded("the holder hears of it", held.lost()).await;
    let held_lost_at = Instant::now();
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
    assert!(
        fenced.commit().await.is_err(),
        "a fenced transaction begun on the old primary committed after its crash"
    );
    let (_primary, replica, vip, promoted_at) = bounded("the failover", failed_over).await.expect("failover");

    let mut stale = FencedTransaction::begin_mysql(&held, &pool)
        .await
        .expect("begin a fenced transaction on the new primary");
    sqlx::query("INSERT INTO ledger (token, note) VALUES (?, 'after')")
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
        count(&replica, "SELECT COUNT(*) FROM lockline.ledger"),
        0,
        "a write of the old holder's fenced transactions is on the new primary"
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
    silent_path.heal();
    drop((silent, holder, vip, replica));
}
