//! Tables of an older layout are refused with a message that says where
//! the way to move them is, and the way the SQL chapter gives
//! (`docs/sql.md`, "Layout versions") moves layout 2, 3 and 4 tables (as
//! the earlier lockline's scripts made them, kept in `tests/fixtures/`) to
//! the current layout, on PostgreSQL and on MariaDB; layout 3 and 4 tables
//! are also moved by the first session that may create tables.

use std::time::Duration;

use lockline::backend::{AppendRequest, Conflicts, EntryKind, QueueUpdate};
use lockline::conformance::bounded;
use lockline::{Client, Error, SessionOptions};
use lockline_sql::{FencedTransaction, Sql};

#[macro_use]
mod support;

use support::db::Db;

on_both!(
    layout_2_tables_are_refused_and_moved_as_documented,
    layout_3_tables_are_moved_by_the_first_session_that_may_create,
    layout_3_tables_are_refused_and_moved_as_documented,
    layout_4_tables_are_moved_by_the_first_session_that_may_create,
    layout_4_tables_are_refused_and_moved_as_documented,
);

/// The statements `docs/sql.md` gives, before and after the script.
const POSTGRES_BEFORE: &str = "ALTER TABLE lockline_entries ADD COLUMN epoch bigint NOT NULL DEFAULT 0, \
     ADD COLUMN changed bigint NOT NULL DEFAULT 0; \
     UPDATE lockline_entries SET epoch = version;";
const MARIADB_BEFORE: &str = "ALTER TABLE lockline_entries ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0 AFTER version, \
     ADD COLUMN changed BIGINT NOT NULL DEFAULT 0 AFTER epoch, \
     ADD COLUMN watchers INT NOT NULL DEFAULT 0 AFTER changed; \
     UPDATE lockline_entries SET epoch = version; \
     DROP PROCEDURE lockline_append;";
const AFTER: &str = "UPDATE lockline_meta SET layout = 5;";

fn options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(10))
}

async fn layout_2_tables_are_refused_and_moved_as_documented(db: Db) {
    let (old, before) = if db.is_postgres() {
        (include_str!("fixtures/layout2_postgres.sql"), POSTGRES_BEFORE)
    } else {
        (include_str!("fixtures/layout2_mariadb.sql"), MARIADB_BEFORE)
    };
    db.sql(old);
    let client = Client::new(Sql::new(db.url()));
    match bounded("open on layout 2", client.session_with(options())).await {
        Err(Error::InvalidOptions { reason }) => {
            assert!(reason.contains("layout Some(2)"), "{reason}");
            assert!(reason.contains("Layout versions"), "{reason}");
        }
        other => panic!("layout 2 tables must be refused, got {other:?}"),
    }
    db.sql(before);
    db.sql(&Sql::new(db.url()).ddl().expect("ddl"));
    db.sql(AFTER);
    let (a, b) = (
        bounded("open", client.session_with(options())).await.expect("session"),
        bounded("open", client.session_with(options())).await.expect("session"),
    );
    // The recipes of before work.
    let guard = a.mutex("moved/mutex").expect("mutex").lock().await.expect("lock");
    guard.release().await.expect("release");
    let leadership = bounded(
        "campaign",
        a.election("moved/election").expect("election").campaign(b"a"),
    )
    .await
    .expect("campaign");
    leadership.proclaim(b"a2").await.expect("proclaim");
    leadership.resign().await.expect("resign");
    // And lock modes: an entry, a conditional update with a block, and a
    // watch woken by another session's write.
    let request = AppendRequest {
        dir: "moved/modes",
        kind: EntryKind::Dlm,
        attempt: "moved-attempt",
        value: b"EX",
        conflicts: Conflicts::All,
        nearest: 0,
    };
    let entry = bounded("append", a.backend_session().append(&request))
        .await
        .expect("append")
        .entry;
    let watching = {
        let backend = std::sync::Arc::clone(b.backend_session());
        let entry = entry.clone();
        tokio::spawn(async move { backend.watch_value(&entry, b"EX").await })
    };
    let queue = bounded("read", b.backend_session().read_queue("moved/modes"))
        .await
        .expect("read");
    let unchanged = [(&entry, queue.slots[0].version)];
    let token = bounded(
        "update",
        b.backend_session().update_queue(&QueueUpdate {
            dir: "moved/modes",
            unchanged: &unchanged,
            present: &[],
            set: &[(&entry, b"EX, wanted")],
            delete: &[],
            block: Some(b"block"),
        }),
    )
    .await
    .expect("update");
    assert!(token.is_some());
    let woken = bounded("the watch wakes", watching)
        .await
        .expect("task")
        .expect("watch");
    assert_eq!(woken.as_deref(), Some(&b"EX, wanted"[..]));
    let queue = bounded("read", a.backend_session().read_queue("moved/modes"))
        .await
        .expect("read");
    assert_eq!(queue.block.as_deref(), Some(&b"block"[..]));
}

/// The script of an earlier layout (3 or 4).
fn layout_script(db: &Db, layout: i64) -> &'static str {
    match (layout, db.is_postgres()) {
        (3, true) => include_str!("fixtures/layout3_postgres.sql"),
        (3, false) => include_str!("fixtures/layout3_mariadb.sql"),
        (4, true) => include_str!("fixtures/layout4_postgres.sql"),
        (4, false) => include_str!("fixtures/layout4_mariadb.sql"),
        other => panic!("no script of layout {other:?}"),
    }
}

/// A transaction fenced on a lock of `client`'s commits: the fence is
/// there. And a lock handed from one session to a waiting one: the wait
/// that reads the waiter's turn is there.
async fn the_fence_and_the_handoff_work(db: &Db, client: &Client) {
    let session = bounded("open", client.session_with(options())).await.expect("session");
    let guard = session
        .mutex("moved/fenced")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    if db.is_postgres() {
        let pool = sqlx::PgPool::connect(&db.url()).await.expect("pool");
        let tx = FencedTransaction::begin_postgres(&guard, &pool).await.expect("begin");
        tx.commit().await.expect("a fenced commit while held");
    } else {
        let pool = sqlx::MySqlPool::connect(&db.url()).await.expect("pool");
        let tx = FencedTransaction::begin_mysql(&guard, &pool).await.expect("begin");
        tx.commit().await.expect("a fenced commit while held");
    }
    let other = bounded("open", client.session_with(options())).await.expect("session");
    let waits_before = client.stats().waits;
    let waiting = {
        let mutex = other.mutex("moved/fenced").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    bounded("the waiter queues", async {
        while client.stats().waits == waits_before {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    guard.release().await.expect("release");
    let handed = bounded("the waiter is granted", waiting)
        .await
        .expect("task")
        .expect("lock");
    handed.release().await.expect("release");
    other.close().await.expect("close");
    session.close().await.expect("close");
}

fn refused_as(layout: i64, opened: lockline::Result<lockline::Session>) {
    match opened {
        Err(Error::InvalidOptions { reason }) => {
            assert!(reason.contains(&format!("layout Some({layout})")), "{reason}");
            assert!(reason.contains("Layout versions"), "{reason}");
        }
        other => panic!("layout {layout} tables must be refused, got {other:?}"),
    }
}

async fn moved_by_the_first_session_that_may_create(db: Db, layout: i64) {
    db.sql(layout_script(&db, layout));
    let fixed = Client::new(Sql::new(db.url()).without_creating_tables());
    refused_as(
        layout,
        bounded("open on an earlier layout", fixed.session_with(options())).await,
    );
    assert_eq!(db.count("SELECT layout FROM lockline_meta"), layout);
    // Sessions opened at once: one moves the tables, the others find them
    // moved.
    let client = Client::new(Sql::new(db.url()));
    let opened = futures::future::join_all((0..4).map(|_| client.session_with(options()))).await;
    for session in opened {
        session
            .expect("a session on moved tables")
            .close()
            .await
            .expect("close");
    }
    assert_eq!(db.count("SELECT layout FROM lockline_meta"), 5);
    the_fence_and_the_handoff_work(&db, &fixed).await;
}

async fn refused_and_moved_as_documented(db: Db, layout: i64) {
    db.sql(layout_script(&db, layout));
    let fixed = Client::new(Sql::new(db.url()).without_creating_tables());
    refused_as(
        layout,
        bounded("open on an earlier layout", fixed.session_with(options())).await,
    );
    // docs/sql.md: the script again, then the layout row.
    db.sql(&Sql::new(db.url()).ddl().expect("ddl"));
    db.sql(AFTER);
    the_fence_and_the_handoff_work(&db, &fixed).await;
}

async fn layout_3_tables_are_moved_by_the_first_session_that_may_create(db: Db) {
    moved_by_the_first_session_that_may_create(db, 3).await;
}

async fn layout_3_tables_are_refused_and_moved_as_documented(db: Db) {
    refused_and_moved_as_documented(db, 3).await;
}

async fn layout_4_tables_are_moved_by_the_first_session_that_may_create(db: Db) {
    moved_by_the_first_session_that_may_create(db, 4).await;
}

async fn layout_4_tables_are_refused_and_moved_as_documented(db: Db) {
    refused_and_moved_as_documented(db, 4).await;
}
