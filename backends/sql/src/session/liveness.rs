//! The session's own life: its renewals (hedged on a fresh connection when
//! slow), the proof that its owning connection still answers, its loss
//! (ended on the server too), and the end of a restart grace it waited out.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use lockline::backend::advance;
use lockline::{Result, SessionState};
use tokio::time::Instant;

use super::{Shared, SqlSession};
use crate::dialect::{Dialect, Purpose};
use crate::error::{map, timed_out};

impl<D: Dialect> Shared<D> {
    /// Records that the owning connection answered a statement sent at `sent`.
    pub(super) fn owner_answered(&self, sent: Instant) {
        let mut confirmed = self.owner_confirmed.lock().unwrap_or_else(PoisonError::into_inner);
        if sent > *confirmed {
            *confirmed = sent;
        }
    }

    /// The send time of the last statement the owning connection answered.
    pub(super) fn owner_confirmed(&self) -> Instant {
        *self.owner_confirmed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Declares the session lost: its holders and waiters learn it at once;
    /// the owning connection is closed (the server frees its guards) and its
    /// rows deleted as far as the server answers.
    pub(super) fn lose(self: &Arc<Self>, why: &str) {
        // Lost first, then its entries gone: a holder woken by its entry
        // going must find the session over, not an entry deleted by someone.
        let lost = advance(&self.state, SessionState::Lost);
        self.signal_gone_all();
        if lost {
            tracing::warn!(session = %self.id, target = %self.target, "session lost: {why}");
            for idle in self.waits.close() {
                drop(idle);
            }
            let shared = Arc::clone(self);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { shared.end_on_server().await });
            }
        }
    }

    /// Closes the owning connection (once a statement in flight on it is
    /// done or timed out) and ends the session on the server through a new
    /// connection, best effort: its old connection, which the server may
    /// still believe in behind a silent partition, is ended first, then its
    /// rows are deleted. A session declared lost must not block anyone later
    /// (DESIGN §6.11); what cannot be done here is left to the waiters, who
    /// end a session past its TTL themselves.
    pub(super) async fn end_on_server(&self) {
        let timeout = self.options.request_timeout();
        if let Ok(mut owner) = tokio::time::timeout(timeout, self.owner.lock()).await {
            owner.take();
        }
        let cleanup = async {
            let (mut conn, _) = self.dialect.connect(Purpose::Wait).await?;
            self.dialect.end(&mut conn, &self.id, self.owner_server_id).await
        };
        match tokio::time::timeout(timeout + Duration::from_secs(5), cleanup).await {
            Ok(Ok(true)) => tracing::debug!(session = %self.id, "lost session ended on the server"),
            Ok(Ok(false)) => {
                tracing::debug!(session = %self.id, "a lost session's connection would not end; left to the waiters")
            }
            Ok(Err(error)) => tracing::debug!(session = %self.id, %error, "could not end a lost session on the server"),
            Err(_) => tracing::debug!(session = %self.id, "could not reach the server to end a lost session"),
        }
    }

    /// One renewal: `Ok(true)` renewed, `Ok(false)` the session is gone.
    pub(super) async fn renew(self: &Arc<Self>) -> Result<bool> {
        let renewed = on_control!(self, "renew the session", |d, conn| d.heartbeat(conn, &self.id));
        let count = match renewed {
            Ok(count) => count,
            Err(error) => {
                if self.control.lock().await.is_none() {
                    // The control connection broke: if the path to the server
                    // was reset, the guard connection was reset with it and
                    // every guard is gone. Ask it now rather than at the loss
                    // deadline (a reconnect may be refused meanwhile).
                    let _ = on_owner!(self, "check the session's connection", |d, conn| d.ping(conn));
                }
                return Err(error);
            }
        };
        let Some(count) = count else {
            return Ok(false);
        };
        let tracked = self.entries().len();
        if usize::try_from(count).unwrap_or(usize::MAX) < tracked {
            // Someone deleted one of our entries: find which.
            let ids = on_control!(self, "list the session's entries", |d, conn| d.own_ids(conn, &self.id))?;
            let ids: std::collections::HashSet<i64> = ids.into_iter().collect();
            let gone: Vec<i64> = self.entries().keys().copied().filter(|id| !ids.contains(id)).collect();
            for id in gone {
                tracing::debug!(session = %self.id, id, "entry found gone at renewal");
                // Still guarded by us: let go of the guard.
                let _ = on_owner!(self, "let go of a deleted entry's guard", |d, conn| d
                    .remove(conn, id, &self.id, true));
                self.forget(id);
            }
        }
        Ok(true)
    }

    /// One renewal, hedged after `bound`: if the control connection has not
    /// answered by then (it may have gone silent, or be merely slow), the
    /// same heartbeat is sent on a fresh connection too, and the first
    /// answer counts. A fresh connection that answers first replaces the
    /// control connection, so a silent one is not used again.
    pub(super) async fn renew_within(self: &Arc<Self>, bound: Duration) -> Result<bool> {
        // Boxed, so that it can be dropped (letting go of the control
        // connection's lock) before that connection is replaced.
        let mut first = Box::pin(self.renew());
        tokio::select! {
            renewed = &mut first => return renewed,
            () = tokio::time::sleep(bound) => {}
        }
        tracing::debug!(session = %self.id, ?bound, "a renewal is slow; sending it on a fresh connection too");
        let hedge = async {
            let (mut conn, _) = self.dialect.connect(Purpose::Control).await?;
            let renewed = self.dialect.heartbeat(&mut conn, &self.id).await?;
            Ok::<_, sqlx::Error>((renewed, conn))
        };
        let hedged = tokio::select! {
            renewed = &mut first => return renewed,
            hedged = hedge => hedged,
        };
        match hedged {
            Ok((renewed, conn)) => {
                // The first try ends here, and its connection is replaced.
                drop(first);
                if let Ok(mut control) = self.control.try_lock() {
                    *control = Some(conn);
                }
                Ok(renewed.is_some())
            }
            Err(error) => {
                // The fresh connection failed: the first try may still answer.
                tracing::debug!(session = %self.id, %error, "the hedged renewal failed");
                first.await
            }
        }
    }

    /// Ends the restart grace this session waited out, once (best effort:
    /// while it stays in force, each session opened in it waits all of it).
    pub(super) async fn end_grace(&self) {
        let Some((until, id)) = self.grace_until else { return };
        if Instant::now() < until || self.state.borrow().is_over() {
            return;
        }
        let mut ended = self.grace_ended.lock().await;
        if *ended {
            return;
        }
        *ended = true;
        if let Err(error) = on_control!(self, "end the restart grace", |d, conn| d.end_grace(conn, id)) {
            tracing::debug!(session = %self.id, %error, "could not end the restart grace");
        }
    }

    /// Proves the owning connection alive with a round trip on it, unless it
    /// answered a statement sent since `since` (a renewal on the control
    /// connection says the server still has it, not that its flow works).
    /// A ping that has no answer loses the session (see `on_owner!`).
    pub(super) async fn prove_owner(self: &Arc<Self>, since: Instant) {
        if self.owner_confirmed() >= since {
            return;
        }
        if let Err(error) = on_owner!(self, "prove the session's connection alive", |d, conn| d.ping(conn)) {
            tracing::debug!(session = %self.id, %error, "the session's connection did not answer a ping");
        }
    }

    /// Pings the owning connection each keepalive interval, on a timer of
    /// its own (never held up by a slow renewal), unless it answered
    /// something since the tick before: it is pinged at the latest two
    /// intervals after it last answered, which the server's keepalive
    /// (`ServerKeepalive`) counts on. Each ping in a task of its own, one
    /// at a time: a ping queued behind the owning connection's statements
    /// must not hold the next tick up.
    pub(super) async fn prove_owner_each_interval(self: Arc<Self>, opened_at: Instant) {
        let interval = self.options.keepalive_interval();
        let mut ticks = tokio::time::interval_at(opened_at + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let tick = ticks.tick().await;
            if self.state.borrow().is_over() {
                return;
            }
            if !self.proving.swap(true, Ordering::SeqCst) {
                let shared = Arc::clone(&self);
                tokio::spawn(async move {
                    shared.prove_owner(tick - interval).await;
                    shared.proving.store(false, Ordering::SeqCst);
                });
            }
        }
    }

    /// Renews until the session ends: `Suspended` while renewals fail,
    /// `Lost` once none has been confirmed for `ttl - safety margin`,
    /// counted from the send time of the last confirmed one. A renewal that
    /// has no answer within half the time left is abandoned with its
    /// connection and tried again at once on a fresh one.
    ///
    /// Each interval the owning connection is also pinged (on a timer of its
    /// own, `prove_owner_each_interval`), unless it answered something since
    /// the last one; a ping (or any statement)
    /// there with no answer within the request timeout loses the session
    /// (`on_owner!`). That bound, not the loss deadline, governs the owning
    /// connection: a statement may legitimately wait there (a row lock),
    /// and while the server believes in the connection its guards stay
    /// held, so nobody else is granted meanwhile — a silent owning
    /// connection is a matter of the queue's liveness, which the ping
    /// restores within an interval and a request timeout, not of safety.
    pub(super) async fn keep_alive(self: Arc<Self>, opened_at: Instant) {
        let interval = self.options.keepalive_interval();
        let loss_after = self.options.loss_deadline();
        let request_timeout = self.options.request_timeout();
        let retry_pause = (interval / 8).min(Duration::from_millis(250));
        let mut confirmed = opened_at;
        let mut next = opened_at + interval;
        loop {
            let deadline = confirmed + loss_after;
            tokio::time::sleep_until(next.min(deadline)).await;
            if self.state.borrow().is_over() {
                return;
            }
            let sent = Instant::now();
            if sent >= deadline {
                self.lose("no renewal confirmed within ttl - safety margin");
                return;
            }
            let bound = ((deadline - sent) / 2)
                .max(Duration::from_millis(50))
                .min(request_timeout);
            let attempt = self.renew_within(bound);
            tokio::pin!(attempt);
            let mut overdue = true;
            let outcome = loop {
                tokio::select! {
                    outcome = &mut attempt => break Some(outcome),
                    () = tokio::time::sleep_until(sent + interval), if overdue => {
                        overdue = false;
                        advance(&self.state, SessionState::Suspended);
                    }
                    () = tokio::time::sleep_until(deadline) => break None,
                }
            };
            match outcome {
                Some(Ok(true)) => {
                    confirmed = sent;
                    next = sent + interval;
                    advance(&self.state, SessionState::Live);
                }
                Some(Ok(false)) => {
                    self.lose(
                        "the database no longer has the session, or its connection (ended by another client after \
                         its TTL, or by the server), or a transaction-pooling proxy put two of its connections on one \
                         server backend",
                    );
                    return;
                }
                Some(Err(error)) => {
                    tracing::debug!(session = %self.id, %error, "renewal failed");
                    if self.state.borrow().is_over() {
                        return;
                    }
                    advance(&self.state, SessionState::Suspended);
                    next = Instant::now() + retry_pause;
                }
                None => {}
            }
        }
    }
}

impl<D: Dialect> SqlSession<D> {
    /// Closes the session: its grace ended if waited out, its tasks and
    /// waits stopped, its rows deleted, its owning connection closed (which
    /// lets go of every guard).
    pub(super) async fn close_session(&self) -> Result<()> {
        let shared = &self.shared;
        // Waited out but not ended yet (the task's moment had not come):
        // ended now, so that sessions opened later need not wait it all.
        shared.end_grace().await;
        advance(&shared.state, SessionState::Closed);
        shared.signal_gone_all();
        for task in &self.tasks {
            task.abort();
        }
        shared.waits.close();
        let timeout = shared.options.request_timeout();
        let mut owner = match tokio::time::timeout(timeout, shared.owner.lock()).await {
            Ok(owner) => owner,
            Err(_) => return Err(timed_out(shared.doing("close the session"), timeout)),
        };
        let Some(conn) = owner.as_mut() else {
            // Lost before: its connection is closed already; its rows were
            // deleted by the loss, or are left to the reaping.
            return Ok(());
        };
        let closed = tokio::time::timeout(timeout, shared.dialect.close(conn, &shared.id)).await;
        // Closing the connection lets go of every guard it held.
        owner.take();
        match closed {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(map(shared.doing("close the session"), error)),
            Err(_) => Err(timed_out(shared.doing("close the session"), timeout)),
        }
    }
}
