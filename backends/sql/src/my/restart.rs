//! A server restart (or a replica's promotion) told apart at a session's
//! open: the id counter moved past the clock, and the restart grace begun.

use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Row as _};

use super::MySql;
use super::{Names, NOW_US};
use crate::dialect::DbResult;

/// How far apart two readings of the server's start time (its clock minus
/// its `Uptime`, in whole seconds) may be and still be the same start.
const SAME_START_US: i64 = 2_500_000;

impl MySql {
    /// Moves the id counter past the server's clock in microseconds, and
    /// begins a restart grace, when the server started (or a replica was
    /// promoted) since the last session was opened. Openers racing after a
    /// restart may each move the counter (harmless); the meta row is
    /// changed by one of them only (compared and set on the start and run
    /// it read), so none undoes another's record of the live sessions'
    /// TTLs. Nothing is held across round trips: an opener whose
    /// connection goes silent keeps no one else from opening.
    pub(super) async fn bump_after_restart(&self, conn: &mut MySqlConnection, names: &Names) -> DbResult<()> {
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
}
