//! The entries of a queue: an append and the reads of the nearest earlier
//! entries (each one call of a function), removals.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::AssertSqlSafe;

use super::Postgres;
use crate::alike::Alike;
use crate::dialect::{shape, Append, DbResult, Entries, Row, Turn};

/// The entries a function answers, first first.
fn rows(found: Vec<PgRow>) -> DbResult<Vec<Row>> {
    found.iter().map(|r| Row::read(r, 0)).collect()
}

#[async_trait]
impl Entries for Postgres {
    async fn append(&self, conn: &mut PgConnection, append: &Append<'_>) -> DbResult<(i64, Vec<Row>)> {
        let found = append
            .bind(sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.append))))
            .fetch_all(conn)
            .await?;
        let mut found = rows(found)?.into_iter();
        let mine = found.next().ok_or_else(|| shape("append returned no row"))?;
        Ok((mine.id, found.collect()))
    }

    async fn earlier(&self, conn: &mut PgConnection, turn: &Turn) -> DbResult<Option<Vec<Row>>> {
        let found = turn
            .bind(sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.earlier))))
            .fetch_all(conn)
            .await?;
        let mut found = rows(found)?.into_iter();
        Ok(found.next().map(|_mine| found.collect()))
    }

    async fn list(&self, conn: &mut PgConnection, name: &str, session: &str) -> DbResult<Vec<Row>> {
        conn.entries(&self.names()?.sql.list, name, session).await
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
}
