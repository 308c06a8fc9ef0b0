//! PostgreSQL: entries in an unlogged table, guards as session-level
//! advisory locks of the owning connection, every step one function call.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use lockline::{Error, Write};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, Row as _};

use crate::ddl;
use crate::dialect::{
    shape, Append, Beat, DbResult, Dialect, EntryStatus, Found, Grace, Listener, Purpose, QueueChange, QueueRow,
    Reaped, Row, Status, Turn, TurnRead, Waited, Watched,
};
use crate::error::{has_code, Doing};
use crate::layout::{fnv64, movable, Tables, DEFAULT_PREFIX, DLM, LAYOUT_VERSION, MOVABLE_LAYOUTS};
use crate::Settings;

/// The tables and functions, as `ddl/postgres.sql` keeps them: for schema
/// [`SCRIPT_SCHEMA`] and the default table prefix.
const SCRIPT: &str = include_str!("../ddl/postgres.sql");

/// The schema the script is written for.
const SCRIPT_SCHEMA: &str = "public";

/// The database's clock in microseconds since the epoch.
const NOW_US: &str = "(extract(epoch from clock_timestamp()) * 1000000)::bigint";

/// The names and statements of one set of tables, once its schema is known.
#[derive(Debug)]
struct Names {
    schema: String,
    prefix: String,
    meta: String,
    /// `ll<hash>_`: the start of the notification channel of each entry
    /// (`ll<hash>_<id>`), kept apart per table set.
    channel: String,
    /// `"schema".prefix` for functions: `{functions}append`.
    functions: String,
    /// The first key of the two-`int4` advisory-lock space lockline uses
    /// (serializing appends to one name, creating the tables).
    class: i32,
    sql: Statements,
}

#[derive(Debug)]
struct Statements {
    heartbeat: Arc<str>,
    statuses: Arc<str>,
    beats: Arc<str>,
    beat_of: Arc<str>,
    own_ids: Arc<str>,
    append: Arc<str>,
    earlier: Arc<str>,
    list: Arc<str>,
    remove: Arc<str>,
    release: Arc<str>,
    abandon: Arc<str>,
    wait: Arc<str>,
    wait_turn: Arc<str>,
    wait_version: Arc<str>,
    reap: Arc<str>,
    set_value: Arc<str>,
    get_value: Arc<str>,
    write: Arc<str>,
    read: Arc<str>,
    close: Arc<str>,
    end: Arc<str>,
    open: Arc<str>,
    fence: Arc<str>,
    read_queue: Arc<str>,
    update_queue: Arc<str>,
    watch_read: Arc<str>,
    watch: Arc<str>,
}

/// The PostgreSQL dialect for one database URL and table set.
pub(crate) struct Postgres {
    connect: PgConnectOptions,
    tables: Tables,
    settings: Settings,
    names: OnceLock<Names>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("host", &self.connect.get_host())
            .field("port", &self.connect.get_port())
            .field("database", &self.connect.get_database())
            .field("tables", &self.tables)
            .finish_non_exhaustive()
    }
}

fn quote(identifier: &str) -> String {
    // Identifiers are checked to be [a-z0-9_] (layout::Tables), so quoting
    // only keeps them from being taken as keywords.
    format!("\"{identifier}\"")
}

/// The keys one set of tables derives from its schema and prefix: the
/// salt of its guards' advisory-lock keys, the class of its two-key
/// advisory locks, and the start of its entries' notification channels.
#[derive(Debug)]
struct Keys {
    /// XORed into an entry's id to make its guard's advisory-lock key
    /// (`bigint` space): keeps keys of two table sets apart and away from
    /// the small numbers applications lock.
    salt: i64,
    class: i32,
    channel: String,
}

impl Keys {
    fn new(schema: &str, prefix: &str) -> Self {
        let hash = fnv64(&format!("postgres/{schema}.{prefix}"));
        // Bits 53..62: ids stay below 2^53 (microseconds until the year
        // 2255), so keys of two sets differ unless these ten bits match.
        let mut salt = (hash & 0x7fe0_0000_0000_0000) as i64;
        if salt == 0 {
            salt = 1 << 53;
        }
        Keys {
            salt,
            class: (hash >> 32) as u32 as i32,
            channel: format!("ll{:012x}_", hash >> 16),
        }
    }
}

impl Names {
    fn new(schema: &str, prefix: &str) -> Self {
        let q = quote(schema);
        let table = |t: &str| format!("{q}.{}", quote(&format!("{prefix}{t}")));
        let Keys { salt, class, channel } = Keys::new(schema, prefix);
        let entries = table("entries");
        let sessions = table("sessions");
        let meta = table("meta");
        let data = table("data");
        let blocks = table("blocks");
        let functions = format!("{q}.\"{prefix}");
        // A dead entry that still blocks: with the reset grace
        // (Sql::with_reset_grace), one whose session is still there.
        let live = format!(
            "(e.session = $2 OR NOT pg_try_advisory_xact_lock_shared(e.id # {salt}) \
             OR (coalesce(current_setting('lockline.reset_grace', true), '') = 'on' \
                 AND EXISTS (SELECT 1 FROM {sessions} s WHERE s.id = e.session)))"
        );
        // `"schema"."prefix` + `append"`: a function name quoted whole.
        let f = |name: &str| format!("{functions}{name}\"");
        let sql = Statements {
            heartbeat: format!(
                "UPDATE {sessions} s SET renewed_us = {NOW_US}, beat = s.beat + 1 WHERE s.id = $1 AND s.pid <> pg_backend_pid() \
                 AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid AND a.backend_start = s.backend_start) \
                 RETURNING (SELECT count(*) FROM {entries} e WHERE e.session = $1)"
            )
            .into(),
            statuses: format!(
                "SELECT x.id, x.version, CASE WHEN e.id IS NULL OR (x.version >= 0 AND e.version <> x.version) THEN 0 \
                 WHEN pg_try_advisory_xact_lock_shared(x.id # {salt}) THEN 3 ELSE 1 END::integer, \
                 COALESCE(e.session, ''), s.beat, s.ttl_ms \
                 FROM unnest($1::bigint[], $2::bigint[]) AS x(id, version) LEFT JOIN {entries} e ON e.id = x.id \
                 LEFT JOIN {sessions} s ON s.id = e.session"
            )
            .into(),
            beats: format!(
                "SELECT s.id, s.beat, s.ttl_ms, COALESCE((SELECT e.id FROM {entries} e WHERE e.session = s.id LIMIT 1), 0) \
                 FROM {sessions} s"
            )
            .into(),
            own_ids: format!("SELECT e.id FROM {entries} e WHERE e.session = $1").into(),
            beat_of: format!("SELECT s.beat, s.ttl_ms FROM {sessions} s WHERE s.id = $1").into(),
            append: format!(
                "SELECT e_id, e_kind, e_session FROM {}($1, $2, $3, $4, $5, $6, $7)",
                f("append")
            )
            .into(),
            earlier: format!(
                "SELECT e_id, e_kind, e_session FROM {}($1, $2, $3, $4, $5)",
                f("earlier")
            )
            .into(),
            list: format!(
                "SELECT e.id, e.kind, e.session FROM {entries} e WHERE e.name = $1 \
                 AND (e.session = $2 OR NOT pg_try_advisory_xact_lock_shared(e.id # {salt})) ORDER BY e.id"
            )
            .into(),
            remove: format!("SELECT {}($1, $2, $3)", f("remove")).into(),
            release: format!("CALL {}($1, $2, NULL)", f("release")).into(),
            abandon: format!("SELECT {}($1, $2)", f("abandon")).into(),
            wait: format!("SELECT w_code, w_beat, w_ttl_ms FROM {}($1 # {salt}, $2, $3, $1)", f("wait")).into(),
            wait_turn: format!(
                "SELECT w_code, w_beat, w_ttl_ms, w_read, e_id, e_kind, e_session FROM {}($1, $2, $3, $4, $5, $6, $7, $8)",
                f("wait_turn")
            )
            .into(),
            wait_version: format!(
                "SELECT w_code, w_beat, w_ttl_ms FROM {}(hashtextextended($1::text || ':' || $2::text, {salt}), $3, $4, NULL)",
                f("wait")
            )
            .into(),
            reap: format!("SELECT {}($1, $2 # {salt}, $3)", f("reap")).into(),
            set_value: format!("SELECT {}($1, $2, $3)", f("set_value")).into(),
            get_value: format!(
                "SELECT e.value, e.version FROM {entries} e WHERE e.id = $1 \
                 AND (e.session = $2 OR NOT pg_try_advisory_xact_lock_shared(e.id # {salt})) FOR SHARE OF e"
            )
            .into(),
            write: format!("SELECT {}($1, $2, $3, $4, $5)", f("write")).into(),
            read: format!("SELECT d.value FROM {data} d WHERE d.key = $1").into(),
            close: format!("SELECT {}($1)", f("close")).into(),
            end: format!("SELECT {}($1, $2)", f("end")).into(),
            open: format!("SELECT {}($1, $2)", f("open")).into(),
            fence: format!("SELECT {}($1)", f("fence")).into(),
            // The block first (no id), then the entries: one statement, one
            // snapshot. Values of other kinds' entries are not sent.
            read_queue: format!(
                "SELECT NULL::bigint, NULL::text, NULL::text, b.value, NULL::bigint, NULL::bigint \
                 FROM {blocks} b WHERE b.name = $1 \
                 UNION ALL \
                 SELECT e.id, e.kind, e.session, CASE WHEN e.kind = '{DLM}' THEN e.value ELSE '\\x'::bytea END, \
                 e.version, greatest(e.changed, e.id) FROM {entries} e WHERE e.name = $1 AND {live} \
                 ORDER BY 1 NULLS FIRST"
            )
            .into(),
            update_queue: format!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                f("update_queue")
            )
            .into(),
            watch_read: format!(
                "SELECT e.value, e.version, e.epoch, {live} FROM {entries} e WHERE e.id = $1 FOR SHARE OF e"
            )
            .into(),
            watch: format!(
                "SELECT w_code, w_beat, w_ttl_ms, w_read, w_value, w_version, w_epoch, w_live \
                 FROM {}($1, $2, $3, $4, $5, $6)",
                f("watch")
            )
            .into(),
        };
        Names {
            schema: schema.to_owned(),
            prefix: prefix.to_owned(),
            meta,
            channel,
            functions,
            class,
            sql,
        }
    }

    fn function(&self, name: &str) -> String {
        format!("{}{name}\"", self.functions)
    }

    /// The tables and functions, as a script a DBA can run: the script of
    /// `ddl/postgres.sql` for these names.
    fn ddl(&self) -> String {
        self.renamed(ddl::without_notes(SCRIPT))
    }

    /// The functions layout 5 added (the fence of layout 4 with them): what
    /// a session creates alone when it moves layout 3 or 4 tables to layout
    /// 5. Each is taken from the script with the comment lines right above
    /// its `CREATE`.
    fn upgrade_ddl(&self) -> DbResult<String> {
        let functions = ["fence", "wait_turn", "release"]
            .iter()
            .map(|name| script_function(ddl::without_notes(SCRIPT), name))
            .collect::<DbResult<Vec<&str>>>()?;
        Ok(self.renamed(&functions.join("\n")))
    }

    /// `text` of the script with its names replaced by these.
    fn renamed(&self, text: &str) -> String {
        let script = Keys::new(SCRIPT_SCHEMA, DEFAULT_PREFIX);
        let keys = Keys::new(&self.schema, &self.prefix);
        let (script_salt, salt) = (script.salt.to_string(), keys.salt.to_string());
        let (script_class, class) = (script.class.to_string(), keys.class.to_string());
        ddl::rename(
            text,
            &[
                (&quote(SCRIPT_SCHEMA), &quote(&self.schema)),
                (&format!("\"{DEFAULT_PREFIX}"), &format!("\"{}", self.prefix)),
                (DEFAULT_PREFIX, &self.prefix),
                (&script_salt, &salt),
                (&script_class, &class),
                (&script.channel, &keys.channel),
            ],
        )
    }
}

/// The definition of function (or procedure) `name` in `script`, as a
/// session creates it alone: from the comment lines right above its
/// `CREATE` to its closing `$fn$;` line.
fn script_function<'s>(script: &'s str, name: &str) -> DbResult<&'s str> {
    let called = format!(" {}.\"{DEFAULT_PREFIX}{name}\"(", quote(SCRIPT_SCHEMA));
    let mut lines = Vec::new();
    let mut at = 0;
    for line in script.split_inclusive('\n') {
        lines.push((at, line));
        at += line.len();
    }
    let missing = || sqlx::Error::Configuration(format!("the DDL script has no function {name}").into());
    let create = lines
        .iter()
        .position(|(_, line)| line.starts_with("CREATE OR REPLACE ") && line.contains(&called))
        .ok_or_else(missing)?;
    let first = lines[..create]
        .iter()
        .rposition(|(_, line)| !line.starts_with("--"))
        .map_or(0, |before| before + 1);
    let (end, last) = lines[create..]
        .iter()
        .find(|(_, line)| line.trim_end() == "$fn$;")
        .ok_or_else(missing)?;
    Ok(&script[lines[first].0..end + last.len()])
}

impl Postgres {
    pub(crate) fn new(url: &str, tables: Tables, settings: Settings) -> lockline::Result<Self> {
        let connect: PgConnectOptions = url.parse().map_err(|e: sqlx::Error| Error::InvalidOptions {
            reason: format!(
                "invalid PostgreSQL URL {:?}: {e}{}",
                crate::redact(url),
                crate::encoding_hint(url)
            ),
        })?;
        Ok(Postgres {
            connect,
            tables,
            settings,
            names: OnceLock::new(),
        })
    }

    fn names(&self) -> DbResult<&Names> {
        self.names
            .get()
            .ok_or_else(|| sqlx::Error::Configuration("the tables' schema is not resolved yet".into()))
    }

    /// The DDL script for `schema` (or the configured one).
    pub(crate) fn ddl(&self, schema: Option<&str>) -> lockline::Result<String> {
        let schema = match (schema, self.tables.qualifier.as_str()) {
            (Some(s), _) => s.to_owned(),
            (None, "") => "public".to_owned(),
            (None, q) => q.to_owned(),
        };
        Tables::new(Some(&schema), &self.tables.prefix)?;
        Ok(Names::new(&schema, &self.tables.prefix).ddl())
    }

    /// The call of the fence function a fenced transaction makes before it
    /// commits (one parameter: the entry's key).
    pub(crate) fn fence_sql(&self) -> DbResult<Arc<str>> {
        Ok(Arc::clone(&self.names()?.sql.fence))
    }

    /// The options of a connection for `purpose`, and the statement that
    /// sets its settings again once connected (answering its pid).
    fn connect_options(&self, purpose: Purpose) -> (PgConnectOptions, String) {
        let Settings {
            owner_lock_timeout,
            check_interval,
            ..
        } = self.settings;
        let lock_timeout = match purpose {
            // The owning connection never waits long on a row (a fenced
            // commit in flight): its renewals queue behind it.
            Purpose::Owner => format!("{}ms", owner_lock_timeout.as_millis().max(1)),
            Purpose::Control | Purpose::Wait => "0".to_owned(),
        };
        let check = format!("{}ms", check_interval.as_millis().max(1));
        // The server's second line behind the client's bounded round trips
        // (see `ServerKeepalive`); ignored on a Unix socket.
        let probe = self.settings.server_keepalive;
        let (idle, interval, count, user_timeout) = (
            probe.idle_s.to_string(),
            probe.interval_s.to_string(),
            probe.count.to_string(),
            probe.user_timeout_ms.to_string(),
        );
        // Nothing lockline reads is a float: no extra_float_digits, one
        // startup parameter fewer for a pooler to refuse before `options`.
        let settings = [
            ("idle_session_timeout", "0"),
            ("idle_in_transaction_session_timeout", "0"),
            ("statement_timeout", "0"),
            ("lock_timeout", lock_timeout.as_str()),
            ("client_connection_check_interval", check.as_str()),
            ("standard_conforming_strings", "on"),
            ("tcp_keepalives_idle", idle.as_str()),
            ("tcp_keepalives_interval", interval.as_str()),
            ("tcp_keepalives_count", count.as_str()),
            ("tcp_user_timeout", user_timeout.as_str()),
        ];
        let options = self
            .connect
            .clone()
            .application_name("lockline")
            .extra_float_digits(None)
            .options(settings);
        // Set again in the session: a session-mode pool started with
        // `ignore_startup_parameters = options` drops the startup ones.
        let mut set = String::from("SELECT pg_backend_pid()");
        for (name, value) in settings {
            set.push_str(&format!(", set_config('{name}', '{value}', false)"));
        }
        if self.settings.reset_grace {
            set.push_str(", set_config('lockline.reset_grace', 'on', false)");
        }
        (options, set)
    }

    fn doing<'a>(&self, what: &'a str, target: &'a str) -> Doing<'a> {
        Doing {
            backend: "postgres",
            what,
            target,
        }
    }

    /// Creates the tables and functions, one creator at a time.
    async fn create(&self, conn: &mut PgConnection, names: &Names) -> DbResult<()> {
        let mut tx = conn.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
            .bind(names.class)
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(names.ddl())).execute(&mut *tx).await?;
        tx.commit().await
    }

    /// Moves tables of a movable layout to this one: creates the fence
    /// and the wait that reads a turn, and raises the layout, one mover at a time, in one
    /// transaction. The layout found (the current one when moved).
    async fn upgrade(&self, conn: &mut PgConnection, names: &Names) -> DbResult<Option<i32>> {
        let mut tx = conn.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
            .bind(names.class)
            .execute(&mut *tx)
            .await?;
        let layout: Option<i32> =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT layout FROM {} FOR UPDATE", names.meta)))
                .fetch_optional(&mut *tx)
                .await?;
        if !movable(layout) {
            // Moved meanwhile by another session, or not ours to move.
            return Ok(layout);
        }
        sqlx::raw_sql(AssertSqlSafe(names.upgrade_ddl()?))
            .execute(&mut *tx)
            .await?;
        let [oldest, newest] = MOVABLE_LAYOUTS;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET layout = {LAYOUT_VERSION} WHERE layout BETWEEN {oldest} AND {newest}",
            names.meta
        )))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(LAYOUT_VERSION))
    }

    /// What is wrong with the columns of an existing table, if anything.
    async fn check_columns(
        &self,
        conn: &mut PgConnection,
        names: &Names,
        table: &str,
        expected: &[(&str, &str)],
    ) -> DbResult<Option<String>> {
        let rows = sqlx::query(
            "SELECT column_name::text, data_type::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
        )
        .bind(&names.schema)
        .bind(format!("{}{table}", self.tables.prefix))
        .fetch_all(&mut *conn)
        .await?;
        let found: Vec<(String, String)> = rows
            .iter()
            .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?)))
            .collect::<DbResult<_>>()?;
        for (column, kind) in expected {
            match found.iter().find(|(c, _)| c == column) {
                None => return Ok(Some(format!("it has no column {column:?}"))),
                Some((_, t)) if t != kind => {
                    return Ok(Some(format!("its column {column:?} is {t}, not {kind}")));
                }
                Some(_) => {}
            }
        }
        Ok(None)
    }
}

fn rows(found: Vec<PgRow>) -> DbResult<Vec<Row>> {
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

fn status(code: i32) -> Status {
    match code {
        0 => Status::Free,
        3 => Status::Dead,
        _ => Status::Held,
    }
}

/// A heartbeat read beside a status or a wait (NULLs: no session row).
fn beat(count: Option<i64>, ttl_ms: Option<i64>) -> Option<Beat> {
    Some(Beat {
        count: count?,
        ttl_ms: ttl_ms?,
    })
}

fn waited(row: &PgRow) -> DbResult<Waited> {
    let code: i32 = row.try_get(0)?;
    match code {
        0 => Ok(Waited::Released),
        3 => Ok(Waited::Lost),
        1 => Ok(Waited::TimedOut(beat(row.try_get(1)?, row.try_get(2)?))),
        other => Err(shape(format!("wait returned {other}"))),
    }
}

#[async_trait]
impl Dialect for Postgres {
    type Conn = PgConnection;

    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn connect(&self, purpose: Purpose) -> DbResult<(PgConnection, i64)> {
        let (options, set) = self.connect_options(purpose);
        let mut conn = options.connect().await?;
        let pid: i32 = sqlx::query_scalar(AssertSqlSafe(set)).fetch_one(&mut conn).await?;
        Ok((conn, i64::from(pid)))
    }

    async fn prepare(&self, conn: &mut PgConnection) -> lockline::Result<()> {
        let target = crate::pg_target(&self.connect);
        let doing = |what| self.doing(what, &target);
        let map = |what, e| crate::error::map(doing(what), e);
        if self.names.get().is_none() {
            let schema = if self.tables.qualifier.is_empty() {
                let current: Option<String> = sqlx::query_scalar("SELECT current_schema()::text")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(|e| map("read the current schema", e))?;
                current.ok_or_else(|| Error::InvalidOptions {
                    reason: format!(
                        "{target}: the connection has no current schema (an empty search_path); name one with Sql::with_schema"
                    ),
                })?
            } else {
                self.tables.qualifier.clone()
            };
            if Tables::new(Some(&schema), &self.tables.prefix).is_err() {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "{target}: the current schema {schema:?} is not a plain lower-case identifier; name one with Sql::with_schema"
                    ),
                });
            }
            let _ = self.names.set(Names::new(&schema, &self.tables.prefix));
        }
        let names = self.names().map_err(|e| map("resolve the tables", e))?;
        let layout = sqlx::query_scalar::<_, i32>(AssertSqlSafe(format!("SELECT layout FROM {}", names.meta)))
            .fetch_optional(&mut *conn)
            .await;
        let layout = match layout {
            Err(error) if has_code(&error, "42P01") => {
                // No meta table: a first use. Create everything.
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
                        key: format!("schema {}", names.schema),
                        reason: format!(
                            "{reason}; lockline creates its tables on first use, which needs CREATE on the schema (or run the DDL script from Sql::ddl as a user who has it)"
                        ),
                    },
                    other => other,
                })?;
                Some(LAYOUT_VERSION)
            }
            other => other.map_err(|e| map("read lockline's layout version", e))?,
        };
        let layout = match layout {
            // The layout before: moved here (it lacks the fence function
            // alone), unless this user may create nothing.
            found if movable(found) && self.settings.create_tables => self
                .upgrade(conn, names)
                .await
                .map_err(|e| match map("move lockline's tables to the current layout", e) {
                    Error::PermissionDenied { backend, reason, .. } => Error::PermissionDenied {
                        backend,
                        operation: "create the fence and wait functions in",
                        key: format!("schema {}", names.schema),
                        reason: format!(
                            "{reason}; layout {} tables are moved to layout {LAYOUT_VERSION} on first use, which needs CREATE on the schema (or have the tables' owner do it: the SQL chapter of the documentation, docs/sql.md, \"Layout versions\")",
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
        let expected: [(&str, &[(&str, &str)]); 4] = [
            (
                "entries",
                &[
                    ("id", "bigint"),
                    ("name", "text"),
                    ("kind", "text"),
                    ("session", "text"),
                    ("attempt", "text"),
                    ("value", "bytea"),
                    ("version", "bigint"),
                    ("epoch", "bigint"),
                    ("changed", "bigint"),
                ],
            ),
            (
                "sessions",
                &[
                    ("id", "text"),
                    ("pid", "integer"),
                    ("ttl_ms", "bigint"),
                    ("renewed_us", "bigint"),
                    ("backend_start", "timestamp with time zone"),
                    ("beat", "bigint"),
                ],
            ),
            ("data", &[("key", "text"), ("value", "bytea")]),
            ("blocks", &[("name", "text"), ("value", "bytea")]),
        ];
        for (table, columns) in expected {
            let problem = self
                .check_columns(conn, names, table, columns)
                .await
                .map_err(|e| map("check lockline's tables", e))?;
            if let Some(problem) = problem {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "{target}: the table {}.{}{table} is not lockline's: {problem}; pick another table prefix (Sql::with_table_prefix) or schema",
                        names.schema, self.tables.prefix
                    ),
                });
            }
        }
        let missing: Option<String> =
            sqlx::query_scalar("SELECT f FROM unnest($1::text[]) f WHERE to_regproc(f) IS NULL LIMIT 1")
                .bind(
                    [
                        "append",
                        "nearest",
                        "earlier",
                        "remove",
                        "abandon",
                        "wait",
                        "reap",
                        "set_value",
                        "write",
                        "close",
                        "open",
                        "update_queue",
                        "watch",
                        "fence",
                    ]
                    .map(|f| names.function(f))
                    .to_vec(),
                )
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| map("check lockline's functions", e))?;
        if let Some(function) = missing {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "{target}: lockline's function {function} is missing; run the DDL script (Sql::ddl) again"
                ),
            });
        }
        Ok(())
    }

    async fn open(&self, conn: &mut PgConnection, session: &str, ttl_ms: i64) -> DbResult<Option<Grace>> {
        let names = self.names()?;
        // The function also answers what is left of the grace by the
        // server's clock (an older lockline's reading): not used, a step of
        // that clock would shorten it.
        let _: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.open)))
            .bind(session)
            .bind(ttl_ms)
            .fetch_one(&mut *conn)
            .await?;
        let grace: Option<(i64, Option<i64>)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT grace_ms, (extract(epoch FROM grace_from) * 1000000)::bigint FROM {} WHERE grace_ms > 0",
            names.meta
        )))
        .fetch_optional(&mut *conn)
        .await?;
        Ok(grace.map(|(ms, id)| Grace {
            ms,
            id: id.unwrap_or(0),
        }))
    }

    async fn end_grace(&self, conn: &mut PgConnection, id: i64) -> DbResult<()> {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET grace_ms = 0 WHERE grace_ms > 0 \
             AND coalesce((extract(epoch FROM grace_from) * 1000000)::bigint, 0) = $1",
            self.names()?.meta
        )))
        .bind(id)
        .execute(conn)
        .await
        .map(drop)
    }

    async fn heartbeat(&self, conn: &mut PgConnection, session: &str) -> DbResult<Option<i64>> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.heartbeat)))
            .bind(session)
            .fetch_optional(conn)
            .await
    }

    async fn statuses(&self, conn: &mut PgConnection, ids: &[(i64, i64)]) -> DbResult<Vec<EntryStatus>> {
        let (entries, versions): (Vec<i64>, Vec<i64>) = ids.iter().copied().unzip();
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.statuses)))
            .bind(entries)
            .bind(versions)
            .fetch_all(conn)
            .await?;
        found
            .iter()
            .map(|r| {
                Ok((
                    r.try_get(0)?,
                    r.try_get(1)?,
                    status(r.try_get(2)?),
                    r.try_get(3)?,
                    beat(r.try_get(4)?, r.try_get(5)?),
                ))
            })
            .collect()
    }

    async fn beats(&self, conn: &mut PgConnection) -> DbResult<Vec<(String, Beat, i64)>> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.beats)))
            .fetch_all(&mut *conn)
            .await?;
        found
            .iter()
            .map(|r| {
                let beat = Beat {
                    count: r.try_get(1)?,
                    ttl_ms: r.try_get(2)?,
                };
                Ok((r.try_get(0)?, beat, r.try_get(3)?))
            })
            .collect()
    }

    async fn own_ids(&self, conn: &mut PgConnection, session: &str) -> DbResult<Vec<i64>> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.own_ids)))
            .bind(session)
            .fetch_all(conn)
            .await
    }

    async fn append(&self, conn: &mut PgConnection, append: &Append<'_>) -> DbResult<(i64, Vec<Row>)> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.append)))
            .bind(append.name)
            .bind(append.kind)
            .bind(append.session)
            .bind(append.attempt)
            .bind(append.value)
            .bind(append.skip_shared)
            .bind(append.count)
            .fetch_all(conn)
            .await?;
        let mut found = rows(found)?.into_iter();
        let mine = found.next().ok_or_else(|| shape("append returned no row"))?;
        Ok((mine.id, found.collect()))
    }

    async fn earlier(
        &self,
        conn: &mut PgConnection,
        id: i64,
        name: &str,
        session: &str,
        skip_shared: bool,
        count: i32,
    ) -> DbResult<Option<Vec<Row>>> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.earlier)))
            .bind(id)
            .bind(name)
            .bind(session)
            .bind(skip_shared)
            .bind(count)
            .fetch_all(conn)
            .await?;
        let mut found = rows(found)?.into_iter();
        Ok(found.next().map(|_mine| found.collect()))
    }

    async fn list(&self, conn: &mut PgConnection, name: &str, session: &str) -> DbResult<Vec<Row>> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.list)))
            .bind(name)
            .bind(session)
            .fetch_all(conn)
            .await?;
        rows(found)
    }

    async fn remove(&self, conn: &mut PgConnection, id: i64, session: &str, unlock: bool) -> DbResult<bool> {
        if unlock {
            // Our own: the deletion commits before the guard is let go of.
            let removed: Option<bool> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.release)))
                .bind(id)
                .bind(session)
                .fetch_one(conn)
                .await?;
            return Ok(removed == Some(true));
        }
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.remove)))
            .bind(id)
            .bind(session)
            .bind(unlock)
            .fetch_one(conn)
            .await
    }

    async fn abandon(&self, conn: &mut PgConnection, attempt: &str, session: &str) -> DbResult<Option<i64>> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.abandon)))
            .bind(attempt)
            .bind(session)
            .fetch_one(conn)
            .await
    }

    async fn wait(&self, conn: &mut PgConnection, id: i64, owner: &str, bound_ms: i64) -> DbResult<Waited> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.wait)))
            .bind(id)
            .bind(owner)
            .bind(bound_ms)
            .fetch_one(conn)
            .await?;
        waited(&row)
    }

    async fn wait_turn(
        &self,
        conn: &mut PgConnection,
        id: i64,
        owner: &str,
        bound_ms: i64,
        turn: &Turn,
    ) -> DbResult<(Waited, Option<TurnRead>)> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.wait_turn)))
            .bind(id)
            .bind(owner)
            .bind(bound_ms)
            .bind(turn.id)
            .bind(&turn.name)
            .bind(&turn.session)
            .bind(turn.skip_shared)
            .bind(turn.count)
            .fetch_all(conn)
            .await?;
        let mut found = found.iter();
        let first = found.next().ok_or_else(|| shape("the wait returned no row"))?;
        let waited = waited(first)?;
        let read: Option<bool> = first.try_get(3)?;
        if matches!(waited, Waited::TimedOut(_)) || read != Some(true) {
            return Ok((waited, None));
        }
        let rows = found
            .map(|r| {
                Ok(Row {
                    id: r.try_get(4)?,
                    kind: r.try_get(5)?,
                    session: r.try_get(6)?,
                })
            })
            .collect::<DbResult<Vec<Row>>>()?;
        // As `earlier` answers: the waiter's own entry first, or no row at
        // all when it is gone.
        let mut rows = rows.into_iter();
        Ok((waited, Some(rows.next().map(|_mine| rows.collect()))))
    }

    async fn wait_version(
        &self,
        conn: &mut PgConnection,
        id: i64,
        version: i64,
        owner: &str,
        bound_ms: i64,
    ) -> DbResult<Waited> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.wait_version)))
            .bind(id)
            .bind(version)
            .bind(owner)
            .bind(bound_ms)
            .fetch_one(conn)
            .await?;
        waited(&row)
    }

    async fn reap(&self, conn: &mut PgConnection, owner: &str, id: i64, beat: i64) -> DbResult<Reaped> {
        let code: i32 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.reap)))
            .bind(owner)
            .bind(id)
            .bind(beat)
            .fetch_one(conn)
            .await?;
        match code {
            0 => Ok(Reaped::Gone),
            1 => Ok(Reaped::Renewed),
            2 => Ok(Reaped::Ended),
            other => Err(shape(format!("reap returned {other}"))),
        }
    }

    async fn beat_of(&self, conn: &mut PgConnection, owner: &str) -> DbResult<Option<Beat>> {
        let found: Option<(i64, i64)> = sqlx::query_as(AssertSqlSafe(Arc::clone(&self.names()?.sql.beat_of)))
            .bind(owner)
            .fetch_optional(conn)
            .await?;
        Ok(found.map(|(count, ttl_ms)| Beat { count, ttl_ms }))
    }

    async fn ping(&self, conn: &mut PgConnection) -> DbResult<()> {
        conn.execute("SELECT 1").await.map(drop)
    }

    async fn cancel(&self, conn: &mut PgConnection, server_id: i64) -> DbResult<()> {
        let pid = i32::try_from(server_id).map_err(|_| shape(format!("pid {server_id} out of range")))?;
        sqlx::query("SELECT pg_cancel_backend($1)")
            .bind(pid)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn reset(&self, conn: &mut PgConnection) -> DbResult<()> {
        sqlx::query("SELECT pg_advisory_unlock_all()").execute(conn).await?;
        Ok(())
    }

    async fn set_value(&self, conn: &mut PgConnection, id: i64, session: &str, value: &[u8]) -> DbResult<bool> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.set_value)))
            .bind(id)
            .bind(session)
            .bind(value)
            .fetch_one(conn)
            .await
    }

    async fn get_value(&self, conn: &mut PgConnection, id: i64, session: &str) -> DbResult<Option<(Vec<u8>, i64)>> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.get_value)))
            .bind(id)
            .bind(session)
            .fetch_optional(conn)
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }

    async fn write_if_held(&self, conn: &mut PgConnection, id: i64, session: &str, writes: &[Write]) -> DbResult<bool> {
        let keys: Vec<&str> = writes.iter().map(Write::key).collect();
        let values: Vec<&[u8]> = writes
            .iter()
            .map(|w| match w {
                Write::Put { value, .. } => value.as_slice(),
                _ => &[][..],
            })
            .collect();
        let deletes: Vec<bool> = writes.iter().map(|w| !matches!(w, Write::Put { .. })).collect();
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.write)))
            .bind(id)
            .bind(session)
            .bind(keys)
            .bind(values)
            .bind(deletes)
            .fetch_one(conn)
            .await
    }

    async fn read(&self, conn: &mut PgConnection, key: &str) -> DbResult<Option<Vec<u8>>> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.read)))
            .bind(key)
            .fetch_optional(conn)
            .await
    }

    async fn end(&self, conn: &mut PgConnection, session: &str, owner_server_id: i64) -> DbResult<bool> {
        let pid = i32::try_from(owner_server_id).map_err(|_| shape(format!("pid {owner_server_id} out of range")))?;
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.end)))
            .bind(session)
            .bind(pid)
            .fetch_one(conn)
            .await
    }

    async fn close(&self, conn: &mut PgConnection, session: &str) -> DbResult<()> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.close)))
            .bind(session)
            .execute(conn)
            .await?;
        Ok(())
    }
    async fn read_queue(
        &self,
        conn: &mut PgConnection,
        name: &str,
        session: &str,
    ) -> DbResult<(Vec<QueueRow>, Option<Vec<u8>>)> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.read_queue)))
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

    async fn update_queue(&self, conn: &mut PgConnection, change: &QueueChange<'_>) -> DbResult<Option<i64>> {
        let ids: Vec<i64> = change.named.iter().map(|n| n.id).collect();
        let versions: Vec<i64> = change.named.iter().map(|n| n.condition.code()).collect();
        let writes: Vec<bool> = change.named.iter().map(|n| n.writes).collect();
        let set_ids: Vec<i64> = change.set.iter().map(|(id, _)| *id).collect();
        let set_values: Vec<&[u8]> = change.set.iter().map(|(_, value)| *value).collect();
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.update_queue)))
            .bind(change.name)
            .bind(change.session)
            .bind(ids)
            .bind(versions)
            .bind(writes)
            .bind(set_ids)
            .bind(set_values)
            .bind(&change.delete)
            .bind(change.block)
            .fetch_one(conn)
            .await
    }

    async fn watch_read(&self, conn: &mut PgConnection, id: i64, session: &str) -> DbResult<Found> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.watch_read)))
            .bind(id)
            .bind(session)
            .fetch_optional(conn)
            .await?;
        row.map(|r| {
            let watched = Watched {
                value: r.try_get(0)?,
                version: r.try_get(1)?,
                epoch: r.try_get(2)?,
            };
            Ok((watched, r.try_get(3)?))
        })
        .transpose()
    }

    async fn wait_watch(
        &self,
        conn: &mut PgConnection,
        id: i64,
        at: Watched<()>,
        session: &str,
        owner: &str,
        bound_ms: i64,
    ) -> DbResult<(Waited, Option<Found>)> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.watch)))
            .bind(id)
            .bind(at.epoch)
            .bind(at.version)
            .bind(session)
            .bind(owner)
            .bind(bound_ms)
            .fetch_one(conn)
            .await?;
        let waited = waited(&row)?;
        let read: Option<bool> = row.try_get(3)?;
        if read != Some(true) {
            return Ok((waited, None));
        }
        let value: Option<Vec<u8>> = row.try_get(4)?;
        let found = match value {
            None => None,
            Some(value) => {
                let watched = Watched {
                    value,
                    version: row.try_get::<Option<i64>, _>(5)?.unwrap_or_default(),
                    epoch: row.try_get::<Option<i64>, _>(6)?.unwrap_or_default(),
                };
                Some((watched, row.try_get::<Option<bool>, _>(7)?.unwrap_or(false)))
            }
        };
        Ok((waited, Some(found)))
    }

    fn notifies(&self) -> bool {
        true
    }

    async fn listener(&self) -> DbResult<Option<Box<dyn Listener>>> {
        let channel = self.names()?.channel.clone();
        let (options, set) = self.connect_options(Purpose::Control);
        // Told apart from the session's other connections in
        // pg_stat_activity.
        let options = options.application_name("lockline notices");
        let set: Arc<str> = set.into();
        // A pool of one connection, which the driver's listener needs to
        // connect again after a loss (re-listening to every channel).
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(self.settings.request_timeout)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                let set = Arc::clone(&set);
                Box::pin(async move {
                    sqlx::query(AssertSqlSafe(set)).execute(conn).await?;
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        let listener = PgListener::connect_with(&pool).await?;
        Ok(Some(Box::new(EntryListener {
            listener,
            channel,
            pool,
        })))
    }
}

/// Notifications of writes to lock-mode entries by sessions that do not
/// own them: `LISTEN` on each watched entry's channel.
struct EntryListener {
    listener: PgListener,
    channel: String,
    pool: PgPool,
}

impl std::fmt::Debug for EntryListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryListener")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Drop for EntryListener {
    fn drop(&mut self) {
        // Closes the connection once the listener lets go of it.
        let pool = self.pool.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { pool.close().await });
        }
    }
}

#[async_trait]
impl Listener for EntryListener {
    async fn listen(&mut self, id: i64) -> DbResult<()> {
        self.listener.listen(&format!("{}{id}", self.channel)).await
    }

    async fn unlisten(&mut self, id: i64) -> DbResult<()> {
        self.listener.unlisten(&format!("{}{id}", self.channel)).await
    }

    async fn recv(&mut self) -> DbResult<Option<i64>> {
        loop {
            let Some(notification) = self.listener.try_recv().await? else {
                return Ok(None);
            };
            let id = notification
                .channel()
                .strip_prefix(self.channel.as_str())
                .and_then(|id| id.parse().ok());
            if let Some(id) = id {
                return Ok(Some(id));
            }
        }
    }

    async fn ping(&mut self) -> DbResult<()> {
        sqlx::query("SELECT 1").execute(&mut self.listener).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_of_this_layout() {
        let script = ddl::without_notes(SCRIPT);
        assert!(script.starts_with(&format!("-- lockline's tables and functions (layout {LAYOUT_VERSION})")));
        assert!(script.contains(&format!("(layout) VALUES ({LAYOUT_VERSION}) ON CONFLICT DO NOTHING;")));
    }

    #[test]
    fn the_script_is_written_for_the_default_names() {
        let keys = Keys::new(SCRIPT_SCHEMA, DEFAULT_PREFIX);
        for name in [
            format!("\"{SCRIPT_SCHEMA}\".\"{DEFAULT_PREFIX}entries\""),
            format!("# {}", keys.salt),
            format!("pg_advisory_xact_lock({}, ", keys.class),
            format!("pg_notify('{}' || ", keys.channel),
        ] {
            assert!(SCRIPT.contains(&name), "the script has no {name}");
        }
        assert_eq!(
            Names::new(SCRIPT_SCHEMA, DEFAULT_PREFIX).ddl(),
            ddl::without_notes(SCRIPT)
        );
    }

    #[test]
    fn every_name_of_the_script_is_replaced() {
        let names = Names::new("app", "p_");
        let made = names.ddl();
        let script = Keys::new(SCRIPT_SCHEMA, DEFAULT_PREFIX);
        let keys = Keys::new("app", "p_");
        for gone in [
            "\"public\"".to_owned(),
            DEFAULT_PREFIX.to_owned(),
            script.salt.to_string(),
            script.class.to_string(),
            script.channel.clone(),
        ] {
            assert!(!made.contains(&gone), "{gone} is left in the script");
        }
        let count = |text: &str, name: &str| text.matches(name).count();
        let source = ddl::without_notes(SCRIPT);
        assert_eq!(
            count(&made, "\"app\".\"p_"),
            count(source, &format!("\"{SCRIPT_SCHEMA}\".\"{DEFAULT_PREFIX}"))
        );
        assert_eq!(
            count(&made, &format!("# {}", keys.salt)),
            count(source, &format!("# {}", script.salt))
        );
        assert_eq!(count(&made, &keys.channel), count(source, &script.channel));
    }

    #[test]
    fn the_functions_of_a_move_are_taken_whole() {
        let moved = Names::new("app", "p_").upgrade_ddl().expect("the functions");
        for function in ["fence", "wait_turn", "release"] {
            assert_eq!(
                moved.matches(&format!("\"app\".\"p_{function}\"(")).count(),
                1,
                "{moved}"
            );
        }
        assert_eq!(moved.matches("CREATE OR REPLACE").count(), 3, "{moved}");
        assert_eq!(moved.matches("$fn$;").count(), 3, "{moved}");
        assert!(moved.starts_with("-- The fence of a transaction"), "{moved}");
        assert!(moved.ends_with("$fn$;\n"), "{moved}");
    }
}
