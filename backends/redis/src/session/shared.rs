//! What a session's tasks share: its tracked entries, the exchange with
//! the server (timeouts, epochs, replica acknowledgements), renewals and
//! the keep-alive loop.

use super::*;

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
    pub(super) entries: std::sync::Mutex<HashMap<String, Tracked>>,
    /// Our entries a release announced as holding now: their next
    /// `earlier` needs no read (the release's script made it).
    pub(super) heads: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Entries of others this session waited on and saw go (by entry key
    /// and order): when, if they went with their owner's session, `None` if
    /// released. What `departure` answers for a lock-delay; one it never
    /// saw go (a wait cut short) counts as lost. Kept only with a
    /// lock-delay.
    pub(super) lost: std::sync::Mutex<HashMap<(String, i64), Option<Instant>>>,
    /// This session's own entries (by entry key and order) that a removal
    /// found gone without a removal of theirs, for `removed_by_me`. Bounded.
    pub(super) taken: std::sync::Mutex<std::collections::HashSet<(String, i64)>>,
    /// This session's changes of its queues (its writes, and its reads of
    /// a lock-mode queue from the server): how many are in flight, and how
    /// many began or ended so far. See [`take_handed`](Self::take_handed).
    pub(super) changes: std::sync::Mutex<(u32, u64)>,
    /// The queues hand-overs' messages carried (see `UPDATE_QUEUE`), by
    /// lock name, the newest heard of each. Bounded.
    pub(super) handed: std::sync::Mutex<HashMap<String, Handed>>,
    /// Whether appends take the session key along (a single node's, see
    /// `APPEND`): cleared once the server refused it as another slot's.
    pub(super) session_key_in_append: std::sync::atomic::AtomicBool,
}

/// A queue a hand-over's message carried: when heard, the count of changes
/// before the watch that heard it subscribed, and the queue.
pub(super) type Handed = (Instant, u64, Carried);

/// A change of this session's queues in flight, counted until dropped
/// (see [`Shared::changing`]).
pub(super) struct Changing<'a>(&'a Shared);

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        let mut changes = self.0.changes.lock().unwrap_or_else(PoisonError::into_inner);
        changes.0 = changes.0.saturating_sub(1);
        changes.1 += 1;
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
            changes: std::sync::Mutex::new((0, 0)),
            handed: std::sync::Mutex::new(HashMap::new()),
            session_key_in_append: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Whether a message said the watched entry is gone, and how: the
    /// server's own word, said only once it is deleted, no look needed
    /// (`Some(Ok(None))`, the watch's answer). A hand-over's message may
    /// also say what it left: the read the core makes next then needs no
    /// request (see `Shared::take_handed`).
    pub(super) fn heard_gone(
        &self,
        messages: &crate::hub::Subscription,
        entry: &Entry,
        name: &str,
        quiet: Option<u64>,
    ) -> Option<Result<Option<Vec<u8>>>> {
        if !messages.heard_gone() {
            return None;
        }
        if messages.heard_lost() {
            self.note_lost(entry);
        } else {
            self.note_released(entry);
            let handed = messages
                .handed_queue()
                .and_then(|packed| queue_from_packed(name, &packed));
            if let (Some(quiet), Some(carried)) = (quiet, handed) {
                self.keep_handed(name, quiet, carried);
            }
        }
        Some(Ok(None))
    }

    /// Counts a change of this session's queues from now until the guard
    /// is dropped.
    pub(super) fn changing(&self) -> Changing<'_> {
        let mut changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        changes.0 += 1;
        changes.1 += 1;
        Changing(self)
    }

    /// The count of changes so far, if none is in flight.
    pub(super) fn quiet(&self) -> Option<u64> {
        let changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        (changes.0 == 0).then_some(changes.1)
    }

    /// Keeps the queue a hand-over's message carried, heard by a watch
    /// that subscribed when the count of changes was `quiet`, unless one
    /// of a later hand-over of that lock is kept already (two watches of
    /// this session may hear two hand-overs and end in either order).
    pub(super) fn keep_handed(&self, name: &str, quiet: u64, carried: Carried) {
        let mut handed = self.handed.lock().unwrap_or_else(PoisonError::into_inner);
        if handed.len() >= HANDED_KEPT && !handed.contains_key(name) {
            handed.clear();
        }
        if handed
            .get(name)
            .is_some_and(|(_, _, kept)| kept.newness > carried.newness)
        {
            return;
        }
        handed.insert(name.to_owned(), (Instant::now(), quiet, carried));
    }

    /// The queue of lock `name` a hand-over's message carried, taken once,
    /// if heard within [`HANDED_FOR`] and this session changed none of its
    /// queues, nor read one from the server, since before the watch that
    /// heard it subscribed. Such a queue is then what a read would have
    /// answered at the moment of the hand-over, which came after every
    /// change this session made and before any it makes next: its reads of
    /// a lock never go back in time and always show its own writes.
    ///
    /// Taking one counts as a read: a queue heard by a watch that began
    /// before it, and kept after it, may be older, and is not used.
    pub(super) fn take_handed(&self, name: &str) -> Option<Carried> {
        let (at, quiet, carried) = self
            .handed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name)?;
        let fresh = at.elapsed() <= HANDED_FOR && self.quiet() == Some(quiet);
        drop(self.changing());
        fresh.then_some(carried)
    }

    pub(super) fn ttl_ms(&self) -> u64 {
        u64::try_from(self.options.ttl().as_millis()).unwrap_or(u64::MAX)
    }

    pub(super) fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn check_live(&self) -> Result<()> {
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
        self.exchange_by(what, timeout, deadline, request)
            .await
            .map_err(|(error, _)| error)
    }

    /// As [`exchange`](Self::exchange), for a request that only reads:
    /// when its connection turns out closed (the server restarted or
    /// dropped it; not a request left unanswered), it is sent once more on
    /// a new connection, within the same bound. The first read after a
    /// restart then meets the new server, not the closed connection. (An
    /// append is never sent twice here: a copy may still be on its way.)
    pub(crate) async fn exchange_again_if_closed<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut request: F,
    ) -> Result<T>
    where
        F: FnMut(Link) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let deadline = Instant::now() + timeout;
        match self.exchange_by(what, timeout, deadline, &mut request).await {
            Err((_, true)) => {
                tracing::debug!(target = %self.target, what, "the connection was closed; sending once more on a new one");
                self.exchange_by(what, timeout, deadline, request)
                    .await
                    .map_err(|(error, _)| error)
            }
            outcome => outcome.map_err(|(error, _)| error),
        }
    }

    /// One request on the current connection, by `deadline`; a failure
    /// says whether the connection was closed under it (not timed out).
    async fn exchange_by<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        deadline: Instant,
        request: F,
    ) -> std::result::Result<T, (Error, bool)>
    where
        F: FnOnce(Link) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let link = match tokio::time::timeout_at(deadline, self.conn.link()).await {
            Ok(Ok(link)) => link,
            Ok(Err(error)) => return Err((map(what, &self.target, error), false)),
            Err(_) => return Err((timed_out(what, &self.target, timeout), false)),
        };
        match tokio::time::timeout_at(deadline, request(link.clone())).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                self.conn.replace_if_broken(&link, &error);
                let closed = error.is_connection_dropped() && !error.is_timeout();
                Err((map(what, &self.target, error), closed))
            }
            Err(_) => {
                self.conn.replace(&link);
                Err((timed_out(what, &self.target, timeout), false))
            }
        }
    }

    /// Runs a script on `link`; with replica acknowledgement asked for (and
    /// a write), also how many replicas acknowledged it (`WAIT`).
    pub(super) async fn invoke(
        &self,
        script: &redis::Script,
        invocation: &ScriptInvocation<'_>,
        writes: bool,
        link: &mut Link,
    ) -> redis::RedisResult<(Value, Option<i64>)> {
        let _changing = writes.then(|| self.changing());
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
    pub(super) fn check_acks(&self, what: &str, acked: Option<i64>) -> Result<()> {
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
    /// enough replicas have it. A script that only reads is sent once more
    /// on a new connection when its connection was closed under it.
    pub(super) async fn run(
        &self,
        what: &str,
        script: &redis::Script,
        invocation: &ScriptInvocation<'_>,
        writes: bool,
    ) -> Result<Value> {
        let request = |mut link: Link| async move { self.invoke(script, invocation, writes, &mut link).await };
        let timeout = self.options.request_timeout();
        let (reply, acked) = if writes {
            self.exchange(what, timeout, request).await?
        } else {
            self.exchange_again_if_closed(what, timeout, request).await?
        };
        self.check_acks(what, acked)?;
        Ok(reply)
    }

    /// Runs a writing script whose last argument is the epoch of the server
    /// it is sent to (see `APPEND` in the scripts), added here on the very
    /// connection the script goes on: no request of its own. Bounded by the
    /// request timeout, confirmed by replicas as [`run`](Self::run) is.
    pub(super) async fn run_in_epoch(
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

    /// One command that only reads, bounded by the request timeout (sent
    /// once more on a new connection when its connection was closed).
    pub(super) async fn command<T: redis::FromRedisValue>(&self, what: &str, cmd: &redis::Cmd) -> Result<T> {
        self.exchange_again_if_closed(what, self.options.request_timeout(), |mut link| async move {
            cmd.query_async::<T>(&mut link).await
        })
        .await
    }

    /// This very entry's value and remaining TTL in ms (-1: none), or how
    /// it went. One script.
    pub(super) async fn look_value(&self, entry: &Entry) -> Result<Look> {
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
    pub(super) async fn status(&self, entry: &Entry) -> Result<Status> {
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
    pub(super) fn note_lost(&self, entry: &Entry) {
        self.note(entry, Some(Instant::now()));
    }

    /// Remembers, for a lock-delay, that `entry` was seen released.
    pub(super) fn note_released(&self, entry: &Entry) {
        self.note(entry, None);
    }

    pub(super) fn note(&self, entry: &Entry, lost_at: Option<Instant>) {
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
    pub(super) fn departure(&self, entry: &Entry) -> Departure {
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
    pub(super) fn forget(&self, key: &str) {
        if let Some(tracked) = self.entries().remove(key) {
            tracked.gone.signal();
        }
        self.heads.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
    }

    /// Declares the session lost and, as far as the server answers, ends it
    /// there too (its key and its entries), never to be renewed again.
    pub(super) fn lose(self: &Arc<Self>, why: &str) {
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
    pub(super) async fn remove_all(&self) -> Result<()> {
        // On a single node the session key goes first: from then on the
        // server refuses every append of this session (see `APPEND`), so an
        // attempt whose append was never answered is removed without a
        // tombstone, and none is left behind. A cluster keeps the key in
        // another slot than the entries, out of the scripts' reach (so does
        // a server that refused it: `session_key_in_append`): there the
        // tombstones stay, and the key goes last.
        let single = !self.conn.is_cluster() && self.session_key_in_append.load(std::sync::atomic::Ordering::Relaxed);
        let mut first_error = None;
        if single {
            let mut del = redis::cmd("DEL");
            del.arg(layout::session_key(&self.id));
            if let Err(error) = self.command::<i64>("delete the session key", &del).await {
                first_error.get_or_insert(error);
            }
        }
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
        // Without the key's deletion confirmed, tombstones as on a cluster.
        let keyless = single && first_error.is_none();
        let removals = owned.iter().map(|(_, name, attempt, order)| async move {
            self.remove_owned_as(name, attempt, order, &self.id, keyless)
                .await
                .map(|n| n == 1)
        });
        let results = futures::future::join_all(removals).await;
        for ((key, ..), result) in owned.iter().zip(results) {
            match result {
                Ok(_) => self.forget(key),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if !single {
            let mut del = redis::cmd("DEL");
            del.arg(layout::session_key(&self.id));
            if let Err(error) = self.command::<i64>("delete the session key", &del).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Runs the removal script for `attempt` under `name`, fenced on `order`
    /// (empty: any) and on the owner.
    pub(super) async fn remove_attempt(&self, name: &str, attempt: &str, order: &str) -> Result<bool> {
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
    pub(super) async fn remove_owned(&self, name: &str, attempt: &str, order: &str, owner: &str) -> Result<i64> {
        self.remove_owned_as(name, attempt, order, owner, false).await
    }

    /// [`remove_owned`](Self::remove_owned); `keyless` once this session's
    /// key is deleted from a single node (see `REMOVE`).
    async fn remove_owned_as(&self, name: &str, attempt: &str, order: &str, owner: &str, keyless: bool) -> Result<i64> {
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
        if lost || keyless {
            invocation.arg(if lost { "lost" } else { "" });
        }
        if keyless {
            invocation.arg("keyless");
        }
        let reply = self.run("remove the entry", &scripts.remove, &invocation, true).await?;
        Ok(int(&reply).unwrap_or(0))
    }

    /// One renewal: the session key and every entry, in one round trip on a
    /// single node. Returns whether the session key was still there, and the
    /// entries found gone.
    pub(super) async fn renew(&self) -> Result<(bool, Vec<String>)> {
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
    pub(super) fn renewal_timeout(&self) -> Duration {
        self.options.request_timeout() + self.acks.map_or(Duration::ZERO, |acks| acks.timeout)
    }

    /// One renewal, tried a second time at once if the first failed: a
    /// request on a connection the server dropped (it restarted, or failed
    /// over) or that went unanswered (a middlebox forgot it) fails and gives
    /// the connection up, and the second try goes on a new one. Every
    /// command of a renewal may be repeated.
    pub(super) async fn renew_reconnecting(&self) -> Result<(bool, Vec<String>)> {
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

    pub(super) fn signal_gone_all(&self) {
        for tracked in self.entries().values() {
            tracked.gone.signal();
        }
    }

    /// Waits until the plain key `name`, owned by a foreign client, is gone:
    /// on its keyspace events when the server sends them, and otherwise at
    /// its TTL (re-armed if it was renewed).
    pub(super) async fn wait_plain(&self, name: &str) -> Result<()> {
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

/// Whether the last message heard carried a newer value that `wanted`
/// refuses (a lock-mode update's write, see `UPDATE_QUEUE`): it becomes
/// the value seen and the wait goes on without a look. Any other
/// message (a write that did not say its value, a reconnection) needs
/// the look; so does a wanted value, which the look confirms.
pub(super) fn written_past(
    messages: &crate::hub::Subscription,
    written: &mut Option<u64>,
    seen: &mut Vec<u8>,
    wanted: &Wanted,
) -> bool {
    let Some((version, value)) = messages.written() else {
        return false;
    };
    if written.is_some_and(|known| version <= known) {
        return false;
    }
    *written = Some(version);
    if wanted(&value) {
        return false;
    }
    *seen = value.to_vec();
    true
}
