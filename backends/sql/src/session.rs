//! A session: one connection that holds every guard and renews a heartbeat,
//! and a bounded pool of connections its waiters block on. Written once
//! over a [`Dialect`]; here what the session and its tasks share, the two
//! ways a statement runs (on the owning connection, on the control
//! connection), and the backend's trait; its parts by concept below:
//! `open` (opening), `liveness` (renewals, loss, close), `queue`
//! (appends, reads, waiting for an entry to go), `wait` (waits on the
//! server), `overflow` (waiters beyond the wait connections), `beats`
//! (other sessions' heartbeats), `turns` (our own entries, the turns our
//! waiters read) and `modes` (lock modes).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use lockline::backend::{
    only_owner_unblocks, AppendRequest, Appended, BackendSession, Conflicts, Earlier, Entry, EntryKind, Queue,
    QueueUpdate, Wanted,
};
use lockline::{Error, FencingToken, Result, SessionOptions, SessionState, Write};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::dialect::{Dialect, Row, Turn, TurnRead};
use crate::error::Doing;
use crate::layout::{self, entry_key, kind_from_label, parse_entry_key};
use crate::notices::Notices;
use crate::pool::{Stop, WaitPool};

/// How often an election observer looks again at a queue with no candidate
/// (the one wait that has nothing on the server to block on).
pub(crate) const EMPTY_QUEUE_RECHECK: Duration = Duration::from_millis(100);

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
    entries: std::sync::Mutex<HashMap<i64, Arc<Stop>>>,
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
    /// Lock-mode entries as this session's last queue reads found them
    /// (live then), by id: a watch of one whose value is still the one
    /// seen there starts its wait at that version and epoch instead of
    /// reading the entry first (a write since moves the version, at which
    /// the wait returns at once and reads). Taken by the watch.
    queue_reads: std::sync::Mutex<HashMap<i64, crate::dialect::Watched>>,
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
            Err(_) => Err(crate::error::timed_out(shared.doing(what), timeout)),
            Ok(mut guard) => match guard.as_mut() {
                None => Err(shared.over_error()),
                Some($conn) => {
                    let $dialect = &*shared.dialect;
                    let sent = tokio::time::Instant::now();
                    let bound = timeout.max(shared.options.loss_deadline());
                    let result: std::result::Result<crate::dialect::DbResult<_>, _> = tokio::time::timeout(bound, $call).await;
                    match result {
                        Ok(Ok(value)) => {
                            shared.owner_answered(sent);
                            Ok(value)
                        }
                        Ok(Err(error)) => {
                            let gone = crate::error::connection_gone(&error);
                            let unknown = $writes && gone && !crate::error::ended_by_the_server(&error);
                            if crate::error::is_lock_timeout(&error) {
                                shared.spawn_reap_stale();
                            }
                            let mapped = crate::error::map(shared.doing(what), error);
                            if gone {
                                // Every guard went with the connection.
                                guard.take();
                                drop(guard);
                                shared.lose("the session's connection ended");
                                if unknown {
                                    let doing = shared.doing(what);
                                    Err(lockline::Error::unavailable(
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
                            Err(crate::error::timed_out(shared.doing(what), bound))
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
                    .connect(crate::dialect::Purpose::Control)
                    .await
                    .map_err(|e| crate::error::map(shared.doing("open the control connection"), e))?;
                *guard = Some(conn);
            }
            let Some($conn) = guard.as_mut() else {
                return Err(shared.over_error());
            };
            let $dialect = &*shared.dialect;
            let result: crate::dialect::DbResult<_> = $call.await;
            match result {
                Ok(value) => Ok(value),
                Err(error) => {
                    if crate::error::connection_gone(&error) {
                        guard.take();
                    }
                    Err(crate::error::map(shared.doing(what), error))
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
                Err(crate::error::timed_out(shared.doing(what), timeout))
            }
        }
    }};
}

// Declared after the macros above, which they use.
mod beats;
mod liveness;
mod modes;
mod open;
mod overflow;
mod queue;
mod turns;
mod wait;

use beats::Seen;
use overflow::Overflow;
use wait::WaitOn;

impl<D: Dialect> Shared<D> {
    /// What a step of this session was doing, for its errors.
    fn doing<'a>(&'a self, what: &'a str) -> Doing<'a> {
        self.dialect.doing(what, &self.target)
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
}

impl<D: Dialect> SqlSession<D> {
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
        // The whole queue (or none) for a lock-mode entry, never a window.
        self.append_entry(&request.without_window()).await
    }

    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        self.read_earlier(entry, conflicts, count).await
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
        self.wait_entry_gone(entry).await
    }

    fn grant_not_before(&self) -> Option<Instant> {
        self.shared.grace_until.map(|(until, _)| until)
    }

    fn departure(&self, gone: &Entry) -> lockline::backend::Departure {
        self.departure_of(gone)
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

    /// As `watch_value`; a lock-mode entry's watch goes on past a value
    /// `wanted` refuses, on the same subscription.
    async fn watch_value_until(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        if entry.kind == EntryKind::Dlm {
            return self.watch_lock_mode(entry, seen, wanted, &|_| true).await;
        }
        lockline::backend::watch_value_anew(self, entry, seen, wanted).await
    }

    async fn watch_blocker_until(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        if entry.kind == EntryKind::Dlm {
            return self
                .watch_lock_mode(entry, seen, wanted, &|value| !only_owner_unblocks(value))
                .await;
        }
        self.watch_value_until(entry, seen, wanted).await
    }

    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        if entry.kind == EntryKind::Dlm {
            return self.watch_lock_mode(entry, seen, &|_| true, &|_| true).await;
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
        self.read_mode_queue(dir).await
    }

    async fn update_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        self.update_mode_queue(update).await
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
        self.close_session().await
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
