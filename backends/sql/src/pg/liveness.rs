//! A session's life on the server: its registration (and the restart
//! grace), its heartbeat, its end, and the end of a silent one.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::PgConnection;
use sqlx::AssertSqlSafe;

use super::Postgres;
use crate::alike::Alike;
use crate::dialect::{shape, Beat, DbResult, Grace, Liveness, Reaped};

#[async_trait]
impl Liveness for Postgres {
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
        conn.grace(&names.sql.grace).await
    }

    async fn end_grace(&self, conn: &mut PgConnection, id: i64) -> DbResult<()> {
        conn.run_with(&self.names()?.sql.end_grace, id).await
    }

    async fn heartbeat(&self, conn: &mut PgConnection, session: &str) -> DbResult<Option<i64>> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.heartbeat)))
            .bind(session)
            .fetch_optional(conn)
            .await
    }

    async fn beats(&self, conn: &mut PgConnection) -> DbResult<Vec<(String, Beat, i64)>> {
        conn.beats(&self.names()?.sql.beats).await
    }

    async fn own_ids(&self, conn: &mut PgConnection, session: &str) -> DbResult<Vec<i64>> {
        conn.ids(&self.names()?.sql.own_ids, session).await
    }

    async fn beat_of(&self, conn: &mut PgConnection, owner: &str) -> DbResult<Option<Beat>> {
        conn.beat(&self.names()?.sql.beat_of, owner).await
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

    async fn close(&self, conn: &mut PgConnection, session: &str) -> DbResult<()> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.close)))
            .bind(session)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn end(&self, conn: &mut PgConnection, session: &str, owner_server_id: i64) -> DbResult<bool> {
        let pid = i32::try_from(owner_server_id).map_err(|_| shape(format!("pid {owner_server_id} out of range")))?;
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.end)))
            .bind(session)
            .bind(pid)
            .fetch_one(conn)
            .await
    }
}
