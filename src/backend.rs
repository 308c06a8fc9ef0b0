//! For backend authors: the traits a backend implements, the entries it
//! stores and the queue primitives every recipe is written over.
//!
//! Users of lockline need none of this: they pick a backend crate
//! (`lockline-etcd`, `lockline-zookeeper`) or [`MemoryBackend`](crate::MemoryBackend)
//! and hand it to [`Client::new`](crate::Client::new).
//!
//! A backend knows how to store entries (their keys or paths, the layout other
//! clients expect) and how to wait for one entry to disappear. It knows nothing
//! of recipes: which entry a contender waits for is decided once, in the core,
//! by the wait rule. The conformance suite (cargo feature `conformance`)
//! checks a backend against the behaviour the recipes rely on.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::{Error, FencingToken, Result, SessionOptions, SessionState, Write};

/// The kind of contender an entry stands for.
///
/// Backends choose each kind's layout (etcd key shape, ZooKeeper node name) so
/// that other clients of the same server recognise it. Entries written by foreign
/// clients are reported with the kind that matches their meaning (an exclusive
/// lock as [`EntryKind::Mutex`], a shared one as [`EntryKind::Read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EntryKind {
    /// An exclusive lock.
    Mutex,
    /// A shared (read) lock.
    Read,
    /// An exclusive (write) lock of a read/write lock.
    Write,
    /// A semaphore permit.
    Semaphore,
    /// A leader-election candidate.
    Election,
    /// Another client's recipe found under the name that lockline recognises
    /// but cannot queue with (a Curator or kazoo semaphore's nodes in a
    /// ZooKeeper lock directory). No lockline contender queues with it:
    /// acquires under that name fail with
    /// [`Error::InvalidName`].
    Foreign,
    /// A contender of a [`Resource`](crate::Resource) in one of the six lock
    /// modes. Its mode, its grant and its conversion live in its value,
    /// written and read by the core (see [`Queue`]); the backend stores the
    /// value and never reads it. Queues only with other entries of this kind.
    Dlm,
}

impl EntryKind {
    /// Whether entries of this kind share the lock with each other (readers).
    pub fn is_shared(self) -> bool {
        matches!(self, EntryKind::Read)
    }

    /// Whether a contender of this kind can queue with an entry of `other` kind
    /// under one name without breaking either's guarantee.
    ///
    /// Mutexes, read and write locks and election candidates all follow the
    /// exclusive rule (and on etcd a mutex and a candidate are the same Go
    /// layout), so they exclude each other safely. A semaphore permit holds
    /// beside up to `n - 1` earlier entries, so a semaphore mixed with any other
    /// kind would let a permit holder and a lock holder in together: semaphores
    /// queue only with semaphores.
    /// [`EntryKind::Foreign`] queues with nothing.
    pub fn queues_with(self, other: EntryKind) -> bool {
        if self == EntryKind::Foreign || other == EntryKind::Foreign {
            return false;
        }
        if (self == EntryKind::Dlm) != (other == EntryKind::Dlm) {
            return false;
        }
        (self == EntryKind::Semaphore) == (other == EntryKind::Semaphore)
    }

    /// A short lowercase label (`mutex`, `read`, `write`, `semaphore`,
    /// `election`, `foreign recipe`, `lock mode`).
    pub fn label(self) -> &'static str {
        match self {
            EntryKind::Mutex => "mutex",
            EntryKind::Read => "read",
            EntryKind::Write => "write",
            EntryKind::Semaphore => "semaphore",
            EntryKind::Election => "election",
            EntryKind::Foreign => "foreign recipe",
            EntryKind::Dlm => "lock mode",
        }
    }
}

// The error a contender gets for an entry of another recipe in its way,
// beside the kinds it describes: `backend` depends on `error`, not the other
// way round.
impl Error {
    /// Refuses to queue a `kind` contender for `name` behind `other`, an entry
    /// of a recipe it cannot share a queue with (see [`EntryKind::queues_with`]).
    pub(crate) fn mixed_recipes(name: &str, kind: EntryKind, other: &Entry) -> Self {
        Error::InvalidName {
            name: name.to_owned(),
            reason: format!(
                "a {} cannot queue with the {} entry {:?} already under this name; use one recipe kind per name",
                kind.label(),
                other.kind.label(),
                other.key
            ),
        }
    }
}

/// One contender's record in a lock's queue, as the server stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The full key (etcd) or path (ZooKeeper) of the entry.
    pub key: String,
    /// What the entry stands for.
    pub kind: EntryKind,
    /// The server's creation order: etcd create revision, ZooKeeper sequence
    /// number. Smaller is earlier.
    pub order: i64,
    /// The fencing token a holder of this entry presents.
    pub token: FencingToken,
    /// The id of the session that owns the entry, when the backend can tell.
    pub owner: Option<String>,
}

/// Which earlier entries can block a contender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Conflicts {
    /// Every entry (a mutex, a write lock, a semaphore permit, a candidate).
    All,
    /// Only entries that are not shared (what blocks a read lock).
    Exclusive,
}

impl Conflicts {
    /// Whether an entry of this kind can block.
    pub fn includes(self, kind: EntryKind) -> bool {
        match self {
            Conflicts::All => true,
            Conflicts::Exclusive => !kind.is_shared(),
        }
    }
}

/// What to append, and what to read back in the same round trip.
#[derive(Debug, Clone, Copy)]
pub struct AppendRequest<'a> {
    /// The lock's name (already validated), under which entries are kept.
    pub dir: &'a str,
    /// The kind of the new entry.
    pub kind: EntryKind,
    /// A unique id of this acquire attempt. A backend that cannot tell from a
    /// lost response whether the entry was created puts it into the entry (the
    /// ZooKeeper node name) so that [`BackendSession::abandon`] and retries can
    /// find it.
    pub attempt: &'a str,
    /// The entry's value (an election candidate's proclaimed value; empty for locks).
    pub value: &'a [u8],
    /// Which earlier entries can block the new one.
    pub conflicts: Conflicts,
    /// How many of the nearest earlier conflicting entries the backend should
    /// read back with the append, where it can do so in the same round trip.
    /// The core decides from them alone whether the contender holds at once
    /// and, if not, which entry it waits on.
    ///
    /// For an entry of [`EntryKind::Dlm`], a window of the queue: when not 0,
    /// [`Appended::queue`] may hold only this many of the entries nearest
    /// before the new one (of any kind), the new one and those after it, in
    /// creation order, where the backend can read fewer in the same round
    /// trip. A window holds exactly this many entries before the new one,
    /// or all of them when there are fewer: it passes over entries it
    /// leaves out as expired. A backend may always return the whole queue
    /// instead (more entries before the new one than this can only be the
    /// whole queue). The core decides to wait from a window alone (on the
    /// nearest entry that blocks it) and reads the whole queue before a
    /// grant.
    pub nearest: usize,
}

impl<'a> AppendRequest<'a> {
    /// The request as a backend that reads no window of a lock-mode queue
    /// takes it: for an entry of [`EntryKind::Dlm`], `nearest` 0 (the
    /// window is a license to read less, never an ask for the nearest
    /// entries of another recipe); any other request unchanged.
    pub fn without_window(&self) -> AppendRequest<'a> {
        match self.kind {
            EntryKind::Dlm => AppendRequest { nearest: 0, ..*self },
            _ => *self,
        }
    }
}

/// Which new values of an entry a
/// [`watch_value_until`](BackendSession::watch_value_until) returns.
pub type Wanted = dyn for<'v> Fn(&'v [u8]) -> bool + Send + Sync;

/// [`BackendSession::watch_value_until`] over
/// [`watch_value`](BackendSession::watch_value), watched anew after each
/// value `wanted` refuses: the trait's default, for a backend whose
/// override keeps one watch for some entries only.
///
/// # Cancel safety
///
/// Cancelling drops the watch.
pub async fn watch_value_anew<S: BackendSession + ?Sized>(
    session: &S,
    entry: &Entry,
    seen: &[u8],
    wanted: &Wanted,
) -> Result<Option<Vec<u8>>> {
    let mut seen = seen.to_vec();
    loop {
        match session.watch_value(entry, &seen).await? {
            None => return Ok(None),
            Some(value) if wanted(&value) => return Ok(Some(value)),
            Some(value) => seen = value,
        }
    }
}

/// The result of an append.
#[derive(Debug, Clone)]
pub struct Appended {
    /// The new entry.
    pub entry: Entry,
    /// The nearest earlier entries matching the request's conflicts, nearest
    /// first, at most `nearest` of them, as [`BackendSession::earlier`] would
    /// return them; `None` when the backend could not read them with the append
    /// (the core then calls `earlier`).
    pub nearest: Option<Vec<Entry>>,
    /// For an entry of [`EntryKind::Dlm`], the whole queue as
    /// [`BackendSession::read_queue`] would return it, or the window of it
    /// that [`AppendRequest::nearest`] allows, read in the append's own
    /// round trip, the new entry in it; `None` when the backend could not
    /// read it with the append (the core then calls `read_queue`).
    pub queue: Option<Queue>,
}

/// The entries created before a given one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Earlier {
    /// The given entry itself no longer exists.
    Gone,
    /// The nearest earlier entries, nearest first (at most the count asked for).
    Entries(Vec<Entry>),
}

/// One entry of a lock-mode queue as read with its value (see [`Queue`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The entry.
    pub entry: Entry,
    /// The entry's current value.
    pub value: Vec<u8>,
    /// The entry's version as [`QueueUpdate::unchanged`] compares it: it
    /// changes whenever the entry is written (etcd: its mod revision;
    /// ZooKeeper: its data version). Opaque to the core.
    pub version: i64,
    /// When the entry was last written, in the server's order of writes to
    /// this lock: a number the core compares with the token an update
    /// returns (etcd: the mod revision; ZooKeeper: the `mzxid`).
    pub changed: u64,
}

/// A lock-mode resource as one read sees it: its entries in creation order,
/// with their values, and its lock value block.
///
/// A [`Resource`](crate::Resource) decides from this alone who holds what:
/// each entry's value says its mode, whether it is granted and whether it
/// converts. The backend stores entries of [`EntryKind::Dlm`] and the block,
/// and applies [`QueueUpdate`]s atomically; it reads none of the values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Queue {
    /// Every entry under the name, first-created first, foreign and other
    /// recipes' entries included (with an empty value), as
    /// [`BackendSession::list`] gives them.
    pub slots: Vec<Slot>,
    /// The resource's lock value block as last written, or `None` when it was
    /// never written.
    pub block: Option<Vec<u8>>,
}

/// The first bytes of the value of every lock-mode request that asks for
/// EX and was never granted (see
/// [`BackendSession::read_queue_woken`]): a backend may end a prefix of a
/// queue at the first entry whose value begins with them.
pub const WAITING_EX: &[u8] = b"dlm2 - EX ";

/// Whether a lock-mode entry whose value is `value` can be changed so that
/// a waiter watching it (see [`BackendSession::watch_blocker_until`]) is
/// let on only by its owner: by the owner's own writes, the entry's removal
/// or the end of the owner's session, never by a write of another session.
///
/// True for a request never granted and for a lock held in the mode it
/// asked for. Other sessions write such an entry only to grant it the mode
/// it asked for (a hand-over) or to mark it with a waiter's mode, and
/// neither changes whom it blocks: a waiting request already blocks every
/// later request as if it held its mode. False for a value lockline did not
/// write, and for a conversion under way, whose grant does change whom it
/// blocks (a CW holder converting to PR blocks a PR request behind it until
/// then): today only its owner grants a conversion, but a rule that let a
/// release grant it in its own write would make that another session's
/// write, and listening behind a conversion costs little. So a backend
/// whose watch hears writes of other sessions on a channel of their own
/// (PostgreSQL's notices), or by a wake of their own (MariaDB's watch
/// slots), need not hear them while the value seen is such a value, until
/// a change it hears from the owner makes it one that is not; and a
/// backend whose every watcher of an entry shares one channel (Redis) need
/// not say on it another session's grant of a waiting request in the mode
/// it asked for, when nothing else listens there for that write.
pub fn only_owner_unblocks(value: &[u8]) -> bool {
    crate::mode_rule::state_settled_or_waiting(value)
}

/// An atomic, conditional change of a lock-mode resource: all of it, or
/// nothing when a condition fails.
#[derive(Debug, Clone, Copy)]
pub struct QueueUpdate<'a> {
    /// The resource's name (its directory).
    pub dir: &'a str,
    /// Entries that must still exist, each at the version a read gave it.
    /// Every entry in `set` is also here, and every entry in `delete` here
    /// or in `present`.
    pub unchanged: &'a [(&'a Entry, i64)],
    /// Entries that must still exist, at whatever version (a holder's
    /// release, which others' marks on its entry must not hold up).
    pub present: &'a [&'a Entry],
    /// New values for entries (of any session: a waiter marks the holder it
    /// waits on). The entry keeps its owner and its session binding.
    pub set: &'a [(&'a Entry, &'a [u8])],
    /// Entries to delete.
    pub delete: &'a [&'a Entry],
    /// A new lock value block, written unconditionally when the other
    /// conditions hold.
    pub block: Option<&'a [u8]>,
}

/// How an entry a contender waited on went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Departure {
    /// Its owner released it (or the backend cannot tell).
    Released,
    /// It was lost with its owner's session (expired, cut off, its process
    /// dead): seen gone at `noticed`.
    Lost {
        /// When this client saw it go (the server removed it at that time or
        /// a little before).
        noticed: tokio::time::Instant,
    },
}

/// A backend: opens sessions against one cluster.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// The backend's name, used in errors and logs (`etcd`, `zookeeper`, `memory`).
    fn name(&self) -> &'static str;

    /// Where the backend connects, for messages: the endpoints, the connect
    /// string, never a credential. The default says nothing.
    fn describe(&self) -> String {
        String::new()
    }

    /// Refuses names this backend cannot store beyond the core's own checks.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when the name cannot be stored.
    fn validate_name(&self, name: &str) -> Result<()> {
        let _ = name;
        Ok(())
    }

    /// The lock `name` as this backend stores it: two names stored alike
    /// are one lock (ZooKeeper takes `x` and `/x` for the one path `/x`).
    /// Multi-locks order and compare their names by it, so that two of
    /// them with overlapping names take those in one order and never
    /// deadlock. The default: the name itself.
    fn stored_name<'n>(&self, name: &'n str) -> std::borrow::Cow<'n, str> {
        std::borrow::Cow::Borrowed(name)
    }

    /// Refuses keys this backend cannot store, for fenced writes and reads
    /// (the core has already refused the empty key). The default accepts
    /// every key.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] naming the key.
    fn validate_key(&self, key: &str) -> Result<()> {
        let _ = key;
        Ok(())
    }

    /// Refuses keys a fenced write must not create though they can be read:
    /// keys with the shape of a lock entry in this backend's layout, which
    /// would stand in that lock's queue as a holder nobody releases. Called
    /// after [`validate_key`](Self::validate_key). The default accepts every
    /// key.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] naming the key.
    fn validate_write_key(&self, key: &str) -> Result<()> {
        let _ = key;
        Ok(())
    }

    /// Opens a session: an etcd lease with its keepalive, a ZooKeeper session.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the call leaves no session behind that would keep itself alive.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when the cluster cannot
    /// be reached within the options' connect timeout.
    async fn open_session(&self, options: &SessionOptions) -> Result<Arc<dyn BackendSession>>;
}

/// A live session and the queue primitives (see the module docs).
///
/// `Any` is a supertrait so that a backend's own helpers can downcast
/// [`Session::backend_session`](crate::Session::backend_session) to their type.
///
/// Every method that takes an [`Entry`] applies to that very entry: a newer
/// entry under the same key (a later acquire by the same session) is another
/// entry, told apart by its `order`/`token`.
#[async_trait]
pub trait BackendSession: std::any::Any + Send + Sync + fmt::Debug + 'static {
    /// The session's id (etcd lease id in lowercase hex, ZooKeeper session id in hex).
    fn id(&self) -> &str;

    /// The session's state, kept current by the backend.
    fn state(&self) -> watch::Receiver<SessionState>;

    /// Appends an entry under `request.dir` owned by this session, and reads the
    /// nearest earlier conflicting entries.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the entry may or may not exist; [`abandon`](Self::abandon)
    /// with the same attempt removes it.
    async fn append(&self, request: &AppendRequest<'_>) -> Result<Appended>;

    /// The entries created before `entry` whose kind `conflicts` includes,
    /// nearest first, at most `count` of them; or [`Earlier::Gone`] when `entry`
    /// itself no longer exists. One read.
    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier>;

    /// Every entry under `dir`, first-created first (foreign clients' included).
    async fn list(&self, dir: &str) -> Result<Vec<Entry>>;

    /// Resolves once `dir` holds at least one entry (at once if it does). Used
    /// by election observers while nobody leads; lock waiters never call it.
    ///
    /// # Cancel safety
    ///
    /// Cancelling drops the watch.
    async fn wait_for_entry(&self, dir: &str) -> Result<()>;

    /// Resolves once `entry` no longer exists (at once if it is already gone).
    /// Never polls: one server-side watch.
    ///
    /// # Cancel safety
    ///
    /// Cancelling drops the watch.
    async fn wait_gone(&self, entry: &Entry) -> Result<()>;

    /// Deletes `entry` if it still exists and is still the same entry (fenced on
    /// its creation order and owner). Returns whether it deleted it.
    async fn remove(&self, entry: &Entry) -> Result<bool>;

    /// Deletes the entry that the append with this `attempt` created, if any.
    async fn abandon(&self, dir: &str, kind: EntryKind, attempt: &str) -> Result<()>;

    /// Replaces `entry`'s value, only if it is still the same entry.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] when the entry is gone.
    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<()>;

    /// `entry`'s current value, or `None` when it is gone.
    async fn get_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>>;

    /// Waits until `entry`'s value differs from `seen` (returns the new value) or
    /// the entry is gone (returns `None`).
    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>>;

    /// As [`watch_value`](Self::watch_value), but a new value for which
    /// `wanted` is false is watched past (it becomes the value seen): a
    /// lock-mode waiter is woken only by the changes that let it on. The
    /// default calls `watch_value` again after each such value; a backend
    /// whose watch outlives one change overrides it to keep one watch.
    ///
    /// # Cancel safety
    ///
    /// Cancelling drops the watch.
    async fn watch_value_until(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        watch_value_anew(self, entry, seen, wanted).await
    }

    /// As [`watch_value_until`](Self::watch_value_until), for a lock-mode
    /// waiter watching the entry that blocks it: `wanted` takes a value only
    /// when the entry no longer blocks the waiter (it depends on whom the
    /// entry blocks, nothing else). A backend may then leave unheard the
    /// writes of other sessions while the value seen is one
    /// [`only_owner_unblocks`] accepts, since none of them can change that:
    /// it must still answer the owner's writes, the entry's removal and the
    /// end of the owner's session. The default calls `watch_value_until`.
    ///
    /// # Cancel safety
    ///
    /// Cancelling drops the watch.
    async fn watch_blocker_until(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        self.watch_value_until(entry, seen, wanted).await
    }

    /// Applies `writes` to keys of the store, atomically and only if `entry`
    /// still exists and is still the same entry (the fence): all of them, or
    /// none. Returns `Ok(false)`, having written nothing, when the entry is
    /// gone (the core then tells a lost session from a deleted entry).
    ///
    /// Puts create persistent keys (not bound to the session). Deleting a
    /// missing key is no error. The core has checked each key with
    /// [`Backend::validate_key`] and that no key appears twice; a backend
    /// refuses keys under `entry`'s own lock with
    /// [`Error::InvalidName`].
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the writes may or may not have been applied, all or none.
    ///
    /// # Errors
    ///
    /// The default returns [`Error::Unsupported`], so backends written before
    /// this method existed keep compiling.
    async fn write_if_held(&self, entry: &Entry, writes: &[Write]) -> Result<bool> {
        let _ = (entry, writes);
        Err(Error::Unsupported {
            backend: "this",
            operation: "fenced writes",
        })
    }

    /// The value of `key` in the store (a key written by
    /// [`write_if_held`](Self::write_if_held), or any other), or `None` when
    /// it does not exist. One read.
    ///
    /// # Errors
    ///
    /// The default returns [`Error::Unsupported`].
    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let _ = key;
        Err(Error::Unsupported {
            backend: "this",
            operation: "reads",
        })
    }

    /// How `gone` went away: an entry this session waited on with
    /// [`wait_gone`](Self::wait_gone) and then found gone (also when that
    /// wait was cut short by an error and the next read no longer showed the
    /// entry: the backend may then have seen nothing of how it went, and
    /// answers from what it has). Asked by an
    /// acquire with a lock-delay before it is granted after that wait, so
    /// the answer must come from what the wait and the read after it
    /// already saw (no request of its own: nothing new on the handoff path,
    /// DESIGN §6.17). The default says [`Departure::Released`].
    fn departure(&self, gone: &Entry) -> Departure {
        let _ = gone;
        Departure::Released
    }

    /// No grant on this session before this instant: a backend whose server
    /// restarted recently may still have holders from before the restart
    /// that have not heard `lost()` yet (a restart grace). Asked when an
    /// acquire finds nothing before it, with no request of its own; the
    /// acquire then holds back until then, as for a lock-delay (and shows it
    /// the same way in `contenders()`). The default says `None`.
    fn grant_not_before(&self) -> Option<tokio::time::Instant> {
        None
    }

    /// Whether this session's own earlier removal of `entry` is what removed
    /// it. Asked only on a release's retry path: a removal was cut off in
    /// transit, a later try found the entry gone, and the server still
    /// confirms the session, so either the cut-off try removed it (its answer
    /// lost) or another client deleted it during the fault. `Some(true)`: a
    /// removal of this session did (a release); `Some(false)`: it did not (the
    /// lock was lost to someone else's delete); `None`: the backend cannot
    /// tell, and the core counts it as a release, as Go's, Curator's and
    /// kazoo's unlocks do for a key already gone. Never asked on the handoff
    /// path, so it may make requests of its own. The default says `None`.
    ///
    /// # Cancel safety
    ///
    /// Only reads; cancelling it leaves nothing behind.
    async fn removed_by_me(&self, entry: &Entry) -> Result<Option<bool>> {
        let _ = entry;
        Ok(None)
    }

    /// Reads a lock-mode resource: every entry under `dir` with its value and
    /// version, and the lock value block, in one consistent read.
    ///
    /// # Cancel safety
    ///
    /// Only reads; cancelling it leaves nothing behind.
    ///
    /// # Errors
    ///
    /// The default returns [`Error::Unsupported`].
    async fn read_queue(&self, dir: &str) -> Result<Queue> {
        let _ = dir;
        Err(Error::Unsupported {
            backend: "this",
            operation: "lock modes",
        })
    }

    /// Reads a lock-mode resource for a waiter whose wait on one of its
    /// entries just ended: as [`read_queue`](Self::read_queue) (`true`:
    /// the whole queue), or, where the backend already holds a read made
    /// after the change that ended the wait (what a hand-over's message
    /// carried), only a *prefix* of it (`false`): every entry from the
    /// first through the first one whose value begins with
    /// [`WAITING_EX`] (or through the last, if none does), with the block.
    ///
    /// Such a request blocks every request behind it, and none behind it
    /// is granted in a mode other than NL while it waits, so the prefix
    /// holds every granted entry but NL holders, and everything the
    /// entries in it wait on. A waiter decides from a prefix only that it
    /// was handed the lock, or which entry it waits on; anything else it
    /// decides from a whole read.
    ///
    /// # Cancel safety
    ///
    /// Only reads; cancelling it leaves nothing behind.
    ///
    /// # Errors
    ///
    /// As [`read_queue`](Self::read_queue).
    async fn read_queue_woken(&self, dir: &str) -> Result<(Queue, bool)> {
        Ok((self.read_queue(dir).await?, true))
    }

    /// Applies `update` atomically if every entry in `update.unchanged` still
    /// exists at its version and every entry in `update.present` still
    /// exists. Returns `Some(token)`: a number above every
    /// [`Slot::changed`] and every token this resource gave before (the
    /// write's place in the server's order: etcd's revision, ZooKeeper's
    /// zxid, a counter), which is also the new `changed` of every entry it
    /// set; or `None`, having written nothing, when a condition failed.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the update may or may not have been applied, all or none.
    ///
    /// # Errors
    ///
    /// The default returns [`Error::Unsupported`].
    async fn update_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let _ = update;
        Err(Error::Unsupported {
            backend: "this",
            operation: "lock modes",
        })
    }

    /// Asks the server now whether the session still lives (etcd: the lease's
    /// remaining TTL), updates [`state`](Self::state) and returns it. Called when
    /// one of the session's own entries vanished, to tell an expired session
    /// from an entry deleted by someone else. The default returns the current
    /// state.
    async fn confirm(&self) -> Result<SessionState> {
        Ok(*self.state().borrow())
    }

    /// Ends the session on the server: every entry it owns is deleted.
    async fn close(&self) -> Result<()>;

    /// Declares the session [`Lost`](SessionState::Lost) and ends it on the
    /// server by the one means that needs no permission, because the server
    /// refused to delete something the session left there and it would
    /// otherwise block a lock's queue for as long as the session lives
    /// (etcd: stop renewing, so the lease expires within its TTL; ZooKeeper:
    /// close the session, which deletes its ephemeral nodes whatever their
    /// ACLs). The default does nothing (a backend whose removals are never
    /// refused).
    fn give_up(&self, why: &str) {
        let _ = why;
    }
}

/// Moves the state a backend publishes to `next` if
/// [`SessionState::may_become`] allows it. Returns whether it changed.
pub fn advance(state: &watch::Sender<SessionState>, next: SessionState) -> bool {
    state.send_if_modified(|current| {
        let allowed = current.may_become(next);
        if allowed {
            *current = next;
        }
        allowed
    })
}
