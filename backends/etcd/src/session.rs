//! An etcd session: one lease, its keepalive, one watch stream.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use lockline::backend::{
    advance, AppendRequest, Appended, BackendSession, Conflicts, Departure, Earlier, Entry, EntryKind, Queue,
    QueueUpdate, Slot,
};
use lockline::{Error, Result, SessionOptions, SessionState, Write};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::error::{self, map, map_on, BACKEND};
use crate::layout;
use crate::watch::{Hub, Liveness, Signal, WATCH_CANCELED};

/// A lockline session on etcd.
pub(crate) struct EtcdSession {
    id: String,
    lease: i64,
    client: Client,
    state: watch::Sender<SessionState>,
    hub: Hub,
    keepalive: AbortHandle,
    /// The keys of this session's mutex and election entries (one key per
    /// name, `<name>/<lease>`, in both layouts), by the acquire attempt that
    /// writes or holds each: a mutex and an election of one name must not
    /// take the same key for one entry.
    shared_keys: std::sync::Mutex<HashMap<String, KeyClaim>>,
    /// Where this session's markers go (namespace included).
    markers: layout::Markers,
    /// With markers beside each lock: the lock directory of each entry this
    /// session appended and has not removed, by key, so that `close()` can
    /// mark the hand-over of the locks it still has entries in.
    live: std::sync::Mutex<HashMap<String, String>>,
    /// The key prefix every lock directory gets ([`Etcd::with_namespace`](crate::Etcd::with_namespace)).
    namespace: String,
    /// Entries a read of this session showed to exist, by (key, create
    /// revision), with the revision of that read: a watch on one of them that
    /// the server started at or before that revision sees every later
    /// deletion, so it needs no read of its own (see [`Seen`]).
    seen: std::sync::Mutex<Seen>,
    /// Lock-mode entries' values as this session last read or wrote them,
    /// with the revision of that read or write: a value watch the server
    /// started at or before it needs no read of its own (see [`Values`]).
    values: std::sync::Mutex<Values>,
    /// Whether this session's contenders wait with a lock-delay: only then
    /// do their waits remember how predecessors went, and their reads after
    /// a wait look at the predecessors' hand-over markers.
    lock_delay: bool,
    /// Entries this session's waits saw go, until `departure` asks how.
    gone: std::sync::Mutex<Gone>,
    /// Whether this session ever appended an entry (only then can a waiter
    /// be behind one of its entries when it closes).
    appended: AtomicBool,
    /// The server refused this session's hand-over marker (a role without
    /// write on the marker prefix): its removals go on without one.
    markers_refused: AtomicBool,
    /// Whether every removal writes the hand-over marker
    /// ([`Etcd::with_release_markers`](crate::Etcd::with_release_markers)),
    /// rather than only while a lock-delayed contender flagged the lock.
    always_mark: bool,
    /// With a lock-delay: the lock directories (the marker prefix, under
    /// one) this session's appends have flagged ([`layout::waits_delayed`]).
    /// The flags live with the lease, so each is written once; bounded
    /// (forgetting one only costs a put of it again).
    flagged: std::sync::Mutex<std::collections::HashSet<String>>,
    /// How long `close()` waits to mark its hand-over before it revokes.
    close_mark_timeout: Duration,
    /// Bounds every request of the session, whatever the connect options
    /// (a client without a request timeout of its own, a connection gone
    /// silent without HTTP/2 keepalive to notice).
    request_timeout: Duration,
}

/// Entries waited on and seen gone, by (key, create revision): how each went
/// is decided by the read that follows the wait (see
/// [`layout::released`]) and handed to [`BackendSession::departure`].
#[derive(Debug, Default)]
struct Gone(HashMap<(String, i64), Went>);

/// An entry seen gone whose hand-over marker a read looks at: its (key,
/// create revision), its lease in hex, the revision of its deletion.
type Look = ((String, i64), String, i64);

/// What a wait saw of an entry that went away.
#[derive(Debug, Clone)]
struct Went {
    /// The entry's lock directory.
    dir: String,
    /// The entry's lease, in hex (the owner of its hand-over marker).
    owner: Option<String>,
    /// The revision of its deletion, when the wait saw it.
    revision: Option<i64>,
    /// When the wait saw it go.
    noticed: Instant,
    /// How it went, once a read decided.
    decided: Option<Departure>,
}

impl Gone {
    /// At most this many are remembered.
    const LIMIT: usize = 4096;
    /// One forgotten this long after it went was never asked about.
    const FORGET: Duration = Duration::from_secs(60);
    /// A read after a wait looks at the markers of at most this many.
    const PER_READ: usize = 4;

    fn insert(&mut self, entry: &Entry, revision: Option<i64>, noticed: Instant) {
        let now = Instant::now();
        if self.0.len() >= Self::LIMIT {
            self.0
                .retain(|_, went| now.saturating_duration_since(went.noticed) < Self::FORGET);
            if self.0.len() >= Self::LIMIT {
                self.0.clear();
            }
        }
        self.0.insert(
            (entry.key.clone(), entry.order),
            Went {
                dir: layout::dir_of(entry).to_owned(),
                owner: entry.owner.clone(),
                revision,
                noticed,
                decided: None,
            },
        );
    }

    /// The undecided entries of the lock `dir` created before `order` whose
    /// markers a read can look at (the latest seen first), deciding at once
    /// those it cannot (no deletion revision or no lease seen: lost).
    fn undecided(&mut self, dir: &str, order: i64) -> Vec<Look> {
        let mut found: Vec<_> = self
            .0
            .iter_mut()
            .filter(|((_, created), went)| went.decided.is_none() && went.dir == dir && *created < order)
            .filter_map(|(id, went)| match (&went.owner, went.revision) {
                (Some(owner), Some(revision)) => Some((went.noticed, (id.clone(), owner.clone(), revision))),
                _ => {
                    went.decided = Some(Departure::Lost { noticed: went.noticed });
                    None
                }
            })
            .collect();
        found.sort_by_key(|(noticed, _)| std::cmp::Reverse(*noticed));
        found.into_iter().take(Self::PER_READ).map(|(_, id)| id).collect()
    }

    /// Takes the departure of `id` for a loss noticed now, whatever its
    /// marker said: something else ahead went unseen after it.
    fn lost_now(&mut self, id: &(String, i64)) {
        if let Some(went) = self.0.get_mut(id) {
            went.decided = Some(Departure::Lost {
                noticed: Instant::now(),
            });
        }
    }

    fn decide(&mut self, id: &(String, i64), released: bool) {
        if let Some(went) = self.0.get_mut(id) {
            went.decided = Some(if released {
                Departure::Released
            } else {
                Departure::Lost { noticed: went.noticed }
            });
        }
    }
}

/// The revisions at which reads showed entries to exist, for the watches about
/// to be opened on them: this session's own new entry and the entry it will
/// wait on. Taken by the first watch on the entry; bounded, since an acquire
/// may end without watching (granted at once, a `try_lock` that found the lock
/// taken): dropping what it holds only costs the watches a read.
#[derive(Debug, Default)]
struct Seen(HashMap<(String, i64), i64>);

impl Seen {
    /// At most this many entries are remembered.
    const LIMIT: usize = 4096;

    fn insert(&mut self, entry: &Entry, revision: Option<i64>) {
        let Some(revision) = revision else { return };
        if self.0.len() >= Self::LIMIT {
            self.0.clear();
        }
        self.0.insert((entry.key.clone(), entry.order), revision);
    }

    fn take(&mut self, entry: &Entry) -> Option<i64> {
        self.0.remove(&(entry.key.clone(), entry.order))
    }
}

/// Lock-mode entries' values as a read ([`BackendSession::read_queue`]) or a
/// write ([`BackendSession::update_queue`]) of this session saw them, by (key,
/// create revision), with that revision: a
/// [`watch_value`](BackendSession::watch_value) whose watch the server
/// started at or before that revision, waiting for a change from that very
/// value, sees every later write and the deletion as events, so it needs no
/// read of its own. Taken by the first value watch on the entry; bounded (an
/// entry read but never watched only costs a later watch its read).
#[derive(Debug, Default)]
struct Values(HashMap<(String, i64), (i64, Vec<u8>)>);

impl Values {
    /// At most this many entries are remembered.
    const LIMIT: usize = 4096;

    fn insert(&mut self, entry: &Entry, revision: i64, value: &[u8]) {
        if self.0.len() >= Self::LIMIT {
            self.0.clear();
        }
        self.0
            .insert((entry.key.clone(), entry.order), (revision, value.to_vec()));
    }

    /// The revision at which `entry` was seen, and its value then, if
    /// remembered.
    fn take(&mut self, entry: &Entry) -> Option<(i64, Vec<u8>)> {
        self.0.remove(&(entry.key.clone(), entry.order))
    }
}

/// Which acquire attempt uses a session's one key of a name.
#[derive(Debug, Clone)]
struct KeyClaim {
    attempt: String,
    kind: EntryKind,
    /// The entry's create revision, once appended.
    order: Option<i64>,
}

impl fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSession")
            .field("lease", &self.id)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl Drop for EtcdSession {
    /// Every handle is gone: stop renewing; the lease expires after its TTL,
    /// as a crashed process's would. `close()` revokes it at once.
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

impl EtcdSession {
    pub(crate) async fn open(
        client: Client,
        options: &SessionOptions,
        markers: layout::Markers,
        namespace: String,
        always_mark: bool,
    ) -> Result<Arc<Self>> {
        // etcd counts lease TTLs in whole seconds: round up.
        let ttl = i64::try_from(options.ttl().as_millis().div_ceil(1000)).unwrap_or(i64::MAX);
        let granted_at = Instant::now();
        let grant = client.lease_client().grant(ttl, None).await.map_err(|e| map(e, None))?;
        let lease = grant.id();
        let id = format!("{lease:x}");
        let state = watch::Sender::new(SessionState::Live);
        let keepalive = tokio::spawn(keep_alive(
            client.clone(),
            lease,
            options.clone(),
            granted_at,
            state.clone(),
        ))
        .abort_handle();
        let hub = Hub::start(
            client.watch_client(),
            Liveness {
                probe_after: options.keepalive_interval(),
                answer_within: options.request_timeout(),
            },
        );
        tracing::debug!(lease = %id, ttl, "etcd session opened");
        Ok(Arc::new(EtcdSession {
            id,
            lease,
            client,
            state,
            hub,
            keepalive,
            shared_keys: std::sync::Mutex::default(),
            markers,
            live: std::sync::Mutex::default(),
            namespace,
            seen: std::sync::Mutex::default(),
            values: std::sync::Mutex::default(),
            lock_delay: !options.lock_delay().is_zero(),
            gone: std::sync::Mutex::default(),
            appended: AtomicBool::new(false),
            markers_refused: AtomicBool::new(false),
            always_mark,
            flagged: std::sync::Mutex::default(),
            close_mark_timeout: options.request_timeout() / 2,
            request_timeout: options.request_timeout(),
        }))
    }

    /// The lock directory `dir` under the backend's namespace.
    fn within<'a>(&self, dir: &'a str) -> std::borrow::Cow<'a, str> {
        if self.namespace.is_empty() {
            std::borrow::Cow::Borrowed(dir)
        } else {
            std::borrow::Cow::Owned(format!("{}{dir}", self.namespace))
        }
    }

    /// Watch events this session's stream has received.
    pub(crate) fn watch_events(&self) -> u64 {
        self.hub.events.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn err(&self, error: etcd_client::Error) -> Error {
        self.err_on(error, "call", "")
    }

    /// As `err`, for a request that did `operation` on `key`.
    fn err_on(&self, error: etcd_client::Error, operation: &'static str, key: &str) -> Error {
        let mapped = map_on(error, Some(&self.id), operation, key);
        if let Error::SessionLost { .. } = mapped {
            self.mark_lost("the server no longer has the lease");
        }
        mapped
    }

    fn mark_lost(&self, why: &str) {
        let changed = advance(&self.state, SessionState::Lost);
        if changed {
            tracing::warn!(lease = %self.id, why, "etcd session lost");
        }
    }

    /// Runs a transaction that does `operation` on `key` (for errors).
    async fn txn(&self, txn: Txn, operation: &'static str, key: &str) -> Result<etcd_client::TxnResponse> {
        let txn = &txn;
        self.authed(operation, key, || {
            let mut kv = self.client.kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// What a watch on `key` that the server ended means. A refusal is
    /// checked with a read first: a watch stream keeps the token it was
    /// opened with, and with JWT tokens (which carry the auth revision they
    /// were issued at) a change of users or roles makes the server refuse
    /// watches on that stream though the user may read. So: authenticate
    /// again, re-open the stream, and let a read (retried the same way) say
    /// whether the user may read `key`; if so, the wait is retried.
    async fn broken(&self, reason: String, key: &str) -> Error {
        if !reason.contains("permission denied") {
            return error::watch_broken(reason, key);
        }
        if let Err(error) = self.client.refresh_token().await {
            return self.err_on(error, "watch", key);
        }
        self.hub
            .reset("watch refused: re-opening the watch stream with a new token");
        match self
            .get(key, Some(GetOptions::new().with_keys_only().with_limit(1)), "watch")
            .await
        {
            Err(error) => error,
            Ok(_) => Error::unavailable(
                BACKEND,
                format!("{reason}; the user may read {key:?}: re-watching with a new token"),
            ),
        }
    }

    /// Reads `key` (with `options`), for errors named as `operation`.
    async fn get(
        &self,
        key: &str,
        options: Option<GetOptions>,
        operation: &'static str,
    ) -> Result<etcd_client::GetResponse> {
        self.authed(operation, key, || {
            let mut kv = self.client.kv_client();
            let (key, options) = (key.to_owned(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    /// Runs a request, and runs it again after authenticating anew when
    /// etcd refused it because the cluster's users or roles changed while it
    /// was in flight, or since the token was issued ("revision of auth store
    /// is old"), as Go's client does; a few times at most.
    async fn authed<T, F, Fut>(&self, operation: &'static str, key: &str, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let mut tries = 0;
        loop {
            let Ok(answered) = tokio::time::timeout(self.request_timeout, call()).await else {
                return Err(Error::unavailable(
                    BACKEND,
                    format!(
                        "{operation} {key:?}: no answer within the request timeout of {:?}",
                        self.request_timeout
                    ),
                ));
            };
            match answered {
                Err(etcd_client::Error::GRpcStatus(status)) if error::is_stale_auth(status.message()) && tries < 5 => {
                    tries += 1;
                    if let Err(error) = self.client.refresh_token().await {
                        return Err(self.err_on(error, operation, key));
                    }
                }
                other => return other.map_err(|e| self.err_on(e, operation, key)),
            }
        }
    }

    /// The entries of the lock `dir` in a range read under its prefix (keys
    /// of other locks nested under it are left out).
    fn entries(dir: &str, response: &etcd_client::GetResponse) -> Vec<Entry> {
        response.kvs().iter().filter_map(|kv| layout::entry(dir, kv)).collect()
    }

    /// Reserves the session's one key of a name for this attempt (mutex and
    /// election keys only: other kinds' keys carry their attempt id).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when an entry of the other kind (an election for
    /// a mutex, a mutex for an election) of this name uses the key now.
    fn claim(&self, key: &str, request: &AppendRequest<'_>) -> Result<()> {
        if !shares_key(request.kind) {
            return Ok(());
        }
        let mut claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(claim) = claims.get(key) {
            if claim.attempt != request.attempt && claim.kind != request.kind {
                return Err(Error::InvalidName {
                    // The name as the caller gave it, without the namespace.
                    name: request
                        .dir
                        .strip_prefix(self.namespace.as_str())
                        .unwrap_or(request.dir)
                        .to_owned(),
                    reason: format!(
                        "this session already has {} entry {key:?}; on etcd a mutex and an election of \
                         one name share one key per session, so they cannot be used at once",
                        article(claim.kind)
                    ),
                });
            }
        }
        if claims.get(key).is_none_or(|claim| claim.attempt != request.attempt) {
            claims.insert(
                key.to_owned(),
                KeyClaim {
                    attempt: request.attempt.to_owned(),
                    kind: request.kind,
                    order: None,
                },
            );
        }
        Ok(())
    }

    /// The create revision of an entry of this session under `key` made by
    /// another attempt of the same kind: a leftover whose removal is pending
    /// (the core's same-session queue lets a new attempt of one name and kind
    /// start only once the previous entry is gone or being removed). Another
    /// kind's entry under the key is refused by [`claim`](Self::claim).
    fn stale_entry(&self, key: &str, request: &AppendRequest<'_>) -> Option<i64> {
        let claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        claims
            .get(key)
            .filter(|claim| claim.attempt != request.attempt && claim.kind == request.kind)
            .and_then(|claim| claim.order)
    }

    /// Records the entry an attempt's claim stands for.
    fn claimed_entry(&self, attempt: &str, entry: &Entry) {
        let mut claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(claim) = claims.get_mut(&entry.key).filter(|claim| claim.attempt == attempt) {
            claim.order = Some(entry.order);
        }
    }

    /// Whether `key` is claimed by another attempt than `attempt`.
    fn claimed_by_other(&self, key: &str, attempt: &str) -> bool {
        let claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        claims.get(key).is_some_and(|claim| claim.attempt != attempt)
    }

    /// Lets go of a key whose entry is gone: the entry of this attempt, or
    /// this entry (not a newer one under the same key).
    fn release_claim(&self, key: &str, owner: Owner<'_>) {
        let mut claims = self.shared_keys.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = claims.get(key).is_some_and(|claim| match owner {
            Owner::Attempt(attempt) => claim.attempt == attempt,
            Owner::Entry(order) => claim.order == Some(order),
        });
        if mine {
            claims.remove(key);
        }
    }
}

/// How many hand-over markers one transaction of `close()` writes (etcd
/// refuses transactions of more than 128 operations by default).
const CLOSING_PER_TXN: usize = 64;

/// How many flagged locks a session with a lock-delay remembers.
const FLAGGED_LIMIT: usize = 4096;

/// How long `close()` waits for the watch hub to end its stream before it
/// revokes the lease anyway.
const HUB_CLOSE_WAIT: Duration = Duration::from_millis(250);

/// A key an append's put just created, as a read of it would show it.
struct Created<'a> {
    key: &'a str,
    revision: i64,
    lease: i64,
}

impl layout::Stored for Created<'_> {
    fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }
    fn create_revision(&self) -> i64 {
        self.revision
    }
    fn lease(&self) -> i64 {
        self.lease
    }
}

/// What a released claim must match.
#[derive(Debug, Clone, Copy)]
enum Owner<'a> {
    Attempt(&'a str),
    Entry(i64),
}

/// Kinds whose key is the same for every entry of one session and name.
fn shares_key(kind: EntryKind) -> bool {
    !matches!(
        kind,
        EntryKind::Read | EntryKind::Write | EntryKind::Semaphore | EntryKind::Dlm
    )
}

fn article(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::Election => "an election",
        _ => "a mutex",
    }
}

/// A request future on the heap. Every held lock keeps a [`wait_gone`]
/// future for as long as it is held; a request made inline there (a gRPC
/// call's future is kilobytes) would take room in each of them, even while
/// it only waits for an event.
///
/// [`wait_gone`]: BackendSession::wait_gone
fn boxed<'a, T>(
    call: impl std::future::Future<Output = T> + Send + 'a,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>> {
    Box::pin(call)
}

fn first_created(limit: usize) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(i64::try_from(limit).unwrap_or(i64::MAX))
}

/// Whether the server refused a read of a revision its history no longer has.
fn is_compacted(error: &Error) -> bool {
    matches!(error, Error::Backend { reason, .. } if reason.contains("compacted"))
}

fn get_response(response: Option<&TxnOpResponse>) -> Result<&etcd_client::GetResponse> {
    match response {
        Some(TxnOpResponse::Get(get)) => Ok(get),
        _ => Err(Error::backend(BACKEND, "unexpected transaction response shape")),
    }
}

#[async_trait]
impl BackendSession for EtcdSession {
    fn id(&self) -> &str {
        &self.id
    }

    fn state(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    /// One round trip: if my key does not exist (and this attempt was not
    /// abandoned), create it with my lease and read it back with the nearest
    /// earlier conflicting keys; else read it (a retry after a lost response
    /// finds its own key).
    async fn append(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        self.appended.store(true, Ordering::Relaxed);
        let dir = self.within(request.dir);
        let request = &AppendRequest { dir: &dir, ..*request };
        let key = layout::key(request.dir, request.kind, &self.id, request.attempt);
        // An earlier entry of this session under the same key whose removal has
        // not finished (a guard dropped while the server was unreachable) is
        // no retry of this attempt and must never be taken for its entry:
        // remove it first (fenced on its revision). A failure leaves the old
        // claim in place, so a retry of this append does the same.
        if let Some(order) = self.stale_entry(&key, request) {
            let stale = Entry {
                key: key.clone(),
                kind: request.kind,
                order,
                token: lockline::FencingToken::new(u64::try_from(order).unwrap_or(0)),
                owner: Some(self.id.clone()),
            };
            tracing::debug!(
                key,
                order,
                "removing this session's own leftover entry before appending"
            );
            self.remove(&stale).await?;
        }
        self.claim(&key, request)?;
        let flag = self.lock_delay && self.markers_allowed() && !self.is_flagged(request.dir);
        match self.append_once(request, &key, flag).await {
            // The role may not write the marker prefix: queue without the
            // flag (nothing of a refused transaction was applied).
            Err(refused) if flag && refused.is_refusal() => {
                let appended = self.append_once(request, &key, false).await?;
                self.refuse_flag(&refused);
                Ok(appended)
            }
            other => other,
        }
    }

    /// One round trip: confirm my key is still the same entry and read the
    /// nearest earlier conflicting keys (greatest create revision below mine).
    /// When keys of other locks nested under the prefix leave the read short,
    /// one more read takes every key below mine.
    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let dir = layout::dir_of(entry);
        let prefix = layout::conflict_prefix(dir, conflicts);
        let count = count.max(1);
        let below_mine = || {
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_max_create_revision(entry.order - 1)
        };
        let nearest = || below_mine().with_limit(i64::try_from(layout::page(conflicts, count)).unwrap_or(i64::MAX));
        // After a wait of a contender with a lock-delay: the hand-over
        // markers of the entries it saw go, as of their deletions, in the
        // same request (DESIGN §6.17).
        let looks = if self.lock_delay {
            self.gone().undecided(dir, entry.order)
        } else {
            Vec::new()
        };
        // The queue ahead as of the latest deletion the wait saw, read in
        // the same request: an entry there that this read no longer shows
        // went after it, unseen (two departures before one read).
        let then = looks.iter().map(|(_, _, deleted_at)| *deleted_at).max();
        let response = match self.read_earlier(entry, &prefix, nearest(), &looks, then).await {
            // History compacted away, or the marker prefix not readable:
            // undecided, so lost (a lock-delay at worst), and the queue is
            // read alone.
            Err(error) if !looks.is_empty() && (error.is_refusal() || is_compacted(&error)) => {
                self.looks_unreadable(&entry.key, &error, &looks);
                self.read_earlier(entry, &prefix, nearest(), &[], None).await?
            }
            other => other?,
        };
        if !response.succeeded() {
            return Ok(Earlier::Gone);
        }
        let mut read_at = response.header().map(|h| h.revision());
        let ops = response.op_responses();
        let first = get_response(ops.first())?;
        let mut found: Vec<Entry> = Self::entries(dir, first)
            .into_iter()
            .filter(|e| conflicts.includes(e.kind))
            .collect();
        if !looks.is_empty() {
            self.decide_looks(&ops, 1, &looks);
            let before = get_response(ops.get(1 + 2 * looks.len())).ok();
            let unseen = before.and_then(|before| {
                Self::entries(dir, before)
                    .into_iter()
                    .filter(|e| conflicts.includes(e.kind))
                    .find(|e| {
                        let watched = looks
                            .iter()
                            .any(|((key, order), ..)| *key == e.key && *order == e.order);
                        let listed = found.iter().any(|f| f.key == e.key && f.order == e.order);
                        // Beyond a short page of this read, an older entry may
                        // still be there: only judged within what was read.
                        let within = !first.more() || found.last().is_some_and(|last| e.order > last.order);
                        !watched && !listed && within
                    })
            });
            if let Some(unseen) = unseen {
                tracing::debug!(
                    key = %entry.key,
                    gone = %unseen.key,
                    "an entry ahead went unseen after the one watched; taken for a loss"
                );
                let mut gone = self.gone();
                for (id, ..) in &looks {
                    gone.lost_now(id);
                }
            }
        }
        if found.len() < count && first.more() {
            // Never take a short page for the whole queue: that would grant
            // a lock someone else holds. Keys created before mine can only
            // go away, so a later read is a subset, never a superset.
            let all = self.get(&prefix, Some(below_mine().with_keys_only()), "read").await?;
            read_at = all.header().map(|h| h.revision());
            found = Self::entries(dir, &all)
                .into_iter()
                .filter(|e| conflicts.includes(e.kind))
                .collect();
        }
        found.truncate(count);
        if let Some(blocker) = found.get(count - 1) {
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(blocker, read_at);
        }
        Ok(Earlier::Entries(found))
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let dir = &*self.within(dir);
        let response = self.get(&layout::prefix(dir), Some(first_created(0)), "read").await?;
        Ok(Self::entries(dir, &response))
    }

    /// A watch on the prefix from the current revision, then one read.
    async fn wait_for_entry(&self, dir: &str) -> Result<()> {
        let dir = &*self.within(dir);
        let mut watch = self.hub.watch_prefix(&layout::prefix(dir));
        loop {
            match watch.next().await {
                Signal::Created { .. } => {
                    if !self.list(dir).await?.is_empty() {
                        return Ok(());
                    }
                }
                // Keys of other locks nested under the prefix do not count.
                Signal::Put(written) if layout::is_entry(dir, &written.key) => return Ok(()),
                Signal::Put(_) => {}
                Signal::Delete { .. } => {}
                Signal::Broken(reason) => return Err(self.broken(reason.into(), &layout::prefix(dir)).await),
            }
        }
    }

    /// A watch on the key from the current revision (never a past one: etcd
    /// serves those from its slow unsynced-watcher loop), then one read to
    /// confirm the key still exists, then its DELETE event.
    ///
    /// Only a deletion after the entry's creation counts: a member that lags
    /// can serve the watch from a revision before it, and a key name outlives
    /// its entries (a session re-acquiring writes the same key again).
    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner).take(entry);
        let mut watch = self.hub.watch(&entry.key, false);
        loop {
            match watch.next().await {
                Signal::Created { revision } => {
                    // A read showed the entry at `seen`, and the watch started
                    // at `revision + 1` ≤ `seen + 1`: any deletion since is an
                    // event still to come, so no read is needed. Otherwise
                    // the entry may have gone in between: read.
                    let covered = seen.is_some_and(|seen| revision <= seen);
                    if !covered && !boxed(self.exists(entry)).await? {
                        if self.lock_delay {
                            // Gone before the watch began: its deletion's
                            // revision, for the hand-over marker, comes from
                            // the server's history since the read.
                            let noticed = Instant::now();
                            drop(watch);
                            let deleted_at = match seen {
                                Some(seen) => boxed(self.deleted_since(entry, seen)).await,
                                None => None,
                            };
                            self.gone().insert(entry, deleted_at, noticed);
                        }
                        return Ok(());
                    }
                }
                Signal::Delete { revision } if revision > entry.order => {
                    if self.lock_delay {
                        self.gone().insert(entry, Some(revision), Instant::now());
                    }
                    return Ok(());
                }
                Signal::Delete { .. } | Signal::Put(_) => {}
                Signal::Broken(reason) => return Err(boxed(self.broken(reason.into(), &entry.key)).await),
            }
        }
    }

    /// One transaction: if the entry is still the same one, delete it and,
    /// for an entry of this session on a lock a lock-delayed contender
    /// flagged, write the session's hand-over marker in the same revision (a
    /// waiter with a lock-delay tells a release from a loss by it). Without
    /// such a flag the transaction writes the delete alone.
    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let marked = entry.owner.as_deref() == Some(self.id.as_str()) && self.markers_allowed();
        let removed = match self.remove_once(entry, marked).await {
            Err(refused) if marked && refused.is_refusal() => {
                let removed = self.remove_once(entry, false).await?;
                self.refuse_markers(&refused);
                removed
            }
            other => other?,
        };
        // Deleted now or gone before: the key is free for the session's next entry.
        self.release_claim(&entry.key, Owner::Entry(entry.order));
        if entry.owner.as_deref() == Some(self.id.as_str()) {
            self.untrack(&entry.key);
        }
        Ok(removed)
    }

    /// One transaction: delete the attempt's key if it holds my lease, and
    /// leave a marker (bound to my lease) saying the attempt was abandoned, so
    /// that its append, if it reaches the server only now (another member, a
    /// slow path), creates nothing.
    async fn abandon(&self, dir: &str, kind: EntryKind, attempt: &str) -> Result<()> {
        let dir = &*self.within(dir);
        let key = layout::key(dir, kind, &self.id, attempt);
        let marker = TxnOp::put(
            layout::abandoned(&self.markers, dir, &self.id, attempt),
            Vec::new(),
            Some(PutOptions::new().with_lease(self.lease)),
        );
        let others = shares_key(kind) && self.claimed_by_other(&key, attempt);
        let txn = if others {
            // The key is another entry's of this session (an election of the
            // same name while this mutex was refused, say): keep it.
            Txn::new().and_then([marker])
        } else {
            let mut removal = vec![marker.clone(), TxnOp::delete(key.clone(), None)];
            if self.markers_allowed() {
                removal.push(self.hand_over_if_awaited(dir));
            }
            Txn::new()
                .when([Compare::lease(key.clone(), CompareOp::Equal, self.lease)])
                .and_then(removal)
                .or_else([marker])
        };
        match self.txn(txn, "leave the queue of", &key).await {
            Ok(_) => {}
            Err(refused) if refused.is_refusal() => self.abandon_refused(dir, &key, attempt, refused).await?,
            Err(error) => return Err(error),
        }
        self.release_claim(&key, Owner::Attempt(attempt));
        if !others {
            self.untrack(&key);
        }
        Ok(())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<()> {
        let put = TxnOp::put(
            entry.key.clone(),
            value.to_vec(),
            Some(PutOptions::new().with_lease(self.lease)),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.order,
            )])
            .and_then([put]);
        if self.txn(txn, "write", &entry.key).await?.succeeded() {
            Ok(())
        } else {
            Err(Error::LockLost { key: entry.key.clone() })
        }
    }

    /// One `Txn`: if the entry's create revision (its fencing token) is
    /// still the one it was granted with, then every put and delete; else
    /// nothing. Puts carry no lease: guarded state outlives the session.
    ///
    /// Keys under the lock's own prefix are refused: Go's
    /// `concurrency.Mutex` and `etcdctl lock` count every key under
    /// `<name>/` as a contender, and a key without a lease would block them
    /// for good.
    async fn write_if_held(&self, entry: &Entry, writes: &[Write]) -> Result<bool> {
        let own = layout::prefix(layout::dir_of(entry));
        let mut ops = Vec::with_capacity(writes.len());
        for write in writes {
            let key = self.within(write.key());
            if key.starts_with(&own) {
                return Err(Error::InvalidName {
                    name: write.key().to_owned(),
                    reason: format!(
                        "the key lies under {own:?}, the prefix of the lock that fences the write, \
                         where Go's and etcdctl's contenders would take it for a lock holder"
                    ),
                });
            }
            ops.push(match write {
                Write::Put { value, .. } => TxnOp::put(key.into_owned(), value.clone(), None),
                Write::Delete { .. } => TxnOp::delete(key.into_owned(), None),
                other => {
                    return Err(Error::InvalidOptions {
                        reason: format!("the etcd backend cannot apply {other:?}"),
                    })
                }
            });
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.order,
            )])
            .and_then(ops);
        let named = writes.first().map_or(entry.key.as_str(), Write::key);
        Ok(self.txn(txn, "write", named).await?.succeeded())
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let response = self.get(&self.within(key), None, "read").await?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// One transaction of two range reads at one revision: every key under
    /// `<dir>/` by create revision (the entries of `dir` among them, keys of
    /// nested locks left out), and the value block beside the lock.
    ///
    /// After a value watch of a session with a lock-delay saw an entry of
    /// `dir` go, the same transaction reads that entry's hand-over marker as
    /// of its deletion and the revision before, as the read after a wait
    /// does for the other recipes ([`departure`](BackendSession::departure)
    /// answers from it).
    async fn read_queue(&self, dir: &str) -> Result<Queue> {
        let dir = &*self.within(dir);
        let looks = if self.lock_delay {
            self.gone().undecided(dir, i64::MAX)
        } else {
            Vec::new()
        };
        let read = |looks: &[Look]| {
            let mut ops = vec![
                TxnOp::get(layout::prefix(dir), Some(first_created(0))),
                TxnOp::get(layout::block(dir), None),
            ];
            ops.extend(self.marker_reads(dir, looks));
            self.txn(Txn::new().and_then(ops), "read the queue of", dir)
        };
        let (response, looked) = match read(&looks).await {
            Err(error) if !looks.is_empty() && (error.is_refusal() || is_compacted(&error)) => {
                self.looks_unreadable(dir, &error, &looks);
                (read(&[]).await?, false)
            }
            other => (other?, !looks.is_empty()),
        };
        let read_at = response.header().map(|h| h.revision());
        let ops = response.op_responses();
        let listed = get_response(ops.first())?;
        let block = get_response(ops.get(1))?.kvs().first().map(|kv| kv.value().to_vec());
        if looked {
            self.decide_looks(&ops, 2, &looks);
        }
        let slots: Vec<Slot> = listed
            .kvs()
            .iter()
            .filter_map(|kv| {
                let entry = layout::entry(dir, kv)?;
                Some(Slot {
                    entry,
                    value: kv.value().to_vec(),
                    version: kv.mod_revision(),
                    changed: u64::try_from(kv.mod_revision()).unwrap_or(0),
                })
            })
            .collect();
        if let Some(read_at) = read_at {
            let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
            for slot in slots.iter().filter(|slot| slot.entry.kind == EntryKind::Dlm) {
                values.insert(&slot.entry, read_at, &slot.value);
            }
        }
        Ok(Queue { slots, block })
    }

    /// One transaction: if every unchanged entry's modification revision is
    /// still the version read (which also makes it the very same entry: a
    /// key deleted and created again has a later one, a missing key 0) and
    /// every present entry's create revision is still its own, then put the
    /// new values keeping each key's lease (`ignore_lease`), delete,
    /// and put the block; the token is the transaction's revision, which is
    /// also the new modification revision of every key it put.
    ///
    /// A removal of this session's own entry writes its hand-over marker in
    /// the same transaction where [`remove`](BackendSession::remove) would
    /// (a lock-delayed contender flagged the lock). An
    /// update that writes nothing else puts this session's tick key beside
    /// the lock ([`layout::touched`]), so that its revision is its own.
    async fn update_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let dir = self.within(update.dir);
        let marked = update
            .delete
            .iter()
            .any(|entry| entry.owner.as_deref() == Some(self.id.as_str()))
            && self.markers_allowed();
        let response = match self.update_once(&dir, update, marked).await {
            Err(refused) if marked && refused.is_refusal() => {
                let response = self.update_once(&dir, update, false).await?;
                self.refuse_markers(&refused);
                response
            }
            other => other?,
        };
        let Some(token) = response else {
            return Ok(None);
        };
        for entry in update.delete {
            if entry.owner.as_deref() == Some(self.id.as_str()) {
                self.untrack(&entry.key);
            }
        }
        {
            let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
            for (entry, value) in update.set {
                if !update.delete.iter().any(|gone| gone.key == entry.key) {
                    values.insert(entry, token, value);
                }
            }
        }
        Ok(Some(u64::try_from(token).unwrap_or(0)))
    }

    async fn get_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>> {
        let response = self.get(&entry.key, None, "read").await?;
        Ok(response
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == entry.order)
            .map(|kv| kv.value().to_vec()))
    }

    /// A watch on the key from the current revision, then one read, unless
    /// a lock-mode read or update of this session (or the value watch that
    /// returned `seen`) showed the entry holding `seen` at or after the
    /// revision the watch started from: then every change since is an event
    /// still to come.
    ///
    /// With a lock-delay, an entry seen gone is remembered with the revision
    /// of its deletion, for the next [`read_queue`](BackendSession::read_queue)
    /// to read its hand-over marker.
    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        let remembered = self.values.lock().unwrap_or_else(PoisonError::into_inner).take(entry);
        // A revision at which the entry existed, and one at which it held `seen`.
        let existed_at = remembered.as_ref().map(|(revision, _)| *revision);
        let known = remembered.and_then(|(revision, value)| (value == seen).then_some(revision));
        let mut watch = self.hub.watch(&entry.key, true);
        loop {
            match watch.next().await {
                Signal::Created { revision } if known.is_some_and(|known| revision <= known) => {}
                Signal::Created { .. } => match boxed(self.value_at(entry)).await? {
                    (None, _) => {
                        drop(watch);
                        boxed(self.went(entry, None, existed_at)).await;
                        return Ok(None);
                    }
                    (Some(value), read_at) if value != seen => {
                        self.remember(entry, read_at, &value);
                        return Ok(Some(value));
                    }
                    (Some(_), _) => {}
                },
                Signal::Delete { revision } if revision > entry.order => {
                    boxed(self.went(entry, Some(revision), None)).await;
                    return Ok(None);
                }
                Signal::Delete { .. } => {}
                Signal::Put(written) => {
                    // An older key under the same name: not this entry. A
                    // write the value seen already followed (replayed by a
                    // member that lags): nothing new.
                    if written.create_revision < entry.order || known.is_some_and(|known| written.mod_revision <= known)
                    {
                        continue;
                    }
                    if written.create_revision > entry.order {
                        boxed(self.went(entry, None, None)).await;
                        return Ok(None);
                    }
                    if written.value != seen {
                        self.remember(entry, Some(written.mod_revision), &written.value);
                        return Ok(Some(written.value));
                    }
                }
                Signal::Broken(reason) => return Err(self.broken(reason.into(), &entry.key).await),
            }
        }
    }

    /// From the hand-over marker the read after the wait saw (see
    /// [`layout::released`]): no request of its own.
    fn departure(&self, gone: &Entry) -> Departure {
        let went = self.gone().0.remove(&(gone.key.clone(), gone.order));
        match went {
            Some(Went {
                decided: Some(departure),
                ..
            }) => departure,
            Some(went) => Departure::Lost { noticed: went.noticed },
            None => Departure::Lost {
                noticed: Instant::now(),
            },
        }
    }

    /// Finds the revision `entry` was deleted at (a watch from its creation
    /// replays the deletion from the server's history), then reads this
    /// session's hand-over marker of the entry's lock as of that revision,
    /// and the lock's lock-delay flags as of the revision before: a marker
    /// written in that very revision means a removal of this session's did
    /// it (its transaction writes the marker; one transaction per
    /// revision). No marker, where a removal of this session's would have
    /// written one (a flag was there, or every removal writes it), means
    /// someone else deleted the entry, or the lease ended: as waiters with a
    /// lock-delay tell a hand-over from a loss, with no limit on how often
    /// the marker changed since. Unknown (`None`) when no removal would have
    /// written a marker (no lock-delayed contender flagged the lock: a plain
    /// fenced delete leaves no trace of who sent it), the entry is not this
    /// session's own, the session writes no markers, or the history was
    /// compacted away.
    async fn removed_by_me(&self, entry: &Entry) -> Result<Option<bool>> {
        if entry.owner.as_deref() != Some(self.id.as_str()) || !self.markers_allowed() {
            return Ok(None);
        }
        let mut watch = self.hub.watch_deletes_from(&entry.key, entry.order + 1);
        let deleted_at = loop {
            match watch.next().await {
                Signal::Delete { revision } if revision > entry.order => break revision,
                // Canceled by the server: its history no longer goes back
                // to the entry's creation.
                Signal::Broken(reason) if reason.starts_with(WATCH_CANCELED) => return Ok(None),
                Signal::Broken(reason) => {
                    return Err(Error::unavailable(
                        BACKEND,
                        format!("reading when {:?} was deleted: {reason}", entry.key),
                    ))
                }
                Signal::Created { .. } | Signal::Delete { .. } | Signal::Put(_) => {}
            }
        };
        let dir = layout::dir_of(entry);
        let marker = layout::released(&self.markers, dir, &self.id);
        let flags = GetOptions::new()
            .with_prefix()
            .with_count_only()
            .with_revision((deleted_at - 1).max(1));
        let reads = Txn::new().and_then([
            TxnOp::get(marker.clone(), Some(GetOptions::new().with_revision(deleted_at))),
            TxnOp::get(layout::delay_flags(&self.markers, dir), Some(flags)),
        ]);
        let response = match self.txn(reads, "read", &marker).await {
            Err(error) if is_compacted(&error) || error.is_refusal() => return Ok(None),
            other => other?,
        };
        let ops = response.op_responses();
        // A read of a compacted revision ends the answer short on etcd 3.4.
        let (Ok(at), Ok(flagged)) = (get_response(ops.first()), get_response(ops.get(1))) else {
            return Ok(None);
        };
        if at.kvs().first().is_some_and(|kv| kv.mod_revision() == deleted_at) {
            return Ok(Some(true));
        }
        if self.always_mark || flagged.count() > 0 {
            return Ok(Some(false));
        }
        Ok(None)
    }

    /// Asks the server for the lease's remaining TTL; none left means lost.
    async fn confirm(&self) -> Result<SessionState> {
        let current = *self.state.borrow();
        if current.is_over() {
            return Ok(current);
        }
        let mut leases = self.client.lease_client();
        let asked = tokio::time::timeout(self.request_timeout, leases.time_to_live(self.lease, None));
        let response = match asked.await {
            Ok(answered) => answered.map_err(|e| self.err(e))?,
            Err(_) => {
                return Err(Error::unavailable(
                    BACKEND,
                    format!(
                        "reading the TTL of lease {}: no answer within the request timeout of {:?}",
                        self.id, self.request_timeout
                    ),
                ))
            }
        };
        if response.ttl() <= 0 {
            self.mark_lost("the lease has no time left");
        }
        Ok(*self.state.borrow())
    }

    /// Stops renewing (the keepalive task ends on `Lost`): the lease, and
    /// every key on it, expires within the TTL without any permission.
    fn give_up(&self, why: &str) {
        self.mark_lost(why);
    }

    async fn close(&self) -> Result<()> {
        self.keepalive.abort();
        // No watch of this session may be left to hear the revoke's deletions.
        // The hub answers at once unless it is stuck on a request of its own
        // (a stream opening under a partition): then revoke without waiting,
        // rather than let the close run out of time before the revoke is sent.
        let _ = tokio::time::timeout(HUB_CLOSE_WAIT, self.hub.close()).await;
        let was_lost = *self.state.borrow() == SessionState::Lost;
        if !was_lost && self.appended.load(Ordering::Relaxed) && self.markers_allowed() {
            self.mark_closing().await;
        }
        let revoked = self.client.lease_client().revoke(self.lease).await;
        // A session already lost stays lost: closing it does not undo that.
        advance(&self.state, SessionState::Closed);
        match revoked {
            Ok(_) => Ok(()),
            Err(error) => match map_on(error, Some(&self.id), "revoke the lease of", &self.id) {
                // Already gone on the server: nothing left to release.
                Error::SessionLost { .. } => Ok(()),
                // A lost session (given up after a refused removal, say) is
                // no longer renewed: its lease expires within the TTL, which
                // is all closing it could do.
                refused if was_lost && refused.is_refusal() => {
                    tracing::debug!(lease = %self.id, %refused, "lost session's lease may not be revoked; it expires unrenewed");
                    Ok(())
                }
                other => Err(other),
            },
        }
    }
}

impl EtcdSession {
    /// One round trip: if my key does not exist (and this attempt was not
    /// abandoned), create it with my lease and read it back with the nearest
    /// earlier conflicting keys; else read it (a retry after a lost response
    /// finds its own key).
    ///
    /// With `flag`, the same transaction leaves this session's lock-delay
    /// flag on the lock ([`layout::waits_delayed`]), so that removals of the
    /// entries before this one write their hand-over markers.
    async fn append_once(&self, request: &AppendRequest<'_>, key: &str, flag: bool) -> Result<Appended> {
        let key = key.to_owned();
        let abandoned = layout::abandoned(&self.markers, request.dir, &self.id, request.attempt);
        // Right after my put my key is the newest under the prefix, so the
        // newest conflicting keys (one more than asked, mine may be among them)
        // are exactly the nearest earlier ones, unless keys of other locks
        // nested under the prefix take some of the room (then the core asks
        // `earlier`, which reads on).
        let nearest_prefix = layout::conflict_prefix(request.dir, request.conflicts);
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(
                i64::try_from(layout::page(request.conflicts, request.nearest).saturating_add(1)).unwrap_or(i64::MAX),
            );
        let put = TxnOp::put(
            key.clone(),
            request.value.to_vec(),
            Some(PutOptions::new().with_lease(self.lease)),
        );
        let mut created = vec![put, TxnOp::get(nearest_prefix, Some(newest))];
        if flag {
            created.push(TxnOp::put(
                layout::waits_delayed(&self.markers, request.dir, &self.id),
                Vec::new(),
                Some(PutOptions::new().with_lease(self.lease)),
            ));
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                // An append that reaches the server after its attempt was
                // abandoned (another path, a slow member) creates nothing.
                Compare::create_revision(abandoned.clone(), CompareOp::Equal, 0),
            ])
            .and_then(created)
            .or_else([
                TxnOp::get(key.clone(), None),
                TxnOp::get(abandoned, Some(GetOptions::new().with_count_only())),
            ]);
        let response = self.txn(txn, "queue on", &key).await?;
        let ops = response.op_responses();
        if response.succeeded() {
            if flag {
                self.flagged(request.dir);
            }
            // My put created the key in this very transaction: its create
            // revision is the transaction's revision, its lease mine. No
            // read of it back (one range less per acquire than before).
            let revision = response
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| Error::backend(BACKEND, "a transaction's answer without a header"))?;
            let created = Created {
                key: &key,
                revision,
                lease: self.lease,
            };
            let entry = layout::entry(request.dir, &created).ok_or_else(|| Error::LockLost { key: key.clone() })?;
            let newest = get_response(ops.get(1))?;
            return Ok(self.appended(request, entry, Some(newest), Some(revision)));
        }
        if get_response(ops.get(1))?.count() > 0 {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "acquire attempt {} on {:?} was already abandoned",
                    request.attempt, request.dir
                ),
            ));
        }
        // My key already existed (a retry after a lost answer): keys newer
        // than mine may exist too, so the core asks `earlier`.
        let mine = get_response(ops.first())?;
        let entry = mine
            .kvs()
            .first()
            .and_then(|kv| layout::entry(request.dir, kv))
            .ok_or_else(|| Error::LockLost { key: key.clone() })?;
        if mine.kvs().first().map(|kv| kv.lease()) != Some(self.lease) {
            return Err(Error::backend(
                BACKEND,
                format!("key {key:?} exists with another lease; refusing to share it"),
            ));
        }
        let read_at = response.header().map(|h| h.revision());
        Ok(self.appended(request, entry, None, read_at))
    }

    /// An append's entry, and the nearest earlier ones from `newest` (the
    /// newest conflicting keys the append's transaction read at `read_at`,
    /// mine among them), or `None` when that read is missing or was filled
    /// by other locks' keys.
    fn appended(
        &self,
        request: &AppendRequest<'_>,
        entry: Entry,
        newest: Option<&etcd_client::GetResponse>,
        read_at: Option<i64>,
    ) -> Appended {
        self.claimed_entry(request.attempt, &entry);
        self.track(&entry.key, request.dir);
        let nearest = newest.and_then(|newest| {
            let mut nearest: Vec<Entry> = Self::entries(request.dir, newest)
                .into_iter()
                .filter(|e| e.order < entry.order && request.conflicts.includes(e.kind))
                .collect();
            if nearest.len() < request.nearest && newest.more() {
                // Other locks' keys filled the page: the answer is incomplete.
                return None;
            }
            nearest.truncate(request.nearest);
            Some(nearest)
        });
        // What this read showed exists, for the watches the wait opens next:
        // on this entry, and on the one it will wait for.
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.insert(&entry, read_at);
        if let Some(blocker) = nearest.as_ref().and_then(|n| n.get(request.nearest.max(1) - 1)) {
            seen.insert(blocker, read_at);
        }
        drop(seen);
        Appended { entry, nearest }
    }

    /// The transaction of [`update_queue`](BackendSession::update_queue),
    /// with this session's hand-over marker if `marked`: the revision it
    /// applied at, or `None` when a condition failed.
    async fn update_once(&self, dir: &str, update: &QueueUpdate<'_>, marked: bool) -> Result<Option<i64>> {
        let mut compares = Vec::with_capacity(update.unchanged.len());
        for (entry, version) in update.unchanged {
            if *version <= 0 {
                // No entry that exists has such a version.
                return Ok(None);
            }
            compares.push(Compare::mod_revision(entry.key.clone(), CompareOp::Equal, *version));
        }
        // Present at any version: the very same entry (its create revision).
        for entry in update.present {
            compares.push(Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.order,
            ));
        }
        // The core lists every entry it sets or deletes as unchanged or
        // present too; one it did not is still fenced on its identity.
        let fenced = |entry: &Entry| {
            update.unchanged.iter().any(|(known, _)| known.key == entry.key)
                || update.present.iter().any(|known| known.key == entry.key)
        };
        for entry in update
            .set
            .iter()
            .map(|(entry, _)| *entry)
            .chain(update.delete.iter().copied())
        {
            if !fenced(entry) {
                compares.push(Compare::create_revision(
                    entry.key.clone(),
                    CompareOp::Equal,
                    entry.order,
                ));
            }
        }
        // etcd refuses two writes of one key in a transaction: a deleted
        // entry is not also set, and an entry set twice takes the last value.
        let mut ops: Vec<TxnOp> = Vec::with_capacity(update.set.len() + update.delete.len() + 2);
        let mut written: Vec<&str> = Vec::with_capacity(update.set.len());
        for (at, (entry, value)) in update.set.iter().enumerate() {
            let later = update.set[at + 1..].iter().any(|(other, _)| other.key == entry.key);
            let deleted = update.delete.iter().any(|gone| gone.key == entry.key);
            if later || deleted {
                continue;
            }
            written.push(&entry.key);
            ops.push(TxnOp::put(
                entry.key.clone(),
                value.to_vec(),
                Some(PutOptions::new().with_ignore_lease()),
            ));
        }
        for (at, entry) in update.delete.iter().enumerate() {
            if !update.delete[..at].iter().any(|other| other.key == entry.key) {
                ops.push(TxnOp::delete(entry.key.clone(), None));
            }
        }
        if let Some(block) = update.block {
            ops.push(TxnOp::put(layout::block(dir), block.to_vec(), None));
        }
        if marked {
            ops.push(self.hand_over_if_awaited(dir));
        }
        if ops.is_empty() {
            ops.push(TxnOp::put(
                layout::touched(dir, &self.id),
                Vec::new(),
                Some(PutOptions::new().with_lease(self.lease)),
            ));
        }
        let txn = Txn::new().when(compares).and_then(ops);
        let response = self.txn(txn, "update the queue of", dir).await?;
        if !response.succeeded() {
            return Ok(None);
        }
        let revision = response
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| Error::backend(BACKEND, "a transaction's answer without a header"))?;
        Ok(Some(revision))
    }

    /// The abandonment of `attempt` was refused. That ends the session only if
    /// it can leave an entry behind: when the marker alone may be written
    /// (so no try of the append still on its way can create the key any more)
    /// and the key is not there, the attempt made nothing, typically because
    /// the user may not write the lock's prefix at all, and the refusal is
    /// nothing to act on. Otherwise the refusal stands.
    async fn abandon_refused(&self, dir: &str, key: &str, attempt: &str, refused: Error) -> Result<()> {
        let marker = layout::abandoned(&self.markers, dir, &self.id, attempt);
        let fenced = self
            .client
            .kv_client()
            .put(marker, Vec::new(), Some(PutOptions::new().with_lease(self.lease)))
            .await;
        if fenced.is_err() {
            return Err(refused);
        }
        let response = self
            .client
            .kv_client()
            .get(key.to_owned(), Some(GetOptions::new().with_keys_only()))
            .await;
        match response {
            Ok(response) if response.kvs().iter().all(|kv| kv.lease() != self.lease) => {
                tracing::debug!(key, %refused, "abandoned attempt made no entry; its refused removal changes nothing");
                Ok(())
            }
            _ => Err(refused),
        }
    }

    fn gone(&self) -> std::sync::MutexGuard<'_, Gone> {
        self.gone.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether removals write the session's hand-over marker.
    fn markers_allowed(&self) -> bool {
        !self.markers_refused.load(Ordering::Relaxed)
    }

    /// The server refused a removal with the hand-over marker and took it
    /// without: the user's roles do not cover the marker prefix for writes.
    fn refuse_markers(&self, refused: &Error) {
        if !self.markers_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                lease = %self.id,
                %refused,
                "the hand-over marker may not be written: releases by this session look like losses to waiters with a lock-delay"
            );
        }
    }

    /// The server refused an append with this lock-delayed session's flag
    /// and took it without: the user's roles do not cover the marker prefix
    /// for writes. Without a flag of its own, the releases before this
    /// session's entries write no marker for it (unless another lock-delayed
    /// session flagged the lock), so its waits take them for losses: held
    /// back for the lock-delay after each, never granted early. Its own
    /// removals write no marker either.
    fn refuse_flag(&self, refused: &Error) {
        if !self.markers_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                lease = %self.id,
                %refused,
                "the lock-delay flag may not be written: this session queues without it, so a release before its wait looks like a loss and it is held back for the lock-delay after each (never granted early); releases by this session look like losses to waiters with a lock-delay"
            );
        }
    }

    /// The put of this session's hand-over marker for the lock `dir`, bound
    /// to its lease.
    fn hand_over(&self, dir: &str, value: &[u8]) -> TxnOp {
        TxnOp::put(
            layout::released(&self.markers, dir, &self.id),
            value.to_vec(),
            Some(PutOptions::new().with_lease(self.lease)),
        )
    }

    /// The put of this session's hand-over marker for the lock `dir` as a
    /// removal writes it: only if a lock-delayed contender flagged the lock
    /// (a nested transaction whose compare, on the range of the flags, is
    /// evaluated with the removal's own, before any of its writes), or
    /// always with [`Etcd::with_release_markers`](crate::Etcd::with_release_markers).
    /// Without a flag the removal writes nothing but its delete.
    fn hand_over_if_awaited(&self, dir: &str) -> TxnOp {
        let put = self.hand_over(dir, b"");
        if self.always_mark {
            return put;
        }
        TxnOp::txn(Txn::new().when([self.awaited(dir)]).and_then([put]))
    }

    /// The compare that holds while a lock-delayed contender has flagged
    /// the lock `dir`: some key under its flags' prefix (a range compare on
    /// an empty range compares a missing key, version 0).
    fn awaited(&self, dir: &str) -> Compare {
        Compare::version(layout::delay_flags(&self.markers, dir), CompareOp::Greater, 0).with_prefix()
    }

    /// Whether this session's lock-delay flag is known to be on the lock
    /// `dir` (on the marker prefix, under one).
    fn is_flagged(&self, dir: &str) -> bool {
        self.flagged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(self.flag_scope(dir))
    }

    /// Remembers that this session's lock-delay flag is on the lock `dir`.
    fn flagged(&self, dir: &str) {
        let mut flagged = self.flagged.lock().unwrap_or_else(PoisonError::into_inner);
        if flagged.len() >= FLAGGED_LIMIT {
            flagged.clear();
        }
        flagged.insert(self.flag_scope(dir).to_owned());
    }

    /// What one flag stands for: the lock `dir` beside it, every lock under
    /// a marker prefix.
    fn flag_scope<'a>(&self, dir: &'a str) -> &'a str {
        match self.markers {
            layout::Markers::BesideEachLock => dir,
            layout::Markers::Under(_) => "",
        }
    }

    /// The fenced delete of `entry`, with the hand-over marker if `marked`
    /// and the lock is flagged (written in the deletion's own revision,
    /// which is how a waiter with a lock-delay, and a release retried after
    /// a lost answer ([`BackendSession::removed_by_me`]), tell a removal of
    /// this session's from someone else's delete).
    async fn remove_once(&self, entry: &Entry, marked: bool) -> Result<bool> {
        let mut ops = vec![TxnOp::delete(entry.key.clone(), None)];
        if marked {
            ops.push(self.hand_over_if_awaited(layout::dir_of(entry)));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.order,
            )])
            .and_then(ops);
        Ok(self.txn(txn, "delete", &entry.key).await?.succeeded())
    }

    /// Remembers that `key`, an entry of this session in the lock `dir`,
    /// exists (markers beside each lock only: `close()` marks those locks).
    fn track(&self, key: &str, dir: &str) {
        if self.markers == layout::Markers::BesideEachLock {
            self.live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.to_owned(), dir.to_owned());
        }
    }

    /// Forgets the entry `key`: removed, or never made.
    fn untrack(&self, key: &str) {
        if self.markers == layout::Markers::BesideEachLock {
            self.live.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
        }
    }

    /// The hand-over markers `close()` writes `closing` into, with the lock
    /// each stands for: the session's one marker under a marker prefix, or
    /// beside each lock it still has entries in.
    fn closing_markers(&self) -> Vec<(String, String)> {
        match &self.markers {
            layout::Markers::Under(_) => vec![(layout::released(&self.markers, "", &self.id), String::new())],
            layout::Markers::BesideEachLock => {
                let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
                let dirs: std::collections::BTreeSet<&str> = live.values().map(String::as_str).collect();
                dirs.into_iter()
                    .map(|dir| (layout::released(&self.markers, dir, &self.id), dir.to_owned()))
                    .collect()
            }
        }
    }

    /// Before the revoke of a close: the hand-over markers say the session
    /// is closing, so that a waiter with a lock-delay takes the revoke's
    /// deletions for a hand-over. Written with the session's lease, so they
    /// are only written while the lease lives (a lease the server already let
    /// expire fails the put: those deletions were a loss). One transaction
    /// per [`CLOSING_PER_TXN`] locks the session still has entries in, sent
    /// together; each marker only if a lock-delayed contender flagged its
    /// lock (as a removal writes it), so that without lock-delayed
    /// contenders the transaction writes nothing. Best effort, bounded:
    /// without them waiters are only held back.
    async fn mark_closing(&self) {
        let markers = self.closing_markers();
        if markers.is_empty() {
            return;
        }
        let txns = markers.chunks(CLOSING_PER_TXN).map(|chunk| {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(marker, dir)| {
                    let put = TxnOp::put(
                        marker.clone(),
                        layout::CLOSING.to_vec(),
                        Some(PutOptions::new().with_lease(self.lease)),
                    );
                    if self.always_mark {
                        put
                    } else {
                        TxnOp::txn(Txn::new().when([self.awaited(dir)]).and_then([put]))
                    }
                })
                .collect();
            let mut kv = self.client.kv_client();
            async move { kv.txn(Txn::new().and_then(ops)).await }
        });
        let marked = futures::future::join_all(txns);
        let first = &markers[0].0;
        match tokio::time::timeout(self.close_mark_timeout, marked).await {
            Ok(results) => {
                for error in results.into_iter().filter_map(std::result::Result::err) {
                    tracing::debug!(lease = %self.id, marker = first, %error, "closing without a hand-over marker");
                }
            }
            Err(_) => {
                tracing::debug!(lease = %self.id, marker = first, "closing without a hand-over marker: no answer in time")
            }
        }
    }

    /// For each of `looks` (an entry of the lock `dir` seen deleted at a
    /// revision, and its lease): two reads of that lease's hand-over marker,
    /// as of the deletion and as of the revision before.
    fn marker_reads(&self, dir: &str, looks: &[Look]) -> Vec<TxnOp> {
        let mut ops = Vec::with_capacity(2 * looks.len());
        for (_, owner, deleted_at) in looks {
            let marker = layout::released(&self.markers, dir, owner);
            ops.push(TxnOp::get(
                marker.clone(),
                Some(GetOptions::new().with_revision(*deleted_at)),
            ));
            ops.push(TxnOp::get(
                marker,
                Some(GetOptions::new().with_revision((*deleted_at - 1).max(1))),
            ));
        }
        ops
    }

    /// Decides how each of `looks` went from the answers of its
    /// [`marker_reads`](Self::marker_reads), found in `ops` from `from` on.
    fn decide_looks(&self, ops: &[TxnOpResponse], from: usize, looks: &[Look]) {
        let mut gone = self.gone();
        for (i, (id, _, deleted_at)) in looks.iter().enumerate() {
            // A read of a compacted revision ends the answer short on
            // etcd 3.4 (3.5 refuses the whole request): undecided, so
            // lost.
            let (Ok(at), Ok(before)) = (
                get_response(ops.get(from + 2 * i)),
                get_response(ops.get(from + 1 + 2 * i)),
            ) else {
                tracing::debug!(key = %id.0, "hand-over marker history compacted away; taken for a loss");
                gone.decide(id, false);
                continue;
            };
            // Written by the very transaction that deleted the entry, or
            // saying its session was closing just before the deletion.
            let released = at.kvs().first().is_some_and(|kv| kv.mod_revision() == *deleted_at)
                || before.kvs().first().is_some_and(|kv| kv.value() == layout::CLOSING);
            gone.decide(id, released);
        }
    }

    /// The markers of `looks` cannot be read (history compacted away, the
    /// marker prefix not readable): each undecided, so lost (a lock-delay at
    /// worst).
    fn looks_unreadable(&self, key: &str, error: &Error, looks: &[Look]) {
        tracing::debug!(key, %error, "hand-over markers unreadable; taken for losses");
        let mut gone = self.gone();
        for (id, ..) in looks {
            gone.decide(id, false);
        }
    }

    /// The read after a wait: my entry confirmed, the nearest earlier keys,
    /// and for each of `looks` (an entry seen deleted at a revision, and its
    /// lease) that lease's hand-over marker as of the deletion and as of
    /// the revision before.
    async fn read_earlier(
        &self,
        entry: &Entry,
        prefix: &str,
        nearest: GetOptions,
        looks: &[Look],
        then: Option<i64>,
    ) -> Result<etcd_client::TxnResponse> {
        let mut ops = Vec::with_capacity(2 + 2 * looks.len());
        ops.push(TxnOp::get(prefix.to_owned(), Some(nearest.clone())));
        ops.extend(self.marker_reads(layout::dir_of(entry), looks));
        if let Some(then) = then {
            ops.push(TxnOp::get(prefix.to_owned(), Some(nearest.with_revision(then))));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.order,
            )])
            .and_then(ops);
        self.txn(txn, "read", prefix).await
    }

    /// The revision `entry` was deleted at, after `seen` (a revision at which
    /// a read showed it): a watch from `seen + 1` replays the deletion from
    /// the server's history. `None` when that history was compacted away or
    /// the server does not answer within a second.
    async fn deleted_since(&self, entry: &Entry, seen: i64) -> Option<i64> {
        let mut watch = self.hub.watch_deletes_from(&entry.key, seen + 1);
        let replay = async {
            loop {
                match watch.next().await {
                    Signal::Delete { revision } if revision > entry.order => return Some(revision),
                    Signal::Broken(_) => return None,
                    Signal::Created { .. } | Signal::Delete { .. } | Signal::Put(_) => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(1), replay)
            .await
            .ok()
            .flatten()
    }

    /// `entry`'s current value (`None` when it is gone), and the revision
    /// of the read.
    async fn value_at(&self, entry: &Entry) -> Result<(Option<Vec<u8>>, Option<i64>)> {
        let response = self.get(&entry.key, None, "read").await?;
        let value = response
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == entry.order)
            .map(|kv| kv.value().to_vec());
        Ok((value, response.header().map(|h| h.revision())))
    }

    /// Remembers that `entry` held `value` at `revision`, for the next value
    /// watch on it (see [`Values`]).
    fn remember(&self, entry: &Entry, revision: Option<i64>, value: &[u8]) {
        if let Some(revision) = revision {
            self.values
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(entry, revision, value);
        }
    }

    /// A value watch saw `entry` go: with a lock-delay, remember it with the
    /// revision of its deletion (`deleted_at`, or replayed from the server's
    /// history after `existed_at`, a revision at which it existed), for the
    /// next read of its lock to decide how it went.
    async fn went(&self, entry: &Entry, deleted_at: Option<i64>, existed_at: Option<i64>) {
        if !self.lock_delay {
            return;
        }
        let noticed = Instant::now();
        let deleted_at = match (deleted_at, existed_at) {
            (Some(revision), _) => Some(revision),
            (None, Some(seen)) => self.deleted_since(entry, seen).await,
            (None, None) => None,
        };
        self.gone().insert(entry, deleted_at, noticed);
    }

    async fn exists(&self, entry: &Entry) -> Result<bool> {
        let response = self
            .get(&entry.key, Some(GetOptions::new().with_keys_only()), "read")
            .await?;
        Ok(response
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == entry.order))
    }
}

/// Why the keepalive stopped renewing.
enum Ending {
    /// No renewal confirmed for `ttl - safety margin`.
    Unconfirmed,
    /// The server answered with TTL ≤ 0: the lease is gone already.
    Expired,
    /// The session was declared lost elsewhere (a request found the lease gone).
    DeclaredLost,
}

/// Renews the lease every `keepalive_interval`; the session is `Suspended` as
/// soon as a renewal goes unanswered for a keepalive interval (or fails), and
/// `Lost` on a TTL ≤ 0 answer or when no renewal has been confirmed for
/// `ttl - safety_margin`, counted from the send time of the last renewal the
/// server answered.
///
/// Once lost the session stops renewing for good and revokes its lease as soon
/// as the server can be reached (DESIGN §6.11): a renewal sent before the loss
/// and delivered late could otherwise keep the lease, and the keys of a
/// session that already told its holders they lost, alive.
async fn keep_alive(
    client: Client,
    lease: i64,
    options: SessionOptions,
    granted_at: Instant,
    state: watch::Sender<SessionState>,
) {
    let interval = options.keepalive_interval();
    let retry = interval.min(Duration::from_millis(250));
    let mut confirmed = granted_at;
    let mut stream = None;
    let mut wait = interval;
    let mut watched = state.subscribe();
    let ending = loop {
        let deadline = confirmed + options.loss_deadline();
        tokio::select! {
            biased;
            _ = watched.wait_for(|s| s.is_over()) => break Ending::DeclaredLost,
            () = tokio::time::sleep_until(deadline) => break Ending::Unconfirmed,
            () = tokio::time::sleep(wait) => {}
        }
        let sent = Instant::now();
        let outcome = {
            let renewal = async {
                if stream.is_none() {
                    stream = Some(client.lease_client().keep_alive(lease).await?);
                }
                let Some((keeper, responses)) = stream.as_mut() else {
                    return Ok(None);
                };
                keeper.keep_alive().await?;
                responses.message().await
            };
            let renewal = tokio::time::timeout(options.request_timeout(), renewal);
            tokio::pin!(renewal);
            // A renewal normally answers within milliseconds: one that takes a
            // whole keepalive interval means the server may be out of reach.
            let slow = sent + interval.min(options.request_timeout());
            tokio::select! {
                biased;
                outcome = &mut renewal => Some(outcome),
                () = tokio::time::sleep_until(deadline) => None,
                () = tokio::time::sleep_until(slow) => {
                    if advance(&state, SessionState::Suspended) {
                        tracing::debug!(lease = format!("{lease:x}"), "etcd keepalive unanswered; session suspended");
                    }
                    tokio::select! {
                        biased;
                        outcome = &mut renewal => Some(outcome),
                        () = tokio::time::sleep_until(deadline) => None,
                    }
                }
            }
        };
        match outcome {
            None => break Ending::Unconfirmed,
            Some(Ok(Ok(Some(response)))) if response.ttl() > 0 => {
                confirmed = sent;
                wait = interval;
                advance(&state, SessionState::Live);
            }
            Some(Ok(Ok(Some(_)))) => break Ending::Expired,
            Some(outcome) => {
                let why = match outcome {
                    Ok(Err(error)) => error.to_string(),
                    Ok(Ok(_)) => "keepalive stream ended".into(),
                    Err(_) => format!(
                        "no answer within the request timeout of {:?}",
                        options.request_timeout()
                    ),
                };
                tracing::debug!(lease = format!("{lease:x}"), why, "etcd keepalive failed; retrying");
                stream = None;
                wait = retry;
                advance(&state, SessionState::Suspended);
            }
        }
    };
    // Stop renewing, whatever happens next.
    drop(stream);
    match ending {
        Ending::Expired => {
            tracing::warn!(
                lease = format!("{lease:x}"),
                "etcd lease expired or revoked; session lost"
            );
            advance(&state, SessionState::Lost);
            return;
        }
        Ending::Unconfirmed => {
            tracing::warn!(
                lease = format!("{lease:x}"),
                deadline = ?options.loss_deadline(),
                "etcd lease not confirmed within ttl - safety margin; session lost"
            );
            advance(&state, SessionState::Lost);
        }
        Ending::DeclaredLost => {}
    }
    if *state.borrow() == SessionState::Lost {
        // Detached: dropping the session's last handle must not stop it.
        tokio::spawn(async move { revoke_lost_lease(&client, lease, &options).await });
    }
}

/// Revokes a lost session's lease, retrying with capped backoff until the
/// server confirms it (revoked now, or not found: expired or revoked before),
/// also after every handle of the session is dropped (a renewal sent before
/// the loss and delivered late would otherwise keep the lease a TTL longer).
async fn revoke_lost_lease(client: &Client, lease: i64, options: &SessionOptions) {
    let id = format!("{lease:x}");
    let mut backoff = Duration::from_millis(100);
    loop {
        let revoked = tokio::time::timeout(options.request_timeout(), client.lease_client().revoke(lease)).await;
        match revoked {
            Ok(Ok(_)) => {
                tracing::info!(lease = %id, "lost etcd session's lease revoked");
                return;
            }
            Ok(Err(error)) => match map(error, Some(&id)) {
                Error::SessionLost { .. } => {
                    tracing::debug!(lease = %id, "lost etcd session's lease already gone");
                    return;
                }
                // The user may not revoke it (revoking needs write on every
                // key on the lease): it expires within its TTL, unrenewed.
                error if error.is_refusal() => {
                    tracing::info!(lease = %id, %error, "the server refuses to revoke the lost lease; it expires unrenewed");
                    return;
                }
                error => tracing::debug!(lease = %id, %error, ?backoff, "revoking a lost etcd lease failed; retrying"),
            },
            Err(_) => tracing::debug!(
                lease = %id,
                timeout = ?options.request_timeout(),
                "revoking a lost etcd lease timed out; retrying"
            ),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
