//! Bad input gets a typed error, on PostgreSQL and on MariaDB: an
//! unreachable server, a wrong password, missing privileges, a foreign
//! table of the same name. And the DBA's way: tables made from the DDL
//! script, used by a user who may create nothing.

use std::time::{Duration, Instant};

use lockline::conformance::bounded;
use lockline::{Client, Error, SessionOptions};
use lockline_sql::Sql;
use lockline_testkit::{free_port, TcpProxy};

#[macro_use]
mod support;

use support::db::Db;

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(2))
}

on_both!(
    a_wrong_password_is_an_authentication_failure,
    a_silent_server_fails_within_the_connect_timeout,
    a_user_who_may_not_create_tables_is_told_which_privilege,
    a_foreign_table_of_the_same_name_is_refused,
    tables_made_by_a_dba_serve_a_user_who_may_create_nothing,
    the_longest_names_and_any_characters_are_separate_locks,
    ending_another_users_silent_holder_needs_a_privilege,
    an_unprivileged_user_of_its_own_database_creates_the_tables,
);

async fn open(url: String) -> lockline::Result<lockline::Session> {
    bounded("open a session", Client::new(Sql::new(url)).session_with(options())).await
}

async fn a_wrong_password_is_an_authentication_failure(db: Db) {
    db.create_user("app", "right");
    let url = db.url_for("app", "wrong");
    match open(url).await {
        Err(error @ Error::AuthenticationFailed { .. }) => {
            let text = error.to_string();
            assert!(!text.contains("wrong"), "the password leaked into {text:?}");
        }
        other => panic!("a wrong password must be AuthenticationFailed, got {other:?}"),
    }
}

async fn a_silent_server_fails_within_the_connect_timeout(db: Db) {
    // Nobody listens: refused at once.
    let closed = db
        .url()
        .replace(&db.port().to_string(), &free_port().expect("port").to_string());
    let started = Instant::now();
    match open(closed).await {
        Err(error @ Error::Unavailable { .. }) => assert!(error.is_transient()),
        other => panic!("a closed port must be Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    // A server that accepts and never answers (a silent partition).
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    proxy.blackhole();
    let started = Instant::now();
    match open(db.url_via(&proxy.address())).await {
        // Said by the backend or by the client's own bound on the open,
        // whichever comes first: both name the deadline.
        Err(Error::Unavailable { reason, .. }) => {
            assert!(
                reason.contains("connect timeout") || reason.contains("within 2s"),
                "{reason}"
            );
        }
        other => panic!("a silent server must be Unavailable, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "gave up after {took:?} with a 2 s connect timeout"
    );
    proxy.heal();
}

async fn a_user_who_may_not_create_tables_is_told_which_privilege(db: Db) {
    db.create_user("app", "secret");
    if !db.is_postgres() {
        // The MariaDB user may use the test database's tables, not create them.
        assert!(db
            .sql("SHOW GRANTS FOR 'app'@'%'")
            .contains("SELECT, INSERT, UPDATE, DELETE"));
    }
    match open(db.url_for("app", "secret")).await {
        Err(Error::PermissionDenied {
            operation, key, reason, ..
        }) => {
            assert_eq!(operation, "create tables in");
            assert!(key.contains("public") || key.contains("lockline"), "{key}");
            assert!(
                reason.contains("CREATE"),
                "the reason must name the privilege: {reason}"
            );
            assert!(reason.contains("Sql::ddl"), "the reason must say how else: {reason}");
        }
        other => panic!("a user who may not create tables must get PermissionDenied, got {other:?}"),
    }
}

async fn a_foreign_table_of_the_same_name_is_refused(db: Db) {
    db.sql("CREATE TABLE lockline_meta (singleton int PRIMARY KEY, layout int NOT NULL, started_at int)");
    // The current layout version: only the entries table is foreign.
    db.sql("INSERT INTO lockline_meta VALUES (1, 3, NULL)");
    db.sql("CREATE TABLE lockline_entries (id bigint PRIMARY KEY, owner text)");
    match open(db.url()).await {
        Err(Error::InvalidOptions { reason }) => {
            assert!(reason.contains("lockline_entries is not lockline's"), "{reason}");
            assert!(reason.contains("with_table_prefix"), "{reason}");
        }
        other => panic!("a foreign table must be refused, got {other:?}"),
    }
    // Another prefix sets lockline beside it.
    let session = bounded(
        "open a session",
        Client::new(Sql::new(db.url()).with_table_prefix("locks_")).session_with(options()),
    )
    .await
    .expect("a session with another prefix");
    let guard = session.mutex("beside").expect("mutex").lock().await.expect("lock");
    guard.release().await.expect("release");
    assert_eq!(db.count("SELECT count(*) FROM lockline_entries"), 0);
}

async fn tables_made_by_a_dba_serve_a_user_who_may_create_nothing(db: Db) {
    let ddl = Sql::new(db.url()).ddl().expect("ddl");
    db.sql(&ddl);
    db.create_user("app", "secret");
    if db.is_postgres() {
        db.sql(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON lockline_entries, lockline_sessions, lockline_meta, lockline_data, lockline_blocks TO app; \
             GRANT USAGE, SELECT, UPDATE ON SEQUENCE lockline_entries_id_seq TO app;",
        );
    }
    let url = db.url_for("app", "secret");
    let client = Client::new(Sql::new(url).without_creating_tables());
    let (a, b) = (
        client.session_with(options()).await.expect("session"),
        client.session_with(options()).await.expect("session"),
    );
    let first = a.mutex("dba").expect("mutex").lock().await.expect("lock");
    let second = {
        let mutex = b.mutex("dba").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    let token = first.token();
    first.release().await.expect("release");
    let second = bounded("the waiter", second).await.expect("task").expect("lock");
    assert!(second.token() > token);
    second.release().await.expect("release");
    // Without the tables, a user who may not create them is told what to do.
    let bare = Sql::new(db.url_for("app", "secret"))
        .with_table_prefix("missing_")
        .without_creating_tables();
    match Client::new(bare).session_with(options()).await {
        Err(Error::InvalidOptions { reason }) => assert!(reason.contains("DDL script"), "{reason}"),
        other => panic!("missing tables must be refused, got {other:?}"),
    }
}

async fn the_longest_names_and_any_characters_are_separate_locks(db: Db) {
    let session = open(db.url()).await.expect("session");
    let long = "ü".repeat(lockline::MAX_NAME_LEN / 2);
    let names = [long.as_str(), "Case", "case", "a/b", "a", "quote'\"\\;--", "日本/語"];
    let mut guards = Vec::new();
    for name in names {
        let guard = session
            .mutex(name)
            .expect("mutex")
            .try_lock()
            .await
            .expect("try_lock")
            .unwrap_or_else(|| panic!("{name:?} is taken by another name's holder"));
        assert!(guard.key().starts_with(name), "{} for {name:?}", guard.key());
        guards.push(guard);
    }
    assert_eq!(db.entries(), i64::try_from(names.len()).expect("count"));
    for guard in guards {
        guard.release().await.expect("release");
    }
}

/// A waiter ends a silent holder's connection only if the server lets it:
/// the same database user, or one with the privilege. Without it the
/// waiter's `lock()` fails with `PermissionDenied` naming the privilege
/// (rather than waiting for TCP to give up); with it, the waiter is granted.
async fn ending_another_users_silent_holder_needs_a_privilege(db: Db) {
    let ddl = Sql::new(db.url()).ddl().expect("ddl");
    db.sql(&ddl);
    for user in ["alice", "bob"] {
        db.create_user(user, "secret");
        if db.is_postgres() {
            db.sql(&format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON lockline_entries, lockline_sessions, lockline_meta, lockline_data, lockline_blocks TO {user}; \
                 GRANT USAGE, SELECT, UPDATE ON SEQUENCE lockline_entries_id_seq TO {user};"
            ));
        }
    }
    let short = SessionOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(2));
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let alice_url = db
        .url_for("alice", "secret")
        .replace(&format!("127.0.0.1:{}", db.port()), &proxy.address());
    let alice = Client::new(Sql::new(alice_url).without_creating_tables())
        .session_with(short.clone())
        .await
        .expect("alice's session");
    let held = alice.mutex("shared").expect("mutex").lock().await.expect("lock");
    proxy.blackhole();
    let bob = Client::new(Sql::new(db.url_for("bob", "secret")).without_creating_tables())
        .session_with(short.clone())
        .await
        .expect("bob's session");
    match bounded("bob's wait ends", bob.mutex("shared").expect("mutex").lock()).await {
        Err(Error::PermissionDenied { reason, .. }) => {
            let names = if db.is_postgres() {
                "pg_signal_backend"
            } else {
                "CONNECTION ADMIN"
            };
            assert!(reason.contains(names), "the reason must name {names}: {reason}");
        }
        other => {
            panic!("ending another user's connection without the privilege must be PermissionDenied, got {other:?}")
        }
    }
    bounded("alice hears of her loss", held.lost()).await;
    if db.is_postgres() {
        db.sql("GRANT pg_signal_backend TO bob");
    } else {
        db.sql("GRANT CONNECTION ADMIN ON *.* TO 'bob'@'%'");
    }
    let bob = Client::new(Sql::new(db.url_for("bob", "secret")).without_creating_tables())
        .session_with(short)
        .await
        .expect("bob's session");
    let taken = bounded("bob is granted", bob.mutex("shared").expect("mutex").lock())
        .await
        .expect("lock");
    assert!(taken.token() > held.token());
    taken.release().await.expect("release");
    proxy.heal();
}

/// On a stock server, an unprivileged user with a database of its own
/// (PostgreSQL: its owner; MariaDB: all rights on it) needs nothing else:
/// the tables are made on first use, by two sessions opening at once.
async fn an_unprivileged_user_of_its_own_database_creates_the_tables(db: Db) {
    let url = db.owned_database_url("owner", "secret");
    let client = Client::new(Sql::new(url));
    let (a, b) = tokio::join!(client.session_with(options()), client.session_with(options()));
    let (a, b) = (a.expect("session"), b.expect("session"));
    let first = a.mutex("mine").expect("mutex").lock().await.expect("lock");
    let second = {
        let mutex = b.mutex("mine").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    let token = first.token();
    first.release().await.expect("release");
    let second = bounded("the waiter", second).await.expect("task").expect("lock");
    assert!(second.token() > token);
    second.release().await.expect("release");
}
