-- lockline's tables and procedure (layout 2) for MariaDB 10.6 or later, or MySQL 8.0.29
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
        IF p_kind = 'election' THEN
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
INSERT IGNORE INTO `lockline`.`lockline_meta` (singleton, layout) VALUES (1, 2);
