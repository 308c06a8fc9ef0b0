//! The statements both engines run alike: the same parameters bound in the
//! same order, the same columns read back. Each engine gives its own text
//! (its `Statements`, its layout's catalog query); running it and reading
//! its answer are written here once, for any connection of either driver.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row as _, Type};

use crate::dialect::{Beat, Columns, DbResult, Grace, Row};

/// A connection that runs the statements both engines share (see the
/// module): each method takes the engine's text of the statement.
#[async_trait]
pub(crate) trait Alike: Send {
    /// A live entry's value and version (the statement takes the entry's id
    /// and the caller's session); `None` when gone.
    async fn value(&mut self, statement: &Arc<str>, id: i64, session: &str) -> DbResult<Option<(Vec<u8>, i64)>>;

    /// Entries (id, kind, session), first first (the statement takes a
    /// name and the caller's session).
    async fn entries(&mut self, statement: &Arc<str>, name: &str, session: &str) -> DbResult<Vec<Row>>;

    /// A key's value in the data table.
    async fn data(&mut self, statement: &Arc<str>, key: &str) -> DbResult<Option<Vec<u8>>>;

    /// The ids of a session's entries.
    async fn ids(&mut self, statement: &Arc<str>, session: &str) -> DbResult<Vec<i64>>;

    /// A session's heartbeat (count, TTL); `None` when its row is gone.
    async fn beat(&mut self, statement: &Arc<str>, session: &str) -> DbResult<Option<Beat>>;

    /// Every session's heartbeat, with one of its entries (0 if none).
    async fn beats(&mut self, statement: &Arc<str>) -> DbResult<Vec<(String, Beat, i64)>>;

    /// The restart grace in force (its length, and its start in
    /// microseconds), if any.
    async fn grace(&mut self, statement: &Arc<str>) -> DbResult<Option<Grace>>;

    /// Runs a statement that takes one integer and answers nothing.
    async fn run_with(&mut self, statement: &Arc<str>, value: i64) -> DbResult<()>;

    /// The layout a meta table holds (`None`: no row).
    async fn layout(&mut self, meta: &str) -> DbResult<Option<i32>>;

    /// The columns of a table, with their types, as the catalog query
    /// `statement` answers them (it takes the schema or database, and the
    /// table's name).
    async fn columns(&mut self, statement: &'static str, place: &str, table: &str) -> DbResult<Vec<(String, String)>>;
}

#[async_trait]
impl<C> Alike for C
where
    C: sqlx::Connection,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    <C::Database as Database>::Row: Columns,
    <C::Database as Database>::Arguments: IntoArguments<C::Database>,
    for<'q> i64: Encode<'q, C::Database> + Type<C::Database>,
    for<'q> &'q str: Encode<'q, C::Database> + Type<C::Database>,
    for<'r> i32: Decode<'r, C::Database> + Type<C::Database>,
    usize: ColumnIndex<<C::Database as Database>::Row>,
{
    async fn value(&mut self, statement: &Arc<str>, id: i64, session: &str) -> DbResult<Option<(Vec<u8>, i64)>> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .bind(id)
            .bind(session)
            .fetch_optional(&mut *self)
            .await?;
        row.map(|r| Ok((r.bytes(0)?, r.int(1)?))).transpose()
    }

    async fn entries(&mut self, statement: &Arc<str>, name: &str, session: &str) -> DbResult<Vec<Row>> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .bind(name)
            .bind(session)
            .fetch_all(&mut *self)
            .await?;
        found.iter().map(|r| Row::read(r, 0)).collect()
    }

    async fn data(&mut self, statement: &Arc<str>, key: &str) -> DbResult<Option<Vec<u8>>> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .bind(key)
            .fetch_optional(&mut *self)
            .await?;
        row.map(|r| r.bytes(0)).transpose()
    }

    async fn ids(&mut self, statement: &Arc<str>, session: &str) -> DbResult<Vec<i64>> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .bind(session)
            .fetch_all(&mut *self)
            .await?;
        found.iter().map(|r| r.int(0)).collect()
    }

    async fn beat(&mut self, statement: &Arc<str>, session: &str) -> DbResult<Option<Beat>> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .bind(session)
            .fetch_optional(&mut *self)
            .await?;
        row.map(|r| {
            Ok(Beat {
                count: r.int(0)?,
                ttl_ms: r.int(1)?,
            })
        })
        .transpose()
    }

    async fn beats(&mut self, statement: &Arc<str>) -> DbResult<Vec<(String, Beat, i64)>> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .fetch_all(&mut *self)
            .await?;
        found
            .iter()
            .map(|r| {
                let beat = Beat {
                    count: r.int(1)?,
                    ttl_ms: r.int(2)?,
                };
                Ok((r.text(0)?, beat, r.int(3)?))
            })
            .collect()
    }

    async fn grace(&mut self, statement: &Arc<str>) -> DbResult<Option<Grace>> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .fetch_optional(&mut *self)
            .await?;
        row.map(|r| Ok(Grace::of((r.int(0)?, r.int_or_null(1)?)))).transpose()
    }

    async fn run_with(&mut self, statement: &Arc<str>, value: i64) -> DbResult<()> {
        sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .bind(value)
            .execute(&mut *self)
            .await
            .map(drop)
    }

    async fn layout(&mut self, meta: &str) -> DbResult<Option<i32>> {
        let row = sqlx::query(AssertSqlSafe(format!("SELECT layout FROM {meta}")))
            .fetch_optional(&mut *self)
            .await?;
        row.map(|r| r.try_get(0)).transpose()
    }

    async fn columns(&mut self, statement: &'static str, place: &str, table: &str) -> DbResult<Vec<(String, String)>> {
        let found = sqlx::query(statement)
            .bind(place)
            .bind(table)
            .fetch_all(&mut *self)
            .await?;
        found.iter().map(|r| Ok((r.text(0)?, r.text(1)?))).collect()
    }
}
