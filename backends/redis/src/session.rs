//! A session: a key renewed with every entry it owns, one pub/sub connection.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use lockline::backend::{
    advance, AppendRequest, Appended, BackendSession, Conflicts, Departure, Earlier, Entry, EntryKind, Queue,
    QueueUpdate, Slot,
};
use lockline::{Error, FencingToken, Result, SessionOptions, SessionState, Write};
use redis::{Pipeline, ScriptInvocation, Value};
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::conn::{Conn, Link};
use crate::error::{bad_reply, map, timed_out, NAME};
use crate::hub::Hub;
use crate::layout;
use crate::scripts::Scripts;

/// How long a waiter waits before looking again at a predecessor with no
/// TTL (a foreign lock taken without one): never a spin, and bounded.
fn no_ttl_recheck(options: &SessionOptions) -> Duration {
    options.ttl()
}

/// The first pause before a failed renewal is tried again, doubled at
/// each failure up to [`RETRY_MAX`] (and never more than a keepalive
/// interval): a server back from a restart is renewed on within that.
const RETRY_MIN: Duration = Duration::from_millis(25);
const RETRY_MAX: Duration = Duration::from_millis(100);

/// How long one renewal, or one ping of the pub/sub connection, may go
/// unanswered before its connection is given up: the request timeout, but
/// no more than half of what is left of the loss deadline after a keepalive
/// interval, so that a try on a new connection, made at once, is still
/// confirmed before the deadline. Every connection of a session is thereby
/// proven alive, or replaced, within the loss deadline (DESIGN rule 18).
pub(crate) fn probe_timeout(options: &SessionOptions) -> Duration {
    let left = options.loss_deadline().saturating_sub(options.keepalive_interval());
    options.request_timeout().min(left / 2).max(Duration::from_millis(1))
}

/// A little past a key's TTL, when it is surely gone if not renewed.
const EXPIRY_SLACK: Duration = Duration::from_millis(3);

/// How many entries lost with their owner's session a session remembers
/// for its lock-delay before it forgets the oldest (those it waited on and
/// was never asked about: a wait that ended in a timeout or a cancel).
const LOST_REMEMBERED: usize = 256;

/// At most this many of the session's own entries found taken are
/// remembered for `removed_by_me` (each is asked about at once).
const TAKEN_LIMIT: usize = 1024;

/// What a look at an entry another session owns found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// There, with this many ms left (-1: no TTL).
    Live(i64),
    /// Gone, let go by its owner (released, closed, cancelled).
    Released,
    /// Gone with its owner's session: expired, or removed as lost.
    Lost,
}

/// What a look at an entry's value found.
#[derive(Debug)]
enum Look {
    /// There, with this value and this many ms left (-1: no TTL).
    Live(Vec<u8>, i64),
    /// Gone: [`Status::Released`] or [`Status::Lost`].
    Gone(Status),
}

/// Acknowledgement of writes by replicas (`WAIT`), when asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplicaAcks {
    pub(crate) replicas: usize,
    pub(crate) timeout: Duration,
}

/// One of the session's own entries, renewed with it; tracked by its key
/// (`{name}:e:<attempt>`), which also gives its name and attempt. Kept small:
/// a session may hold very many (DESIGN §8).
struct Tracked {
    /// Whether the append was answered (an unanswered one may still land).
    known: bool,
    /// Its order, once the append was answered.
    order: Option<i64>,
    /// Whether the entry owns the plain key (a mutex at the head).
    plain: bool,
    /// Set when the entry is found gone.
    gone: Arc<Gone>,
}

/// A flag set once an entry is found gone, and the waiters to wake then: a
/// fraction of a `watch` channel's size, and all a held entry's wait needs.
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
            // Registered before looking, so a signal in between is not missed.
            changed.as_mut().enable();
            if self.set.load(Ordering::SeqCst) {
                return;
            }
            changed.await;
        }
    }
}

/// The name and attempt of one of our tracked entry keys.
fn name_and_attempt(key: &str) -> (&str, &str) {
    // Every tracked key was made by `layout::entry_key`.
    layout::parse_entry_key(key).unwrap_or((key, ""))
}

pub(crate) struct Shared {
    pub(crate) id: String,
    pub(crate) conn: Conn,
    pub(crate) target: String,
    pub(crate) scripts: Arc<Scripts>,
    pub(crate) hub: Arc<Hub>,
    pub(crate) options: SessionOptions,
    pub(crate) state: watch::Sender<SessionState>,
    /// The keyspace-event channel prefix (`__keyspace@0__:`) when the server
    /// publishes DEL and expiry events; `None` otherwise.
    pub(crate) keyspace: Option<String>,
    pub(crate) acks: Option<ReplicaAcks>,
    entries: std::sync::Mutex<HashMap<String, Tracked>>,
    /// Our entries a release announced as holding now: their next
    /// `earlier` needs no read (the release's script made it).
    heads: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Entries of others this session waited on and saw go (by entry key
    /// and order): when, if they went with their owner's session, `None` if
    /// released. What `departure` answers for a lock-delay; one it never
    /// saw go (a wait cut short) counts as lost. Kept only with a
    /// lock-delay.
    lost: std::sync::Mutex<HashMap<(String, i64), Option<Instant>>>,
    /// This session's own entries (by entry key and order) that a removal
    /// found gone without a removal of theirs, for `removed_by_me`. Bounded.
    taken: std::sync::Mutex<std::collections::HashSet<(String, i64)>>,
}

/// A session of the [`Redis`](crate::Redis) backend.
pub(crate) struct RedisSession {
    shared: Arc<Shared>,
    state: watch::Receiver<SessionState>,
    tasks: Vec<AbortHandle>,
}

impl fmt::Debug for RedisSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSession")
            .field("id", &self.shared.id)
            .field("target", &self.shared.target)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisSession {
    /// Every handle is gone, as if the process died: renewals stop and the
    /// entries expire after their TTL.
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// An error of a step on lock `name`: a key of another type is named by
/// the lock, not by the step.
fn for_lock(error: Error, name: &str) -> Error {
    match error {
        Error::InvalidName { reason, .. } => Error::InvalidName {
            name: name.to_owned(),
            reason,
        },
        other => other,
    }
}

/// What a script's reply item says of one entry.
fn entry_from(name: &str, item: &Value) -> Option<Entry> {
    let Value::Array(fields) = item else { return None };
    let [member, kind, order, owner] = fields.as_slice() else {
        return None;
    };
    let kind = text(kind)?;
    if kind == "plain" {
        return Some(layout::plain_blocker(name));
    }
    let member = text(member)?;
    let order: i64 = text(order)?.parse().ok()?;
    Some(Entry {
        key: layout::entry_key(name, &member),
        kind: layout::kind_from_label(&kind),
        order,
        token: FencingToken::new(order.unsigned_abs()),
        owner: Some(text(owner)?),
    })
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(_) | Value::SimpleString(_) => text(value)?.parse().ok(),
        _ => None,
    }
}

fn entries_from(name: &str, value: &Value) -> Option<Vec<Entry>> {
    let Value::Array(items) = value else { return None };
    items.iter().map(|item| entry_from(name, item)).collect()
}

/// The bytes of a value in a script's reply (nil: empty).
fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::SimpleString(text) => Some(text.clone().into_bytes()),
        Value::Nil => Some(Vec::new()),
        _ => None,
    }
}

/// One slot of `READ_QUEUE`'s reply: `{attempt, kind, order, owner, value,
/// changed}`.
fn slot_from(name: &str, item: &Value) -> Option<Slot> {
    let Value::Array(fields) = item else { return None };
    let [member, kind, order, owner, value, changed] = fields.as_slice() else {
        return None;
    };
    let order: i64 = text(order)?.parse().ok()?;
    let changed: u64 = text(changed)?.parse().ok()?;
    Some(Slot {
        entry: Entry {
            key: layout::entry_key(name, &text(member)?),
            kind: layout::kind_from_label(&text(kind)?),
            order,
            token: FencingToken::new(order.unsigned_abs()),
            owner: Some(text(owner)?),
        },
        value: bytes(value)?,
        // Every write of a lock-mode entry takes a new number of the
        // lock's counter: that number is its version too.
        version: i64::try_from(changed).ok()?,
        changed,
    })
}

/// `READ_QUEUE`'s reply: `{slots, block}`.
fn queue_from(name: &str, reply: &Value) -> Option<Queue> {
    let Value::Array(parts) = reply else { return None };
    let [Value::Array(slots), block] = parts.as_slice() else {
        return None;
    };
    let slots = slots
        .iter()
        .map(|item| slot_from(name, item))
        .collect::<Option<Vec<_>>>()?;
    let block = match block {
        Value::Nil => None,
        other => Some(bytes(other)?),
    };
    Some(Queue { slots, block })
}

fn conflicts_arg(conflicts: Conflicts) -> &'static str {
    match conflicts {
        Conflicts::Exclusive => "exclusive",
        _ => "all",
    }
}

impl Shared {
    pub(crate) fn new(
        id: String,
        conn: Conn,
        target: String,
        hub: Arc<Hub>,
        options: SessionOptions,
        keyspace: Option<String>,
        acks: Option<ReplicaAcks>,
    ) -> Arc<Self> {
        Arc::new(Shared {
            id,
            conn,
            target,
            scripts: Arc::new(Scripts::new()),
            hub,
            options,
            state: watch::Sender::new(SessionState::Live),
            keyspace,
            acks,
            entries: std::sync::Mutex::new(HashMap::new()),
            heads: std::sync::Mutex::new(std::collections::HashSet::new()),
            lost: std::sync::Mutex::new(HashMap::new()),
            taken: std::sync::Mutex::new(std::collections::HashSet::new()),
        })
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.options.ttl().as_millis()).unwrap_or(u64::MAX)
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_live(&self) -> Result<()> {
        match *self.state.borrow() {
            SessionState::Live | SessionState::Suspended => Ok(()),
            SessionState::Closed => Err(Error::Closed {
                session: self.id.clone(),
            }),
            _ => Err(Error::SessionLost {
                session: self.id.clone(),
            }),
        }
    }

    /// Sends one request on the session's command connection (made first
    /// if there is none), all within `timeout`. A request that broke its
    /// connection or went unanswered gives the connection up, so that the
    /// next one (a retry) goes on a new connection rather than on one a
    /// middlebox may have silently forgotten (DESIGN rule 18).
    pub(crate) async fn exchange<T, F, Fut>(&self, what: &str, timeout: Duration, request: F) -> Result<T>
    where
        F: FnOnce(Link) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let deadline = Instant::now() + timeout;
        let link = match tokio::time::timeout_at(deadline, self.conn.link()).await {
            Ok(Ok(link)) => link,
            Ok(Err(error)) => return Err(map(what, &self.target, error)),
            Err(_) => return Err(timed_out(what, &self.target, timeout)),
        };
        match tokio::time::timeout_at(deadline, request(link.clone())).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                self.conn.replace_if_broken(&link, &error);
                Err(map(what, &self.target, error))
            }
            Err(_) => {
                self.conn.replace(&link);
                Err(timed_out(what, &self.target, timeout))
            }
        }
    }

    /// Runs a script on `link`; with replica acknowledgement asked for (and
    /// a write), also how many replicas acknowledged it (`WAIT`).
    async fn invoke(
        &self,
        script: &redis::Script,
        invocation: &ScriptInvocation<'_>,
        writes: bool,
        link: &mut Link,
    ) -> redis::RedisResult<(Value, Option<i64>)> {
        match self.acks.filter(|_| writes) {
            None => Ok((invocation.invoke_async::<Value>(link).await?, None)),
            Some(acks) => {
                // One round trip: the script (loaded first, in case the
                // server lost it) and the WAIT behind it on the same connection.
                let mut pipe = Pipeline::new();
                pipe.load_script(script).ignore();
                pipe.invoke_script(invocation);
                pipe.cmd("WAIT").arg(acks.replicas).arg(acks.timeout.as_millis() as u64);
                let (reply, acked): (Value, i64) = pipe.query_async(link).await?;
                Ok((reply, Some(acked)))
            }
        }
    }

    /// A write confirmed by fewer replicas than asked for fails as unavailable.
    fn check_acks(&self, what: &str, acked: Option<i64>) -> Result<()> {
        match (self.acks, acked) {
            (Some(acks), Some(acked)) if usize::try_from(acked).unwrap_or(0) < acks.replicas => {
                Err(Error::unavailable(
                    NAME,
                    format!(
                        "{what} on {}: {acked} of {} replicas acknowledged the write within {:?}",
                        self.target, acks.replicas, acks.timeout
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Runs a script, bounded by the request timeout; with replica
    /// acknowledgement asked for, a write is confirmed only once `WAIT` says
    /// enough replicas have it.
    async fn run(
        &self,
        what: &str,
        script: &redis::Script,
        invocation: &ScriptInvocation<'_>,
        writes: bool,
    ) -> Result<Value> {
        let (reply, acked) = self
            .exchange(what, self.options.request_timeout(), |mut link| async move {
                self.invoke(script, invocation, writes, &mut link).await
            })
            .await?;
        self.check_acks(what, acked)?;
        Ok(reply)
    }

    /// Runs a writing script whose last argument is the epoch of the server
    /// it is sent to (see `APPEND` in the scripts), added here on the very
    /// connection the script goes on: no request of its own. Bounded by the
    /// request timeout, confirmed by replicas as [`run`](Self::run) is.
    async fn run_in_epoch(
        &self,
        what: &str,
        script: &redis::Script,
        mut invocation: ScriptInvocation<'_>,
    ) -> Result<Value> {
        let (reply, acked) = self
            .exchange(what, self.options.request_timeout(), |mut link| async move {
                invocation.arg(link.epoch());
                self.invoke(script, &invocation, true, &mut link).await
            })
            .await?;
        self.check_acks(what, acked)?;
        Ok(reply)
    }

    async fn command<T: redis::FromRedisValue>(&self, what: &str, cmd: &redis::Cmd) -> Result<T> {
        self.exchange(what, self.options.request_timeout(), |mut link| async move {
            cmd.query_async::<T>(&mut link).await
        })
        .await
    }

    /// This very entry's value and remaining TTL in ms (-1: none), or how
    /// it went. One script.
    async fn look_value(&self, entry: &Entry) -> Result<Look> {
        let scripts = Arc::clone(&self.scripts);
        let mut invocation = scripts.get_value.key(&entry.key);
        invocation.arg(entry.order);
        let what = "read the entry's value";
        let reply = self.run(what, &scripts.get_value, &invocation, false).await?;
        let Value::Array(parts) = &reply else {
            return Err(bad_reply(what, &reply));
        };
        match parts.as_slice() {
            [found, how] if int(found) == Some(0) => match int(how) {
                Some(-3) => Ok(Look::Gone(Status::Lost)),
                Some(-2) => Ok(Look::Gone(Status::Released)),
                _ => Err(bad_reply(what, &reply)),
            },
            [found, value, left] if int(found) == Some(1) => match (bytes(value), int(left)) {
                (Some(value), Some(left)) => Ok(Look::Live(value, left)),
                _ => Err(bad_reply(what, &reply)),
            },
            _ => Err(bad_reply(what, &reply)),
        }
    }

    /// Looks at this very entry: its remaining TTL, or how it went.
    async fn status(&self, entry: &Entry) -> Result<Status> {
        let scripts = Arc::clone(&self.scripts);
        let mut invocation = scripts.status.key(&entry.key);
        invocation.arg(entry.order);
        let reply = self.run("read the entry", &scripts.status, &invocation, false).await?;
        match int(&reply) {
            Some(-2) => Ok(Status::Released),
            Some(-3) => Ok(Status::Lost),
            Some(ms) if ms >= -1 => Ok(Status::Live(ms)),
            _ => Err(bad_reply("read the entry", &reply)),
        }
    }

    /// Remembers, for a lock-delay, that `entry` was seen go with its
    /// owner's session now.
    fn note_lost(&self, entry: &Entry) {
        self.note(entry, Some(Instant::now()));
    }

    /// Remembers, for a lock-delay, that `entry` was seen released.
    fn note_released(&self, entry: &Entry) {
        self.note(entry, None);
    }

    fn note(&self, entry: &Entry, lost_at: Option<Instant>) {
        if self.options.lock_delay().is_zero() {
            return;
        }
        let mut seen = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= LOST_REMEMBERED {
            // Asked at once after the wait: what is still here was never
            // asked for (a wait given up), and a delay counted from longer
            // ago than the longest one is over.
            seen.clear();
        }
        seen.insert((entry.key.clone(), entry.order), lost_at);
    }

    /// How `entry`, waited on, went: lost when the wait saw it go with its
    /// owner's session, or did not see it go at all (a wait cut short by a
    /// connection failure: erring toward a delay); released when the wait
    /// saw its owner let go, or it was one of this session's own (asked
    /// once).
    fn departure(&self, entry: &Entry) -> Departure {
        if entry.owner.as_deref() == Some(self.id.as_str()) {
            return Departure::Released;
        }
        let seen = self
            .lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(entry.key.clone(), entry.order));
        match seen {
            Some(Some(noticed)) => Departure::Lost { noticed },
            Some(None) => Departure::Released,
            None => Departure::Lost {
                noticed: Instant::now(),
            },
        }
    }

    /// Marks one of our entries gone, and stops renewing it.
    fn forget(&self, key: &str) {
        if let Some(tracked) = self.entries().remove(key) {
            tracked.gone.signal();
        }
        self.heads.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
    }

    /// Declares the session lost and, as far as the server answers, ends it
    /// there too (its key and its entries), never to be renewed again.
    fn lose(self: &Arc<Self>, why: &str) {
        // Its entries are gone for its holders and waiters now, and stay
        // listed until the server has deleted them (here, or by `close`).
        self.signal_gone_all();
        if advance(&self.state, SessionState::Lost) {
            tracing::warn!(session = %self.id, target = %self.target, "session lost: {why}");
            let shared = Arc::clone(self);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = shared.remove_all().await;
                });
            }
        }
    }

    /// Deletes every entry of the session and its key.
    async fn remove_all(&self) -> Result<()> {
        let owned: Vec<(String, String, String, String)> = self
            .entries()
            .iter()
            .map(|(key, t)| {
                // An entry whose append was never answered is removed as an
                // abandoned attempt (leaving a tombstone against a late append).
                let order = t.order.map(|o| o.to_string()).unwrap_or_default();
                let (name, attempt) = name_and_attempt(key);
                (key.clone(), name.to_owned(), attempt.to_owned(), order)
            })
            .collect();
        let removals = owned
            .iter()
            .map(|(_, name, attempt, order)| self.remove_attempt(name, attempt, order));
        let results = futures::future::join_all(removals).await;
        let mut first_error = None;
        for ((key, ..), result) in owned.iter().zip(results) {
            match result {
                Ok(_) => self.forget(key),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        let mut del = redis::cmd("DEL");
        del.arg(layout::session_key(&self.id));
        if let Err(error) = self.command::<i64>("delete the session key", &del).await {
            first_error.get_or_insert(error);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Runs the removal script for `attempt` under `name`, fenced on `order`
    /// (empty: any) and on the owner.
    async fn remove_attempt(&self, name: &str, attempt: &str, order: &str) -> Result<bool> {
        Ok(self.remove_owned(name, attempt, order, &self.id).await? == 1)
    }

    /// Runs the removal script for an entry of `owner`. It goes with its
    /// owner's session (its waiter told `lost`, for a lock-delay) when that
    /// session is this one and was lost, or is another session (whose
    /// holder did not let go); otherwise (a release, a close, a cancelled
    /// acquire) its owner let it go, and the request is the same as without
    /// lock-delay.
    /// Returns the script's answer: 1 deleted, -1 found gone without a
    /// removal of its owner, 0 otherwise.
    async fn remove_owned(&self, name: &str, attempt: &str, order: &str, owner: &str) -> Result<i64> {
        let lost = owner != self.id || *self.state.borrow() == SessionState::Lost;
        let scripts = Arc::clone(&self.scripts);
        let mut invocation = scripts.remove.key(layout::queue(name));
        invocation
            .key(name)
            .arg(layout::prefix(name))
            .arg(attempt)
            .arg(order)
            .arg(owner)
            .arg(self.ttl_ms());
        if lost {
            invocation.arg("lost");
        }
        let reply = self.run("remove the entry", &scripts.remove, &invocation, true).await?;
        Ok(int(&reply).unwrap_or(0))
    }

    /// One renewal: the session key and every entry, in one round trip on a
    /// single node. Returns whether the session key was still there, and the
    /// entries found gone.
    async fn renew(&self) -> Result<(bool, Vec<String>)> {
        let ttl = self.ttl_ms();
        let tracked: Vec<(String, bool, bool)> = self
            .entries()
            .iter()
            .map(|(key, t)| (key.clone(), t.plain, t.known))
            .collect();
        let scripts = Arc::clone(&self.scripts);
        let holder = |key: &str| {
            let (name, attempt) = name_and_attempt(key);
            let mut invocation = scripts.renew_holder.key(key);
            invocation
                .key(name)
                .arg(ttl)
                .arg(layout::queue(name))
                .arg(layout::channel(name, attempt))
                .arg(attempt);
            invocation
        };
        // One reply per command: the session key, then each entry in order.
        // On a single node the session key's answer is bounded by the probe
        // timeout: unanswered within it, the renewal gives its connection
        // up, and the next try (at once) goes on a new one early enough to
        // be confirmed before the loss deadline.
        let (tracked_all, scripts, holder) = (&tracked, &scripts, &holder);
        let renewal = |conn: Link| async move {
            let tracked = tracked_all;
            if self.conn.is_cluster() {
                // A cluster takes no pipeline across slots: one request per key,
                // all in flight at once on the multiplexed node connections.
                let mut session = redis::cmd("PEXPIRE");
                session.arg(layout::session_key(&self.id)).arg(ttl);
                let invocations: Vec<Option<ScriptInvocation<'_>>> = tracked
                    .iter()
                    .map(|(key, plain, _)| plain.then(|| holder(key)))
                    .collect();
                let entries = tracked.iter().zip(&invocations).map(|((key, ..), invocation)| {
                    let mut conn = conn.clone();
                    async move {
                        match invocation {
                            Some(invocation) => invocation.invoke_async::<Value>(&mut conn).await,
                            None => {
                                let mut pexpire = redis::cmd("PEXPIRE");
                                pexpire.arg(key).arg(ttl);
                                pexpire.query_async::<Value>(&mut conn).await
                            }
                        }
                    }
                });
                let mut session_conn = conn.clone();
                let (first, rest) = futures::join!(
                    session.query_async::<Value>(&mut session_conn),
                    futures::future::join_all(entries)
                );
                std::iter::once(first)
                    .chain(rest)
                    .collect::<redis::RedisResult<Vec<_>>>()
            } else {
                // One round trip however many entries: the session key first,
                // on its own, then every entry in one pipeline right behind it
                // on the same connection. The session key's answer comes first
                // and soon, however many entries follow: it is the probe that
                // proves the connection alive, bounded by the probe timeout
                // (a renewal of 100,000 entries takes longer than that, and
                // is bounded by the request timeout instead).
                let probe = async {
                    let mut session = redis::cmd("PEXPIRE");
                    session.arg(layout::session_key(&self.id)).arg(ttl);
                    let mut probe_conn = conn.clone();
                    let bound = probe_timeout(&self.options);
                    match tokio::time::timeout(bound, session.query_async::<Value>(&mut probe_conn)).await {
                        Ok(answer) => answer,
                        Err(elapsed) => {
                            self.conn.replace(&conn);
                            Err(std::io::Error::new(std::io::ErrorKind::TimedOut, elapsed).into())
                        }
                    }
                };
                // The holders' script is called by its hash; only when the
                // server does not know it (it restarted) is it sent along, and
                // the renewal (every command of which may be repeated) made
                // again. Sending it every time cost each session some 2.5 KB
                // per TTL.
                let pipeline = |load: bool| {
                    let mut pipe = Pipeline::with_capacity(tracked.len() + 2);
                    if load && tracked.iter().any(|t| t.1) {
                        pipe.load_script(&scripts.renew_holder).ignore();
                    }
                    for (key, plain, _) in tracked {
                        if *plain {
                            pipe.invoke_script(&holder(key));
                        } else {
                            pipe.cmd("PEXPIRE").arg(key).arg(ttl);
                        }
                    }
                    if let Some(acks) = self.acks {
                        // Behind every write of this connection, the session
                        // key's among them.
                        pipe.cmd("WAIT").arg(acks.replicas).arg(acks.timeout.as_millis() as u64);
                    }
                    pipe
                };
                let entries = async {
                    if tracked.is_empty() && self.acks.is_none() {
                        return Ok(Vec::new());
                    }
                    let mut entries_conn = conn.clone();
                    match pipeline(false).query_async::<Vec<Value>>(&mut entries_conn).await {
                        Err(error) if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                            pipeline(true).query_async::<Vec<Value>>(&mut entries_conn).await
                        }
                        other => other,
                    }
                };
                // Polled in this order, so the probe is sent first.
                let (first, rest) = futures::future::try_join(probe, entries).await?;
                Ok(std::iter::once(first).chain(rest).collect())
            }
        };
        let replies: Vec<Value> = self
            .exchange("renew the session", self.renewal_timeout(), renewal)
            .await?;
        let mut replies = replies.into_iter();
        let session_alive = replies.next().and_then(|v| int(&v)) == Some(1);
        let mut gone = Vec::new();
        for (key, _, known) in &tracked {
            let renewed = replies.next().as_ref().and_then(int) == Some(1);
            if !renewed && *known {
                gone.push(key.clone());
            }
        }
        if let Some(acks) = self.acks {
            let acked = replies.next().as_ref().and_then(int).unwrap_or(0);
            if usize::try_from(acked).unwrap_or(0) < acks.replicas {
                return Err(Error::unavailable(
                    NAME,
                    format!(
                        "renew the session on {}: {acked} of {} replicas acknowledged within {:?}",
                        self.target, acks.replicas, acks.timeout
                    ),
                ));
            }
        }
        Ok((session_alive, gone))
    }

    /// How long one renewal may take in all: the request timeout, and with
    /// replica acknowledgement asked for, the `WAIT` behind it on top. Its
    /// first answer, the session key's, is bounded by the probe timeout.
    fn renewal_timeout(&self) -> Duration {
        self.options.request_timeout() + self.acks.map_or(Duration::ZERO, |acks| acks.timeout)
    }

    /// One renewal, tried a second time at once if the first failed: a
    /// request on a connection the server dropped (it restarted, or failed
    /// over) or that went unanswered (a middlebox forgot it) fails and gives
    /// the connection up, and the second try goes on a new one. Every
    /// command of a renewal may be repeated.
    async fn renew_reconnecting(&self) -> Result<(bool, Vec<String>)> {
        match self.renew().await {
            Err(error) if error.is_transient() => {
                tracing::debug!(session = %self.id, %error, "renewal failed; trying again on a new connection");
                self.renew().await
            }
            outcome => outcome,
        }
    }

    /// Renews until the session ends: `Suspended` while renewals fail,
    /// `Lost` once none has been confirmed for `ttl - safety margin`,
    /// counted from the send time of the last confirmed one. A failed
    /// renewal is tried again within [`RETRY_MAX`], not a keepalive interval
    /// later: a server back from a restart (or a failover) shorter than the
    /// loss deadline is renewed on before the deadline, and the session is
    /// `Live` again.
    pub(crate) async fn keep_alive(self: Arc<Self>, opened_at: Instant) {
        let interval = self.options.keepalive_interval();
        let loss_after = self.options.loss_deadline();
        let mut confirmed = opened_at;
        // The pause before the next try while renewals fail.
        let mut retry: Option<Duration> = None;
        loop {
            let pause = retry.map_or(interval, |pause| pause.min(interval));
            tokio::time::sleep_until((Instant::now() + pause).min(confirmed + loss_after)).await;
            if self.state.borrow().is_over() {
                return;
            }
            let sent = Instant::now();
            let deadline = confirmed + loss_after;
            // Each try is bounded by the probe timeout (see `renew`).
            let renewal = self.renew_reconnecting();
            tokio::pin!(renewal);
            // A renewal unanswered for a keepalive interval suspends the
            // session while it is still awaited: under a silent partition the
            // request timeout can outlast the loss deadline.
            let mut overdue = true;
            let outcome = loop {
                tokio::select! {
                    outcome = &mut renewal => break Some(outcome),
                    () = tokio::time::sleep_until(sent + interval), if overdue => {
                        overdue = false;
                        tracing::debug!(session = %self.id, "renewal unanswered for a keepalive interval");
                        advance(&self.state, SessionState::Suspended);
                    }
                    () = tokio::time::sleep_until(deadline) => break None,
                }
            };
            match outcome {
                Some(Ok((true, gone))) => {
                    confirmed = sent;
                    retry = None;
                    advance(&self.state, SessionState::Live);
                    for key in gone {
                        tracing::debug!(session = %self.id, %key, "entry found gone at renewal");
                        self.forget(&key);
                    }
                }
                Some(Ok((false, _))) => {
                    // The server no longer knows the session (it expired, or
                    // the server restarted without its data).
                    self.lose("the server no longer has the session");
                    return;
                }
                Some(Err(error)) => {
                    tracing::debug!(session = %self.id, %error, "renewal failed");
                    advance(&self.state, SessionState::Suspended);
                    retry = Some(retry.map_or(RETRY_MIN, |pause| (pause * 2).min(RETRY_MAX)));
                }
                None => {}
            }
            if Instant::now() >= confirmed + loss_after {
                self.lose("no renewal confirmed within ttl - safety margin");
                return;
            }
        }
    }

    fn signal_gone_all(&self) {
        for tracked in self.entries().values() {
            tracked.gone.signal();
        }
    }

    /// Waits until the plain key `name`, owned by a foreign client, is gone:
    /// on its keyspace events when the server sends them, and otherwise at
    /// its TTL (re-armed if it was renewed).
    async fn wait_plain(&self, name: &str) -> Result<()> {
        let mut events = match &self.keyspace {
            Some(prefix) => Some(self.hub.subscribe(&format!("{prefix}{name}")).await?),
            None => None,
        };
        loop {
            let mut pttl = redis::cmd("PTTL");
            pttl.arg(name);
            let left: i64 = self.command("read the plain key", &pttl).await?;
            let recheck = match left {
                -2 => return Ok(()),
                ms if ms >= 0 => Duration::from_millis(ms.unsigned_abs()) + EXPIRY_SLACK,
                _ => no_ttl_recheck(&self.options),
            };
            let sleep = tokio::time::sleep(recheck);
            match events.as_mut() {
                Some(events) => tokio::select! {
                    () = events.changed() => {}
                    () = sleep => {}
                },
                None => sleep.await,
            }
        }
    }
}

impl RedisSession {
    pub(crate) fn new(shared: Arc<Shared>, tasks: Vec<AbortHandle>) -> Self {
        let state = shared.state.subscribe();
        RedisSession { shared, state, tasks }
    }

    fn name_of<'a>(&self, entry: &'a Entry) -> Result<(&'a str, &'a str)> {
        layout::parse_entry_key(&entry.key).ok_or_else(|| Error::InvalidName {
            name: entry.key.clone(),
            reason: "not an entry of the Redis layout".into(),
        })
    }

    /// Whether a mutex contender takes the plain key at the head.
    fn wants_plain(kind: EntryKind) -> &'static str {
        if kind == EntryKind::Mutex {
            "1"
        } else {
            "0"
        }
    }

    /// Waits until an entry that is not one of our tracked ones is gone:
    /// a foreign owner's plain key, or another session's entry.
    async fn wait_gone_elsewhere(&self, entry: &Entry) -> Result<()> {
        let shared = &self.shared;
        if layout::is_plain_blocker(entry) {
            // A foreign client's lock: nothing says whether it was released
            // or expired, so it counts as lost (a lock-delay only delays).
            shared.wait_plain(&entry.key).await?;
            shared.note_lost(entry);
            return Ok(());
        }
        let (name, attempt) = self.name_of(entry)?;
        let mut messages = shared.hub.subscribe(&layout::channel(name, attempt)).await?;
        loop {
            let left = match shared.status(entry).await? {
                Status::Live(left) => left,
                Status::Released => {
                    shared.note_released(entry);
                    return Ok(());
                }
                Status::Lost => {
                    // Expired (seen here at its TTL, or as soon as this look
                    // was made), or removed as lost before the subscription.
                    shared.note_lost(entry);
                    return Ok(());
                }
            };
            // Gone at its TTL unless renewed: look again then.
            let recheck = if left >= 0 {
                Duration::from_millis(left.unsigned_abs()) + EXPIRY_SLACK
            } else {
                no_ttl_recheck(&shared.options)
            };
            tokio::select! {
                () = messages.changed() => {
                    // A release or a reaping says so once the entry is
                    // deleted, and how it went: no need to read it again.
                    if messages.heard_gone() {
                        if messages.heard_lost() {
                            shared.note_lost(entry);
                        } else {
                            shared.note_released(entry);
                        }
                        // It may also say that one of ours holds now.
                        if let Some(head) = messages.announced_head() {
                            let key = layout::entry_key(name, &head);
                            if shared.entries().contains_key(&key) {
                                shared.heads.lock().unwrap_or_else(PoisonError::into_inner).insert(key);
                            }
                        }
                        return Ok(());
                    }
                }
                () = tokio::time::sleep(recheck) => {}
            }
        }
    }

    fn mark_plain(&self, key: &str, nearest: &[Entry], kind: EntryKind) {
        if kind == EntryKind::Mutex && nearest.is_empty() {
            if let Some(tracked) = self.shared.entries().get_mut(key) {
                tracked.plain = true;
            }
        }
    }
}

#[async_trait::async_trait]
impl BackendSession for RedisSession {
    fn id(&self) -> &str {
        &self.shared.id
    }

    fn state(&self) -> watch::Receiver<SessionState> {
        self.state.clone()
    }

    async fn append(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        let shared = &self.shared;
        shared.check_live()?;
        let name = request.dir;
        let key = layout::entry_key(name, request.attempt);
        shared.entries().entry(key.clone()).or_insert_with(|| Tracked {
            known: false,
            order: None,
            plain: false,
            gone: Arc::default(),
        });
        let scripts = Arc::clone(&shared.scripts);
        let mut invocation = scripts.append.key(layout::queue(name));
        invocation
            .key(layout::counter(name))
            .key(name)
            .key(layout::epoch(name))
            .arg(layout::prefix(name))
            .arg(request.attempt)
            .arg(layout::kind_label(request.kind))
            .arg(&shared.id)
            .arg(request.value)
            .arg(shared.ttl_ms())
            .arg(conflicts_arg(request.conflicts))
            .arg(request.nearest.max(1))
            .arg(Self::wants_plain(request.kind));
        // The epoch of the server at the other end of the very connection
        // the append goes on (see `APPEND`): rides on the append itself, no
        // request of its own.
        let what = "append to the queue";
        let script = &scripts.append;
        let (reply, acked) = shared
            .exchange(what, shared.options.request_timeout(), |mut link| async move {
                invocation.arg(link.epoch());
                shared.invoke(script, &invocation, true, &mut link).await
            })
            .await
            .map_err(|e| for_lock(e, name))?;
        shared.check_acks(what, acked)?;
        let parsed = match &reply {
            Value::Array(parts) => match parts.as_slice() {
                [order, nearest] => int(order).zip(entries_from(name, nearest)),
                _ => None,
            },
            _ => None,
        };
        let Some((order, mut nearest)) = parsed else {
            return Err(bad_reply("append to the queue", &reply));
        };
        nearest.truncate(request.nearest);
        if let Some(tracked) = shared.entries().get_mut(&key) {
            tracked.known = true;
            tracked.order = Some(order);
        }
        self.mark_plain(&key, &nearest, request.kind);
        if shared.state.borrow().is_over() {
            // Lost while the append was in flight: nothing renews it now.
            let _ = shared.remove_attempt(name, request.attempt, "").await;
            shared.check_live()?;
        }
        Ok(Appended {
            entry: Entry {
                key,
                kind: request.kind,
                order,
                token: FencingToken::new(order.unsigned_abs()),
                owner: Some(shared.id.clone()),
            },
            nearest: Some(nearest),
        })
    }

    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let (name, attempt) = self.name_of(entry)?;
        let shared = &self.shared;
        // The release that woke us decided, in its own script, that this
        // entry heads the queue under the exclusive rule (and took the plain
        // key for a mutex): that was the one read.
        let announced = shared
            .heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&entry.key);
        if announced && conflicts == Conflicts::All && entry.kind != EntryKind::Semaphore {
            self.mark_plain(&entry.key, &[], entry.kind);
            return Ok(Earlier::Entries(Vec::new()));
        }
        let scripts = Arc::clone(&shared.scripts);
        let mut invocation = scripts.earlier.key(layout::queue(name));
        invocation
            .key(name)
            .arg(layout::prefix(name))
            .arg(attempt)
            .arg(entry.order)
            .arg(conflicts_arg(conflicts))
            .arg(count.max(1))
            .arg(shared.ttl_ms())
            .arg(Self::wants_plain(entry.kind));
        let reply = shared
            .run("read the queue", &scripts.earlier, &invocation, true)
            .await
            .map_err(|e| for_lock(e, name))?;
        let Value::Array(parts) = &reply else {
            return Err(bad_reply("read the queue", &reply));
        };
        match parts.as_slice() {
            [found] if int(found) == Some(0) => Ok(Earlier::Gone),
            [found, nearest] if int(found) == Some(1) => {
                let Some(mut nearest) = entries_from(name, nearest) else {
                    return Err(bad_reply("read the queue", &reply));
                };
                nearest.truncate(count);
                self.mark_plain(&entry.key, &nearest, entry.kind);
                Ok(Earlier::Entries(nearest))
            }
            _ => Err(bad_reply("read the queue", &reply)),
        }
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let shared = &self.shared;
        let scripts = Arc::clone(&shared.scripts);
        let mut invocation = scripts.list.key(layout::queue(dir));
        invocation.key(dir).arg(layout::prefix(dir));
        let reply = shared.run("list the queue", &scripts.list, &invocation, false).await?;
        entries_from(dir, &reply).ok_or_else(|| bad_reply("list the queue", &reply))
    }

    async fn wait_for_entry(&self, dir: &str) -> Result<()> {
        let mut joined = self.shared.hub.subscribe(&layout::joined(dir)).await?;
        loop {
            if !self.list(dir).await?.is_empty() {
                return Ok(());
            }
            joined.changed().await;
        }
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let shared = &self.shared;
        if entry.owner.as_deref() == Some(shared.id.as_str()) {
            // Our own entries are renewed by us, and each renewal says which
            // of them are gone (deleted by anyone, or expired); our own
            // removals say so at once. No subscription, no read. One we do
            // not track (an append that landed after its attempt was given
            // up) is waited on like anyone else's, at its TTL.
            let gone = shared.entries().get(&entry.key).map(|t| Arc::clone(&t.gone));
            if let Some(gone) = gone {
                gone.wait().await;
                return Ok(());
            }
        }
        // Boxed: its state is many times the size of the wait above, which
        // every held lock keeps for as long as it is held.
        Box::pin(self.wait_gone_elsewhere(entry)).await
    }

    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let (name, attempt) = self.name_of(entry)?;
        let owner = entry.owner.as_deref().unwrap_or_default();
        let removed = self
            .shared
            .remove_owned(name, attempt, &entry.order.to_string(), owner)
            .await?;
        if owner == self.shared.id {
            self.shared.forget(&entry.key);
            if removed == -1 {
                let mut taken = self.shared.taken.lock().unwrap_or_else(PoisonError::into_inner);
                if taken.len() >= TAKEN_LIMIT {
                    taken.clear();
                }
                taken.insert((entry.key.clone(), entry.order));
            }
        }
        Ok(removed == 1)
    }

    /// Told by the removal that just found `entry` gone: a member still
    /// queued, or one already reaped and marked lost (`{n}:l:<attempt>`, kept
    /// 60 s), means it did not go by a removal of this session, since a
    /// release deletes the entry and its member in one script and marks
    /// nothing; neither means it did (or a client that knows the layout
    /// deleted both and marked nothing, which this cannot tell).
    async fn removed_by_me(&self, entry: &Entry) -> Result<Option<bool>> {
        if entry.owner.as_deref() != Some(self.shared.id.as_str()) {
            return Ok(None);
        }
        let taken = self
            .shared
            .taken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(entry.key.clone(), entry.order));
        Ok(Some(!taken))
    }

    async fn abandon(&self, dir: &str, _kind: EntryKind, attempt: &str) -> Result<()> {
        self.shared.remove_attempt(dir, attempt, "").await?;
        self.shared.forget(&layout::entry_key(dir, attempt));
        Ok(())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<()> {
        let (name, attempt) = self.name_of(entry)?;
        let shared = &self.shared;
        let scripts = Arc::clone(&shared.scripts);
        let mut invocation = scripts.set_value.key(&entry.key);
        invocation
            .key(layout::counter(name))
            .key(layout::epoch(name))
            .arg(entry.order)
            .arg(value)
            .arg(layout::channel(name, attempt));
        let reply = shared
            .run_in_epoch("set the entry's value", &scripts.set_value, invocation)
            .await?;
        if int(&reply) == Some(1) {
            Ok(())
        } else {
            Err(Error::LockLost { key: entry.key.clone() })
        }
    }

    async fn get_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>> {
        match self.shared.look_value(entry).await? {
            Look::Live(value, _) => Ok(Some(value)),
            Look::Gone(_) => Ok(None),
        }
    }

    /// Subscribes to the entry's channel, then looks at it once (its value
    /// and its remaining TTL, one script); waits for a message on the
    /// channel (`value` from a write of its value, `gone`/`lost` once it is
    /// deleted) or its TTL, and looks again. Never polls: a live entry is
    /// looked at again only at a message, at its TTL (re-armed if renewed),
    /// or when the pub/sub connection was made again. An entry seen go is
    /// remembered, for a lock-delay, as released or lost, from the message
    /// or the look that saw it (as `wait_gone` does).
    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        let (name, attempt) = self.name_of(entry)?;
        let shared = &self.shared;
        let mut messages = shared.hub.subscribe(&layout::channel(name, attempt)).await?;
        loop {
            let (value, left) = match shared.look_value(entry).await? {
                Look::Live(value, left) => (value, left),
                Look::Gone(Status::Lost) => {
                    shared.note_lost(entry);
                    return Ok(None);
                }
                Look::Gone(_) => {
                    shared.note_released(entry);
                    return Ok(None);
                }
            };
            if value != seen {
                return Ok(Some(value));
            }
            let recheck = if left >= 0 {
                Duration::from_millis(left.unsigned_abs()) + EXPIRY_SLACK
            } else {
                no_ttl_recheck(&shared.options)
            };
            tokio::select! {
                () = messages.changed() => {
                    // Said only once the entry is deleted, and how: the
                    // server's own word, no look needed.
                    if messages.heard_gone() {
                        if messages.heard_lost() {
                            shared.note_lost(entry);
                        } else {
                            shared.note_released(entry);
                        }
                        return Ok(None);
                    }
                }
                () = tokio::time::sleep(recheck) => {}
            }
        }
    }

    async fn read_queue(&self, dir: &str) -> Result<Queue> {
        let shared = &self.shared;
        let scripts = Arc::clone(&shared.scripts);
        let mut invocation = scripts.read_queue.key(layout::queue(dir));
        invocation.key(layout::block(dir)).arg(layout::prefix(dir));
        let what = "read the lock-mode queue";
        let reply = shared
            .run(what, &scripts.read_queue, &invocation, false)
            .await
            .map_err(|e| for_lock(e, dir))?;
        queue_from(dir, &reply).ok_or_else(|| bad_reply(what, &reply))
    }

    /// One script (see `UPDATE_QUEUE`): the checks, the counter's next
    /// number as the token, the values, the deletions, the block and the
    /// messages on the set and deleted entries' own channels, all on the
    /// lock's slot.
    async fn update_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let shared = &self.shared;
        // A session declared lost no longer writes: its entries are being
        // deleted, and would fail the checks once they are.
        shared.check_live()?;
        let name = update.dir;
        let attempt_of = |entry: &Entry| -> Result<String> {
            match layout::parse_entry_key(&entry.key) {
                Some((dir, attempt)) if dir == name => Ok(attempt.to_owned()),
                _ => Err(Error::InvalidName {
                    name: entry.key.clone(),
                    reason: format!("not an entry of the lock {name:?} in the Redis layout"),
                }),
            }
        };
        let scripts = Arc::clone(&shared.scripts);
        let mut invocation = scripts.update_queue.key(layout::queue(name));
        invocation
            .key(layout::counter(name))
            .key(layout::epoch(name))
            .key(layout::block(name))
            .arg(layout::prefix(name))
            .arg(&shared.id)
            .arg(if update.block.is_some() { "1" } else { "0" })
            .arg(update.block.unwrap_or_default())
            .arg(update.unchanged.len());
        for (entry, version) in update.unchanged {
            invocation.arg(attempt_of(entry)?).arg(entry.order).arg(*version);
        }
        invocation.arg(update.present.len());
        for entry in update.present {
            invocation.arg(attempt_of(entry)?).arg(entry.order);
        }
        invocation.arg(update.set.len());
        for (entry, value) in update.set {
            invocation.arg(attempt_of(entry)?).arg(entry.order).arg(*value);
        }
        invocation.arg(update.delete.len());
        for entry in update.delete {
            invocation.arg(attempt_of(entry)?).arg(entry.order);
        }
        let what = "update the lock-mode queue";
        let reply = shared
            .run_in_epoch(what, &scripts.update_queue, invocation)
            .await
            .map_err(|e| for_lock(e, name))?;
        let Value::Array(parts) = &reply else {
            return Err(bad_reply(what, &reply));
        };
        match parts.as_slice() {
            [applied] if int(applied) == Some(0) => Ok(None),
            [applied, token] if int(applied) == Some(1) => {
                let Some(token) = text(token).and_then(|t| t.parse::<u64>().ok()) else {
                    return Err(bad_reply(what, &reply));
                };
                for entry in update.delete {
                    if entry.owner.as_deref() == Some(shared.id.as_str()) {
                        shared.forget(&entry.key);
                    }
                }
                Ok(Some(token))
            }
            _ => Err(bad_reply(what, &reply)),
        }
    }

    async fn write_if_held(&self, entry: &Entry, writes: &[Write]) -> Result<bool> {
        let (name, _) = self.name_of(entry)?;
        let prefix = layout::prefix(name);
        // Keys under `n/` are refused as on every backend (they are the
        // lock's entries on etcd and ZooKeeper), so code moves between them.
        let below = format!("{name}/");
        if let Some(write) = writes
            .iter()
            .find(|w| w.key().starts_with(&prefix) || w.key() == name || w.key().starts_with(&below))
        {
            return Err(Error::InvalidName {
                name: write.key().to_owned(),
                reason: format!("the key is one of the lock {name:?}'s own keys, which fences the write"),
            });
        }
        let shared = &self.shared;
        let scripts = Arc::clone(&shared.scripts);
        let mut invocation = scripts.write_if_held.key(&entry.key);
        invocation.arg(entry.order);
        for write in writes {
            invocation.key(write.key());
        }
        for write in writes {
            invocation.arg(match write {
                Write::Put { .. } => "put",
                _ => "del",
            });
        }
        for write in writes {
            if let Write::Put { value, .. } = write {
                invocation.arg(value.as_slice());
            }
        }
        let reply = shared
            .run("write fenced on the entry", &scripts.write_if_held, &invocation, true)
            .await?;
        Ok(int(&reply) == Some(1))
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.shared.check_live()?;
        let mut get = redis::cmd("GET");
        get.arg(key);
        self.shared.command::<Option<Vec<u8>>>(key, &get).await
    }

    async fn confirm(&self) -> Result<SessionState> {
        let shared = &self.shared;
        if shared.state.borrow().is_over() {
            return Ok(*shared.state.borrow());
        }
        let mut exists = redis::cmd("EXISTS");
        exists.arg(layout::session_key(&shared.id));
        let found: i64 = shared.command("read the session key", &exists).await?;
        if found == 0 {
            shared.lose("the server no longer has the session");
        }
        Ok(*shared.state.borrow())
    }

    async fn close(&self) -> Result<()> {
        let shared = &self.shared;
        // A session already lost stays lost: closing it does not undo that.
        advance(&shared.state, SessionState::Closed);
        shared.signal_gone_all();
        for task in &self.tasks {
            task.abort();
        }
        // Every entry still listed (all of them, or those an earlier close
        // could not remove) and the session key: `Ok` once the server has
        // deleted them, so a second close after a failed one asks again.
        shared.remove_all().await
    }

    fn give_up(&self, why: &str) {
        self.shared.lose(why);
    }

    fn departure(&self, gone: &Entry) -> Departure {
        self.shared.departure(gone)
    }
}
