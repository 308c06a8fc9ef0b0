//! The tables a session opens on: the schema resolved, the layout read,
//! created or moved (see [`crate::tables`]), and the functions checked.

use async_trait::async_trait;
use lockline::Error;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use super::{Names, Postgres};
use crate::dialect::{DbResult, Engine};
use crate::layout::{movable, raise_layout, Tables, LAYOUT_VERSION};
use crate::tables::{self, Columns, Layout, Place};

impl Postgres {
    /// Resolves the schema (the connection's current one unless given),
    /// checks the tables and their layout (creating or moving them when
    /// allowed), and that every function is there.
    pub(super) async fn prepare_tables(&self, conn: &mut PgConnection) -> lockline::Result<()> {
        let target = crate::pg_target(&self.connect);
        let doing = |what| self.doing(what, &target);
        let map = |what, e| crate::error::map(doing(what), e);
        if self.names.get().is_none() {
            let schema = if self.tables.qualifier.is_empty() {
                let current: Option<String> = sqlx::query_scalar("SELECT current_schema()::text")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(|e| map("read the current schema", e))?;
                current.ok_or_else(|| Error::InvalidOptions {
                    reason: format!(
                        "{target}: the connection has no current schema (an empty search_path); name one with Sql::with_schema"
                    ),
                })?
            } else {
                self.tables.qualifier.clone()
            };
            if Tables::new(Some(&schema), &self.tables.prefix).is_err() {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "{target}: the current schema {schema:?} is not a plain lower-case identifier; name one with Sql::with_schema"
                    ),
                });
            }
            let _ = self.names.set(Names::new(&schema, &self.tables.prefix));
        }
        let names = self.names().map_err(|e| map("resolve the tables", e))?;
        tables::check(names, conn, self.backend(), &target, self.settings.create_tables).await?;
        let missing: Option<String> =
            sqlx::query_scalar("SELECT f FROM unnest($1::text[]) f WHERE to_regproc(f) IS NULL LIMIT 1")
                .bind(
                    [
                        "append",
                        "nearest",
                        "earlier",
                        "remove",
                        "abandon",
                        "wait",
                        "reap",
                        "set_value",
                        "write",
                        "close",
                        "open",
                        "update_queue",
                        "watch",
                        "fence",
                    ]
                    .map(|f| names.function(f))
                    .to_vec(),
                )
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| map("check lockline's functions", e))?;
        if let Some(function) = missing {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "{target}: lockline's function {function} is missing; run the DDL script (Sql::ddl) again"
                ),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Layout for Names {
    type Conn = PgConnection;

    const NO_SUCH_TABLE: &'static str = "42P01";
    const CREATED_WITHOUT_ROW: bool = false;
    const PLACE: &'static str = "schema";
    const CREATE_NEEDS: &'static str = "lockline creates its tables on first use, which needs CREATE on the schema (or run the DDL script from Sql::ddl as a user who has it)";
    const MOVE_CREATES: &'static str = "create the fence and wait functions in";
    const MOVE_NEEDS: &'static str = "CREATE on the schema (or have the tables' owner do it";
    const CATALOG: &'static str = "SELECT column_name::text, data_type::text FROM information_schema.columns \
                                   WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position";
    const COLUMNS: &'static Columns = &[
        (
            "entries",
            &[
                ("id", "bigint"),
                ("name", "text"),
                ("kind", "text"),
                ("session", "text"),
                ("attempt", "text"),
                ("value", "bytea"),
                ("version", "bigint"),
                ("epoch", "bigint"),
                ("changed", "bigint"),
            ],
        ),
        (
            "sessions",
            &[
                ("id", "text"),
                ("pid", "integer"),
                ("ttl_ms", "bigint"),
                ("renewed_us", "bigint"),
                ("backend_start", "timestamp with time zone"),
                ("beat", "bigint"),
            ],
        ),
        ("data", &[("key", "text"), ("value", "bytea")]),
        ("blocks", &[("name", "text"), ("value", "bytea")]),
    ];

    fn place(&self) -> Place<'_> {
        Place::new(&self.schema, &self.prefix, &self.meta)
    }

    fn same(found: &str, expected: &str) -> bool {
        found == expected
    }

    /// Creates the tables and functions, one creator at a time, in one
    /// transaction.
    async fn create(&self, conn: &mut PgConnection) -> DbResult<()> {
        let mut tx = conn.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
            .bind(self.class)
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(self.ddl())).execute(&mut *tx).await?;
        tx.commit().await
    }

    /// Creates the fence and the wait that reads a turn, and raises the
    /// layout, one mover at a time, in one transaction.
    async fn upgrade(&self, conn: &mut PgConnection) -> DbResult<Option<i32>> {
        let mut tx = conn.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
            .bind(self.class)
            .execute(&mut *tx)
            .await?;
        let layout: Option<i32> =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT layout FROM {} FOR UPDATE", self.meta)))
                .fetch_optional(&mut *tx)
                .await?;
        if !movable(layout) {
            // Moved meanwhile by another session, or not ours to move.
            return Ok(layout);
        }
        sqlx::raw_sql(AssertSqlSafe(self.upgrade_ddl()?))
            .execute(&mut *tx)
            .await?;
        sqlx::query(AssertSqlSafe(raise_layout(&self.meta)))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(LAYOUT_VERSION))
    }
}
