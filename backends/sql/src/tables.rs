//! lockline's tables as a session finds them when it opens, on either
//! engine: the layout it reads, creates or moves (one rule for both), and
//! the columns it checks. Each engine gives its own steps and words
//! ([`Layout`]).

use async_trait::async_trait;
use lockline::Error;

use crate::alike::Alike;
use crate::dialect::DbResult;
use crate::error::{has_code, map, Doing};
use crate::layout::{movable, LAYOUT_VERSION};

/// The columns lockline's tables must have, by table (its name less the
/// prefix): each column's name and type as the engine's catalog gives it.
pub(crate) type Columns = [(&'static str, &'static [(&'static str, &'static str)])];

/// Where a set of lockline's tables is, for statements and messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place<'a> {
    /// The schema or database the tables are in.
    pub(crate) name: &'a str,
    /// The table prefix.
    pub(crate) prefix: &'a str,
    /// The meta table, as statements name it.
    pub(crate) meta: &'a str,
}

impl<'a> Place<'a> {
    /// The tables in `name` (a schema or database), by their prefix and
    /// their meta table as statements name it.
    pub(crate) fn new(name: &'a str, prefix: &'a str, meta: &'a str) -> Self {
        Place { name, prefix, meta }
    }
}

/// One engine's set of lockline's tables, and the steps that read, create
/// or move them.
#[async_trait]
pub(crate) trait Layout: Send + Sync {
    /// A connection of the engine.
    type Conn: Alike;

    /// The SQLSTATE of a statement on a table that does not exist.
    const NO_SUCH_TABLE: &'static str;

    /// Whether a meta table without its row is created over: the tables are
    /// not created yet, or being created by another session right now (on
    /// an engine whose DDL is not transactional, the meta row is made last).
    const CREATED_WITHOUT_ROW: bool;

    /// What the engine keeps tables in (`schema`, `database`).
    const PLACE: &'static str;

    /// What creating the tables needs, said after the server's refusal.
    const CREATE_NEEDS: &'static str;

    /// What a session creates when it moves tables of an older layout.
    const MOVE_CREATES: &'static str;

    /// What that move needs (a privilege, or who has it), said after the
    /// server's refusal.
    const MOVE_NEEDS: &'static str;

    /// The columns of each table.
    const COLUMNS: &'static Columns;

    /// The catalog query that answers a table's columns and their types
    /// (it takes the schema or database, and the table's name).
    const CATALOG: &'static str;

    /// Where the tables are.
    fn place(&self) -> Place<'_>;

    /// Whether a column name or type the catalog gives is the one expected.
    fn same(found: &str, expected: &str) -> bool;

    /// The layout the meta table holds (`None`: no row).
    async fn read_layout(&self, conn: &mut Self::Conn) -> DbResult<Option<i32>> {
        conn.layout(self.place().meta).await
    }

    /// Creates the tables and what goes with them, one creator at a time.
    async fn create(&self, conn: &mut Self::Conn) -> DbResult<()>;

    /// Moves tables of a movable layout to this one, one mover at a time;
    /// the layout found (the current one when moved).
    async fn upgrade(&self, conn: &mut Self::Conn) -> DbResult<Option<i32>>;

    /// The columns of table `table` (its name less the prefix), with their
    /// types.
    async fn columns(&self, conn: &mut Self::Conn, table: &str) -> DbResult<Vec<(String, String)>> {
        let place = self.place();
        conn.columns(Self::CATALOG, place.name, &format!("{}{table}", place.prefix))
            .await
    }
}

/// Checks the tables a session opens on: reads their layout, creates them
/// when missing (if this user may) and moves a movable layout (likewise),
/// refuses any other layout, then checks every table's columns.
pub(crate) async fn check<L: Layout>(
    tables: &L,
    conn: &mut L::Conn,
    backend: &'static str,
    target: &str,
    create_tables: bool,
) -> lockline::Result<()> {
    let doing = |what| Doing { backend, what, target };
    let map = |what, e| map(doing(what), e);
    let place = tables.place();
    let key = || format!("{} {}", L::PLACE, place.name);
    let layout = match tables.read_layout(conn).await {
        Err(error) if has_code(&error, L::NO_SUCH_TABLE) => {
            // No meta table: a first use. Create everything.
            if !create_tables {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "{target}: the table {} does not exist; create lockline's tables with the DDL script (Sql::ddl) or allow lockline to create them",
                        place.meta
                    ),
                });
            }
            tables
                .create(conn)
                .await
                .map_err(|e| match map("create lockline's tables", e) {
                    Error::PermissionDenied { backend, reason, .. } => Error::PermissionDenied {
                        backend,
                        operation: "create tables in",
                        key: key(),
                        reason: format!("{reason}; {}", L::CREATE_NEEDS),
                    },
                    other => other,
                })?;
            Some(LAYOUT_VERSION)
        }
        Ok(None) if L::CREATED_WITHOUT_ROW && create_tables => {
            tables
                .create(conn)
                .await
                .map_err(|e| map("create lockline's tables", e))?;
            Some(LAYOUT_VERSION)
        }
        other => other.map_err(|e| map("read lockline's layout version", e))?,
    };
    let layout = match layout {
        // The layout before: moved here (it lacks functions or procedures
        // alone), unless this user may create nothing.
        found if movable(found) && create_tables => tables.upgrade(conn).await.map_err(|e| {
            match map("move lockline's tables to the current layout", e) {
                Error::PermissionDenied { backend, reason, .. } => Error::PermissionDenied {
                    backend,
                    operation: L::MOVE_CREATES,
                    key: key(),
                    reason: format!(
                        "{reason}; layout {} tables are moved to layout {LAYOUT_VERSION} on first use, which needs {}: the SQL chapter of the documentation, docs/sql.md, \"Layout versions\")",
                        found.unwrap_or_default(),
                        L::MOVE_NEEDS
                    ),
                },
                other => other,
            }
        })?,
        other => other,
    };
    if layout != Some(LAYOUT_VERSION) {
        return Err(Error::InvalidOptions {
            reason: format!(
                "{target}: {} holds layout {layout:?}, this lockline uses layout {LAYOUT_VERSION}: move the tables to it while no session of the older lockline runs (the SQL chapter of the documentation, docs/sql.md, \"Layout versions\")",
                place.meta
            ),
        });
    }
    for &(table, columns) in L::COLUMNS {
        let found = tables
            .columns(conn, table)
            .await
            .map_err(|e| map("check lockline's tables", e))?;
        if let Some(problem) = column_problem::<L>(&found, columns) {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "{target}: the table {}.{}{table} is not lockline's: {problem}; pick another table prefix (Sql::with_table_prefix) or {}",
                    place.name,
                    place.prefix,
                    L::PLACE
                ),
            });
        }
    }
    Ok(())
}

/// What is wrong with the columns `found` of an existing table, if anything.
fn column_problem<L: Layout>(found: &[(String, String)], expected: &[(&str, &str)]) -> Option<String> {
    for (column, kind) in expected {
        match found.iter().find(|(c, _)| L::same(c, column)) {
            None => return Some(format!("it has no column {column:?}")),
            Some((_, t)) if !L::same(t, kind) => {
                return Some(format!("its column {column:?} is {t}, not {kind}"));
            }
            Some(_) => {}
        }
    }
    None
}
