//! The database's fence (`lockline_fence(KEY)`: a function on PostgreSQL, a
//! procedure on MariaDB) from drivers other than sqlx: `tokio-postgres`,
//! Python's psycopg2 and PyMySQL (Debian `python3-psycopg2`,
//! `python3-pymysql`), and Go's `database/sql` with lib/pq and
//! go-sql-driver/mysql (Debian `golang-github-lib-pq-dev`,
//! `golang-github-go-sql-driver-mysql-dev`; `tests/go/fencewriter`, built
//! here offline in GOPATH mode). A transaction that calls it before its
//! commit commits while the lock is held; one whose holder was paused
//! (SIGSTOP) past its TTL, and replaced meanwhile, is refused with the
//! documented SQLSTATE (PyMySQL and go-sql-driver/mysql report the error
//! number alone) and nothing it wrote lands, even when its client sends
//! COMMIT anyway. (The same from `psql` and `mariadb` jobs under `lockline
//! lock`: the CLI crate's `fence_cli.rs`.)

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, MutexGuard, Session};
use lockline_sql::{Sql, NOT_HELD_POSTGRES};
use lockline_testkit::LineChild;

#[macro_use]
mod support;

use support::db::{spawn_probe, Db};
use support::options;

/// Debian's interpreter, the one `python3-psycopg2` and `python3-pymysql`
/// install into (not whichever `python3` comes first on the PATH).
const PYTHON: &str = "/usr/bin/python3";

const WAIT: Duration = Duration::from_secs(30);

on_both!(
    a_python_transaction_commits_while_the_lock_is_held,
    a_paused_python_holder_is_refused_and_nothing_lands,
    an_application_user_with_the_documented_privileges_calls_the_fence,
    a_go_transaction_commits_while_the_lock_is_held,
    a_paused_go_holder_is_refused_and_nothing_lands,
);

fn create_table(db: &Db) {
    db.sql("CREATE TABLE fenced_writes (token bigint NOT NULL)");
}

fn writes_of(db: &Db, token: u64) -> i64 {
    db.count(&format!("SELECT count(*) FROM fenced_writes WHERE token = {token}"))
}

/// A lock held by the `sql_probe` example in a process of its own: its key
/// (`NAME/TOKEN` on the SQL backend) and token.
fn hold(db: &Db, name: &str, ttl_ms: u64) -> (LineChild, String, u64) {
    let (probe, first) = spawn_probe(&db.url(), name, "hold", ttl_ms);
    let token: u64 = first
        .strip_prefix("held ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the probe said {first:?}"));
    (probe, format!("{name}/{token}"), token)
}

/// The Python writer, once it has written in its open transaction.
fn python_writer(db: &Db, key: &str, token: u64) -> LineChild {
    python_writer_at(&db.url(), key, token)
}

fn python_writer_at(url: &str, key: &str, token: u64) -> LineChild {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/fence_writer.py");
    let mut command = Command::new(PYTHON);
    command.args([script, url, key, &token.to_string()]);
    let writer = LineChild::spawn(command).expect("start python3 (Debian python3-psycopg2 and python3-pymysql)");
    assert_eq!(writer.line(WAIT).as_deref(), Some("ready"), "the Python writer");
    writer
}

/// Builds the Go writer once per test binary, offline, against Debian's Go
/// driver sources.
fn fencewriter() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("go-fencewriter");
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/go/fencewriter/main.go");
        lockline_testkit::go_build(source.as_ref(), &out).expect(
            "build the Go writer (Debian golang-go, golang-github-lib-pq-dev, \
             golang-github-go-sql-driver-mysql-dev)",
        );
        out
    })
}

/// The Go writer, `now` (it fences and commits at once) or `wait` (once it
/// has said `ready`, having written in its open transaction).
fn go_writer(db: &Db, mode: &str, key: &str, token: u64) -> LineChild {
    // lib/pq requires TLS unless told otherwise; the test servers have none.
    let url = if db.is_postgres() {
        format!("{}?sslmode=disable", db.url())
    } else {
        db.url()
    };
    let mut command = Command::new(fencewriter());
    command.args([mode, &url, key, &token.to_string()]);
    let writer = LineChild::spawn(command).expect("start the Go writer");
    if mode == "wait" {
        assert_eq!(writer.line(WAIT).as_deref(), Some("ready"), "the Go writer");
    }
    writer
}

/// The holder `probe` (of `name`, its lock's key `key` and token `stale`)
/// and the writer (its transaction open, written) pause; the next holder is
/// granted once the holder's TTL ran out; then the writer, resumed, is told
/// to commit and must be refused with the engine's error. The next
/// holder's session and guard.
async fn replaced_and_refused(
    db: &Db,
    probe: &LineChild,
    writer: &mut LineChild,
    name: &str,
    key: &str,
    stale: u64,
) -> (Session, MutexGuard) {
    probe.signal(libc::SIGSTOP).expect("pause the holder");
    writer.signal(libc::SIGSTOP).expect("pause the writer");
    let session = Client::new(Sql::new(db.url()))
        .session_with(options(2000))
        .await
        .expect("session");
    let next = bounded("the next holder is granted", session.mutex(name).expect("mutex").lock())
        .await
        .expect("lock");
    assert!(next.token().get() > stale);
    writer.signal(libc::SIGCONT).expect("resume the writer");
    writer.send_line("commit").expect("tell it to commit");
    let said = writer.line(WAIT).expect("the writer's answer");
    let expected = if db.is_postgres() {
        "refused LL002 "
    } else {
        "refused 1644 "
    };
    assert!(
        said.starts_with(expected) && said.contains("is not held") && said.contains(key),
        "a paused holder's fenced commit must be refused with {expected:?}, it said {said:?}"
    );
    (session, next)
}

async fn a_go_transaction_commits_while_the_lock_is_held(db: Db) {
    create_table(&db);
    let (_probe, key, token) = hold(&db, "go/live", 10_000);
    let writer = go_writer(&db, "now", &key, token);
    assert_eq!(writer.line(WAIT).as_deref(), Some("committed"));
    assert_eq!(writes_of(&db, token), 1);
}

async fn a_paused_go_holder_is_refused_and_nothing_lands(db: Db) {
    create_table(&db);
    let (probe, key, stale) = hold(&db, "go/paused", 2000);
    let mut writer = go_writer(&db, "wait", &key, stale);
    let (_session, next) = replaced_and_refused(&db, &probe, &mut writer, "go/paused", &key, stale).await;
    // lib/pq answers a COMMIT of an aborted transaction with an error (and
    // rolls it back); on MariaDB the procedure rolled it back already and the
    // COMMIT commits nothing.
    let anyway = writer.line(WAIT).expect("the writer's COMMIT anyway");
    if db.is_postgres() {
        assert_eq!(
            anyway, "commit anyway failed: pq: Could not complete operation in a failed transaction",
            "lib/pq's answer to a COMMIT of an aborted transaction"
        );
    } else {
        assert_eq!(anyway, "committed anyway");
    }
    assert_eq!(writes_of(&db, stale), 0, "the paused holder's write landed");
    probe.signal(libc::SIGCONT).expect("resume the holder");
    next.release().await.expect("release");
}

async fn a_python_transaction_commits_while_the_lock_is_held(db: Db) {
    create_table(&db);
    let (_probe, key, token) = hold(&db, "py/live", 10_000);
    let mut writer = python_writer(&db, &key, token);
    writer.send_line("commit").expect("tell it to commit");
    assert_eq!(writer.line(WAIT).as_deref(), Some("committed"));
    assert_eq!(writes_of(&db, token), 1);
}

/// An application's own database user, with the privileges
/// `docs/fenced-writes.md` lists (and its own table's), calls the fence.
async fn an_application_user_with_the_documented_privileges_calls_the_fence(db: Db) {
    create_table(&db);
    let (_probe, key, token) = hold(&db, "py/app", 10_000);
    if db.is_postgres() {
        db.sql(
            "CREATE USER app PASSWORD 'app-secret'; \
             GRANT SELECT, INSERT ON fenced_writes TO app; \
             GRANT SELECT, UPDATE ON lockline_entries TO app;",
        );
    } else {
        db.sql(
            "CREATE USER 'app'@'%' IDENTIFIED BY 'app-secret'; \
             GRANT SELECT, INSERT ON lockline.fenced_writes TO 'app'@'%'; \
             GRANT SELECT ON lockline.lockline_entries TO 'app'@'%'; \
             GRANT EXECUTE ON PROCEDURE lockline.lockline_fence TO 'app'@'%';",
        );
    }
    let mut writer = python_writer_at(&db.url_for("app", "app-secret"), &key, token);
    writer.send_line("commit").expect("tell it to commit");
    assert_eq!(writer.line(WAIT).as_deref(), Some("committed"));
    assert_eq!(writes_of(&db, token), 1);
}

async fn a_paused_python_holder_is_refused_and_nothing_lands(db: Db) {
    create_table(&db);
    let (probe, key, stale) = hold(&db, "py/paused", 2000);
    let mut writer = python_writer(&db, &key, stale);
    let (_session, next) = replaced_and_refused(&db, &probe, &mut writer, "py/paused", &key, stale).await;
    assert_eq!(writer.line(WAIT).as_deref(), Some("committed anyway"));
    assert_eq!(writes_of(&db, stale), 0, "the paused holder's write landed");
    probe.signal(libc::SIGCONT).expect("resume the holder");
    next.release().await.expect("release");
}

/// The fence from `tokio-postgres`: a live holder's transaction commits and
/// the fence answers its token; a transaction of a holder paused past its
/// TTL and replaced is refused with `LL002` and nothing of it lands; a key
/// that is no entry's is `22023`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_commits_only_while_the_lock_is_held() {
    let db = Db::postgres();
    create_table(&db);
    let (mut client, connection) = tokio_postgres::connect(&db.url(), tokio_postgres::NoTls)
        .await
        .expect("connect with tokio-postgres");
    tokio::spawn(connection);

    // Held: commits.
    let session = Client::new(Sql::new(db.url()))
        .session_with(options(10_000))
        .await
        .expect("session");
    let guard = session.mutex("tp/live").expect("mutex").lock().await.expect("lock");
    let token = i64::try_from(guard.token().get()).expect("token");
    let tx = client.transaction().await.expect("begin");
    tx.execute("INSERT INTO fenced_writes (token) VALUES ($1)", &[&token])
        .await
        .expect("insert");
    let fenced: i64 = tx
        .query_one("SELECT lockline_fence($1)", &[&guard.key()])
        .await
        .expect("the fence of a held lock")
        .get(0);
    assert_eq!(fenced, token, "the fence answers the token");
    tx.commit().await.expect("commit");
    assert_eq!(writes_of(&db, guard.token().get()), 1);
    guard.release().await.expect("release");

    // Paused past its TTL and replaced: refused, nothing lands.
    let (probe, key, stale) = hold(&db, "tp/paused", 2000);
    let tx = client.transaction().await.expect("begin");
    tx.execute(
        "INSERT INTO fenced_writes (token) VALUES ($1)",
        &[&i64::try_from(stale).expect("token")],
    )
    .await
    .expect("insert");
    probe.signal(libc::SIGSTOP).expect("pause the holder");
    let next = bounded(
        "the next holder is granted",
        session.mutex("tp/paused").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    assert!(next.token().get() > stale);
    let refused = tx
        .query_one("SELECT lockline_fence($1)", &[&key])
        .await
        .expect_err("the fence of a lost lock must refuse");
    assert_eq!(refused.code().map(|c| c.code()), Some(NOT_HELD_POSTGRES), "{refused:?}");
    // A COMMIT of the aborted transaction rolls it back.
    let _ = tx.commit().await;
    assert_eq!(writes_of(&db, stale), 0, "the paused holder's write landed");
    probe.signal(libc::SIGCONT).expect("resume the holder");

    // Not a key: 22023; the key of another name: not held.
    for (bad, code) in [
        ("tp/paused", "22023"),
        ("tp/paused/0", "22023"),
        ("/5", "22023"),
        ("tp/paused/99999999999999999999", "22023"),
        (&format!("tp/other/{}", next.token()), NOT_HELD_POSTGRES),
    ] {
        let tx = client.transaction().await.expect("begin");
        let error = tx
            .query_one("SELECT lockline_fence($1)", &[&bad])
            .await
            .expect_err("refused");
        assert_eq!(error.code().map(|c| c.code()), Some(code), "{bad}: {error:?}");
    }
    let tx = client.transaction().await.expect("begin");
    let fenced: i64 = tx
        .query_one("SELECT lockline_fence($1)", &[&next.key()])
        .await
        .expect("the next holder's fence")
        .get(0);
    assert_eq!(u64::try_from(fenced).ok(), Some(next.token().get()));
    tx.commit().await.expect("commit");
    next.release().await.expect("release");
}
