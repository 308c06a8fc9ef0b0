//! A session: one connection that holds every guard and renews a heartbeat,
//! and a bounded pool of connections its waiters block on.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use lockline::backend::{
    advance, AppendRequest, Appended, BackendSession, Conflicts, Earlier, Entry, EntryKind, Queue, QueueUpdate, Slot,
};
use lockline::{Error, FencingToken, Result, SessionOptions, SessionState, Write};
use tokio::sync::{oneshot, watch, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::dialect::{
    Append, Beat, DbResult, Dialect, Found, Purpose, QueueChange, Reaped, Row, Status, Turn, TurnRead, Waited, Watched,
};
use crate::error::{connection_gone, interrupted, map, timed_out, Doing};
use crate::layout::{self, entry_key, kind_from_label, kind_label, parse_entry_key};
use crate::notices::Notices;
use crate::pool::{Idle, Lease, Stop, WaitPool};

/// At most this many turns noted or read and not yet taken are kept (more
/// means waits given up without a read after them; they are dropped, and
/// those waiters read on their own).
const TURNS_KEPT: usize = 4096;

/// How a waiter without a wait connection is woken: its signal, and the
/// flag saying its predecessor was lost rather than released.
type Wake = (Arc<Stop>, Arc<AtomicBool>);

/// How often an election observer looks again at a queue with no candidate
/// (the one wait that has nothing on the server to block on).
pub(crate) const EMPTY_QUEUE_RECHECK: Duration = Duration::from_millis(100);

/// A flag set once one of the session's own entries is found gone.
#[derive(Default)]
struct Gone {
    set: AtomicBool,
    changed: Notify,
}

impl Gone {
    fn signal(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    async fn wait(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.set.load(Ordering::SeqCst) {
                return;
            }
            changed.await;
        }
    }
}

/// What the session and its tasks share.
pub(crate) struct Shared<D: Dialect> {
    dialect: Arc<D>,
    id: String,
    target: String,
    options: SessionOptions,
    state: watch::Sender<SessionState>,
    /// The connection that holds every guard; `None` once the session is over.
    owner: tokio::sync::Mutex<Option<D::Conn>>,
    owner_server_id: i64,
    /// The send time of the last statement the owning connection answered:
    /// a keepalive interval without one, and the connection is pinged (a
    /// renewal on the control connection proves nothing about this one).
    owner_confirmed: std::sync::Mutex<Instant>,
    /// A ping of the owning connection is under way.
    proving: AtomicBool,
    /// The connection that renews the session, sends cancels and looks at
    /// waits: never queued behind the owner's statements (a row-lock wait
    /// there must not starve the heartbeat). Opened again when it breaks:
    /// it holds nothing.
    control: tokio::sync::Mutex<Option<D::Conn>>,
    waits: WaitPool<D::Conn>,
    /// Waiters with no wait connection yet: the entry each waits on, and
    /// the flag the overflow check sets once that entry is gone.
    overflow: std::sync::Mutex<HashMap<u64, Overflow>>,
    next_overflow: std::sync::atomic::AtomicU64,
    /// Entries of others this session waited on and saw go: when, if they
    /// went with their owner's connection or session, `None` if released.
    /// What a lock-delay asks (`departure`); one whose wait was cut short
    /// (never seen go) counts as lost. Forgotten once asked.
    departures: std::sync::Mutex<HashMap<i64, Option<Instant>>>,
    /// Other sessions' heartbeats as this one saw them: each owner's count,
    /// its TTL, and when an answer first carried that count (on this
    /// process's monotonic clock). An owner whose count has not moved for
    /// its TTL since then is silent (DESIGN §6.19).
    beats: std::sync::Mutex<HashMap<String, Seen>>,
    /// After a database restart: no grant before this (see
    /// `Sql::without_restart_grace`), and which grace it is.
    grace_until: Option<(Instant, i64)>,
    /// The grace was waited out and ended on the server (or tried); held
    /// while it is being ended, so that a close waits for an end under way.
    grace_ended: tokio::sync::Mutex<bool>,
    /// Outlive a reset holder before going past it (see
    /// `Sql::with_reset_grace`).
    reset_grace: bool,
    /// Owners being ended by the overflow check, so each once at a time.
    reaping: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The session's own entries by id: whether their guard is held, and
    /// the flag their holders wait on.
    entries: std::sync::Mutex<HashMap<i64, Arc<Gone>>>,
    /// The turns this session's waiters read next, by the entry of another
    /// session each waits on (from the read that named it): the wait on
    /// that entry reads the turn in its own statement. `None` when two of
    /// this session's waiters wait on the same entry (each then reads on
    /// its own).
    behind: std::sync::Mutex<HashMap<i64, Option<Turn>>>,
    /// Turns read by a wait, by the waiter's own entry, for its next
    /// `earlier` to take instead of reading again: read locks or not, the
    /// count asked, and what was read.
    turns_read: std::sync::Mutex<HashMap<i64, (bool, i32, TurnRead)>>,
    /// Where the engine tells of writes to lock-mode entries by sessions
    /// that do not own them (PostgreSQL); `None` when it wakes watchers on
    /// the server itself (MariaDB/MySQL).
    notices: Option<Notices>,
}

/// A session of the [`Sql`](crate::Sql) backend.
pub(crate) struct SqlSession<D: Dialect> {
    shared: Arc<Shared<D>>,
    state: watch::Receiver<SessionState>,
    tasks: Vec<AbortHandle>,
}

impl<D: Dialect> fmt::Debug for SqlSession<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlSession")
            .field("id", &self.shared.id)
            .field("target", &self.shared.target)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> Drop for SqlSession<D> {
    /// Every handle is gone, as if the process died: renewals stop. The
    /// owning connection closes when the last task lets go of it, and the
    /// server frees every guard with it.
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.shared.waits.close();
    }
}

/// Runs one statement on the owning connection. Waiting for the connection
/// (queued behind the session's other statements) is bounded by the request
/// timeout and fails the call alone; the statement itself is bounded by the
/// request timeout or the loss deadline, whichever is longer (a slow server
/// is given as long as a renewal is), and one that has no answer by then
/// loses the session (DESIGN
/// §6.18): the connection may have gone silent (a NAT or a load balancer
/// forgot the flow), and the guards it holds can then neither be trusted
/// nor let go of — a retry would queue behind it for ever. The session is
/// ended on the server from a fresh connection, which frees them. A
/// connection found gone loses the session too.
macro_rules! on_owner {
    ($shared:expr, $what:expr, |$dialect:ident, $conn:ident| $call:expr) => {
        on_owner!(@run $shared, $what, false, |$dialect, $conn| $call)
    };
    // A statement that writes: a connection that breaks before its answer
    // (not one the server ended, which ends the statement too) leaves the
    // writes applied or not, and says so (`Unavailable`), where another
    // statement reports the session's loss.
    ($shared:expr, $what:expr, writes = $writes:expr, |$dialect:ident, $conn:ident| $call:expr) => {
        on_owner!(@run $shared, $what, $writes, |$dialect, $conn| $call)
    };
    (@run $shared:expr, $what:expr, $writes:expr, |$dialect:ident, $conn:ident| $call:expr) => {{
        let shared = &$shared;
        let what: &str = $what;
        let timeout = shared.options.request_timeout();
        match tokio::time::timeout(timeout, shared.owner.lock()).await {
            Err(_) => Err(timed_out(shared.doing(what), timeout)),
            Ok(mut guard) => match guard.as_mut() {
                None => Err(shared.over_error()),
                Some($conn) => {
                    let $dialect = &*shared.dialect;
                    let sent = Instant::now();
                    let bound = timeout.max(shared.options.loss_deadline());
                    let result: std::result::Result<DbResult<_>, _> = tokio::time::timeout(bound, $call).await;
                    match result {
                        Ok(Ok(value)) => {
                            shared.owner_answered(sent);
                            Ok(value)
                        }
                        Ok(Err(error)) => {
                            let gone = connection_gone(&error);
                            let unknown = $writes && gone && !crate::error::ended_by_the_server(&error);
                            if crate::error::is_lock_timeout(&error) {
                                shared.spawn_reap_stale();
                            }
                            let mapped = map(shared.doing(what), error);
                            if gone {
                                // Every guard went with the connection.
                                guard.take();
                                drop(guard);
                                shared.lose("the session's connection ended");
                                if unknown {
                                    let doing = shared.doing(what);
                                    Err(Error::unavailable(
                                        doing.backend,
                                        format!(
                                            "{} on {}: the connection ended before the answer, so the writes may or \
                                             may not have been applied (all of them or none); the session is lost",
                                            doing.what, doing.target
                                        ),
                                    ))
                                } else {
                                    Err(shared.over_error())
                                }
                            } else {
                                shared.owner_answered(sent);
                                Err(mapped)
                            }
                        }
                        Err(_) => {
                            // Lost first, then the connection closed: closing
                            // it frees its guards on the server at once, and
                            // no one may be granted them before the holders
                            // are told.
                            shared.lose(
                                "a statement on the connection that holds the session's locks had no answer within \
                                 the request timeout (the connection may have gone silent)",
                            );
                            guard.take();
                            drop(guard);
                            Err(timed_out(shared.doing(what), bound))
                        }
                    }
                }
            },
        }
    }};
}

/// Runs one statement on the control connection (opened if it is not),
/// bounded by the request timeout; a broken one is dropped, to be opened
/// again next time.
macro_rules! on_control {
    ($shared:expr, $what:expr, |$dialect:ident, $conn:ident| $call:expr) => {{
        let shared = &$shared;
        let what: &str = $what;
        let timeout = shared.options.request_timeout();
        let run = async {
            let mut guard = shared.control.lock().await;
            if guard.is_none() {
                let (conn, _) = shared
                    .dialect
                    .connect(Purpose::Control)
                    .await
                    .map_err(|e| map(shared.doing("open the control connection"), e))?;
                *guard = Some(conn);
            }
            let Some($conn) = guard.as_mut() else {
                return Err(shared.over_error());
            };
            let $dialect = &*shared.dialect;
            let result: DbResult<_> = $call.await;
            match result {
                Ok(value) => Ok(value),
                Err(error) => {
                    if connection_gone(&error) {
                        guard.take();
                    }
                    Err(map(shared.doing(what), error))
                }
            }
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(result) => result,
            Err(_) => {
                // Cut off in the middle of a statement: start afresh.
                if let Ok(mut guard) = shared.control.try_lock() {
                    guard.take();
                }
                Err(timed_out(shared.doing(what), timeout))
            }
        }
    }};
}

/// An owner's heartbeat count as first seen (see `Shared::beats`).
#[derive(Debug, Clone, Copy)]
struct Seen {
    count: i64,
    ttl: Duration,
    at: Instant,
}

/// A waiter with no wait connection (see `Shared::overflow`).
struct Overflow {
    id: i64,
    version: Option<i64>,
    gone: Arc<Stop>,
    /// Set with `gone` when the entry was lost with its owner's connection.
    lost: Arc<AtomicBool>,
}

/// How often waiters with no wait connection have their entries looked at
/// (one statement for all of a session's): only while a session has more
/// waiters than wait connections.
pub(crate) const OVERFLOW_RECHECK: Duration = Duration::from_millis(100);

impl<D: Dialect> Shared<D> {
    fn doing<'a>(&'a self, what: &'a str) -> Doing<'a> {
        Doing {
            backend: self.dialect.backend(),
            what,
            target: &self.target,
        }
    }

    /// Records that the owning connection answered a statement sent at `sent`.
    fn owner_answered(&self, sent: Instant) {
        let mut confirmed = self.owner_confirmed.lock().unwrap_or_else(PoisonError::into_inner);
        if sent > *confirmed {
            *confirmed = sent;
        }
    }

    /// The send time of the last statement the owning connection answered.
    fn owner_confirmed(&self) -> Instant {
        *self.owner_confirmed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `owner`'s heartbeat as read in an answer that arrived just
    /// now; whether its count has not moved for its TTL since an answer
    /// first carried it. The time is when the answer arrived, never when
    /// the question was sent: the renewal that wrote the count was sent
    /// before, so its sender's loss deadline (`ttl - margin` after that
    /// send) has passed when this says silent.
    fn silent(&self, owner: &str, beat: Beat) -> bool {
        let now = Instant::now();
        let ttl = Duration::from_millis(u64::try_from(beat.ttl_ms).unwrap_or(0));
        let mut beats = self.beats.lock().unwrap_or_else(PoisonError::into_inner);
        match beats.get(owner) {
            Some(seen) if seen.count == beat.count => now.duration_since(seen.at) >= seen.ttl,
            _ => {
                if beats.len() >= 4096 {
                    beats.clear();
                }
                beats.insert(
                    owner.to_owned(),
                    Seen {
                        count: beat.count,
                        ttl,
                        at: now,
                    },
                );
                false
            }
        }
    }

    /// How long a wait on an entry of `owner` may block on the server
    /// before its heartbeat is read again: until it could be judged silent,
    /// at most our own TTL (the server also caps it at a third of the
    /// owner's TTL).
    fn wait_bound(&self, owner: &str) -> Duration {
        let ttl = self.options.ttl();
        let beats = self.beats.lock().unwrap_or_else(PoisonError::into_inner);
        match beats.get(owner) {
            Some(seen) => (seen.at + seen.ttl)
                .saturating_duration_since(Instant::now())
                .min(seen.ttl / 3)
                .clamp(Duration::from_millis(1), ttl),
            None => ttl,
        }
    }

    /// Records how an entry of another session this session waited on went
    /// (for a lock-delay's `departure`): lost with its owner's connection
    /// or session, or released.
    fn saw_go(&self, entry: &Entry, lost: bool) {
        if self.options.lock_delay().is_zero() || entry.owner.as_deref() == Some(self.id.as_str()) {
            return;
        }
        let Some((_, id)) = parse_entry_key(&entry.key) else {
            return;
        };
        let mut departures = self.departures.lock().unwrap_or_else(PoisonError::into_inner);
        if departures.len() > 4096 {
            departures.clear();
        }
        departures.insert(id, lost.then(Instant::now));
    }

    /// Forgets an owner's heartbeat (its session ended).
    fn forget_beat(&self, owner: &str) {
        self.beats.lock().unwrap_or_else(PoisonError::into_inner).remove(owner);
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<Gone>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn over_error(&self) -> Error {
        match *self.state.borrow() {
            SessionState::Closed => Error::Closed {
                session: self.id.clone(),
            },
            _ => Error::SessionLost {
                session: self.id.clone(),
            },
        }
    }

    fn check_live(&self) -> Result<()> {
        if self.state.borrow().is_over() {
            Err(self.over_error())
        } else {
            Ok(())
        }
    }

    /// Marks one of our entries gone.
    fn forget(&self, id: i64) {
        if let Some(gone) = self.entries().remove(&id) {
            gone.signal();
        }
        self.turns_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        self.behind
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, turn| turn.as_ref().is_none_or(|t| t.id != id));
    }

    /// Notes which entry the waiter of our entry `turn.id` waits on next,
    /// from the nearest earlier entries a read gave it (the rule's blocker
    /// is the `count`-th of them, as the core picks it), so that the wait
    /// on that entry reads the waiter's turn too.
    fn note_blocker(&self, turn: Turn, nearest: &[Row]) {
        let Some(blocker) = usize::try_from(turn.count)
            .ok()
            .and_then(|count| nearest.get(count.checked_sub(1)?))
        else {
            return;
        };
        if blocker.session == self.id {
            // Our own entry: its wait reads nothing on the server.
            return;
        }
        let mut behind = self.behind.lock().unwrap_or_else(PoisonError::into_inner);
        if behind.len() > TURNS_KEPT {
            behind.clear();
        }
        behind
            .entry(blocker.id)
            .and_modify(|other| {
                if other.as_ref().is_some_and(|o| o.id != turn.id) {
                    *other = None;
                } else {
                    *other = Some(turn.clone());
                }
            })
            .or_insert(Some(turn));
    }

    /// Keeps a turn a wait read, for the waiter's next `earlier`.
    fn keep_turn(&self, turn: &Turn, read: TurnRead) {
        let mut kept = self.turns_read.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() > TURNS_KEPT {
            kept.clear();
        }
        kept.insert(turn.id, (turn.skip_shared, turn.count, read));
    }

    /// The turn a wait read for our entry `id`, if it read the same one.
    fn take_turn(&self, id: i64, skip_shared: bool, count: i32) -> Option<TurnRead> {
        let kept = self
            .turns_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)?;
        (kept.0 == skip_shared && kept.1 == count).then_some(kept.2)
    }

    fn signal_gone_all(&self) {
        for gone in self.entries().values() {
            gone.signal();
        }
    }

    /// Declares the session lost: its holders and waiters learn it at once;
    /// the owning connection is closed (the server frees its guards) and its
    /// rows deleted as far as the server answers.
    fn lose(self: &Arc<Self>, why: &str) {
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
    async fn end_on_server(&self) {
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
    async fn renew(self: &Arc<Self>) -> Result<bool> {
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
    async fn renew_within(self: &Arc<Self>, bound: Duration) -> Result<bool> {
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
    async fn end_grace(&self) {
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
    async fn prove_owner(self: &Arc<Self>, since: Instant) {
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
    async fn prove_owner_each_interval(self: Arc<Self>, opened_at: Instant) {
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
    async fn keep_alive(self: Arc<Self>, opened_at: Instant) {
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

    /// A wait connection for a waiter with `priority`, opened if the pool
    /// has room.
    async fn lease(&self, priority: i64) -> Result<Lease<D::Conn>> {
        let mut lease = self.waits.acquire(priority).await.ok_or_else(|| self.over_error())?;
        if lease.conn.is_none() {
            let timeout = self.options.connect_timeout();
            match tokio::time::timeout(timeout, self.dialect.connect(Purpose::Wait)).await {
                Ok(Ok((conn, server_id))) => lease.conn = Some(Idle { conn, server_id }),
                Ok(Err(error)) => {
                    self.waits.release(lease.key, None);
                    return Err(map(self.doing("open a wait connection"), error));
                }
                Err(_) => {
                    self.waits.release(lease.key, None);
                    return Err(timed_out(self.doing("open a wait connection"), timeout));
                }
            }
        }
        Ok(lease)
    }

    /// Waits on the server until the lock `on` names is free, on one wait
    /// connection, in a task of its own so that a waiter dropped midway
    /// still ends the server-side wait (cancel) and gets the connection back.
    /// `Ok(true)` when the entry went with its owner's connection or
    /// session (lost), `Ok(false)` when its owner released it.
    async fn wait_on(self: &Arc<Self>, on: WaitOn, owner: &str, priority: i64) -> Result<bool> {
        self.wait_on_reading(on, owner, priority, None).await
    }

    /// As [`wait_on`](Self::wait_on) on entry `id`'s guard, reading the
    /// waiter's `turn` in the wait's own statement; the turn as read, when
    /// the wait read it (a wait of a waiter without a wait connection, or
    /// one cut short, reads nothing: the waiter reads on its own).
    async fn wait_on_turn(
        self: &Arc<Self>,
        id: i64,
        owner: &str,
        priority: i64,
        turn: Turn,
    ) -> Result<(bool, Option<TurnRead>)> {
        let slot: TurnSlot = Arc::new((turn, std::sync::Mutex::new(None)));
        let lost = self
            .wait_on_server(WaitOn::Guard(id), owner, priority, None, Some(&slot))
            .await?;
        let read = slot.1.lock().unwrap_or_else(PoisonError::into_inner).take();
        if lost && self.reset_grace {
            // Read before the reset holder was outlived: stale.
            self.outlive(owner, id).await?;
            return Ok((lost, None));
        }
        Ok((lost, read))
    }

    /// As [`wait_on`](Self::wait_on); a lock-mode watch's wait also puts
    /// into `found` the entry as it read it after waking, if it did.
    async fn wait_on_reading(
        self: &Arc<Self>,
        on: WaitOn,
        owner: &str,
        priority: i64,
        found: Option<&FoundSlot>,
    ) -> Result<bool> {
        let lost = self.wait_on_server(on, owner, priority, found, None).await?;
        if lost && self.reset_grace {
            if let WaitOn::Guard(id) | WaitOn::Watch(id, _) = on {
                self.outlive(owner, id).await?;
            }
        }
        Ok(lost)
    }

    /// With the reset grace: after `owner`'s entry `id` was freed with its
    /// owner's connection, waits until that owner has heard `lost()` (its
    /// session row is gone: it ends its session itself at its next
    /// heartbeat, after telling its holders) or its heartbeat has stood
    /// still for its TTL by our clock (then it is ended here). Its count is
    /// read a few times a TTL meanwhile: there is nothing on the server to
    /// block on once a connection is gone.
    async fn outlive(self: &Arc<Self>, owner: &str, id: i64) -> Result<()> {
        loop {
            self.check_live()?;
            let beat = on_control!(self, "look at a reset holder's session", |d, conn| d
                .beat_of(conn, owner))?;
            let Some(beat) = beat else {
                return Ok(());
            };
            if self.silent(owner, beat) {
                let reaped = on_control!(self, "end a reset holder's session", |d, conn| d
                    .reap(conn, owner, id, beat.count))?;
                if reaped != Reaped::Renewed {
                    self.forget_beat(owner);
                    return Ok(());
                }
                continue;
            }
            tokio::time::sleep(self.wait_bound(owner)).await;
        }
    }

    /// Waits on the server (see `wait_on`).
    async fn wait_on_server(
        self: &Arc<Self>,
        on: WaitOn,
        owner: &str,
        priority: i64,
        found: Option<&FoundSlot>,
        turn: Option<&TurnSlot>,
    ) -> Result<bool> {
        loop {
            self.check_live()?;
            // While no wait connection is free, the overflow check looks at
            // the entry (with every other such waiter's, in one statement)
            // and says when it is gone: a waiter beyond the connections is
            // not stuck behind waits that may last long (another lock held
            // for hours, an election).
            let (key, gone, lost) = self.register_overflow(on);
            let lease = tokio::select! {
                lease = self.lease(priority) => lease,
                () = gone.wait() => {
                    self.unregister_overflow(key);
                    return Ok(lost.load(Ordering::SeqCst));
                }
            };
            self.unregister_overflow(key);
            let lease = lease?;
            let stop = Arc::new(Stop::default());
            let (tx, rx) = oneshot::channel();
            let task = WaitTask {
                shared: Arc::clone(self),
                on,
                owner: owner.to_owned(),
                stop: Arc::clone(&stop),
                found: found.cloned(),
                turn: turn.cloned(),
            };
            tokio::spawn(task.run(lease, tx));
            let _stop_on_drop = StopOnDrop(stop);
            match rx.await {
                Ok(TaskOutcome::Released) => return Ok(false),
                Ok(TaskOutcome::Lost) => return Ok(true),
                Ok(TaskOutcome::Preempted) => {}
                Ok(TaskOutcome::Failed(error)) => return Err(error),
                Err(_) => return Err(self.over_error()),
            }
        }
    }

    fn register_overflow(&self, on: WaitOn) -> (u64, Arc<Stop>, Arc<AtomicBool>) {
        let key = self.next_overflow.fetch_add(1, Ordering::Relaxed);
        let gone = Arc::new(Stop::default());
        let lost = Arc::new(AtomicBool::new(false));
        let (id, version) = match on {
            WaitOn::Guard(id) => (id, None),
            WaitOn::Version(id, version) => (id, Some(version)),
            WaitOn::Watch(id, at) => (id, Some(at.version)),
        };
        self.overflow.lock().unwrap_or_else(PoisonError::into_inner).insert(
            key,
            Overflow {
                id,
                version,
                gone: Arc::clone(&gone),
                lost: Arc::clone(&lost),
            },
        );
        (key, gone, lost)
    }

    fn unregister_overflow(&self, key: u64) {
        self.overflow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
    }

    /// Looks at the entries of waiters that have no wait connection, every
    /// [`OVERFLOW_RECHECK`] while there are any: wakes those whose entry is
    /// gone (or whose value changed), and ends the sessions past their TTL
    /// that hold the others (as a waiter with a connection would).
    async fn check_overflow(self: Arc<Self>) {
        loop {
            tokio::time::sleep(OVERFLOW_RECHECK).await;
            if self.state.borrow().is_over() {
                return;
            }
            // Each waiter's entry id, the version it waits for, and how to wake it.
            let waiting: Vec<(i64, Option<i64>, Wake)> = self
                .overflow
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .map(|o| {
                    let wake = (Arc::clone(&o.gone), Arc::clone(&o.lost));
                    (o.id, o.version, wake)
                })
                .collect();
            if waiting.is_empty() {
                continue;
            }
            let mut ids: Vec<(i64, i64)> = waiting.iter().map(|(id, v, ..)| (*id, v.unwrap_or(-1))).collect();
            ids.sort_unstable();
            ids.dedup();
            let statuses = match on_control!(self, "look at queued waits", |d, conn| d.statuses(conn, &ids)) {
                Ok(statuses) => statuses,
                Err(error) => {
                    tracing::debug!(session = %self.id, %error, "could not look at queued waits");
                    continue;
                }
            };
            for (id, version, status, owner, beat) in statuses {
                match status {
                    Status::Free | Status::Dead => {
                        for (_, _, (gone, lost)) in waiting
                            .iter()
                            .filter(|(i, v, ..)| *i == id && v.unwrap_or(-1) == version)
                        {
                            lost.store(status == Status::Dead, Ordering::SeqCst);
                            gone.signal();
                        }
                    }
                    Status::Held => {
                        if let Some(beat) = beat {
                            if self.silent(&owner, beat) {
                                self.spawn_reap(owner, id, beat.count);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Ends a session past its TTL that holds an entry a waiter without a
    /// connection waits on, through a connection of its own (the step can
    /// take seconds: the server ends the connection first).
    fn spawn_reap(self: &Arc<Self>, owner: String, id: i64, beat: i64) {
        if !self
            .reaping
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owner.clone())
        {
            return;
        }
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let timeout = shared.options.request_timeout() + Duration::from_secs(5);
            let reap = async {
                let (mut conn, _) = shared.dialect.connect(Purpose::Wait).await?;
                shared.dialect.reap(&mut conn, &owner, id, beat).await
            };
            match tokio::time::timeout(timeout, reap).await {
                Ok(Ok(Reaped::Ended)) => {
                    tracing::info!(session = %shared.id, %owner, "ended a session that stopped renewing");
                    shared.forget_beat(&owner);
                }
                Ok(Ok(Reaped::Gone)) => shared.forget_beat(&owner),
                Ok(Ok(Reaped::Renewed)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(session = %shared.id, %owner, %error, "could not end a silent session")
                }
                Err(_) => tracing::debug!(session = %shared.id, %owner, "ending a silent session took too long"),
            }
            shared
                .reaping
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&owner);
        });
    }

    /// Ends every session past its TTL, in the background (once at a
    /// time): after a statement of this session waited too long on a row
    /// lock, which a silent session may hold from a transaction it was in
    /// when it went silent.
    fn spawn_reap_stale(self: &Arc<Self>) {
        if !self
            .reaping
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(String::new())
        {
            return;
        }
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let timeout = shared.options.request_timeout() + Duration::from_secs(10);
            let reap = async {
                let (mut conn, _) = shared.dialect.connect(Purpose::Wait).await?;
                let mut ended = 0u64;
                for (owner, beat, entry) in shared.dialect.beats(&mut conn).await? {
                    if owner != shared.id
                        && shared.silent(&owner, beat)
                        && shared.dialect.reap(&mut conn, &owner, entry, beat.count).await? == Reaped::Ended
                    {
                        shared.forget_beat(&owner);
                        ended += 1;
                    }
                }
                Ok::<_, sqlx::Error>(ended)
            };
            match tokio::time::timeout(timeout, reap).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(session = %shared.id, ended = n, "ended sessions that stopped renewing"),
                Ok(Err(error)) => tracing::debug!(session = %shared.id, %error, "could not end silent sessions"),
                Err(_) => tracing::debug!(session = %shared.id, "ending silent sessions took too long"),
            }
            shared.reaping.lock().unwrap_or_else(PoisonError::into_inner).remove("");
        });
    }
}

/// What a wait blocks on.
#[derive(Debug, Clone, Copy)]
enum WaitOn {
    /// An entry's guard: until it is gone.
    Guard(i64),
    /// An election entry's value version: until its owner writes it.
    Version(i64, i64),
    /// A lock-mode entry at a version, and its owner's value lock of an
    /// epoch: until anyone writes it, or it is gone.
    Watch(i64, Watched<()>),
}

/// How one server-side wait ended: on its own, or stopped (and then
/// whether the statement finished cleanly after the cancel, if it finished).
enum Step {
    Done(DbResult<Waited>),
    /// No answer within the wait's bound and the request timeout.
    Silent,
    Stopped(Option<bool>),
}

enum TaskOutcome {
    Released,
    /// Free because its owner's connection or session ended.
    Lost,
    Preempted,
    Failed(Error),
}

/// Signals a wait task to stop when the waiter goes away.
struct StopOnDrop(Arc<Stop>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.signal();
    }
}

struct WaitTask<D: Dialect> {
    shared: Arc<Shared<D>>,
    on: WaitOn,
    owner: String,
    stop: Arc<Stop>,
    /// Where a lock-mode watch's wait puts the entry as it read it.
    found: Option<FoundSlot>,
    /// Where a wait on a guard that reads its waiter's turn puts the read.
    turn: Option<TurnSlot>,
}

/// A waiter's turn to read in its wait's own statement, and where the wait
/// puts what it read.
type TurnSlot = Arc<(Turn, std::sync::Mutex<Option<TurnRead>>)>;

/// The entry as a watch's wait read it after waking (see
/// `Dialect::wait_watch`), for the watcher to take.
type FoundSlot = Arc<std::sync::Mutex<Option<Found>>>;

impl<D: Dialect> WaitTask<D> {
    async fn run(self, mut lease: Lease<D::Conn>, reply: oneshot::Sender<TaskOutcome>) {
        let Some(mut idle) = lease.conn.take() else {
            self.shared.waits.release(lease.key, None);
            return;
        };
        let (outcome, keep) = self.wait(&mut idle, &lease.preempt).await;
        self.shared.waits.release(lease.key, keep.then_some(idle));
        let _ = reply.send(outcome);
    }

    /// Returns the outcome and whether the connection may be used again.
    ///
    /// Each server-side wait is bounded (see `Shared::wait_bound`), and so
    /// is the await of its answer, by that bound plus the request timeout:
    /// a wait connection that stops answering (a NAT forgot the flow) is
    /// given up and the wait asked again on a fresh one, instead of leaving
    /// its waiter — who may be next in line — deaf to the release.
    async fn wait(&self, idle: &mut Idle<D::Conn>, preempt: &Stop) -> (TaskOutcome, bool) {
        let shared = &self.shared;
        let dialect = &*shared.dialect;
        let request_timeout = shared.options.request_timeout();
        // Set once this wait ended the owner's session: what frees the
        // entry then is that end, not a release.
        let mut lost_by_reaping = false;
        loop {
            let stopped = async {
                tokio::select! {
                    () = self.stop.wait() => {}
                    () = preempt.wait() => {}
                }
            };
            let server_id = idle.server_id;
            let bound = shared.wait_bound(&self.owner);
            let bound_ms = i64::try_from(bound.as_millis()).unwrap_or(i64::MAX).max(1);
            let step = {
                let call = async {
                    match self.on {
                        WaitOn::Guard(id) => match &self.turn {
                            Some(slot) => {
                                let waited = dialect
                                    .wait_turn(&mut idle.conn, id, &self.owner, bound_ms, &slot.0)
                                    .await;
                                waited.map(|(waited, read)| {
                                    if let Some(read) = read {
                                        *slot.1.lock().unwrap_or_else(PoisonError::into_inner) = Some(read);
                                    }
                                    waited
                                })
                            }
                            None => dialect.wait(&mut idle.conn, id, &self.owner, bound_ms).await,
                        },
                        WaitOn::Version(id, version) => {
                            dialect
                                .wait_version(&mut idle.conn, id, version, &self.owner, bound_ms)
                                .await
                        }
                        WaitOn::Watch(id, at) => {
                            let watched = dialect
                                .wait_watch(&mut idle.conn, id, at, &shared.id, &self.owner, bound_ms)
                                .await;
                            watched.map(|(waited, found)| {
                                if let (Some(slot), Some(found)) = (&self.found, found) {
                                    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(found);
                                }
                                waited
                            })
                        }
                    }
                };
                tokio::pin!(call);
                tokio::select! {
                    result = tokio::time::timeout(bound + request_timeout, &mut call) => match result {
                        Ok(result) => Step::Done(result),
                        Err(_) => Step::Silent,
                    },
                    () = stopped => {
                        // End the server-side wait, then read what it
                        // answered: a wait that ended on its own just before
                        // is harmless (it let go of what it took).
                        let cancelled = on_control!(shared, "cancel a wait", |d, conn| d.cancel(conn, server_id));
                        let finished = if cancelled.is_ok() {
                            tokio::time::timeout(request_timeout, &mut call).await.ok()
                        } else {
                            None
                        };
                        Step::Stopped(finished.map(|r| r.is_ok()))
                    }
                }
            };
            let waited = match step {
                Step::Done(waited) => waited,
                Step::Silent => return self.silent_connection(server_id),
                Step::Stopped(finished) => {
                    let usable = match finished {
                        Some(true) => true,
                        Some(false) => tokio::time::timeout(request_timeout, dialect.reset(&mut idle.conn))
                            .await
                            .is_ok_and(|r| r.is_ok()),
                        None => false,
                    };
                    let outcome = if self.stop.is_set() {
                        TaskOutcome::Failed(shared.over_error())
                    } else {
                        TaskOutcome::Preempted
                    };
                    return (outcome, usable && !shared.state.borrow().is_over());
                }
            };
            let beat = match waited {
                Ok(Waited::Released) if lost_by_reaping => return (TaskOutcome::Lost, true),
                Ok(Waited::Released) => return (TaskOutcome::Released, true),
                Ok(Waited::Lost) => return (TaskOutcome::Lost, true),
                Ok(Waited::TimedOut(beat)) => beat,
                // A writer's wake (MariaDB/MySQL): a watcher reads its
                // entry again; any other wait was hit by a wake meant for
                // this connection's watch before, and asks again.
                Ok(Waited::Interrupted) => {
                    if matches!(self.on, WaitOn::Watch(..)) {
                        return (TaskOutcome::Released, true);
                    }
                    continue;
                }
                Err(error) if interrupted(&error) && !self.stop.is_set() => {
                    let reset = tokio::time::timeout(request_timeout, dialect.reset(&mut idle.conn)).await;
                    if !reset.is_ok_and(|r| r.is_ok()) {
                        return (TaskOutcome::Preempted, false);
                    }
                    if matches!(self.on, WaitOn::Watch(..)) {
                        return (TaskOutcome::Released, true);
                    }
                    continue;
                }
                Err(error) => {
                    return (TaskOutcome::Failed(map(shared.doing("wait on a guard"), error)), false);
                }
            };
            // The owner did not let go within the bound: end it if its
            // heartbeat has not moved for its TTL by our clock.
            let reaped = match beat {
                Some(beat) if shared.silent(&self.owner, beat) => {
                    let id = match self.on {
                        WaitOn::Guard(id) | WaitOn::Version(id, _) | WaitOn::Watch(id, _) => id,
                    };
                    let reaping = dialect.reap(&mut idle.conn, &self.owner, id, beat.count);
                    match tokio::time::timeout(request_timeout, reaping).await {
                        Ok(Ok(reaped)) => reaped,
                        Ok(Err(error)) if interrupted(&error) && !self.stop.is_set() => {
                            // A wake meant for this connection's watch
                            // before: look again, on a fresh connection.
                            return (TaskOutcome::Preempted, false);
                        }
                        Ok(Err(error)) => {
                            // Not reused: a statement that failed may have
                            // left a transaction (and its row locks) open.
                            return (
                                TaskOutcome::Failed(map(shared.doing("end a silent holder's session"), error)),
                                false,
                            );
                        }
                        Err(_) => return self.silent_connection(server_id),
                    }
                }
                Some(_) => Reaped::Renewed,
                // No session row: nothing to judge; wait again (a version
                // lock's owner is gone with it).
                None => Reaped::Gone,
            };
            match reaped {
                Reaped::Renewed => {}
                Reaped::Gone | Reaped::Ended => {
                    if reaped == Reaped::Ended {
                        tracing::info!(session = %shared.id, owner = %self.owner, "ended a session that stopped renewing");
                        lost_by_reaping = true;
                    }
                    shared.forget_beat(&self.owner);
                    // Its guard is free, or will be once the server has
                    // ended its connection: wait for that too.
                    if matches!(self.on, WaitOn::Version(..) | WaitOn::Watch(..)) {
                        return (TaskOutcome::Released, true);
                    }
                }
            }
        }
    }

    /// A wait connection that stopped answering: given up (never used
    /// again), and the wait asked again on a fresh one.
    fn silent_connection(&self, server_id: i64) -> (TaskOutcome, bool) {
        tracing::warn!(
            session = %self.shared.id,
            server_id,
            target = %self.shared.target,
            "a wait connection stopped answering; waiting again on a fresh one"
        );
        (TaskOutcome::Preempted, false)
    }
}

impl<D: Dialect> SqlSession<D> {
    /// Opens a session: the owning connection, the tables checked, the
    /// session registered, the heartbeat started.
    pub(crate) async fn open(
        dialect: Arc<D>,
        target: String,
        options: SessionOptions,
        wait_connections: usize,
        restart_grace: bool,
        reset_grace: bool,
    ) -> Result<Self> {
        let doing = Doing {
            backend: dialect.backend(),
            what: "open a session",
            target: &target,
        };
        let connect_timeout = options.connect_timeout();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let opened_at = Instant::now();
        let opening = async {
            let (mut conn, server_id) = dialect.connect(Purpose::Owner).await.map_err(|e| map(doing, e))?;
            dialect.prepare(&mut conn).await?;
            let ttl_ms = i64::try_from(options.ttl().as_millis()).unwrap_or(i64::MAX);
            let grace = dialect.open(&mut conn, &id, ttl_ms).await.map_err(|e| map(doing, e))?;
            // The whole grace, counted from the answer's arrival (after the
            // grace began): whenever this session opened in it, it waits all
            // of it by its own clock.
            let grace = grace.map(|g| {
                let ms = u64::try_from(g.ms).unwrap_or(0);
                (Instant::now() + Duration::from_millis(ms), g.id)
            });
            let (control, _) = dialect.connect(Purpose::Control).await.map_err(|e| map(doing, e))?;
            Ok::<_, Error>((conn, server_id, control, grace))
        };
        let (conn, owner_server_id, control, grace) = match tokio::time::timeout(connect_timeout, opening).await {
            Ok(opened) => opened?,
            Err(_) => {
                return Err(Error::unavailable(
                    dialect.backend(),
                    format!("no session opened on {target} within the connect timeout {connect_timeout:?}"),
                ))
            }
        };
        let (notices, notices_task) = if dialect.notifies() {
            let (notices, task) = Notices::start(
                Arc::clone(&dialect),
                options.keepalive_interval(),
                options.request_timeout(),
            );
            (Some(notices), Some(task))
        } else {
            (None, None)
        };
        let shared = Arc::new(Shared {
            dialect,
            id,
            target,
            options,
            state: watch::Sender::new(SessionState::Live),
            owner: tokio::sync::Mutex::new(Some(conn)),
            owner_server_id,
            owner_confirmed: std::sync::Mutex::new(opened_at),
            proving: AtomicBool::new(false),
            control: tokio::sync::Mutex::new(Some(control)),
            waits: WaitPool::new(wait_connections),
            overflow: std::sync::Mutex::new(HashMap::new()),
            next_overflow: std::sync::atomic::AtomicU64::new(0),
            reaping: std::sync::Mutex::new(std::collections::HashSet::new()),
            departures: std::sync::Mutex::new(HashMap::new()),
            beats: std::sync::Mutex::new(HashMap::new()),
            grace_until: grace.filter(|&(until, _)| restart_grace && until > Instant::now()),
            grace_ended: tokio::sync::Mutex::new(false),
            reset_grace,
            entries: std::sync::Mutex::new(HashMap::new()),
            behind: std::sync::Mutex::new(HashMap::new()),
            turns_read: std::sync::Mutex::new(HashMap::new()),
            notices,
        });
        let keepalive = tokio::spawn(Arc::clone(&shared).keep_alive(opened_at)).abort_handle();
        let prove = tokio::spawn(Arc::clone(&shared).prove_owner_each_interval(opened_at)).abort_handle();
        let overflow = tokio::spawn(Arc::clone(&shared).check_overflow()).abort_handle();
        let mut tasks = vec![keepalive, prove, overflow];
        tasks.extend(notices_task);
        if let Some((until, _)) = shared.grace_until {
            let waited = Arc::clone(&shared);
            tasks.push(
                tokio::spawn(async move {
                    tokio::time::sleep_until(until).await;
                    waited.end_grace().await;
                })
                .abort_handle(),
            );
        }
        let state = shared.state.subscribe();
        Ok(SqlSession { shared, state, tasks })
    }

    fn id_of(&self, entry: &Entry) -> Result<(String, i64)> {
        parse_entry_key(&entry.key)
            .map(|(name, id)| (name.to_owned(), id))
            .ok_or_else(|| Error::InvalidName {
                name: entry.key.clone(),
                reason: "not an entry of the SQL layout (NAME/ID)".into(),
            })
    }

    fn entry_from(&self, name: &str, row: &Row) -> Entry {
        Entry {
            key: entry_key(name, row.id),
            kind: kind_from_label(&row.kind),
            order: row.id,
            token: FencingToken::new(row.id.unsigned_abs()),
            owner: Some(row.session.clone()),
        }
    }

    /// Waits until a lock-mode entry's value differs from `seen` (the new
    /// value) or the entry is gone (`None`). On the server, on the lock its
    /// owner holds for the entry's version (a write by its owner, its
    /// removal, the end of its owner's connection); a write by another
    /// session is heard on the entry's channel (PostgreSQL) or wakes the
    /// wait itself (MariaDB/MySQL, see the watch procedure).
    async fn watch_lock_mode(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        let (_, id) = self.id_of(entry)?;
        let shared = &self.shared;
        let owner = entry.owner.clone().unwrap_or_default();
        let mut notices = match &shared.notices {
            None => None,
            Some(notices) => {
                let timeout = shared.options.request_timeout();
                match tokio::time::timeout(timeout, notices.subscribe(id)).await {
                    Err(_) => return Err(timed_out(shared.doing("listen for the entry's writes"), timeout)),
                    Ok(None) => return Err(shared.over_error()),
                    Ok(Some(Err(error))) => return Err(map(shared.doing("listen for the entry's writes"), error)),
                    Ok(Some(Ok(subscription))) => Some(subscription),
                }
            }
        };
        // Whether the last wait saw the entry's owner's connection end (the
        // entry's value lock free with the entry still there).
        let mut lost = false;
        // The entry as the last wait read it after waking: no read needed.
        // (Read before the notices are marked seen below: a write after it
        // moved the version, at which the next wait returns at once.)
        let mut woken: Option<Found> = None;
        loop {
            shared.check_live()?;
            if let Some(notices) = notices.as_mut() {
                notices.seen();
            }
            let found = match woken.take() {
                Some(found) => found,
                None => on_owner!(shared, "read the entry's value", |d, conn| d
                    .watch_read(conn, id, &shared.id))?,
            };
            let (value, version, epoch) = match found {
                Some((Watched { value, version, epoch }, true)) => (value, version, epoch),
                // There with its guard free: gone with its owner's
                // connection (or, its wait having seen that, deleted by
                // whoever met it dead).
                Some((_, false)) => {
                    shared.saw_go(entry, true);
                    return Ok(None);
                }
                None => {
                    shared.saw_go(entry, lost);
                    return Ok(None);
                }
            };
            if value != seen {
                return Ok(Some(value));
            }
            let at = Watched {
                value: (),
                version,
                epoch,
            };
            // A slot of this wait's own: a wait dropped for a notice may
            // still answer into its slot later.
            let slot = FoundSlot::default();
            let waited = shared.wait_on_reading(WaitOn::Watch(id, at), &owner, entry.order, Some(&slot));
            lost = match notices.as_mut() {
                Some(notices) => {
                    tokio::select! {
                        () = notices.changed() => false,
                        waited = waited => waited?,
                    }
                }
                None => waited.await?,
            };
            woken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        }
    }

    /// The session's owning connection's server-side id.
    #[allow(dead_code)]
    pub(crate) fn owner_server_id(&self) -> i64 {
        self.shared.owner_server_id
    }

    /// The session's dialect (its tables' names and statements).
    pub(crate) fn dialect(&self) -> &D {
        &self.shared.dialect
    }

    /// Where the session is connected, for messages.
    pub(crate) fn target(&self) -> &str {
        &self.shared.target
    }
}

fn count_of(count: usize) -> i32 {
    i32::try_from(count.max(1)).unwrap_or(i32::MAX)
}

#[async_trait::async_trait]
impl<D: Dialect> BackendSession for SqlSession<D> {
    fn id(&self) -> &str {
        &self.shared.id
    }

    fn state(&self) -> watch::Receiver<SessionState> {
        self.state.clone()
    }

    async fn append(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        let shared = &self.shared;
        shared.check_live()?;
        let append = Append {
            name: request.dir,
            kind: kind_label(request.kind),
            session: &shared.id,
            attempt: request.attempt,
            value: request.value,
            skip_shared: request.conflicts == Conflicts::Exclusive,
            count: count_of(request.nearest),
        };
        let (id, nearest) = on_owner!(shared, "append to the queue", |d, conn| d.append(conn, &append))?;
        shared.entries().entry(id).or_default();
        shared.note_blocker(
            Turn {
                id,
                name: request.dir.to_owned(),
                session: shared.id.clone(),
                skip_shared: append.skip_shared,
                count: append.count,
            },
            &nearest,
        );
        if shared.state.borrow().is_over() {
            shared.check_live()?;
        }
        let mut nearest: Vec<Entry> = nearest.iter().map(|row| self.entry_from(request.dir, row)).collect();
        nearest.truncate(request.nearest);
        Ok(Appended {
            entry: Entry {
                key: entry_key(request.dir, id),
                kind: request.kind,
                order: id,
                token: FencingToken::new(id.unsigned_abs()),
                owner: Some(shared.id.clone()),
            },
            nearest: Some(nearest),
            queue: None,
        })
    }

    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let (name, id) = self.id_of(entry)?;
        let shared = &self.shared;
        let skip_shared = conflicts == Conflicts::Exclusive;
        // Read already by the wait that woke this waiter, in its own
        // statement: no second round trip.
        let found = match shared.take_turn(id, skip_shared, count_of(count)) {
            Some(read) => read,
            None => on_owner!(shared, "read the queue", |d, conn| d.earlier(
                conn,
                id,
                &name,
                &shared.id,
                skip_shared,
                count_of(count)
            ))?,
        };
        if let Some(rows) = &found {
            shared.note_blocker(
                Turn {
                    id,
                    name: name.to_string(),
                    session: shared.id.clone(),
                    skip_shared,
                    count: count_of(count),
                },
                rows,
            );
        }
        Ok(match found {
            None => Earlier::Gone,
            Some(rows) => {
                let mut nearest: Vec<Entry> = rows.iter().map(|row| self.entry_from(&name, row)).collect();
                nearest.truncate(count);
                Earlier::Entries(nearest)
            }
        })
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let shared = &self.shared;
        let rows = on_owner!(shared, "list the queue", |d, conn| d.list(conn, dir, &shared.id))?;
        Ok(rows.iter().map(|row| self.entry_from(dir, row)).collect())
    }

    async fn wait_for_entry(&self, dir: &str) -> Result<()> {
        // Nothing on the server to block on until someone appends: look
        // again every so often (election observers, while nobody leads).
        loop {
            if !self.list(dir).await?.is_empty() {
                return Ok(());
            }
            tokio::time::sleep(EMPTY_QUEUE_RECHECK).await;
        }
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let shared = &self.shared;
        let (_, id) = self.id_of(entry)?;
        if entry.owner.as_deref() == Some(shared.id.as_str()) {
            // Our own entries: their guard is ours; renewals and our own
            // removals say when they are gone.
            let gone = shared.entries().get(&id).map(Arc::clone);
            return match gone {
                Some(gone) => {
                    gone.wait().await;
                    Ok(())
                }
                None => Ok(()),
            };
        }
        let owner = entry.owner.clone().unwrap_or_default();
        // The waiter behind it, if one of ours waits on it alone: its wait
        // reads its turn too.
        let turn = shared
            .behind
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)
            .flatten();
        let lost = match turn {
            Some(turn) => {
                let (lost, read) = shared.wait_on_turn(id, &owner, entry.order, turn.clone()).await?;
                if let Some(read) = read {
                    shared.keep_turn(&turn, read);
                }
                lost
            }
            None => shared.wait_on(WaitOn::Guard(id), &owner, entry.order).await?,
        };
        shared.saw_go(entry, lost);
        Ok(())
    }

    fn grant_not_before(&self) -> Option<Instant> {
        self.shared.grace_until.map(|(until, _)| until)
    }

    fn departure(&self, gone: &Entry) -> lockline::backend::Departure {
        use lockline::backend::Departure;
        // One of ours went by our own removal (or with our session, whose
        // loss ends the wait anyway).
        if gone.owner.as_deref() == Some(self.shared.id.as_str()) {
            return Departure::Released;
        }
        let seen = self.id_of(gone).ok().and_then(|(_, id)| {
            self.shared
                .departures
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id)
        });
        match seen {
            Some(Some(noticed)) => Departure::Lost { noticed },
            Some(None) => Departure::Released,
            // Never seen go (its wait was cut short): erring toward a delay.
            None => Departure::Lost {
                noticed: Instant::now(),
            },
        }
    }

    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let (_, id) = self.id_of(entry)?;
        let shared = &self.shared;
        let owner = entry.owner.as_deref().unwrap_or_default();
        let ours = owner == shared.id;
        let unlock = ours && shared.entries().contains_key(&id);
        let removed = on_owner!(shared, "remove the entry", |d, conn| d.remove(conn, id, owner, unlock))?;
        if ours {
            shared.forget(id);
        }
        Ok(removed)
    }

    async fn abandon(&self, _dir: &str, _kind: EntryKind, attempt: &str) -> Result<()> {
        let shared = &self.shared;
        let id = on_owner!(shared, "abandon an acquire", |d, conn| d
            .abandon(conn, attempt, &shared.id))?;
        if let Some(id) = id {
            shared.forget(id);
        }
        Ok(())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<()> {
        let (_, id) = self.id_of(entry)?;
        let shared = &self.shared;
        let owner = entry.owner.as_deref().unwrap_or_default();
        let set = on_owner!(shared, "set the entry's value", |d, conn| d
            .set_value(conn, id, owner, value))?;
        if set {
            Ok(())
        } else {
            Err(Error::LockLost { key: entry.key.clone() })
        }
    }

    async fn get_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>> {
        let (_, id) = self.id_of(entry)?;
        let shared = &self.shared;
        let found = on_owner!(shared, "read the entry's value", |d, conn| d
            .get_value(conn, id, &shared.id))?;
        Ok(found.map(|(value, _)| value))
    }

    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        if entry.kind == EntryKind::Dlm {
            return self.watch_lock_mode(entry, seen).await;
        }
        let (_, id) = self.id_of(entry)?;
        let shared = &self.shared;
        let owner = entry.owner.clone().unwrap_or_default();
        loop {
            let found = on_owner!(shared, "read the entry's value", |d, conn| d
                .get_value(conn, id, &shared.id))?;
            let Some((value, version)) = found else {
                return Ok(None);
            };
            if value != seen {
                return Ok(Some(value));
            }
            // The owner holds a lock for the value's version and lets go of
            // it when the value changes or the entry goes.
            shared
                .wait_on(WaitOn::Version(id, version), &owner, entry.order)
                .await?;
        }
    }

    async fn read_queue(&self, dir: &str) -> Result<Queue> {
        let shared = &self.shared;
        shared.check_live()?;
        let (rows, block) = on_owner!(shared, "read the queue", |d, conn| d.read_queue(conn, dir, &shared.id))?;
        let slots = rows
            .into_iter()
            .map(|row| Slot {
                entry: self.entry_from(dir, &row.row),
                value: row.value,
                version: row.version,
                changed: row.changed.unsigned_abs(),
            })
            .collect();
        Ok(Queue { slots, block })
    }

    async fn update_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let shared = &self.shared;
        shared.check_live()?;
        // An entry of another lock (or not of this layout) is not the very
        // same entry under this name: a condition on it fails.
        let under = |entry: &Entry| {
            parse_entry_key(&entry.key)
                .filter(|(name, id)| *name == update.dir && *id == entry.order)
                .map(|(_, id)| id)
        };
        let mut unchanged = Vec::with_capacity(update.unchanged.len());
        for (entry, version) in update.unchanged {
            match under(entry) {
                Some(id) => unchanged.push((id, *version)),
                None => return Ok(None),
            }
        }
        let mut present = Vec::with_capacity(update.present.len());
        for entry in update.present {
            match under(entry) {
                Some(id) => present.push(id),
                None => return Ok(None),
            }
        }
        let set = update
            .set
            .iter()
            .filter_map(|(entry, value)| Some((under(entry)?, *value)))
            .collect();
        let delete: Vec<i64> = update.delete.iter().filter_map(|entry| under(entry)).collect();
        let change = QueueChange::new(update.dir, &shared.id, &unchanged, &present, set, delete, update.block);
        let token = on_owner!(shared, "change the queue", |d, conn| d.update_queue(conn, &change))?;
        let Some(token) = token else {
            return Ok(None);
        };
        // Our own entries it deleted: their guards went with them.
        let own: Vec<i64> = update
            .delete
            .iter()
            .filter(|entry| entry.owner.as_deref() == Some(shared.id.as_str()))
            .filter_map(|entry| under(entry))
            .collect();
        for id in own {
            shared.forget(id);
        }
        Ok(Some(token.unsigned_abs()))
    }

    async fn write_if_held(&self, entry: &Entry, writes: &[Write]) -> Result<bool> {
        let (name, id) = self.id_of(entry)?;
        let below = format!("{name}/");
        if let Some(write) = writes.iter().find(|w| w.key().starts_with(&below)) {
            return Err(Error::InvalidName {
                name: write.key().to_owned(),
                reason: format!("the key lies under the lock {name:?}'s own entries ({name}/...)"),
            });
        }
        let shared = &self.shared;
        let owner = entry.owner.as_deref().unwrap_or_default();
        on_owner!(
            shared,
            "write fenced on the entry",
            writes = !writes.is_empty(),
            |d, conn| d.write_if_held(conn, id, owner, writes)
        )
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let shared = &self.shared;
        shared.check_live()?;
        on_owner!(shared, "read a key", |d, conn| d.read(conn, key))
    }

    async fn confirm(&self) -> Result<SessionState> {
        let shared = &self.shared;
        if shared.state.borrow().is_over() {
            return Ok(*shared.state.borrow());
        }
        if !shared.renew().await? {
            shared.lose("the database no longer has the session");
        }
        Ok(*shared.state.borrow())
    }

    async fn close(&self) -> Result<()> {
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

    fn give_up(&self, why: &str) {
        self.shared.lose(why);
    }
}

/// The kinds of entries as stored (for tests of the layout).
#[allow(dead_code)]
pub(crate) fn label(kind: EntryKind) -> &'static str {
    layout::kind_label(kind)
}
