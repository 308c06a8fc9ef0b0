//! The in-process backend, and [`Client::memory`](crate::Client::memory) over it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::{
    backend::{only_owner_unblocks, Queue, QueueUpdate, Slot, Wanted, WAITING_EX},
    AppendRequest, Appended, Backend, BackendSession, Conflicts, Earlier, Entry, EntryKind, Error, FencingToken,
    Result, SessionOptions, SessionState, Write,
};

const NAME: &str = "memory";

/// An in-process backend with the semantics of the real ones.
///
/// Entries are ordered by a store-wide revision (which is also the fencing
/// token), a session's entries are deleted when it ends, waiting is on one entry
/// at a time. Use it to test code that takes locks without running a server, and
/// in demos. Clones share one store; sessions of every [`Client`](crate::Client)
/// built on clones of one `MemoryBackend` contend with each other, like
/// processes sharing a cluster.
///
/// A session whose every handle is dropped without [`Session::close`](crate::Session::close)
/// expires one TTL later, as a crashed process's would on a server.
/// [`expire`](Self::expire) ends a session at once, as a server would expire it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// use lockline::{Client, MemoryBackend};
///
/// let store = MemoryBackend::new();
/// let session = Client::new(store.clone()).session().await?;
/// let guard = session.mutex("a")?.lock().await?;
/// assert!(store.expire(session.id()));
/// guard.lost().await; // the holder hears of it
/// assert!(!guard.is_held());
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    store: Arc<Store>,
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.store.lock();
        f.debug_struct("MemoryBackend")
            .field("revision", &state.revision)
            .field("sessions", &state.sessions.len())
            .field("entries", &state.entries.len())
            .finish()
    }
}

#[derive(Default)]
struct Store {
    state: std::sync::Mutex<State>,
    /// Bumped on every append, for `wait_for_entry`.
    appended: watch::Sender<u64>,
}

/// The maps of the store: its keys are the user's own names, hashed on every
/// call, where the default hasher's resistance to crafted keys costs more
/// than it guards.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Default)]
struct State {
    revision: i64,
    next_session: u64,
    /// Every entry by key.
    entries: Map<String, Record>,
    /// Each directory's entries by creation order.
    dirs: Map<String, BTreeMap<i64, String>>,
    sessions: Map<String, watch::Sender<SessionState>>,
    /// The keys written by fenced writes: persistent, apart from entries.
    data: BTreeMap<String, Vec<u8>>,
    /// Entries deleted with their session's loss (not released), and when:
    /// what a waiter's lock-delay asks (`departure`). Forgotten once asked,
    /// or all at once when many pile up.
    lost: Map<(String, i64), tokio::time::Instant>,
    /// Lock-mode resources' value blocks, by name.
    blocks: Map<String, Vec<u8>>,
}

struct Record {
    entry: Entry,
    dir: String,
    attempt: String,
    /// The current value; `None` is sent when the entry is deleted.
    value: watch::Sender<Option<Vec<u8>>>,
    /// Told of the owner's writes of the value only (and closed with the
    /// record): what a quiet waiter hears (`watch_blocker_until`), which
    /// other sessions' writes of a waiting or settled entry need not wake.
    owner_wrote: watch::Sender<()>,
    /// Bumped on every write of the value (a lock-mode slot's version).
    version: i64,
    /// The revision of the last write of the value.
    changed: u64,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding the lock; recover the data regardless.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends a session: deletes its entries and sets its final state.
    fn end(&self, id: &str, final_state: SessionState) -> bool {
        let mut state = self.lock();
        let Some(sender) = state.sessions.remove(id) else {
            return false;
        };
        // The state first: whoever is woken by the deletions below must already
        // see the session as over.
        sender.send_replace(final_state);
        let owned: Vec<String> = state
            .entries
            .values()
            .filter(|r| r.entry.owner.as_deref() == Some(id))
            .map(|r| r.entry.key.clone())
            .collect();
        let lost = final_state == SessionState::Lost;
        if lost && state.lost.len() > 4096 {
            state.lost.clear();
        }
        for key in owned {
            if let Some(entry) = state.delete(&key) {
                if lost {
                    state.lost.insert((entry.key, entry.order), tokio::time::Instant::now());
                }
            }
        }
        true
    }
}

impl State {
    fn delete(&mut self, key: &str) -> Option<Entry> {
        let record = self.entries.remove(key)?;
        if let Some(dir) = self.dirs.get_mut(&record.dir) {
            dir.remove(&record.entry.order);
            if dir.is_empty() {
                self.dirs.remove(&record.dir);
            }
        }
        record.value.send_replace(None);
        Some(record.entry)
    }

    /// The record of this very entry (same key, same creation order).
    fn record(&self, entry: &Entry) -> Option<&Record> {
        self.entries.get(&entry.key).filter(|r| r.entry.order == entry.order)
    }

    /// The lock-mode queue of `dir`, as [`BackendSession::read_queue`]
    /// gives it.
    fn queue(&self, dir: &str) -> Queue {
        self.queue_window(dir, None)
    }

    /// The queue, or with `window` (an entry's order and a count) only that
    /// many entries before the entry, the entry and those after it
    /// ([`AppendRequest::nearest`] for a lock-mode entry).
    fn queue_window(&self, dir: &str, window: Option<(i64, usize)>) -> Queue {
        let slots = self.dirs.get(dir).map_or_else(Vec::new, |dir| {
            let from = window.and_then(|(order, count)| dir.range(..order).rev().nth(count - 1).map(|(&o, _)| o));
            dir.range(from.unwrap_or(i64::MIN)..)
                .map(|(_, key)| key)
                .filter_map(|key| self.entries.get(key))
                .map(|r| Slot {
                    entry: r.entry.clone(),
                    value: r.value.borrow().clone().unwrap_or_default(),
                    version: r.version,
                    changed: r.changed,
                })
                .collect()
        });
        Queue {
            slots,
            block: self.blocks.get(dir).cloned(),
        }
    }

    /// The queue of `dir` through its first entry whose value begins with
    /// [`WAITING_EX`], and whether that is all of it (see
    /// [`BackendSession::read_queue_woken`]).
    fn queue_prefix(&self, dir: &str) -> (Queue, bool) {
        let mut whole = true;
        let slots = self.dirs.get(dir).map_or_else(Vec::new, |dir| {
            let mut records = dir.values().filter_map(|key| self.entries.get(key));
            let mut slots = Vec::new();
            while let Some(record) = records.next() {
                let value = record.value.borrow().clone().unwrap_or_default();
                let ends = value.starts_with(WAITING_EX);
                slots.push(Slot {
                    entry: record.entry.clone(),
                    value,
                    version: record.version,
                    changed: record.changed,
                });
                if ends {
                    whole = records.next().is_none();
                    break;
                }
            }
            slots
        });
        let queue = Queue {
            slots,
            block: self.blocks.get(dir).cloned(),
        };
        (queue, whole)
    }

    fn record_mut(&mut self, entry: &Entry) -> Option<&mut Record> {
        self.entries
            .get_mut(&entry.key)
            .filter(|r| r.entry.order == entry.order)
    }
}

// The memory backend's constructor on `Client` lives beside the backend:
// `client` imports no backend.
impl crate::Client {
    /// A client over a new, empty in-process [`MemoryBackend`]. Sessions of
    /// clones of this client see each other's locks; another `Client::memory()`
    /// is another, separate store.
    pub fn memory() -> Self {
        Self::new(MemoryBackend::new())
    }
}

impl MemoryBackend {
    /// A new, empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Expires the session with this id at once, as a server whose TTL ran out
    /// would: its entries are deleted and it becomes
    /// [`SessionState::Lost`]. Returns whether such a live session existed.
    pub fn expire(&self, session_id: &str) -> bool {
        self.store.end(session_id, SessionState::Lost)
    }

    /// The keys of every entry under `dir`, first-created first.
    pub fn keys(&self, dir: &str) -> Vec<String> {
        let state = self.store.lock();
        state
            .dirs
            .get(dir)
            .map(|entries| entries.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// A fenced write aimed at the lock's own entries.
fn under_own_lock(key: &str, dir: &str) -> Error {
    Error::InvalidName {
        name: key.to_owned(),
        reason: format!("the key lies under the entries of the lock {dir:?} that fences the write"),
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<Arc<dyn BackendSession>> {
        let mut state = self.store.lock();
        state.next_session += 1;
        let id = format!("{:x}", state.next_session);
        let (sender, receiver) = watch::channel(SessionState::Live);
        state.sessions.insert(id.clone(), sender);
        Ok(Arc::new(MemorySession {
            id,
            store: Arc::clone(&self.store),
            state: receiver,
            ttl: options.ttl(),
        }))
    }
}

/// A session of the [`MemoryBackend`].
pub(crate) struct MemorySession {
    id: String,
    store: Arc<Store>,
    state: watch::Receiver<SessionState>,
    ttl: Duration,
}

impl fmt::Debug for MemorySession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySession").field("id", &self.id).finish()
    }
}

impl MemorySession {
    fn check_live(&self) -> Result<()> {
        match *self.state.borrow() {
            SessionState::Live | SessionState::Suspended => Ok(()),
            SessionState::Closed => Err(Error::Closed {
                session: self.id.clone(),
            }),
            SessionState::Lost => Err(Error::SessionLost {
                session: self.id.clone(),
            }),
        }
    }
}

impl Drop for MemorySession {
    /// Every handle is gone, as if the process died: the store expires the
    /// session once its TTL has passed.
    fn drop(&mut self) {
        let store = Arc::clone(&self.store);
        let id = std::mem::take(&mut self.id);
        let ttl = self.ttl;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(ttl).await;
                    store.end(&id, SessionState::Lost);
                });
            }
            Err(_) => {
                store.end(&id, SessionState::Lost);
            }
        }
    }
}

#[async_trait]
impl BackendSession for MemorySession {
    fn id(&self) -> &str {
        &self.id
    }

    fn state(&self) -> watch::Receiver<SessionState> {
        self.state.clone()
    }

    async fn append(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        self.check_live()?;
        let mut state = self.store.lock();
        // Checked again under the store's lock: an expiry between the two
        // would otherwise leave an entry owned by an ended session.
        if !state.sessions.contains_key(&self.id) {
            drop(state);
            self.check_live()?;
            return Err(Error::SessionLost {
                session: self.id.clone(),
            });
        }
        state.revision += 1;
        let order = state.revision;
        let key = format!("{}/{}-{}-{:08}", request.dir, request.kind.label(), self.id, order);
        let entry = Entry {
            key: key.clone(),
            kind: request.kind,
            order,
            token: FencingToken::new(order.unsigned_abs()),
            owner: Some(self.id.clone()),
        };
        state.entries.insert(
            key.clone(),
            Record {
                entry: entry.clone(),
                dir: request.dir.to_owned(),
                attempt: request.attempt.to_owned(),
                value: watch::Sender::new(Some(request.value.to_vec())),
                owner_wrote: watch::Sender::new(()),
                version: 1,
                changed: order.unsigned_abs(),
            },
        );
        state.dirs.entry(request.dir.to_owned()).or_default().insert(order, key);
        self.store.appended.send_modify(|n| *n += 1);
        // A lock-mode request reads its window of the queue instead.
        let nearest = state
            .dirs
            .get(request.dir)
            .filter(|_| request.kind != EntryKind::Dlm)
            .map_or_else(Vec::new, |dir| {
                dir.range(..order)
                    .rev()
                    .filter_map(|(_, key)| state.entries.get(key))
                    .filter(|r| request.conflicts.includes(r.entry.kind))
                    .take(request.nearest)
                    .map(|r| r.entry.clone())
                    .collect()
            });
        let window = (request.nearest > 0).then_some((order, request.nearest));
        let queue = (request.kind == EntryKind::Dlm).then(|| state.queue_window(request.dir, window));
        Ok(Appended {
            entry,
            nearest: Some(nearest),
            queue,
        })
    }

    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let state = self.store.lock();
        let Some(record) = state.record(entry) else {
            return Ok(Earlier::Gone);
        };
        let nearest = state.dirs.get(&record.dir).map_or_else(Vec::new, |dir| {
            dir.range(..entry.order)
                .rev()
                .filter_map(|(_, key)| state.entries.get(key))
                .filter(|r| conflicts.includes(r.entry.kind))
                .take(count)
                .map(|r| r.entry.clone())
                .collect()
        });
        Ok(Earlier::Entries(nearest))
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let state = self.store.lock();
        Ok(state.dirs.get(dir).map_or_else(Vec::new, |dir| {
            dir.values()
                .filter_map(|key| state.entries.get(key))
                .map(|r| r.entry.clone())
                .collect()
        }))
    }

    async fn wait_for_entry(&self, dir: &str) -> Result<()> {
        let mut appended = self.store.appended.subscribe();
        loop {
            if self.store.lock().dirs.get(dir).is_some_and(|d| !d.is_empty()) {
                return Ok(());
            }
            // `self.store` owns the sender: no error while we borrow it.
            let _ = appended.changed().await;
        }
    }

    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let mut value = {
            let state = self.store.lock();
            match state.record(entry) {
                Some(record) => record.value.subscribe(),
                None => return Ok(()),
            }
        };
        // Ends when the entry is deleted (None sent, or the sender dropped).
        let _ = value.wait_for(Option::is_none).await;
        Ok(())
    }

    fn departure(&self, gone: &Entry) -> crate::backend::Departure {
        let mut state = self.store.lock();
        match state.lost.remove(&(gone.key.clone(), gone.order)) {
            Some(noticed) => crate::backend::Departure::Lost { noticed },
            None => crate::backend::Departure::Released,
        }
    }

    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let mut state = self.store.lock();
        if state.record(entry).is_none() {
            return Ok(false);
        }
        Ok(state.delete(&entry.key).is_some())
    }

    async fn abandon(&self, dir: &str, kind: EntryKind, attempt: &str) -> Result<()> {
        let mut state = self.store.lock();
        let key = state
            .dirs
            .get(dir)
            .into_iter()
            .flat_map(|dir| dir.values())
            .filter_map(|key| state.entries.get(key))
            .find(|r| r.attempt == attempt && r.entry.kind == kind && r.entry.owner.as_deref() == Some(&self.id))
            .map(|r| r.entry.key.clone());
        if let Some(key) = key {
            state.delete(&key);
        }
        Ok(())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<()> {
        let mut state = self.store.lock();
        state.revision += 1;
        let revision = state.revision.unsigned_abs();
        match state.record_mut(entry) {
            Some(record) => {
                record.version += 1;
                record.changed = revision;
                record.value.send_replace(Some(value.to_vec()));
                record.owner_wrote.send_replace(());
                Ok(())
            }
            None => Err(Error::LockLost { key: entry.key.clone() }),
        }
    }

    async fn read_queue(&self, dir: &str) -> Result<Queue> {
        Ok(self.store.lock().queue(dir))
    }

    /// Only the prefix: each read copies the entries it gives.
    async fn read_queue_woken(&self, dir: &str) -> Result<(Queue, bool)> {
        Ok(self.store.lock().queue_prefix(dir))
    }

    async fn update_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let mut state = self.store.lock();
        let holds = update
            .unchanged
            .iter()
            .all(|(entry, version)| state.record(entry).is_some_and(|r| r.version == *version))
            && update.present.iter().all(|entry| state.record(entry).is_some());
        if !holds {
            return Ok(None);
        }
        state.revision += 1;
        let revision = state.revision.unsigned_abs();
        for (entry, value) in update.set {
            if let Some(record) = state.record_mut(entry) {
                record.version += 1;
                record.changed = revision;
                record.value.send_replace(Some(value.to_vec()));
                if record.entry.owner.as_deref() == Some(self.id.as_str()) {
                    record.owner_wrote.send_replace(());
                }
            }
        }
        for entry in update.delete {
            if state.record(entry).is_some() {
                state.delete(&entry.key);
            }
        }
        if let Some(block) = update.block {
            state.blocks.insert(update.dir.to_owned(), block.to_vec());
        }
        Ok(Some(revision))
    }

    async fn get_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>> {
        let state = self.store.lock();
        Ok(state.record(entry).and_then(|r| r.value.borrow().clone()))
    }

    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        self.watch_value_until(entry, seen, &|_| true).await
    }

    async fn watch_value_until(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        let mut value = {
            let state = self.store.lock();
            match state.record(entry) {
                Some(record) => record.value.subscribe(),
                None => return Ok(None),
            }
        };
        // Every value in between, wanted or not, is seen in turn: a
        // value equal to `seen` again after an unwanted one is a change.
        let mut seen = seen.to_vec();
        let changed = value
            .wait_for(|v| match v.as_deref() {
                None => true,
                Some(v) if v == seen.as_slice() => false,
                Some(v) if wanted(v) => true,
                Some(v) => {
                    seen = v.to_vec();
                    false
                }
            })
            .await;
        Ok(changed.ok().and_then(|v| v.clone()))
    }

    /// Hears only the owner's writes, the removal and the end of the owner's
    /// session while the value seen is one [`only_owner_unblocks`] accepts
    /// (see the trait): in an EX chain a release's grant of the request the
    /// next waiter waits on then wakes no one but that request.
    async fn watch_blocker_until(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        if !only_owner_unblocks(seen) {
            return self.watch_value_until(entry, seen, wanted).await;
        }
        let (mut owner_wrote, value) = {
            let state = self.store.lock();
            match state.record(entry) {
                Some(record) => (record.owner_wrote.subscribe(), record.value.subscribe()),
                None => return Ok(None),
            }
        };
        let mut seen = seen.to_vec();
        loop {
            let now = value.borrow().clone();
            match now {
                None => return Ok(None),
                Some(now) if now != seen && wanted(&now) => return Ok(Some(now)),
                Some(now) => seen = now,
            }
            if !only_owner_unblocks(&seen) {
                // The owner began a conversion: every writer is heard again.
                return self.watch_value_until(entry, &seen, wanted).await;
            }
            if owner_wrote.changed().await.is_err() {
                // The record was dropped with the entry.
                return Ok(None);
            }
        }
    }

    /// One step under the store's lock: the entry is checked and every
    /// write applied, with nothing in between.
    async fn write_if_held(&self, entry: &Entry, writes: &[Write]) -> Result<bool> {
        let mut state = self.store.lock();
        let Some(record) = state.record(entry) else {
            return Ok(false);
        };
        let own = format!("{}/", record.dir);
        if let Some(write) = writes.iter().find(|w| w.key().starts_with(&own)) {
            return Err(under_own_lock(write.key(), &record.dir));
        }
        for write in writes {
            match write {
                Write::Put { key, value } => {
                    state.data.insert(key.clone(), value.clone());
                }
                Write::Delete { key } => {
                    state.data.remove(key);
                }
            }
        }
        Ok(true)
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.check_live()?;
        Ok(self.store.lock().data.get(key).cloned())
    }

    async fn close(&self) -> Result<()> {
        self.store.end(&self.id, SessionState::Closed);
        Ok(())
    }
}
