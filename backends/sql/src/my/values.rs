//! An election entry's value (its version lock moved after the write
//! commits), and fenced writes to the data table.

use std::sync::Arc;

use async_trait::async_trait;
use lockline::Write;
use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Connection};

use super::MySql;
use super::{release_lock, TAKE_LOCK};
use crate::alike::Alike;
use crate::dialect::{DbResult, Values};

#[async_trait]
impl Values for MySql {
    async fn set_value(&self, conn: &mut MySqlConnection, id: i64, session: &str, value: &[u8]) -> DbResult<bool> {
        self.check_size(value.len())?;
        let names = self.names()?;
        let mut tx = conn.begin().await?;
        let old: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.value_of)))
            .bind(id)
            .bind(session)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(old) = old else {
            tx.commit().await?;
            return Ok(false);
        };
        sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.bump_value)))
            .bind(value)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        // Committed first: a watcher woken by the old version's lock reads
        // the new value.
        let next = names.version_lock(id, old + 1);
        sqlx::query(TAKE_LOCK).bind(&next).execute(&mut *conn).await?;
        release_lock(conn, &names.version_lock(id, old)).await?;
        Ok(true)
    }

    async fn get_value(&self, conn: &mut MySqlConnection, id: i64, session: &str) -> DbResult<Option<(Vec<u8>, i64)>> {
        conn.value(&self.names()?.sql.get_value, id, session).await
    }

    async fn write_if_held(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        session: &str,
        writes: &[Write],
    ) -> DbResult<bool> {
        for write in writes {
            let value = match write {
                Write::Put { value, .. } => value.len(),
                _ => 0,
            };
            self.check_size(write.key().len() + value)?;
        }
        let names = self.names()?;
        let mut tx = conn.begin().await?;
        let held: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.held)))
            .bind(id)
            .bind(session)
            .fetch_one(&mut *tx)
            .await?;
        if held == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        for write in writes {
            match write {
                Write::Put { key, value } => {
                    sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.put)))
                        .bind(key)
                        .bind(value)
                        .execute(&mut *tx)
                        .await?;
                }
                other => {
                    sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.delete)))
                        .bind(other.key())
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn read(&self, conn: &mut MySqlConnection, key: &str) -> DbResult<Option<Vec<u8>>> {
        conn.data(&self.names()?.sql.read, key).await
    }
}
