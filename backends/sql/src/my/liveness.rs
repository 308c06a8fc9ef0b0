//! A session's life on the server: its registration (with the session lock
//! its connection holds, and the restart grace), its heartbeat, its end,
//! and the end of a silent one.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::mysql::{MySqlArguments, MySqlConnection};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Executor};

use super::MySql;
use super::{Names, LOCK_HOLDER, NOW_US, TAKE_LOCK};
use crate::alike::Alike;
use crate::dialect::{shape, Beat, DbResult, Grace, Liveness, Reaped};

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

impl MySql {
    /// Ends connection `expected` if it holds the lock of session
    /// `session` (one gone already between the look and the kill: nothing
    /// to end; one refused, another user's: the error). The connection
    /// that held the lock, if any.
    async fn end_holder(
        &self,
        conn: &mut MySqlConnection,
        names: &Names,
        session: &str,
        expected: i64,
    ) -> DbResult<Option<i64>> {
        let holder: Option<i64> = sqlx::query_scalar(LOCK_HOLDER)
            .bind(names.session_lock(session))
            .fetch_one(&mut *conn)
            .await?;
        if holder == Some(expected) {
            let kill = conn
                .execute(sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {expected}"))))
                .await;
            if let Err(error) = kill {
                if !no_such_connection(&error) {
                    return Err(error);
                }
            }
        }
        Ok(holder)
    }
}

/// Deletes the entries of session `session`, then its row by `row` (a
/// statement with its parameters bound), statement by statement.
async fn delete_session(
    conn: &mut MySqlConnection,
    names: &Names,
    session: &str,
    row: Query<'_, sqlx::MySql, MySqlArguments>,
) -> DbResult<()> {
    sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.delete_entries)))
        .bind(session)
        .execute(&mut *conn)
        .await?;
    row.execute(&mut *conn).await?;
    Ok(())
}

#[async_trait]
impl Liveness for MySql {
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
            let row = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.reap_session)))
                .bind(&stale_id)
                .bind(renewed_us);
            let cleaned = delete_session(conn, names, &stale_id, row).await;
            if let Err(error) = cleaned {
                tracing::debug!(session = %stale_id, %error, "could not clean up a dead session's rows");
            }
        }
        // The session's own lock: held by its connection while it lives.
        let lock = names.session_lock(session);
        let got: Option<i64> = sqlx::query_scalar(TAKE_LOCK).bind(&lock).fetch_one(&mut *conn).await?;
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
        conn.grace(&names.sql.grace).await
    }

    async fn end_grace(&self, conn: &mut MySqlConnection, id: i64) -> DbResult<()> {
        conn.run_with(&self.names()?.sql.end_grace, id).await
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

    async fn beats(&self, conn: &mut MySqlConnection) -> DbResult<Vec<(String, Beat, i64)>> {
        conn.beats(&self.names()?.sql.beats).await
    }

    async fn own_ids(&self, conn: &mut MySqlConnection, session: &str) -> DbResult<Vec<i64>> {
        conn.ids(&self.names()?.sql.own_ids, session).await
    }

    async fn beat_of(&self, conn: &mut MySqlConnection, owner: &str) -> DbResult<Option<Beat>> {
        conn.beat(&self.names()?.sql.beat_of, owner).await
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
        // Its connection, known by the session's own lock: ended if still
        // there. Refused (another user's connection): the rows stay, and
        // the waiter hears why.
        self.end_holder(conn, names, owner, owner_conn).await?;
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.reap_done))).bind(owner);
        delete_session(conn, names, owner, row).await?;
        Ok(Reaped::Ended)
    }

    async fn close(&self, conn: &mut MySqlConnection, session: &str) -> DbResult<()> {
        let names = self.names()?;
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.close_session))).bind(session);
        delete_session(conn, names, session, row).await
    }

    async fn end(&self, conn: &mut MySqlConnection, session: &str, owner_server_id: i64) -> DbResult<bool> {
        let holder = self.end_holder(conn, self.names()?, session, owner_server_id).await?;
        if holder.is_some_and(|holder| holder != owner_server_id) {
            // Not the connection this session opened: leave it alone.
            return Ok(false);
        }
        self.close(conn, session).await?;
        Ok(true)
    }
}
