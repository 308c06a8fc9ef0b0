//! The database's fence (`lockline_fence(KEY)`) against a caller that tries
//! to make a lost lock's transaction commit: orders of events around the
//! loss, isolation levels, the caller's own name resolution, odd keys.
//!
//! The holder's loss is its owning connection ending (as a crash or a reset
//! would): its guard comes free at once, its entry row stays, dead, until the
//! next contender deletes it.

use std::time::Duration;

use lockline::conformance::{bounded, until};
use lockline::{Client, MutexGuard, Session};
use lockline_sql::{Sql, NOT_HELD_MYSQL, NOT_HELD_POSTGRES};
use sqlx::{Connection, Executor, MySqlConnection};

#[macro_use]
mod support;

use support::db::Db;
use support::options;

async fn session(db: &Db) -> Session {
    Client::new(Sql::new(db.url()))
        .session_with(options(10_000))
        .await
        .expect("session")
}

/// Ends the session's owning connection, as a crash or a reset would: its
/// guards come free, its rows stay.
fn cut(db: &Db, session: &Session) {
    let id = session.id();
    if db.is_postgres() {
        db.sql(&format!(
            "SELECT pg_terminate_backend(pid, 5000) FROM lockline_sessions WHERE id = '{id}'"
        ));
    } else {
        let conn = db.sql(&format!("SELECT conn FROM lockline_sessions WHERE id = '{id}'"));
        // KILL only flags the connection: its guards come free when its
        // thread has ended, a moment later.
        db.end_connection(conn.trim());
    }
}

fn create_table(db: &Db) {
    db.sql("CREATE TABLE fenced_writes (token bigint NOT NULL)");
}

fn writes_of(db: &Db, token: u64) -> i64 {
    db.count(&format!("SELECT count(*) FROM fenced_writes WHERE token = {token}"))
}

/// An application's connection of either engine, as a driver other than
/// lockline's would use it: statements, one at a time.
enum App {
    Pg(tokio_postgres::Client),
    My(MySqlConnection),
}

/// A PostgreSQL error as the tests compare it: its SQLSTATE, then its message.
fn pg_refusal(e: &tokio_postgres::Error) -> String {
    let code = e.code().map(|c| c.code().to_owned()).unwrap_or_default();
    format!("{code} {}", e.as_db_error().map(|d| d.message()).unwrap_or(""))
}

/// A MariaDB error as the tests compare it: its SQLSTATE, then its message.
fn my_refusal(e: &sqlx::Error) -> String {
    let db = e.as_database_error();
    let code = db.and_then(|d| d.code()).map(|c| c.into_owned()).unwrap_or_default();
    format!("{code} {}", db.map(|d| d.message()).unwrap_or(""))
}

impl App {
    async fn connect(url: &str) -> App {
        if url.starts_with("postgres") {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .expect("connect with tokio-postgres");
            tokio::spawn(connection);
            App::Pg(client)
        } else {
            App::My(MySqlConnection::connect(url).await.expect("connect with sqlx"))
        }
    }

    async fn sql(&mut self, statement: &str) -> Result<(), String> {
        match self {
            App::Pg(client) => client.batch_execute(statement).await.map_err(|e| pg_refusal(&e)),
            App::My(conn) => conn
                .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned())))
                .await
                .map(|_| ())
                .map_err(|e| my_refusal(&e)),
        }
    }

    /// Ends `session`'s owning connection, as [`cut`] does, without blocking.
    async fn cut(&mut self, session: &str) {
        match self {
            App::Pg(client) => {
                client
                    .batch_execute(&format!(
                        "SELECT pg_terminate_backend(pid, 5000) FROM lockline_sessions WHERE id = '{session}'"
                    ))
                    .await
                    .expect("terminate");
            }
            App::My(conn) => {
                let owner: i64 = sqlx::query_scalar("SELECT conn FROM lockline_sessions WHERE id = ?")
                    .bind(session)
                    .fetch_one(&mut *conn)
                    .await
                    .expect("the session's connection");
                let _ = conn
                    .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {owner}"))))
                    .await;
            }
        }
    }

    /// Writes `token` to the fenced table, in the transaction open (if any).
    async fn write(&mut self, token: u64) {
        self.sql(&format!("INSERT INTO fenced_writes (token) VALUES ({token})"))
            .await
            .expect("insert");
    }

    /// The fenced writes of `token`, read without blocking.
    async fn writes_of(&mut self, token: u64) -> i64 {
        let query = format!("SELECT count(*) FROM fenced_writes WHERE token = {token}");
        match self {
            App::Pg(client) => client.query_one(&query, &[]).await.expect("count").get(0),
            App::My(conn) => sqlx::query_scalar(sqlx::AssertSqlSafe(query))
                .fetch_one(&mut *conn)
                .await
                .expect("count"),
        }
    }

    /// Calls the fence with `key`: Ok, or the SQLSTATE and message.
    async fn fence(&mut self, key: &str) -> Result<(), String> {
        match self {
            App::Pg(client) => client
                .query_one("SELECT lockline_fence($1)", &[&key])
                .await
                .map(|_| ())
                .map_err(|e| pg_refusal(&e)),
            App::My(conn) => sqlx::query("CALL lockline_fence(?)")
                .bind(key)
                .execute(&mut *conn)
                .await
                .map(|_| ())
                .map_err(|e| my_refusal(&e)),
        }
    }
}

fn not_held(db: &Db) -> &'static str {
    if db.is_postgres() {
        NOT_HELD_POSTGRES
    } else {
        NOT_HELD_MYSQL
    }
}

async fn held(db: &Db, session: &Session, name: &str) -> (MutexGuard, String, u64) {
    let guard = session.mutex(name).expect("mutex").lock().await.expect("lock");
    let key = guard.key().to_owned();
    let token = guard.token().get();
    let _ = db;
    (guard, key, token)
}

/// A lock held by a session of its own, then lost by [`cut`]: the session
/// and the guard (kept: dropping them would clean up what the test looks
/// at), the lock's key and its token.
async fn lost(db: &Db, name: &str) -> (Session, MutexGuard, String, u64) {
    let first = session(db).await;
    let (guard, key, token) = held(db, &first, name).await;
    cut(db, &first);
    (first, guard, key, token)
}

/// An application's connection in a transaction that has written `token`
/// (not fenced yet).
async fn writing(db: &Db, token: u64) -> App {
    let mut app = App::connect(&db.url()).await;
    app.sql("BEGIN").await.expect("begin");
    app.write(token).await;
    app
}

on_both!(
    a_fenced_transaction_in_flight_holds_back_the_next_grant_until_it_ends,
    a_snapshot_taken_before_the_loss_does_not_pass_the_fence,
    odd_keys_are_refused_and_roll_back,
    a_stale_transaction_that_never_ends_holds_the_lock_only_as_long_as_the_servers_idle_bound,
    a_fence_racing_the_loss_and_the_next_grant_never_lands_after_the_grant,
);

/// The fence passed, then the holder's connection ended before COMMIT: the
/// next contender waits for that transaction (the entry row is locked by
/// it), so the stale commit lands before the next grant, never after.
async fn a_fenced_transaction_in_flight_holds_back_the_next_grant_until_it_ends(db: Db) {
    create_table(&db);
    for (i, level) in levels(&db).iter().enumerate() {
        let name = format!("order/{i}");
        let first = session(&db).await;
        let (guard, key, stale) = held(&db, &first, &name).await;
        let mut app = App::connect(&db.url()).await;
        begin(&db, &mut app, level).await;
        app.write(stale).await;
        app.fence(&key).await.expect("the fence of a held lock");
        // Statements after the fence, before the commit: the row stays locked.
        app.sql(&format!("UPDATE fenced_writes SET token = token WHERE token = {stale}"))
            .await
            .expect("update");
        cut(&db, &first);
        let second = session(&db).await;
        let next = tokio::spawn(async move {
            let guard = second.mutex(&name).expect("mutex").lock().await.expect("lock");
            (second, guard)
        });
        // The next contender's removal of the dead entry waits for the
        // fenced transaction. PostgreSQL shows the wait (no client event
        // tells it); on MariaDB the waiter's state was not found in its
        // process list, so a window of 3 s stands in there.
        if db.is_postgres() {
            until("the next contender waits for the fenced transaction", || {
                db.count(WAITING_FOR_A_LOCK) > 0
            })
            .await;
        } else {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        assert!(
            !next.is_finished(),
            "{level}: granted while the old holder's fenced commit was in flight"
        );
        app.sql("COMMIT")
            .await
            .expect("the commit of a transaction fenced while held");
        let (_second, next) = bounded("the next holder is granted", next).await.expect("task");
        assert!(next.token().get() > stale);
        assert_eq!(writes_of(&db, stale), 1, "{level}");
        drop(guard);
        next.release().await.expect("release");
    }
}

/// How many PostgreSQL connections wait for a lock another transaction holds.
const WAITING_FOR_A_LOCK: &str = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'";

/// The isolation levels a transaction is tried at.
fn levels(db: &Db) -> &'static [&'static str] {
    if db.is_postgres() {
        &["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
    } else {
        // (SERIALIZABLE on InnoDB makes a plain read of lockline's table a
        // locking one: the next holder would wait for the transaction, as
        // for a fence.)
        &["REPEATABLE READ", "READ COMMITTED"]
    }
}

async fn begin(db: &Db, app: &mut App, level: &str) {
    if db.is_postgres() {
        app.sql(&format!("BEGIN ISOLATION LEVEL {level}")).await.expect("begin");
    } else {
        app.sql(&format!("SET TRANSACTION ISOLATION LEVEL {level}"))
            .await
            .expect("level");
        app.sql("START TRANSACTION").await.expect("begin");
    }
}

/// A transaction whose snapshot was taken while the lock was held (it read
/// the entry, and wrote) calls the fence after the holder lost the lock and
/// the next holder was granted: refused, nothing lands, at each isolation
/// level.
async fn a_snapshot_taken_before_the_loss_does_not_pass_the_fence(db: Db) {
    create_table(&db);
    for (i, level) in levels(&db).iter().enumerate() {
        let name = format!("snap/{i}");
        let first = session(&db).await;
        let (_guard, key, stale) = held(&db, &first, &name).await;
        let mut app = App::connect(&db.url()).await;
        begin(&db, &mut app, level).await;
        // The snapshot: the entry as it is while held.
        app.sql("SELECT count(*) FROM lockline_entries").await.expect("read");
        app.write(stale).await;
        cut(&db, &first);
        let second = session(&db).await;
        let next = bounded("the next holder is granted", second.mutex(&name).expect("mutex").lock())
            .await
            .expect("lock");
        let refused = app.fence(&key).await.expect_err("a lost lock's fence must refuse");
        assert!(
            refused.starts_with(not_held(&db)),
            "{level}: the fence of a lost lock said {refused:?}, not {}",
            not_held(&db)
        );
        let _ = app.sql("COMMIT").await;
        assert_eq!(writes_of(&db, stale), 0, "{level}: the lost holder's write landed");
        next.release().await.expect("release");
    }
}

/// Keys that are no held entry's: refused, and the transaction rolled back
/// (a COMMIT sent anyway commits nothing).
async fn odd_keys_are_refused_and_roll_back(db: Db) {
    create_table(&db);
    let first = session(&db).await;
    let (guard, key, token) = held(&db, &first, "odd/x").await;
    let (released, released_key, _) = held(&db, &first, "odd/released").await;
    released.release().await.expect("release");
    let long = format!("{}/{token}", "n".repeat(5000));
    let cases: Vec<(String, &str)> = vec![
        (format!("{key}'"), "22023"),
        (format!("odd/x'/{token}"), not_held(&db)),
        (format!("odd\\x/{token}"), not_held(&db)),
        (format!("odd/x/{token} "), "22023"),
        (format!(" {key}"), not_held(&db)),
        (format!("odd/x/0{token}"), "22023"),
        (format!("odd/x/+{token}"), "22023"),
        (format!("odd/x/{token}\n"), "22023"),
        (format!("odd/X/{token}"), not_held(&db)),
        (format!("odd/x/{}", token + 1), not_held(&db)),
        (released_key.clone(), not_held(&db)),
        (format!("{token}"), "22023"),
        ("/".to_owned(), "22023"),
        (String::new(), "22023"),
        // The sequencer's text, as `lockline check` takes it.
        (guard.sequencer().to_string(), "22023"),
    ];
    for (bad, code) in cases {
        let mut app = writing(&db, token).await;
        let refused = app.fence(&bad).await.expect_err(&format!("{bad:?} must be refused"));
        assert!(refused.starts_with(code), "{bad:?}: said {refused:?}, expected {code}");
        let _ = app.sql("COMMIT").await;
        assert_eq!(writes_of(&db, token), 0, "{bad:?}: the write landed");
    }
    // A key far longer than any entry's.
    let mut app = writing(&db, token).await;
    let refused = app.fence(&long).await.expect_err("a long key must be refused");
    let _ = app.sql("COMMIT").await;
    assert_eq!(writes_of(&db, token), 0, "a long key: the write landed ({refused})");
    // NULL.
    let mut app = writing(&db, token).await;
    let call = if db.is_postgres() {
        "SELECT lockline_fence(NULL)"
    } else {
        "CALL lockline_fence(NULL)"
    };
    let refused = app.sql(call).await.expect_err("NULL must be refused");
    assert!(refused.starts_with("22023"), "NULL: said {refused:?}");
    let _ = app.sql("COMMIT").await;
    assert_eq!(writes_of(&db, token), 0, "NULL: the write landed");
    // The held key itself still commits.
    let mut app = writing(&db, token).await;
    app.fence(&key).await.expect("the held key");
    app.sql("COMMIT").await.expect("commit");
    assert_eq!(writes_of(&db, token), 1);
    guard.release().await.expect("release");
}

/// PostgreSQL: the fence resolves nothing through the caller's
/// `search_path`. An unprivileged caller who puts a schema of its own
/// before `pg_catalog`, with a look-alike of a function the fence calls,
/// does not make a lost lock pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_callers_search_path_does_not_make_a_lost_lock_pass() {
    let db = Db::postgres();
    create_table(&db);
    let first = session(&db).await;
    let (_guard, key, stale) = held(&db, &first, "path/x").await;
    db.sql(
        "CREATE USER app PASSWORD 'app-secret'; \
         CREATE SCHEMA mine AUTHORIZATION app; \
         GRANT SELECT, INSERT ON fenced_writes TO app; \
         GRANT SELECT, UPDATE ON lockline_entries TO app;",
    );
    cut(&db, &first);
    let mut app = App::connect(&db.url_for("app", "app-secret")).await;
    app.sql(
        "CREATE FUNCTION mine.pg_try_advisory_xact_lock_shared(bigint) RETURNS boolean \
         LANGUAGE sql AS 'SELECT false'; \
         CREATE TEMP TABLE lockline_entries (id bigint, name text); \
         SET search_path = mine, pg_catalog, public",
    )
    .await
    .expect("the caller's own schema");
    app.sql("BEGIN").await.expect("begin");
    app.write(stale).await;
    let refused = app
        .fence(&key)
        .await
        .expect_err("a lost lock's fence must refuse, whatever the caller's search_path");
    assert!(refused.starts_with(NOT_HELD_POSTGRES), "said {refused:?}");
    let _ = app.sql("COMMIT").await;
    assert_eq!(writes_of(&db, stale), 0, "the lost holder's write landed");
}

/// A holder that called the fence and then stopped before COMMIT (its
/// transaction idle, open) holds back the reaper and the next holder for as
/// long as that transaction lasts: the application's idle-in-transaction
/// bound (`idle_in_transaction_session_timeout`, MariaDB's
/// `idle_transaction_timeout`) ends it, then the next holder is granted and
/// nothing of the stale transaction lands.
async fn a_stale_transaction_that_never_ends_holds_the_lock_only_as_long_as_the_servers_idle_bound(db: Db) {
    create_table(&db);
    let first = session(&db).await;
    let (_guard, key, stale) = held(&db, &first, "idle/x").await;
    let mut app = App::connect(&db.url()).await;
    if db.is_postgres() {
        app.sql("SET idle_in_transaction_session_timeout = '5s'")
            .await
            .expect("set");
    } else {
        app.sql("SET SESSION idle_transaction_timeout = 5").await.expect("set");
    }
    app.sql("BEGIN").await.expect("begin");
    app.write(stale).await;
    app.fence(&key).await.expect("the fence of a held lock");
    cut(&db, &first);
    let second = session(&db).await;
    let started = std::time::Instant::now();
    let next = bounded(
        "the next holder is granted",
        second.mutex("idle/x").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "granted after {:?}, while the stale fenced transaction was open",
        started.elapsed()
    );
    assert!(app.sql("COMMIT").await.is_err(), "the stale transaction committed");
    assert_eq!(writes_of(&db, stale), 0, "the stale holder's write landed");
    next.release().await.expect("release");
}

/// PostgreSQL: a refusal aborts the transaction, but a savepoint rolled back
/// to after it (as `psql`'s `ON_ERROR_ROLLBACK` and some drivers' automatic
/// savepoints do) revives it: what it wrote before the savepoint commits.
/// The fence cannot stop that: don't roll back to a savepoint after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_savepoint_rolled_back_to_after_a_refusal_revives_the_transaction() {
    let db = Db::postgres();
    create_table(&db);
    let (_first, _guard, key, stale) = lost(&db, "save/x").await;
    let mut app = writing(&db, stale).await;
    app.sql("SAVEPOINT fence").await.expect("savepoint");
    let refused = app.fence(&key).await.expect_err("refused");
    assert!(refused.starts_with(NOT_HELD_POSTGRES), "{refused}");
    app.sql("ROLLBACK TO SAVEPOINT fence")
        .await
        .expect("rollback to savepoint");
    app.sql("COMMIT").await.expect("commit");
    assert_eq!(writes_of(&db, stale), 1, "as documented: the savepoint revived it");
}

/// MariaDB: the procedure is its database's, whatever the caller's default
/// database; after a refusal, statements a careless client sends run in a
/// new transaction (autocommit off) and commit, but nothing sent before the
/// refusal does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_after_a_refusal_only_later_statements_commit_and_any_default_database_reads_lockline() {
    let db = Db::mariadb();
    create_table(&db);
    let first = session(&db).await;
    let (guard, key, token) = held(&db, &first, "db/x").await;
    db.sql(
        "CREATE DATABASE other; CREATE TABLE other.lockline_entries LIKE lockline.lockline_entries; \
         INSERT INTO other.lockline_entries SELECT * FROM lockline.lockline_entries;",
    );
    let mut app = App::connect(&db.url()).await;
    app.sql("USE other").await.expect("use");
    app.sql("SET autocommit = 0").await.expect("autocommit off");
    app.sql(&format!("INSERT INTO lockline.fenced_writes (token) VALUES ({token})"))
        .await
        .expect("insert");
    app.sql(&format!("CALL lockline.lockline_fence('{key}')"))
        .await
        .expect("held, from another default database");
    app.sql("COMMIT").await.expect("commit");
    assert_eq!(writes_of(&db, token), 1);
    // Lost: the copy in `other` (its guard-free row there) must not matter.
    cut(&db, &first);
    app.sql(&format!("INSERT INTO lockline.fenced_writes (token) VALUES ({token})"))
        .await
        .expect("insert");
    let refused = app
        .sql(&format!("CALL lockline.lockline_fence('{key}')"))
        .await
        .expect_err("refused");
    assert!(refused.starts_with(NOT_HELD_MYSQL), "{refused}");
    app.sql(&format!(
        "INSERT INTO lockline.fenced_writes (token) VALUES ({})",
        token + 1
    ))
    .await
    .expect("a statement after the refusal");
    app.sql("COMMIT").await.expect("commit");
    assert_eq!(writes_of(&db, token), 1, "the write before the refusal landed");
    assert_eq!(
        writes_of(&db, token + 1),
        1,
        "as documented: a statement after the refusal commits"
    );
    drop(guard);
}

/// PostgreSQL: the guards are advisory locks, which no privilege protects.
/// Any user who may connect to the database can read the salt (a function's
/// source is public) and hold the guard of a dead entry: the entry then
/// looks live to lockline and to the fence, whose lost holder's write then
/// lands. A limitation, documented (docs/sql.md, "Guards"): give lockline's
/// database to trusted users only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_any_database_user_can_hold_a_dead_entrys_guard_as_documented() {
    let db = Db::postgres();
    create_table(&db);
    let (_first, _guard, key, stale) = lost(&db, "spoof/x").await;
    db.sql("CREATE USER nobody PASSWORD 'nobody-secret'");
    let mut nobody = App::connect(&db.url_for("nobody", "nobody-secret")).await;
    let App::Pg(client) = &mut nobody else { unreachable!() };
    let salt: String = client
        .query_one(
            "SELECT substring(prosrc from '# (-?[0-9]+)\\)') FROM pg_proc WHERE proname = 'lockline_fence'",
            &[],
        )
        .await
        .expect("the function's source")
        .get(0);
    client
        .batch_execute(&format!("SELECT pg_advisory_lock({stale} # {salt})"))
        .await
        .expect("hold the guard");
    let mut app = writing(&db, stale).await;
    app.fence(&key)
        .await
        .expect("passes: the guard is held, by another user");
    app.sql("COMMIT").await.expect("commit");
    assert_eq!(writes_of(&db, stale), 1);
}

/// The fence and commit of the old holder race its loss and the next
/// holder's grant, at varied offsets: whenever the old holder's commit
/// succeeds, the next holder, once granted, already sees its write (the
/// commit came before the grant); when refused, nothing of it ever lands.
async fn a_fence_racing_the_loss_and_the_next_grant_never_lands_after_the_grant(db: Db) {
    create_table(&db);
    let (mut committed, mut refused) = (0, 0);
    for i in 0..24u64 {
        let name = format!("race/{i}");
        let first = session(&db).await;
        let (guard, key, stale) = held(&db, &first, &name).await;
        let mut app = writing(&db, stale).await;
        let second = session(&db).await;
        let mut killer = App::connect(&db.url()).await;
        let mut reader = App::connect(&db.url()).await;
        let (fence_after, cut_after) = (Duration::from_millis((i % 4) * 3), Duration::from_millis((i / 4) * 2));
        let first_id = first.id().to_owned();
        let fenced = async {
            tokio::time::sleep(fence_after).await;
            match app.fence(&key).await {
                Ok(()) => app.sql("COMMIT").await.is_ok(),
                Err(_) => {
                    let _ = app.sql("COMMIT").await;
                    false
                }
            }
        };
        let granted = async {
            tokio::time::sleep(cut_after).await;
            killer.cut(&first_id).await;
            let next = second.mutex(&name).expect("mutex").lock().await.expect("lock");
            let seen = reader.writes_of(stale).await;
            (next, seen)
        };
        let (landed, (next, seen)) = bounded("the race", async { tokio::join!(fenced, granted) }).await;
        let after = writes_of(&db, stale);
        if landed {
            committed += 1;
            assert_eq!(seen, 1, "race {i}: the old holder's commit landed after the next grant");
        } else {
            refused += 1;
            assert_eq!(after, 0, "race {i}: a refused transaction's write landed");
        }
        drop(guard);
        next.release().await.expect("release");
    }
    eprintln!("committed before the grant: {committed}, refused: {refused}");
}

/// MariaDB: inside an XA transaction the procedure may not roll back (XA
/// forbids it): a refusal is still `45L02`, and the branch is the client's
/// to roll back (documented); rolled back, nothing of it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_refusal_inside_an_xa_transaction_is_still_45l02() {
    let db = Db::mariadb();
    create_table(&db);
    let (_first, _guard, key, stale) = lost(&db, "xa/x").await;
    let mut app = App::connect(&db.url()).await;
    app.sql("XA START 'fenced'").await.expect("xa start");
    app.write(stale).await;
    let refused = app.fence(&key).await.expect_err("refused");
    assert!(
        refused.starts_with(NOT_HELD_MYSQL),
        "inside XA the fence said {refused:?}"
    );
    app.sql("XA END 'fenced'").await.expect("xa end");
    app.sql("XA ROLLBACK 'fenced'").await.expect("xa rollback");
    assert_eq!(writes_of(&db, stale), 0, "the lost holder's write landed through XA");
}
