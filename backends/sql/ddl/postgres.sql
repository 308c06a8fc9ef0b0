-- | lockline's PostgreSQL tables and functions, in schema public with the
-- | default table prefix lockline_: run it as it is (psql -f postgres.sql).
-- | Sql::ddl() prints it for another schema (Sql::with_schema) or table
-- | prefix (Sql::with_table_prefix). It is the one source of the layout:
-- | lockline runs this very script when it creates its tables on first use.
-- |
-- | For other names, lockline replaces these as they are written here:
-- | "public"; lockline_ at the start of a name; and what it derives from the
-- | schema and the prefix: the salt of the guards' advisory-lock keys
-- | (2026619832316723200), the class of its two-key advisory locks
-- | (472486338) and the start of the entries' notification channels
-- | (ll1c2991c2feb9_). When it moves tables of an older layout to this one,
-- | it runs the functions this layout added alone: each from the comment
-- | lines right above its CREATE to its closing $fn$; line.
-- | Lines that begin with "-- |", as these do, are left out of what
-- | lockline runs and prints.
-- lockline's tables and functions (layout 5), for PostgreSQL 14 or later.
-- Entries and sessions die with their owners' connections, so they are UNLOGGED:
-- an acquire or a release writes no WAL and waits for no disk flush. The fencing
-- token (an entry's id) never repeats: the first session opened after each server
-- start or crash recovery moves the id counter past the server's clock in microseconds.
CREATE TABLE IF NOT EXISTS "public"."lockline_meta" (
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
INSERT INTO "public"."lockline_meta" (layout) VALUES (5) ON CONFLICT DO NOTHING;
CREATE UNLOGGED TABLE IF NOT EXISTS "public"."lockline_entries" (
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
    -- A lock-mode entry: the token of its last write by lockline_update_queue
    -- (0: none yet).
    changed bigint NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS "lockline_entries_attempt" ON "public"."lockline_entries" (attempt);
CREATE INDEX IF NOT EXISTS "lockline_entries_name" ON "public"."lockline_entries" (name, id);
CREATE INDEX IF NOT EXISTS "lockline_entries_session" ON "public"."lockline_entries" (session);
CREATE UNLOGGED TABLE IF NOT EXISTS "public"."lockline_sessions" (
    id text PRIMARY KEY,
    pid integer NOT NULL,
    ttl_ms bigint NOT NULL,
    renewed_us bigint NOT NULL,
    backend_start timestamptz,
    beat bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS "public"."lockline_data" (
    key text PRIMARY KEY,
    value bytea NOT NULL
);
-- The lock value block of each lock-mode resource (by its name) that was
-- given one. Logged, as the data table: it outlives its holders and restarts.
CREATE TABLE IF NOT EXISTS "public"."lockline_blocks" (
    name text PRIMARY KEY,
    value bytea NOT NULL
);

-- The nearest live entries before p_id under p_name (read locks pass over
-- shared ones), nearest first. An entry whose guard is free is dead (released,
-- or its owner's connection ended): it is deleted before anyone goes past it,
-- which waits for a fenced commit of its holder still in flight.
CREATE OR REPLACE FUNCTION "public"."lockline_nearest"(p_id bigint, p_name text, p_session text, p_skip_shared boolean, p_count integer)
RETURNS TABLE (e_id bigint, e_kind text, e_session text) LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
    n integer := 0;
BEGIN
    IF p_count <= 0 THEN RETURN; END IF;
    FOR r IN SELECT e.id, e.kind, e.session FROM "public"."lockline_entries" e
             WHERE e.name = p_name AND e.id < p_id ORDER BY e.id DESC LOOP
        IF r.session <> p_session AND pg_try_advisory_xact_lock_shared(r.id # 2026619832316723200) THEN
            -- Free to this backend: dead, unless this very backend is its
            -- owner's, as behind a transaction-pooling proxy.
            IF EXISTS (SELECT 1 FROM "public"."lockline_sessions" s WHERE s.id = r.session AND s.pid = pg_backend_pid()) THEN
                RAISE EXCEPTION 'two connections of lockline share one server backend: a transaction-pooling proxy (PgBouncer pool_mode=transaction or statement) is in front of the database; the locks of lockline belong to a connection, so it needs a direct connection or a session-mode pool' USING ERRCODE = 'LL001';
            END IF;
            -- With the reset grace (Sql::with_reset_grace), a dead entry whose
            -- session is still there blocks like a live one: its owner may be
            -- alive with its connection reset, not told yet.
            IF coalesce(current_setting('lockline.reset_grace', true), '') <> 'on'
               OR NOT EXISTS (SELECT 1 FROM "public"."lockline_sessions" s WHERE s.id = r.session) THEN
                DELETE FROM "public"."lockline_entries" e WHERE e.id = r.id;
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
CREATE OR REPLACE FUNCTION "public"."lockline_append"(p_name text, p_kind text, p_session text, p_attempt text, p_value bytea, p_skip_shared boolean, p_count integer)
RETURNS TABLE (e_id bigint, e_kind text, e_session text) LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(472486338, hashtext(p_name));
    SELECT e.id INTO v_id FROM "public"."lockline_entries" e WHERE e.attempt = p_attempt AND e.session = p_session;
    IF v_id IS NOT NULL THEN
        -- A retry: the entry and its guard are there already.
        e_id := v_id; e_kind := p_kind; e_session := p_session;
        RETURN NEXT;
        RETURN QUERY SELECT * FROM "public"."lockline_nearest"(v_id, p_name, p_session, p_skip_shared, p_count);
        RETURN;
    END IF;
    INSERT INTO "public"."lockline_entries" (name, kind, session, attempt, value)
    VALUES (p_name, p_kind, p_session, p_attempt, p_value) RETURNING id INTO v_id;
    e_id := v_id; e_kind := p_kind; e_session := p_session;
    RETURN NEXT;
    RETURN QUERY SELECT * FROM "public"."lockline_nearest"(v_id, p_name, p_session, p_skip_shared, p_count);
    -- The guard last, still before the entry is visible (at commit): a step
    -- that fails before it leaves no session-level lock behind (a rolled
    -- back transaction does not let go of one).
    IF NOT pg_try_advisory_lock(v_id # 2026619832316723200) THEN
        RAISE EXCEPTION 'the guard (advisory lock %) of entry % is held by another connection', v_id # 2026619832316723200, v_id
            USING ERRCODE = '55P03';
    END IF;
    IF p_kind IN ('election', 'dlm') AND NOT pg_try_advisory_lock(hashtextextended(v_id::text || ':0', 2026619832316723200)) THEN
        PERFORM pg_advisory_unlock(v_id # 2026619832316723200);
        RAISE EXCEPTION 'the value lock of entry % is held by another connection', v_id USING ERRCODE = '55P03';
    END IF;
END
$fn$;

-- p_id itself (an empty kind) and the nearest earlier live entries; no row at
-- all when p_id is gone.
CREATE OR REPLACE FUNCTION "public"."lockline_earlier"(p_id bigint, p_name text, p_session text, p_skip_shared boolean, p_count integer)
RETURNS TABLE (e_id bigint, e_kind text, e_session text) LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM "public"."lockline_entries" e WHERE e.id = p_id) THEN RETURN; END IF;
    e_id := p_id; e_kind := ''; e_session := p_session;
    RETURN NEXT;
    RETURN QUERY SELECT * FROM "public"."lockline_nearest"(p_id, p_name, p_session, p_skip_shared, p_count);
END
$fn$;

-- Deletes an entry of p_session; lets go of its guard when p_unlock (called on
-- the owning connection). A lock-mode entry removed by another session: its
-- watchers hear of it on its channel.
CREATE OR REPLACE FUNCTION "public"."lockline_remove"(p_id bigint, p_session text, p_unlock boolean)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    v_kind text;
    v_version bigint;
BEGIN
    DELETE FROM "public"."lockline_entries" e WHERE e.id = p_id AND e.session = p_session RETURNING e.kind, e.epoch INTO v_kind, v_version;
    IF p_unlock THEN
        -- Held on to until the deletion commits (see lockline_update_queue).
        PERFORM pg_advisory_xact_lock(p_id # 2026619832316723200);
        PERFORM pg_advisory_unlock(p_id # 2026619832316723200);
        IF v_kind IN ('election', 'dlm') THEN
            PERFORM pg_advisory_xact_lock(hashtextextended(p_id::text || ':' || v_version::text, 2026619832316723200));
            PERFORM pg_advisory_unlock(hashtextextended(p_id::text || ':' || v_version::text, 2026619832316723200));
        END IF;
    ELSIF v_kind = 'dlm' THEN
        PERFORM pg_notify('ll1c2991c2feb9_' || p_id::text, '');
    END IF;
    RETURN v_kind IS NOT NULL;
END
$fn$;

-- Deletes the entry an attempt appended, if any, and lets go of its guard.
CREATE OR REPLACE FUNCTION "public"."lockline_abandon"(p_attempt text, p_session text)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
    v_kind text;
    v_version bigint;
BEGIN
    DELETE FROM "public"."lockline_entries" e WHERE e.attempt = p_attempt AND e.session = p_session
    RETURNING e.id, e.kind, e.epoch INTO v_id, v_kind, v_version;
    IF v_id IS NOT NULL THEN
        -- Held on to until the deletion commits (see lockline_update_queue).
        PERFORM pg_advisory_xact_lock(v_id # 2026619832316723200);
        PERFORM pg_advisory_unlock(v_id # 2026619832316723200);
        IF v_kind IN ('election', 'dlm') THEN
            PERFORM pg_advisory_xact_lock(hashtextextended(v_id::text || ':' || v_version::text, 2026619832316723200));
            PERFORM pg_advisory_unlock(hashtextextended(v_id::text || ':' || v_version::text, 2026619832316723200));
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
CREATE OR REPLACE FUNCTION "public"."lockline_wait"(p_key bigint, p_owner text, p_bound_ms bigint, p_entry bigint)
RETURNS TABLE (w_code integer, w_beat bigint, w_ttl_ms bigint) LANGUAGE plpgsql AS $fn$
DECLARE
    v_ttl bigint;
    v_pid integer;
    v_bound bigint := p_bound_ms;
BEGIN
    SELECT s.ttl_ms, s.pid INTO v_ttl, v_pid FROM "public"."lockline_sessions" s WHERE s.id = p_owner;
    IF FOUND THEN
        IF v_pid = pg_backend_pid() THEN
            RAISE EXCEPTION 'two connections of lockline share one server backend: a transaction-pooling proxy (PgBouncer pool_mode=transaction or statement) is in front of the database; the locks of lockline belong to a connection, so it needs a direct connection or a session-mode pool' USING ERRCODE = 'LL001';
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
        PERFORM 1 FROM "public"."lockline_entries" e WHERE e.id = p_entry FOR UPDATE;
        IF FOUND THEN
            w_code := 3;
        END IF;
    END IF;
    RETURN NEXT;
EXCEPTION WHEN lock_not_available THEN
    SELECT s.beat, s.ttl_ms INTO w_beat, w_ttl_ms FROM "public"."lockline_sessions" s WHERE s.id = p_owner;
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
CREATE OR REPLACE FUNCTION "public"."lockline_reap"(p_owner text, p_key bigint, p_beat bigint)
RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
    s record;
BEGIN
    SELECT x.pid, x.beat, x.backend_start INTO s FROM "public"."lockline_sessions" x WHERE x.id = p_owner FOR UPDATE;
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
    DELETE FROM "public"."lockline_entries" e
     WHERE e.id IN (SELECT x.id FROM "public"."lockline_entries" x WHERE x.session = p_owner ORDER BY x.id FOR UPDATE);
    DELETE FROM "public"."lockline_sessions" x WHERE x.id = p_owner;
    RETURN 2;
END
$fn$;

-- Replaces an election entry's value: takes the lock of the next version before
-- letting go of the current one, which wakes the value's watchers. (The value
-- lock follows epoch, which is the version unless another session wrote it.)
CREATE OR REPLACE FUNCTION "public"."lockline_set_value"(p_id bigint, p_session text, p_value bytea)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    v_old bigint;
BEGIN
    SELECT e.epoch INTO v_old FROM "public"."lockline_entries" e WHERE e.id = p_id AND e.session = p_session FOR UPDATE;
    IF NOT FOUND THEN RETURN false; END IF;
    UPDATE "public"."lockline_entries" e SET value = p_value, version = e.version + 1, epoch = v_old + 1 WHERE e.id = p_id;
    PERFORM pg_advisory_lock(hashtextextended(p_id::text || ':' || (v_old + 1)::text, 2026619832316723200));
    PERFORM pg_advisory_unlock(hashtextextended(p_id::text || ':' || v_old::text, 2026619832316723200));
    RETURN true;
END
$fn$;

-- Applies fenced writes to the data table, only while p_session's entry p_id
-- exists (called on the owning connection, which holds its guard).
CREATE OR REPLACE FUNCTION "public"."lockline_write"(p_id bigint, p_session text, p_keys text[], p_values bytea[], p_deletes boolean[])
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM 1 FROM "public"."lockline_entries" e WHERE e.id = p_id AND e.session = p_session FOR SHARE;
    IF NOT FOUND THEN RETURN false; END IF;
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF p_deletes[i] THEN
            DELETE FROM "public"."lockline_data" d WHERE d.key = p_keys[i];
        ELSE
            INSERT INTO "public"."lockline_data" (key, value) VALUES (p_keys[i], p_values[i])
            ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
        END IF;
    END LOOP;
    RETURN true;
END
$fn$;

-- The fence of a transaction on the application's own tables that must commit
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
CREATE OR REPLACE FUNCTION "public"."lockline_fence"(p_key text)
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
    IF NOT pg_try_advisory_xact_lock_shared(v_id # 2026619832316723200) THEN
        PERFORM 1 FROM "public"."lockline_entries" e WHERE e.id = v_id AND e.name = v_name FOR SHARE OF e;
        IF FOUND AND NOT pg_try_advisory_xact_lock_shared(v_id # 2026619832316723200) THEN
            RETURN v_id;
        END IF;
    END IF;
    RAISE EXCEPTION 'lockline: the lock % is not held', quote_literal(p_key) USING ERRCODE = 'LL002',
        HINT = 'Its holder lost it (its session ended or was ended) or released it: nothing this transaction wrote may commit.';
END
$fn$;

-- Waits as "public"."lockline_wait" does on the guard of entry p_entry (of session
-- p_owner), then, unless the bound ran out, reads in the same call what the
-- waiter's own entry p_id reads after a wake, as "public"."lockline_earlier" does: a handoff
-- is the releaser's statement and this call's answer, no read after it. The
-- wait's row first (e_id NULL; w_read false when the read was not made: a dead
-- entry's row held past the bound by a fenced commit in flight, which the
-- caller then reads on its own), then the rows of "public"."lockline_earlier".
CREATE OR REPLACE FUNCTION "public"."lockline_wait_turn"(p_entry bigint, p_owner text, p_bound_ms bigint, p_id bigint, p_name text,
    p_session text, p_skip_shared boolean, p_count integer)
RETURNS TABLE (w_code integer, w_beat bigint, w_ttl_ms bigint, w_read boolean, e_id bigint, e_kind text,
    e_session text) LANGUAGE plpgsql AS $fn$
DECLARE
    v_ids bigint[];
    v_kinds text[];
    v_sessions text[];
BEGIN
    SELECT x.w_code, x.w_beat, x.w_ttl_ms INTO w_code, w_beat, w_ttl_ms
      FROM "public"."lockline_wait"(p_entry # 2026619832316723200, p_owner, p_bound_ms, p_entry) x;
    w_read := false;
    IF w_code <> 1 THEN
        -- Bounded as the wait was (its lock_timeout holds to the end of
        -- this call).
        BEGIN
            SELECT array_agg(r.e_id ORDER BY r.n), array_agg(r.e_kind ORDER BY r.n), array_agg(r.e_session ORDER BY r.n)
              INTO v_ids, v_kinds, v_sessions
              FROM "public"."lockline_earlier"(p_id, p_name, p_session, p_skip_shared, p_count) WITH ORDINALITY AS r(e_id, e_kind, e_session, n);
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
CREATE OR REPLACE PROCEDURE "public"."lockline_release"(p_id bigint, p_session text, INOUT r_removed boolean DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_kind text;
    v_version bigint;
BEGIN
    DELETE FROM "public"."lockline_entries" e WHERE e.id = p_id AND e.session = p_session RETURNING e.kind, e.epoch INTO v_kind, v_version;
    COMMIT;
    PERFORM pg_advisory_unlock(p_id # 2026619832316723200);
    IF v_kind IN ('election', 'dlm') THEN
        PERFORM pg_advisory_unlock(hashtextextended(p_id::text || ':' || v_version::text, 2026619832316723200));
    END IF;
    r_removed := v_kind IS NOT NULL;
END
$fn$;

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
-- id counter, which a restart moves past (see "public"."lockline_open"). Watchers hear of each
-- write: the caller's own entries by their value lock (of epoch), moved (or let
-- go of with the entry) last, after every step that can fail; other sessions'
-- entries, whose value lock their owner holds, by a notification on the
-- entry's channel, sent at commit, which carries the entry's version and the
-- value written (w, the version, a colon and the value's hex; empty for a
-- removal). An entry both set and deleted is deleted. The
-- block's write waits for the disk unless it only moves the holder it names
-- (see below).
CREATE OR REPLACE FUNCTION "public"."lockline_update_queue"(p_name text, p_session text, p_ids bigint[], p_versions bigint[],
    p_writes boolean[], p_set_ids bigint[], p_set_values bytea[], p_delete_ids bigint[], p_block bytea)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
    i integer;
    v_reset boolean := coalesce(current_setting('lockline.reset_grace', true), '') = 'on';
    v_conditions integer;
    v_met integer := 0;
    v_version bigint;
    v_own bigint[] := '{}';
    v_dead bigint[] := '{}';
    v_moved bigint[] := '{}';
    v_moved_to bigint[] := '{}';
    v_gone bigint[] := '{}';
    v_gone_at bigint[] := '{}';
    v_told bigint[] := '{}';
    v_told_values text[] := '{}';
    v_token bigint;
    v_block bytea;
    v_b bytea;
    v_head text;
    v_named boolean[] := '{}';
    v_values bytea[] := '{}';
BEGIN
    PERFORM pg_advisory_xact_lock(472486338, hashtext(p_name));
    SELECT count(*) INTO v_conditions FROM unnest(p_versions) v WHERE v <> -1;
    FOR r IN SELECT e.id, e.session FROM "public"."lockline_entries" e WHERE e.name = p_name ORDER BY e.id LOOP
        i := array_position(p_ids, r.id);
        IF i IS NULL THEN
            IF r.session <> p_session AND pg_try_advisory_xact_lock_shared(r.id # 2026619832316723200)
               AND (NOT v_reset OR NOT EXISTS (SELECT 1 FROM "public"."lockline_sessions" s WHERE s.id = r.session)) THEN
                v_dead := v_dead || r.id;
            END IF;
            CONTINUE;
        END IF;
        IF p_writes[i] THEN
            SELECT e.version INTO v_version FROM "public"."lockline_entries" e WHERE e.id = r.id FOR UPDATE;
        ELSE
            SELECT e.version INTO v_version FROM "public"."lockline_entries" e WHERE e.id = r.id FOR SHARE;
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
            IF r.session <> p_session AND pg_try_advisory_xact_lock_shared(r.id # 2026619832316723200)
               AND (NOT v_reset OR NOT EXISTS (SELECT 1 FROM "public"."lockline_sessions" s WHERE s.id = r.session)) THEN
                RETURN NULL;
            END IF;
            v_met := v_met + 1;
        END IF;
    END LOOP;
    IF v_met < v_conditions THEN
        RETURN NULL;
    END IF;
    IF cardinality(v_dead) > 0 THEN
        DELETE FROM "public"."lockline_entries" e WHERE e.id = ANY(v_dead);
    END IF;
    v_token := nextval(pg_get_serial_sequence('"public"."lockline_entries"', 'id'));
    FOR r IN UPDATE "public"."lockline_entries" e SET value = x.value, version = e.version + 1, changed = v_token,
             epoch = e.epoch + (e.session = p_session)::integer
             FROM unnest(p_set_ids, p_set_values) AS x(id, value)
             WHERE e.id = x.id AND e.name = p_name AND e.id <> ALL(p_delete_ids) RETURNING e.id, e.epoch, e.value, e.version LOOP
        IF r.id = ANY(v_own) THEN
            v_moved := v_moved || r.id;
            v_moved_to := v_moved_to || r.epoch;
        ELSE
            v_told := v_told || r.id;
            -- The notice carries the value written (w, the entry's version, a
            -- colon and the value's hex), so that a watcher it leaves waiting
            -- need not read the entry; the version tells a notice of a write
            -- the watcher's read already saw (notices arrive late) from a
            -- later one.
            v_told_values := v_told_values || CASE WHEN octet_length(r.value) <= 2000
                THEN 'w' || r.version::text || ':' || encode(r.value, 'hex') ELSE '' END;
        END IF;
    END LOOP;
    FOR r IN DELETE FROM "public"."lockline_entries" e WHERE e.id = ANY(p_delete_ids) AND e.name = p_name
             RETURNING e.id, e.epoch LOOP
        IF r.id = ANY(v_own) THEN
            v_gone := v_gone || r.id;
            v_gone_at := v_gone_at || r.epoch;
        ELSE
            v_told := v_told || r.id;
            v_told_values := v_told_values || ''::text;
        END IF;
    END LOOP;
    IF p_block IS NOT NULL THEN
        SELECT b.value INTO v_block FROM "public"."lockline_blocks" b WHERE b.name = p_name;
        IF v_block IS NOT NULL AND v_block <> p_block THEN
            -- Each block as lockline writes it ("lvb1 <sequence> <valid>
            -- <holder's order> <length of the holder's key>", a newline, the
            -- key, the value's bytes): its value without the holder, and
            -- whether it names one.
            FOREACH v_b IN ARRAY ARRAY[v_block, p_block] LOOP
                i := position('\x0a'::bytea IN v_b);
                v_head := CASE WHEN i > 1 THEN encode(substring(v_b FROM 1 FOR i - 1), 'escape') END;
                IF v_head ~ '^lvb1 [0-9]{1,19} [01] -?[0-9]{1,19} [0-9]{1,9}$' THEN
                    v_named := v_named || (split_part(v_head, ' ', 5)::integer > 0);
                    v_values := v_values || (convert_to(split_part(v_head, ' ', 2) || ' ' || split_part(v_head, ' ', 3) || ' ', 'UTF8')
                        || substring(v_b FROM i + 1 + split_part(v_head, ' ', 5)::integer));
                ELSE
                    v_named := v_named || NULL::boolean;
                    v_values := v_values || NULL::bytea;
                END IF;
            END LOOP;
            -- The holder named changes, from a holder to another or to none,
            -- and the value does not: the commit need not wait for the disk.
            -- A crash that loses it leaves the block naming a holder gone with
            -- the crash (as every write before it is kept or lost in order),
            -- which reads as a loss: the value not valid, never valid when it
            -- should not be. A write that names a holder where none was, or
            -- that changes the value, waits for the disk as any commit does.
            IF v_named[1] AND v_values[1] = v_values[2] THEN
                PERFORM set_config('synchronous_commit', 'off', true);
            END IF;
        END IF;
        IF v_block IS DISTINCT FROM p_block THEN
            INSERT INTO "public"."lockline_blocks" AS b (name, value) VALUES (p_name, p_block)
            ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value WHERE b.value IS DISTINCT FROM EXCLUDED.value;
        END IF;
    END IF;
    FOR i IN 1 .. cardinality(v_told) LOOP
        PERFORM pg_notify('ll1c2991c2feb9_' || v_told[i]::text, v_told_values[i]);
    END LOOP;
    -- The guards and value locks let go of are held on to until this
    -- transaction ends (a transaction's own hold, taken first): a reader
    -- that finds one free then sees this write committed, never the rows
    -- before it beside a guard that says the entry is gone.
    FOR i IN 1 .. cardinality(v_moved) LOOP
        PERFORM pg_advisory_lock(hashtextextended(v_moved[i]::text || ':' || v_moved_to[i]::text, 2026619832316723200));
        PERFORM pg_advisory_xact_lock(hashtextextended(v_moved[i]::text || ':' || (v_moved_to[i] - 1)::text, 2026619832316723200));
        PERFORM pg_advisory_unlock(hashtextextended(v_moved[i]::text || ':' || (v_moved_to[i] - 1)::text, 2026619832316723200));
    END LOOP;
    FOR i IN 1 .. cardinality(v_gone) LOOP
        PERFORM pg_advisory_xact_lock(v_gone[i] # 2026619832316723200);
        PERFORM pg_advisory_unlock(v_gone[i] # 2026619832316723200);
        PERFORM pg_advisory_xact_lock(hashtextextended(v_gone[i]::text || ':' || v_gone_at[i]::text, 2026619832316723200));
        PERFORM pg_advisory_unlock(hashtextextended(v_gone[i]::text || ':' || v_gone_at[i]::text, 2026619832316723200));
    END LOOP;
    RETURN v_token;
END
$fn$;

-- Waits until the lock-mode entry p_id is no longer at p_version: until its
-- owner lets go of its value lock of p_epoch (it wrote the entry, removed it,
-- or its connection ended), bounded as "public"."lockline_wait". w_code 0: moved on or gone; 3:
-- there with its guard free (lost with its owner's connection); 1: the bound
-- ran out, with the owner's heartbeat. Unless the bound ran out, the entry as
-- it is then (w_read; its value, version, epoch and whether it is live, or
-- NULLs when gone), so that the watcher need not read it again. Writes by
-- other sessions are told on the entry's channel instead.
CREATE OR REPLACE FUNCTION "public"."lockline_watch"(p_id bigint, p_epoch bigint, p_version bigint, p_session text, p_owner text,
    p_bound_ms bigint)
RETURNS TABLE (w_code integer, w_beat bigint, w_ttl_ms bigint, w_read boolean, w_value bytea, w_version bigint,
    w_epoch bigint, w_live boolean) LANGUAGE plpgsql AS $fn$
BEGIN
    w_code := 0;
    IF EXISTS (SELECT 1 FROM "public"."lockline_entries" e WHERE e.id = p_id AND e.version = p_version) THEN
        SELECT x.w_code, x.w_beat, x.w_ttl_ms INTO w_code, w_beat, w_ttl_ms
          FROM "public"."lockline_wait"(hashtextextended(p_id::text || ':' || p_epoch::text, 2026619832316723200), p_owner, p_bound_ms, NULL) x;
    END IF;
    w_read := w_code = 0;
    IF w_read THEN
        -- A write or a removal of its owner's in flight lets go of the value
        -- lock before its commit: wait for that, then read.
        PERFORM set_config('lock_timeout', '0', true);
        SELECT e.value, e.version, e.epoch, (e.session = p_session OR NOT pg_try_advisory_xact_lock_shared(e.id # 2026619832316723200) OR (coalesce(current_setting('lockline.reset_grace', true), '') = 'on' AND EXISTS (SELECT 1 FROM "public"."lockline_sessions" s WHERE s.id = e.session))) INTO w_value, w_version, w_epoch, w_live
          FROM "public"."lockline_entries" e WHERE e.id = p_id FOR SHARE OF e;
        IF FOUND AND NOT w_live THEN
            w_code := 3;
        END IF;
    END IF;
    RETURN NEXT;
END
$fn$;

-- Deletes a session's entries (their rows locked in id order, as
-- "public"."lockline_update_queue" locks the rows it names) and its row.
CREATE OR REPLACE FUNCTION "public"."lockline_close"(p_session text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM "public"."lockline_entries" e
     WHERE e.id IN (SELECT x.id FROM "public"."lockline_entries" x WHERE x.session = p_session ORDER BY x.id FOR UPDATE);
    DELETE FROM "public"."lockline_sessions" s WHERE s.id = p_session;
END
$fn$;

-- Ends a lost session from another connection: its old owning connection is
-- terminated if it is still there (a connection the server still believes in,
-- behind a silent partition; its pid and start time), then its rows are
-- deleted. false when that connection would not end within 5 s.
CREATE OR REPLACE FUNCTION "public"."lockline_end"(p_session text, p_pid integer)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM "public"."lockline_sessions" s JOIN pg_stat_activity a
                 ON a.pid = s.pid AND a.backend_start = s.backend_start
               WHERE s.id = p_session AND s.pid = p_pid) THEN
        IF NOT pg_terminate_backend(p_pid, 5000) THEN
            RETURN false;
        END IF;
    END IF;
    DELETE FROM "public"."lockline_entries" e
     WHERE e.id IN (SELECT x.id FROM "public"."lockline_entries" x WHERE x.session = p_session ORDER BY x.id FOR UPDATE);
    DELETE FROM "public"."lockline_sessions" s WHERE s.id = p_session;
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
CREATE OR REPLACE FUNCTION "public"."lockline_open"(p_session text, p_ttl_ms bigint)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_started timestamptz := pg_postmaster_start_time();
    v_seen timestamptz;
    v_seq regclass := pg_get_serial_sequence('"public"."lockline_entries"', 'id')::regclass;
    v_last bigint;
    v_unreadable boolean := false;
    v_left bigint;
BEGIN
    SELECT m.started_at INTO v_seen FROM "public"."lockline_meta" m;
    BEGIN
        v_last := pg_sequence_last_value(v_seq);
    EXCEPTION WHEN internal_error THEN
        -- Looked at again below, with the meta row locked (this block's
        -- locks went with its failure: none is kept on the sequence).
        v_unreadable := true;
    END;
    IF v_seen IS DISTINCT FROM v_started OR v_last IS NULL THEN
        -- One mover at a time, holding this until its commit: see below.
        PERFORM pg_advisory_xact_lock(472486338, 1);
        SELECT m.started_at INTO v_seen FROM "public"."lockline_meta" m FOR UPDATE;
        IF v_unreadable THEN
            -- PostgreSQL 15 and later: an unlogged sequence created while a
            -- standby streamed is unreadable on that standby once promoted,
            -- until its next restartpoint (its init fork was replayed into
            -- memory only). Its identity is made again, past the clock, by
            -- the first session; those waiting for the meta row meanwhile
            -- find the new one.
            v_seq := pg_get_serial_sequence('"public"."lockline_entries"', 'id')::regclass;
            BEGIN
                v_last := pg_sequence_last_value(v_seq);
                v_unreadable := false;
            EXCEPTION WHEN internal_error THEN
                IF SQLERRM NOT LIKE 'bad magic number in sequence%' THEN RAISE; END IF;
            END;
            IF v_unreadable THEN
                BEGIN
                    EXECUTE 'ALTER TABLE "public"."lockline_entries" ALTER COLUMN id DROP IDENTITY';
                    EXECUTE format('ALTER TABLE "public"."lockline_entries" ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)',
                                   (extract(epoch from clock_timestamp()) * 1000000)::bigint);
                EXCEPTION WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'the id counter of "public"."lockline_entries" cannot be read after a promotion (a PostgreSQL bug with unlogged sequences); as the table''s owner run: ALTER TABLE "public"."lockline_entries" ALTER COLUMN id DROP IDENTITY, ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY, then grant USAGE, SELECT, UPDATE on its new sequence again'
                        USING ERRCODE = '42501';
                END;
                v_seq := pg_get_serial_sequence('"public"."lockline_entries"', 'id')::regclass;
                v_last := NULL;
            END IF;
        END IF;
        IF v_seen IS DISTINCT FROM v_started OR pg_sequence_last_value(v_seq) IS NULL THEN
            PERFORM setval(v_seq, greatest(coalesce(pg_sequence_last_value(v_seq), 0), (extract(epoch from clock_timestamp()) * 1000000)::bigint));
            -- A grace still in force (a restart within it) is kept when
            -- longer: its holders may not have heard either.
            UPDATE "public"."lockline_meta" SET started_at = v_started, grace_ms = greatest(grace_ms, run_max_ttl_ms),
                run_max_ttl_ms = 0, grace_from = clock_timestamp();
        END IF;
    ELSE
        -- A mover's setval shows at once, its grace only with its commit
        -- (which may wait for a synchronous standby): wait for that commit,
        -- so that no opener takes the moved counter for no restart and
        -- skips the grace.
        PERFORM pg_advisory_xact_lock_shared(472486338, 1);
    END IF;
    UPDATE "public"."lockline_meta" SET run_max_ttl_ms = p_ttl_ms WHERE run_max_ttl_ms < p_ttl_ms;
    -- Sessions of processes that died a minute or more past their TTL, whose
    -- connection is gone (their guards with it): their rows go.
    DELETE FROM "public"."lockline_entries" e USING "public"."lockline_sessions" s
     WHERE e.session = s.id AND s.renewed_us + s.ttl_ms * 1000 < (extract(epoch from clock_timestamp()) * 1000000)::bigint - 60000000
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid);
    DELETE FROM "public"."lockline_sessions" s
     WHERE s.renewed_us + s.ttl_ms * 1000 < (extract(epoch from clock_timestamp()) * 1000000)::bigint - 60000000
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid);
    INSERT INTO "public"."lockline_sessions" (id, pid, ttl_ms, renewed_us, backend_start)
    SELECT p_session, pg_backend_pid(), p_ttl_ms, (extract(epoch from clock_timestamp()) * 1000000)::bigint, a.backend_start
      FROM pg_stat_activity a WHERE a.pid = pg_backend_pid();
    SELECT greatest(0, m.grace_ms - (extract(epoch from clock_timestamp() - m.grace_from) * 1000)::bigint)
      INTO v_left FROM "public"."lockline_meta" m;
    RETURN coalesce(v_left, 0);
END
$fn$;
-- (schema "public")
