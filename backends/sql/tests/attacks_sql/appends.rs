//! Appends: racing ones, one stalled or cut midway, one waiting on a row
//! lock, one that fails after taking its guard.

use super::*;

/// Many sessions race `try_lock` on one free lock: never two holders at
/// once, and each grant's token is above the one before.
async fn racing_try_locks_never_grant_two(db: Db) {
    let client = Client::new(Sql::new(db.url()));
    let mut sessions = Vec::new();
    for _ in 0..8 {
        sessions.push(client.session_with(options(10_000)).await.expect("session"));
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let stop_at = Instant::now() + Duration::from_secs(12);
    let mut tasks = Vec::new();
    for session in &sessions {
        let mutex = session.mutex("race").expect("mutex");
        let (holders, grants, overlaps) = (holders.clone(), grants.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                let t = Instant::now();
                let tried = mutex.try_lock().await;
                if t.elapsed() > Duration::from_millis(500) {
                    eprintln!(
                        "slow try_lock {:?}: {:?}",
                        t.elapsed(),
                        tried.as_ref().map(|g| g.is_some())
                    );
                }
                let Some(guard) = tried.expect("try_lock") else {
                    continue;
                };
                if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                grants.lock().unwrap().push(guard.token().get());
                tokio::time::sleep(Duration::from_millis(3)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        step("a racer ends", task).await.expect("racer");
    }
    let grants = grants.lock().unwrap().clone();
    let backwards = grants.windows(2).filter(|w| w[1] <= w[0]).count();
    eprintln!(
        "{} grants, {} overlaps, {} tokens not above the one before",
        grants.len(),
        overlaps.load(Ordering::SeqCst),
        backwards
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(backwards, 0, "a grant's token was not above the previous grant's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_racing_try_locks_never_grant_two() {
    racing_try_locks_never_grant_two(Db::mariadb()).await;
}

/// Two appends racing on MariaDB, made certain: an append (A) whose id is allocated and
/// whose row is in the table but not yet in the (name, id) index, held
/// there by a REPEATABLE READ transaction of the test's own that gap-locks
/// part of the `attempt` index (an insert into that gap waits after the row
/// itself is written). A quick append (B) with a larger id meanwhile must
/// not be granted, and once A goes on, never both.
async fn a_stalled_append_with_a_smaller_id_is_not_passed(db: Db) {
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()));
    let a = client.session_with(options(10_000)).await.expect("session");
    let mut bs = Vec::new();
    for _ in 0..4 {
        bs.push(client.session_with(options(10_000)).await.expect("session"));
    }
    let mut side = Side::connect(&url).await;
    // A table in use holds entries of many names (here dead ones of other
    // locks), so the queue is read through the (name, id) index. The
    // sentinel, whose `attempt` bounds the gap locked below, sorts after
    // the lock's name and is never touched by its reads.
    side.exec(
        "INSERT INTO lockline_entries (name, kind, session, attempt, value) \
         SELECT CONCAT('filler/', seq), 'mutex', 'filler', CONCAT('z', seq), '' FROM seq_1_to_5000",
    )
    .await;
    side.exec("INSERT INTO lockline_entries (name, kind, session, attempt, value) VALUES ('zzz-sentinel', 'mutex', 'sentinel', '8', '')")
        .await;
    side.exec("ANALYZE TABLE lockline_entries").await;
    let mut looker = Side::connect(&url).await;
    for _round in 0..20 {
        side.exec("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .await;
        side.exec("BEGIN").await;
        side.exec("SELECT id FROM lockline_entries FORCE INDEX (entries_attempt) WHERE attempt < '8' FOR UPDATE")
            .await;
        let mut a_lock = {
            let mutex = a.mutex("stalled").expect("mutex");
            tokio::spawn(async move { mutex.lock().await })
        };
        // A's attempt id falls in the locked gap half of the time.
        let stalled = within(Duration::from_millis(500), async {
            loop {
                let waits = looker
                    .int(
                        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                         WHERE INFO LIKE 'INSERT INTO `lockline`.`lockline_entries`%' AND TIME_MS > 100",
                    )
                    .await;
                if waits > 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .is_some();
        if !stalled {
            side.exec("COMMIT").await;
            let held = step("A's lock", &mut a_lock).await.expect("task").expect("lock");
            held.release().await.expect("release");
            continue;
        }
        // A waits inside its INSERT, its id taken (for at most its row-lock
        // wait, 1 s). B tries from four sessions at once (one of them
        // surely outside the locked gap; those inside wait there too).
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for b in &bs {
            let mutex = b.mutex("stalled").expect("mutex");
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(mutex.try_lock().await);
            });
        }
        drop(tx);
        let mut granted = Vec::new();
        let _ = within(Duration::from_millis(400), async {
            while let Some(tried) = rx.recv().await {
                if let Ok(Some(guard)) = tried {
                    granted.push(guard);
                    return;
                }
            }
        })
        .await;
        side.exec("COMMIT").await;
        let a_first = within(Duration::from_secs(3), &mut a_lock).await;
        while let Some(tried) = step("B's other tries", rx.recv()).await {
            if let Ok(Some(guard)) = tried {
                granted.push(guard);
            }
        }
        let Some(a_held) = a_first else {
            // A's INSERT gave up its row-lock wait and A queued again, behind
            // B: no overlap this round.
            for g in granted {
                g.release().await.expect("release");
            }
            step("A's lock", a_lock)
                .await
                .expect("task")
                .expect("lock")
                .release()
                .await
                .expect("release");
            continue;
        };
        let a_held = a_held.expect("task").expect("lock");
        let both: Vec<_> = granted.iter().filter(|g| g.is_held()).map(|g| g.token()).collect();
        assert!(
            both.is_empty() || !a_held.is_held(),
            "two holders at once: A (token {}, appended first) and {:?} (appended while A's INSERT was in flight)",
            a_held.token(),
            both
        );
        for g in granted {
            g.release().await.expect("release");
        }
        a_held.release().await.expect("release");
        return;
    }
    panic!("A's append never fell into the locked gap in 20 rounds");
}

// Regression test: before 89f8825 (appends serialized by a row lock on the
// name, lockline_names; since layout 2 by the name's turn in the append
// procedure) this granted two holders: InnoDB allocates the
// AUTO_INCREMENT id before the row reaches the (name, id) index the
// append's locking read scans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_stalled_append_with_a_smaller_id_is_not_passed() {
    a_stalled_append_with_a_smaller_id_is_not_passed(Db::mariadb()).await;
}

/// Holds the next append to `name` on the server at its first step that
/// takes a row lock, through a transaction of `side`'s own; returns the
/// statement that finds `looker` the append waiting.
async fn block_appends(db: &Db, side: &mut Side, name: &str) -> &'static str {
    if !db.is_postgres() {
        side.exec("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .await;
    }
    side.exec("BEGIN").await;
    if db.is_postgres() {
        // Every append inserts into the entries table.
        side.exec("LOCK TABLE lockline_entries IN SHARE MODE").await;
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query LIKE 'SELECT e_id, e_kind, e_session FROM %append%'"
    } else {
        // Every append inserts into the entries table (with its turn on
        // `name` taken): next-key locks on the whole attempt index, up to
        // its end, make that insert wait.
        let _ = name;
        side.exec("SELECT id FROM lockline_entries FORCE INDEX (entries_attempt) FOR UPDATE")
            .await;
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE INFO LIKE 'INSERT INTO `lockline`.`lockline_entries`%'"
    }
}

/// A contender silently cut off in the middle of its append (here: right
/// after the server took the append's first row lock): it is no holder,
/// its session is lost at ttl - margin, and the lock must stay usable for
/// everyone else: the next contender is granted within a bound.
async fn a_cut_during_an_append_leaves_the_lock_usable(db: Db) {
    let url = db.url();
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    let near = Client::new(Sql::new(url.clone()));
    // Long enough to live through the set-up on a machine busier than two
    // CPU hogs make it (a 2 s TTL was lost there before the cut).
    let ttl = 4000;
    let cut = far.session_with(options(ttl)).await.expect("session");
    // A long TTL for the healthy contender: its own appends may wait on a
    // row lock on its one connection (see
    // a_row_lock_wait_does_not_lose_a_healthy_session).
    let other = near.session_with(options(10_000)).await.expect("session");
    // The lock has been used before (its name row exists).
    other
        .mutex("appending")
        .expect("mutex")
        .lock()
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    let mut side = Side::connect(&url).await;
    let mut looker = Side::connect(&url).await;
    let waiting = block_appends(&db, &mut side, "appending").await;
    let cut_append = {
        let mutex = cut.mutex("appending").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    looker.until("the append waits on the server", waiting, |n| n > 0).await;
    proxy.blackhole();
    side.exec("COMMIT").await;
    // The cut contender's session ends on its side.
    step("the cut session is lost", cut.lost()).await;
    let started = Instant::now();
    let next = within(
        Duration::from_millis(ttl) + Duration::from_secs(10),
        other.mutex("appending").expect("mutex").lock(),
    )
    .await;
    let next = next.unwrap_or_else(|| {
        panic!(
            "the lock is unusable {:?} after a contender was cut off during its append (it never held it)",
            started.elapsed()
        )
    });
    next.expect("lock").release().await.expect("release");
    cut_append.abort();
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_cut_during_an_append_leaves_the_lock_usable() {
    a_cut_during_an_append_leaves_the_lock_usable(Db::postgres()).await;
}

// Was a defect, now fixed (liveness, MariaDB/MySQL): my.rs `append` (since 89f8825) holds the
// name's row of lockline_names in a transaction across round trips
// (BEGIN, INSERT names, INSERT entries, COMMIT) on the owning connection,
// whose wait_timeout lockline sets to a year. A silent cut between the
// name's lock and COMMIT leaves that row locked by a connection the server
// still believes in; its entry is uncommitted, so no waiter ever sees it or
// reaps its session, and every later append to the name fails its row-lock
// wait and retries: the lock is unusable until TCP gives up (hours).
// Since layout 2 the append is one procedure call that holds nothing past
// it; appends_mariadb.rs freezes the guard connection alone mid-append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_cut_during_an_append_leaves_the_lock_usable() {
    a_cut_during_an_append_leaves_the_lock_usable(Db::mariadb()).await;
}

/// A healthy session (TTL 2 s, as the fault tests use) whose acquire waits
/// on the server for a row another transaction holds for a few seconds:
/// its connection is fine and the server answers, so it must not be
/// declared lost.
async fn a_row_lock_wait_does_not_lose_a_healthy_session(db: Db) {
    attack_kit::log_warnings();
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()));
    let session = client.session_with(options(2000)).await.expect("session");
    session
        .mutex("busy-row")
        .expect("mutex")
        .lock()
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    let mut side = Side::connect(&url).await;
    let mut looker = Side::connect(&url).await;
    let waiting = block_appends(&db, &mut side, "busy-row").await;
    let mut states = session.watch_state();
    let acquire = {
        let mutex = session.mutex("busy-row").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    looker.until("the append waits on the server", waiting, |n| n > 0).await;
    // Held for 10 s (five TTLs): the session must stay Live or Suspended.
    let t0 = Instant::now();
    let lost = within(Duration::from_secs(10), states.wait_for(|s| *s == SessionState::Lost))
        .await
        .map(|_| t0.elapsed());
    side.exec("COMMIT").await;
    assert!(
        lost.is_none(),
        "a healthy session was declared lost {lost:?} after its append began waiting on a row lock"
    );
    let guard = step("the acquire", acquire).await.expect("task").expect("lock");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_row_lock_wait_does_not_lose_a_healthy_session() {
    a_row_lock_wait_does_not_lose_a_healthy_session(Db::postgres()).await;
}

// Was a defect, now fixed (availability; seen on MariaDB/MySQL with TTL 2 s): the session is
// declared lost ("no renewal confirmed within ttl - safety margin") though
// every heartbeat is answered. session.rs:262 takes a renewal's send time
// before it waits for the owning connection, which the session's own
// statements hold (on_owner!); session.rs:258 then schedules the next one an
// interval after the renewal *completed*, capped at confirmed + loss
// deadline. A renewal that waited loss - interval (0.93 s at TTL 2 s) behind
// another statement leaves the next one scheduled at the deadline itself:
// lost at once. On MariaDB one row-lock wait of the owner lasts 1 s
// (my.rs:581 rounds lib.rs:287's keepalive / 2 up to whole seconds), so
// any TTL under about 3 s loses a healthy session whose append waits on a
// row (another append's name row, a fenced commit's row); on PostgreSQL the
// wait is keepalive / 2 in ms and the same TTL holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_row_lock_wait_does_not_lose_a_healthy_session() {
    a_row_lock_wait_does_not_lose_a_healthy_session(Db::mariadb()).await;
}

// Was a defect, now fixed (resource leak, PostgreSQL): pg.rs `lockline_append` took the
// entry's session-level guard (pg_try_advisory_lock) inside the function's
// transaction, before `nearest`; when `nearest` then failed (its DELETE of a
// dead entry hitting lock_timeout on a row a fenced commit holds FOR SHARE,
// or LL001), the INSERT rolled back but the session-level lock stayed, and
// each retry of the append leaked one more: entries in the server's shared
// lock table (max_locks_per_transaction x max_connections, shared with every
// table lock of every application) for as long as the session lives.
// (Fails at 2dbe68e; fixed by 9cd4858: now a regression test.)
/// An append on PostgreSQL that fails after taking its entry's guard: the
/// entry before it is dead and its row is locked FOR SHARE by a fenced
/// commit in flight (here a transaction of the test's own), so the
/// append's DELETE of it times out and the append is retried until the
/// row is let go. Afterwards the session must hold one advisory lock per
/// entry it has, and none once it released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_failed_append_leaves_no_advisory_lock() {
    let db = Db::postgres();
    let url = db.url();
    let client = Client::new(Sql::new(url.clone()));
    let session = client.session_with(options(2000)).await.expect("session");
    let mut side = Side::connect(&url).await;
    // A dead entry (its guard is free) under the lock's name.
    side.exec(
        "INSERT INTO lockline_entries (name, kind, session, attempt) VALUES ('leak', 'mutex', 'ghost', 'ghost-attempt')",
    )
    .await;
    side.exec("BEGIN").await;
    side.exec("SELECT 1 FROM lockline_entries WHERE attempt = 'ghost-attempt' FOR SHARE")
        .await;
    let acquire = {
        let mutex = session.mutex("leak").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    let mut looker = Side::connect(&url).await;
    let held_by_session = format!(
        "SELECT count(*) FROM pg_locks l JOIN lockline_sessions s ON l.pid = s.pid \
         WHERE s.id = '{}' AND l.locktype = 'advisory' AND l.granted",
        session.id()
    );
    // A few appends fail (lock_timeout) while the row is held.
    looker
        .until(
            "an append waits on the dead row",
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT e_id%append%'",
            |n| n > 0,
        )
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    side.exec("COMMIT").await;
    let guard = step("the acquire", acquire).await.expect("task").expect("lock");
    let while_held = looker.int(&held_by_session).await;
    guard.release().await.expect("release");
    let after = looker.int(&held_by_session).await;
    assert_eq!(
        (while_held, after),
        (1, 0),
        "advisory locks held by the session's connection while it holds one lock, and after it released it"
    );
}
