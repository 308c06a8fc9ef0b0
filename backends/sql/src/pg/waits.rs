//! Waits on the server: on an entry's guard (reading the waiter's turn in
//! the same call), on an election value's version, and the look at waits
//! that have no connection of their own.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{AssertSqlSafe, Row as _};

use super::Postgres;
use crate::dialect::{shape, Beat, DbResult, EntryStatus, Row, Status, Turn, TurnRead, Waited, Waits};

/// An entry's status as the statuses statement gives it.
fn status(code: i32) -> Status {
    match code {
        0 => Status::Free,
        3 => Status::Dead,
        _ => Status::Held,
    }
}

/// How a wait ended, as the wait function answers it (its code, and the
/// owner's heartbeat when the bound ran out).
pub(super) fn waited(row: &PgRow) -> DbResult<Waited> {
    let code: i32 = row.try_get(0)?;
    match code {
        0 => Ok(Waited::Released),
        3 => Ok(Waited::Lost),
        1 => Ok(Waited::TimedOut(Beat::of(row.try_get(1)?, row.try_get(2)?))),
        other => Err(shape(format!("wait returned {other}"))),
    }
}

#[async_trait]
impl Waits for Postgres {
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
                    Beat::of(r.try_get(4)?, r.try_get(5)?),
                ))
            })
            .collect()
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
        let wait = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.wait_turn)))
            .bind(id)
            .bind(owner)
            .bind(bound_ms);
        let found = turn.bind(wait).fetch_all(conn).await?;
        let mut found = found.iter();
        let first = found.next().ok_or_else(|| shape("the wait returned no row"))?;
        let waited = waited(first)?;
        let read: Option<bool> = first.try_get(3)?;
        if matches!(waited, Waited::TimedOut(_)) || read != Some(true) {
            return Ok((waited, None));
        }
        let rows = found.map(|r| Row::read(r, 4)).collect::<DbResult<Vec<Row>>>()?;
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
}
