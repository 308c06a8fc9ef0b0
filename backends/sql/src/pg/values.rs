//! An election entry's value, and fenced writes to the data table.

use std::sync::Arc;

use async_trait::async_trait;
use lockline::Write;
use sqlx::postgres::PgConnection;
use sqlx::AssertSqlSafe;

use super::Postgres;
use crate::alike::Alike;
use crate::dialect::{DbResult, Values};

#[async_trait]
impl Values for Postgres {
    async fn set_value(&self, conn: &mut PgConnection, id: i64, session: &str, value: &[u8]) -> DbResult<bool> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.set_value)))
            .bind(id)
            .bind(session)
            .bind(value)
            .fetch_one(conn)
            .await
    }

    async fn get_value(&self, conn: &mut PgConnection, id: i64, session: &str) -> DbResult<Option<(Vec<u8>, i64)>> {
        conn.value(&self.names()?.sql.get_value, id, session).await
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
        conn.data(&self.names()?.sql.read, key).await
    }
}
