-- | lockline's MariaDB/MySQL tables and procedures, in database lockline with
-- | the default table prefix lockline_: run it as it is with the mariadb or
-- | mysql client (mariadb lockline < mariadb.sql). Sql::ddl() prints it for
-- | another database (the URL's, or Sql::with_schema) or table prefix
-- | (Sql::with_table_prefix). It is the one source of the layout: lockline
-- | runs this very script when it creates its tables on first use, one step
-- | at a time: the text before the first DELIMITER // line; each procedure,
-- | alone between a DELIMITER // line and its closing //, DELIMITER ; lines;
-- | and the text after the last procedure (the layout's row, last: it says
-- | the rest exists).
-- |
-- | For other names, lockline replaces these as they are written here:
-- | `lockline` (the database); `lockline_ at the start of a name; and the
-- | start of the named locks (ll:bb29fb052a1f:), which it derives from the
-- | database and the prefix. When it moves tables of an older layout to this
-- | one, it runs the procedures this layout added alone, each its own step.
-- | Lines that begin with "-- |", as these do, are left out of what
-- | lockline runs and prints.
-- lockline's tables and procedures (layout 5) for MariaDB 10.6 or later, or MySQL 8.0.29
-- or later, in database `lockline`.
-- InnoDB for all: the entries' row locks make a fenced commit and the next grant
-- exclusive of each other, and AUTO_INCREMENT (the fencing token) is persisted.
-- Names and keys are VARBINARY: compared byte for byte (a PAD SPACE collation
-- would make `a` and `a ` one lock).
CREATE TABLE IF NOT EXISTS `lockline`.`lockline_entries` (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name VARBINARY(512) NOT NULL,
    kind VARCHAR(16) CHARACTER SET ascii NOT NULL,
    session VARCHAR(64) CHARACTER SET ascii NOT NULL,
    attempt VARCHAR(64) CHARACTER SET ascii NOT NULL,
    value LONGBLOB NOT NULL,
    version BIGINT NOT NULL DEFAULT 0,
    -- The version of the value lock its owner holds (election and lock-mode
    -- entries): raised by its owner's own writes only, so equal to version
    -- unless another session wrote it.
    epoch BIGINT NOT NULL DEFAULT 0,
    -- A lock-mode entry: the token of its last write by the update_queue
    -- procedure (0: none yet), and how many watch slots were ever used
    -- (see the watch procedure).
    changed BIGINT NOT NULL DEFAULT 0,
    watchers INT NOT NULL DEFAULT 0,
    UNIQUE KEY entries_attempt (attempt),
    KEY entries_name (name, id),
    KEY entries_session (session)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS `lockline`.`lockline_sessions` (
    id VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    conn BIGINT NOT NULL,
    ttl_ms BIGINT NOT NULL,
    renewed_us BIGINT NOT NULL,
    beat BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS `lockline`.`lockline_data` (
    `key` VARBINARY(3072) NOT NULL PRIMARY KEY,
    value LONGBLOB NOT NULL
) ENGINE=InnoDB;
-- The lock value block of each lock-mode resource (by its name) that was
-- given one.
CREATE TABLE IF NOT EXISTS `lockline`.`lockline_blocks` (
    name VARBINARY(512) NOT NULL PRIMARY KEY,
    value LONGBLOB NOT NULL
) ENGINE=InnoDB;
-- MEMORY: a server start empties it. A row with a server's id names the run
-- of lockline that server's first session began (the meta row names the run
-- in force), so a restart is told even when the server's start (its clock
-- less its whole-second uptime) looks the same, and so is a replica's
-- promotion (its primary's rows, replicated, have the primary's id; a row of
-- its own is of an older run).
CREATE TABLE IF NOT EXISTS `lockline`.`lockline_run` (
    server_id BIGINT NOT NULL PRIMARY KEY,
    run_id VARCHAR(32) CHARACTER SET ascii NOT NULL
) ENGINE=MEMORY;
-- An append, in one round trip: nothing it takes on the server (its turn on
-- the name, a row lock) outlives the call, whatever becomes of the client.
-- Appends to one name take turns on a named lock of the name's hash, held from
-- before the id is allocated until the entry is committed (each statement here
-- commits on its own), so ids under a name become visible in their order
-- (InnoDB allocates an id before the row reaches the index a reader scans).
-- The entry's guard is taken before the row exists, so a visible entry whose
-- guard is free is dead. Answers the entry's id (-1: its guard is held by
-- another connection) and the nearest earlier live entries, "id kind session;"
-- each, deleting dead ones before going past them.
DELIMITER //
CREATE PROCEDURE IF NOT EXISTS `lockline`.`lockline_append`(
    p_name VARBINARY(512), p_kind VARCHAR(16) CHARACTER SET ascii, p_session VARCHAR(64) CHARACTER SET ascii,
    p_attempt VARCHAR(64) CHARACTER SET ascii, p_value LONGBLOB, p_skip_shared BOOLEAN, p_count INT)
    MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    DECLARE v_guard VARCHAR(64) CHARACTER SET ascii DEFAULT CONCAT('ll:bb29fb052a1f:e:', p_attempt);
    DECLARE v_turn VARCHAR(64) CHARACTER SET ascii DEFAULT CONCAT('ll:bb29fb052a1f:n:', SHA1(p_name));
    DECLARE v_version VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_id, v_below, v_earlier BIGINT;
    DECLARE v_kind VARCHAR(16) CHARACTER SET ascii;
    DECLARE v_session VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_live, v_done BOOLEAN DEFAULT FALSE;
    DECLARE v_found INT DEFAULT 0;
    DECLARE v_nearest LONGTEXT CHARACTER SET ascii DEFAULT '';
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
    -- A failed step (a row-lock wait that ran out, a killed statement) gives
    -- the name's turn back before the error reaches the client.
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        DO RELEASE_LOCK(v_turn);
        RESIGNAL;
    END;
    IF NOT (IS_USED_LOCK(v_guard) <=> CONNECTION_ID()) THEN
        IF NOT (GET_LOCK(v_guard, 0) <=> 1) THEN
            SET v_id = -1;
        END IF;
    END IF;
    IF v_id IS NULL THEN
        IF NOT (GET_LOCK(v_turn, @@innodb_lock_wait_timeout) <=> 1) THEN
            SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205,
                MESSAGE_TEXT = 'Lock wait timeout exceeded: appends to the same name held their turn';
        END IF;
        -- A retried attempt finds its earlier append.
        SET v_id = (SELECT id FROM `lockline`.`lockline_entries` WHERE attempt = p_attempt AND session = p_session);
        IF v_id IS NULL THEN
            INSERT INTO `lockline`.`lockline_entries` (name, kind, session, attempt, value)
                VALUES (p_name, p_kind, p_session, p_attempt, p_value);
            SET v_id = LAST_INSERT_ID();
        END IF;
        DO RELEASE_LOCK(v_turn);
        IF p_kind IN ('election', 'dlm') THEN
            SET v_version = CONCAT('ll:bb29fb052a1f:v:', v_id, ':0');
            IF NOT (IS_USED_LOCK(v_version) <=> CONNECTION_ID()) THEN
                DO GET_LOCK(v_version, 0);
            END IF;
        END IF;
        SET v_below = v_id;
        scan: WHILE v_found < p_count DO
            SET v_done = FALSE;
            SELECT id, kind, session, IS_USED_LOCK(CONCAT('ll:bb29fb052a1f:e:', attempt)) IS NOT NULL OR session = p_session
                INTO v_earlier, v_kind, v_session, v_live
                FROM `lockline`.`lockline_entries` WHERE name = p_name AND id < v_below ORDER BY id DESC LIMIT 1;
            IF v_done THEN
                LEAVE scan;
            END IF;
            SET v_below = v_earlier;
            -- With the reset grace (Sql::with_reset_grace), a dead entry whose
            -- session is still there blocks like a live one: its owner may be
            -- alive with its connection reset, not told yet.
            IF NOT v_live AND @lockline_reset_grace <=> 1
               AND EXISTS (SELECT 1 FROM `lockline`.`lockline_sessions` WHERE id = v_session) THEN
                SET v_live = TRUE;
            END IF;
            IF NOT v_live THEN
                -- Its guard is free: released, or its owner's connection ended.
                -- Deleted before going past it (this waits for a fenced commit of
                -- its holder still in flight).
                DELETE FROM `lockline`.`lockline_entries` WHERE id = v_earlier AND session <> p_session
                    AND IS_FREE_LOCK(CONCAT('ll:bb29fb052a1f:e:', attempt));
            ELSEIF NOT (p_skip_shared AND v_kind = 'read') THEN
                SET v_nearest = CONCAT(v_nearest, v_earlier, ' ', v_kind, ' ', v_session, ';');
                SET v_found = v_found + 1;
            END IF;
        END WHILE;
    END IF;
    SELECT v_id, v_nearest;
END//
DELIMITER ;
DELIMITER //
-- A change of a lock-mode queue, atomically or not at all, in one round trip.
-- p_named lists the entries it names, by ascending id, "id version op length;"
-- each: the version it must be at (-1: none; -2: any, but there), op 1 sets
-- its value (the next
-- length bytes of p_values), 2 deletes it. Changes of one name take the name's
-- turn, as appends do, for the whole transaction, and lock the named rows in id
-- order (shared where only a version is checked). A named entry missing, dead
-- or at another version: NULL, nothing written. Otherwise dead entries of the
-- name are deleted, the token drawn from the entries' AUTO_INCREMENT (a row
-- inserted and deleted again: the counter a restart moves past the clock), the
-- values set (version raised, changed = the token), the entries deleted, the
-- block written when given (NULL: left alone), and the token answered. After
-- the commit the entries' watchers are told: the caller's own entries by their
-- value lock (of epoch: moved, or let go of with the guard), other sessions'
-- by waking each watcher that holds one of the entry's watch slots (KILL
-- QUERY). An entry both set and deleted is deleted.
CREATE PROCEDURE IF NOT EXISTS `lockline`.`lockline_update_queue`(
    p_name VARBINARY(512), p_session VARCHAR(64) CHARACTER SET ascii, p_named LONGTEXT CHARACTER SET ascii,
    p_values LONGBLOB, p_block LONGBLOB)
    MODIFIES SQL DATA SQL SECURITY INVOKER
proc: BEGIN
    DECLARE v_turn VARCHAR(64) CHARACTER SET ascii DEFAULT CONCAT('ll:bb29fb052a1f:n:', SHA1(p_name));
    DECLARE v_rest LONGTEXT CHARACTER SET ascii DEFAULT p_named;
    DECLARE v_wake LONGTEXT CHARACTER SET ascii DEFAULT '';
    DECLARE v_item VARCHAR(200) CHARACTER SET ascii;
    DECLARE v_id, v_want, v_version, v_epoch, v_token, v_pos BIGINT;
    DECLARE v_op, v_len, v_watchers INT;
    DECLARE v_session, v_attempt VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_done BOOLEAN DEFAULT FALSE;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        DO RELEASE_LOCK(v_turn);
        RESIGNAL;
    END;
    IF NOT (GET_LOCK(v_turn, @@innodb_lock_wait_timeout) <=> 1) THEN
        SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205,
            MESSAGE_TEXT = 'Lock wait timeout exceeded: changes of the same name held their turn';
    END IF;
    START TRANSACTION;
    WHILE v_rest <> '' DO
        SET v_item = SUBSTRING_INDEX(v_rest, ';', 1);
        SET v_rest = SUBSTRING(v_rest, LENGTH(v_item) + 2);
        SET v_id = CAST(SUBSTRING_INDEX(v_item, ' ', 1) AS SIGNED);
        SET v_want = CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(v_item, ' ', 2), ' ', -1) AS SIGNED);
        SET v_op = CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(v_item, ' ', 3), ' ', -1) AS SIGNED);
        SET v_done = FALSE;
        IF v_op > 0 THEN
            SELECT version, epoch, session, attempt, watchers INTO v_version, v_epoch, v_session, v_attempt, v_watchers
                FROM `lockline`.`lockline_entries` WHERE id = v_id AND name = p_name FOR UPDATE;
        ELSE
            SELECT version, epoch, session, attempt, watchers INTO v_version, v_epoch, v_session, v_attempt, v_watchers
                FROM `lockline`.`lockline_entries` WHERE id = v_id AND name = p_name LOCK IN SHARE MODE;
        END IF;
        IF v_done THEN
            IF v_want <> -1 THEN
                ROLLBACK;
                DO RELEASE_LOCK(v_turn);
                SELECT NULL;
                LEAVE proc;
            END IF;
        ELSE
            IF v_want <> -1 AND ((v_want >= 0 AND v_version <> v_want) OR (v_session <> p_session
                    AND IS_FREE_LOCK(CONCAT('ll:bb29fb052a1f:e:', v_attempt))
                    AND NOT (@lockline_reset_grace <=> 1 AND EXISTS (SELECT 1 FROM `lockline`.`lockline_sessions` WHERE id = v_session)))) THEN
                ROLLBACK;
                DO RELEASE_LOCK(v_turn);
                SELECT NULL;
                LEAVE proc;
            END IF;
            IF v_op > 0 THEN
                SET v_wake = CONCAT(v_wake, v_id, ' ', v_op, ' ', v_session = p_session, ' ', v_epoch, ' ',
                    v_watchers, ' ', v_attempt, ';');
            END IF;
        END IF;
    END WHILE;
    -- Dead entries of the name: deleted before anyone goes past them.
    DELETE FROM `lockline`.`lockline_entries` WHERE name = p_name AND session <> p_session
        AND IS_FREE_LOCK(CONCAT('ll:bb29fb052a1f:e:', attempt))
        AND NOT (@lockline_reset_grace <=> 1 AND EXISTS (SELECT 1 FROM `lockline`.`lockline_sessions` s WHERE s.id = session));
    INSERT INTO `lockline`.`lockline_entries` (name, kind, session, attempt, value)
        VALUES ('', 'token', '', CONCAT('token:', CONNECTION_ID()), '');
    SET v_token = LAST_INSERT_ID();
    DELETE FROM `lockline`.`lockline_entries` WHERE id = v_token;
    SET v_rest = p_named;
    SET v_pos = 1;
    WHILE v_rest <> '' DO
        SET v_item = SUBSTRING_INDEX(v_rest, ';', 1);
        SET v_rest = SUBSTRING(v_rest, LENGTH(v_item) + 2);
        SET v_id = CAST(SUBSTRING_INDEX(v_item, ' ', 1) AS SIGNED);
        SET v_op = CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(v_item, ' ', 3), ' ', -1) AS SIGNED);
        SET v_len = CAST(SUBSTRING_INDEX(v_item, ' ', -1) AS SIGNED);
        IF v_op = 1 THEN
            UPDATE `lockline`.`lockline_entries` SET value = SUBSTRING(p_values, v_pos, v_len), version = version + 1,
                epoch = epoch + (session = p_session), changed = v_token
                WHERE id = v_id AND name = p_name;
        END IF;
        SET v_pos = v_pos + v_len;
        IF v_op & 2 THEN
            DELETE FROM `lockline`.`lockline_entries` WHERE id = v_id AND name = p_name;
        END IF;
    END WHILE;
    IF p_block IS NOT NULL THEN
        INSERT INTO `lockline`.`lockline_blocks` (name, value) VALUES (p_name, p_block) ON DUPLICATE KEY UPDATE value = VALUES(value);
    END IF;
    COMMIT;
    DO RELEASE_LOCK(v_turn);
    -- Committed: a watcher woken now reads the new values. Nothing here fails
    -- the change.
    BEGIN
        DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
        WHILE v_wake <> '' DO
            SET v_item = SUBSTRING_INDEX(v_wake, ';', 1);
            SET v_wake = SUBSTRING(v_wake, LENGTH(v_item) + 2);
            SET v_id = CAST(SUBSTRING_INDEX(v_item, ' ', 1) AS SIGNED);
            SET v_op = CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(v_item, ' ', 2), ' ', -1) AS SIGNED);
            SET v_epoch = CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(v_item, ' ', 4), ' ', -1) AS SIGNED);
            SET v_watchers = CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(v_item, ' ', 5), ' ', -1) AS SIGNED);
            SET v_attempt = SUBSTRING_INDEX(v_item, ' ', -1);
            IF SUBSTRING_INDEX(SUBSTRING_INDEX(v_item, ' ', 3), ' ', -1) = '1' THEN
                IF v_op & 2 THEN
                    DO RELEASE_LOCK(CONCAT('ll:bb29fb052a1f:e:', v_attempt));
                    DO RELEASE_LOCK(CONCAT('ll:bb29fb052a1f:v:', v_id, ':', v_epoch));
                ELSE
                    DO GET_LOCK(CONCAT('ll:bb29fb052a1f:v:', v_id, ':', v_epoch + 1), 0);
                    DO RELEASE_LOCK(CONCAT('ll:bb29fb052a1f:v:', v_id, ':', v_epoch));
                END IF;
            ELSE
                CALL `lockline`.`lockline_wake`(v_id, v_watchers);
            END IF;
        END WHILE;
    END;
    SELECT v_token;
END//
DELIMITER ;
DELIMITER //
-- A watcher's wait on a lock-mode entry at p_version, in one round trip:
-- takes the lowest free watch slot of the entry (a named lock a writer of
-- another session finds, and wakes its holder by KILL QUERY; the entry's
-- watchers column says how far to look, raised before the version is read),
-- then waits on the value lock of p_epoch the entry's owner holds, bounded by
-- p_bound_ms and a third of the owner's TTL. Answers a code (0: moved on,
-- gone, or woken; 3: there with its guard free, lost with its owner's
-- connection; 1: the bound ran out) and, unless the bound ran out, the entry
-- as it is then (read: 1; value, version, epoch and whether it is live, or
-- NULLs when gone), so that the watcher need not read it again.
CREATE PROCEDURE IF NOT EXISTS `lockline`.`lockline_watch`(
    p_id BIGINT, p_epoch BIGINT, p_version BIGINT, p_session VARCHAR(64) CHARACTER SET ascii,
    p_owner VARCHAR(64) CHARACTER SET ascii, p_bound_ms BIGINT)
    MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    DECLARE v_slot INT DEFAULT 0;
    DECLARE v_slot_lock VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_lock VARCHAR(64) CHARACTER SET ascii DEFAULT CONCAT('ll:bb29fb052a1f:v:', p_id, ':', p_epoch);
    DECLARE v_bound BIGINT;
    DECLARE v_got INT;
    DECLARE v_code INT DEFAULT 0;
    DECLARE v_read BOOLEAN DEFAULT TRUE;
    DECLARE v_value LONGBLOB;
    DECLARE v_version, v_epoch BIGINT;
    DECLARE v_live BOOLEAN;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_value = NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        DO RELEASE_ALL_LOCKS();
        RESIGNAL;
    END;
    -- A wait connection holds nothing between its waits: a slot left by a
    -- wait cut short goes now.
    DO RELEASE_ALL_LOCKS();
    slots: LOOP
        SET v_slot_lock = CONCAT('ll:bb29fb052a1f:w:', p_id, ':', v_slot);
        IF GET_LOCK(v_slot_lock, 0) <=> 1 THEN
            LEAVE slots;
        END IF;
        SET v_slot = v_slot + 1;
    END LOOP;
    UPDATE `lockline`.`lockline_entries` SET watchers = v_slot + 1 WHERE id = p_id AND watchers <= v_slot;
    IF EXISTS (SELECT 1 FROM `lockline`.`lockline_entries` WHERE id = p_id AND version = p_version) THEN
        SET v_bound = LEAST(p_bound_ms, COALESCE((SELECT ttl_ms DIV 3 FROM `lockline`.`lockline_sessions` WHERE id = p_owner), p_bound_ms));
        -- NULL: ended by a writer's KILL QUERY (see the wake procedure).
        SET v_got = GET_LOCK(v_lock, GREATEST(v_bound, 1) / 1000);
        IF v_got = 1 THEN
            DO RELEASE_LOCK(v_lock);
        ELSEIF v_got = 0 THEN
            SET v_code = 1;
            SET v_read = FALSE;
        END IF;
    END IF;
    IF v_read THEN
        -- A write or a removal commits before its writer lets go or wakes.
        SELECT e.value, e.version, e.epoch, e.session = p_session
                OR IS_USED_LOCK(CONCAT('ll:bb29fb052a1f:e:', e.attempt)) IS NOT NULL
                OR (@lockline_reset_grace <=> 1 AND EXISTS (SELECT 1 FROM `lockline`.`lockline_sessions` s WHERE s.id = e.session))
            INTO v_value, v_version, v_epoch, v_live
            FROM `lockline`.`lockline_entries` e WHERE e.id = p_id;
        IF v_value IS NOT NULL AND NOT v_live THEN
            SET v_code = 3;
        END IF;
    END IF;
    DO RELEASE_LOCK(v_slot_lock);
    SELECT v_code, v_read, v_value, v_version, v_epoch, v_live;
END//
DELIMITER ;
DELIMITER //
-- Wakes the watchers of entry p_id (see the watch procedure): KILL QUERY of
-- each connection holding one of its first p_slots watch slots. A connection
-- gone already, or one of another user without CONNECTION ADMIN, is passed
-- over (that watcher wakes at its wait's bound).
CREATE PROCEDURE IF NOT EXISTS `lockline`.`lockline_wake`(p_id BIGINT, p_slots INT)
    MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    DECLARE v_slot INT DEFAULT 0;
    DECLARE v_conn BIGINT;
    DECLARE CONTINUE HANDLER FOR 1094, 1095 BEGIN END;
    WHILE v_slot < p_slots DO
        SET v_conn = IS_USED_LOCK(CONCAT('ll:bb29fb052a1f:w:', p_id, ':', v_slot));
        IF v_conn IS NOT NULL AND v_conn <> CONNECTION_ID() THEN
            SET @lockline_kill = CONCAT('KILL QUERY ', v_conn);
            PREPARE lockline_kill FROM @lockline_kill;
            EXECUTE lockline_kill;
            DEALLOCATE PREPARE lockline_kill;
        END IF;
        SET v_slot = v_slot + 1;
    END WHILE;
END//
DELIMITER ;
DELIMITER //
-- The fence of a transaction on the application's own tables that must commit
-- only while a lock is held, from any driver: CALL it in that transaction with
-- the lock's key (NAME/ID, as Guard::key and the CLI's LOCKLINE_KEY give it),
-- last before COMMIT. It locks the holder's entry row in share mode until the
-- transaction ends, then checks that the entry's guard is still held. A reaper
-- or the next holder deletes that row before going past it, and so waits for
-- this transaction to end: the check and the commit are one step. Not held
-- (the entry is gone, or its guard is free): SQLSTATE 45L02 (error 1644); not
-- an entry key: 22023. Either way it rolls the transaction back first, so
-- that a COMMIT after the error commits nothing (as PostgreSQL's abort does),
-- unless it is an XA transaction, which only its client may roll back.
-- Any length: a key longer than a parameter's type would be refused before
-- the body runs, the transaction left open for a COMMIT sent anyway.
CREATE PROCEDURE IF NOT EXISTS `lockline`.`lockline_fence`(p_key LONGBLOB)
    MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    DECLARE v_digits, v_name LONGBLOB;
    DECLARE v_attempt VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_attempt = NULL;
    SET v_digits = SUBSTRING_INDEX(p_key, '/', -1);
    SET v_name = LEFT(p_key, GREATEST(LENGTH(p_key) - LENGTH(v_digits) - 1, 0));
    -- (REGEXP's $ also matches before a final newline: refused apart.)
    IF p_key IS NULL OR v_name = '' OR NOT (v_digits REGEXP '^[1-9][0-9]{0,18}$')
       OR LOCATE(CHAR(10), v_digits) > 0 OR CAST(v_digits AS DECIMAL(20, 0)) > 9223372036854775807 THEN
        BEGIN
            -- Inside an XA transaction nothing may roll back here
            -- (XAER_RMFAIL): refused all the same, the caller rolls back.
            DECLARE CONTINUE HANDLER FOR SQLSTATE 'XAE07' BEGIN END;
            ROLLBACK;
        END;
        SET v_message = LEFT(CONCAT('lockline: ', QUOTE(CONVERT(p_key USING utf8mb4)),
            ' is not the key of a lock entry (NAME/ID)'), 128);
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT e.attempt INTO v_attempt FROM `lockline`.`lockline_entries` e
        WHERE e.id = CAST(v_digits AS UNSIGNED) AND e.name = v_name LOCK IN SHARE MODE;
    IF v_attempt IS NULL OR IS_USED_LOCK(CONCAT('ll:bb29fb052a1f:e:', v_attempt)) IS NULL THEN
        BEGIN
            -- Inside an XA transaction nothing may roll back here
            -- (XAER_RMFAIL): refused all the same, the caller rolls back.
            DECLARE CONTINUE HANDLER FOR SQLSTATE 'XAE07' BEGIN END;
            ROLLBACK;
        END;
        SET v_message = LEFT(CONCAT('lockline: the lock ', QUOTE(CONVERT(p_key USING utf8mb4)), ' is not held'), 128);
        SIGNAL SQLSTATE '45L02' SET MESSAGE_TEXT = v_message;
    END IF;
END//
DELIMITER ;
DELIMITER //
-- Waits until the guard of entry p_entry (of session p_owner) is free, for at
-- most p_bound_ms and a third of the owner's TTL, whichever is less; then, unless
-- the bound ran out, reads in the same call what the waiter's own entry p_id
-- reads after a wake (p_id NULL: nothing), as the append procedure does: a
-- handoff is the releaser's call and this call's answer, no read after it.
-- Answers the wait's code (0: free, its row gone: released; 3: free with its
-- row still there: lost with its owner's connection, as a release deletes the
-- row before it lets go of the guard; 1: the bound ran out, with the owner's
-- heartbeat count and TTL, NULL when its session row is gone; 4: this very
-- connection holds the guard, a multiplexing proxy; NULL: ended by a KILL
-- QUERY), whether the read was made (not when a dead entry's row stayed locked
-- by a fenced commit in flight for a second: the waiter then reads on its
-- own), whether p_id is still there, and its nearest earlier live entries,
-- "id kind session;" each, deleting dead ones before going past them.
CREATE PROCEDURE IF NOT EXISTS `lockline`.`lockline_wait_turn`(
    p_entry BIGINT, p_owner VARCHAR(64) CHARACTER SET ascii, p_bound_ms BIGINT, p_id BIGINT,
    p_name VARBINARY(512), p_session VARCHAR(64) CHARACTER SET ascii, p_skip_shared BOOLEAN, p_count INT)
    MODIFIES SQL DATA SQL SECURITY INVOKER
proc: BEGIN
    DECLARE v_attempt VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_lock VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_bound, v_beat, v_ttl, v_below, v_earlier BIGINT;
    DECLARE v_got INT;
    DECLARE v_code INT DEFAULT 0;
    DECLARE v_kind VARCHAR(16) CHARACTER SET ascii;
    DECLARE v_session VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_read, v_mine, v_live, v_done BOOLEAN DEFAULT FALSE;
    DECLARE v_found INT DEFAULT 0;
    DECLARE v_nearest LONGTEXT CHARACTER SET ascii DEFAULT '';
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
    -- A failed step leaves the connection's row-lock wait as it was set.
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        SET SESSION innodb_lock_wait_timeout = COALESCE(@lockline_row_wait, @@innodb_lock_wait_timeout);
        RESIGNAL;
    END;
    SET v_attempt = (SELECT attempt FROM `lockline`.`lockline_entries` WHERE id = p_entry);
    IF v_attempt IS NOT NULL THEN
        SET v_lock = CONCAT('ll:bb29fb052a1f:e:', v_attempt);
        IF IS_USED_LOCK(v_lock) <=> CONNECTION_ID() THEN
            SELECT 4, NULL, NULL, FALSE, FALSE, '';
            LEAVE proc;
        END IF;
        SET v_bound = LEAST(p_bound_ms, COALESCE((SELECT ttl_ms DIV 3 FROM `lockline`.`lockline_sessions` WHERE id = p_owner), p_bound_ms));
        SET v_got = GET_LOCK(v_lock, GREATEST(v_bound, 1) / 1000);
        IF v_got IS NULL THEN
            SELECT NULL, NULL, NULL, FALSE, FALSE, '';
            LEAVE proc;
        END IF;
        IF v_got = 0 THEN
            SELECT beat, ttl_ms INTO v_beat, v_ttl FROM `lockline`.`lockline_sessions` WHERE id = p_owner;
            SELECT 1, v_beat, v_ttl, FALSE, FALSE, '';
            LEAVE proc;
        END IF;
        DO RELEASE_LOCK(v_lock);
        IF EXISTS (SELECT 1 FROM `lockline`.`lockline_entries` WHERE id = p_entry) THEN
            SET v_code = 3;
        END IF;
    END IF;
    IF p_id IS NOT NULL THEN
        SET v_mine = EXISTS (SELECT 1 FROM `lockline`.`lockline_entries` WHERE id = p_id);
        SET v_read = TRUE;
        IF v_mine THEN
            SET SESSION innodb_lock_wait_timeout = 1;
            scan: BEGIN
                DECLARE EXIT HANDLER FOR 1205 SET v_read = FALSE;
                SET v_below = p_id;
                WHILE v_found < p_count DO
                    SET v_done = FALSE;
                    SELECT id, kind, session, IS_USED_LOCK(CONCAT('ll:bb29fb052a1f:e:', attempt)) IS NOT NULL OR session = p_session
                        INTO v_earlier, v_kind, v_session, v_live
                        FROM `lockline`.`lockline_entries` WHERE name = p_name AND id < v_below ORDER BY id DESC LIMIT 1;
                    IF v_done THEN
                        LEAVE scan;
                    END IF;
                    SET v_below = v_earlier;
                    IF NOT v_live AND @lockline_reset_grace <=> 1
                       AND EXISTS (SELECT 1 FROM `lockline`.`lockline_sessions` WHERE id = v_session) THEN
                        SET v_live = TRUE;
                    END IF;
                    IF NOT v_live THEN
                        DELETE FROM `lockline`.`lockline_entries` WHERE id = v_earlier AND session <> p_session
                            AND IS_FREE_LOCK(CONCAT('ll:bb29fb052a1f:e:', attempt));
                    ELSEIF NOT (p_skip_shared AND v_kind = 'read') THEN
                        SET v_nearest = CONCAT(v_nearest, v_earlier, ' ', v_kind, ' ', v_session, ';');
                        SET v_found = v_found + 1;
                    END IF;
                END WHILE;
            END;
            SET SESSION innodb_lock_wait_timeout = COALESCE(@lockline_row_wait, @@innodb_lock_wait_timeout);
        END IF;
    END IF;
    SELECT v_code, v_beat, v_ttl, v_read, v_mine, v_nearest;
END//
DELIMITER ;
DELIMITER //
-- A removal of entry p_id of session p_session, in one round trip: the row is
-- deleted (committed on its own), then, when p_unlock (called on the owning
-- connection), its guard and value lock are let go of; another session's
-- lock-mode entry removed has its watchers woken (see the wake procedure).
-- Answers 1 when it deleted the entry, else 0.
CREATE PROCEDURE IF NOT EXISTS `lockline`.`lockline_remove`(p_id BIGINT, p_session VARCHAR(64) CHARACTER SET ascii, p_unlock BOOLEAN)
    MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    DECLARE v_attempt VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_kind VARCHAR(16) CHARACTER SET ascii;
    DECLARE v_session VARCHAR(64) CHARACTER SET ascii;
    DECLARE v_epoch BIGINT;
    DECLARE v_watchers, v_removed INT DEFAULT 0;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_attempt = NULL;
    SELECT attempt, kind, session, epoch, watchers INTO v_attempt, v_kind, v_session, v_epoch, v_watchers
        FROM `lockline`.`lockline_entries` WHERE id = p_id;
    DELETE FROM `lockline`.`lockline_entries` WHERE id = p_id AND session = p_session;
    SET v_removed = ROW_COUNT();
    IF p_unlock AND v_attempt IS NOT NULL THEN
        DO RELEASE_LOCK(CONCAT('ll:bb29fb052a1f:e:', v_attempt));
        IF v_kind IN ('election', 'dlm') THEN
            DO RELEASE_LOCK(CONCAT('ll:bb29fb052a1f:v:', p_id, ':', v_epoch));
        END IF;
    END IF;
    IF NOT p_unlock AND v_removed = 1 AND v_kind = 'dlm' AND v_watchers > 0 THEN
        CALL `lockline`.`lockline_wake`(p_id, v_watchers);
    END IF;
    SELECT v_removed;
END//
DELIMITER ;
-- Created last: its row says the rest exists (MariaDB DDL is not transactional).
CREATE TABLE IF NOT EXISTS `lockline`.`lockline_meta` (
    singleton TINYINT NOT NULL PRIMARY KEY,
    layout INT NOT NULL,
    started_us BIGINT NULL,
    -- The run of lockline on this server: see the run table.
    run_id VARCHAR(32) CHARACTER SET ascii NULL,
    -- The longest TTL of a session opened since the server started.
    run_max_ttl_ms BIGINT NOT NULL DEFAULT 0,
    -- After a restart: no grant for grace_ms (by each session's own clock)
    -- until a session that waited it out sets it to 0; grace_from_us names it.
    grace_ms BIGINT NOT NULL DEFAULT 0,
    grace_from_us BIGINT NULL
) ENGINE=InnoDB;
INSERT IGNORE INTO `lockline`.`lockline_meta` (singleton, layout) VALUES (1, 5);
