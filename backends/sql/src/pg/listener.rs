//! The connection that hears of writes to lock-mode entries by sessions
//! that do not own them: `LISTEN` on each watched entry's channel.

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPool};

use crate::dialect::{DbResult, Listener};

/// Notifications of writes to lock-mode entries by sessions that do not
/// own them: `LISTEN` on each watched entry's channel.
pub(super) struct EntryListener {
    pub(super) listener: PgListener,
    pub(super) channel: String,
    pub(super) pool: PgPool,
}

impl std::fmt::Debug for EntryListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryListener")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Drop for EntryListener {
    fn drop(&mut self) {
        // Closes the connection once the listener lets go of it.
        let pool = self.pool.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { pool.close().await });
        }
    }
}

#[async_trait]
impl Listener for EntryListener {
    async fn listen(&mut self, id: i64) -> DbResult<()> {
        self.listener.listen(&format!("{}{id}", self.channel)).await
    }

    async fn unlisten(&mut self, id: i64) -> DbResult<()> {
        self.listener.unlisten(&format!("{}{id}", self.channel)).await
    }

    async fn recv(&mut self) -> DbResult<Option<i64>> {
        loop {
            let Some(notification) = self.listener.try_recv().await? else {
                return Ok(None);
            };
            let id = notification
                .channel()
                .strip_prefix(self.channel.as_str())
                .and_then(|id| id.parse().ok());
            if let Some(id) = id {
                return Ok(Some(id));
            }
        }
    }

    async fn ping(&mut self) -> DbResult<()> {
        sqlx::query("SELECT 1").execute(&mut self.listener).await.map(drop)
    }
}
