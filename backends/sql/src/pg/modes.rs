//! Lock modes: a queue read and changed as a whole (one statement, one
//! function call), and watchers of its entries, woken by the value lock
//! an entry's owner holds or by a notice on the entry's channel.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row as _};

use super::listener::EntryListener;
use super::waits::waited;
use super::Postgres;
use crate::dialect::{
    queue_rows, DbResult, Found, Listener, LockModes, Purpose, QueueChange, QueueRead, Waited, Watch, Watched,
};

#[async_trait]
impl LockModes for Postgres {
    async fn read_queue(&self, conn: &mut PgConnection, name: &str, session: &str) -> DbResult<QueueRead> {
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.read_queue)))
            .bind(name)
            .bind(session)
            .fetch_all(conn)
            .await?;
        queue_rows(&found)
    }

    async fn update_queue(&self, conn: &mut PgConnection, change: &QueueChange<'_>) -> DbResult<Option<i64>> {
        let ids: Vec<i64> = change.named.iter().map(|n| n.id).collect();
        let versions: Vec<i64> = change.named.iter().map(|n| n.condition.code()).collect();
        let writes: Vec<bool> = change.named.iter().map(|n| n.writes).collect();
        let set_ids: Vec<i64> = change.set.iter().map(|(id, _)| *id).collect();
        let set_values: Vec<&[u8]> = change.set.iter().map(|(_, value)| *value).collect();
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.update_queue)))
            .bind(change.name)
            .bind(change.session)
            .bind(ids)
            .bind(versions)
            .bind(writes)
            .bind(set_ids)
            .bind(set_values)
            .bind(&change.delete)
            .bind(change.block)
            .fetch_one(conn)
            .await
    }

    async fn watch_read(&self, conn: &mut PgConnection, id: i64, session: &str) -> DbResult<Found> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.watch_read)))
            .bind(id)
            .bind(session)
            .fetch_optional(conn)
            .await?;
        row.map(|r| Ok((Watched::read(&r, 0)?, r.try_get(3)?))).transpose()
    }

    async fn wait_watch(&self, conn: &mut PgConnection, watch: &Watch<'_>) -> DbResult<(Waited, Option<Found>)> {
        let row = watch
            .bind(sqlx::query(AssertSqlSafe(Arc::clone(&self.names()?.sql.watch))))
            .fetch_one(conn)
            .await?;
        let waited = waited(&row)?;
        let read = row.try_get::<Option<bool>, _>(3)? == Some(true);
        let found = Watched::read_woken(&row, read, 4, |row| {
            Ok(row.try_get::<Option<bool>, _>(7)?.unwrap_or(false))
        })?;
        Ok((waited, found))
    }

    fn notifies(&self) -> bool {
        true
    }

    async fn listener(&self) -> DbResult<Option<Box<dyn Listener>>> {
        let channel = self.names()?.channel.clone();
        let (options, set) = self.connect_options(Purpose::Control);
        // Told apart from the session's other connections in
        // pg_stat_activity.
        let options = options.application_name("lockline notices");
        let set: Arc<str> = set.into();
        // A pool of one connection, which the driver's listener needs to
        // connect again after a loss (re-listening to every channel).
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(self.settings.request_timeout)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                let set = Arc::clone(&set);
                Box::pin(async move {
                    sqlx::query(AssertSqlSafe(set)).execute(conn).await?;
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        let listener = PgListener::connect_with(&pool).await?;
        Ok(Some(Box::new(EntryListener {
            listener,
            channel,
            pool,
        })))
    }
}
