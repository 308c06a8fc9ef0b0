//! What each database engine must do; the session is written once over it.

use std::fmt;

use async_trait::async_trait;
use lockline::Write;
use sqlx::query::Query;

use crate::error::Doing;

/// A result of a dialect's statement: the driver's error, mapped by the
/// session with what it was doing.
pub(crate) type DbResult<T> = std::result::Result<T, sqlx::Error>;

/// An earlier entry as the statements return it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) id: i64,
    pub(crate) kind: String,
    pub(crate) session: String,
}

/// What to append.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Append<'a> {
    pub(crate) name: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) session: &'a str,
    pub(crate) attempt: &'a str,
    pub(crate) value: &'a [u8],
    /// Read locks pass over shared entries.
    pub(crate) skip_shared: bool,
    pub(crate) count: i32,
}

impl Append<'_> {
    /// `query` with the append bound, in the order both engines' append
    /// takes it: name, kind, session, attempt, value, read locks or not,
    /// how many earlier entries.
    pub(crate) fn bind<'q, DB>(&self, query: Query<'q, DB, DB::Arguments>) -> Query<'q, DB, DB::Arguments>
    where
        DB: sqlx::Database,
        for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> &'t [u8]: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> bool: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> i32: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    {
        query
            .bind(self.name)
            .bind(self.kind)
            .bind(self.session)
            .bind(self.attempt)
            .bind(self.value)
            .bind(self.skip_shared)
            .bind(self.count)
    }
}

/// An owner's heartbeat as a waiter reads it: the counter each of its
/// renewals raises, and its TTL. Staleness is judged on the waiter's own
/// monotonic clock — a count that has not moved for the TTL while it
/// watched — never by comparing readings of the database's wall clock
/// (DESIGN §6.19).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Beat {
    pub(crate) count: i64,
    pub(crate) ttl_ms: i64,
}

impl Beat {
    /// A heartbeat read beside a status or a wait: `None` when its columns
    /// are NULL (the owner's session row is gone).
    pub(crate) fn of(count: Option<i64>, ttl_ms: Option<i64>) -> Option<Beat> {
        Some(Beat {
            count: count?,
            ttl_ms: ttl_ms?,
        })
    }
}

/// How one wait on a guard ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The guard was free (at once, or when its owner let go), and the
    /// entry's row gone: its owner released it.
    Released,
    /// The guard was free with the entry's row still there: its owner's
    /// connection ended (a crash, a reset, a kill).
    Lost,
    /// The wait ran to its bound: the owner's heartbeat as read when it
    /// did (`None`: the owner's session row is gone).
    TimedOut(Option<Beat>),
    /// The wait was ended by a `KILL QUERY` this session did not send
    /// (MariaDB/MySQL: a writer waking an entry's watchers, or such a wake
    /// meant for the connection's previous wait): ask again.
    Interrupted,
}

/// What a waiter reads once the entry it waits on is gone: whether its own
/// entry `id` is still there, and the nearest earlier live entries before
/// it. Asked of [`Entries::earlier`], and of [`Waits::wait_turn`], which
/// reads it in the wait's own statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Turn {
    /// The waiter's own entry.
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) session: String,
    /// Read locks pass over shared entries.
    pub(crate) skip_shared: bool,
    pub(crate) count: i32,
}

impl Turn {
    /// `query` with the turn bound, in the order both of PostgreSQL's
    /// functions that read it take it: the waiter's entry, the lock's
    /// name, the session, read locks or not, how many earlier entries.
    #[cfg(feature = "postgres")]
    pub(crate) fn bind<'q, DB>(&self, query: Query<'q, DB, DB::Arguments>) -> Query<'q, DB, DB::Arguments>
    where
        DB: sqlx::Database,
        for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> bool: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> i32: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    {
        query
            .bind(self.id)
            .bind(self.name.as_str())
            .bind(self.session.as_str())
            .bind(self.skip_shared)
            .bind(self.count)
    }
}

/// What [`Waits::wait_turn`] read after the wait: as
/// [`Entries::earlier`] answers (`None`: the waiter's own entry is gone).
pub(crate) type TurnRead = Option<Vec<Row>>;

/// An entry of a lock-mode queue as [`LockModes::read_queue`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueRow {
    pub(crate) row: Row,
    /// Its value (empty for entries of other kinds).
    pub(crate) value: Vec<u8>,
    /// Raised by one on every write of the value.
    pub(crate) version: i64,
    /// The token of its last write by [`LockModes::update_queue`], or its id
    /// when none wrote it yet.
    pub(crate) changed: i64,
    /// Raised by its owner's own writes only: the value lock its owner
    /// holds is this epoch's (see [`Watched`]).
    pub(crate) epoch: i64,
}

/// A lock-mode entry as a watcher reads it: its value, its version (raised
/// by every write), and its epoch (raised by its owner's own writes only:
/// the value lock its owner holds is that epoch's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watched<V = Vec<u8>> {
    pub(crate) value: V,
    pub(crate) version: i64,
    pub(crate) epoch: i64,
}

/// What a [`QueueChange`] asks of an entry it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Condition {
    /// Nothing: it is only written (and passed over if gone).
    None,
    /// That it is live, at any version.
    Present,
    /// That it is live at this version.
    Version(i64),
}

impl Condition {
    /// As the function or procedure takes it: -1 none, -2 present, else
    /// the version (never negative).
    pub(crate) fn code(self) -> i64 {
        match self {
            Condition::None => -1,
            Condition::Present => -2,
            Condition::Version(version) => version.max(0),
        }
    }

    /// Both conditions at once.
    fn and(self, other: Condition) -> Condition {
        match (self, other) {
            (Condition::None, c) | (c, Condition::None) => c,
            (Condition::Present, c) | (c, Condition::Present) => c,
            (Condition::Version(a), Condition::Version(b)) if a == b => Condition::Version(a),
            // Two versions at once: no entry is at a version this high.
            (Condition::Version(_), Condition::Version(_)) => Condition::Version(i64::MAX),
        }
    }
}

/// A lock-mode entry as read for a watcher: its value, version and epoch,
/// and whether it is live; `None` when its row is gone.
pub(crate) type Found = Option<(Watched, bool)>;

/// A lock-mode queue as [`LockModes::read_queue`] reads it: its live
/// entries, first first, and its lock value block.
pub(crate) type QueueRead = (Vec<QueueRow>, Option<Vec<u8>>);

/// A watcher's wait on a lock-mode entry (see [`LockModes::wait_watch`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watch<'a> {
    /// The entry.
    pub(crate) id: i64,
    /// Its version and epoch as the watcher last read them.
    pub(crate) at: Watched<()>,
    /// The watcher's session.
    pub(crate) session: &'a str,
    /// The entry owner's session.
    pub(crate) owner: &'a str,
    /// How long the wait may last at most.
    pub(crate) bound_ms: i64,
}

impl Watch<'_> {
    /// `query` with the wait bound, in the order both engines' watch takes
    /// it: the entry, its epoch and version, the watcher's session, the
    /// owner's, the bound.
    pub(crate) fn bind<'q, DB>(&self, query: Query<'q, DB, DB::Arguments>) -> Query<'q, DB, DB::Arguments>
    where
        DB: sqlx::Database,
        for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    {
        query
            .bind(self.id)
            .bind(self.at.epoch)
            .bind(self.at.version)
            .bind(self.session)
            .bind(self.owner)
            .bind(self.bound_ms)
    }
}

impl Watched {
    /// A lock-mode entry as a statement answers it: its value, version and
    /// epoch in three columns from `first` on.
    pub(crate) fn read(row: &impl Columns, first: usize) -> DbResult<Watched> {
        let (value, version, epoch) = (row.bytes(first)?, row.int(first + 1)?, row.int(first + 2)?);
        Ok(Watched { value, version, epoch })
    }

    /// A lock-mode entry as a watch's wait read it after waking, if it
    /// did (`read`), from column `first` on: `Some(None)` when its row is
    /// gone (its value NULL), else its value, version and epoch (NULL read
    /// as 0), and whether it is live, as `live` reads it.
    pub(crate) fn read_woken<R: Columns>(
        row: &R,
        read: bool,
        first: usize,
        live: impl FnOnce(&R) -> DbResult<bool>,
    ) -> DbResult<Option<Found>> {
        if !read {
            return Ok(None);
        }
        let Some(value) = row.bytes_or_null(first)? else {
            return Ok(Some(None));
        };
        let watched = Watched {
            value,
            version: row.int_or_null(first + 1)?.unwrap_or_default(),
            epoch: row.int_or_null(first + 2)?.unwrap_or_default(),
        };
        Ok(Some(Some((watched, live(row)?))))
    }
}

/// One entry an [`QueueChange`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Named {
    pub(crate) id: i64,
    pub(crate) condition: Condition,
    /// Whether the change sets or deletes it (an exclusive row lock).
    pub(crate) writes: bool,
}

/// An atomic, conditional change of one lock-mode queue.
#[derive(Debug, Clone)]
pub(crate) struct QueueChange<'a> {
    pub(crate) name: &'a str,
    pub(crate) session: &'a str,
    /// Every entry named, once each, by ascending id: the order its row
    /// locks are taken in.
    pub(crate) named: Vec<Named>,
    pub(crate) set: Vec<(i64, &'a [u8])>,
    pub(crate) delete: Vec<i64>,
    pub(crate) block: Option<&'a [u8]>,
}

impl<'a> QueueChange<'a> {
    /// The change, its entries named once each in id order: those that
    /// must be at a version (`unchanged`), those that must be there
    /// (`present`), those written.
    pub(crate) fn new(
        name: &'a str,
        session: &'a str,
        unchanged: &[(i64, i64)],
        present: &[i64],
        set: Vec<(i64, &'a [u8])>,
        delete: Vec<i64>,
        block: Option<&'a [u8]>,
    ) -> Self {
        let mut named: std::collections::BTreeMap<i64, Named> = std::collections::BTreeMap::new();
        let mut name_it = |id: i64, condition: Condition, writes: bool| {
            let slot = named.entry(id).or_insert(Named {
                id,
                condition: Condition::None,
                writes: false,
            });
            slot.condition = slot.condition.and(condition);
            slot.writes |= writes;
        };
        for &(id, version) in unchanged {
            name_it(id, Condition::Version(version), false);
        }
        for &id in present {
            name_it(id, Condition::Present, false);
        }
        for id in set.iter().map(|(id, _)| *id).chain(delete.iter().copied()) {
            name_it(id, Condition::None, true);
        }
        QueueChange {
            name,
            session,
            named: named.into_values().collect(),
            set,
            delete,
            block,
        }
    }
}

/// What a look at a silent owner found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reaped {
    /// The session is not in the table (closed, or reaped by someone else).
    Gone,
    /// It renewed after all.
    Renewed,
    /// Its heartbeat had not moved: its connection was ended and its rows
    /// deleted.
    Ended,
}

/// The purpose of a connection: the session's own, which holds every guard;
/// its control connection (heartbeats, cancels, looks at waits); or one of
/// its wait connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    Owner,
    Control,
    Wait,
}

/// What became of an entry a waiter waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Gone (released), or its value moved on.
    Free,
    /// Its row is there and its guard free: lost with its owner's connection.
    Dead,
    /// Held by a session, whose heartbeat is given with the status.
    Held,
}

/// What [`Waits::statuses`] says of one entry: its id, the value version
/// asked for, its status, its owner's session id and heartbeat.
pub(crate) type EntryStatus = (i64, i64, Status, String, Option<Beat>);

/// A restart grace in force when a session opened: how long (the longest
/// TTL of the run before the restart) and which one (when it began, in the
/// server's microseconds: an id, never compared with a clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grace {
    pub(crate) ms: i64,
    pub(crate) id: i64,
}

impl Grace {
    /// The grace as the meta row gives it: its length, and when it began
    /// (NULL read as 0).
    pub(crate) fn of((ms, id): (i64, Option<i64>)) -> Grace {
        Grace {
            ms,
            id: id.unwrap_or(0),
        }
    }
}

/// One engine's statements over one set of tables: every part below. The
/// session is written once over it.
pub(crate) trait Dialect: Engine + Liveness + Entries + Waits + Values + LockModes {}

impl<D: Engine + Liveness + Entries + Waits + Values + LockModes> Dialect for D {}

/// One engine's connections: opening them with lockline's settings,
/// checking the tables, and what any connection runs.
#[async_trait]
pub(crate) trait Engine: Send + Sync + fmt::Debug + 'static {
    /// A connection of this engine.
    type Conn: Send + 'static;

    /// The backend's name in errors (`postgres`, `mysql`).
    fn backend(&self) -> &'static str;

    /// What a step of this engine on `target` was doing, for its errors.
    fn doing<'a>(&self, what: &'a str, target: &'a str) -> Doing<'a> {
        Doing {
            backend: self.backend(),
            what,
            target,
        }
    }

    /// Opens a connection with lockline's per-connection settings. Returns
    /// it and its server-side id (PostgreSQL backend pid, MySQL connection id).
    async fn connect(&self, purpose: Purpose) -> DbResult<(Self::Conn, i64)>;

    /// Checks the tables (creating them when missing and allowed), and
    /// moves the id counter past anything handed out before a server restart.
    async fn prepare(&self, conn: &mut Self::Conn) -> std::result::Result<(), lockline::Error>;

    /// A statement that does nothing: whether the connection still works.
    async fn ping(&self, conn: &mut Self::Conn) -> DbResult<()>;

    /// Ends the statement running on connection `server_id` (a wait).
    async fn cancel(&self, conn: &mut Self::Conn, server_id: i64) -> DbResult<()>;

    /// Lets go of anything a cancelled wait may have left held.
    async fn reset(&self, conn: &mut Self::Conn) -> DbResult<()>;
}

/// A session's life on the server: its row and heartbeat, its end, and the
/// end of another session that went silent.
#[async_trait]
pub(crate) trait Liveness: Engine {
    /// Registers a session owned by this connection. Returns the restart
    /// grace in force, if any: after a server restart (or a promotion), the
    /// longest TTL of a session opened before it, during which no grant is
    /// made (holders from before may not have heard `lost()`). It is in
    /// force until a session that waited it out by its own clock ends it
    /// ([`end_grace`](Self::end_grace)); no reading of the database's clock
    /// shortens it.
    async fn open(&self, conn: &mut Self::Conn, session: &str, ttl_ms: i64) -> DbResult<Option<Grace>>;

    /// Ends restart grace `id` (from [`open`](Self::open)), if it is still
    /// the one in force: a session waited it out.
    async fn end_grace(&self, conn: &mut Self::Conn, id: i64) -> DbResult<()>;

    /// Renews the session from its control connection (not the one that
    /// holds its guards), raising its heartbeat count; `Some(n)`: renewed,
    /// and it owns `n` entries;
    /// `None`: the session's row is gone, or its owning connection is gone
    /// on the server (checked in the same statement), or this connection is
    /// that very connection (a pooler).
    async fn heartbeat(&self, conn: &mut Self::Conn, session: &str) -> DbResult<Option<i64>>;

    /// Every session's heartbeat, with one of its entries (0 if none): for
    /// ending a silent session that holds something no waiter blocks on (a
    /// row lock of a transaction it was in when it went silent).
    async fn beats(&self, conn: &mut Self::Conn) -> DbResult<Vec<(String, Beat, i64)>>;

    /// The ids of the session's entries.
    async fn own_ids(&self, conn: &mut Self::Conn, session: &str) -> DbResult<Vec<i64>>;

    /// `owner`'s heartbeat now; `None` when its session row is gone.
    async fn beat_of(&self, conn: &mut Self::Conn, owner: &str) -> DbResult<Option<Beat>>;

    /// Ends a silent owner whose entry `id` a waiter waits on — its
    /// connection and its rows — if its heartbeat count is still `beat`
    /// (atomically: a renewal either moves the count first, or finds the
    /// session ended and loses it).
    async fn reap(&self, conn: &mut Self::Conn, owner: &str, id: i64, beat: i64) -> DbResult<Reaped>;

    /// Deletes the session's entries and its row.
    async fn close(&self, conn: &mut Self::Conn, session: &str) -> DbResult<()>;

    /// Ends a lost session from another connection: its old owning
    /// connection (`owner_server_id`) is ended if it still holds a guard of
    /// the session, then its rows are deleted. `false` when the old
    /// connection would not end in time (its rows are then left alone).
    async fn end(&self, conn: &mut Self::Conn, session: &str, owner_server_id: i64) -> DbResult<bool>;
}

/// The entries of a queue: appending, reading the nearest earlier ones,
/// removing.
#[async_trait]
pub(crate) trait Entries: Engine {
    /// Appends (or finds the earlier append of the same attempt): the new
    /// entry's id and the nearest earlier live entries.
    async fn append(&self, conn: &mut Self::Conn, append: &Append<'_>) -> DbResult<(i64, Vec<Row>)>;

    /// The nearest earlier live entries before `turn.id`, as `turn` asks
    /// them, removing dead ones on the way; `None` when `turn.id` itself is
    /// gone.
    async fn earlier(&self, conn: &mut Self::Conn, turn: &Turn) -> DbResult<Option<Vec<Row>>>;

    /// Every live entry of `name`, first first.
    async fn list(&self, conn: &mut Self::Conn, name: &str, session: &str) -> DbResult<Vec<Row>>;

    /// Deletes entry `id` if `session` owns it; lets go of its guard when
    /// `unlock` (the caller's session holds it). Whether it deleted it.
    async fn remove(&self, conn: &mut Self::Conn, id: i64, session: &str, unlock: bool) -> DbResult<bool>;

    /// Deletes the entry of `attempt` and lets go of its guard.
    async fn abandon(&self, conn: &mut Self::Conn, attempt: &str, session: &str) -> DbResult<Option<i64>>;
}

/// Waits on the server: on an entry's guard, on an election value's
/// version, and the look at waits that have no connection of their own.
#[async_trait]
pub(crate) trait Waits: Engine {
    /// What became of the entries some waiters wait on, given as (id,
    /// value version or -1): each with its [`Status`] (an entry whose row is
    /// gone, whose guard is free, or whose value moved past the version is
    /// [`Status::Free`]), its owner's session id and the owner's heartbeat.
    async fn statuses(&self, conn: &mut Self::Conn, ids: &[(i64, i64)]) -> DbResult<Vec<EntryStatus>>;

    /// Waits until the guard of entry `id` is free, for at most `bound_ms`
    /// and a third of `owner`'s TTL, whichever is less; a wait that runs to
    /// its bound answers the owner's heartbeat as read at its end.
    async fn wait(&self, conn: &mut Self::Conn, id: i64, owner: &str, bound_ms: i64) -> DbResult<Waited>;

    /// As [`wait`](Self::wait), and unless the bound ran out, in the same
    /// round trip what the waiter `turn` reads next: its own entry and the
    /// nearest earlier live entries, read after the wait (so a handoff is
    /// the releaser's statement and this one's answer, no read after it).
    /// `None` for the read when it could not be made in the same call (a
    /// dead entry's row held by a fenced commit past the bound): the
    /// waiter reads on its own.
    async fn wait_turn(
        &self,
        conn: &mut Self::Conn,
        id: i64,
        owner: &str,
        bound_ms: i64,
        turn: &Turn,
    ) -> DbResult<(Waited, Option<TurnRead>)>;

    /// As [`wait`](Self::wait), on the lock an election entry's owner holds
    /// for its value's `version`.
    async fn wait_version(
        &self,
        conn: &mut Self::Conn,
        id: i64,
        version: i64,
        owner: &str,
        bound_ms: i64,
    ) -> DbResult<Waited>;
}

/// An election entry's value, and fenced writes to the data table.
#[async_trait]
pub(crate) trait Values: Engine {
    /// Replaces an election entry's value; whether `session` still owns it.
    async fn set_value(&self, conn: &mut Self::Conn, id: i64, session: &str, value: &[u8]) -> DbResult<bool>;

    /// A live entry's value and version; `None` when gone.
    async fn get_value(&self, conn: &mut Self::Conn, id: i64, session: &str) -> DbResult<Option<(Vec<u8>, i64)>>;

    /// Applies `writes` to the data table if `session` still owns entry `id`.
    async fn write_if_held(&self, conn: &mut Self::Conn, id: i64, session: &str, writes: &[Write]) -> DbResult<bool>;

    /// A key of the data table.
    async fn read(&self, conn: &mut Self::Conn, key: &str) -> DbResult<Option<Vec<u8>>>;
}

/// Lock modes: a queue read and changed as a whole, and watchers of its
/// entries.
#[async_trait]
pub(crate) trait LockModes: Engine {
    /// Every live entry of `name`, first first, with its value, version and
    /// the token of its last write, and the name's lock value block: one
    /// statement, one snapshot.
    async fn read_queue(&self, conn: &mut Self::Conn, name: &str, session: &str) -> DbResult<QueueRead>;

    /// Applies `change` if every entry it names with a version is live at
    /// that version: its token (above every token and `changed` of the
    /// name before), or `None`, having written nothing.
    async fn update_queue(&self, conn: &mut Self::Conn, change: &QueueChange<'_>) -> DbResult<Option<i64>>;

    /// A lock-mode entry's value, version and epoch, and whether it is
    /// live as [`read_queue`](Self::read_queue) counts it (its row there
    /// with its guard free: its owner's connection ended); `None` when its
    /// row is gone. Waits for a write of it in flight to commit.
    async fn watch_read(&self, conn: &mut Self::Conn, id: i64, session: &str) -> DbResult<Found>;

    /// Waits until the lock-mode entry `watch.id` is no longer at the
    /// version `watch.at` gives: until the value lock its owner holds for
    /// that epoch is free (its
    /// owner wrote it, removed it or is gone), or (MariaDB/MySQL) a writer
    /// of another session wakes it; at once when it moved on already;
    /// bounded as [`wait`](Waits::wait). [`Waited::Lost`]: the entry is
    /// there with its guard free (its owner's connection ended). Unless
    /// the bound ran out, also the entry as the wait read it after waking
    /// (as [`watch_read`](Self::watch_read) gives it), so that the
    /// watcher need not read it again.
    async fn wait_watch(&self, conn: &mut Self::Conn, watch: &Watch<'_>) -> DbResult<(Waited, Option<Found>)>;

    /// A connection that hears of writes to lock-mode entries by sessions
    /// that do not own them (PostgreSQL: `LISTEN`); `None` when the
    /// engine wakes watchers on the server instead.
    async fn listener(&self) -> DbResult<Option<Box<dyn Listener>>> {
        Ok(None)
    }

    /// Whether [`listener`](Self::listener) gives one.
    fn notifies(&self) -> bool {
        false
    }
}

/// A write a notice carries: the entry's version after it, and the value
/// written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    /// The entry's version after the write: a watcher whose read saw this
    /// version or a later one already knows the write.
    pub(crate) version: i64,
    /// The value written.
    pub(crate) value: Vec<u8>,
}

/// A connection told of writes to entries (see [`LockModes::listener`]).
#[async_trait]
pub(crate) trait Listener: Send + fmt::Debug {
    /// Starts hearing of entry `id`; returns once the server listens.
    async fn listen(&mut self, id: i64) -> DbResult<()>;

    /// Stops hearing of entry `id`.
    async fn unlisten(&mut self, id: i64) -> DbResult<()>;

    /// The next entry written, with the write (version and value) when the
    /// notice carries it (a write rather than a removal, and not too long); `None`
    /// when the connection was lost and made again (whatever was sent
    /// meanwhile is missed).
    async fn recv(&mut self) -> DbResult<Option<(i64, Option<Written>)>>;

    /// A statement that does nothing: whether the connection still works.
    async fn ping(&mut self) -> DbResult<()>;
}

/// A row of either engine's answers, read by column position, with the
/// types lockline reads.
pub(crate) trait Columns {
    /// An integer column.
    fn int(&self, column: usize) -> DbResult<i64>;

    /// An integer column that may be NULL.
    fn int_or_null(&self, column: usize) -> DbResult<Option<i64>>;

    /// A text column.
    fn text(&self, column: usize) -> DbResult<String>;

    /// A binary column.
    fn bytes(&self, column: usize) -> DbResult<Vec<u8>>;

    /// A binary column that may be NULL.
    fn bytes_or_null(&self, column: usize) -> DbResult<Option<Vec<u8>>>;
}

impl<R> Columns for R
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn int(&self, column: usize) -> DbResult<i64> {
        self.try_get(column)
    }

    fn int_or_null(&self, column: usize) -> DbResult<Option<i64>> {
        self.try_get(column)
    }

    fn text(&self, column: usize) -> DbResult<String> {
        self.try_get(column)
    }

    fn bytes(&self, column: usize) -> DbResult<Vec<u8>> {
        self.try_get(column)
    }

    fn bytes_or_null(&self, column: usize) -> DbResult<Option<Vec<u8>>> {
        self.try_get(column)
    }
}

impl Row {
    /// An entry as a statement answers it: its id, kind and session in
    /// three columns from `first` on.
    pub(crate) fn read(row: &impl Columns, first: usize) -> DbResult<Row> {
        Ok(Row {
            id: row.int(first)?,
            kind: row.text(first + 1)?,
            session: row.text(first + 2)?,
        })
    }
}

/// A lock-mode queue as [`LockModes::read_queue`]'s statement answers it:
/// the lock value block first (its row without an id, its value in column
/// 3), then each entry (id, kind, session, value, version, changed).
pub(crate) fn queue_rows(found: &[impl Columns]) -> DbResult<QueueRead> {
    let mut block = None;
    let mut rows = Vec::with_capacity(found.len());
    for r in found {
        let id: Option<i64> = r.int_or_null(0)?;
        let Some(id) = id else {
            block = Some(r.bytes(3)?);
            continue;
        };
        rows.push(QueueRow {
            row: Row {
                id,
                kind: r.text(1)?,
                session: r.text(2)?,
            },
            value: r.bytes(3)?,
            version: r.int(4)?,
            changed: r.int(5)?,
            epoch: r.int(6)?,
        });
    }
    Ok((rows, block))
}

/// Turns a row-shape problem into the driver's decode error.
pub(crate) fn shape(detail: impl Into<String>) -> sqlx::Error {
    sqlx::Error::Decode(detail.into().into())
}
