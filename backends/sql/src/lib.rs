//! The SQL backend of [lockline](https://docs.rs/lockline): the same fair,
//! herd-free, fenced queue as on etcd and ZooKeeper, on the PostgreSQL or
//! MariaDB/MySQL database a team already runs, behind the same
//! `Client`/`Session`/`Mutex` API.
//!
//! ```no_run
//! use lockline_sql::{lockline::Client, Sql};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockline::Result<()> {
//! let client = Client::new(Sql::new("postgres://app:secret@db.internal/app"));
//! let session = client.session().await?; // one connection, renewed in the background
//! let guard = session.mutex("billing/nightly")?.lock().await?;
//! println!("held with fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How it uses the database
//!
//! - **Entries are rows** of `lockline_entries`; the identity column's value
//!   orders each lock's queue and is the fencing token (strictly increasing
//!   across the table).
//! - **Each entry is guarded by a named lock** its session's connection holds
//!   (a PostgreSQL session-level advisory lock, a MariaDB `GET_LOCK`), so the
//!   server frees it the moment that connection dies. A row whose guard is
//!   free is dead; whoever meets it deletes it before going past it.
//! - **A waiter blocks on the server** on its predecessor's guard only (shared
//!   on PostgreSQL): a release wakes exactly one waiter.
//! - **A silent owner cannot hold forever.** Each session renews a heartbeat
//!   (a count) once per keepalive interval however many locks it holds, on a
//!   control connection of its own that also checks the guard connection is
//!   still there, and proves the guard connection alive by a round trip on
//!   it; a statement there with no answer loses the session. A waiter whose
//!   predecessor's count has not moved for its TTL by the waiter's own
//!   monotonic clock ends that session's connection
//!   (`pg_terminate_backend`, `KILL CONNECTION`) and deletes its rows; the
//!   owner has told its holders `lost()` at `ttl - safety margin` after the
//!   send time of its last answered heartbeat, before that. No wall clock
//!   is compared.
//! - **Bounded connections.** A session has one connection that holds its
//!   guards, its control connection (on PostgreSQL, while it watches
//!   lock-mode entries, also one that listens for their writes), and at most
//!   [`Sql::with_wait_connections`] more for its waiters (16 by default),
//!   given to the waiters nearest the heads of their queues; waiters beyond
//!   them have their predecessors looked at every 100 ms, in one statement.
//! - **Lock modes** (`Resource`): a contender is an entry row of kind `dlm`;
//!   the queue is read in one statement and changed conditionally in one
//!   call of a function (PostgreSQL) or procedure (MariaDB/MySQL), its token
//!   drawn from the entries' id counter; a resource's lock value block is a
//!   row of `lockline_blocks`. A watcher of an entry waits on the server on
//!   the value lock its owner holds, and a write by another session wakes
//!   that entry's watchers alone (PostgreSQL `NOTIFY` on the entry's channel;
//!   MariaDB `KILL QUERY` of the waits holding its watch slots).
//! - **A reset connection frees its locks at once**, as a crash does: the
//!   holder hears `lost()` at its next heartbeat, within a keepalive
//!   interval (the SQL chapter of the documentation, `docs/sql.md`, says
//!   what this means).
//!
//! The tables are created on first use (or by a DBA with the script from
//! [`Sql::ddl`]); the SQL chapter, `docs/sql.md`, gives the layout, the
//! privileges and the server settings.
//!
//! # Fenced transactions
//!
//! [`FencedTransaction`] runs a transaction on the application's own
//! database that commits only if the lock is still held at commit time: the
//! entry row is checked and locked in that transaction, so neither a reaper
//! nor the next holder can slip between the check and the commit.
//!
//! The check is the database's own: `lockline_fence(KEY)` (a function on
//! PostgreSQL, a procedure on MariaDB/MySQL, created with the tables; named
//! `PREFIX` + `fence` under [`Sql::with_table_prefix`]), which
//! [`FencedTransaction::commit`] calls and any other driver or language can
//! call last in its own transaction with the lock's key (`guard.key()`, the
//! CLI's `LOCKLINE_KEY`):
//!
//! ```text
//! BEGIN;
//! UPDATE ledger SET balance = balance + 1;
//! SELECT lockline_fence('ledger/1730000000000042');   -- MariaDB/MySQL: CALL lockline_fence(...)
//! COMMIT;
//! ```
//!
//! A lock no longer held is refused with SQLSTATE [`NOT_HELD_POSTGRES`]
//! (`LL002`) or [`NOT_HELD_MYSQL`] (`45L02`, error number 1644), and nothing
//! the transaction wrote commits (PostgreSQL aborts the transaction, the
//! MariaDB/MySQL procedure rolls it back); a key that is no entry's is
//! SQLSTATE `22023`. `docs/fenced-writes.md` shows it from `tokio-postgres`,
//! psycopg2, PyMySQL, Go's `database/sql` (lib/pq, go-sql-driver/mysql),
//! `psql` and `mariadb`.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod alike;
mod ddl;
mod dialect;
mod error;
mod fenced;
mod layout;
#[cfg(feature = "mysql")]
mod my;
mod notices;
#[cfg(feature = "postgres")]
mod pg;
mod pool;
mod session;
mod tables;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockline::backend::{Backend, BackendSession};
use lockline::{Error, Result, SessionOptions};

pub use lockline;

pub use crate::fenced::{FencedTransaction, NOT_HELD_MYSQL, NOT_HELD_POSTGRES};
use crate::layout::Tables;
use crate::session::SqlSession;

/// The number of wait connections a session keeps at most, unless set.
pub const DEFAULT_WAIT_CONNECTIONS: usize = 16;

/// The database engines the backend speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Engine {
    /// PostgreSQL 14 or later.
    Postgres,
    /// MariaDB 10.6 or later, or MySQL 8.
    MySql,
}

/// What every connection of a session is set up with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// How long the owning connection may wait for a row lock.
    pub(crate) owner_lock_timeout: Duration,
    /// How often a PostgreSQL server checks that a waiting client is still
    /// there (`client_connection_check_interval`).
    pub(crate) check_interval: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) create_tables: bool,
    /// A dead entry whose session is still there blocks (see
    /// `Sql::with_reset_grace`).
    pub(crate) reset_grace: bool,
    /// How the server probes a connection whose client went silent.
    pub(crate) server_keepalive: ServerKeepalive,
}

/// The TCP keepalive and user timeout a PostgreSQL server applies to a
/// lockline connection (`tcp_keepalives_idle`, `tcp_keepalives_interval`,
/// `tcp_keepalives_count`, `tcp_user_timeout`): a second line of defence
/// behind the client's bounded round trips. A server that hears nothing from
/// a connection's client (no answer to its probes, no acknowledgement of what
/// it sent) ends it, and frees its guards and its slot, but never sooner
/// than two keepalive intervals + the longer of the TTL and the request
/// timeout + 1 s + the safety margin after the client last spoke: by then the client's own
/// bounds have declared the session lost (the owning connection is pinged
/// at the latest two intervals after it last answered, and a statement
/// there without an answer within the longer of the loss deadline and the
/// request timeout loses the session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerKeepalive {
    pub(crate) idle_s: u64,
    pub(crate) interval_s: u64,
    pub(crate) count: u64,
    pub(crate) user_timeout_ms: u64,
}

impl ServerKeepalive {
    /// Probes: this many, a whole number of seconds apart.
    const PROBES: u64 = 5;

    pub(crate) fn new(options: &SessionOptions) -> Self {
        // Linux's limits: idle and interval in whole seconds up to 32,767,
        // at most 127 probes.
        const MAX_S: u64 = 32_767;
        const MAX_PROBES: u64 = 127;
        // A second and the safety margin for timers that fire late on a
        // busy machine.
        let margin = options.ttl().saturating_sub(options.loss_deadline());
        let silence = options.keepalive_interval() * 2
            + options.ttl().max(options.request_timeout())
            + Duration::from_secs(1)
            + margin;
        let silence_s = silence.as_secs() + u64::from(silence.subsec_nanos() > 0);
        let idle_s = options.keepalive_interval().as_secs().clamp(1, MAX_S);
        let rest = silence_s.saturating_sub(idle_s);
        let interval_s = rest.div_ceil(Self::PROBES).clamp(1, MAX_S);
        let count = rest.div_ceil(interval_s).clamp(Self::PROBES, MAX_PROBES);
        ServerKeepalive {
            idle_s,
            interval_s,
            count,
            user_timeout_ms: u64::try_from(silence.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// How long after the client last spoke the server gives up probing.
    #[cfg(test)]
    fn gives_up_after(self) -> Duration {
        Duration::from_secs(self.idle_s + self.interval_s * self.count)
    }
}

/// The SQL backend: one PostgreSQL or MariaDB/MySQL database.
///
/// ```
/// use lockline_sql::Sql;
///
/// let postgres = Sql::new("postgres://app:secret@127.0.0.1:5432/app");
/// let mariadb = Sql::new("mysql://app:secret@127.0.0.1:3306/app")
///     .with_table_prefix("locks_")
///     .with_wait_connections(4);
/// assert!(postgres.ddl().unwrap().contains("CREATE UNLOGGED TABLE"));
/// assert!(mariadb.ddl().unwrap().contains("ENGINE=InnoDB"));
/// ```
#[derive(Clone)]
pub struct Sql {
    url: String,
    schema: Option<String>,
    prefix: String,
    wait_connections: usize,
    create_tables: bool,
    restart_grace: bool,
    reset_grace: bool,
}

impl fmt::Debug for Sql {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sql")
            .field("url", &redact(&self.url))
            .field("schema", &self.schema)
            .field("prefix", &self.prefix)
            .field("wait_connections", &self.wait_connections)
            .field("create_tables", &self.create_tables)
            .field("restart_grace", &self.restart_grace)
            .field("reset_grace", &self.reset_grace)
            .finish()
    }
}

/// A URL with its password (if any) replaced by `***` and its query
/// (which may hold `password=`) left out. Robust to passwords that hold
/// unencoded `/`, `?` or `@`: everything up to the last `@` is credentials.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not a URL)".to_owned();
    };
    let (credentials, place) = match rest.rsplit_once('@') {
        Some((credentials, place)) => (Some(credentials), place),
        None => (None, rest),
    };
    let place = place.split_once('?').map_or(place, |(p, _)| p);
    match credentials {
        Some(credentials) => {
            let user = credentials.split([':', '/', '?']).next().unwrap_or_default();
            if credentials.len() > user.len() {
                format!("{scheme}://{user}:***@{place}")
            } else {
                format!("{scheme}://{user}@{place}")
            }
        }
        None => format!("{scheme}://{place}"),
    }
}

/// A hint for a URL whose credentials hold characters that must be
/// percent-encoded.
pub(crate) fn encoding_hint(url: &str) -> &'static str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    match rest.rsplit_once('@') {
        Some((credentials, _)) if credentials.contains(['/', '?', '@', '#']) => {
            " (percent-encode /, ?, @ and # in the user name and password: / is %2F)"
        }
        _ => "",
    }
}

#[cfg(feature = "postgres")]
pub(crate) fn pg_target(options: &sqlx::postgres::PgConnectOptions) -> String {
    format!(
        "postgres://{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    )
}

#[cfg(feature = "mysql")]
pub(crate) fn my_target(options: &sqlx::mysql::MySqlConnectOptions) -> String {
    format!(
        "mysql://{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    )
}

impl Sql {
    /// A database by URL: `postgres://` or `postgresql://` for PostgreSQL,
    /// `mysql://` or `mariadb://` for MariaDB and MySQL, with the user,
    /// password, host, port and database
    /// (`postgres://USER:PASSWORD@HOST:PORT/DATABASE`), and the driver's
    /// query options (`?sslmode=require`, `?ssl-mode=REQUIRED`, ...).
    /// Nothing is connected until a session opens.
    pub fn new(url: impl Into<String>) -> Self {
        Sql {
            url: url.into(),
            schema: None,
            prefix: layout::DEFAULT_PREFIX.to_owned(),
            wait_connections: DEFAULT_WAIT_CONNECTIONS,
            create_tables: true,
            restart_grace: true,
            reset_grace: false,
        }
    }

    /// Keeps lockline's tables in this PostgreSQL schema (default: the
    /// connection's current schema) or MariaDB/MySQL database (default: the
    /// URL's). A lower-case identifier.
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Names lockline's tables `PREFIX` + `entries`, `sessions`, `meta`,
    /// `data`, `blocks` (and `run` on MariaDB/MySQL), and its functions or
    /// procedures likewise (default `lockline_`). A lower-case identifier,
    /// possibly empty.
    pub fn with_table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many connections a session may open for its waiters, besides the
    /// one that holds its locks (default [`DEFAULT_WAIT_CONNECTIONS`]). A
    /// session waits on the server for at most this many locks at once;
    /// further waiters queue in the process, nearest the head first.
    pub fn with_wait_connections(mut self, connections: usize) -> Self {
        self.wait_connections = connections;
        self
    }

    /// Never creates tables: a session fails to open unless the tables from
    /// [`ddl`](Self::ddl) exist (for users without the right to create them).
    pub fn without_creating_tables(mut self) -> Self {
        self.create_tables = false;
        self
    }

    /// Grants at once after a database restart. By default a session
    /// opened after a restart grants nothing until the longest TTL of a
    /// session opened before it has passed since the server started (the
    /// *restart grace*, as Chubby does on a master change): every holder
    /// from before has heard `lost()` by then, so no grant comes before
    /// an old holder is told. Without it the next holder may be granted
    /// within a second of the restart while an old one hears `lost()` only
    /// at its next heartbeat; fencing tokens still tell them apart.
    pub fn without_restart_grace(mut self) -> Self {
        self.restart_grace = false;
        self
    }

    /// Grants past a holder whose connection was *reset* only once that
    /// holder has heard `lost()` (its session ended) or its heartbeat has
    /// stood still for its TTL, as on etcd. Off by default: the server
    /// frees a connection's locks the moment it ends, and a reset cannot be
    /// told from a crash, so without this a crashed holder is replaced
    /// within a second while a holder whose connection alone was reset
    /// (an administrator's `pg_terminate_backend`, a middlebox's reset)
    /// may hear `lost()` only at its next heartbeat, after the next grant —
    /// the window fencing tokens cover. With it, that window is closed and
    /// a crashed holder costs its TTL instead (a reset holder that is alive
    /// ends its session at its next heartbeat, within a keepalive interval).
    pub fn with_reset_grace(mut self) -> Self {
        self.reset_grace = true;
        self
    }

    /// The engine the URL names.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a URL of another scheme.
    pub fn engine(&self) -> Result<Engine> {
        let scheme = self.url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => Ok(Engine::Postgres),
            Some("mysql" | "mariadb") => Ok(Engine::MySql),
            _ => Err(Error::InvalidOptions {
                reason: format!(
                    "invalid database URL {:?}: expected postgres://, postgresql://, mysql:// or mariadb://",
                    redact(&self.url)
                ),
            }),
        }
    }

    /// The script that creates lockline's tables (and its functions on
    /// PostgreSQL, its procedures on MariaDB/MySQL), for a DBA who creates
    /// them rather than letting lockline do it on first use. It names the
    /// schema given with [`with_schema`](Self::with_schema) (`public` when
    /// none is given on PostgreSQL; the URL's database on MariaDB/MySQL).
    /// It is the crate's `ddl/postgres.sql` or `ddl/mariadb.sql` (which run
    /// as they are for schema `public` or database `lockline` and the
    /// default table prefix) with these names, and what a session runs
    /// when it creates the tables itself.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for an unknown URL scheme, a bad schema or
    /// prefix, or a MariaDB/MySQL URL without a database.
    pub fn ddl(&self) -> Result<String> {
        let tables = Tables::new(self.schema.as_deref(), &self.prefix)?;
        let settings = self.settings(&SessionOptions::default());
        match self.engine()? {
            #[cfg(feature = "postgres")]
            Engine::Postgres => pg::Postgres::new(&self.url, tables, settings)?.ddl(None),
            #[cfg(feature = "mysql")]
            Engine::MySql => my::MySql::new(&self.url, tables, settings)?.ddl(None),
            #[allow(unreachable_patterns)]
            engine => Err(disabled(engine)),
        }
    }

    fn settings(&self, options: &SessionOptions) -> Settings {
        let keepalive = options.keepalive_interval();
        Settings {
            owner_lock_timeout: (keepalive / 2).clamp(Duration::from_millis(100), Duration::from_secs(2)),
            check_interval: keepalive.clamp(Duration::from_millis(500), Duration::from_secs(5)),
            request_timeout: options.request_timeout(),
            create_tables: self.create_tables,
            reset_grace: self.reset_grace,
            server_keepalive: ServerKeepalive::new(options),
        }
    }

    fn target(&self) -> String {
        redact(&self.url)
    }

    fn check(&self) -> Result<(Engine, Tables)> {
        let engine = self.engine()?;
        let tables = Tables::new(self.schema.as_deref(), &self.prefix)?;
        if self.wait_connections == 0 {
            return Err(Error::InvalidOptions {
                reason: "a session needs at least one wait connection".into(),
            });
        }
        Ok((engine, tables))
    }
}

impl Sql {
    /// Opens a session over one engine's statements.
    async fn open_with<D: dialect::Dialect>(
        &self,
        dialect: D,
        target: String,
        options: &SessionOptions,
    ) -> Result<Arc<dyn BackendSession>> {
        let session = SqlSession::open(
            Arc::new(dialect),
            target,
            options.clone(),
            self.wait_connections,
            self.restart_grace,
            self.reset_grace,
        )
        .await?;
        Ok(Arc::new(session))
    }
}

#[allow(dead_code)]
fn disabled(engine: Engine) -> Error {
    Error::InvalidOptions {
        reason: format!("lockline-sql was built without the cargo feature for {engine:?}"),
    }
}

#[async_trait::async_trait]
impl Backend for Sql {
    fn name(&self) -> &'static str {
        match self.engine() {
            Ok(Engine::MySql) => "mysql",
            _ => "postgres",
        }
    }

    fn describe(&self) -> String {
        self.target()
    }

    fn validate_key(&self, key: &str) -> Result<()> {
        if matches!(self.engine(), Ok(Engine::MySql)) && key.len() > 3072 {
            return Err(Error::InvalidName {
                name: key.to_owned(),
                reason: "a fenced-write key on MariaDB/MySQL is at most 3072 bytes".into(),
            });
        }
        if key.contains('\0') {
            return Err(Error::InvalidName {
                name: key.to_owned(),
                reason: "a key cannot hold a NUL character".into(),
            });
        }
        Ok(())
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<Arc<dyn BackendSession>> {
        options.validate()?;
        let (engine, tables) = self.check()?;
        let settings = self.settings(options);
        let target = self.target();
        match engine {
            #[cfg(feature = "postgres")]
            Engine::Postgres => {
                self.open_with(pg::Postgres::new(&self.url, tables, settings)?, target, options)
                    .await
            }
            #[cfg(feature = "mysql")]
            Engine::MySql => {
                self.open_with(my::MySql::new(&self.url, tables, settings)?, target, options)
                    .await
            }
            #[allow(unreachable_patterns)]
            engine => Err(disabled(engine)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact("postgres://app:secret@db:5432/app?sslmode=require&password=x"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(redact("mysql://root@127.0.0.1/x"), "mysql://root@127.0.0.1/x");
        assert_eq!(redact("postgres://db"), "postgres://db");
        assert_eq!(
            redact("postgres://app:pa/ss@127.0.0.1:1/app"),
            "postgres://app:***@127.0.0.1:1/app"
        );
        assert_eq!(redact("postgres://app:p@ss?w@h:1/app"), "postgres://app:***@h:1/app");
        assert_eq!(
            redact("postgres://app@127.0.0.1:1?password=s3cret"),
            "postgres://app@127.0.0.1:1"
        );
        assert_eq!(redact("postgres://h?password=s3cret"), "postgres://h");
        assert_eq!(redact("secret"), "(not a URL)");
        for url in [
            "postgres://u:hunter2@h/d",
            "mysql://u:hun/ter2@h/d",
            "postgres://h:1?password=hunter2",
        ] {
            assert!(!format!("{:?}", Sql::new(url)).contains("hunter2"), "{url}");
            assert!(!format!("{:?}", Sql::new(url)).contains("hun/ter2"), "{url}");
        }
    }

    #[test]
    fn the_server_gives_a_silent_client_up_only_after_its_own_bounds() {
        for (ttl, keepalive, request) in [
            (3.0, 1.0, 5.0),
            (6.0, 2.0, 5.0),
            (1.0, 0.1, 0.2),
            (3600.0, 1200.0, 0.2),
            (86400.0, 60.0, 30.0),
        ] {
            let options = SessionOptions::new()
                .with_ttl(Duration::from_secs_f64(ttl))
                .with_keepalive_interval(Duration::from_secs_f64(keepalive))
                .with_request_timeout(Duration::from_secs_f64(request));
            let probe = ServerKeepalive::new(&options);
            // The owning connection pinged at the latest two intervals after
            // it last answered, lost once a statement there has no answer
            // within the longer of the request timeout and the loss deadline.
            let client_bound =
                options.keepalive_interval() * 2 + options.request_timeout().max(options.loss_deadline());
            assert!(probe.gives_up_after() >= client_bound, "{probe:?} for {options:?}");
            assert!(
                Duration::from_millis(probe.user_timeout_ms) >= client_bound,
                "{probe:?}"
            );
            assert!(probe.idle_s >= 1 && probe.interval_s >= 1, "{probe:?}");
        }
    }

    #[test]
    fn engines_come_from_the_scheme() {
        assert_eq!(Sql::new("postgresql://h/d").engine().ok(), Some(Engine::Postgres));
        assert_eq!(Sql::new("mariadb://h/d").engine().ok(), Some(Engine::MySql));
        assert!(matches!(
            Sql::new("redis://h").engine(),
            Err(Error::InvalidOptions { .. })
        ));
    }
}
