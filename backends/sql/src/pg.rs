//! PostgreSQL: entries in an unlogged table, guards as session-level
//! advisory locks of the owning connection, every step one function call.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use lockline::{Error, Write};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, Row as _};

use crate::dialect::{
    shape, Append, Beat, DbResult, Dialect, EntryStatus, Found, Grace, Listener, Purpose, QueueChange, QueueRow,
    Reaped, Row, Status, Turn, TurnRead, Waited, Watched,
};
use crate::error::{has_code, Doing};
use crate::layout::{fnv64, movable, Tables, DLM, LAYOUT_VERSION, MOVABLE_LAYOUTS};
use crate::Settings;

/// The database's clock in microseconds since the epoch.
const NOW_US: &str = "(extract(epoch from clock_timestamp()) * 1000000)::bigint";

/// What a statement says when two of lockline's connections turn out to be
/// one server backend (SQLSTATE `LL001`).
pub(crate) const POOLED: &str = "two connections of lockline share one server backend: a transaction-pooling proxy \
     (PgBouncer pool_mode=transaction or statement) is in front of the database; the locks of lockline belong to a \
     connection, so it needs a direct connection or a session-mode pool";

/// The names and statements of one set of tables, once its schema is known.
#[derive(Debug)]
struct Names {
    schema: String,
    entries: String,
    sessions: String,
    meta: String,
    data: String,
    blocks: String,
    /// `ll<hash>_`: the start of the notification channel of each entry
    /// (`ll<hash>_<id>`), kept apart per table set.
    channel: String,
    /// `"schema".prefix` for functions: `{functions}append`.
    functions: String,
    /// XORed into an entry's id to make its guard's advisory-lock key
    /// (`bigint` space): keeps keys of two table sets apart and away from
    /// the small numbers applications lock.
    salt: i64,
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

impl Names {
    fn new(schema: &str, prefix: &str) -> Self {
        let q = quote(schema);
        let table = |t: &str| format!("{q}.{}", quote(&format!("{prefix}{t}")));
        let hash = fnv64(&format!("postgres/{schema}.{prefix}"));
        // Bits 53..62: ids stay below 2^53 (microseconds until the year
        // 2255), so keys of two sets differ unless these ten bits match.
        let mut salt = (hash & 0x7fe0_0000_0000_0000) as i64;
        if salt == 0 {
            salt = 1 << 53;
        }
        let class = (hash >> 32) as u32 as i32;
        let entries = table("entries");
        let sessions = table("sessions");
        let meta = table("meta");
        let data = table("data");
        let blocks = table("blocks");
        let channel = format!("ll{:012x}_", hash >> 16);
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
            entries,
            sessions,
            meta,
            data,
            blocks,
            channel,
            functions,
            salt,
            class,
            sql,
        }
    }

    fn function(&self, name: &str) -> String {
        format!("{}{name}\"", self.functions)
    }

    /// The fence function (layout 4): created with the rest by [`ddl`](Self::ddl),
    /// and alone when layout 3 tables are moved to layout 4.
    fn fence_ddl(&self) -> String {
        let (entries, salt, fence) = (&self.entries, self.salt, self.function("fence"));
        format!(
            r#"-- The fence of a transaction on the application's own tables that must commit
-- only while a lock is held, from any driver: call it in that transaction with
-- the lock's key (NAME/ID, as Guard::key and the CLI's LOCKLINE_KEY give it),
-- last before COMMIT, from any connection but the lock session's own. It locks
-- the holder's entry row in share mode until the transaction ends, then checks
-- that the entry's guard is still held. A reaper or the next holder deletes
-- that row before going past it, and so waits for this transaction to end: the
-- check and the commit are one step. Answers the entry's id (the holder's
-- fencing token; a lock-mode holder's may have moved past it). Not held (the
-- entry is gone, or its guard is free): SQLSTATE LL002; not an entry key:
-- 22023. Either error aborts the transaction. Nothing in it is resolved
-- through the caller's search_path (a schema of the caller's own before
-- pg_catalog, with a look-alike of a function it calls, must not make a lost
-- lock pass). A lock lost before the call is refused before the row is
-- locked, whatever the isolation level (under REPEATABLE READ or SERIALIZABLE
-- the row lock of an entry deleted after the transaction's snapshot fails
-- with 40001 instead); one lost while the call locks the row may still be
-- 40001, which aborts the transaction as well.
CREATE OR REPLACE FUNCTION {fence}(p_key text)
RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_name text := substring(p_key from '^(.+)/[1-9][0-9]*$');
    v_digits text := substring(p_key from '/([1-9][0-9]*)$');
    v_id bigint;
BEGIN
    IF v_name IS NULL OR length(v_digits) > 19 OR v_digits::numeric > 9223372036854775807 THEN
        RAISE EXCEPTION 'lockline: % is not the key of a lock entry (NAME/ID)', quote_literal(p_key)
            USING ERRCODE = '22023';
    END IF;
    v_id := v_digits::bigint;
    IF NOT pg_try_advisory_xact_lock_shared(v_id # {salt}) THEN
        PERFORM 1 FROM {entries} e WHERE e.id = v_id AND e.name = v_name FOR SHARE OF e;
        IF FOUND AND NOT pg_try_advisory_xact_lock_shared(v_id # {salt}) THEN
            RETURN v_id;
        END IF;
    END IF;
    RAISE EXCEPTION 'lockline: the lock % is not held', quote_literal(p_key) USING ERRCODE = 'LL002',
        HINT = 'Its holder lost it (its session ended or was ended) or released it: nothing this transaction wrote may commit.';
END
$fn$;
"#
        )
    }

    /// The wait that reads the waiter's turn and the release that commits
    /// before it lets go of the guard (layout 5): created with the rest by
    /// [`ddl`](Self::ddl), and alone (with the fence) when layout 3 or 4
    /// tables are moved to layout 5.
    fn turn_ddl(&self) -> String {
        let (salt, wait, earlier, wait_turn, release, entries) = (
            self.salt,
            self.function("wait"),
            self.function("earlier"),
            self.function("wait_turn"),
            self.function("release"),
            &self.entries,
        );
        format!(
            r#"-- Waits as {wait} does on the guard of entry p_entry (of session
-- p_owner), then, unless the bound ran out, reads in the same call what the
-- waiter's own entry p_id reads after a wake, as {earlier} does: a handoff
-- is the releaser's statement and this call's answer, no read after it. The
-- wait's row first (e_id NULL; w_read false when the read was not made: a dead
-- entry's row held past the bound by a fenced commit in flight, which the
-- caller then reads on its own), then the rows of {earlier}.
CREATE OR REPLACE FUNCTION {wait_turn}(p_entry bigint, p_owner text, p_bound_ms bigint, p_id bigint, p_name text,
    p_session text, p_skip_shared boolean, p_count integer)
RETURNS TABLE (w_code integer, w_beat bigint, w_ttl_ms bigint, w_read boolean, e_id bigint, e_kind text,
    e_session text) LANGUAGE plpgsql AS $fn$
DECLARE
    v_ids bigint[];
    v_kinds text[];
    v_sessions text[];
BEGIN
    SELECT x.w_code, x.w_beat, x.w_ttl_ms INTO w_code, w_beat, w_ttl_ms
      FROM {wait}(p_entry # {salt}, p_owner, p_bound_ms, p_entry) x;
    w_read := false;
    IF w_code <> 1 THEN
        -- Bounded as the wait was (its lock_timeout holds to the end of
        -- this call).
        BEGIN
            SELECT array_agg(r.e_id ORDER BY r.n), array_agg(r.e_kind ORDER BY r.n), array_agg(r.e_session ORDER BY r.n)
              INTO v_ids, v_kinds, v_sessions
              FROM {earlier}(p_id, p_name, p_session, p_skip_shared, p_count) WITH ORDINALITY AS r(e_id, e_kind, e_session, n);
            w_read := true;
        EXCEPTION WHEN lock_not_available THEN
            w_read := false;
        END;
    END IF;
    RETURN NEXT;
    FOR i IN 1 .. coalesce(cardinality(v_ids), 0) LOOP
        e_id := v_ids[i]; e_kind := v_kinds[i]; e_session := v_sessions[i];
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- A holder's release, called on the owning connection in a transaction of its
-- own: deletes entry p_id of p_session and commits, then lets go of its guard
-- (and value lock), so the waiter woken by the guard finds the row gone at
-- once instead of waiting again for the deletion's commit. r_removed: whether
-- it deleted it.
CREATE OR REPLACE PROCEDURE {release}(p_id bigint, p_session text, INOUT r_removed boolean DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_kind text;
    v_version bigint;
BEGIN
    DELETE FROM {entries} e WHERE e.id = p_id AND e.session = p_session RETURNING e.kind, e.epoch INTO v_kind, v_version;
    COMMIT;
    PERFORM pg_advisory_unlock(p_id # {salt});
    IF v_kind IN ('election', '{DLM}') THEN
        PERFORM pg_advisory_unlock(hashtextextended(p_id::text || ':' || v_version::text, {salt}));
    END IF;
    r_removed := v_kind IS NOT NULL;
END
$fn$;
"#
        )
    }

    /// The tables and functions, as a script a DBA can run.
    fn ddl(&self) -> String {
        let Names {
            entries,
            sessions,
            meta,
            data,
            blocks,
            channel,
            salt,
            class,
            ..
        } = self;
        let f = |name: &str| self.function(name);
        let end = f("end");
        let (update_queue, watch) = (f("update_queue"), f("watch"));
        let fence_function = self.fence_ddl();
        let turn_function = self.turn_ddl();
        let (append, nearest, earlier, remove, abandon, wait, reap, set_value, write, close, open) = (
            f("append"),
            f("nearest"),
            f("earlier"),
            f("remove"),
            f("abandon"),
            f("wait"),
            f("reap"),
            f("set_value"),
            f("write"),
            f("close"),
            f("open"),
        );
        let entries_text = entries.replace('\'', "''");
        // Whether entry e is live, for a function that has the caller's
        // session in p_session.
        let live_in = format!(
            "(e.session = p_session OR NOT pg_try_advisory_xact_lock_shared(e.id # {salt}) \
             OR (coalesce(current_setting('lockline.reset_grace', true), '') = 'on' \
                 AND EXISTS (SELECT 1 FROM {sessions} s WHERE s.id = e.session)))"
        );
        let prefix = entries.rsplit_once('.').map_or("", |(_, t)| t).trim_matches('"');
        let prefix = prefix.strip_suffix("entries").unwrap_or(prefix);
        let schema = quote(&self.schema);
        let version = LAYOUT_VERSION;
        format!(
            r#"-- lockline's tables and functions (layout {version}), for PostgreSQL 14 or later.
-- Entries and sessions die with their owners' connections, so they are UNLOGGED:
-- an acquire or a release writes no WAL and waits for no disk flush. The fencing
-- token (an entry's id) never repeats: the first session opened after each server
-- start or crash recovery moves the id counter past the server's clock in microseconds.
CREATE TABLE IF NOT EXISTS {meta} (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    layout integer NOT NULL,
    started_at timestamptz,
    -- The longest TTL of a session opened since the server started.
    run_max_ttl_ms bigint NOT NULL DEFAULT 0,
    -- After a restart: no grant for grace_ms (by each session's own clock)
    -- until a session that waited it out sets it to 0; grace_from names it.
    grace_ms bigint NOT NULL DEFAULT 0,
    grace_from timestamptz
);
INSERT INTO {meta} (layout) VALUES ({version}) ON CONFLICT DO NOTHING;
CREATE UNLOGGED TABLE IF NOT EXISTS {entries} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    kind text NOT NULL,
    session text NOT NULL,
    attempt text NOT NULL,
    value bytea NOT NULL DEFAULT '\x',
    version bigint NOT NULL DEFAULT 0,
    -- The version of the value lock its owner holds (election and lock-mode
    -- entries): raised by its owner's own writes only, so equal to version
    -- unless another session wrote it.
    epoch bigint NOT NULL DEFAULT 0,
    -- A lock-mode entry: the token of its last write by {prefix}update_queue
    -- (0: none yet).
    changed bigint NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS "{prefix}entries_attempt" ON {entries} (attempt);
CREATE INDEX IF NOT EXISTS "{prefix}entries_name" ON {entries} (name, id);
CREATE INDEX IF NOT EXISTS "{prefix}entries_session" ON {entries} (session);
CREATE UNLOGGED TABLE IF NOT EXISTS {sessions} (
    id text PRIMARY KEY,
    pid integer NOT NULL,
    ttl_ms bigint NOT NULL,
    renewed_us bigint NOT NULL,
    backend_start timestamptz,
    beat bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS {data} (
    key text PRIMARY KEY,
    value bytea NOT NULL
);
-- The lock value block of each lock-mode resource (by its name) that was
-- given one. Logged, as the data table: it outlives its holders and restarts.
CREATE TABLE IF NOT EXISTS {blocks} (
    name text PRIMARY KEY,
    value bytea NOT NULL
);

-- The nearest live entries before p_id under p_name (read locks pass over
-- shared ones), nearest first. An entry whose guard is free is dead (released,
-- or its owner's connection ended): it is deleted before anyone goes past it,
-- which waits for a fenced commit of its holder still in flight.
CREATE OR REPLACE FUNCTION {nearest}(p_id bigint, p_name text, p_session text, p_skip_shared boolean, p_count integer)
RETURNS TABLE (e_id bigint, e_kind text, e_session text) LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
    n integer := 0;
BEGIN
    IF p_count <= 0 THEN RETURN; END IF;
    FOR r IN SELECT e.id, e.kind, e.session FROM {entries} e
             WHERE e.name = p_name AND e.id < p_id ORDER BY e.id DESC LOOP
        IF r.session <> p_session AND pg_try_advisory_xact_lock_shared(r.id # {salt}) THEN
            -- Free to this backend: dead, unless this very backend is its
            -- owner's, as behind a transaction-pooling proxy.
            IF EXISTS (SELECT 1 FROM {sessions} s WHERE s.id = r.session AND s.pid = pg_backend_pid()) THEN
                RAISE EXCEPTION '{POOLED}' USING ERRCODE = 'LL001';
            END IF;
            -- With the reset grace (Sql::with_reset_grace), a dead entry whose
            -- session is still there blocks like a live one: its owner may be
            -- alive with its connection reset, not told yet.
            IF coalesce(current_setting('lockline.reset_grace', true), '') <> 'on'
               OR NOT EXISTS (SELECT 1 FROM {sessions} s WHERE s.id = r.session) THEN
                DELETE FROM {entries} e WHERE e.id = r.id;
                CONTINUE;
            END IF;
        END IF;
        IF p_skip_shared AND r.kind = 'read' THEN CONTINUE; END IF;
        e_id := r.id; e_kind := r.kind; e_session := r.session;
        RETURN NEXT;
        n := n + 1;
        EXIT WHEN n >= p_count;
    END LOOP;
END
$fn$;

-- Appends an entry (or finds the one this attempt appended before), takes its
-- guard, and returns it followed by the nearest earlier live entries. Appends to
-- one name are serialized, so ids under a name become visible in their order.
CREATE OR REPLACE FUNCTION {append}(p_name text, p_kind text, p_session text, p_attempt text, p_value bytea, p_skip_shared boolean, p_count integer)
RETURNS TABLE (e_id bigint, e_kind text, e_session text) LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock({class}, hashtext(p_name));
    SELECT e.id INTO v_id FROM {entries} e WHERE e.attempt = p_attempt AND e.session = p_session;
    IF v_id IS NOT NULL THEN
        -- A retry: the entry and its guard are there already.
        e_id := v_id; e_kind := p_kind; e_session := p_session;
        RETURN NEXT;
        RETURN QUERY SELECT * FROM {nearest}(v_id, p_name, p_session, p_skip_shared, p_count);
        RETURN;
    END IF;
    INSERT INTO {entries} (name, kind, session, attempt, value)
    VALUES (p_name, p_kind, p_session, p_attempt, p_value) RETURNING id INTO v_id;
    e_id := v_id; e_kind := p_kind; e_session := p_session;
    RETURN NEXT;
    RETURN QUERY SELECT * FROM {nearest}(v_id, p_name, p_session, p_skip_shared, p_count);
    -- The guard last, still before the entry is visible (at commit): a step
    -- that fails before it leaves no session-level lock behind (a rolled
    -- back transaction does not let go of one).
    IF NOT pg_try_advisory_lock(v_id # {salt}) THEN
        RAISE EXCEPTION 'the guard (advisory lock %) of entry % is held by another connection', v_id # {salt}, v_id
            USING ERRCODE = '55P03';
    END IF;
    IF p_kind IN ('election', '{DLM}') AND NOT pg_try_advisory_lock(hashtextextended(v_id::text || ':0', {salt})) THEN
        PERFORM pg_advisory_unlock(v_id # {salt});
        RAISE EXCEPTION 'the value lock of entry % is held by another connection', v_id USING ERRCODE = '55P03';
    END IF;
END
$fn$;

-- p_id itself (an empty kind) and the nearest earlier live entries; no row at
-- all when p_id is gone.
CREATE OR REPLACE FUNCTION {earlier}(p_id bigint, p_name text, p_session text, p_skip_shared boolean, p_count integer)
RETURNS TABLE (e_id bigint, e_kind text, e_session text) LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {entries} e WHERE e.id = p_id) THEN RETURN; END IF;
    e_id := p_id; e_kind := ''; e_session := p_session;
    RETURN NEXT;
    RETURN QUERY SELECT * FROM {nearest}(p_id, p_name, p_session, p_skip_shared, p_count);
END
$fn$;

-- Deletes an entry of p_session; lets go of its guard when p_unlock (called on
-- the owning connection). A lock-mode entry removed by another session: its
-- watchers hear of it on its channel.
CREATE OR REPLACE FUNCTION {remove}(p_id bigint, p_session text, p_unlock boolean)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    v_kind text;
    v_version bigint;
BEGIN
    DELETE FROM {entries} e WHERE e.id = p_id AND e.session = p_session RETURNING e.kind, e.epoch INTO v_kind, v_version;
    IF p_unlock THEN
        PERFORM pg_advisory_unlock(p_id # {salt});
        IF v_kind IN ('election', '{DLM}') THEN
            PERFORM pg_advisory_unlock(hashtextextended(p_id::text || ':' || v_version::text, {salt}));
        END IF;
    ELSIF v_kind = '{DLM}' THEN
        PERFORM pg_notify('{channel}' || p_id::text, '');
    END IF;
    RETURN v_kind IS NOT NULL;
END
$fn$;

-- Deletes the entry an attempt appended, if any, and lets go of its guard.
CREATE OR REPLACE FUNCTION {abandon}(p_attempt text, p_session text)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
    v_kind text;
    v_version bigint;
BEGIN
    DELETE FROM {entries} e WHERE e.attempt = p_attempt AND e.session = p_session
    RETURNING e.id, e.kind, e.epoch INTO v_id, v_kind, v_version;
    IF v_id IS NOT NULL THEN
        PERFORM pg_advisory_unlock(v_id # {salt});
        IF v_kind IN ('election', '{DLM}') THEN
            PERFORM pg_advisory_unlock(hashtextextended(v_id::text || ':' || v_version::text, {salt}));
        END IF;
    END IF;
    RETURN v_id;
END
$fn$;

-- Waits until the advisory lock p_key is free, for at most p_bound_ms and a
-- third of the owner's TTL, whichever is less. w_code 0: free, released by its
-- owner; 3: free, lost with its owner's connection (p_entry, when given, still
-- there); 1: the bound ran out, with the owner's heartbeat (w_beat, w_ttl_ms;
-- NULL when its session row is gone) read then. No clock is read: the waiter
-- judges a silent owner by its own clock (a count that has not moved).
CREATE OR REPLACE FUNCTION {wait}(p_key bigint, p_owner text, p_bound_ms bigint, p_entry bigint)
RETURNS TABLE (w_code integer, w_beat bigint, w_ttl_ms bigint) LANGUAGE plpgsql AS $fn$
DECLARE
    v_ttl bigint;
    v_pid integer;
    v_bound bigint := p_bound_ms;
BEGIN
    SELECT s.ttl_ms, s.pid INTO v_ttl, v_pid FROM {sessions} s WHERE s.id = p_owner;
    IF FOUND THEN
        IF v_pid = pg_backend_pid() THEN
            RAISE EXCEPTION '{POOLED}' USING ERRCODE = 'LL001';
        END IF;
        v_bound := least(v_bound, v_ttl / 3);
    END IF;
    PERFORM set_config('lock_timeout', greatest(v_bound, 1)::text || 'ms', true);
    PERFORM pg_advisory_lock_shared(p_key);
    PERFORM pg_advisory_unlock_shared(p_key);
    -- Released (its owner deleted the row before letting go of the guard:
    -- the row lock waits for that delete to commit, or for a fenced commit
    -- of its holder still in flight) or lost (its connection ended with the
    -- row still there)?
    w_code := 0;
    IF p_entry IS NOT NULL THEN
        PERFORM 1 FROM {entries} e WHERE e.id = p_entry FOR UPDATE;
        IF FOUND THEN
            w_code := 3;
        END IF;
    END IF;
    RETURN NEXT;
EXCEPTION WHEN lock_not_available THEN
    SELECT s.beat, s.ttl_ms INTO w_beat, w_ttl_ms FROM {sessions} s WHERE s.id = p_owner;
    w_code := 1;
    RETURN NEXT;
END
$fn$;

-- Ends a session whose heartbeat count is still p_beat, which a waiter saw
-- unchanged for its TTL by the waiter's own clock: its owning connection is
-- terminated (if it is still there: its pid and its start time, or the guard
-- p_key the caller waited on that it holds; a pid used again is never taken
-- for it) and its rows are deleted. The session's row is locked first, so a
-- renewal either raised the count before (1: renewed) or finds the row gone
-- after and loses the session. 0: no such session; 2: ended.
CREATE OR REPLACE FUNCTION {reap}(p_owner text, p_key bigint, p_beat bigint)
RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
    s record;
BEGIN
    SELECT x.pid, x.beat, x.backend_start INTO s FROM {sessions} x WHERE x.id = p_owner FOR UPDATE;
    IF NOT FOUND THEN RETURN 0; END IF;
    IF s.beat <> p_beat THEN RETURN 1; END IF;
    -- Its connection, if still there: known by its pid and start time (seen
    -- only by the same database user), or by the guard it still holds
    -- (pg_locks shows every user's).
    IF EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid AND a.backend_start = s.backend_start)
       OR EXISTS (SELECT 1 FROM pg_locks l
                  WHERE l.locktype = 'advisory' AND l.pid = s.pid AND l.granted AND l.mode = 'ExclusiveLock'
                    AND l.objsubid = 1 AND l.classid = (p_key >> 32)::oid AND l.objid = (p_key & 4294967295)::oid
                    AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())) THEN
        PERFORM pg_terminate_backend(s.pid, 5000);
    END IF;
    DELETE FROM {entries} e
     WHERE e.id IN (SELECT x.id FROM {entries} x WHERE x.session = p_owner ORDER BY x.id FOR UPDATE);
    DELETE FROM {sessions} x WHERE x.id = p_owner;
    RETURN 2;
END
$fn$;

-- Replaces an election entry's value: takes the lock of the next version before
-- letting go of the current one, which wakes the value's watchers. (The value
-- lock follows epoch, which is the version unless another session wrote it.)
CREATE OR REPLACE FUNCTION {set_value}(p_id bigint, p_session text, p_value bytea)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    v_old bigint;
BEGIN
    SELECT e.epoch INTO v_old FROM {entries} e WHERE e.id = p_id AND e.session = p_session FOR UPDATE;
    IF NOT FOUND THEN RETURN false; END IF;
    UPDATE {entries} e SET value = p_value, version = e.version + 1, epoch = v_old + 1 WHERE e.id = p_id;
    PERFORM pg_advisory_lock(hashtextextended(p_id::text || ':' || (v_old + 1)::text, {salt}));
    PERFORM pg_advisory_unlock(hashtextextended(p_id::text || ':' || v_old::text, {salt}));
    RETURN true;
END
$fn$;

-- Applies fenced writes to the data table, only while p_session's entry p_id
-- exists (called on the owning connection, which holds its guard).
CREATE OR REPLACE FUNCTION {write}(p_id bigint, p_session text, p_keys text[], p_values bytea[], p_deletes boolean[])
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM 1 FROM {entries} e WHERE e.id = p_id AND e.session = p_session FOR SHARE;
    IF NOT FOUND THEN RETURN false; END IF;
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF p_deletes[i] THEN
            DELETE FROM {data} d WHERE d.key = p_keys[i];
        ELSE
            INSERT INTO {data} (key, value) VALUES (p_keys[i], p_values[i])
            ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
        END IF;
    END LOOP;
    RETURN true;
END
$fn$;

{fence_function}
{turn_function}
-- Applies a change of a lock-mode queue atomically, or nothing. p_ids are the
-- entries it names, ascending, once each; p_versions the version each must be
-- at (-1: none, only written; -2: any, but there); p_writes whether it sets
-- or deletes it.
-- Changes of one name take turns with its appends (the name's advisory lock),
-- and lock the named rows in id order (shared where only a version is
-- checked). A named entry missing, dead (its guard free) or at another
-- version: NULL. Otherwise dead entries of the name are deleted (which waits
-- for a fenced commit of theirs in flight), the values set (their version
-- raised, their changed set to the token), the entries deleted, the block
-- written if given, and the token returned: the next value of the entries'
-- id counter, which a restart moves past (see {open}). Watchers hear of each
-- write: the caller's own entries by their value lock (of epoch), moved (or let
-- go of with the entry) last, after every step that can fail; other sessions'
-- entries, whose value lock their owner holds, by a notification on the
-- entry's channel, sent at commit. An entry both set and deleted is deleted.
CREATE OR REPLACE FUNCTION {update_queue}(p_name text, p_session text, p_ids bigint[], p_versions bigint[],
    p_writes boolean[], p_set_ids bigint[], p_set_values bytea[], p_delete_ids bigint[], p_block bytea)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
    i integer;
    v_reset boolean := coalesce(current_setting('lockline.reset_grace', true), '') = 'on';
    v_conditions integer;
    v_met integer := 0;
    v_version bigint;
    v_own bigint[] := '{{}}';
    v_dead bigint[] := '{{}}';
    v_moved bigint[] := '{{}}';
    v_moved_to bigint[] := '{{}}';
    v_gone bigint[] := '{{}}';
    v_gone_at bigint[] := '{{}}';
    v_told bigint[] := '{{}}';
    v_token bigint;
BEGIN
    PERFORM pg_advisory_xact_lock({class}, hashtext(p_name));
    SELECT count(*) INTO v_conditions FROM unnest(p_versions) v WHERE v <> -1;
    FOR r IN SELECT e.id, e.session FROM {entries} e WHERE e.name = p_name ORDER BY e.id LOOP
        i := array_position(p_ids, r.id);
        IF i IS NULL THEN
            IF r.session <> p_session AND pg_try_advisory_xact_lock_shared(r.id # {salt})
               AND (NOT v_reset OR NOT EXISTS (SELECT 1 FROM {sessions} s WHERE s.id = r.session)) THEN
                v_dead := v_dead || r.id;
            END IF;
            CONTINUE;
        END IF;
        IF p_writes[i] THEN
            SELECT e.version INTO v_version FROM {entries} e WHERE e.id = r.id FOR UPDATE;
        ELSE
            SELECT e.version INTO v_version FROM {entries} e WHERE e.id = r.id FOR SHARE;
        END IF;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;
        IF r.session = p_session THEN
            v_own := v_own || r.id;
        END IF;
        IF p_versions[i] <> -1 THEN
            IF p_versions[i] >= 0 AND v_version <> p_versions[i] THEN
                RETURN NULL;
            END IF;
            IF r.session <> p_session AND pg_try_advisory_xact_lock_shared(r.id # {salt})
               AND (NOT v_reset OR NOT EXISTS (SELECT 1 FROM {sessions} s WHERE s.id = r.session)) THEN
                RETURN NULL;
            END IF;
            v_met := v_met + 1;
        END IF;
    END LOOP;
    IF v_met < v_conditions THEN
        RETURN NULL;
    END IF;
    IF cardinality(v_dead) > 0 THEN
        DELETE FROM {entries} e WHERE e.id = ANY(v_dead);
    END IF;
    v_token := nextval(pg_get_serial_sequence('{entries_text}', 'id'));
    FOR r IN UPDATE {entries} e SET value = x.value, version = e.version + 1, changed = v_token,
             epoch = e.epoch + (e.session = p_session)::integer
             FROM unnest(p_set_ids, p_set_values) AS x(id, value)
             WHERE e.id = x.id AND e.name = p_name AND e.id <> ALL(p_delete_ids) RETURNING e.id, e.epoch LOOP
        IF r.id = ANY(v_own) THEN
            v_moved := v_moved || r.id;
            v_moved_to := v_moved_to || r.epoch;
        ELSE
            v_told := v_told || r.id;
        END IF;
    END LOOP;
    FOR r IN DELETE FROM {entries} e WHERE e.id = ANY(p_delete_ids) AND e.name = p_name
             RETURNING e.id, e.epoch LOOP
        IF r.id = ANY(v_own) THEN
            v_gone := v_gone || r.id;
            v_gone_at := v_gone_at || r.epoch;
        ELSE
            v_told := v_told || r.id;
        END IF;
    END LOOP;
    IF p_block IS NOT NULL THEN
        INSERT INTO {blocks} AS b (name, value) VALUES (p_name, p_block)
        ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value WHERE b.value IS DISTINCT FROM EXCLUDED.value;
    END IF;
    FOR i IN 1 .. cardinality(v_told) LOOP
        PERFORM pg_notify('{channel}' || v_told[i]::text, '');
    END LOOP;
    FOR i IN 1 .. cardinality(v_moved) LOOP
        PERFORM pg_advisory_lock(hashtextextended(v_moved[i]::text || ':' || v_moved_to[i]::text, {salt}));
        PERFORM pg_advisory_unlock(hashtextextended(v_moved[i]::text || ':' || (v_moved_to[i] - 1)::text, {salt}));
    END LOOP;
    FOR i IN 1 .. cardinality(v_gone) LOOP
        PERFORM pg_advisory_unlock(v_gone[i] # {salt});
        PERFORM pg_advisory_unlock(hashtextextended(v_gone[i]::text || ':' || v_gone_at[i]::text, {salt}));
    END LOOP;
    RETURN v_token;
END
$fn$;

-- Waits until the lock-mode entry p_id is no longer at p_version: until its
-- owner lets go of its value lock of p_epoch (it wrote the entry, removed it,
-- or its connection ended), bounded as {wait}. w_code 0: moved on or gone; 3:
-- there with its guard free (lost with its owner's connection); 1: the bound
-- ran out, with the owner's heartbeat. Unless the bound ran out, the entry as
-- it is then (w_read; its value, version, epoch and whether it is live, or
-- NULLs when gone), so that the watcher need not read it again. Writes by
-- other sessions are told on the entry's channel instead.
CREATE OR REPLACE FUNCTION {watch}(p_id bigint, p_epoch bigint, p_version bigint, p_session text, p_owner text,
    p_bound_ms bigint)
RETURNS TABLE (w_code integer, w_beat bigint, w_ttl_ms bigint, w_read boolean, w_value bytea, w_version bigint,
    w_epoch bigint, w_live boolean) LANGUAGE plpgsql AS $fn$
BEGIN
    w_code := 0;
    IF EXISTS (SELECT 1 FROM {entries} e WHERE e.id = p_id AND e.version = p_version) THEN
        SELECT x.w_code, x.w_beat, x.w_ttl_ms INTO w_code, w_beat, w_ttl_ms
          FROM {wait}(hashtextextended(p_id::text || ':' || p_epoch::text, {salt}), p_owner, p_bound_ms, NULL) x;
    END IF;
    w_read := w_code = 0;
    IF w_read THEN
        -- A write or a removal of its owner's in flight lets go of the value
        -- lock before its commit: wait for that, then read.
        PERFORM set_config('lock_timeout', '0', true);
        SELECT e.value, e.version, e.epoch, {live_in} INTO w_value, w_version, w_epoch, w_live
          FROM {entries} e WHERE e.id = p_id FOR SHARE OF e;
        IF FOUND AND NOT w_live THEN
            w_code := 3;
        END IF;
    END IF;
    RETURN NEXT;
END
$fn$;

-- Deletes a session's entries (their rows locked in id order, as
-- {update_queue} locks the rows it names) and its row.
CREATE OR REPLACE FUNCTION {close}(p_session text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {entries} e
     WHERE e.id IN (SELECT x.id FROM {entries} x WHERE x.session = p_session ORDER BY x.id FOR UPDATE);
    DELETE FROM {sessions} s WHERE s.id = p_session;
END
$fn$;

-- Ends a lost session from another connection: its old owning connection is
-- terminated if it is still there (a connection the server still believes in,
-- behind a silent partition; its pid and start time), then its rows are
-- deleted. false when that connection would not end within 5 s.
CREATE OR REPLACE FUNCTION {end}(p_session text, p_pid integer)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM {sessions} s JOIN pg_stat_activity a
                 ON a.pid = s.pid AND a.backend_start = s.backend_start
               WHERE s.id = p_session AND s.pid = p_pid) THEN
        IF NOT pg_terminate_backend(p_pid, 5000) THEN
            RETURN false;
        END IF;
    END IF;
    DELETE FROM {entries} e
     WHERE e.id IN (SELECT x.id FROM {entries} x WHERE x.session = p_session ORDER BY x.id FOR UPDATE);
    DELETE FROM {sessions} s WHERE s.id = p_session;
    RETURN true;
END
$fn$;

-- Registers a session owned by the calling connection. The first session
-- opened after a server start moves the id counter past the server's clock in
-- microseconds, above every token handed out before (the counter of an
-- unlogged table restarts after a crash). So does the first one after the
-- postmaster reinitialized following a backend's crash (the OOM killer): that
-- keeps pg_postmaster_start_time() but empties unlogged tables and restarts
-- their counter, which has then handed nothing out (its last value is NULL).
-- A promoted standby is a server start too (its own start, not the one in the
-- replicated meta row), its counter empty.
-- Holders of the run before may not have heard lost() yet: a restart grace
-- begins at this first open, which comes after the start, the reinitialization
-- or the promotion (a standby may have started hours before it was promoted):
-- the longest TTL of a session opened in that run, or of a grace still in
-- force. Each session opened in it grants nothing for all of it, by its own
-- clock; one that waited it out ends it (grace_ms = 0). The answer is what is
-- left by this server's clock, which lockline no longer uses (a step of the
-- clock would shorten it).
CREATE OR REPLACE FUNCTION {open}(p_session text, p_ttl_ms bigint)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_started timestamptz := pg_postmaster_start_time();
    v_seen timestamptz;
    v_seq regclass := pg_get_serial_sequence('{entries_text}', 'id')::regclass;
    v_last bigint;
    v_unreadable boolean := false;
    v_left bigint;
BEGIN
    SELECT m.started_at INTO v_seen FROM {meta} m;
    BEGIN
        v_last := pg_sequence_last_value(v_seq);
    EXCEPTION WHEN internal_error THEN
        -- Looked at again below, with the meta row locked (this block's
        -- locks went with its failure: none is kept on the sequence).
        v_unreadable := true;
    END;
    IF v_seen IS DISTINCT FROM v_started OR v_last IS NULL THEN
        -- One mover at a time, holding this until its commit: see below.
        PERFORM pg_advisory_xact_lock({class}, 1);
        SELECT m.started_at INTO v_seen FROM {meta} m FOR UPDATE;
        IF v_unreadable THEN
            -- PostgreSQL 15 and later: an unlogged sequence created while a
            -- standby streamed is unreadable on that standby once promoted,
            -- until its next restartpoint (its init fork was replayed into
            -- memory only). Its identity is made again, past the clock, by
            -- the first session; those waiting for the meta row meanwhile
            -- find the new one.
            v_seq := pg_get_serial_sequence('{entries_text}', 'id')::regclass;
            BEGIN
                v_last := pg_sequence_last_value(v_seq);
                v_unreadable := false;
            EXCEPTION WHEN internal_error THEN
                IF SQLERRM NOT LIKE 'bad magic number in sequence%' THEN RAISE; END IF;
            END;
            IF v_unreadable THEN
                BEGIN
                    EXECUTE 'ALTER TABLE {entries} ALTER COLUMN id DROP IDENTITY';
                    EXECUTE format('ALTER TABLE {entries} ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)',
                                   {NOW_US});
                EXCEPTION WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'the id counter of {entries_text} cannot be read after a promotion (a PostgreSQL bug with unlogged sequences); as the table''s owner run: ALTER TABLE {entries_text} ALTER COLUMN id DROP IDENTITY, ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY, then grant USAGE, SELECT, UPDATE on its new sequence again'
                        USING ERRCODE = '42501';
                END;
                v_seq := pg_get_serial_sequence('{entries_text}', 'id')::regclass;
                v_last := NULL;
            END IF;
        END IF;
        IF v_seen IS DISTINCT FROM v_started OR pg_sequence_last_value(v_seq) IS NULL THEN
            PERFORM setval(v_seq, greatest(coalesce(pg_sequence_last_value(v_seq), 0), {NOW_US}));
            -- A grace still in force (a restart within it) is kept when
            -- longer: its holders may not have heard either.
            UPDATE {meta} SET started_at = v_started, grace_ms = greatest(grace_ms, run_max_ttl_ms),
                run_max_ttl_ms = 0, grace_from = clock_timestamp();
        END IF;
    ELSE
        -- A mover's setval shows at once, its grace only with its commit
        -- (which may wait for a synchronous standby): wait for that commit,
        -- so that no opener takes the moved counter for no restart and
        -- skips the grace.
        PERFORM pg_advisory_xact_lock_shared({class}, 1);
    END IF;
    UPDATE {meta} SET run_max_ttl_ms = p_ttl_ms WHERE run_max_ttl_ms < p_ttl_ms;
    -- Sessions of processes that died a minute or more past their TTL, whose
    -- connection is gone (their guards with it): their rows go.
    DELETE FROM {entries} e USING {sessions} s
     WHERE e.session = s.id AND s.renewed_us + s.ttl_ms * 1000 < {NOW_US} - 60000000
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid);
    DELETE FROM {sessions} s
     WHERE s.renewed_us + s.ttl_ms * 1000 < {NOW_US} - 60000000
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid);
    INSERT INTO {sessions} (id, pid, ttl_ms, renewed_us, backend_start)
    SELECT p_session, pg_backend_pid(), p_ttl_ms, {NOW_US}, a.backend_start
      FROM pg_stat_activity a WHERE a.pid = pg_backend_pid();
    SELECT greatest(0, m.grace_ms - (extract(epoch from clock_timestamp() - m.grace_from) * 1000)::bigint)
      INTO v_left FROM {meta} m;
    RETURN coalesce(v_left, 0);
END
$fn$;
-- (schema {schema})
"#
        )
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
        sqlx::raw_sql(AssertSqlSafe(format!("{}{}", names.fence_ddl(), names.turn_ddl())))
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
