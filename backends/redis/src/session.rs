//! A session: a key renewed with every entry it owns, one pub/sub connection.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use lockline::backend::{
    advance, AppendRequest, Appended, BackendSession, Conflicts, Departure, Earlier, Entry, EntryKind, Queue,
    QueueUpdate, Slot, Wanted,
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

mod reply;
mod shared;

use reply::*;
use shared::written_past;
pub(crate) use shared::Shared;

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

/// How long a queue a hand-over's message carried may answer the next read
/// of that queue (see `Shared::take_handed`): the waiter it woke reads
/// right after its wait.
const HANDED_FOR: Duration = Duration::from_secs(1);

/// How many locks' queues carried by hand-overs' messages a session keeps
/// at once; past it they are dropped (each costing its waiter a read).
const HANDED_KEPT: usize = 1024;

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

impl RedisSession {
    pub(crate) fn new(shared: Arc<Shared>, tasks: Vec<AbortHandle>) -> Self {
        let state = shared.state.subscribe();
        RedisSession { shared, state, tasks }
    }

    /// The lock-mode queue `dir`, read from the server (see `READ_QUEUE`).
    async fn read_queue_now(&self, dir: &str) -> Result<Queue> {
        let shared = &self.shared;
        let _changing = shared.changing();
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
        // On a single node the session key goes along (see `APPEND`),
        // unless the server refused it before: a proxy, or a server in
        // cluster mode addressed as one node, takes a script's keys only
        // from one slot.
        let with_session_key = !shared.conn.is_cluster() && shared.session_key_in_append.load(Ordering::Relaxed);
        let invocation_with = |session_key: bool| {
            let mut invocation = scripts.append.key(layout::queue(name));
            invocation
                .key(layout::counter(name))
                .key(name)
                .key(layout::epoch(name))
                .key(layout::block(name));
            if session_key {
                invocation.key(layout::session_key(&shared.id));
            }
            invocation
                .arg(layout::prefix(name))
                .arg(request.attempt)
                .arg(layout::kind_label(request.kind))
                .arg(&shared.id)
                .arg(request.value)
                .arg(shared.ttl_ms())
                .arg(conflicts_arg(request.conflicts))
                // A lock-mode entry's `nearest` is its window of the queue
                // (the last argument); of the nearest conflicting entries it
                // reads one, as every append does.
                .arg(if request.kind == EntryKind::Dlm {
                    1
                } else {
                    request.nearest.max(1)
                })
                .arg(Self::wants_plain(request.kind))
                .arg(if request.kind == EntryKind::Dlm { "1" } else { "0" });
            invocation
        };
        let window = if request.kind == EntryKind::Dlm {
            request.nearest
        } else {
            0
        };
        // The epoch of the server at the other end of the very connection
        // the append goes on (see `APPEND`): rides on the append itself, no
        // request of its own.
        let what = "append to the queue";
        let script = &scripts.append;
        let invocation_with = &invocation_with;
        // Never sent twice here, even on a connection found closed: a copy
        // may still be on its way (held by a middlebox), and only the core,
        // which retries appends itself, knows to fence the whole attempt.
        let answer = shared
            .exchange(what, shared.options.request_timeout(), |mut link| async move {
                let mut invocation = invocation_with(with_session_key);
                invocation.arg(link.epoch()).arg(window);
                match shared.invoke(script, &invocation, true, &mut link).await {
                    Err(error) if crate::error::refused_with(&error, "NOSESSION") => Ok(None),
                    Err(error) if with_session_key && crate::error::refused_with(&error, "CROSSSLOT") => {
                        // Refused before it ran: the same append without
                        // the session key, and none from now on.
                        if shared.session_key_in_append.swap(false, Ordering::Relaxed) {
                            tracing::warn!(
                                target = %shared.target,
                                "the server takes a script's keys from one slot only: appends no longer check \
                                 the session key (a session the server forgot is found at its next renewal)"
                            );
                        }
                        let mut invocation = invocation_with(false);
                        invocation.arg(link.epoch()).arg(window);
                        shared.invoke(script, &invocation, true, &mut link).await.map(Some)
                    }
                    other => other.map(Some),
                }
            })
            .await
            .map_err(|e| for_lock(e, name))?;
        let Some((reply, acked)) = answer else {
            // The server no longer has the session (see `APPEND`): this try
            // appended nothing, and the session is lost. An earlier try of
            // the same attempt may have landed before the key went (an
            // eviction, a `DEL`): the attempt stays listed, so the loss's
            // cleanup removes whatever it left.
            shared.lose("the server no longer has the session");
            return Err(Error::SessionLost {
                session: shared.id.clone(),
            });
        };
        shared.check_acks(what, acked)?;
        let parsed = match &reply {
            Value::Array(parts) => match parts.as_slice() {
                [order, nearest] => int(order).zip(entries_from(name, nearest)).map(|o| (o, None)),
                [order, nearest, queue] => int(order)
                    .zip(entries_from(name, nearest))
                    .zip(queue_from(name, queue))
                    .map(|(o, queue)| (o, Some(queue))),
                _ => None,
            },
            _ => None,
        };
        let Some(((order, mut nearest), queue)) = parsed else {
            return Err(bad_reply("append to the queue", &reply));
        };
        nearest.truncate(if request.kind == EntryKind::Dlm {
            0
        } else {
            request.nearest
        });
        if let Some(tracked) = shared.entries().get_mut(&key) {
            tracked.known = true;
            tracked.order = Some(order);
        }
        self.mark_plain(&key, &nearest, request.kind);
        if shared.state.borrow().is_over() {
            // Lost or closed while the append was in flight: nothing renews
            // it now. Its append was answered, so it is removed by its order
            // (no tombstone: no append of it is still on its way).
            let _ = shared.remove_attempt(name, request.attempt, &order.to_string()).await;
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
            queue,
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
        self.watch_value_until(entry, seen, &|_| true).await
    }

    /// As `watch_value`, on the one subscription: a value `wanted` refuses
    /// is watched past, not subscribed to anew.
    async fn watch_value_until(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        let (name, attempt) = self.name_of(entry)?;
        let shared = &self.shared;
        // Before the subscription: a queue heard on it came after this.
        let quiet = shared.quiet();
        let mut messages = shared.hub.subscribe(&layout::channel(name, attempt)).await?;
        let mut seen = seen.to_vec();
        // The version of the last value a message carried, heard or not
        // before this subscription: only a newer one is news.
        let mut written = messages.written().map(|(version, _)| version);
        let mut recheck_at = Instant::now();
        // Whether the next wait needs a look first: not after a message
        // that carried a newer value the watcher does not want.
        let mut look = true;
        loop {
            if look {
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
                    if wanted(&value) {
                        return Ok(Some(value));
                    }
                    seen = value;
                }
                let recheck = if left >= 0 {
                    Duration::from_millis(left.unsigned_abs()) + EXPIRY_SLACK
                } else {
                    no_ttl_recheck(&shared.options)
                };
                recheck_at = Instant::now() + recheck;
            }
            tokio::select! {
                () = messages.changed() => {
                    if let Some(gone) = shared.heard_gone(&messages, entry, name, quiet) {
                        return gone;
                    }
                    look = !written_past(&messages, &mut written, &mut seen, wanted);
                }
                () = tokio::time::sleep_until(recheck_at) => look = true,
            }
        }
    }

    /// One script (see `READ_QUEUE`), or none right after a watch heard a
    /// hand-over say the whole queue it left (see `Shared::take_handed`).
    async fn read_queue(&self, dir: &str) -> Result<Queue> {
        match self.shared.take_handed(dir) {
            Some(Carried { queue, whole: true, .. }) => Ok(queue),
            _ => self.read_queue_now(dir).await,
        }
    }

    /// As `read_queue`, but the queue a hand-over's message carried may be
    /// a prefix.
    async fn read_queue_woken(&self, dir: &str) -> Result<(Queue, bool)> {
        match self.shared.take_handed(dir) {
            Some(carried) => Ok((carried.queue, carried.whole)),
            None => Ok((self.read_queue_now(dir).await?, true)),
        }
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
