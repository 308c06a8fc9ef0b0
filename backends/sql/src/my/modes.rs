//! Lock modes: a queue read as a whole (one statement) and changed by one
//! call of the update procedure, and watchers of its entries, woken by the
//! value lock an entry's owner holds or by a writer's `KILL QUERY` of the
//! waits holding the entry's watch slots.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Executor, Row as _};

use super::MySql;
use crate::dialect::{
    queue_rows, shape, DbResult, Found, Liveness, LockModes, QueueChange, QueueRead, Waited, Watch, Watched,
};

#[async_trait]
impl LockModes for MySql {
    async fn read_queue(&self, conn: &mut MySqlConnection, name: &str, session: &str) -> DbResult<QueueRead> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.read_queue)))
            .bind(name)
            .bind(name)
            .bind(session)
            .fetch_all(conn)
            .await?;
        queue_rows(&found)
    }

    async fn update_queue(&self, conn: &mut MySqlConnection, change: &QueueChange<'_>) -> DbResult<Option<i64>> {
        // "id version op length;" by ascending id, the values set after
        // each other in that order (see the procedure).
        let mut named = String::new();
        let mut values = Vec::new();
        for entry in &change.named {
            let set = change
                .set
                .iter()
                .find(|(id, _)| *id == entry.id)
                .map(|(_, value)| *value);
            let delete = change.delete.contains(&entry.id);
            let op = u8::from(set.is_some()) | (u8::from(delete) << 1);
            let length = set.map_or(0, <[u8]>::len);
            named.push_str(&format!("{} {} {op} {length};", entry.id, entry.condition.code()));
            if let Some(value) = set {
                values.extend_from_slice(value);
            }
        }
        self.check_size(values.len() + change.block.map_or(0, <[u8]>::len) + named.len() + change.name.len())?;
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.update_queue)))
            .bind(change.name)
            .bind(change.session)
            .bind(named)
            .bind(values)
            .bind(change.block)
            .fetch_all(conn)
            .await?;
        let [row] = found.as_slice() else {
            return Err(shape(format!("the change answered {} rows, not one", found.len())));
        };
        row.try_get(0)
    }

    async fn watch_read(&self, conn: &mut MySqlConnection, id: i64, session: &str) -> DbResult<Found> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.watch_read)))
            .bind(session)
            .bind(id)
            .fetch_optional(conn)
            .await?;
        row.map(|r| {
            let live: Option<i64> = r.try_get(3)?;
            Ok((Watched::read(&r, 0)?, live == Some(1)))
        })
        .transpose()
    }

    async fn wait_watch(&self, conn: &mut MySqlConnection, watch: &Watch<'_>) -> DbResult<(Waited, Option<Found>)> {
        let found = watch
            .bind(sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.watch))))
            .fetch_all(&mut *conn)
            .await;
        let row = match found {
            Ok(mut found) if found.len() == 1 => found.remove(0),
            Ok(found) => return Err(shape(format!("the watch answered {} rows, not one", found.len()))),
            // Woken in a step other than the wait: its slot may still be
            // held, which would draw wakes meant for it to the next wait.
            Err(error) if crate::error::interrupted(&error) => {
                conn.execute("DO RELEASE_ALL_LOCKS()").await?;
                return Ok((Waited::Interrupted, None));
            }
            Err(error) => return Err(error),
        };
        let code: Option<i64> = row.try_get(0)?;
        let waited = match code {
            Some(0) => Waited::Released,
            Some(3) => Waited::Lost,
            // The owner's heartbeat now, by a statement of its own (a fresh
            // snapshot, read after the wait).
            Some(1) => return Ok((Waited::TimedOut(self.beat_of(conn, watch.owner).await?), None)),
            other => return Err(shape(format!("the watch answered {other:?}"))),
        };
        let read = row.try_get::<Option<i64>, _>(1)? == Some(1);
        let found = Watched::read_woken(&row, read, 2, |row| Ok(row.try_get::<Option<i64>, _>(5)? == Some(1)))?;
        Ok((waited, found))
    }
}
