//! PostgreSQL: entries in an unlogged table, guards as session-level
//! advisory locks of the owning connection, every step one function call
//! of the functions `ddl/postgres.sql` creates.

mod connect;
mod ddl;
mod entries;
mod listener;
mod liveness;
mod modes;
mod tables;
mod values;
mod waits;

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use lockline::Error;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, ConnectOptions, Executor};

use crate::dialect::{shape, DbResult, Engine, Purpose};
use crate::layout::{fnv64, Tables, DLM};
use crate::Settings;

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
    grace: Arc<str>,
    end_grace: Arc<str>,
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
            grace: format!(
                "SELECT grace_ms, (extract(epoch FROM grace_from) * 1000000)::bigint FROM {meta} WHERE grace_ms > 0"
            )
            .into(),
            end_grace: format!(
                "UPDATE {meta} SET grace_ms = 0 WHERE grace_ms > 0 \
                 AND coalesce((extract(epoch FROM grace_from) * 1000000)::bigint, 0) = $1"
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
                "SELECT NULL::bigint, NULL::text, NULL::text, b.value, NULL::bigint, NULL::bigint, NULL::bigint \
                 FROM {blocks} b WHERE b.name = $1 \
                 UNION ALL \
                 SELECT e.id, e.kind, e.session, CASE WHEN e.kind = '{DLM}' THEN e.value ELSE '\\x'::bytea END, \
                 e.version, greatest(e.changed, e.id), e.epoch FROM {entries} e WHERE e.name = $1 AND {live} \
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
            (None, "") => ddl::SCRIPT_SCHEMA.to_owned(),
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
}

#[async_trait]
impl Engine for Postgres {
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

    async fn prepare(&self, conn: &mut PgConnection) -> lockline::Result<()> {
        self.prepare_tables(conn).await
    }
}
