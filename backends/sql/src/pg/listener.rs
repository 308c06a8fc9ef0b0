//! The connection that hears of writes to lock-mode entries by sessions
//! that do not own them: `LISTEN` on each watched entry's channel.

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPool};

use crate::dialect::{DbResult, Listener, Written};

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

    async fn recv(&mut self) -> DbResult<Option<(i64, Option<Written>)>> {
        loop {
            let Some(notification) = self.listener.try_recv().await? else {
                return Ok(None);
            };
            let id = notification
                .channel()
                .strip_prefix(self.channel.as_str())
                .and_then(|id| id.parse().ok());
            if let Some(id) = id {
                return Ok(Some((id, written(notification.payload()))));
            }
        }
    }

    async fn ping(&mut self) -> DbResult<()> {
        sqlx::query("SELECT 1").execute(&mut self.listener).await.map(drop)
    }
}

/// The write a notice's payload carries: `w`, the entry's version, a colon
/// and the value in hex, as `lockline_update_queue` sends it for a write
/// (an empty payload for a removal, or a value too long to send).
fn written(payload: &str) -> Option<Written> {
    let (version, hex) = payload.strip_prefix('w')?.split_once(':')?;
    let version = version.parse().ok()?;
    let hex = hex.as_bytes();
    if hex.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let value = hex
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect::<Option<Vec<u8>>>()?;
    Some(Written { version, value })
}

#[cfg(test)]
mod tests {
    use super::written;
    use crate::dialect::Written;

    #[test]
    fn a_notice_carries_the_value_written_or_nothing() {
        let write = |version, value: &[u8]| {
            Some(Written {
                version,
                value: value.to_vec(),
            })
        };
        assert_eq!(written("w7:00ff7a"), write(7, &[0x00, 0xff, 0x7a]));
        assert_eq!(written("w12:"), write(12, &[]));
        assert_eq!(written(""), None);
        assert_eq!(written("w"), None);
        assert_eq!(written("w00ff"), None);
        assert_eq!(written("w3:0"), None);
        assert_eq!(written("w3:zz"), None);
        assert_eq!(written("wx:00"), None);
        assert_eq!(written("3:00ff"), None);
    }
}
