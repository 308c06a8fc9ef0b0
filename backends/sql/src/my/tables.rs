//! The tables a session opens on: the layout read, created or moved (see
//! [`crate::tables`]), then what MariaDB/MySQL needs besides: the run
//! table's engine, the procedures, the id counter moved past a restart, and
//! the owning connection's statements prepared.

use async_trait::async_trait;
use lockline::Error;
use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Executor};

use super::{check_database, MySql};
use super::{release_lock, Names, LOCK_HOLDER, RELEASE_LOCK, TAKE_LOCK};
use crate::dialect::{shape, DbResult, Engine};
use crate::layout::{movable, raise_layout, LAYOUT_VERSION};
use crate::tables::{self, Columns, Layout, Place};

impl MySql {
    /// Checks the tables and their layout (creating or moving them when
    /// allowed), the run table's engine and the procedures; moves the id
    /// counter past a server restart; prepares the owning connection's
    /// statements.
    pub(super) async fn prepare_tables(&self, conn: &mut MySqlConnection) -> lockline::Result<()> {
        let target = crate::my_target(&self.connect);
        let doing = |what| self.doing(what, &target);
        let map = |what, e| crate::error::map(doing(what), e);
        if self.names.get().is_none() {
            let database = self.database();
            check_database(&database)?;
            let _ = self.names.set(Names::new(&database, &self.tables.prefix));
        }
        let names = self.names().map_err(|e| map("resolve the tables", e))?;
        tables::check(names, conn, self.backend(), &target, self.settings.create_tables).await?;
        // The run marker must be emptied by a restart: a MEMORY table (a
        // server that forces another engine would keep it).
        let engine: Option<String> = sqlx::query_scalar(
            "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        )
        .bind(&names.database)
        .bind(format!("{}run", self.tables.prefix))
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| map("check lockline's tables", e))?
        .flatten();
        if !engine.as_deref().is_some_and(|e| e.eq_ignore_ascii_case("MEMORY")) {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "{target}: the table {} must be ENGINE=MEMORY (a server restart must empty it), not {}; \
                     recreate it with the DDL script (Sql::ddl), on a server that allows MEMORY tables",
                    names.run,
                    engine.as_deref().unwrap_or("unknown")
                ),
            });
        }
        // Listed only to a user who may run them (or alter them).
        for (procedure, full) in [
            ("append", &names.append_procedure),
            ("update_queue", &names.update_procedure),
            ("watch", &names.watch_procedure),
            ("wake", &names.wake_procedure),
            ("fence", &names.fence_procedure),
        ] {
            let found: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.ROUTINES \
                 WHERE ROUTINE_SCHEMA = ? AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'",
            )
            .bind(&names.database)
            .bind(format!("{}{procedure}", self.tables.prefix))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map("check lockline's procedures", e))?;
            if found == 0 {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "{target}: the procedure {full} is missing, or this user may not execute it: create it with the DDL script (Sql::ddl) and grant EXECUTE on it"
                    ),
                });
            }
        }
        self.bump_after_restart(conn, names)
            .await
            .map_err(|e| map("move the id counter past a server restart", e))?;
        // Every statement the owning connection runs for a caller, prepared
        // now: the driver recovers from a caller that goes away while a
        // statement executes, not while it is being prepared (which happens
        // at a statement's first use), and a broken owning connection loses
        // the session.
        let sql = &names.sql;
        let owner_statements: [&str; 23] = [
            &sql.append,
            &sql.find,
            &sql.exists,
            &sql.nearest,
            &sql.delete_dead,
            &sql.list,
            &sql.remove,
            &sql.value_of,
            &sql.bump_value,
            &sql.get_value,
            &sql.held,
            &sql.put,
            &sql.delete,
            &sql.read,
            &sql.delete_entries,
            &sql.close_session,
            &sql.read_queue,
            &sql.update_queue,
            &sql.watch_read,
            &sql.wake,
            RELEASE_LOCK,
            TAKE_LOCK,
            LOCK_HOLDER,
        ];
        for statement in owner_statements {
            conn.prepare(sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(statement.to_owned())))
                .await
                .map_err(|e| map("prepare lockline's statements", e))?;
        }
        Ok(())
    }
}

impl Names {
    /// Takes the named lock the creators and movers of these tables take in
    /// turn (for at most 30 s); the lock's name. `busy`: what another
    /// connection is doing when it cannot be taken.
    async fn take_ddl_lock(&self, conn: &mut MySqlConnection, busy: &str) -> DbResult<String> {
        let lock = format!("{}ddl", self.lock_prefix);
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 30)")
            .bind(&lock)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(shape(busy));
        }
        Ok(lock)
    }
}

#[async_trait]
impl Layout for Names {
    type Conn = MySqlConnection;

    const NO_SUCH_TABLE: &'static str = "42S02";
    const CREATED_WITHOUT_ROW: bool = true;
    const PLACE: &'static str = "database";
    const CREATE_NEEDS: &'static str = "lockline creates its tables and its procedure on first use, which needs the CREATE and CREATE ROUTINE privileges on the database (or run the DDL script from Sql::ddl as a user who has them)";
    const MOVE_CREATES: &'static str = "create the fence and wait procedures in";
    const MOVE_NEEDS: &'static str = "CREATE ROUTINE on the database (or have a user who has it do it";
    const CATALOG: &'static str =
        "SELECT CAST(column_name AS CHAR), CAST(data_type AS CHAR) FROM information_schema.columns \
                                   WHERE table_schema = ? AND table_name = ?";
    const COLUMNS: &'static Columns = &[
        (
            "entries",
            &[
                ("id", "bigint"),
                ("name", "varbinary"),
                ("kind", "varchar"),
                ("session", "varchar"),
                ("attempt", "varchar"),
                ("value", "longblob"),
                ("version", "bigint"),
                ("epoch", "bigint"),
                ("changed", "bigint"),
                ("watchers", "int"),
            ],
        ),
        (
            "sessions",
            &[
                ("id", "varchar"),
                ("conn", "bigint"),
                ("ttl_ms", "bigint"),
                ("renewed_us", "bigint"),
                ("beat", "bigint"),
            ],
        ),
        ("data", &[("key", "varbinary"), ("value", "longblob")]),
        ("run", &[("server_id", "bigint"), ("run_id", "varchar")]),
        ("blocks", &[("name", "varbinary"), ("value", "longblob")]),
    ];

    fn place(&self) -> Place<'_> {
        Place::new(&self.database, &self.prefix, &self.meta)
    }

    fn same(found: &str, expected: &str) -> bool {
        found.eq_ignore_ascii_case(expected)
    }

    /// Runs the script a step at a time, under the creators' lock.
    async fn create(&self, conn: &mut MySqlConnection) -> DbResult<()> {
        let lock = self
            .take_ddl_lock(conn, "another connection is creating lockline's tables")
            .await?;
        let mut created = Ok(());
        for step in self.ddl_steps() {
            created = conn.execute(sqlx::raw_sql(AssertSqlSafe(step))).await.map(drop);
            if created.is_err() {
                break;
            }
        }
        release_lock(conn, &lock).await?;
        created
    }

    /// Creates the fence and the procedures of layout 5 and raises the
    /// layout, under the creators' lock.
    async fn upgrade(&self, conn: &mut MySqlConnection) -> DbResult<Option<i32>> {
        let lock = self
            .take_ddl_lock(
                conn,
                "another connection is moving lockline's tables to the current layout",
            )
            .await?;
        let moved = async {
            let layout = self.read_layout(conn).await?;
            if !movable(layout) {
                return Ok(layout);
            }
            for step in self.upgrade_steps()? {
                conn.execute(sqlx::raw_sql(AssertSqlSafe(step))).await?;
            }
            sqlx::query(AssertSqlSafe(raise_layout(&self.meta)))
                .execute(&mut *conn)
                .await?;
            Ok(Some(LAYOUT_VERSION))
        }
        .await;
        release_lock(conn, &lock).await?;
        moved
    }
}
