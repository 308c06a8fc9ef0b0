//! A fenced write whose connection ends before its answer: the writes may or
//! may not have been applied, so the caller must be told `Unavailable` (as
//! `write_if_held` documents), never a loss that says nothing was written.
//!
//! The write is held up on the server by another transaction's uncommitted
//! insert of the same key, and the holder's connection is ended while it
//! waits: the outcome is then known to the test (nothing landed) but not
//! to the client, which is the case to get right.

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, Error, SessionOptions, Write};
use lockline_sql::Sql;
use sqlx::{Connection, Executor, MySqlConnection};

#[macro_use]
mod support;

use support::db::Db;

// PostgreSQL only: the answer is decided by the session's code both engines
// share (`on_owner!`), and only PostgreSQL lets the held-up write wait long
// enough (its lock wait is counted in milliseconds, MariaDB's in whole
// seconds, 1 s here) for the test to see it wait and end its connection
// before the wait gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_connection_ends_before_the_answer_is_reported_as_unknown() {
    the_write_is_reported_as_unknown(Db::postgres()).await;
}

/// A transaction of another client that holds an uncommitted row of the
/// key the holder writes.
enum Blocker {
    Pg(tokio_postgres::Client),
    My(MySqlConnection),
}

impl Blocker {
    async fn hold_key(db: &Db, key: &str) -> Blocker {
        if db.is_postgres() {
            let statement = format!("BEGIN; INSERT INTO lockline_data (key, value) VALUES ('{key}', '\\x00')");
            let (client, connection) = tokio_postgres::connect(&db.url(), tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(connection);
            client.batch_execute(&statement).await.expect("hold the key");
            Blocker::Pg(client)
        } else {
            let statement = format!("BEGIN; INSERT INTO lockline_data (`key`, value) VALUES ('{key}', 'x')");
            let mut conn = MySqlConnection::connect(&db.url()).await.expect("connect");
            conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(statement)))
                .await
                .expect("hold the key");
            Blocker::My(conn)
        }
    }

    async fn rollback(self) {
        match self {
            Blocker::Pg(client) => client.batch_execute("ROLLBACK").await.expect("rollback"),
            Blocker::My(mut conn) => {
                conn.execute("ROLLBACK").await.expect("rollback");
            }
        }
    }
}

/// The server-side id of the connection that holds `session`'s locks.
fn owner_connection(db: &Db, session: &str) -> String {
    let column = if db.is_postgres() { "pid" } else { "conn" };
    db.sql(&format!(
        "SELECT {column} FROM lockline_sessions WHERE id = '{session}'"
    ))
    .trim()
    .to_owned()
}

/// Whether connection `conn` waits for another transaction's row lock.
fn waits_for_a_lock(db: &Db, conn: &str) -> bool {
    let query = if db.is_postgres() {
        format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {conn} AND wait_event_type = 'Lock'")
    } else {
        format!(
            "SELECT count(*) FROM information_schema.PROCESSLIST \
             WHERE ID = {conn} AND COMMAND = 'Query' AND STATE <> ''"
        )
    };
    db.count(&query) > 0
}

async fn the_write_is_reported_as_unknown(db: Db) {
    // Long enough that the write waits on the other row, not on a timeout.
    let options = SessionOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_request_timeout(Duration::from_secs(8));
    let client = Client::new(Sql::new(db.url()));
    let session = client.session_with(options).await.expect("session");
    let guard = session.mutex("inflight").expect("mutex").lock().await.expect("lock");
    let conn = owner_connection(&db, session.id());
    let blocker = Blocker::hold_key(&db, "inflight-state").await;
    let write = guard.write_if_held([Write::put("inflight-state", "written")]);
    let cut = async {
        // The other transaction's row is the only thing the write can wait
        // on here: no event to await, so the server's own view is probed.
        lockline::conformance::until("the write waits for the other transaction's row", || {
            waits_for_a_lock(&db, &conn)
        })
        .await;
        db.end_connection(&conn);
    };
    let (written, ()) = bounded("the write's answer", async { tokio::join!(write, cut) }).await;
    assert!(
        matches!(written, Err(Error::Unavailable { .. })),
        "a write cut off before its answer must say it may have been applied, said {written:?}"
    );
    blocker.rollback().await;
    // What the test knows and the client did not: nothing landed.
    let reader = client.session().await.expect("session");
    assert_eq!(reader.read("inflight-state").await.expect("read"), None);
}
