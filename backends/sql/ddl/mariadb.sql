-- lockline's tables (layout 2) for MariaDB 10.6 or later, or MySQL 8, in database `lockline`.
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
    renewed_us BIGINT NOT NULL
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS `lockline`.`lockline_names` (
    name VARBINARY(512) NOT NULL PRIMARY KEY
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS `lockline`.`lockline_data` (
    `key` VARBINARY(3072) NOT NULL PRIMARY KEY,
    value LONGBLOB NOT NULL
) ENGINE=InnoDB;
-- Created last: its row says the rest exists (MariaDB DDL is not transactional).
CREATE TABLE IF NOT EXISTS `lockline`.`lockline_meta` (
    singleton TINYINT NOT NULL PRIMARY KEY,
    layout INT NOT NULL,
    started_us BIGINT NULL
) ENGINE=InnoDB;
INSERT IGNORE INTO `lockline`.`lockline_meta` (singleton, layout) VALUES (1, 2);
