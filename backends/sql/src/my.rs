//! MariaDB and MySQL: entries in an InnoDB table, guards as `GET_LOCK`
//! locks of the owning connection, the steps that must be one round trip
//! calls of the procedures `ddl/mariadb.sql` creates.

mod ddl;
mod entries;
mod liveness;
mod modes;
mod restart;
mod tables;
mod values;
mod waits;

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use lockline::Error;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{AssertSqlSafe, ConnectOptions, Executor, Row as _};

use crate::dialect::{DbResult, Engine, Purpose};
use crate::layout::{fnv64, Tables, DLM};
use crate::Settings;

/// The server's clock in microseconds since the epoch, whatever the
/// session's time zone: UTC's calendar time less the epoch's, computed
/// without a time zone. (`UNIX_TIMESTAMP(SYSDATE(6))` turns the local time
/// back into the epoch's count, which jumps back an hour in the repeated
/// hour of a DST change.)
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// Lets go of a named lock.
const RELEASE_LOCK: &str = "DO RELEASE_LOCK(?)";

/// Takes a named lock at once if it is free: 1 when taken.
const TAKE_LOCK: &str = "SELECT GET_LOCK(?, 0)";

/// The connection that holds a named lock (NULL: none).
const LOCK_HOLDER: &str = "SELECT CAST(IS_USED_LOCK(?) AS SIGNED)";

/// Lets go of the named lock `name` this connection holds.
async fn release_lock(conn: &mut MySqlConnection, name: &str) -> DbResult<()> {
    sqlx::query(RELEASE_LOCK).bind(name).execute(conn).await?;
    Ok(())
}

/// The names and statements of one set of tables.
#[derive(Debug)]
struct Names {
    database: String,
    prefix: String,
    entries: String,
    sessions: String,
    meta: String,
    /// A MEMORY table whose row with the server's id says this server has
    /// run lockline since it started: a restart empties it.
    run: String,
    /// The procedure an append calls (see `append`).
    append_procedure: String,
    /// The procedures of lock modes: a change of a queue, a watcher's wait,
    /// and waking an entry's watchers.
    update_procedure: String,
    watch_procedure: String,
    wake_procedure: String,
    /// The fence procedure (see `ddl/mariadb.sql`).
    fence_procedure: String,
    /// A waiter's wait that reads its turn, and a release (see
    /// `ddl/mariadb.sql`).
    wait_turn_procedure: String,
    remove_procedure: String,
    /// `ll:<salt>:`: the start of every `GET_LOCK` name of this table set
    /// (the names are server-wide, at most 64 characters).
    lock_prefix: String,
    sql: Statements,
}

#[derive(Debug)]
struct Statements {
    heartbeat: Arc<str>,
    count_own: Arc<str>,
    beats: Arc<str>,
    grace: Arc<str>,
    end_grace: Arc<str>,
    own_ids: Arc<str>,
    append: Arc<str>,
    find: Arc<str>,
    nearest: Arc<str>,
    exists: Arc<str>,
    delete_dead: Arc<str>,
    list: Arc<str>,
    remove: Arc<str>,
    wait: Arc<str>,
    wait_lock: Arc<str>,
    beat_of: Arc<str>,
    session_exists: Arc<str>,
    reap_claim: Arc<str>,
    reap_read: Arc<str>,
    reap_done: Arc<str>,
    reap_session: Arc<str>,
    value_of: Arc<str>,
    bump_value: Arc<str>,
    get_value: Arc<str>,
    held: Arc<str>,
    put: Arc<str>,
    delete: Arc<str>,
    read: Arc<str>,
    /// Deletes a session's entries (closed, reaped, or cleaned up).
    delete_entries: Arc<str>,
    close_session: Arc<str>,
    open: Arc<str>,
    fence: Arc<str>,
    read_queue: Arc<str>,
    update_queue: Arc<str>,
    watch_read: Arc<str>,
    watch: Arc<str>,
    wake: Arc<str>,
}

/// The MariaDB/MySQL dialect for one database URL and table set.
pub(crate) struct MySql {
    connect: MySqlConnectOptions,
    tables: Tables,
    settings: Settings,
    names: OnceLock<Names>,
    /// The server's `max_allowed_packet`: a larger statement makes it close
    /// the connection, so larger values are refused before they are sent.
    max_packet: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for MySql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySql")
            .field("host", &self.connect.get_host())
            .field("port", &self.connect.get_port())
            .field("database", &self.connect.get_database())
            .field("tables", &self.tables)
            .finish_non_exhaustive()
    }
}

impl Names {
    fn new(database: &str, prefix: &str) -> Self {
        let table = |t: &str| format!("`{database}`.`{prefix}{t}`");
        let lock_prefix = Names::lock_prefix(database, prefix);
        let entries = table("entries");
        let sessions = table("sessions");
        let meta = table("meta");
        let data = table("data");
        let run = table("run");
        let blocks = table("blocks");
        let append_procedure = table("append");
        let update_procedure = table("update_queue");
        let watch_procedure = table("watch");
        let wake_procedure = table("wake");
        let fence_procedure = table("fence");
        let wait_turn_procedure = table("wait_turn");
        let remove_procedure = table("remove");
        let guard = format!("CONCAT('{lock_prefix}e:', e.attempt)");
        // A dead entry that still blocks: with the reset grace
        // (Sql::with_reset_grace), one whose session is still there.
        let live = format!(
            "(e.session = ? OR IS_USED_LOCK({guard}) IS NOT NULL OR (@lockline_reset_grace <=> 1 \
             AND EXISTS (SELECT 1 FROM {sessions} s WHERE s.id = e.session)))"
        );
        let sql = Statements {
            heartbeat: format!(
                "UPDATE {sessions} SET renewed_us = {NOW_US}, beat = beat + 1 WHERE id = ? AND beat >= 0 \
                 AND conn <> CONNECTION_ID() \
                 AND IS_USED_LOCK(CONCAT('{lock_prefix}s:', id)) = conn"
            )
            .into(),
            count_own: format!("SELECT COUNT(*) FROM {entries} WHERE session = ?").into(),
            beats: format!(
                "SELECT s.id, s.beat, s.ttl_ms, COALESCE((SELECT e.id FROM {entries} e WHERE e.session = s.id LIMIT 1), 0) \
                 FROM {sessions} s"
            )
            .into(),
            grace: format!("SELECT grace_ms, grace_from_us FROM {meta} WHERE grace_ms > 0").into(),
            end_grace: format!(
                "UPDATE {meta} SET grace_ms = 0 WHERE grace_ms > 0 AND COALESCE(grace_from_us, 0) = ?"
            )
            .into(),
            own_ids: format!("SELECT id FROM {entries} WHERE session = ?").into(),
            append: format!("CALL {append_procedure}(?, ?, ?, ?, ?, ?, ?)").into(),
            find: format!("SELECT id FROM {entries} WHERE attempt = ? AND session = ?").into(),
            // A plain read: appends to one name commit in their id order
            // (the name's lock in the append procedure), so every earlier
            // entry is visible. (A locking read here deadlocked with
            // removals: index record then row, against row then index
            // record.)
            nearest: format!(
                "SELECT e.id, e.kind, e.session, IS_USED_LOCK({guard}) IS NOT NULL OR e.session = ? \
                 FROM {entries} e WHERE e.name = ? AND e.id < ? ORDER BY e.id DESC LIMIT ?"
            )
            .into(),
            exists: format!("SELECT COUNT(*) FROM {entries} WHERE id = ?").into(),
            delete_dead: format!(
                "DELETE FROM {entries} WHERE id = ? AND session <> ? AND IS_FREE_LOCK(CONCAT('{lock_prefix}e:', attempt))"
            )
            .into(),
            list: format!(
                "SELECT e.id, e.kind, e.session FROM {entries} e WHERE e.name = ? \
                 AND (e.session = ? OR IS_USED_LOCK({guard}) IS NOT NULL) ORDER BY e.id"
            )
            .into(),
            remove: format!("CALL {remove_procedure}(?, ?, ?)").into(),
            // Waits at most the bound given and a third of the owner's TTL.
            wait: format!("CALL {wait_turn_procedure}(?, ?, ?, ?, ?, ?, ?, ?)").into(),
            // A wait on a lock that is not a guard (an election's value
            // lock): at most the bound given and a third of the owner's TTL.
            wait_lock: format!(
                "SELECT CASE WHEN IS_USED_LOCK(?) <=> CONNECTION_ID() THEN 4 \
                 ELSE (CASE GET_LOCK(?, GREATEST(w.bound_ms, 1) / 1000) WHEN 1 THEN RELEASE_LOCK(?) - 1 WHEN 0 THEN 1 END) END \
                 FROM (SELECT LEAST(?, COALESCE((SELECT s.ttl_ms DIV 3 FROM {sessions} s WHERE s.id = ?), ?)) \
                 AS bound_ms) w"
            )
            .into(),
            beat_of: format!("SELECT beat, ttl_ms FROM {sessions} WHERE id = ?").into(),
            session_exists: format!("SELECT COUNT(*) FROM {sessions} WHERE id = ?").into(),
            // Claims the end of a session whose count has not moved: a
            // negative count, which no renewal raises again.
            reap_claim: format!(
                "UPDATE {sessions} SET beat = LEAST(beat, 0) - 1 WHERE id = ? AND beat = ?"
            )
            .into(),
            reap_read: format!("SELECT conn FROM {sessions} WHERE id = ?").into(),
            reap_done: format!("DELETE FROM {sessions} WHERE id = ? AND beat < 0").into(),
            reap_session: format!("DELETE FROM {sessions} WHERE id = ? AND renewed_us = ?").into(),
            value_of: format!("SELECT epoch FROM {entries} WHERE id = ? AND session = ? FOR UPDATE").into(),
            bump_value: format!(
                "UPDATE {entries} SET value = ?, version = version + 1, epoch = epoch + 1 WHERE id = ?"
            )
            .into(),
            get_value: format!(
                "SELECT e.value, e.version FROM {entries} e WHERE e.id = ? \
                 AND (e.session = ? OR IS_USED_LOCK({guard}) IS NOT NULL) LOCK IN SHARE MODE"
            )
            .into(),
            held: format!("SELECT COUNT(*) FROM {entries} WHERE id = ? AND session = ? LOCK IN SHARE MODE").into(),
            put: format!(
                "INSERT INTO {data} (`key`, value) VALUES (?, ?) ON DUPLICATE KEY UPDATE value = VALUES(value)"
            )
            .into(),
            delete: format!("DELETE FROM {data} WHERE `key` = ?").into(),
            read: format!("SELECT value FROM {data} WHERE `key` = ?").into(),
            delete_entries: format!("DELETE FROM {entries} WHERE session = ?").into(),
            close_session: format!("DELETE FROM {sessions} WHERE id = ?").into(),
            open: format!(
                "INSERT INTO {sessions} (id, conn, ttl_ms, renewed_us) VALUES (?, CONNECTION_ID(), ?, {NOW_US})"
            )
            .into(),
            fence: format!("CALL {fence_procedure}(?)").into(),
            // The block first (no id), then the entries: one statement, one
            // read view. Values of other kinds' entries are not sent.
            read_queue: format!(
                "SELECT NULL, NULL, NULL, b.value, NULL, NULL, NULL FROM {blocks} b WHERE b.name = ? \
                 UNION ALL \
                 SELECT e.id, e.kind, e.session, IF(e.kind = '{DLM}', e.value, x''), e.version, \
                 GREATEST(e.changed, e.id), e.epoch FROM {entries} e WHERE e.name = ? AND {live} \
                 ORDER BY 1"
            )
            .into(),
            update_queue: format!("CALL {update_procedure}(?, ?, ?, ?, ?)").into(),
            watch_read: format!(
                "SELECT e.value, e.version, e.epoch, {live} FROM {entries} e WHERE e.id = ? LOCK IN SHARE MODE"
            )
            .into(),
            watch: format!("CALL {watch_procedure}(?, ?, ?, ?, ?, ?)").into(),
            wake: format!("CALL {wake_procedure}(?, ?)").into(),
        };
        Names {
            database: database.to_owned(),
            prefix: prefix.to_owned(),
            entries,
            sessions,
            meta,
            run,
            append_procedure,
            update_procedure,
            watch_procedure,
            wake_procedure,
            fence_procedure,
            wait_turn_procedure,
            remove_procedure,
            lock_prefix,
            sql,
        }
    }

    /// `ll:<salt>:`, the start of every `GET_LOCK` name of the tables of
    /// `prefix` in `database`.
    fn lock_prefix(database: &str, prefix: &str) -> String {
        let salt = fnv64(&format!("mysql/{database}.{prefix}"));
        format!("ll:{:012x}:", salt >> 16)
    }

    fn guard(&self, attempt: &str) -> String {
        format!("{}e:{attempt}", self.lock_prefix)
    }

    fn session_lock(&self, session: &str) -> String {
        format!("{}s:{session}", self.lock_prefix)
    }

    fn version_lock(&self, id: i64, version: i64) -> String {
        format!("{}v:{id}:{version}", self.lock_prefix)
    }
}

impl MySql {
    pub(crate) fn new(url: &str, tables: Tables, settings: Settings) -> lockline::Result<Self> {
        let url = url
            .strip_prefix("mariadb://")
            .map_or_else(|| url.to_owned(), |rest| format!("mysql://{rest}"));
        let connect: MySqlConnectOptions = url.parse().map_err(|e: sqlx::Error| Error::InvalidOptions {
            reason: format!(
                "invalid MySQL/MariaDB URL {:?}: {e}{}",
                crate::redact(&url),
                crate::encoding_hint(&url)
            ),
        })?;
        if connect.get_database().is_none() && tables.qualifier.is_empty() {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "the MySQL/MariaDB URL {:?} names no database: add /DATABASE to it",
                    crate::redact(&url)
                ),
            });
        }
        Ok(MySql {
            connect,
            tables,
            settings,
            names: OnceLock::new(),
            max_packet: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    fn names(&self) -> DbResult<&Names> {
        self.names
            .get()
            .ok_or_else(|| sqlx::Error::Configuration("the tables' database is not resolved yet".into()))
    }

    fn database(&self) -> String {
        if self.tables.qualifier.is_empty() {
            self.connect.get_database().unwrap_or_default().to_owned()
        } else {
            self.tables.qualifier.clone()
        }
    }

    pub(crate) fn ddl(&self, database: Option<&str>) -> lockline::Result<String> {
        let database = database.map_or_else(|| self.database(), str::to_owned);
        check_database(&database)?;
        Ok(Names::new(&database, &self.tables.prefix).ddl())
    }

    /// The call of the fence procedure a fenced transaction makes before it
    /// commits (one parameter: the entry's key).
    pub(crate) fn fence_sql(&self) -> DbResult<Arc<str>> {
        Ok(Arc::clone(&self.names()?.sql.fence))
    }

    /// Refuses a statement carrying `bytes` of data that the server would
    /// not take (`max_allowed_packet`, less room for the statement itself).
    fn check_size(&self, bytes: usize) -> DbResult<()> {
        let max = self.max_packet.load(std::sync::atomic::Ordering::Relaxed);
        let room = max.saturating_sub(16 * 1024);
        if u64::try_from(bytes).unwrap_or(u64::MAX) > room {
            return Err(sqlx::Error::Configuration(
                format!(
                    "the value is too large for the server: {bytes} bytes, and its max_allowed_packet is {max} bytes"
                )
                .into(),
            ));
        }
        Ok(())
    }
}

fn check_database(database: &str) -> lockline::Result<()> {
    let ok = !database.is_empty()
        && database.len() <= 64
        && database
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidOptions {
            reason: format!(
                "database {database:?} must be a plain name of at most 64 characters (letters, digits, _, $, -)"
            ),
        })
    }
}

#[async_trait]
impl Engine for MySql {
    type Conn = MySqlConnection;

    fn backend(&self) -> &'static str {
        "mysql"
    }

    async fn connect(&self, purpose: Purpose) -> DbResult<(MySqlConnection, i64)> {
        let mut conn = self.connect.clone().connect().await?;
        let row_wait_s = match purpose {
            Purpose::Owner => self.settings.owner_lock_timeout.as_secs().max(1),
            Purpose::Control | Purpose::Wait => self.settings.request_timeout.as_secs().max(1),
        };
        // A year: an idle holder must not be disconnected (and lose its
        // locks) by the server's wait_timeout. UTC: no time zone of the
        // server's or the user's decides anything (the clock expression
        // does not depend on it either).
        conn.execute(sqlx::raw_sql(AssertSqlSafe(format!(
            "SET SESSION wait_timeout = 31536000, innodb_lock_wait_timeout = {row_wait_s}, time_zone = '+00:00'; \
             SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; SET @lockline_reset_grace = {}, \
             @lockline_row_wait = {row_wait_s}",
            u8::from(self.settings.reset_grace)
        ))))
        .await?;
        let (id, version, max_packet): (i64, String, i64) = {
            let row =
                sqlx::query("SELECT CAST(CONNECTION_ID() AS SIGNED), VERSION(), CAST(@@max_allowed_packet AS SIGNED)")
                    .fetch_one(&mut conn)
                    .await?;
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)
        };
        self.max_packet.store(
            u64::try_from(max_packet).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
        if version.contains("MariaDB") {
            conn.execute("SET SESSION max_statement_time = 0").await?;
        }
        Ok((conn, id))
    }

    async fn ping(&self, conn: &mut MySqlConnection) -> DbResult<()> {
        conn.execute("SELECT 1").await.map(drop)
    }

    async fn cancel(&self, conn: &mut MySqlConnection, server_id: i64) -> DbResult<()> {
        conn.execute(sqlx::raw_sql(AssertSqlSafe(format!("KILL QUERY {server_id}"))))
            .await?;
        Ok(())
    }

    async fn reset(&self, conn: &mut MySqlConnection) -> DbResult<()> {
        // A wait cut short inside its read may leave the row-lock wait it
        // set for that read.
        conn.execute(sqlx::raw_sql(
            "DO RELEASE_ALL_LOCKS(); \
             SET SESSION innodb_lock_wait_timeout = COALESCE(@lockline_row_wait, @@innodb_lock_wait_timeout)",
        ))
        .await?;
        Ok(())
    }

    async fn prepare(&self, conn: &mut MySqlConnection) -> lockline::Result<()> {
        self.prepare_tables(conn).await
    }
}

#[cfg(test)]
mod tests {
    use sqlx::{AssertSqlSafe, Connection, Executor};

    use super::*;

    fn now_us() -> i64 {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970");
        i64::try_from(since.as_micros()).expect("microseconds")
    }

    /// The clock expression gives the epoch's count in any session time
    /// zone, a pooler's reset one included: fixed offsets, the server's
    /// own, and a zone with daylight saving time in the hour its clocks
    /// went back (where `UNIX_TIMESTAMP(SYSDATE(6))`, checked here as the
    /// premise, is an hour early).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_clock_ignores_the_session_time_zone() {
        let server = lockline_testkit::MariaDbServer::start().expect("start mariadb");
        server
            .add_fallback_time_zone("Lockline/Fallback")
            .expect("add the time zone");
        let mut conn = MySqlConnection::connect(&server.url()).await.expect("connect");
        let slack = 1_000_000;
        for zone in ["+00:00", "SYSTEM", "-09:30", "+05:45", "Lockline/Fallback"] {
            conn.execute(sqlx::raw_sql(AssertSqlSafe(format!("SET time_zone = '{zone}'"))))
                .await
                .expect("set the zone");
            let before = now_us();
            let (clock, local): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
                "SELECT {NOW_US}, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)"
            )))
            .fetch_one(&mut conn)
            .await
            .expect("read the clock");
            let after = now_us();
            assert!(
                clock >= before - slack && clock <= after + slack,
                "in zone {zone}, the clock read {clock}, outside [{before}, {after}]"
            );
            if zone == "Lockline/Fallback" {
                let early = (clock - local) / 1_000_000;
                assert!(
                    (3590..=3610).contains(&early),
                    "the premise: the local time turned back into the epoch's count is an hour early, not {early} s"
                );
            }
        }
    }
}
