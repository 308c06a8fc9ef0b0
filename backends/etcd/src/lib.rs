//! The etcd backend of [lockline](https://docs.rs/lockline): distributed locks
//! and leader election over an etcd cluster you already run.
//!
//! ```no_run
//! use lockline_etcd::{lockline::Client, Etcd};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockline::Result<()> {
//! let client = Client::new(Etcd::new(["http://127.0.0.1:2379"]));
//! let session = client.session().await?; // one lease, kept alive in the background
//! let guard = session.mutex("billing/nightly")?.lock().await?;
//! println!("held as {} with fencing token {}", guard.key(), guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How it uses etcd
//!
//! - **Session** = one lease (TTL from [`SessionOptions`],
//!   rounded up to whole seconds) renewed by one keepalive stream, and one watch
//!   stream that multiplexes every watch of the session; a watch stream
//!   silent for a keepalive interval is probed with a progress request on
//!   it and ended if nothing comes back within the request timeout, so a
//!   connection gone silent cannot leave a waiter deaf. Closing the session
//!   revokes the lease; dropping every handle stops the renewals, so the lease
//!   expires after its TTL.
//! - **Layout** = Go's `concurrency` package: a mutex named `n` is the prefix
//!   `n/` and a session's entry is `n/<lease id in lowercase hex>`, ordered by
//!   create revision. `etcdctl lock n`, Go's `concurrency.Mutex` and etcd's
//!   server-side lock API exclude lockline's holders and vice versa. A key is
//!   an entry of `n` only as `n/<lease hex>` or `n/{read,write,semaphore,dlm}/<lease
//!   hex>-<attempt>`: the keys of nested locks (`n/read`, `n/x`) are ignored,
//!   so lockline names may nest and contain any recipe word (Go's mutex `n`
//!   still counts every key under `n/`).
//!   A trailing `/` is kept, as in Go's examples: `/my-lock/` is the prefix
//!   `/my-lock//`, the keys of `concurrency.NewMutex(s, "/my-lock/")`.
//! - **Acquire** = one transaction: create my key if it does not exist and read
//!   the first-created key under the prefix (one round trip when uncontended).
//! - **Wait** = a watch on the key with the greatest create revision below mine,
//!   opened at the current revision, then one read to confirm that key still
//!   exists; on its DELETE, one transaction confirms my key and reads the next
//!   predecessor.
//! - **Release** = `Txn(If CreateRevision(my key) == my revision, Then Delete)`,
//!   never a bare delete, so a stale guard cannot delete a newer holder's key.
//!   Its `Then` also holds a nested transaction that puts the hand-over
//!   marker only where a session with a lock-delay flagged the lock (see
//!   Lock-delay below): without one, the release writes its delete alone.
//! - **Fencing token** = the holder key's create revision. A Go holder's
//!   matching number is the `CreateRevision` of its key (a `Get` of
//!   `m.Key()`), not `m.Header().Revision` (`etcdctl lock`'s `ETCD_LOCK_REV`),
//!   which is higher whenever the Go holder had to wait.
//! - **Loss** = a keepalive answered with TTL ≤ 0, no renewal confirmed for
//!   `ttl - safety margin` (counted from the send time of the last renewal the
//!   server answered), or the key deleted by someone else. A renewal
//!   unanswered for a keepalive interval makes the session `Suspended` first.
//!   A lost session stops renewing and revokes its lease as soon as the server
//!   answers.
//! - **Markers** = the few keys lockline writes besides a lock's entries
//!   live beside the lock, in the key range of its name but outside its
//!   prefix: `n` + NUL + `lockline/...` (a NUL byte, which no lock name
//!   contains, sorts before `/`). A role that lets a user take `n` through a
//!   prefix of its name (`locks/` for `locks/a`, or `locks/a` itself) covers
//!   them, as it covers `etcdctl lock n`; Go's `concurrency.Mutex`,
//!   `etcdctl lock n` and the server-side lock API count only keys under
//!   `n/`, so they never take a marker for a contender. Every marker is bound
//!   to the session's lease and goes with it. [`Etcd::with_marker_prefix`]
//!   puts them under one prefix of your choosing instead.
//! - **Cancellation** = an acquire cancelled with an append in flight leaves
//!   a marker `n` + NUL + `lockline/<lease hex>-<attempt>` bound to the
//!   lease; the append's transaction requires it absent, so an append that
//!   reaches the server late creates nothing.
//! - **Lock-delay** ([`SessionOptions::with_lock_delay`]) = telling a hand-over
//!   from a loss without a request of its own, paid for only where it is
//!   used. A session with a lock-delay, in the transaction of its first
//!   append to a lock, leaves a flag beside it, `n` + NUL +
//!   `lockline/lock-delay-<lease hex>` (empty, bound to its lease, kept while
//!   the session lives; one per session under a marker prefix, standing
//!   for every lock there). Every removal of a session's own entry
//!   (release, resign, a cancelled acquire) carries, in the delete's own
//!   transaction, a nested transaction: *if* some flag exists on the lock,
//!   put the session's hand-over marker for that lock, `n` + NUL +
//!   `lockline/released-<lease hex>` (empty, bound to the lease: one key per
//!   lock and session, gone with the session), so in the same revision as
//!   the delete. Without a flag, which is always the case where no session
//!   uses a lock-delay, the release writes its delete alone: one revision,
//!   no key created, as before lock-delay existed (the nested compare is a
//!   read of an empty range). `close()` writes `closing` into the markers
//!   of the flagged locks it still has entries in (one transaction per 64
//!   of them, conditioned the same way), then revokes the lease. A waiter
//!   with a lock-delay, woken by its predecessor's DELETE at revision *R*,
//!   reads the predecessor's marker as of *R* and as of *R − 1* in the
//!   transaction it sends after every wake anyway: written at *R* is a
//!   release, `closing` at *R − 1* a close; anything else (the lease expired
//!   or was revoked by someone else, the key deleted by another client) is
//!   a loss, and the grant waits for the delay. Since the waiter's flag was
//!   written with its own entry, every deletion of an entry before it
//!   comes after the flag. A predecessor gone before the waiter's watch
//!   began has its deletion's revision replayed by a watch from the
//!   waiter's last read (that race alone costs a request); history
//!   compacted away, or markers the user may not read, count as a loss. The
//!   cost, paid only by locks a lock-delayed session has queued on while it
//!   lives: one small put more in the lock-delayed session's first append
//!   to each lock, one in every release's transaction, two point reads more
//!   in a lock-delayed waiter's read after a wake, and one range: the queue
//!   ahead as of the deletion the waiter saw. An entry listed there and
//!   gone from the read went unseen after it (the holder lost while the
//!   waiter it queued behind left cleanly, both before one read): the
//!   waiter is held back, whatever either departure was (a delay at worst,
//!   never an early grant). Every release carries the nested compare. A lock-delayed waiter that appends between a holder's
//!   `close()` marking and its revoke finds no `closing` and takes the close
//!   for a loss (held back, never granted early).
//!   [`Etcd::with_release_markers`] has every removal write the marker, as
//!   before (a retried release then tells its own removal from another
//!   client's delete). A lock-delayed session whose roles may not write
//!   its flag queues without it (a warning says so, once): the releases
//!   before it write no marker for it, so it is held back after each as
//!   after a loss, never granted early.
//!
//!   Go's `concurrency.Mutex`, `etcdctl lock` and the server-side lock API
//!   write no hand-over marker, and a lockline session with another marker
//!   prefix ([`Etcd::with_marker_prefix`]) writes its own elsewhere: to a
//!   lockline waiter with a lock-delay, their releases look like losses, so
//!   the waiter is granted the delay after them rather than at once. Nothing
//!   else changes for them (the marker is outside the lock's prefix), and
//!   without a lock-delay a lockline waiter treats everyone alike.
//!
//!   One thing the placement beside each lock cannot do: a key in the range
//!   of `locks/a` is under `locks/`, so Go's or `etcdctl`'s mutex named
//!   `locks` (a *parent* of a lockline lock's name) counts the markers of
//!   `locks/a` as contenders for as long as the lockline session that wrote
//!   them lives, as it counts lockline's entries of `locks/a` while they
//!   exist. Names used with Go's or `etcdctl`'s mutex should not be parents
//!   of lockline's, or markers go under a prefix of their own
//!   ([`Etcd::with_marker_prefix`] with [`MARKER_PREFIX`]). A role on
//!   `locks/a/` alone (the lock's prefix, not its name) does not cover the
//!   markers either: nothing inside `locks/a/` can be written without Go
//!   taking it for a contender, so that role needs a marker prefix too.
//! - **Lock modes** (lockline's `Resource`: NL, CR, CW, PR, PW, EX, with
//!   conversions and a lock value block) = one entry per contender,
//!   `n/dlm/<lease hex>-<attempt>`, bound to the lease like every entry,
//!   holding the core's encoded state (mode, grant, conversion) as its
//!   value, ordered by create revision. The resource's lock value block is
//!   the key `n` + NUL + `lockline/block`, beside the lock like the markers
//!   (whatever the marker prefix: every client of the resource must find
//!   the same key), with no lease: it outlives every session, one small key
//!   per resource that ever wrote one, left in place. Reading the resource
//!   is one `Txn` of two range reads at one revision (every key under `n/`
//!   by create revision, values included, and the block); an update is one
//!   `Txn`: if each unchanged entry's modification revision is still the
//!   version read (which also pins its identity: a key created again has a
//!   later one) and each entry asked only to be present still has its
//!   create revision, then put the new values with `ignore_lease` (an entry
//!   marked by another session keeps its owner's lease and still goes with
//!   its owner's session), delete, put the block; its token is the
//!   transaction's revision, the new modification revision of every entry
//!   it wrote, above every earlier one. An update that writes nothing else
//!   puts the writer's empty tick key `n` + NUL + `lockline/touched-<lease
//!   hex>` (bound to its lease), so that its token is still a revision of
//!   its own. A removal through an update writes the hand-over marker as
//!   a release does, and with a lock-delay the read after a value watch saw
//!   an entry go reads its marker in the same `Txn` (see Lock-delay above).
//!   etcd takes at most 128 comparisons and 128 writes in one
//!   transaction (`--max-txn-ops`): an update that compares or writes more
//!   entries than that fails with the server's error. lockline refuses to
//!   queue lock modes with another recipe on one name; Go's
//!   `concurrency.Mutex` and `etcdctl lock n` count the `dlm/` entries as
//!   contenders (every key under `n/`), and a Go or `etcdctl` mutex of a
//!   parent name (`locks` for `locks/a`) counts the value block of `locks/a`
//!   as a holder that never leaves: keep such names apart.
//!
//! # Secure clusters
//!
//! TLS with a client certificate and a user whose role grants read-write on
//! `locks/` (enough: the markers of `locks/nightly` live in its range):
//!
//! ```no_run
//! use lockline_etcd::lockline::{Client, Tls};
//! use lockline_etcd::Etcd;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockline::Result<()> {
//! let tls = Tls::new()
//!     .with_ca_file("/etc/etcd/ca.pem")?
//!     .with_client_files("/etc/etcd/client.pem", "/etc/etcd/client-key.pem")?;
//! let backend = Etcd::new(["https://etcd-1:2379", "https://etcd-2:2379"])
//!     .with_tls(tls)
//!     .with_user("billing", std::env::var("ETCD_PASSWORD").unwrap_or_default());
//! let session = Client::new(backend).session().await?;
//! let guard = session.mutex("locks/nightly")?.lock().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! - **TLS** ([`Etcd::with_tls`]): rustls on aws-lc-rs (no system OpenSSL);
//!   `https://` endpoints only, and `https://` only with TLS settings.
//! - **Users** ([`Etcd::with_user`]): a token at connect time, renewed when
//!   the server says it expired. The roles need read-write on a prefix of
//!   each lock's name (`locks/` for `locks/a`; the entries are under
//!   `locks/a/`, the markers beside them), as `etcdctl lock` does, and with
//!   [`Etcd::with_marker_prefix`] on the lock's prefix and the marker
//!   prefix; read is enough for `contenders()`, `Election::leader()` and
//!   `observe()`.
//! - **Errors**: a refused operation is [`Error::PermissionDenied`] naming
//!   the operation and key, at once, never retried, with no entry left;
//!   refused credentials are [`Error::AuthenticationFailed`]; a TLS failure
//!   is [`Error::Unavailable`] whose cause says TLS, within the connect timeout.
//! - The password and the private key never appear in `Debug` output, logs or
//!   errors.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod connect;
mod error;
mod layout;
mod session;
mod watch;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lockline::backend::{Backend, BackendSession};
use lockline::{Error, Result, SessionOptions};
use tokio::sync::OnceCell;

pub use etcd_client;
pub use lockline;

use crate::connect::{shown, Clients};
use crate::error::BACKEND;
use crate::session::EtcdSession;

/// The layout decodes etcd's key-values through this (it depends on no client).
impl layout::Stored for etcd_client::KeyValue {
    fn key(&self) -> &[u8] {
        etcd_client::KeyValue::key(self)
    }
    fn create_revision(&self) -> i64 {
        etcd_client::KeyValue::create_revision(self)
    }
    fn lease(&self) -> i64 {
        etcd_client::KeyValue::lease(self)
    }
}

/// The etcd backend: hand it to [`lockline::Client::new`].
///
/// Connects lazily, on the first session, to the given endpoints (several for a
/// cluster: requests are spread over the members that are connected; one that
/// refuses connections or has no leader is avoided, but one that accepts
/// connections and never answers, such as a member behind a silent partition,
/// fails the requests sent to it with [`Error::Unavailable`] after the request
/// timeout until HTTP/2 keepalive drops it). Connect and request deadlines
/// and HTTP/2 keepalive come from each session's [`SessionOptions`]: sessions
/// whose options agree share one connection, a session with other timeouts
/// gets its own. An unreachable cluster gives [`Error::Unavailable`] within the
/// connect timeout, never a hang.
///
/// Every request asks for a member that has a leader (etcd's
/// `WithRequireLeader`): a member cut off from the rest of the cluster fails
/// requests and ends watches with "no leader" instead of serving them in
/// silence, so waiters move to a healthy member.
#[derive(Clone)]
pub struct Etcd {
    endpoints: Vec<String>,
    connect: Option<etcd_client::ConnectOptions>,
    tls: Option<lockline::Tls>,
    user: Option<User>,
    /// The marker prefix [`Etcd::with_marker_prefix`] set; `None`: markers
    /// beside each lock.
    markers: Option<String>,
    /// Whether every removal writes the hand-over marker
    /// ([`Etcd::with_release_markers`]).
    release_markers: bool,
    namespace: String,
    /// Clients by the connection settings taken from session options
    /// (`None`: the caller's own connect options or client, for every session).
    clients: Arc<Mutex<Clients>>,
}

/// A user name and password; the password never shows in `Debug`.
#[derive(Clone)]
struct User {
    name: String,
    password: String,
}

impl fmt::Debug for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Etcd")
            .field(
                "endpoints",
                &self.endpoints.iter().map(|e| shown(e)).collect::<Vec<_>>(),
            )
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("namespace", &self.namespace)
            .field("release_markers", &self.release_markers)
            .finish()
    }
}

impl Etcd {
    /// A backend for the cluster at these endpoints (`http://host:2379`).
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Etcd {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            connect: None,
            tls: None,
            user: None,
            markers: None,
            release_markers: false,
            namespace: String::new(),
            clients: Arc::default(),
        }
    }

    /// Connects over TLS (`https://` endpoints), trusting `tls`'s CA and
    /// presenting its client certificate, if any, to a server started with
    /// `--client-cert-auth`. A handshake that fails (wrong CA, no client
    /// certificate where one is required, a plain-text endpoint) is
    /// [`Error::Unavailable`] within the connect timeout, with a message that
    /// says TLS.
    ///
    /// ```no_run
    /// use lockline_etcd::{lockline::{Client, Tls}, Etcd};
    ///
    /// # fn main() -> lockline::Result<()> {
    /// let tls = Tls::new()
    ///     .with_ca_file("/etc/etcd/ca.pem")?
    ///     .with_client_files("/etc/etcd/client.pem", "/etc/etcd/client-key.pem")?;
    /// let client = Client::new(Etcd::new(["https://10.0.0.1:2379"]).with_tls(tls));
    /// # Ok(()) }
    /// ```
    pub fn with_tls(mut self, tls: lockline::Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticates as `user` with `password` (etcd's users and roles, as
    /// `etcdctl --user`): the client gets a token at connect time and gets a
    /// new one when the server says it expired. Wrong credentials are
    /// [`Error::AuthenticationFailed`] at the first session; an operation the
    /// user's roles do not allow is [`Error::PermissionDenied`], at once.
    ///
    /// The roles need read-write on a prefix of the name of every lock the
    /// user takes (`locks/` for `locks/a`, or `locks/a` itself: the entries
    /// are under `NAME/`, the markers beside it at `NAME` + NUL +
    /// `lockline/`), as `etcdctl lock` does; with
    /// [`with_marker_prefix`](Self::with_marker_prefix), on `NAME/` and on
    /// that prefix. Read on `NAME/` is enough to list contenders and read an
    /// election's leader.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(User {
            name: user.into(),
            password: password.into(),
        });
        self
    }

    /// Uses these connect options (TLS, user and password, HTTP/2 keepalive)
    /// for every session instead of lockline's defaults, which follow each
    /// session's options. Require-leader and the refresh of an expired
    /// authentication token are turned on in them.
    ///
    /// Keep HTTP/2 keepalive on in them (`with_keep_alive(interval, timeout)`
    /// and `with_keep_alive_while_idle(true)`): it is what drops a
    /// connection that a NAT or a load balancer silently forgot. Without
    /// it, a session's watch stream still proves itself alive (a progress
    /// request when it has been silent for a keepalive interval) and every
    /// request is bounded by the request timeout, but a silent connection
    /// stays in the client's rotation and fails the requests that land on
    /// it with [`Error::Unavailable`] after that timeout.
    pub fn with_connect_options(mut self, options: etcd_client::ConnectOptions) -> Self {
        self.connect = Some(options.with_require_leader(true).with_auto_token_refresh(true));
        self
    }

    /// A backend over a client you already have, for every session. Build it
    /// with `ConnectOptions::with_require_leader(true)` so that waits on a
    /// member cut off from its cluster end instead of hanging, and with
    /// HTTP/2 keepalive (see [`with_connect_options`](Self::with_connect_options)).
    /// Requests are bounded by each session's request timeout.
    pub fn from_client(client: etcd_client::Client) -> Self {
        let clients = HashMap::from([(None, Arc::new(OnceCell::new_with(Some(client))))]);
        Etcd {
            endpoints: Vec::new(),
            connect: None,
            tls: None,
            user: None,
            markers: None,
            release_markers: false,
            namespace: String::new(),
            clients: Arc::new(Mutex::new(clients)),
        }
    }

    /// Writes lockline's markers under `prefix`, for every lock, instead of
    /// beside each lock (`NAME` + NUL + `lockline/`, the default, inside any
    /// role that covers the lock's name): for a role on exactly `NAME/`, or
    /// to keep markers out of the range of a name that Go's or `etcdctl`'s
    /// mutex uses as a parent of lockline's names.
    ///
    /// The markers of abandoned acquire attempts (`PREFIX` + `<lease
    /// hex>-<attempt>`), the session's one hand-over marker (`PREFIX` +
    /// `released-<lease hex>`, written by releases for waiters with a
    /// lock-delay) and the one flag of a session with a lock-delay
    /// (`PREFIX` + `lock-delay-<lease hex>`) live under it: while any
    /// session with a lock-delay lives, every release of a lock whose
    /// markers go under the same prefix writes its marker. Sessions that share locks should place
    /// their markers alike, or their releases look like losses to each
    /// other's lock-delayed waiters.
    ///
    /// Pick a prefix under no lock's name you use with Go's or `etcdctl`'s
    /// mutex: those count every key under `NAME/` as a contender, so a marker
    /// under `locks/` keeps a Go mutex named `locks` waiting until the
    /// lockline session that left it ends (a session that released anything
    /// keeps its hand-over marker for as long as it lives). lockline's own
    /// contenders ignore markers wherever they are. [`MARKER_PREFIX`] is a
    /// namespace of its own, under no lock's prefix.
    ///
    /// Under [`with_namespace`](Self::with_namespace) the marker prefix is
    /// relative to the namespace, like every other key. A prefix under which
    /// markers have the shape of a lock's entries (its last segment `read`,
    /// `write`, `semaphore` or `dlm`, as in `locks/read/`: a marker would be a
    /// reader of the lock `locks`) is refused with
    /// [`Error::InvalidOptions`] when a session opens.
    ///
    /// ```
    /// use lockline_etcd::Etcd;
    ///
    /// let backend = Etcd::new(["https://10.0.0.1:2379"])
    ///     .with_user("billing", "s3cret")
    ///     .with_marker_prefix("locks/__lockline_abandoned__/");
    /// ```
    pub fn with_marker_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.markers = Some(prefix.into());
        self
    }

    /// Has every release (resignation, removal of a cancelled acquire's
    /// entry) write the session's hand-over marker in its own transaction,
    /// as lockline did before the marker became pay-per-use. By default a
    /// removal writes it only while a contender with a lock-delay has
    /// flagged the lock (see the crate docs on lock-delay), and is
    /// otherwise the plain fenced delete.
    ///
    /// What the marker buys besides lock-delay: a release whose first try
    /// was cut off in transit and whose retry finds the entry gone tells its
    /// own removal (its answer lost: `Ok`) from another client's delete
    /// during the fault ([`Error::LockLost`]).
    /// Without a marker nothing on the server says who deleted the key, and
    /// such a release is reported as done, as Go's `Unlock`, Curator's and
    /// kazoo's are (fencing tokens cover that window). The price is one
    /// small put in every release's transaction (about a tenth of the
    /// handoff rate in `bench_etcd`).
    ///
    /// ```
    /// use lockline_etcd::Etcd;
    ///
    /// let backend = Etcd::new(["http://10.0.0.1:2379"]).with_release_markers();
    /// ```
    pub fn with_release_markers(mut self) -> Self {
        self.release_markers = true;
        self
    }

    /// Puts every key lockline writes under `prefix`, as Go's
    /// `clientv3/namespace` does: lock `jobs/nightly` lives at
    /// `PREFIX` + `jobs/nightly/<lease>` and its markers beside it at
    /// `PREFIX` + `jobs/nightly` + NUL + `lockline/` (or at `PREFIX` + the
    /// marker prefix). Services sharing a cluster
    /// keep apart, and one role grant on the prefix covers everything a
    /// user's locks need.
    ///
    /// Lock names stay as given (`session.mutex("jobs/nightly")`); the keys
    /// lockline reports ([`MutexGuard::key`](lockline::MutexGuard::key),
    /// `contenders()`, `LOCKLINE_KEY`) are full etcd keys, prefix included,
    /// so `etcdctl` and Go clients can use them as they are. A Go client
    /// wrapped in `namespace.NewKV(client, PREFIX)` (or `etcdctl lock
    /// PREFIX` + `NAME`) queues with lockline on the same lock. The keys of
    /// fenced writes (`write_if_held`) and of `Session::read` are under the
    /// prefix too, given without it, as Go's namespaced KV takes them. The
    /// prefix is used as given; end it with `/` to keep it apart from other
    /// keys.
    ///
    /// ```
    /// use lockline_etcd::Etcd;
    ///
    /// let backend = Etcd::new(["http://10.0.0.1:2379"]).with_namespace("billing/");
    /// ```
    pub fn with_namespace(mut self, prefix: impl Into<String>) -> Self {
        self.namespace = prefix.into();
        self
    }

    /// Where sessions write markers, namespace included.
    fn markers(&self) -> layout::Markers {
        match &self.markers {
            None => layout::Markers::BesideEachLock,
            Some(prefix) => layout::Markers::Under(format!("{}{prefix}", self.namespace)),
        }
    }
}

/// A marker prefix of its own for [`Etcd::with_marker_prefix`]:
/// `__lockline_abandoned__/`, under no lock's prefix, so Go's and `etcdctl`'s
/// mutexes never count a marker as a contender, whatever the nesting of
/// names; lockline's default before markers moved beside each lock. A role
/// then needs read-write on it as well as on its locks' prefixes: every
/// append reads its abandoned-attempt marker (`<lease hex>-<attempt>`) in
/// the same transaction, every release compares the lock-delay flags
/// (`lock-delay-<lease hex>`) and, where a session with a lock-delay left
/// one, writes the session's hand-over marker (`released-<lease hex>`; see
/// the crate docs on lock-delay). A session whose roles refuse to let it
/// write a hand-over marker or a flag releases and queues without them
/// (said once in the log), and its releases look like losses to waiters
/// with a lock-delay; a lock-delayed session without its flag takes the
/// releases before its own waits for losses too, and is held back after
/// each (never granted early).
pub const MARKER_PREFIX: &str = layout::ABANDONED;

#[async_trait]
impl Backend for Etcd {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn describe(&self) -> String {
        self.endpoints.iter().map(|e| shown(e)).collect::<Vec<_>>().join(", ")
    }

    /// Refuses a fenced-write key that has the shape of a lock entry under
    /// any of its ancestors (`jobs/1f2e`, `db/read/1f2e-x`): written, it
    /// would stand in that lock's queue as a holder nobody releases, for
    /// lockline, Go's `concurrency` and `etcdctl lock` alike.
    ///
    /// Refuses as well a key where lockline's markers live (`NAME` NUL
    /// `lockline/...` beside any lock, or under the marker prefix given to
    /// [`Etcd::with_marker_prefix`]): written, it could make a loss pass for
    /// a hand-over, or an acquire for abandoned.
    fn validate_write_key(&self, key: &str) -> Result<()> {
        // The key as the server stores it: under a namespace, `cafe` is
        // `billing/cafe`, a holder's shape for the lock `billing` outside it.
        let stored = format!("{}{key}", self.namespace);
        if layout::Markers::BesideEachLock.covers(&stored) || self.markers().covers(&stored) {
            return Err(Error::InvalidName {
                name: key.to_owned(),
                reason: "the key lies where lockline keeps its markers (`NAME` + NUL + `lockline/`, or the \
                         marker prefix): written, it could forge a lock's hand-over or abandoned-attempt \
                         marker; use another key"
                    .into(),
            });
        }
        for (at, _) in stored.match_indices('/') {
            let dir = &stored[..at];
            if !dir.is_empty() && layout::is_entry(dir, stored.as_bytes()) {
                return Err(Error::InvalidName {
                    name: key.to_owned(),
                    reason: format!(
                        "the key has the shape of a holder of the lock {dir:?} (`NAME/<lease hex>`, \
                         `NAME/read|write|semaphore|dlm/<lease hex>-<attempt>`): written, it would block \
                         that lock for lockline, Go and etcdctl; use another last segment"
                    ),
                });
            }
        }
        Ok(())
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<Arc<dyn BackendSession>> {
        if self.markers.as_deref() == Some("") {
            return Err(Error::InvalidOptions {
                reason: "the marker prefix is empty; leave the default (markers beside each lock) or give a key prefix such as locks/__lockline_abandoned__/".into(),
            });
        }
        let shadowed = self
            .markers
            .clone()
            .and_then(|prefix| layout::Markers::Under(prefix).shadowed_lock());
        if let Some(lock) = shadowed {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "the marker prefix {:?} puts markers where they have the shape of entries of the lock {lock:?} \
                     (`NAME/read|write|semaphore|dlm/<lease hex>-<attempt>`); give a prefix whose last segment is \
                     not read, write, semaphore or dlm, such as locks/__lockline_abandoned__/",
                    self.markers.as_deref().unwrap_or_default()
                ),
            });
        }
        let client = self.client(options).await?;
        let markers = self.markers();
        let session: Arc<dyn BackendSession> =
            EtcdSession::open(client, options, markers, self.namespace.clone(), self.release_markers)
                .await
                .map_err(|e| error::first_request(e, self.tls.as_ref(), &self.endpoints))?;
        Ok(session)
    }
}

/// Watch events received so far by a session opened on this backend (for
/// benchmarks that count wakeups on the wire). `None` for another backend's session.
pub fn watch_events(session: &lockline::Session) -> Option<u64> {
    let remote: &dyn std::any::Any = &**session.backend_session();
    remote.downcast_ref::<EtcdSession>().map(EtcdSession::watch_events)
}
