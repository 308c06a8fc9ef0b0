//! Helpers for the attack tests (`attacks_sql/`, and the MariaDB ones beside
//! it): a side connection of the test's own (to look at the server, or to
//! hold a row lock at a chosen moment), bounded waits on server state, and
//! the session options of `support`.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use sqlx::{Connection, Executor, Row};

pub use crate::support::options;

/// The longest one step of an attack may take before it counts as stuck.
pub const STEP: Duration = Duration::from_secs(20);

/// `Some(value)` if `step` finishes within `within`, `None` if not.
pub async fn within<T>(within: Duration, step: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout(within, step).await.ok()
}

/// Bounds a step by [`STEP`]; panics naming it when it takes longer.
pub async fn step<T>(what: &str, step: impl Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, step).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: did not happen within {STEP:?}"),
    }
}

/// One connection of the test's own to the database under test.
pub enum Side {
    Pg(sqlx::PgConnection),
    My(sqlx::MySqlConnection),
}

impl Side {
    pub async fn connect(url: &str) -> Side {
        if url.starts_with("postgres") {
            Side::Pg(sqlx::PgConnection::connect(url).await.expect("side connection"))
        } else {
            Side::My(sqlx::MySqlConnection::connect(url).await.expect("side connection"))
        }
    }

    /// Waits (bounded, as [`until`](Self::until)) until the count `sql`
    /// answers is at least `least`.
    pub async fn until_at_least(&mut self, what: &str, sql: &str, least: i64) {
        self.until(what, sql, |count| count >= least).await;
    }

    /// Runs statements (no results wanted).
    pub async fn exec(&mut self, sql: &str) {
        self.try_exec(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub async fn try_exec(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        match self {
            Side::Pg(conn) => conn
                .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())))
                .await
                .map(drop),
            Side::My(conn) => conn
                .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())))
                .await
                .map(drop),
        }
    }

    /// One integer a query answers (NULL as 0).
    pub async fn int(&mut self, sql: &str) -> i64 {
        match self {
            Side::Pg(conn) => {
                let row = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                    .fetch_one(conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                row.try_get::<Option<i64>, _>(0).expect("an integer").unwrap_or(0)
            }
            Side::My(conn) => {
                let row = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                    .fetch_one(conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                row.try_get::<Option<i64>, _>(0).expect("an integer").unwrap_or(0)
            }
        }
    }

    /// Rows of one text column.
    pub async fn texts(&mut self, sql: &str) -> Vec<String> {
        match self {
            Side::Pg(conn) => sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_all(conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .iter()
                .map(|r| r.try_get::<String, _>(0).expect("text"))
                .collect(),
            Side::My(conn) => sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_all(conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .iter()
                .map(|r| r.try_get::<String, _>(0).expect("text"))
                .collect(),
        }
    }

    /// Waits until `sql` answers a number for which `ok` holds, probing every
    /// 20 ms for at most [`STEP`] (server state has no event to await).
    pub async fn until(&mut self, what: &str, sql: &str, ok: impl Fn(i64) -> bool) -> i64 {
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let value = self.int(sql).await;
            if ok(value) {
                return value;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("{what}: still {value} after {STEP:?} ({sql})");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Prints lockline's warnings (and, with `LOCKLINE_ATTACK_DEBUG` set, its
/// debug events) to standard error, for diagnosing a failing attack: a
/// subscriber of its own, so the crate needs no new dependency.
pub fn log_warnings() {
    struct Printer {
        debug: bool,
    }
    struct Fields(String);
    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={:?}", field.name(), value));
        }
    }
    impl tracing::Subscriber for Printer {
        fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
            *metadata.level() <= tracing::Level::WARN || (self.debug && *metadata.level() <= tracing::Level::DEBUG)
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            eprintln!(
                "[{} {}]{}",
                event.metadata().level(),
                event.metadata().target(),
                fields.0
            );
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }
    let debug = std::env::var_os("LOCKLINE_ATTACK_DEBUG").is_some();
    let _ = tracing::subscriber::set_global_default(Printer { debug });
}
