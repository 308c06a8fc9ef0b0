//! The entries of a queue: an append (one call of the append procedure),
//! the reads of the nearest earlier entries (deleting dead ones on the
//! way), removals.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, Row as _};

use super::release_lock;
use super::MySql;
use crate::alike::Alike;
use crate::dialect::{shape, Append, DbResult, Entries, Row, Turn};

impl MySql {
    /// The nearest earlier live entries before `turn.id`, removing dead ones
    /// on the way.
    async fn nearest(&self, conn: &mut MySqlConnection, turn: &Turn) -> DbResult<Vec<Row>> {
        let Turn {
            id,
            ref name,
            ref session,
            skip_shared,
            count,
        } = *turn;
        let names = self.names()?;
        let wanted = usize::try_from(count).unwrap_or(0);
        let mut nearest = Vec::new();
        if wanted == 0 {
            return Ok(nearest);
        }
        let mut below = id;
        let batch = i64::from(count) + 16;
        loop {
            let found = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.nearest)))
                .bind(session)
                .bind(name)
                .bind(below)
                .bind(batch)
                .fetch_all(&mut *conn)
                .await?;
            let found = rows(&found)?;
            let full = i64::try_from(found.len()).unwrap_or(i64::MAX) >= batch;
            for (row, live) in found {
                below = row.id;
                // With the reset grace (Sql::with_reset_grace), a dead entry
                // whose session is still there blocks like a live one: its
                // owner may be alive with its connection reset, not told yet.
                let live = live
                    || (self.settings.reset_grace
                        && sqlx::query_scalar::<_, i64>(AssertSqlSafe(Arc::clone(&names.sql.session_exists)))
                            .bind(&row.session)
                            .fetch_one(&mut *conn)
                            .await?
                            > 0);
                if !live {
                    // Its guard is free: released, or its owner's connection
                    // ended. Delete it before going past it (this waits for a
                    // fenced commit of its holder still in flight).
                    sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.delete_dead)))
                        .bind(row.id)
                        .bind(session)
                        .execute(&mut *conn)
                        .await?;
                    continue;
                }
                if skip_shared && row.kind == "read" {
                    continue;
                }
                nearest.push(row);
                if nearest.len() >= wanted {
                    return Ok(nearest);
                }
            }
            if !full {
                return Ok(nearest);
            }
        }
    }
}

/// The nearest entries as the append procedure answers them: `id kind
/// session;` each.
pub(super) fn parse_nearest(nearest: &str) -> DbResult<Vec<Row>> {
    nearest
        .split(';')
        .filter(|row| !row.is_empty())
        .map(|row| {
            let mut fields = row.splitn(3, ' ');
            let (Some(id), Some(kind), Some(session)) = (fields.next(), fields.next(), fields.next()) else {
                return Err(shape(format!("the append answered the entry {row:?}")));
            };
            Ok(Row {
                id: id
                    .parse()
                    .map_err(|_| shape(format!("the append answered the entry {row:?}")))?,
                kind: kind.to_owned(),
                session: session.to_owned(),
            })
        })
        .collect()
}

/// The nearest entries as the nearest statement answers them: each with
/// whether it is live (its guard held, or it is the caller's).
fn rows(found: &[MySqlRow]) -> DbResult<Vec<(Row, bool)>> {
    found
        .iter()
        .map(|r| {
            let live: Option<i64> = r.try_get(3)?;
            Ok((Row::read(r, 0)?, live == Some(1)))
        })
        .collect()
}

#[async_trait]
impl Entries for MySql {
    async fn append(&self, conn: &mut MySqlConnection, append: &Append<'_>) -> DbResult<(i64, Vec<Row>)> {
        self.check_size(append.value.len() + append.name.len())?;
        let names = self.names()?;
        // One round trip (see the procedure in the DDL): nothing it takes on
        // the server outlives the call, so a client that never hears the
        // answer (its connection gone silent) leaves no lock behind but its
        // entry's guard, which its session's end frees.
        let found = append
            .bind(sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.append))))
            .fetch_all(&mut *conn)
            .await?;
        let [row] = found.as_slice() else {
            return Err(shape(format!("the append answered {} rows, not one", found.len())));
        };
        let id: i64 = row.try_get(0)?;
        if id < 0 {
            return Err(shape(format!(
                "the guard {} of a new entry is held by another connection",
                names.guard(append.attempt)
            )));
        }
        let nearest: String = row.try_get(1)?;
        Ok((id, parse_nearest(&nearest)?))
    }

    async fn earlier(&self, conn: &mut MySqlConnection, turn: &Turn) -> DbResult<Option<Vec<Row>>> {
        let names = self.names()?;
        let exists: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.exists)))
            .bind(turn.id)
            .fetch_one(&mut *conn)
            .await?;
        if exists == 0 {
            return Ok(None);
        }
        self.nearest(conn, turn).await.map(Some)
    }

    async fn list(&self, conn: &mut MySqlConnection, name: &str, session: &str) -> DbResult<Vec<Row>> {
        conn.entries(&self.names()?.sql.list, name, session).await
    }

    async fn remove(&self, conn: &mut MySqlConnection, id: i64, session: &str, unlock: bool) -> DbResult<bool> {
        // One round trip (see the remove procedure in the DDL): the delete
        // commits before the guard is let go of.
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.remove)))
            .bind(id)
            .bind(session)
            .bind(unlock)
            .fetch_all(&mut *conn)
            .await?;
        let [row] = found.as_slice() else {
            return Err(shape(format!("the removal answered {} rows, not one", found.len())));
        };
        let removed: i64 = row.try_get(0)?;
        Ok(removed == 1)
    }

    async fn abandon(&self, conn: &mut MySqlConnection, attempt: &str, session: &str) -> DbResult<Option<i64>> {
        let names = self.names()?;
        let id: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.find)))
            .bind(attempt)
            .bind(session)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(id) = id {
            self.remove(conn, id, session, true).await?;
        } else {
            // The append may have taken the guard and never inserted.
            release_lock(conn, &names.guard(attempt)).await?;
        }
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_entries_are_read_as_the_procedure_writes_them() {
        let rows = parse_nearest("41 write 0af3;7 read 9bc1;").expect("parse");
        assert_eq!(
            rows,
            vec![
                Row {
                    id: 41,
                    kind: "write".into(),
                    session: "0af3".into()
                },
                Row {
                    id: 7,
                    kind: "read".into(),
                    session: "9bc1".into()
                },
            ]
        );
        assert_eq!(parse_nearest("").expect("parse"), Vec::new());
        assert!(parse_nearest("x mutex s;").is_err());
        assert!(parse_nearest("7 mutex;").is_err());
    }
}
