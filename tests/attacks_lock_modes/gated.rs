//! `Gated`: the memory backend with a trap on one session's next call of one
//! primitive (applied in the store, its caller not resumed yet), or a yield
//! after every call.

use super::*;

#[derive(Default)]
pub(crate) struct Ctl {
    pub(crate) traps: Std<Vec<Trap>>,
    pub(crate) yielding: Std<HashSet<String>>,
    /// When set, every `update_queue` is serialized with a read of the
    /// queue right after it, which must show pairwise compatible grants
    /// (grants are made by `update_queue` only, so this checks every state
    /// the store passes through).
    pub(crate) audit: std::sync::atomic::AtomicBool,
    pub(crate) serial: tokio::sync::Mutex<()>,
    pub(crate) violations: Std<Vec<String>>,
    /// `(session, op)`: that session's next call of `op` is applied and its
    /// answer lost (it says `Unavailable`).
    pub(crate) lose: Std<Vec<(String, &'static str)>>,
    /// Every append applied, by (session, attempt).
    pub(crate) appended: Std<HashMap<(String, String), Appended>>,
    /// When set, `read_queue_woken` answers a prefix of the queue, as a
    /// hand-over's message on Redis does: through the first request that
    /// waits for EX and was never granted.
    pub(crate) prefixes: std::sync::atomic::AtomicBool,
    /// How many reads `read_queue_woken` answered with a prefix cut short,
    /// and how many `read_queue` answered.
    pub(crate) prefixes_given: std::sync::atomic::AtomicUsize,
    pub(crate) whole_reads: std::sync::atomic::AtomicUsize,
    /// Told each time a prefix is given.
    pub(crate) prefix_given: tokio::sync::Notify,
}

/// `queue` through its first entry whose value begins with `WAITING_EX`,
/// and whether that is all of it.
pub(crate) fn prefix_of(mut queue: Queue) -> (Queue, bool) {
    match queue.slots.iter().position(|s| s.value.starts_with(WAITING_EX)) {
        Some(at) if at + 1 < queue.slots.len() => {
            queue.slots.truncate(at + 1);
            (queue, false)
        }
        _ => (queue, true),
    }
}

/// The granted mode in a lock-mode entry's value (`dlm2 <granted> ...`).
pub(crate) fn granted_in(value: &[u8]) -> Option<LockMode> {
    let text = std::str::from_utf8(value).ok()?;
    let mut words = text.split(' ');
    if words.next()? != "dlm2" {
        return None;
    }
    words.next()?.parse().ok()
}

pub(crate) struct Trap {
    pub(crate) session: String,
    pub(crate) op: &'static str,
    pub(crate) reached: Option<oneshot::Sender<()>>,
    pub(crate) resume: oneshot::Receiver<()>,
}

#[derive(Clone, Default)]
pub(crate) struct Gated {
    pub(crate) store: MemoryBackend,
    pub(crate) ctl: Arc<Ctl>,
}

impl fmt::Debug for Gated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gated").field("store", &self.store).finish()
    }
}

/// A trap set: `reached` resolves once the call applied; sending on (or
/// dropping) `resume` lets the caller go on.
pub(crate) struct Armed {
    pub(crate) reached: oneshot::Receiver<()>,
    pub(crate) resume: oneshot::Sender<()>,
}

impl Gated {
    /// Stops `session`'s next call of `op` after the store applied it.
    pub(crate) fn trap(&self, session: &Session, op: &'static str) -> Armed {
        let (reached_tx, reached) = oneshot::channel();
        let (resume, resume_rx) = oneshot::channel();
        self.ctl.traps.lock().unwrap().push(Trap {
            session: session.id().to_owned(),
            op,
            reached: Some(reached_tx),
            resume: resume_rx,
        });
        Armed { reached, resume }
    }

    /// Makes `session`'s next call of `op` lose its answer after the store
    /// applied it: the caller hears `Unavailable`.
    pub(crate) fn lose_answer(&self, session: &Session, op: &'static str) {
        self.ctl.lose.lock().unwrap().push((session.id().to_owned(), op));
    }

    /// Makes every call of `session` yield once after it applied.
    pub(crate) fn yielding(&self, session: &Session) {
        self.ctl.yielding.lock().unwrap().insert(session.id().to_owned());
    }
}

#[async_trait]
impl Backend for Gated {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn open_session(&self, options: &SessionOptions) -> lockline::Result<Arc<dyn BackendSession>> {
        let inner = self.store.open_session(options).await?;
        Ok(Arc::new(GatedSession {
            inner,
            ctl: Arc::clone(&self.ctl),
        }))
    }
}

pub(crate) struct GatedSession {
    pub(crate) inner: Arc<dyn BackendSession>,
    pub(crate) ctl: Arc<Ctl>,
}

impl fmt::Debug for GatedSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedSession").field("id", &self.inner.id()).finish()
    }
}

impl GatedSession {
    /// Whether this call of `op` loses its answer (see `Gated::lose_answer`).
    pub(crate) fn lost<T>(&self, op: &'static str, out: lockline::Result<T>) -> lockline::Result<T> {
        let mut lose = self.ctl.lose.lock().unwrap();
        match lose.iter().position(|(s, o)| s == self.inner.id() && *o == op) {
            Some(at) => {
                lose.remove(at);
                Err(Error::unavailable("memory", format!("{op}: answer lost (test)")))
            }
            None => out,
        }
    }

    /// Only the traps of `after`, no yield (for `watch_value`, which the
    /// cancellation sweep does not count as an await point).
    pub(crate) async fn trapped(&self, op: &'static str) {
        let trap = {
            let mut traps = self.ctl.traps.lock().unwrap();
            let id = self.inner.id();
            traps
                .iter()
                .position(|t| t.session == id && t.op == op)
                .map(|at| traps.remove(at))
        };
        if let Some(mut trap) = trap {
            if let Some(reached) = trap.reached.take() {
                let _ = reached.send(());
            }
            let _ = (&mut trap.resume).await;
        }
    }

    pub(crate) async fn after(&self, op: &'static str) {
        self.trapped(op).await;
        let yielding = self.ctl.yielding.lock().unwrap().contains(self.inner.id());
        if yielding {
            tokio::task::yield_now().await;
        }
    }
}

#[async_trait]
impl BackendSession for GatedSession {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn state(&self) -> watch::Receiver<SessionState> {
        self.inner.state()
    }
    async fn append(&self, request: &AppendRequest<'_>) -> lockline::Result<Appended> {
        // A retried append finds its own entry, as every server backend's
        // does (the memory backend never loses an answer, so never needs to).
        let key = (self.inner.id().to_owned(), request.attempt.to_owned());
        if let Some(appended) = self.ctl.appended.lock().unwrap().get(&key) {
            return Ok(appended.clone());
        }
        let out = self.inner.append(request).await;
        if let Ok(appended) = &out {
            self.ctl.appended.lock().unwrap().insert(key, appended.clone());
        }
        self.after("append").await;
        self.lost("append", out)
    }
    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> lockline::Result<Earlier> {
        self.inner.earlier(entry, conflicts, count).await
    }
    async fn list(&self, dir: &str) -> lockline::Result<Vec<Entry>> {
        self.inner.list(dir).await
    }
    async fn wait_for_entry(&self, dir: &str) -> lockline::Result<()> {
        self.inner.wait_for_entry(dir).await
    }
    async fn wait_gone(&self, entry: &Entry) -> lockline::Result<()> {
        self.inner.wait_gone(entry).await
    }
    async fn remove(&self, entry: &Entry) -> lockline::Result<bool> {
        let out = self.inner.remove(entry).await;
        self.after("remove").await;
        self.lost("remove", out)
    }
    async fn abandon(&self, dir: &str, kind: EntryKind, attempt: &str) -> lockline::Result<()> {
        self.inner.abandon(dir, kind, attempt).await
    }
    async fn set_value(&self, entry: &Entry, value: &[u8]) -> lockline::Result<()> {
        self.inner.set_value(entry, value).await
    }
    async fn get_value(&self, entry: &Entry) -> lockline::Result<Option<Vec<u8>>> {
        self.inner.get_value(entry).await
    }
    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> lockline::Result<Option<Vec<u8>>> {
        let out = self.inner.watch_value(entry, seen).await;
        self.trapped("watch_value").await;
        out
    }
    async fn write_if_held(&self, entry: &Entry, writes: &[Write]) -> lockline::Result<bool> {
        self.inner.write_if_held(entry, writes).await
    }
    async fn read(&self, key: &str) -> lockline::Result<Option<Vec<u8>>> {
        self.inner.read(key).await
    }
    fn departure(&self, gone: &Entry) -> Departure {
        self.inner.departure(gone)
    }
    fn grant_not_before(&self) -> Option<Instant> {
        self.inner.grant_not_before()
    }
    async fn removed_by_me(&self, entry: &Entry) -> lockline::Result<Option<bool>> {
        self.inner.removed_by_me(entry).await
    }
    async fn read_queue_woken(&self, dir: &str) -> lockline::Result<(Queue, bool)> {
        use std::sync::atomic::Ordering::SeqCst;
        if !self.ctl.prefixes.load(SeqCst) {
            return Ok((self.read_queue(dir).await?, true));
        }
        let out = self.inner.read_queue(dir).await.map(prefix_of);
        if let Ok((_, false)) = &out {
            self.ctl.prefixes_given.fetch_add(1, SeqCst);
            self.ctl.prefix_given.notify_waiters();
        }
        self.after("read_queue").await;
        self.lost("read_queue", out)
    }
    async fn read_queue(&self, dir: &str) -> lockline::Result<Queue> {
        self.ctl.whole_reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let out = self.inner.read_queue(dir).await;
        self.after("read_queue").await;
        self.lost("read_queue", out)
    }
    async fn update_queue(&self, update: &QueueUpdate<'_>) -> lockline::Result<Option<u64>> {
        let out = if self.ctl.audit.load(std::sync::atomic::Ordering::SeqCst) {
            let _serial = self.ctl.serial.lock().await;
            let out = self.inner.update_queue(update).await;
            if let Ok(queue) = self.inner.read_queue(update.dir).await {
                let granted: Vec<(String, LockMode)> = queue
                    .slots
                    .iter()
                    .filter_map(|s| granted_in(&s.value).map(|g| (s.entry.key.clone(), g)))
                    .collect();
                for (i, (ka, a)) in granted.iter().enumerate() {
                    for (kb, b) in &granted[i + 1..] {
                        if !a.compatible(*b) {
                            self.ctl
                                .violations
                                .lock()
                                .unwrap()
                                .push(format!("store: {ka} granted {a} beside {kb} granted {b} ({granted:?})"));
                        }
                    }
                }
            }
            out
        } else {
            self.inner.update_queue(update).await
        };
        self.after("update_queue").await;
        self.lost("update_queue", out)
    }
    async fn confirm(&self) -> lockline::Result<SessionState> {
        self.inner.confirm().await
    }
    async fn close(&self) -> lockline::Result<()> {
        self.inner.close().await
    }
    fn give_up(&self, why: &str) {
        self.inner.give_up(why);
    }
}

pub(crate) async fn gated_sessions(n: usize) -> (Gated, Vec<(Client, Session)>) {
    let gated = Gated::default();
    let mut out = Vec::new();
    for _ in 0..n {
        let client = Client::new(gated.clone());
        let session = client.session().await.expect("session");
        out.push((client, session));
    }
    (gated, out)
}
