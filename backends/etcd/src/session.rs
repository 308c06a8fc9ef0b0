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
    QueueUpdate, Slot, Wanted,
};
use lockline::{Error, Result, SessionOptions, SessionState, Write};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::error::{self, map, map_on, BACKEND};
use crate::layout;
use crate::watch::{Hub, Liveness, Signal, WATCH_CANCELED};

mod claims;
mod departures;
mod entries;
mod fenced;
mod handover;
mod lease;
mod modes;
mod wait;

use claims::KeyClaim;
use departures::Gone;
use lease::keep_alive;
use modes::Values;
use wait::Seen;

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
}

/// How long `close()` waits for the watch hub to end its stream before it
/// revokes the lease anyway.
const HUB_CLOSE_WAIT: Duration = Duration::from_millis(250);

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
        // The whole queue (or none) for a lock-mode entry, never a window.
        self.append_entry(&request.without_window()).await
    }

    /// One round trip: confirm my key is still the same entry and read the
    /// nearest earlier conflicting keys (greatest create revision below mine).
    /// When keys of other locks nested under the prefix leave the read short,
    /// one more read takes every key below mine.
    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        self.nearest_earlier(entry, conflicts, count).await
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
        self.wait_for_deletion(entry).await
    }

    /// One transaction: if the entry is still the same one, delete it and,
    /// for an entry of this session on a lock a lock-delayed contender
    /// flagged, write the session's hand-over marker in the same revision (a
    /// waiter with a lock-delay tells a release from a loss by it). Without
    /// such a flag the transaction writes the delete alone.
    async fn remove(&self, entry: &Entry) -> Result<bool> {
        self.remove_entry(entry).await
    }

    /// One transaction: delete the attempt's key if it holds my lease, and
    /// leave a marker (bound to my lease) saying the attempt was abandoned, so
    /// that its append, if it reaches the server only now (another member, a
    /// slow path), creates nothing.
    async fn abandon(&self, dir: &str, kind: EntryKind, attempt: &str) -> Result<()> {
        self.abandon_attempt(dir, kind, attempt).await
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
        self.write_fenced(entry, writes).await
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
        self.read_dlm_queue(dir).await
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
        self.update_dlm_queue(update).await
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
        self.watch_dlm_value(entry, seen, &|_| true).await
    }

    /// As `watch_value`, on the one watch: a value `wanted` refuses is
    /// watched past, not watched anew.
    async fn watch_value_until(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        self.watch_dlm_value(entry, seen, wanted).await
    }

    /// From the hand-over marker the read after the wait saw (see
    /// [`layout::released`]): no request of its own.
    fn departure(&self, gone: &Entry) -> Departure {
        self.decided_departure(gone)
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
        self.removed_by_me_from_markers(entry).await
    }

    /// Asks the server for the lease's remaining TTL; none left means lost.
    async fn confirm(&self) -> Result<SessionState> {
        self.confirm_lease().await
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

/// A transaction of `ops` applied only while `entry` is the very entry it
/// was (the same key at the same create revision): a fenced change.
fn fenced_on(entry: &Entry, ops: Vec<TxnOp>) -> Txn {
    Txn::new()
        .when([Compare::create_revision(
            entry.key.clone(),
            CompareOp::Equal,
            entry.order,
        )])
        .and_then(ops)
}
