//! Real PostgreSQL and MariaDB servers for the SQL backend's tests, and the
//! conformance fixtures over them, and the session options the fault tests
//! use.

#![allow(dead_code)]

pub mod db;

/// Declares each case once per engine, `mod postgres` and `mod mariadb`: a
/// test `postgres::CASE` calls `CASE(Db::postgres())`, and likewise for
/// MariaDB (`Db` in scope where it is used).
#[allow(unused_macros)]
macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Db::postgres()).await;
                }
            )*
        }
        mod mariadb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Db::mariadb()).await;
                }
            )*
        }
    };
}

use lockline::conformance::Fixture;
use std::time::Duration;

use lockline::{Client, Session, SessionOptions};
use lockline_sql::Sql;
use lockline_testkit::{MariaDbOptions, MariaDbServer, PgOptions, PgServer};

/// A PostgreSQL server for one test: fsync off (a test never survives a
/// machine crash), everything else as shipped.
pub fn postgres() -> PgServer {
    PgServer::start_with(&PgOptions {
        durable: false,
        ..PgOptions::default()
    })
    .expect("start postgres")
}

/// A MariaDB server for one test with a database `lockline`, and its URL.
pub fn mariadb() -> (MariaDbServer, String) {
    let server = MariaDbServer::start_with(&MariaDbOptions {
        innodb_flush_log_at_trx_commit: 2,
        ..MariaDbOptions::default()
    })
    .expect("start mariadb");
    server.create_database("lockline").expect("create database");
    let url = format!("{}/lockline", server.url());
    (server, url)
}

/// Session options with a short TTL, as the fault tests use.
pub fn options(ttl_ms: u64) -> SessionOptions {
    // A session's first open reads the catalog, which a machine running the
    // suite beside two CPU hogs has been seen to take 4 s over: the cases
    // that measure a connect timeout set their own.
    SessionOptions::new()
        .with_ttl(Duration::from_millis(ttl_ms))
        .with_connect_timeout(Duration::from_secs(15))
        .with_request_timeout(Duration::from_secs(2))
}

/// The conformance cases' sessions: a 10 s TTL (the suite's default is 6 s).
/// No case waits for a TTL to run out; a case with 33 sessions in one
/// process, beside two CPU hogs, has seen a session lost at 6 s, which then
/// woke its waiters before any release.
fn conformance_options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(10))
}

/// Runs blocking harness work (a CLI call) off the async workers.
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.expect("blocking work")
}

pub struct PgFixture {
    pub server: std::sync::Arc<PgServer>,
}

impl PgFixture {
    pub fn start() -> Self {
        PgFixture {
            server: std::sync::Arc::new(postgres()),
        }
    }
}

#[lockline::async_trait]
impl Fixture for PgFixture {
    async fn client(&self) -> Client {
        Client::new(Sql::new(self.server.url()))
    }

    fn options(&self) -> SessionOptions {
        conformance_options()
    }

    /// Ends the session as its connection dying would (a crash, a reset):
    /// the server terminates it, which frees every guard; its rows stay,
    /// dead, for the next contender to pass over.
    async fn expire(&self, session: &Session) {
        let id = session.id().to_owned();
        let server = std::sync::Arc::clone(&self.server);
        blocking(move || {
            server
                .psql(&format!(
                    "SELECT pg_terminate_backend(pid, 5000) FROM lockline_sessions WHERE id = '{id}';"
                ))
                .expect("expire the session")
        })
        .await;
    }
}

pub struct MyFixture {
    pub server: std::sync::Arc<MariaDbServer>,
    pub url: String,
}

impl MyFixture {
    pub fn start() -> Self {
        let (server, url) = mariadb();
        MyFixture {
            server: std::sync::Arc::new(server),
            url,
        }
    }
}

#[lockline::async_trait]
impl Fixture for MyFixture {
    async fn client(&self) -> Client {
        Client::new(Sql::new(self.url.clone()))
    }

    fn options(&self) -> SessionOptions {
        conformance_options()
    }

    async fn expire(&self, session: &Session) {
        let id = session.id().to_owned();
        let server = std::sync::Arc::clone(&self.server);
        blocking(move || {
            let conn = server
                .sql(&format!(
                    "SELECT conn FROM lockline.lockline_sessions WHERE id = '{id}'"
                ))
                .expect("read the session");
            let conn = conn.trim();
            if !conn.is_empty() {
                // As its connection dying would; already gone is fine.
                let _ = server.sql(&format!("KILL CONNECTION {conn}"));
            }
        })
        .await;
    }
}
