//! Ending a session: its nodes handed over with the release mark, the
//! close and its confirmation, and a session given up.

use super::liveness::end;
use super::*;

/// How much sooner than the core's bound (the request timeout) `close()`
/// gives up waiting for the server's confirmation, to say why itself.
const CLOSE_MARGIN: Duration = Duration::from_millis(100);

impl ZkSession {
    /// Hands this session's nodes over before the session ends: deletes
    /// each with the release mark, all requests sent at once, waiting at
    /// most `within` for the answers. A node left (the server did not answer
    /// in time) goes with the session, and its waiters take that for a loss.
    async fn hand_over(&self, client: &Client, within: Duration) {
        let keys: Vec<String> = lock(&self.held).drain().collect();
        if keys.is_empty() {
            return;
        }
        let releases: Vec<_> = keys.iter().map(|key| self.release_node(client, key, true)).collect();
        let answered = tokio::time::timeout(within, async {
            for (key, release) in keys.iter().zip(releases) {
                if let Err(error) = release.await {
                    tracing::debug!(session = %self.id, %key, %error, "node not handed over before the close");
                }
            }
        })
        .await;
        if answered.is_err() {
            tracing::debug!(session = %self.id, ?within, "hand-over before the close not answered in time");
        }
    }

    pub(super) fn give_up_session(&self, why: &str) {
        let session = self.session_info();
        self.mark_lost(why);
        if let Some(session) = session {
            tokio::spawn(crate::connect::close_remotely(
                self.backend.clone(),
                self.options.clone(),
                session,
            ));
        }
    }

    pub(super) async fn close_session(&self) -> Result<()> {
        // Dropping the last client closes the ZooKeeper session, which deletes
        // its ephemeral nodes: the client library sends `CloseSession` and
        // reports `Closed` once the server has answered it.
        let timeout = self.options.request_timeout();
        let bound = timeout.saturating_sub(CLOSE_MARGIN).max(timeout / 2);
        let started = Instant::now();
        // A clean hand-over: the session's nodes are deleted with the
        // release mark first, so that lock-delayed waiters do not take the
        // close for a loss (the server deletes what is left the same way as
        // on expiry). Within half the bound, leaving the rest for the close.
        let client = lock(&self.client).clone();
        if let Some(client) = client {
            if *self.state.borrow() == SessionState::Live {
                self.hand_over(&client, bound / 2).await;
            }
        }
        let watcher = lock(&self.client).as_ref().map(Client::state_watcher);
        end(&self.client);
        self.tracker.abort();
        // A session already lost stays lost: closing it does not undo that.
        advance(&self.state, SessionState::Closed);
        // Answered in a round trip. Within the core's own bound (the request
        // timeout), so that the error can say what may hold the session.
        let remaining = bound.saturating_sub(started.elapsed());
        let confirmed = match watcher {
            Some(mut watcher) => {
                let closed = async {
                    loop {
                        match watcher.state() {
                            ZkState::Closed => return true,
                            // The client library also reports these on its
                            // own (its reconnect deadline passed): not a word
                            // from the server.
                            ZkState::Expired | ZkState::AuthFailed => return false,
                            _ => {}
                        }
                        watcher.changed().await;
                    }
                };
                tokio::time::timeout(remaining, closed).await.unwrap_or(false)
            }
            // Lost (or given up) before: its client was let go then.
            None => false,
        };
        if confirmed {
            return Ok(());
        }
        // Not confirmed by the first connection: attach with the session's
        // id and password from a second one, which the server answers with
        // "expired" once the session is gone.
        let remaining = bound.saturating_sub(started.elapsed());
        let remote = crate::connect::close_remotely(self.backend.clone(), self.options.clone(), self.info.clone());
        if tokio::time::timeout(remaining, remote).await.unwrap_or(false) {
            return Ok(());
        }
        Err(Error::unavailable(
            crate::error::BACKEND,
            format!(
                "the close of session {} was not confirmed within {bound:?}: the server is unreachable \
                 (the session then ends when its timeout runs out), or a request of this session is \
                 still in flight in a future that was polled and set aside (the session then stays \
                 open until that future is dropped)",
                self.id
            ),
        ))
    }
}
