//! What `bench_sql`, `crowd_sql` and `scale_sql` share: the engines, their
//! servers (started by the testkit), a plain SQL connection for the
//! baselines and the monitor, and the servers' own counters.

// Each example uses part of this module.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use lockline_bench::BoxResult;
use lockline_testkit::{MariaDbOptions, MariaDbServer, PgOptions, PgServer};
use sqlx::mysql::MySqlConnection;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

/// The database the MariaDB runs use (lockline's MySQL URLs name one).
const MARIADB_DATABASE: &str = "bench";

/// The database a PostgreSQL monitor connects to: `pg_stat_database`
/// counts per database, so the monitor's own statements stay out of the
/// benchmark database's counts.
const MONITOR_DATABASE: &str = "monitor";

/// One of the two engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Postgres,
    MariaDb,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Postgres => "PostgreSQL",
            Engine::MariaDb => "MariaDB",
        }
    }

    /// The `--engine` value that names it.
    pub fn flag(self) -> &'static str {
        match self {
            Engine::Postgres => "postgres",
            Engine::MariaDb => "mariadb",
        }
    }

    /// The engines `--engine` names: `postgres`, `mariadb` or `both`
    /// (the default).
    pub fn parse_list(value: Option<&str>) -> Result<Vec<Engine>, String> {
        match value.unwrap_or("both") {
            "both" => Ok(vec![Engine::Postgres, Engine::MariaDb]),
            "postgres" | "postgresql" => Ok(vec![Engine::Postgres]),
            "mariadb" | "mysql" => Ok(vec![Engine::MariaDb]),
            other => Err(format!("bad --engine {other:?}: postgres, mariadb or both")),
        }
    }
}

/// A server of either engine.
#[derive(Debug)]
pub enum Server {
    Postgres(PgServer),
    MariaDb(MariaDbServer),
}

impl Server {
    /// PostgreSQL with `fsync=on` and `full_page_writes=on` (commits flushed
    /// as in production), `max_connections`, and more settings.
    pub fn postgres(max_connections: u32, settings: &[(&str, String)]) -> BoxResult<Server> {
        let server = PgServer::start_with(&PgOptions {
            durable: true,
            max_connections,
            settings: settings.iter().map(|(n, v)| ((*n).to_owned(), v.clone())).collect(),
        })?;
        server.create_database(MONITOR_DATABASE, "postgres")?;
        Ok(Server::Postgres(server))
    }

    /// MariaDB with `innodb_flush_log_at_trx_commit` = `flush` and
    /// `max_connections`, and a database for lockline's tables.
    pub fn mariadb(flush: u8, max_connections: u32) -> BoxResult<Server> {
        Self::mariadb_with(flush, max_connections, &[])
    }

    /// [`mariadb`](Self::mariadb) with more `mariadbd` options.
    pub fn mariadb_with(flush: u8, max_connections: u32, settings: &[(&str, String)]) -> BoxResult<Server> {
        let server = MariaDbServer::start_with(&MariaDbOptions {
            innodb_flush_log_at_trx_commit: flush,
            max_connections,
            settings: settings.iter().map(|(n, v)| ((*n).to_owned(), v.clone())).collect(),
        })?;
        server.create_database(MARIADB_DATABASE)?;
        Ok(Server::MariaDb(server))
    }

    pub fn engine(&self) -> Engine {
        match self {
            Server::Postgres(_) => Engine::Postgres,
            Server::MariaDb(_) => Engine::MariaDb,
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            Server::Postgres(server) => server.port(),
            Server::MariaDb(server) => server.port(),
        }
    }

    /// The server's processes: MariaDB's one; PostgreSQL's postmaster and
    /// every process it forked (a backend per connection, and its helpers).
    pub fn pids(&mut self) -> Vec<u32> {
        match self {
            Server::MariaDb(server) => server.member().pid().into_iter().collect(),
            Server::Postgres(server) => {
                let Some(postmaster) = server.member().pid() else {
                    return Vec::new();
                };
                let mut pids = vec![postmaster];
                for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                    let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                        continue;
                    };
                    if stat_field(pid, 1) == Some(u64::from(postmaster)) {
                        pids.push(pid);
                    }
                }
                pids
            }
        }
    }

    /// The superuser's URL on the benchmark's database.
    pub fn url(&self) -> String {
        match self {
            Server::Postgres(server) => server.url(),
            Server::MariaDb(server) => format!("{}/{MARIADB_DATABASE}", server.url()),
        }
    }

    /// The URL of the monitor's connection ([`Db::counters`]): on
    /// PostgreSQL another database than the benchmark's.
    pub fn monitor_url(&self) -> String {
        match self {
            Server::Postgres(server) => {
                let url = server.url();
                let base = url.rsplit_once('/').map_or(url.as_str(), |(base, _)| base);
                format!("{base}/{MONITOR_DATABASE}")
            }
            Server::MariaDb(_) => self.url(),
        }
    }

    /// [`url`](Self::url) through a proxy at `address` (`127.0.0.1:PORT`).
    pub fn url_through(&self, address: &str) -> String {
        self.url().replace(&format!("127.0.0.1:{}", self.port()), address)
    }

    /// `version()` and the durability settings, for the header.
    pub async fn describe(&self, db: &mut Db) -> BoxResult<String> {
        Ok(match self {
            Server::Postgres(_) => format!(
                "{} (fsync={}, synchronous_commit={}, full_page_writes={}, wal_sync_method={}, max_connections={})",
                db.text("SELECT split_part(version(), ' ', 2)").await?,
                db.text("SHOW fsync").await?,
                db.text("SHOW synchronous_commit").await?,
                db.text("SHOW full_page_writes").await?,
                db.text("SHOW wal_sync_method").await?,
                db.text("SHOW max_connections").await?,
            ),
            Server::MariaDb(_) => format!(
                "{} (innodb_flush_log_at_trx_commit={}, sync_binlog={}, log_bin={}, max_connections={})",
                db.text("SELECT VERSION()").await?,
                db.text("SELECT CAST(@@innodb_flush_log_at_trx_commit AS CHAR)").await?,
                db.text("SELECT CAST(@@sync_binlog AS CHAR)").await?,
                db.text("SELECT CAST(@@log_bin AS CHAR)").await?,
                db.text("SELECT CAST(@@max_connections AS CHAR)").await?,
            ),
        })
    }
}

/// A plain connection of either engine: the baselines' and the monitor's.
/// It counts the statements it sends, so that a monitor can take its own
/// out of the server's counts.
#[derive(Debug)]
pub enum Conn {
    Postgres(PgConnection),
    MariaDb(MySqlConnection),
}

#[derive(Debug)]
pub struct Db {
    pub conn: Conn,
    pub sent: u64,
}

impl Db {
    pub async fn connect(engine: Engine, url: &str) -> BoxResult<Db> {
        let conn = match engine {
            Engine::Postgres => Conn::Postgres(PgConnection::connect(url).await?),
            Engine::MariaDb => Conn::MariaDb(MySqlConnection::connect(url).await?),
        };
        Ok(Db { conn, sent: 0 })
    }

    pub fn engine(&self) -> Engine {
        match self.conn {
            Conn::Postgres(_) => Engine::Postgres,
            Conn::MariaDb(_) => Engine::MariaDb,
        }
    }

    /// Runs a statement (or, without parameters, several) and returns the
    /// rows it affected.
    pub async fn execute(&mut self, sql: &str) -> BoxResult<u64> {
        self.sent += 1;
        Ok(match &mut self.conn {
            Conn::Postgres(conn) => sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(conn)
                .await?
                .rows_affected(),
            Conn::MariaDb(conn) => sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(conn)
                .await?
                .rows_affected(),
        })
    }

    /// Runs a statement with text and number parameters (`$1`... on
    /// PostgreSQL, `?` on MariaDB) and returns the rows it affected.
    pub async fn execute_with(&mut self, sql: &str, texts: &[&str], number: Option<i64>) -> BoxResult<u64> {
        self.sent += 1;
        Ok(match &mut self.conn {
            Conn::Postgres(conn) => {
                let mut query = sqlx::query(AssertSqlSafe(sql.to_owned()));
                for text in texts {
                    query = query.bind(*text);
                }
                if let Some(number) = number {
                    query = query.bind(number);
                }
                query.execute(conn).await?.rows_affected()
            }
            Conn::MariaDb(conn) => {
                let mut query = sqlx::query(AssertSqlSafe(sql.to_owned()));
                for text in texts {
                    query = query.bind(*text);
                }
                if let Some(number) = number {
                    query = query.bind(number);
                }
                query.execute(conn).await?.rows_affected()
            }
        })
    }

    /// An integer or NULL from a statement with text parameters (`$1`... on
    /// PostgreSQL, `?` on MariaDB): `GET_LOCK`'s answer, say.
    pub async fn optional_number_with(&mut self, sql: &str, texts: &[&str]) -> BoxResult<Option<i64>> {
        self.sent += 1;
        Ok(match &mut self.conn {
            Conn::Postgres(conn) => {
                let mut query = sqlx::query_scalar(AssertSqlSafe(sql.to_owned()));
                for text in texts {
                    query = query.bind(*text);
                }
                query.fetch_one(conn).await?
            }
            Conn::MariaDb(conn) => {
                let mut query = sqlx::query_scalar(AssertSqlSafe(sql.to_owned()));
                for text in texts {
                    query = query.bind(*text);
                }
                query.fetch_one(conn).await?
            }
        })
    }

    /// One number (a `bigint` on PostgreSQL, any integer or text on MariaDB).
    pub async fn number(&mut self, sql: &str) -> BoxResult<i64> {
        self.sent += 1;
        Ok(match &mut self.conn {
            Conn::Postgres(conn) => {
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
                    .fetch_one(conn)
                    .await?
            }
            Conn::MariaDb(conn) => {
                let text: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!("SELECT CAST(({sql}) AS CHAR)")))
                    .fetch_one(conn)
                    .await?;
                let text = text.ok_or_else(|| format!("{sql:?} answered NULL"))?;
                text.trim().parse()?
            }
        })
    }

    /// One text value (`NULL` for a null).
    pub async fn text(&mut self, sql: &str) -> BoxResult<String> {
        self.sent += 1;
        let text = match &mut self.conn {
            Conn::Postgres(conn) => {
                sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(sql.to_owned()))
                    .fetch_one(conn)
                    .await?
            }
            Conn::MariaDb(conn) => {
                sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(sql.to_owned()))
                    .fetch_one(conn)
                    .await?
            }
        };
        Ok(text.unwrap_or_else(|| "NULL".to_owned()))
    }

    /// MariaDB's latest detected deadlock (`SHOW ENGINE INNODB STATUS`),
    /// its statements and locks only; `None` without one, or on PostgreSQL.
    pub async fn latest_deadlock(&mut self) -> Option<String> {
        let Conn::MariaDb(conn) = &mut self.conn else {
            return None;
        };
        let (_, _, status): (String, String, String) =
            sqlx::query_as("SHOW ENGINE INNODB STATUS").fetch_one(conn).await.ok()?;
        let section = status
            .split("LATEST DETECTED DEADLOCK")
            .nth(1)?
            .split("\nTRANSACTIONS\n")
            .next()?;
        let keep = |line: &&str| {
            [
                "***",
                "RECORD LOCKS",
                "TABLE LOCK",
                "SELECT",
                "INSERT",
                "UPDATE",
                "DELETE",
                "DO ",
            ]
            .iter()
            .any(|start| line.starts_with(start))
        };
        Some(section.lines().filter(keep).collect::<Vec<_>>().join("\n"))
    }

    /// Client connections to the server other than this one.
    pub async fn connections(&mut self) -> BoxResult<i64> {
        let sql = match self.engine() {
            Engine::Postgres => {
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            }
            Engine::MariaDb => {
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE ID <> CONNECTION_ID() AND COMMAND NOT IN ('Daemon', 'Binlog Dump') AND USER <> 'system user'"
            }
        };
        self.number(sql).await
    }

    /// Waits until at most `count` other client connections are left (those
    /// of a run closed: a PostgreSQL backend has flushed its statistics when
    /// it leaves `pg_stat_activity`), up to 30 s.
    pub async fn wait_connections_at_most(&mut self, count: i64) -> BoxResult<()> {
        let left = self.connections_left(count, Duration::from_secs(30)).await?;
        if left > count {
            return Err(format!("{left} connections still open 30 s after their clients closed them").into());
        }
        Ok(())
    }

    /// Waits up to `within` until at most `count` other client connections
    /// are left; returns how many are.
    pub async fn connections_left(&mut self, count: i64, within: Duration) -> BoxResult<i64> {
        let deadline = Instant::now() + within;
        loop {
            let now = self.connections().await?;
            if now <= count || Instant::now() > deadline {
                return Ok(now);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The server's counters now, this connection's own statements left out.
    pub async fn counters(&mut self) -> BoxResult<Counters> {
        let sent_before = self.sent;
        let (statements, flushes, log_bytes) = match self.engine() {
            Engine::Postgres => (
                // The monitor is connected to another database.
                self.number("SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = 'postgres'")
                    .await?,
                self.number("SELECT wal_sync::bigint FROM pg_stat_wal").await?,
                self.number("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").await?,
            ),
            Engine::MariaDb => (
                self.number("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'QUESTIONS'")
                    .await?,
                self.number(
                    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_DATA_FSYNCS'",
                )
                .await?,
                self.number(
                    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_OS_LOG_WRITTEN'",
                )
                .await?,
            ),
        };
        let own = match self.engine() {
            Engine::Postgres => 0,
            Engine::MariaDb => sent_before,
        };
        Ok(Counters {
            statements: statements as f64,
            own: own as f64,
            flushes: flushes as f64,
            log_bytes: log_bytes as f64,
        })
    }
}

/// Whether `error` is the server's deadlock error (SQLSTATE 40001 on
/// MariaDB, `ER_LOCK_DEADLOCK`; 40P01 on PostgreSQL): InnoDB ends one of
/// the statements of a lock cycle this way, even autocommitted ones.
pub fn is_deadlock(error: &lockline_bench::BoxError) -> bool {
    match error.downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Database(db)) => matches!(db.code().as_deref(), Some("40001" | "40P01")),
        _ => false,
    }
}

/// A server's counters: statements run (PostgreSQL: transactions, each
/// autocommitted statement one; MariaDB: `Questions`), flushes of its
/// write-ahead log (`pg_stat_wal.wal_sync`; MariaDB 10.11 has no counter of
/// redo log fsyncs alone, so `Innodb_data_fsyncs`, every InnoDB fsync) and the
/// bytes written to it (WAL position, `Innodb_os_log_written`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub statements: f64,
    /// The monitor's own statements counted in `statements` (MariaDB: those
    /// sent before these were read; PostgreSQL: none, the monitor uses
    /// another database).
    pub own: f64,
    pub flushes: f64,
    pub log_bytes: f64,
}

impl Counters {
    /// What happened between `before` and `self`, per `units` (grants, say):
    /// statements (the monitor's own left out), flushes, log bytes.
    pub fn per(&self, before: &Counters, units: u64) -> PerUnit {
        let units = units.max(1) as f64;
        let own = self.own - before.own;
        PerUnit {
            statements: (self.statements - before.statements - own) / units,
            flushes: (self.flushes - before.flushes) / units,
            log_bytes: (self.log_bytes - before.log_bytes) / units,
        }
    }
}

/// Server counters per unit.
#[derive(Debug, Clone, Copy, Default)]
pub struct PerUnit {
    pub statements: f64,
    pub flushes: f64,
    pub log_bytes: f64,
}

/// The server's name for a flush of its log, for the tables' headers.
pub fn flush_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Postgres => "WAL flushes",
        Engine::MariaDb => "InnoDB fsyncs",
    }
}

/// The server's name for its statement counter.
pub fn statements_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Postgres => "transactions (pg_stat_database)",
        Engine::MariaDb => "statements (Questions)",
    }
}

/// Field `index` of `/proc/PID/stat` counted from the state (0) after the
/// command name, as a number.
fn stat_field(pid: u32, index: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(index)?.parse().ok()
}

/// The CPU time (user + system) of processes `pids` so far, in seconds;
/// `None` for this process.
pub fn cpu_seconds(pids: Option<&[u32]>) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let of = |pid: Option<u32>| {
        let pid = pid.map_or_else(|| "self".to_owned(), |p| p.to_string());
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
        (field(11) + field(12)) / ticks
    };
    match pids {
        None => of(None),
        Some(pids) => pids.iter().map(|pid| of(Some(*pid))).sum(),
    }
}
