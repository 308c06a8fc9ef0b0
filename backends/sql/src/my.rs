//! MariaDB and MySQL: entries in an InnoDB table, guards as `GET_LOCK`
//! locks of the owning connection, order checked with a locking read.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use lockline::{Error, Write};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, Row as _};

use crate::ddl;
use crate::dialect::{
    shape, Append, Beat, DbResult, Dialect, EntryStatus, Found, Grace, Purpose, QueueChange, QueueRow, Reaped, Row,
    Status, Turn, TurnRead, Waited, Watched,
};
use crate::error::{has_code, Doing};
use crate::layout::{fnv64, movable, Tables, DEFAULT_PREFIX, DLM, LAYOUT_VERSION, MOVABLE_LAYOUTS};
use crate::Settings;

/// The tables and procedures, as `ddl/mariadb.sql` keeps them: for
/// database [`SCRIPT_DATABASE`] and the default table prefix.
const SCRIPT: &str = include_str!("../ddl/mariadb.sql");

/// The database the script is written for.
const SCRIPT_DATABASE: &str = "lockline";

/// The server's clock in microseconds since the epoch, whatever the
/// session's time zone: UTC's calendar time less the epoch's, computed
/// without a time zone. (`UNIX_TIMESTAMP(SYSDATE(6))` turns the local time
/// back into the epoch's count, which jumps back an hour in the repeated
/// hour of a DST change.)
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// What a wait says when the lock it would wait for is held by its own
/// connection: two of lockline's connections are one server connection.
const MULTIPLEXED: &str = "two connections of lockline share one server connection: a multiplexing proxy (ProxySQL, \
     MaxScale) is in front of the database; the locks of lockline belong to a connection, so it needs a direct \
     connection";

/// How far apart two readings of the server's start time (its clock minus
/// its `Uptime`, in whole seconds) may be and still be the same start.
const SAME_START_US: i64 = 2_500_000;

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
    reap_entries: Arc<str>,
    reap_session: Arc<str>,
    value_of: Arc<str>,
    bump_value: Arc<str>,
    get_value: Arc<str>,
    held: Arc<str>,
    put: Arc<str>,
    delete: Arc<str>,
    read: Arc<str>,
    close_entries: Arc<str>,
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
            reap_entries: format!("DELETE FROM {entries} WHERE session = ?").into(),
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
            close_entries: format!("DELETE FROM {entries} WHERE session = ?").into(),
            close_session: format!("DELETE FROM {sessions} WHERE id = ?").into(),
            open: format!(
                "INSERT INTO {sessions} (id, conn, ttl_ms, renewed_us) VALUES (?, CONNECTION_ID(), ?, {NOW_US})"
            )
            .into(),
            fence: format!("CALL {fence_procedure}(?)").into(),
            // The block first (no id), then the entries: one statement, one
            // read view. Values of other kinds' entries are not sent.
            read_queue: format!(
                "SELECT NULL, NULL, NULL, b.value, NULL, NULL FROM {blocks} b WHERE b.name = ? \
                 UNION ALL \
                 SELECT e.id, e.kind, e.session, IF(e.kind = '{DLM}', e.value, x''), e.version, \
                 GREATEST(e.changed, e.id) FROM {entries} e WHERE e.name = ? AND {live} \
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

    /// The tables and procedures, as a script a DBA can run (the `mariadb`
    /// client needs its `DELIMITER` lines around each procedure, whose body
    /// holds `;`): the script of `ddl/mariadb.sql` for these names.
    fn ddl(&self) -> String {
        self.renamed(ddl::without_notes(SCRIPT))
    }

    /// The DDL in the steps a connection runs one after the other: the
    /// tables, the procedures, and the layout's row (last: its row says the
    /// rest exists).
    fn ddl_steps(&self) -> Vec<String> {
        script_steps(&self.ddl()).into_iter().map(str::to_owned).collect()
    }

    /// The procedures layout 5 added (the fence of layout 4 with them), one
    /// step each: what a session creates alone when it moves layout 3 or 4
    /// tables to layout 5.
    fn upgrade_steps(&self) -> DbResult<Vec<String>> {
        let steps = self.ddl_steps();
        [&self.fence_procedure, &self.wait_turn_procedure, &self.remove_procedure]
            .into_iter()
            .map(|procedure| {
                let create = format!("CREATE PROCEDURE IF NOT EXISTS {procedure}(");
                steps
                    .iter()
                    .find(|step| step.contains(&create))
                    .cloned()
                    .ok_or_else(|| {
                        sqlx::Error::Configuration(format!("the DDL script has no procedure {procedure}").into())
                    })
            })
            .collect()
    }

    /// `text` of the script with its names replaced by these.
    fn renamed(&self, text: &str) -> String {
        let script = Names::lock_prefix(SCRIPT_DATABASE, DEFAULT_PREFIX);
        ddl::rename(
            text,
            &[
                (&format!("`{SCRIPT_DATABASE}`"), &format!("`{}`", self.database)),
                (&format!("`{DEFAULT_PREFIX}"), &format!("`{}", self.prefix)),
                (&script, &self.lock_prefix),
            ],
        )
    }
}

/// The steps of a script that a connection runs one after the other: the
/// text before the first procedure, each procedure (alone between a
/// `DELIMITER //` line and its closing `//`, `DELIMITER ;` lines), and the
/// text after the last one.
fn script_steps<'s>(script: &'s str) -> Vec<&'s str> {
    let mut steps = Vec::new();
    let mut push = |step: &'s str| {
        if !step.is_empty() {
            steps.push(step);
        }
    };
    let (mut start, mut at, mut in_procedure) = (0, 0, false);
    for line in script.split_inclusive('\n') {
        let line_start = at;
        at += line.len();
        match (in_procedure, line.trim_end()) {
            (false, "DELIMITER //") => {
                push(&script[start..line_start]);
                (start, in_procedure) = (at, true);
            }
            (true, "DELIMITER ;") => {
                let procedure = &script[start..line_start];
                push(procedure.strip_suffix("//\n").unwrap_or(procedure));
                (start, in_procedure) = (at, false);
            }
            _ => {}
        }
    }
    push(&script[start..]);
    steps
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

    fn doing<'a>(&self, what: &'a str, target: &'a str) -> Doing<'a> {
        Doing {
            backend: "mysql",
            what,
            target,
        }
    }

    async fn create(&self, conn: &mut MySqlConnection, names: &Names) -> DbResult<()> {
        let lock = format!("{}ddl", names.lock_prefix);
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 30)")
            .bind(&lock)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(shape("another connection is creating lockline's tables"));
        }
        let mut created = Ok(());
        for step in names.ddl_steps() {
            created = conn.execute(sqlx::raw_sql(AssertSqlSafe(step))).await.map(drop);
            if created.is_err() {
                break;
            }
        }
        sqlx::query("DO RELEASE_LOCK(?)")
            .bind(&lock)
            .execute(&mut *conn)
            .await?;
        created
    }

    /// Moves tables of a movable layout to this one: creates the fence and
    /// the procedures of layout 5 and raises the layout, one mover at a time (the lock the
    /// creators take). The layout found (the current one when moved).
    async fn upgrade(&self, conn: &mut MySqlConnection, names: &Names) -> DbResult<Option<i32>> {
        let lock = format!("{}ddl", names.lock_prefix);
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 30)")
            .bind(&lock)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(shape(
                "another connection is moving lockline's tables to the current layout",
            ));
        }
        let moved = async {
            let layout: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!("SELECT layout FROM {}", names.meta)))
                .fetch_optional(&mut *conn)
                .await?;
            if !movable(layout) {
                return Ok(layout);
            }
            for step in names.upgrade_steps()? {
                conn.execute(sqlx::raw_sql(AssertSqlSafe(step))).await?;
            }
            let [oldest, newest] = MOVABLE_LAYOUTS;
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE {} SET layout = {LAYOUT_VERSION} WHERE layout BETWEEN {oldest} AND {newest}",
                names.meta
            )))
            .execute(&mut *conn)
            .await?;
            Ok(Some(LAYOUT_VERSION))
        }
        .await;
        sqlx::query("DO RELEASE_LOCK(?)")
            .bind(&lock)
            .execute(&mut *conn)
            .await?;
        moved
    }

    async fn check_columns(
        &self,
        conn: &mut MySqlConnection,
        names: &Names,
        table: &str,
        expected: &[(&str, &str)],
    ) -> DbResult<Option<String>> {
        let rows = sqlx::query(
            "SELECT CAST(column_name AS CHAR), CAST(data_type AS CHAR) FROM information_schema.columns \
             WHERE table_schema = ? AND table_name = ?",
        )
        .bind(&names.database)
        .bind(format!("{}{table}", self.tables.prefix))
        .fetch_all(&mut *conn)
        .await?;
        let found: Vec<(String, String)> = rows
            .iter()
            .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?)))
            .collect::<DbResult<_>>()?;
        for (column, kind) in expected {
            match found.iter().find(|(c, _)| c.eq_ignore_ascii_case(column)) {
                None => return Ok(Some(format!("it has no column {column:?}"))),
                Some((_, t)) if !t.eq_ignore_ascii_case(kind) => {
                    return Ok(Some(format!("its column {column:?} is {t}, not {kind}")));
                }
                Some(_) => {}
            }
        }
        Ok(None)
    }

    /// Moves the id counter past the server's clock in microseconds, and
    /// begins a restart grace, when the server started (or a replica was
    /// promoted) since the last session was opened. Openers racing after a
    /// restart may each move the counter (harmless); the meta row is
    /// changed by one of them only (compared and set on the start and run
    /// it read), so none undoes another's record of the live sessions'
    /// TTLs. Nothing is held across round trips: an opener whose
    /// connection goes silent keeps no one else from opening.
    async fn bump_after_restart(&self, conn: &mut MySqlConnection, names: &Names) -> DbResult<()> {
        let (uptime_s, now_us): (i64, i64) = {
            let row = sqlx::query(AssertSqlSafe(format!(
                "SELECT CAST(VARIABLE_VALUE AS SIGNED), {NOW_US} FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = 'UPTIME'"
            )))
            .fetch_optional(&mut *conn)
            .await;
            match row {
                Ok(Some(row)) => (row.try_get(0)?, row.try_get(1)?),
                // MySQL 8 keeps status variables in performance_schema.
                Ok(None) | Err(_) => {
                    let row = sqlx::query(AssertSqlSafe(format!(
                        "SELECT CAST(VARIABLE_VALUE AS SIGNED), {NOW_US} FROM performance_schema.global_status \
                         WHERE VARIABLE_NAME = 'Uptime'"
                    )))
                    .fetch_one(&mut *conn)
                    .await?;
                    (row.try_get(0)?, row.try_get(1)?)
                }
            }
        };
        let started_us = now_us - uptime_s * 1_000_000;
        let same = |seen: Option<i64>| seen.is_some_and(|s| (s - started_us).abs() <= SAME_START_US);
        let (seen, run): (Option<i64>, Option<String>) =
            sqlx::query_as(AssertSqlSafe(format!("SELECT started_us, run_id FROM {}", names.meta)))
                .fetch_optional(&mut *conn)
                .await?
                .unwrap_or((None, None));
        // The same start, and this server's marker names the run the meta
        // row names: no restart. A restart empties the marker; a promoted
        // replica has no marker of its own id, or one of a run before the
        // meta row's (its primary's markers are replicated under their ids).
        // The id is read here and written as a value, so that a
        // statement-based replica replays the same row.
        let server_id: i64 = sqlx::query_scalar("SELECT CAST(@@server_id AS SIGNED)")
            .fetch_one(&mut *conn)
            .await?;
        let marker: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT run_id FROM {} WHERE server_id = ?",
            names.run
        )))
        .bind(server_id)
        .fetch_optional(&mut *conn)
        .await?;
        if same(seen) && marker.is_some() && marker == run {
            return Ok(());
        }
        // An explicit id above the counter moves it there (InnoDB keeps the
        // largest); the row itself is deleted at once, with any marker an
        // opener cut off left.
        let marker = format!("restart-{}", uuid::Uuid::new_v4().simple());
        let moved = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {e} (id, name, kind, session, attempt, value) \
             SELECT GREATEST({NOW_US}, COALESCE(MAX(id), 0) + 1), '', 'restart', '', ?, '' FROM {e}",
            e = names.entries
        )))
        .bind(&marker)
        .execute(&mut *conn)
        .await;
        match moved {
            // Another opener took that very id: the counter is past it.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23000") => {}
            other => {
                other?;
            }
        }
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {} WHERE name = '' AND kind = 'restart'",
            names.entries
        )))
        .execute(&mut *conn)
        .await?;
        // Holders of the run before may not have heard `lost()` yet: no
        // grant until the longest TTL of that run has passed since now, the
        // first session after the start — or after a replica's promotion,
        // whose own start may be hours older (a grace counted from it would
        // be over). A grace still in force (a restart within it) is kept
        // when longer: its holders may not have heard either. The new run
        // starts from the TTLs of the sessions still alive (none after a
        // real restart; all of them when the start only looked new).
        // Assignments apply left to right: the grace reads the old run's.
        let new_run = uuid::Uuid::new_v4().simple().to_string();
        let changed = sqlx::query(AssertSqlSafe(format!(
            "UPDATE {meta} SET started_us = ?, run_id = ?, grace_ms = GREATEST(grace_ms, run_max_ttl_ms), \
             run_max_ttl_ms = COALESCE((SELECT MAX(s.ttl_ms) FROM {sessions} s \
               WHERE IS_USED_LOCK(CONCAT('{prefix}s:', s.id)) IS NOT NULL), 0), \
             grace_from_us = {NOW_US} \
             WHERE started_us <=> ? AND run_id <=> ?",
            meta = names.meta,
            sessions = names.sessions,
            prefix = names.lock_prefix
        )))
        .bind(started_us)
        .bind(&new_run)
        .bind(seen)
        .bind(&run)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if changed == 0 {
            // Another opener changed it first: its run is the new one, and it
            // marks it (or, cut off before, leaves all of it to the next).
            return Ok(());
        }
        let run = new_run;
        // Marked last: an opener cut off before leaves the restart to the next.
        sqlx::query(AssertSqlSafe(format!(
            "REPLACE INTO {} (server_id, run_id) VALUES (?, ?)",
            names.run
        )))
        .bind(server_id)
        .bind(&run)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn release(&self, conn: &mut MySqlConnection, name: &str) -> DbResult<()> {
        sqlx::query("DO RELEASE_LOCK(?)").bind(name).execute(conn).await?;
        Ok(())
    }

    /// Whether entry `id`'s row is there, read by a statement of its own.
    async fn row_exists(&self, conn: &mut MySqlConnection, id: i64) -> DbResult<bool> {
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.exists)))
            .bind(id)
            .fetch_one(conn)
            .await?;
        Ok(count > 0)
    }

    /// Waits on the guard of entry `entry` (see the wait procedure in the
    /// DDL), and reads `turn` after it unless the bound ran out: one round
    /// trip.
    async fn wait_on(
        &self,
        conn: &mut MySqlConnection,
        entry: i64,
        owner: &str,
        bound_ms: i64,
        turn: Option<&Turn>,
    ) -> DbResult<(Waited, Option<TurnRead>)> {
        let names = self.names()?;
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.wait)))
            .bind(entry)
            .bind(owner)
            .bind(bound_ms)
            .bind(turn.map(|t| t.id))
            .bind(turn.map(|t| t.name.as_bytes()))
            .bind(turn.map(|t| t.session.as_str()))
            .bind(turn.is_some_and(|t| t.skip_shared))
            .bind(turn.map_or(0, |t| t.count))
            .fetch_all(&mut *conn)
            .await?;
        let [row] = found.as_slice() else {
            return Err(shape(format!("the wait answered {} rows, not one", found.len())));
        };
        let code: Option<i64> = row.try_get(0)?;
        let waited = match code {
            Some(0) => Waited::Released,
            // Its row outlived its guard (read by a statement after the
            // wait: a release deletes the row, then lets go of the guard).
            Some(3) => Waited::Lost,
            Some(1) => Waited::TimedOut(
                match (row.try_get::<Option<i64>, _>(1)?, row.try_get::<Option<i64>, _>(2)?) {
                    (Some(count), Some(ttl_ms)) => Some(Beat { count, ttl_ms }),
                    _ => None,
                },
            ),
            // This connection holds the lock it would wait for: two of
            // lockline's connections are one server connection (a
            // multiplexing proxy in front of the server).
            Some(4) => return Err(sqlx::Error::Configuration(MULTIPLEXED.into())),
            // GET_LOCK ended by KILL QUERY answers NULL: this session's
            // cancel, or a writer's wake meant for a watch on this connection.
            None => Waited::Interrupted,
            Some(other) => return Err(shape(format!("wait returned {other}"))),
        };
        let read: i64 = row.try_get(3)?;
        if turn.is_none() || read == 0 || !matches!(waited, Waited::Released | Waited::Lost) {
            return Ok((waited, None));
        }
        let mine: i64 = row.try_get(4)?;
        if mine == 0 {
            return Ok((waited, Some(None)));
        }
        let nearest: String = row.try_get(5)?;
        Ok((waited, Some(Some(parse_nearest(&nearest)?))))
    }

    /// The nearest earlier live entries before `id`, removing dead ones on
    /// the way.
    async fn nearest(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        name: &str,
        session: &str,
        skip_shared: bool,
        count: i32,
    ) -> DbResult<Vec<Row>> {
        let names = self.names()?;
        let wanted = usize::try_from(count).unwrap_or(0);
        let mut nearest = Vec::new();
        if wanted == 0 {
            return Ok(nearest);
        }
        let mut below = id;
        let batch = i64::from(count) + 16;
        loop {
            let found = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.nearest)))
                .bind(session)
                .bind(name)
                .bind(below)
                .bind(batch)
                .fetch_all(&mut *conn)
                .await?;
            let found = rows(&found)?;
            let full = i64::try_from(found.len()).unwrap_or(i64::MAX) >= batch;
            for (row, live) in found {
                below = row.id;
                // With the reset grace (Sql::with_reset_grace), a dead entry
                // whose session is still there blocks like a live one: its
                // owner may be alive with its connection reset, not told yet.
                let live = live
                    || (self.settings.reset_grace
                        && sqlx::query_scalar::<_, i64>(AssertSqlSafe(Arc::clone(&names.sql.session_exists)))
                            .bind(&row.session)
                            .fetch_one(&mut *conn)
                            .await?
                            > 0);
                if !live {
                    // Its guard is free: released, or its owner's connection
                    // ended. Delete it before going past it (this waits for a
                    // fenced commit of its holder still in flight).
                    sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.delete_dead)))
                        .bind(row.id)
                        .bind(session)
                        .execute(&mut *conn)
                        .await?;
                    continue;
                }
                if skip_shared && row.kind == "read" {
                    continue;
                }
                nearest.push(row);
                if nearest.len() >= wanted {
                    return Ok(nearest);
                }
            }
            if !full {
                return Ok(nearest);
            }
        }
    }
}

/// Whether `KILL` failed because the connection is gone already
/// (ER_NO_SUCH_THREAD), not because it was refused.
fn no_such_connection(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| e.number() == 1094),
        _ => false,
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

/// The nearest entries as the append procedure answers them: `id kind
/// session;` each.
fn parse_nearest(nearest: &str) -> DbResult<Vec<Row>> {
    nearest
        .split(';')
        .filter(|row| !row.is_empty())
        .map(|row| {
            let mut fields = row.splitn(3, ' ');
            let (Some(id), Some(kind), Some(session)) = (fields.next(), fields.next(), fields.next()) else {
                return Err(shape(format!("the append answered the entry {row:?}")));
            };
            Ok(Row {
                id: id
                    .parse()
                    .map_err(|_| shape(format!("the append answered the entry {row:?}")))?,
                kind: kind.to_owned(),
                session: session.to_owned(),
            })
        })
        .collect()
}

fn rows(found: &[MySqlRow]) -> DbResult<Vec<(Row, bool)>> {
    found
        .iter()
        .map(|r| {
            let live: Option<i64> = r.try_get(3)?;
            Ok((
                Row {
                    id: r.try_get(0)?,
                    kind: r.try_get(1)?,
                    session: r.try_get(2)?,
                },
                live == Some(1),
            ))
        })
        .collect()
}

#[async_trait]
impl Dialect for MySql {
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

    async fn prepare(&self, conn: &mut MySqlConnection) -> lockline::Result<()> {
        let target = crate::my_target(&self.connect);
        let doing = |what| self.doing(what, &target);
        let map = |what, e| crate::error::map(doing(what), e);
        if self.names.get().is_none() {
            let database = self.database();
            check_database(&database)?;
            let _ = self.names.set(Names::new(&database, &self.tables.prefix));
        }
        let names = self.names().map_err(|e| map("resolve the tables", e))?;
        let layout = sqlx::query_scalar::<_, i32>(AssertSqlSafe(format!("SELECT layout FROM {}", names.meta)))
            .fetch_optional(&mut *conn)
            .await;
        let layout = match layout {
            // ER_NO_SUCH_TABLE, or the table without its row: not created
            // yet, or being created by another session right now (the DDL
            // runs under a lock and makes the meta row last).
            Err(error) if has_code(&error, "42S02") => {
                if !self.settings.create_tables {
                    return Err(Error::InvalidOptions {
                        reason: format!(
                            "{target}: the table {} does not exist; create lockline's tables with the DDL script (Sql::ddl) or allow lockline to create them",
                            names.meta
                        ),
                    });
                }
                self.create(conn, names).await.map_err(|e| match map("create lockline's tables", e) {
                    Error::PermissionDenied { backend, reason, .. } => Error::PermissionDenied {
                        backend,
                        operation: "create tables in",
                        key: format!("database {}", names.database),
                        reason: format!(
                            "{reason}; lockline creates its tables and its procedure on first use, which needs the CREATE and CREATE ROUTINE privileges on the database (or run the DDL script from Sql::ddl as a user who has them)"
                        ),
                    },
                    other => other,
                })?;
                Some(LAYOUT_VERSION)
            }
            Ok(None) if self.settings.create_tables => {
                self.create(conn, names)
                    .await
                    .map_err(|e| map("create lockline's tables", e))?;
                Some(LAYOUT_VERSION)
            }
            other => other.map_err(|e| map("read lockline's layout version", e))?,
        };
        let layout = match layout {
            // The layout before: moved here (it lacks the fence procedure
            // alone), unless this user may create nothing.
            found if movable(found) && self.settings.create_tables => self
                .upgrade(conn, names)
                .await
                .map_err(|e| match map("move lockline's tables to the current layout", e) {
                    Error::PermissionDenied { backend, reason, .. } => Error::PermissionDenied {
                        backend,
                        operation: "create the fence and wait procedures in",
                        key: format!("database {}", names.database),
                        reason: format!(
                            "{reason}; layout {} tables are moved to layout {LAYOUT_VERSION} on first use, which needs CREATE ROUTINE on the database (or have a user who has it do it: the SQL chapter of the documentation, docs/sql.md, \"Layout versions\")",
                            found.unwrap_or_default()
                        ),
                    },
                    other => other,
                })?,
            other => other,
        };
        if layout != Some(LAYOUT_VERSION) {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "{target}: {} holds layout {layout:?}, this lockline uses layout {LAYOUT_VERSION}: move the tables to it while no session of the older lockline runs (the SQL chapter of the documentation, docs/sql.md, \"Layout versions\")",
                    names.meta
                ),
            });
        }
        let expected: [(&str, &[(&str, &str)]); 5] = [
            (
                "entries",
                &[
                    ("id", "bigint"),
                    ("name", "varbinary"),
                    ("kind", "varchar"),
                    ("session", "varchar"),
                    ("attempt", "varchar"),
                    ("value", "longblob"),
                    ("version", "bigint"),
                    ("epoch", "bigint"),
                    ("changed", "bigint"),
                    ("watchers", "int"),
                ],
            ),
            (
                "sessions",
                &[
                    ("id", "varchar"),
                    ("conn", "bigint"),
                    ("ttl_ms", "bigint"),
                    ("renewed_us", "bigint"),
                    ("beat", "bigint"),
                ],
            ),
            ("data", &[("key", "varbinary"), ("value", "longblob")]),
            ("run", &[("server_id", "bigint"), ("run_id", "varchar")]),
            ("blocks", &[("name", "varbinary"), ("value", "longblob")]),
        ];
        for (table, columns) in expected {
            let problem = self
                .check_columns(conn, names, table, columns)
                .await
                .map_err(|e| map("check lockline's tables", e))?;
            if let Some(problem) = problem {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "{target}: the table {}.{}{table} is not lockline's: {problem}; pick another table prefix (Sql::with_table_prefix) or database",
                        names.database, self.tables.prefix
                    ),
                });
            }
        }
        // The run marker must be emptied by a restart: a MEMORY table (a
        // server that forces another engine would keep it).
        let engine: Option<String> = sqlx::query_scalar(
            "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        )
        .bind(&names.database)
        .bind(format!("{}run", self.tables.prefix))
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| map("check lockline's tables", e))?
        .flatten();
        if !engine.as_deref().is_some_and(|e| e.eq_ignore_ascii_case("MEMORY")) {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "{target}: the table {} must be ENGINE=MEMORY (a server restart must empty it), not {}; \
                     recreate it with the DDL script (Sql::ddl), on a server that allows MEMORY tables",
                    names.run,
                    engine.as_deref().unwrap_or("unknown")
                ),
            });
        }
        // Listed only to a user who may run them (or alter them).
        for (procedure, full) in [
            ("append", &names.append_procedure),
            ("update_queue", &names.update_procedure),
            ("watch", &names.watch_procedure),
            ("wake", &names.wake_procedure),
            ("fence", &names.fence_procedure),
        ] {
            let found: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.ROUTINES \
                 WHERE ROUTINE_SCHEMA = ? AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'",
            )
            .bind(&names.database)
            .bind(format!("{}{procedure}", self.tables.prefix))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map("check lockline's procedures", e))?;
            if found == 0 {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "{target}: the procedure {full} is missing, or this user may not execute it: create it with the DDL script (Sql::ddl) and grant EXECUTE on it"
                    ),
                });
            }
        }
        self.bump_after_restart(conn, names)
            .await
            .map_err(|e| map("move the id counter past a server restart", e))?;
        // Every statement the owning connection runs for a caller, prepared
        // now: the driver recovers from a caller that goes away while a
        // statement executes, not while it is being prepared (which happens
        // at a statement's first use), and a broken owning connection loses
        // the session.
        let sql = &names.sql;
        let owner_statements: [&str; 23] = [
            &sql.append,
            &sql.find,
            &sql.exists,
            &sql.nearest,
            &sql.delete_dead,
            &sql.list,
            &sql.remove,
            &sql.value_of,
            &sql.bump_value,
            &sql.get_value,
            &sql.held,
            &sql.put,
            &sql.delete,
            &sql.read,
            &sql.close_entries,
            &sql.close_session,
            &sql.read_queue,
            &sql.update_queue,
            &sql.watch_read,
            &sql.wake,
            "DO RELEASE_LOCK(?)",
            "SELECT GET_LOCK(?, 0)",
            "SELECT CAST(IS_USED_LOCK(?) AS SIGNED)",
        ];
        for statement in owner_statements {
            conn.prepare(sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(statement.to_owned())))
                .await
                .map_err(|e| map("prepare lockline's statements", e))?;
        }
        Ok(())
    }

    async fn open(&self, conn: &mut MySqlConnection, session: &str, ttl_ms: i64) -> DbResult<Option<Grace>> {
        let names = self.names()?;
        // Sessions of processes that died a minute or more past their TTL,
        // whose connection is gone (its session lock with it): their rows go.
        let stale = format!(
            "s.renewed_us + s.ttl_ms * 1000 < {NOW_US} - 60000000 AND IS_FREE_LOCK(CONCAT('{}s:', s.id))",
            names.lock_prefix
        );
        // Best effort, one session at a time: it must never fail the open
        // (a deadlock with a removal under way is retried at the next open).
        let stale_sessions: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT s.id, s.renewed_us FROM {} s WHERE {stale} LIMIT 100",
            names.sessions
        )))
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_default();
        for (stale_id, renewed_us) in stale_sessions {
            let cleaned = async {
                sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.reap_entries)))
                    .bind(&stale_id)
                    .execute(&mut *conn)
                    .await?;
                sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.reap_session)))
                    .bind(&stale_id)
                    .bind(renewed_us)
                    .execute(&mut *conn)
                    .await
            }
            .await;
            if let Err(error) = cleaned {
                tracing::debug!(session = %stale_id, %error, "could not clean up a dead session's rows");
            }
        }
        // The session's own lock: held by its connection while it lives.
        let lock = names.session_lock(session);
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(&lock)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(shape(format!("the session lock {lock} is taken")));
        }
        sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.open)))
            .bind(session)
            .bind(ttl_ms)
            .execute(&mut *conn)
            .await?;
        // A write only when this TTL is the longest of the run so far.
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET run_max_ttl_ms = ? WHERE run_max_ttl_ms < ?",
            names.meta
        )))
        .bind(ttl_ms)
        .bind(ttl_ms)
        .execute(&mut *conn)
        .await?;
        // In force until a session waited it out by its own clock: no
        // reading of the server's clock shortens it.
        let grace: Option<(i64, Option<i64>)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT grace_ms, grace_from_us FROM {} WHERE grace_ms > 0",
            names.meta
        )))
        .fetch_optional(&mut *conn)
        .await?;
        Ok(grace.map(|(ms, id)| Grace {
            ms,
            id: id.unwrap_or(0),
        }))
    }

    async fn end_grace(&self, conn: &mut MySqlConnection, id: i64) -> DbResult<()> {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET grace_ms = 0 WHERE grace_ms > 0 AND COALESCE(grace_from_us, 0) = ?",
            self.names()?.meta
        )))
        .bind(id)
        .execute(conn)
        .await
        .map(drop)
    }

    async fn end(&self, conn: &mut MySqlConnection, session: &str, owner_server_id: i64) -> DbResult<bool> {
        let names = self.names()?;
        let holder: Option<i64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
            .bind(names.session_lock(session))
            .fetch_one(&mut *conn)
            .await?;
        if holder == Some(owner_server_id) {
            let kill = conn
                .execute(sqlx::raw_sql(AssertSqlSafe(format!(
                    "KILL CONNECTION {owner_server_id}"
                ))))
                .await;
            if let Err(error) = kill {
                if !no_such_connection(&error) {
                    return Err(error);
                }
            }
        } else if holder.is_some() {
            // Not the connection this session opened: leave it alone.
            return Ok(false);
        }
        self.close(conn, session).await?;
        Ok(true)
    }

    async fn heartbeat(&self, conn: &mut MySqlConnection, session: &str) -> DbResult<Option<i64>> {
        let names = self.names()?;
        let renewed = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.heartbeat)))
            .bind(session)
            .execute(&mut *conn)
            .await?;
        if renewed.rows_affected() == 0 {
            return Ok(None);
        }
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.count_own)))
            .bind(session)
            .fetch_one(conn)
            .await?;
        Ok(Some(count))
    }

    async fn own_ids(&self, conn: &mut MySqlConnection, session: &str) -> DbResult<Vec<i64>> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.own_ids)))
            .bind(session)
            .fetch_all(conn)
            .await
    }

    async fn append(&self, conn: &mut MySqlConnection, append: &Append<'_>) -> DbResult<(i64, Vec<Row>)> {
        self.check_size(append.value.len() + append.name.len())?;
        let names = self.names()?;
        // One round trip (see the procedure in the DDL): nothing it takes on
        // the server outlives the call, so a client that never hears the
        // answer (its connection gone silent) leaves no lock behind but its
        // entry's guard, which its session's end frees.
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.append)))
            .bind(append.name)
            .bind(append.kind)
            .bind(append.session)
            .bind(append.attempt)
            .bind(append.value)
            .bind(append.skip_shared)
            .bind(append.count)
            .fetch_all(&mut *conn)
            .await?;
        let [row] = found.as_slice() else {
            return Err(shape(format!("the append answered {} rows, not one", found.len())));
        };
        let id: i64 = row.try_get(0)?;
        if id < 0 {
            return Err(shape(format!(
                "the guard {} of a new entry is held by another connection",
                names.guard(append.attempt)
            )));
        }
        let nearest: String = row.try_get(1)?;
        Ok((id, parse_nearest(&nearest)?))
    }

    async fn earlier(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        name: &str,
        session: &str,
        skip_shared: bool,
        count: i32,
    ) -> DbResult<Option<Vec<Row>>> {
        let names = self.names()?;
        let exists: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.exists)))
            .bind(id)
            .fetch_one(&mut *conn)
            .await?;
        if exists == 0 {
            return Ok(None);
        }
        self.nearest(conn, id, name, session, skip_shared, count)
            .await
            .map(Some)
    }

    async fn list(&self, conn: &mut MySqlConnection, name: &str, session: &str) -> DbResult<Vec<Row>> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.list)))
            .bind(name)
            .bind(session)
            .fetch_all(conn)
            .await?;
        found
            .iter()
            .map(|r| {
                Ok(Row {
                    id: r.try_get(0)?,
                    kind: r.try_get(1)?,
                    session: r.try_get(2)?,
                })
            })
            .collect()
    }

    async fn remove(&self, conn: &mut MySqlConnection, id: i64, session: &str, unlock: bool) -> DbResult<bool> {
        // One round trip (see the remove procedure in the DDL): the delete
        // commits before the guard is let go of.
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.remove)))
            .bind(id)
            .bind(session)
            .bind(unlock)
            .fetch_all(&mut *conn)
            .await?;
        let [row] = found.as_slice() else {
            return Err(shape(format!("the removal answered {} rows, not one", found.len())));
        };
        let removed: i64 = row.try_get(0)?;
        Ok(removed == 1)
    }

    async fn abandon(&self, conn: &mut MySqlConnection, attempt: &str, session: &str) -> DbResult<Option<i64>> {
        let names = self.names()?;
        let id: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.find)))
            .bind(attempt)
            .bind(session)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(id) = id {
            self.remove(conn, id, session, true).await?;
        } else {
            // The append may have taken the guard and never inserted.
            self.release(conn, &names.guard(attempt)).await?;
        }
        Ok(id)
    }

    async fn wait(&self, conn: &mut MySqlConnection, id: i64, owner: &str, bound_ms: i64) -> DbResult<Waited> {
        Ok(self.wait_on(conn, id, owner, bound_ms, None).await?.0)
    }

    async fn wait_turn(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        owner: &str,
        bound_ms: i64,
        turn: &Turn,
    ) -> DbResult<(Waited, Option<TurnRead>)> {
        self.wait_on(conn, id, owner, bound_ms, Some(turn)).await
    }

    async fn wait_version(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        version: i64,
        owner: &str,
        bound_ms: i64,
    ) -> DbResult<Waited> {
        let names = self.names()?;
        let lock = names.version_lock(id, version);
        let code: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.wait_lock)))
            .bind(&lock)
            .bind(&lock)
            .bind(&lock)
            .bind(bound_ms)
            .bind(owner)
            .bind(bound_ms)
            .fetch_one(&mut *conn)
            .await?;
        match code {
            Some(0) => Ok(Waited::Released),
            // The owner's heartbeat now, by a statement of its own (a fresh
            // snapshot, read after the wait).
            Some(1) => {
                let beat: Option<(i64, i64)> = sqlx::query_as(AssertSqlSafe(Arc::clone(&names.sql.beat_of)))
                    .bind(owner)
                    .fetch_optional(&mut *conn)
                    .await?;
                Ok(Waited::TimedOut(beat.map(|(count, ttl_ms)| Beat { count, ttl_ms })))
            }
            Some(4) => Err(sqlx::Error::Configuration(MULTIPLEXED.into())),
            // GET_LOCK ended by KILL QUERY answers NULL: this session's
            // cancel, or a writer's wake meant for a watch on this connection.
            None => Ok(Waited::Interrupted),
            Some(other) => Err(shape(format!("wait returned {other}"))),
        }
    }

    async fn reap(&self, conn: &mut MySqlConnection, owner: &str, _id: i64, beat: i64) -> DbResult<Reaped> {
        // Statement by statement, no transaction: nothing is held between
        // them, so a reaper cut off midway leaves no row lock behind. The
        // claim is one statement: it moves the count to a negative value
        // only if it is still `beat`, after which no renewal succeeds (they
        // need a count of zero or more), so the owner is lost from then on.
        let names = self.names()?;
        let claimed = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.reap_claim)))
            .bind(owner)
            .bind(beat)
            .execute(&mut *conn)
            .await?;
        if claimed.rows_affected() == 0 {
            let now: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.reap_read)))
                .bind(owner)
                .fetch_optional(&mut *conn)
                .await?;
            return Ok(if now.is_some() { Reaped::Renewed } else { Reaped::Gone });
        }
        let Some(owner_conn): Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.reap_read)))
            .bind(owner)
            .fetch_optional(&mut *conn)
            .await?
        else {
            return Ok(Reaped::Gone);
        };
        // Its connection, known by the session's own lock: ended if still there.
        let holder: Option<i64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
            .bind(names.session_lock(owner))
            .fetch_one(&mut *conn)
            .await?;
        if holder == Some(owner_conn) {
            let kill = conn
                .execute(sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {owner_conn}"))))
                .await;
            // Already gone between the look and the kill: nothing to end.
            // Refused (another user's connection): the rows stay, and the
            // waiter hears why.
            if let Err(error) = kill {
                if !no_such_connection(&error) {
                    return Err(error);
                }
            }
        }
        sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.reap_entries)))
            .bind(owner)
            .execute(&mut *conn)
            .await?;
        sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.reap_done)))
            .bind(owner)
            .execute(&mut *conn)
            .await?;
        Ok(Reaped::Ended)
    }

    async fn statuses(&self, conn: &mut MySqlConnection, ids: &[(i64, i64)]) -> DbResult<Vec<EntryStatus>> {
        let names = self.names()?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = ids.iter().map(|(id, _)| id.to_string()).collect::<Vec<_>>().join(",");
        let found = sqlx::query(AssertSqlSafe(format!(
            "SELECT e.id, e.version, CASE WHEN IS_FREE_LOCK(CONCAT('{p}e:', e.attempt)) THEN 0 ELSE 1 END, \
             e.session, s.beat, s.ttl_ms \
             FROM {entries} e LEFT JOIN {sessions} s ON s.id = e.session WHERE e.id IN ({list})",
            p = names.lock_prefix,
            entries = names.entries,
            sessions = names.sessions,
        )))
        .fetch_all(&mut *conn)
        .await?;
        let mut rows = HashMap::new();
        for row in found {
            let (id, version, code, owner): (i64, i64, i64, String) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
            let beat = match (row.try_get::<Option<i64>, _>(4)?, row.try_get::<Option<i64>, _>(5)?) {
                (Some(count), Some(ttl_ms)) => Some(Beat { count, ttl_ms }),
                _ => None,
            };
            rows.insert(id, (version, code, owner, beat));
        }
        // A row read with a free guard may have been read from a snapshot
        // older than a release (which deletes the row, then frees the
        // guard): only a row a fresh statement still finds outlived its
        // guard; the others were released.
        for (id, (_, code, ..)) in rows.iter_mut() {
            if *code == 0 && !self.row_exists(conn, *id).await? {
                *code = -1;
            }
        }
        rows.retain(|_, (_, code, ..)| *code != -1);
        Ok(ids
            .iter()
            .map(|&(id, wanted)| match rows.get(&id) {
                None => (id, wanted, Status::Free, String::new(), None),
                Some((version, code, owner, beat)) => {
                    let status = if wanted >= 0 && *version != wanted {
                        Status::Free
                    } else if *code == 0 {
                        // The row is there and its guard free: its owner's
                        // connection ended.
                        Status::Dead
                    } else {
                        Status::Held
                    };
                    (id, wanted, status, owner.clone(), *beat)
                }
            })
            .collect())
    }

    async fn beats(&self, conn: &mut MySqlConnection) -> DbResult<Vec<(String, Beat, i64)>> {
        let names = self.names()?;
        let found: Vec<(String, i64, i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT s.id, s.beat, s.ttl_ms, COALESCE((SELECT e.id FROM {} e WHERE e.session = s.id LIMIT 1), 0) \
             FROM {} s",
            names.entries, names.sessions
        )))
        .fetch_all(&mut *conn)
        .await?;
        Ok(found
            .into_iter()
            .map(|(id, count, ttl_ms, entry)| (id, Beat { count, ttl_ms }, entry))
            .collect())
    }

    async fn beat_of(&self, conn: &mut MySqlConnection, owner: &str) -> DbResult<Option<Beat>> {
        let found: Option<(i64, i64)> = sqlx::query_as(AssertSqlSafe(Arc::clone(&self.names()?.sql.beat_of)))
            .bind(owner)
            .fetch_optional(conn)
            .await?;
        Ok(found.map(|(count, ttl_ms)| Beat { count, ttl_ms }))
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

    async fn set_value(&self, conn: &mut MySqlConnection, id: i64, session: &str, value: &[u8]) -> DbResult<bool> {
        self.check_size(value.len())?;
        let names = self.names()?;
        let mut tx = conn.begin().await?;
        let old: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.value_of)))
            .bind(id)
            .bind(session)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(old) = old else {
            tx.commit().await?;
            return Ok(false);
        };
        sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.bump_value)))
            .bind(value)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        // Committed first: a watcher woken by the old version's lock reads
        // the new value.
        let next = names.version_lock(id, old + 1);
        sqlx::query("SELECT GET_LOCK(?, 0)")
            .bind(&next)
            .execute(&mut *conn)
            .await?;
        self.release(conn, &names.version_lock(id, old)).await?;
        Ok(true)
    }

    async fn get_value(&self, conn: &mut MySqlConnection, id: i64, session: &str) -> DbResult<Option<(Vec<u8>, i64)>> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.get_value)))
            .bind(id)
            .bind(session)
            .fetch_optional(conn)
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }

    async fn write_if_held(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        session: &str,
        writes: &[Write],
    ) -> DbResult<bool> {
        for write in writes {
            let value = match write {
                Write::Put { value, .. } => value.len(),
                _ => 0,
            };
            self.check_size(write.key().len() + value)?;
        }
        let names = self.names()?;
        let mut tx = conn.begin().await?;
        let held: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.held)))
            .bind(id)
            .bind(session)
            .fetch_one(&mut *tx)
            .await?;
        if held == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        for write in writes {
            match write {
                Write::Put { key, value } => {
                    sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.put)))
                        .bind(key)
                        .bind(value)
                        .execute(&mut *tx)
                        .await?;
                }
                other => {
                    sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.delete)))
                        .bind(other.key())
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn read(&self, conn: &mut MySqlConnection, key: &str) -> DbResult<Option<Vec<u8>>> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.read)))
            .bind(key)
            .fetch_optional(conn)
            .await
    }

    async fn close(&self, conn: &mut MySqlConnection, session: &str) -> DbResult<()> {
        let names = self.names()?;
        sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.close_entries)))
            .bind(session)
            .execute(&mut *conn)
            .await?;
        sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.close_session)))
            .bind(session)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
    async fn read_queue(
        &self,
        conn: &mut MySqlConnection,
        name: &str,
        session: &str,
    ) -> DbResult<(Vec<QueueRow>, Option<Vec<u8>>)> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.read_queue)))
            .bind(name)
            .bind(name)
            .bind(session)
            .fetch_all(conn)
            .await?;
        let mut block = None;
        let mut rows = Vec::with_capacity(found.len());
        for r in &found {
            let id: Option<i64> = r.try_get(0)?;
            let Some(id) = id else {
                block = Some(r.try_get(3)?);
                continue;
            };
            rows.push(QueueRow {
                row: Row {
                    id,
                    kind: r.try_get(1)?,
                    session: r.try_get(2)?,
                },
                value: r.try_get(3)?,
                version: r.try_get(4)?,
                changed: r.try_get(5)?,
            });
        }
        Ok((rows, block))
    }

    async fn update_queue(&self, conn: &mut MySqlConnection, change: &QueueChange<'_>) -> DbResult<Option<i64>> {
        // "id version op length;" by ascending id, the values set after
        // each other in that order (see the procedure).
        let mut named = String::new();
        let mut values = Vec::new();
        for entry in &change.named {
            let set = change
                .set
                .iter()
                .find(|(id, _)| *id == entry.id)
                .map(|(_, value)| *value);
            let delete = change.delete.contains(&entry.id);
            let op = u8::from(set.is_some()) | (u8::from(delete) << 1);
            let length = set.map_or(0, <[u8]>::len);
            named.push_str(&format!("{} {} {op} {length};", entry.id, entry.condition.code()));
            if let Some(value) = set {
                values.extend_from_slice(value);
            }
        }
        self.check_size(values.len() + change.block.map_or(0, <[u8]>::len) + named.len() + change.name.len())?;
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.update_queue)))
            .bind(change.name)
            .bind(change.session)
            .bind(named)
            .bind(values)
            .bind(change.block)
            .fetch_all(conn)
            .await?;
        let [row] = found.as_slice() else {
            return Err(shape(format!("the change answered {} rows, not one", found.len())));
        };
        row.try_get(0)
    }

    async fn watch_read(&self, conn: &mut MySqlConnection, id: i64, session: &str) -> DbResult<Found> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.watch_read)))
            .bind(session)
            .bind(id)
            .fetch_optional(conn)
            .await?;
        row.map(|r| {
            let watched = Watched {
                value: r.try_get(0)?,
                version: r.try_get(1)?,
                epoch: r.try_get(2)?,
            };
            let live: Option<i64> = r.try_get(3)?;
            Ok((watched, live == Some(1)))
        })
        .transpose()
    }

    async fn wait_watch(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        at: Watched<()>,
        session: &str,
        owner: &str,
        bound_ms: i64,
    ) -> DbResult<(Waited, Option<Found>)> {
        let names = self.names()?;
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.watch)))
            .bind(id)
            .bind(at.epoch)
            .bind(at.version)
            .bind(session)
            .bind(owner)
            .bind(bound_ms)
            .fetch_all(&mut *conn)
            .await;
        let row = match found {
            Ok(mut found) if found.len() == 1 => found.remove(0),
            Ok(found) => return Err(shape(format!("the watch answered {} rows, not one", found.len()))),
            // Woken in a step other than the wait: its slot may still be
            // held, which would draw wakes meant for it to the next wait.
            Err(error) if crate::error::interrupted(&error) => {
                conn.execute("DO RELEASE_ALL_LOCKS()").await?;
                return Ok((Waited::Interrupted, None));
            }
            Err(error) => return Err(error),
        };
        let code: Option<i64> = row.try_get(0)?;
        let waited = match code {
            Some(0) => Waited::Released,
            Some(3) => Waited::Lost,
            Some(1) => {
                let beat: Option<(i64, i64)> = sqlx::query_as(AssertSqlSafe(Arc::clone(&names.sql.beat_of)))
                    .bind(owner)
                    .fetch_optional(&mut *conn)
                    .await?;
                return Ok((
                    Waited::TimedOut(beat.map(|(count, ttl_ms)| Beat { count, ttl_ms })),
                    None,
                ));
            }
            other => return Err(shape(format!("the watch answered {other:?}"))),
        };
        let read: Option<i64> = row.try_get(1)?;
        if read != Some(1) {
            return Ok((waited, None));
        }
        let value: Option<Vec<u8>> = row.try_get(2)?;
        let found = match value {
            None => None,
            Some(value) => {
                let watched = Watched {
                    value,
                    version: row.try_get::<Option<i64>, _>(3)?.unwrap_or_default(),
                    epoch: row.try_get::<Option<i64>, _>(4)?.unwrap_or_default(),
                };
                Some((watched, row.try_get::<Option<i64>, _>(5)? == Some(1)))
            }
        };
        Ok((waited, Some(found)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_entries_are_read_as_the_procedure_writes_them() {
        let rows = parse_nearest("41 write 0af3;7 read 9bc1;").expect("parse");
        assert_eq!(
            rows,
            vec![
                Row {
                    id: 41,
                    kind: "write".into(),
                    session: "0af3".into()
                },
                Row {
                    id: 7,
                    kind: "read".into(),
                    session: "9bc1".into()
                },
            ]
        );
        assert_eq!(parse_nearest("").expect("parse"), Vec::new());
        assert!(parse_nearest("x mutex s;").is_err());
        assert!(parse_nearest("7 mutex;").is_err());
    }

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

#[cfg(test)]
mod script_tests {
    use super::*;

    #[test]
    fn the_script_is_of_this_layout() {
        let script = ddl::without_notes(SCRIPT);
        assert!(script.starts_with(&format!(
            "-- lockline's tables and procedures (layout {LAYOUT_VERSION})"
        )));
        assert!(script.ends_with(&format!("(singleton, layout) VALUES (1, {LAYOUT_VERSION});\n")));
    }

    #[test]
    fn the_script_is_written_for_the_default_names() {
        for name in [
            format!("`{SCRIPT_DATABASE}`.`{DEFAULT_PREFIX}entries`"),
            format!("CONCAT('{}e:', ", Names::lock_prefix(SCRIPT_DATABASE, DEFAULT_PREFIX)),
        ] {
            assert!(SCRIPT.contains(&name), "the script has no {name}");
        }
        assert_eq!(
            Names::new(SCRIPT_DATABASE, DEFAULT_PREFIX).ddl(),
            ddl::without_notes(SCRIPT)
        );
    }

    #[test]
    fn every_name_of_the_script_is_replaced() {
        let made = Names::new("app", "p_").ddl();
        let script = Names::lock_prefix(SCRIPT_DATABASE, DEFAULT_PREFIX);
        for gone in ["`lockline`", "`lockline_", &script] {
            assert!(!made.contains(gone), "{gone} is left in the script");
        }
        let source = ddl::without_notes(SCRIPT);
        assert_eq!(
            made.matches("`app`.`p_").count(),
            source
                .matches(&format!("`{SCRIPT_DATABASE}`.`{DEFAULT_PREFIX}"))
                .count()
        );
        assert_eq!(
            made.matches(&Names::lock_prefix("app", "p_")).count(),
            source.matches(&script).count()
        );
    }

    #[test]
    fn the_script_runs_a_step_at_a_time() {
        let names = Names::new("app", "p_");
        let steps = names.ddl_steps();
        // The tables, one step per procedure, the layout's row.
        let procedures = [
            "append",
            "update_queue",
            "watch",
            "wake",
            "fence",
            "wait_turn",
            "remove",
        ];
        assert_eq!(steps.len(), procedures.len() + 2, "{steps:#?}");
        assert!(steps[0].contains("CREATE TABLE IF NOT EXISTS `app`.`p_entries`"));
        assert!(!steps[0].contains("DELIMITER") && !steps[0].contains("PROCEDURE IF"));
        for (step, procedure) in steps[1..].iter().zip(procedures) {
            assert_eq!(step.matches("CREATE PROCEDURE").count(), 1, "{step}");
            assert!(step.contains(&format!("CREATE PROCEDURE IF NOT EXISTS `app`.`p_{procedure}`(")));
            assert!(step.ends_with("END") && !step.contains("DELIMITER"), "{step}");
        }
        assert!(steps[procedures.len() + 1].contains("INSERT IGNORE INTO `app`.`p_meta`"));
        let moved = names.upgrade_steps().expect("the procedures");
        assert_eq!(moved, [&steps[5], &steps[6], &steps[7]].map(String::clone));
    }
}
