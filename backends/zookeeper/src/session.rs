//! A ZooKeeper session: one `zookeeper_client::Client`, its state tracked.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lockline::backend::{
    advance, AppendRequest, Appended, BackendSession, Conflicts, Departure, Earlier, Entry, EntryKind, Queue,
    QueueUpdate, Slot,
};
use lockline::{Error, FencingToken, Result, SessionOptions, SessionState, Write};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use zookeeper_client::{
    Acl, Acls, AuthId, Client, CreateMode, Error as ZkError, EventType, MultiReadResult, MultiWriteError,
    MultiWriteResult, OneshotWatcher, Permission, SessionState as ZkState, Stat, WatchedEvent,
};

use crate::error::{denied, map};
use crate::layout::{self, Contender};
use crate::{AclPolicy, ZooKeeper};

mod fenced;
mod modes;

use modes::QueueMemo;

impl AclPolicy {
    /// The ACL of every node this policy creates for `backend`'s sessions.
    ///
    /// `Creator` names the configured identities explicitly (`digest:USER:HASH`,
    /// `sasl:USER`) rather than through ZooKeeper's `auth` scheme: `auth`
    /// grants every identity the connection has, and a TLS connection with a
    /// client certificate also has the certificate's `x509:` identity, which
    /// every client sharing that certificate has too.
    fn acls(self, backend: &ZooKeeper) -> Vec<Acl> {
        match self {
            AclPolicy::Open => Acls::anyone_all().to_vec(),
            AclPolicy::Creator => {
                let mut acls = Vec::new();
                if let Some(digest) = &backend.digest {
                    let id = crate::connect::digest_id(&digest.user, &digest.password);
                    acls.push(Acl::new(Permission::ALL, AuthId::new("digest", &id)));
                }
                if let Some(sasl) = &backend.sasl {
                    acls.push(Acl::new(Permission::ALL, AuthId::new("sasl", &sasl.user)));
                }
                acls.push(Acl::new(Permission::READ, AuthId::anyone()));
                acls
            }
        }
    }
}

/// A lockline session on ZooKeeper.
pub(crate) struct ZkSession {
    id: String,
    /// `None` once closed or lost; every call clones it (cheap) for its
    /// duration. Dropping the last clone ends the ZooKeeper session: the
    /// client sends `closeSession` as soon as it reaches a server.
    client: Arc<StdMutex<Option<Client>>>,
    state: watch::Sender<SessionState>,
    liveness: Arc<Liveness>,
    tracker: AbortHandle,
    /// Appends that may have created a node without our knowing it: a retry
    /// looks for the attempt's node before creating one. An attempt leaves the
    /// set only once its append has fully succeeded, or it is abandoned.
    uncertain: StdMutex<HashSet<String>>,
    /// How the session was opened, to close it from a second connection
    /// when it is given up.
    backend: crate::ZooKeeper,
    /// The session's id and password, kept after the client is let go (a
    /// lost session), so that `close` can still end it on the server.
    info: zookeeper_client::SessionInfo,
    options: SessionOptions,
    /// Attempts whose create the server refused (an ACL): they made no node,
    /// so abandoning them needs no look at a directory this session may not
    /// be allowed to read.
    refused: StdMutex<HashSet<String>>,
    /// The ACL of the nodes this session creates (see [`AclPolicy`]).
    acls: Vec<Acl>,
    /// This session's nodes that an append made and nothing has removed
    /// yet: `close()` hands them over with the release mark before it ends
    /// the session (see [`release_node`](ZkSession::release_node)).
    held: StdMutex<HashSet<String>>,
    /// How the recent waits on other contenders' nodes ended, by path: what
    /// [`departure`](BackendSession::departure) answers from. Kept only when
    /// the session has a lock-delay, and only for `wake_memory`.
    wakes: StdMutex<HashMap<String, Wake>>,
    /// How long a wake by the release mark counts as one (see
    /// [`ZkSession::departure`]): [`WAKE_MEMORY`], or half the negotiated
    /// session timeout when that is shorter.
    wake_memory: Duration,
    /// What this session last saw of lock-mode resources' directories, by
    /// path: the next `read_queue` reads those children's data in the same
    /// request as the listing (see [`QueueMemo`]). At most
    /// [`QUEUE_MEMO_MAX`] directories.
    queues: StdMutex<HashMap<String, QueueMemo>>,
    /// Counts this session's writes to lock directories, each once when it
    /// begins and once when it ends (or is dropped): a queue kept for a
    /// later read (see [`ZkSession::take_fresh`]) serves only while the
    /// count has not moved since its read was sent.
    writes: AtomicU64,
}

/// A write of this session to a lock directory under way (see
/// `ZkSession::writes`): counted when made and when dropped.
struct Writing<'a>(&'a AtomicU64);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// How a wait on another contender's node ended.
#[derive(Debug, Clone, Copy)]
struct Wake {
    /// When the waiter heard of it.
    at: Instant,
    /// Woken by the release mark (the node's data changed, and the node was
    /// deleted in the same transaction if it is gone at the next read), not
    /// by the deletion alone.
    marked: bool,
}

/// The first pause before a failed watch request is sent again (or sooner,
/// once the client has reconnected), and its cap.
const WATCH_RETRY_PAUSE: Duration = Duration::from_millis(50);
const WATCH_RETRY_MAX_PAUSE: Duration = Duration::from_secs(1);

/// What a watch request found (see [`ZkSession::watch_existing`]).
enum Watched {
    /// The node is there; the watch is set.
    Set(OneshotWatcher),
    /// The node is gone. `across_reconnection`: the connection was lost
    /// and made again while the request was on its way (it was queued or
    /// sent again), so the node may have gone at any time since the read
    /// that named it.
    Gone { across_reconnection: bool },
}

/// A watch request in flight (see [`ZkSession::watch_existing`]).
type Watching<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = std::result::Result<Watched, (Error, Option<zookeeper_client::StateWatcher>)>>
            + Send
            + 'a,
    >,
>;

/// The event of an exists-watch on this session's own node (the watch a
/// waiter sets and hands on to its hold).
///
/// Dropped before its event, as every hold's wait is at its release (the
/// core stops watching, then releases), the watch is left to fire in a task
/// of its own rather than removed: the client library would otherwise send
/// `removeWatches` at the drop and, the release's own change firing the
/// watch on the server anyway, a second one for the event nobody waits for
/// any more; two requests per grant that nothing needs. The event is sure to
/// come: the node's own session changes or deletes it (a release, a
/// cancelled wait's cleanup), or the session ends, which ends every watch.
/// Without a runtime (dropped outside one) the watch is removed as before.
struct OwnWatch(Option<std::pin::Pin<Box<dyn std::future::Future<Output = WatchedEvent> + Send>>>);

impl OwnWatch {
    fn new(watcher: OneshotWatcher) -> Self {
        OwnWatch(Some(Box::pin(watcher.changed())))
    }
}

impl std::future::Future for OwnWatch {
    type Output = WatchedEvent;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<WatchedEvent> {
        let Some(changed) = self.0.as_mut() else {
            return std::task::Poll::Pending;
        };
        let event = std::task::ready!(changed.as_mut().poll(cx));
        self.0 = None;
        std::task::Poll::Ready(event)
    }
}

impl Drop for OwnWatch {
    fn drop(&mut self) {
        if let (Some(changed), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            drop(runtime.spawn(changed));
        }
    }
}

/// Resolves once the client has reconnected after a failed request, or
/// after `pause` at most. Boxed by a plain function, as `watch_existing`: the
/// wait every held lock keeps stays small.
fn reconnected(
    state: Option<zookeeper_client::StateWatcher>,
    pause: Duration,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let connected = async {
            match state {
                Some(mut state) => {
                    while !matches!(
                        state.changed().await,
                        ZkState::SyncConnected | ZkState::ConnectedReadOnly
                    ) {}
                }
                None => std::future::pending().await,
            }
        };
        let _ = tokio::time::timeout(pause, connected).await;
    })
}

/// How long a wake is remembered for [`BackendSession::departure`] at most:
/// the core asks right after the read that follows the wake. A read later
/// than this (a stalled waiter) is taken as a loss: see
/// [`ZkSession::departure`].
const WAKE_MEMORY: Duration = Duration::from_secs(1);

/// The data a release writes into its node in the same transaction as it
/// deletes it (see [`ZkSession::release_node`]): nothing, the change itself
/// is the mark.
const RELEASE_MARK: &[u8] = b"";

/// When the server last confirmed the session, and how long that lasts.
///
/// The leader expires a session `negotiated timeout` after the last activity
/// it heard of. A follower hears of the client's requests first and reports
/// them to the leader in its answers to the leader's pings, sent every half
/// `tickTime` (at most a quarter of the negotiated timeout, which is at least
/// two ticks). So lockline confirms with `sync`, which the server the client
/// is connected to can answer only through the leader (a follower cut off from
/// the leader answers no `sync`, while it would still answer reads), and takes
/// an answered `sync` sent at `t` as proof that the leader had heard of the
/// session's activity from a quarter timeout before `t`: the deadline counts
/// from the send time of the latest answered confirmation sent at least that
/// much earlier (DESIGN §6.9). The session's creation is the first
/// confirmation: the leader itself made it.
#[derive(Debug)]
struct Liveness {
    confirmed: StdMutex<Confirmations>,
    /// `negotiated timeout - safety margin`.
    loss_deadline: Duration,
    /// How long the leader may take to hear of the session's activity at a
    /// follower: a quarter of the negotiated timeout.
    report_lag: Duration,
}

#[derive(Debug)]
struct Confirmations {
    /// What the deadline counts from.
    confirmed: Instant,
    /// Send times of answered confirmations not yet old enough to count,
    /// oldest first.
    recent: std::collections::VecDeque<Instant>,
}

impl Liveness {
    fn new(opened: Instant, loss_deadline: Duration, report_lag: Duration) -> Self {
        Liveness {
            confirmed: StdMutex::new(Confirmations {
                confirmed: opened,
                recent: std::collections::VecDeque::new(),
            }),
            loss_deadline,
            report_lag,
        }
    }

    /// Records an answered `sync` sent at `sent`.
    fn confirm(&self, sent: Instant) {
        let mut c = lock(&self.confirmed);
        if c.recent.back().is_none_or(|last| sent > *last) {
            c.recent.push_back(sent);
        }
        // Everything sent a report lag before this answer now counts.
        let Some(horizon) = sent.checked_sub(self.report_lag) else {
            return;
        };
        while c.recent.front().is_some_and(|t| *t <= horizon) {
            if let Some(t) = c.recent.pop_front() {
                if t > c.confirmed {
                    c.confirmed = t;
                }
            }
        }
    }

    /// When the session must be taken as lost unless confirmed again.
    fn deadline(&self) -> Instant {
        lock(&self.confirmed).confirmed + self.loss_deadline
    }
}

/// Ends a lost session on the server: drops the client, so it sends
/// `closeSession` as soon as it reaches a server (a partition that heals
/// before the server's own expiry must not bring the session and its nodes
/// back), and calls on it fail with `SessionLost`.
fn end(slot: &StdMutex<Option<Client>>) {
    drop(lock(slot).take());
}

impl fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSession")
            .field("id", &self.id)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl Drop for ZkSession {
    fn drop(&mut self) {
        self.tracker.abort();
    }
}

/// Creates the connect string's chroot (`host:port/apps/locks`) when it does
/// not exist, as Curator's namespace does: persistent nodes, with the ACL
/// policy's ACLs. One existence check when it does.
async fn ensure_chroot(client: &Client, acls: &[Acl], session: &str) -> Result<()> {
    let chroot = client.path().to_owned();
    if chroot == "/" {
        return Ok(());
    }
    if chroot == "/zookeeper" || chroot.starts_with("/zookeeper/") {
        return Err(Error::InvalidOptions {
            reason: format!("ZooKeeper chroot {chroot:?}: ZooKeeper reserves the /zookeeper subtree"),
        });
    }
    let Ok(root) = client.clone().chroot("/") else {
        return Err(Error::InvalidOptions {
            reason: format!("ZooKeeper chroot {chroot:?} is not a valid path"),
        });
    };
    match root.check_stat(&chroot).await {
        Ok(Some(_)) => return Ok(()),
        Ok(None) => {}
        Err(ZkError::NoAuth) => return Err(denied("read the chroot", &chroot)),
        Err(error) => return Err(map(error, session)),
    }
    tracing::debug!(%chroot, "creating the ZooKeeper chroot");
    let mode = CreateMode::Persistent.with_acls(Acls::new(acls));
    let mut path = String::new();
    for part in chroot.trim_start_matches('/').split('/') {
        path.push('/');
        path.push_str(part);
        match root.create(&path, b"", &mode).await {
            Ok(_) | Err(ZkError::NodeExists) => {}
            Err(ZkError::NoAuth) => return Err(denied("create the chroot", &path)),
            Err(ZkError::NoChildrenForEphemerals) => {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "ZooKeeper chroot {chroot:?} cannot be created: {:?} is an ephemeral node",
                        path.rsplit_once('/').map_or("/", |(parent, _)| parent)
                    ),
                })
            }
            Err(error) => return Err(map(error, session)),
        }
    }
    Ok(())
}

/// The most bytes of values (and paths) one request may carry: ZooKeeper
/// drops the connection of a client whose packet exceeds its
/// `jute.maxbuffer` (1 MiB less one byte by default), which would look like
/// a network failure and be retried for ever. Room is left for the rest of
/// the packet.
const MAX_REQUEST_BYTES: usize = 1_000_000;

/// What one operation of a `multi` adds on the wire beside its path and data
/// (its header, lengths, version or flags), rounded up.
const MULTI_OP_OVERHEAD: usize = 32;

/// What one ACL of a created node adds on the wire beside its scheme and id
/// (permissions and lengths), rounded up.
const ACL_BYTES: usize = 16;

/// Refuses a request of `size` bytes that the server would not take.
fn fits(size: usize, key: &str) -> Result<()> {
    if size > MAX_REQUEST_BYTES {
        return Err(Error::InvalidOptions {
            reason: format!(
                "cannot write {key:?}: the request is too large for the server ({size} bytes; ZooKeeper takes \
                 up to about {MAX_REQUEST_BYTES} with its default jute.maxbuffer)"
            ),
        });
    }
    Ok(())
}

/// How much sooner than the core's bound (the request timeout) `close()`
/// gives up waiting for the server's confirmation, to say why itself.
const CLOSE_MARGIN: Duration = Duration::from_millis(100);

/// A backend error that says which path the server refused, and why.
fn on_path(error: Error, operation: &str, path: &str) -> Error {
    match error {
        Error::Backend {
            backend,
            reason,
            source,
        } => Error::Backend {
            backend,
            reason: format!("{operation} {path:?}: {reason}"),
            source,
        },
        other => other,
    }
}

fn lock<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ZkSession {
    pub(crate) async fn open(backend: &ZooKeeper, options: &SessionOptions) -> Result<Arc<Self>> {
        // The connect request is the session's first confirmation: the server
        // starts its expiry clock no earlier than this.
        let sent = Instant::now();
        let client = crate::connect::connect(backend, options).await?;
        let id = format!("{:x}", client.session_id().0);
        let info = client.session().clone();
        let acls = backend.acl_policy.acls(backend);
        // Dropping the client on an error closes the session again.
        ensure_chroot(&client, &acls, &id).await?;
        let state = watch::Sender::new(SessionState::Live);
        // Declare the session lost a safety margin before the server could
        // expire it: the negotiated timeout less the margin, counted from the
        // last confirmation.
        let negotiated = client.session_timeout();
        // A server that caps the timeout below the TTL asked for (its
        // maxSessionTimeout) gets the same margin as a share of what it
        // granted, so a long TTL does not eat the whole negotiated timeout.
        let ttl = options.ttl();
        let margin = if negotiated < ttl && !ttl.is_zero() {
            options
                .safety_margin()
                .mul_f64(negotiated.as_secs_f64() / ttl.as_secs_f64())
        } else {
            options.safety_margin()
        };
        let margin = margin.min(negotiated / 2);
        let loss_deadline = negotiated.saturating_sub(margin);
        let report_lag = negotiated / 4;
        let liveness = Arc::new(Liveness::new(sent, loss_deadline, report_lag));
        // Often enough that, counted a report lag back, a confirmation stays
        // well inside the deadline: a confirmation counts once one sent a
        // report lag later is answered, so the deadline must leave room for
        // the lag and two intervals.
        let interval = options
            .keepalive_interval()
            .min(negotiated / 6)
            .min(loss_deadline.saturating_sub(report_lag) / 3);
        let slot = Arc::new(StdMutex::new(Some(client.clone())));
        let tracker = tokio::spawn(track(
            client,
            Arc::clone(&slot),
            Arc::clone(&liveness),
            state.clone(),
            interval,
        ))
        .abort_handle();
        tracing::debug!(session = %id, ?negotiated, "ZooKeeper session opened");
        Ok(Arc::new(ZkSession {
            id,
            client: slot,
            state,
            liveness,
            tracker,
            uncertain: StdMutex::default(),
            backend: backend.clone(),
            info,
            options: options.clone(),
            refused: StdMutex::default(),
            acls,
            held: StdMutex::default(),
            wakes: StdMutex::default(),
            wake_memory: WAKE_MEMORY.min(negotiated / 2),
            queues: StdMutex::default(),
            writes: AtomicU64::new(0),
        }))
    }

    /// The ZooKeeper session's id and password (to attach to it from elsewhere).
    pub(crate) fn session_info(&self) -> Option<zookeeper_client::SessionInfo> {
        lock(&self.client).as_ref().map(|c| c.session().clone())
    }

    fn client(&self) -> Result<Client> {
        self.check_deadline()?;
        lock(&self.client).clone().ok_or_else(|| {
            let session = self.id.clone();
            match *self.state.borrow() {
                SessionState::Lost => Error::SessionLost { session },
                _ => Error::Closed { session },
            }
        })
    }

    /// A session past its loss deadline is lost, whatever the tracker has
    /// had time to notice (a process paused past the deadline runs its own
    /// requests before the tracker's timer): never sent a request on.
    fn check_deadline(&self) -> Result<()> {
        let state = *self.state.borrow();
        if state.is_over() {
            let session = self.id.clone();
            return Err(match state {
                SessionState::Lost => Error::SessionLost { session },
                _ => Error::Closed { session },
            });
        }
        if Instant::now() >= self.liveness.deadline() {
            self.mark_lost("not confirmed within the loss deadline");
            return Err(Error::SessionLost {
                session: self.id.clone(),
            });
        }
        Ok(())
    }

    fn err(&self, error: ZkError) -> Error {
        let mapped = map(error, &self.id);
        // A request that failed for want of an answer once the deadline has
        // passed failed on a lost session.
        if mapped.is_transient() && self.check_deadline().is_err() {
            return Error::SessionLost {
                session: self.id.clone(),
            };
        }
        self.noted(mapped)
    }

    /// As [`err`](Self::err) for a write that was sent and may have been
    /// applied: a transient error stays one (`Unavailable` says the batch may
    /// have landed), whatever the deadline.
    fn err_sent(&self, error: ZkError, path: &str) -> Error {
        on_path(self.noted(map(error, &self.id)), "write", path)
    }

    /// Marks the session lost when the server said it is.
    fn noted(&self, mapped: Error) -> Error {
        match mapped {
            Error::SessionLost { .. } => self.mark_lost("the server expired the session"),
            Error::AuthenticationFailed { .. } => self.mark_lost("the server rejected the session's credentials"),
            _ => {}
        }
        mapped
    }

    /// As [`err`](Self::err), with an ACL refusal named by what was refused.
    fn err_on(&self, error: ZkError, operation: &'static str, path: &str) -> Error {
        match error {
            ZkError::NoAuth => denied(operation, path),
            other => on_path(self.err(other), operation, path),
        }
    }

    fn mark_lost(&self, why: &str) {
        if advance(&self.state, SessionState::Lost) {
            tracing::warn!(session = %self.id, why, "ZooKeeper session lost");
        }
        end(&self.client);
    }

    /// A watch on `entry`'s node, or [`Watched::Gone`] when the node is gone; a failure
    /// comes with the client's state, to wait for a reconnection.
    ///
    /// On another contender's node (`own` false) a data watch (`getData`,
    /// as Curator's waiter sets): a node already gone sets no watch. An
    /// exists-watch on a missing node would stay on the server, waiting for
    /// a creation that never comes (the path is unique), so dropping it
    /// would cost a `removeWatches` request; at N = 2 the node is gone before
    /// the watch in about a third of the handoffs. A node this session may
    /// not read (another client's ACL) is refused with
    /// [`Error::PermissionDenied`]: the server delivers a watch's events
    /// only to a session that may read the node, so a wait on it would never
    /// end. An election candidate's node (its value may be large) gets an
    /// exists-watch, as does this session's own node, which is there all
    /// along (the watch a holder keeps).
    ///
    /// Boxed by a plain function: `wait_gone`'s future, which every held
    /// lock keeps for as long as it is held, then keeps no room for this
    /// request, only for the wait on the watch (DESIGN §8).
    fn watch_existing<'a>(&'a self, entry: &'a Entry, own: bool) -> Watching<'a> {
        Box::pin(async move {
            // The client clone is dropped before the wait, as in
            // `wait_for_entry`.
            let client = self.client().map_err(|error| (error, None))?;
            // Whether the connection changed while the request was out.
            let mut connection = client.state_watcher();
            connection.state();
            let gone = |mut connection: zookeeper_client::StateWatcher| async move {
                let across_reconnection = tokio::time::timeout(Duration::ZERO, connection.changed()).await.is_ok();
                Ok(Watched::Gone { across_reconnection })
            };
            if !own && entry.kind != EntryKind::Election {
                match client.get_and_watch_data(&entry.key).await {
                    Ok((_, _, watcher)) => return Ok(Watched::Set(watcher)),
                    Err(ZkError::NoNode) => return gone(connection).await,
                    // Not allowed to read it: the server sends a watch's
                    // events only to a session that may read the node, so
                    // no watch of ours would ever fire (an exists-watch is
                    // accepted and stays silent). Refused, as Curator's
                    // waiter is, rather than a wait for ever.
                    Err(ZkError::NoAuth) => return Err((unreadable(&entry.key), None)),
                    Err(error) => return Err((self.err(error), Some(client.state_watcher()))),
                }
            }
            let (stat, watcher) = client
                .check_and_watch_stat(&entry.key)
                .await
                .map_err(|e| (self.err(e), Some(client.state_watcher())))?;
            match stat {
                Some(_) => Ok(Watched::Set(watcher)),
                None => gone(connection).await,
            }
        })
    }

    /// Deletes one of this session's nodes as a release: one `multi` that
    /// first sets the node's data (to [`RELEASE_MARK`]) and then deletes it.
    /// A contender waiting on the node is woken by the data change, and
    /// finds the node gone at the read it makes next: that tells it the node
    /// was released. A node that goes with its session (expired, closed
    /// without `close()`) is deleted without the change: its waiters hear
    /// `NodeDeleted` (see [`ZkSession::departure`]). The same one request as
    /// a plain delete; the data change needs WRITE on the node, which the
    /// session's own ACL policy always gives it, and nothing is written
    /// outside the node. Returns whether it deleted the node.
    ///
    /// The request is sent when this function is called, not when its
    /// future is first polled, so `close()` can send several at once.
    ///
    /// An election candidate's node is deleted without the mark (`marked`
    /// false): Curator's `LeaderLatch` wakes only on `NodeDeleted`, so a
    /// latch queued behind a lockline candidate would miss a data change and
    /// wait for ever.
    fn release_node<'a>(
        &'a self,
        client: &'a Client,
        key: &'a str,
        marked: bool,
    ) -> impl std::future::Future<Output = Result<bool>> + Send + 'a {
        let mut multi = client.new_multi_writer();
        let built = if marked {
            multi.add_set_data(key, RELEASE_MARK, None)
        } else {
            Ok(())
        };
        let built = built.and_then(|()| multi.add_delete(key, None));
        let sent = built.map(|()| multi.commit());
        async move {
            let outcome = match sent {
                Ok(commit) => commit.await,
                Err(error) => return Err(self.err_on(error, "delete", key)),
            };
            match outcome {
                Ok(_) => Ok(true),
                Err(MultiWriteError::OperationFailed {
                    source: ZkError::NoNode,
                    ..
                }) => Ok(false),
                // Not allowed to change the node's data (an ACL set on it
                // since): delete it plainly; a waiter takes that for a loss,
                // which only delays it.
                Err(MultiWriteError::OperationFailed {
                    index: 0,
                    source: ZkError::NoAuth,
                }) => match client.delete(key, None).await {
                    Ok(()) => Ok(true),
                    Err(ZkError::NoNode) => Ok(false),
                    Err(error) => Err(self.err_on(error, "delete", key)),
                },
                Err(MultiWriteError::OperationFailed { source, .. } | MultiWriteError::RequestFailed { source }) => {
                    Err(self.err_on(source, "delete", key))
                }
            }
        }
    }

    /// Remembers how a wait on another contender's node ended, when the
    /// session has a lock-delay (nobody asks otherwise); forgets wakes too
    /// old to count.
    fn note_wake(&self, key: &str, marked: bool) {
        let now = Instant::now();
        let mut wakes = lock(&self.wakes);
        let memory = self.wake_memory;
        wakes.retain(|_, wake| now.saturating_duration_since(wake.at) < memory);
        wakes.insert(key.to_owned(), Wake { at: now, marked });
    }

    /// Hands this session's nodes over before the session ends: deletes
    /// each with the release mark, all requests sent at once, waiting at
    /// most `within` for the answers. A node left (the server did not answer
    /// in time) goes with the session, and its waiters take that for a loss.
    async fn hand_over(&self, client: &Client, within: Duration) {
        let keys: Vec<String> = lock(&self.held).drain().collect();
        if keys.is_empty() {
            return;
        }
        let releases: Vec<_> = keys.iter().map(|key| self.release_node(client, key, true)).collect();
        let answered = tokio::time::timeout(within, async {
            for (key, release) in keys.iter().zip(releases) {
                if let Err(error) = release.await {
                    tracing::debug!(session = %self.id, %key, %error, "node not handed over before the close");
                }
            }
        })
        .await;
        if answered.is_err() {
            tracing::debug!(session = %self.id, ?within, "hand-over before the close not answered in time");
        }
    }

    /// The node an earlier try of this append created, if any: found by its
    /// attempt id. Any further node of the attempt (there should be none) is
    /// deleted, so one attempt never holds two places in the queue. Errors are
    /// returned, never taken for "no node": the caller would create a second one.
    async fn find_attempt(&self, client: &Client, dir: &str, attempt: &str) -> Result<Option<(String, i64, i32)>> {
        // After a lost answer the client may have reconnected to a member that
        // has not applied the create yet: catch it up with the leader first.
        match client.sync(dir).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(error) => return Err(self.err_on(error, "read", dir)),
        }
        let mine: Vec<Contender> = self
            .children(client, dir)
            .await?
            .into_iter()
            .filter(|c| c.attempt.as_deref() == Some(attempt))
            .collect();
        let Some((first, extra)) = mine.split_first() else {
            return Ok(None);
        };
        for node in extra {
            let path = format!("{dir}/{}", node.name);
            match client.delete(&path, None).await {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(error) => return Err(self.err_on(error, "delete", &path)),
            }
        }
        let path = format!("{dir}/{}", first.name);
        match client.check_stat(&path).await {
            Ok(Some(stat)) => {
                if format!("{:x}", stat.ephemeral_owner) != self.id {
                    return Err(Error::backend(
                        crate::error::BACKEND,
                        format!("node {path:?} carries this attempt's id but another session owns it"),
                    ));
                }
                Ok(Some((path, stat.czxid, first.sequence)))
            }
            // Gone since the listing (deleted by someone else): make a new one.
            Ok(None) => Ok(None),
            Err(error) => Err(self.err_on(error, "read", &path)),
        }
    }

    async fn children(&self, client: &Client, dir: &str) -> Result<Vec<Contender>> {
        match client.list_children(dir).await {
            Ok(children) => Ok(layout::contenders(&children)),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(error) => Err(self.err_on(error, "read", dir)),
        }
    }

    /// As [`create`](Self::create), with the directory's listing requested
    /// right behind the create, in the same round trip; the listing goes to
    /// `listed` when the first create succeeded (a missing directory takes
    /// the slow way, and no listing).
    async fn create_and_list(
        &self,
        client: &Client,
        prefix: &str,
        dir: &str,
        value: &[u8],
        listed: &mut Option<Result<Vec<Contender>>>,
    ) -> Result<(String, i64)> {
        let node = CreateMode::EphemeralSequential.with_acls(Acls::new(&self.acls));
        // Both requests are sent here, in this order; then both answers awaited.
        let created = client.create(prefix, value, &node);
        let children = client.list_children(dir);
        let (created, children) = tokio::join!(created, children);
        match created {
            Ok((stat, sequence)) => {
                *listed = Some(match children {
                    Ok(children) => Ok(layout::contenders(&children)),
                    Err(ZkError::NoNode) => Ok(Vec::new()),
                    Err(error) => Err(self.err_on(error, "read", dir)),
                });
                Ok((format!("{prefix}{sequence}"), stat.czxid))
            }
            Err(ZkError::NoNode) => self.create(client, prefix, dir, value).await,
            Err(error) => Err(self.err_on(error, "queue on", dir)),
        }
    }

    /// Creates the ephemeral-sequential node, creating missing parents as
    /// container nodes (deleted by the server once empty), all with the
    /// policy's ACLs.
    async fn create(&self, client: &Client, prefix: &str, dir: &str, value: &[u8]) -> Result<(String, i64)> {
        let node = CreateMode::EphemeralSequential.with_acls(Acls::new(&self.acls));
        for _ in 0..3 {
            match client.create(prefix, value, &node).await {
                Ok((stat, sequence)) => return Ok((format!("{prefix}{sequence}"), stat.czxid)),
                // The directory is missing (never made, or a container the
                // server just cleaned up): make it and try again.
                Err(ZkError::NoNode) => {
                    let parent = CreateMode::Container.with_acls(Acls::new(&self.acls));
                    match client.mkdir(dir, &parent).await {
                        Ok(()) | Err(ZkError::NodeExists) => {}
                        Err(error) => return Err(self.err_on(error, "create", dir)),
                    }
                }
                Err(error) => return Err(self.err_on(error, "queue on", dir)),
            }
        }
        Err(Error::backend(
            crate::error::BACKEND,
            format!("the lock directory {dir:?} kept disappearing while creating an entry"),
        ))
    }

    /// An attempt known to have no node: abandoning it is a no-op.
    fn settle_refused(&self, attempt: &str) {
        lock(&self.uncertain).remove(attempt);
        lock(&self.refused).insert(attempt.to_owned());
    }

    fn mine(contenders: &[Contender], key: &str, dir: &str) -> bool {
        contenders.iter().any(|c| format!("{dir}/{}", c.name) == key)
    }

    /// Counts a write of this session to a lock directory, now and when the
    /// returned guard is dropped: a kept queue read before either never
    /// answers a read after it (see [`take_fresh`](Self::take_fresh)).
    fn writing(&self) -> Writing<'_> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        Writing(&self.writes)
    }

    /// After the data of another contender's lock-mode node changed: one
    /// multi-read of the whole queue, the node's data with it, in the round
    /// trip a read of the node alone would take. `None` when the node is
    /// gone, as a release leaves it (it marks the node and deletes it in one
    /// transaction); the queue is then kept for the `read_queue` the core
    /// makes next, which so costs no request. Otherwise the node's data.
    async fn read_after_change(&self, client: &Client, entry: &Entry) -> Result<Option<Vec<u8>>> {
        let dir = dir_of(&entry.key);
        let name = entry.key.rsplit('/').next().unwrap_or_default();
        let mut guess = lock(&self.queues)
            .get(dir)
            .map(|memo| memo.children.clone())
            .unwrap_or_default();
        if !guess.iter().any(|g| g == name) {
            guess.push(name.to_owned());
        }
        let writes = self.writes.load(Ordering::SeqCst);
        let snapshot = self.snapshot(client, dir, &guess).await?;
        let present = snapshot.contenders.iter().any(|c| c.name == name);
        let data = snapshot.read.get(name).map(|(data, _)| data.clone());
        let queue = self.remember_snapshot(dir, snapshot);
        if !present {
            if let Ok(queue) = queue {
                if let Some(memo) = lock(&self.queues).get_mut(dir) {
                    memo.fresh = Some((Instant::now(), writes, queue));
                }
            }
            return Ok(None);
        }
        // Listed, so read in the same snapshot.
        data.map(Some).ok_or_else(|| {
            Error::backend(
                crate::error::BACKEND,
                format!("{:?} was listed but not read in one multi-read", entry.key),
            )
        })
    }
}

/// The directory of an entry: its key less the node name.
fn dir_of(key: &str) -> &str {
    key.rfind('/').map_or(key, |at| &key[..at])
}

/// Whether a release of a node of `kind` carries the release mark (see
/// `ZkSession::release_node`): every kind but an election candidate.
fn marks(kind: EntryKind) -> bool {
    kind != EntryKind::Election
}

fn conflicting(contenders: &[Contender], conflicts: Conflicts) -> impl Iterator<Item = &Contender> {
    contenders.iter().filter(move |c| conflicts.includes(c.kind))
}

#[async_trait]
impl BackendSession for ZkSession {
    fn id(&self) -> &str {
        &self.id
    }

    fn state(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    /// One round trip: create the node, and list the directory right behind
    /// it (two when the directory must be created first).
    ///
    /// Exactly one node per attempt, whatever step fails: the attempt stays
    /// "uncertain" until the append has fully succeeded, and a retry of an
    /// uncertain attempt looks for its node (by the attempt id in its name)
    /// before creating one; a failed look-up fails the retry, never creates.
    async fn append(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        fits(request.value.len(), request.dir)?;
        let client = self.client()?;
        let dir = layout::dir_path(request.dir);
        let _writing = self.writing();
        let prefix = layout::node_prefix(&dir, request.kind, request.attempt);
        let retried = lock(&self.uncertain).contains(request.attempt);
        let found = if retried {
            self.find_attempt(&client, &dir, request.attempt).await?
        } else {
            None
        };
        // The listing, sent right behind the create when there is one: the
        // server applies a session's requests in order, so it shows the new
        // node, and the acquire costs one round trip instead of two.
        let mut listed = None;
        let (key, czxid, sequence) = match found {
            Some(found) => found,
            None => {
                lock(&self.uncertain).insert(request.attempt.to_owned());
                let (key, czxid) = match self
                    .create_and_list(&client, &prefix, &dir, request.value, &mut listed)
                    .await
                {
                    Ok(created) => created,
                    // The server refused: no node was made (a session's
                    // requests are applied in order, so no earlier try of the
                    // attempt is still on its way either).
                    Err(error @ Error::PermissionDenied { .. }) => {
                        self.settle_refused(request.attempt);
                        return Err(error);
                    }
                    Err(error) => return Err(error),
                };
                let sequence = layout::parse(key.rsplit('/').next().unwrap_or_default())
                    .map(|c| c.sequence)
                    .ok_or_else(|| Error::backend(crate::error::BACKEND, format!("unexpected node name {key:?}")))?;
                (key, czxid, sequence)
            }
        };
        let entry = Entry {
            key,
            kind: request.kind,
            order: i64::from(sequence),
            token: FencingToken::new(u64::try_from(czxid).unwrap_or(0)),
            owner: Some(self.id.clone()),
        };
        let contenders = match listed {
            Some(listed) => listed,
            None => self.children(&client, &dir).await,
        };
        let contenders = match contenders {
            Ok(contenders) => contenders,
            // Allowed to queue but not to read the queue: take the node back
            // at once rather than leave it to a cleanup that cannot list. The
            // refusal tells the core there is nothing to clean up, so a node
            // that cannot be deleted either (no DELETE on the directory) would
            // block the queue for as long as the session lives: end the
            // session instead, and the server deletes the node.
            Err(error @ Error::PermissionDenied { .. }) => {
                match client.delete(&entry.key, None).await {
                    Ok(()) | Err(ZkError::NoNode) => self.settle_refused(request.attempt),
                    Err(delete) => {
                        tracing::warn!(
                            key = %entry.key,
                            error = %delete,
                            "cannot delete a node whose directory may not be read; ending the session so that the server deletes it"
                        );
                        drop(client);
                        self.give_up("the server refused to remove a node of a refused acquire");
                    }
                }
                return Err(error);
            }
            Err(error) => return Err(error),
        };
        lock(&self.uncertain).remove(request.attempt);
        if marks(request.kind) {
            lock(&self.held).insert(entry.key.clone());
        }
        if request.kind == EntryKind::Dlm {
            // The resource's next read reads these nodes' data with the
            // listing, in one request.
            self.remember_queue(&dir, Some(contenders.iter().map(|c| c.name.clone()).collect()), None);
        }
        let mut nearest: Vec<Entry> = conflicting(&contenders, request.conflicts)
            .filter(|c| layout::precedes(c, sequence))
            .map(|c| c.entry(&dir))
            .collect();
        nearest.reverse();
        nearest.truncate(request.nearest);
        // The listing must show my own node, or it raced with its deletion: let
        // the core look again.
        let nearest = Self::mine(&contenders, &entry.key, &dir).then_some(nearest);
        Ok(Appended { entry, nearest })
    }

    /// One round trip: list the directory; my node must be among the children.
    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let client = self.client()?;
        let dir = dir_of(&entry.key);
        let contenders = self.children(&client, dir).await?;
        if !Self::mine(&contenders, &entry.key, dir) {
            return Ok(Earlier::Gone);
        }
        let Ok(order) = i32::try_from(entry.order) else {
            return Err(Error::backend(
                crate::error::BACKEND,
                format!("entry {:?} has no ZooKeeper sequence number", entry.key),
            ));
        };
        let mut nearest: Vec<Entry> = conflicting(&contenders, conflicts)
            .filter(|c| layout::precedes(c, order))
            .map(|c| c.entry(dir))
            .collect();
        nearest.reverse();
        nearest.truncate(count);
        Ok(Earlier::Entries(nearest))
    }

    /// Two round trips whatever the queue length: list the directory, then
    /// read every contender's stat (token, owner) in one multi-read.
    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let client = self.client()?;
        let dir = layout::dir_path(dir);
        let contenders = self.children(&client, &dir).await?;
        if contenders.is_empty() {
            return Ok(Vec::new());
        }
        let mut entries: Vec<Entry> = contenders.iter().map(|c| c.entry(&dir)).collect();
        let mut reader = client.new_multi_reader();
        for entry in &entries {
            reader.add_get_data(&entry.key).map_err(|e| self.err(e))?;
        }
        let results = reader.commit().await.map_err(|e| self.err_on(e, "read", &dir))?;
        let mut listed = Vec::with_capacity(entries.len());
        for (mut entry, result) in entries.drain(..).zip(results) {
            match result {
                MultiReadResult::Data { stat, .. } => {
                    entry.token = FencingToken::new(u64::try_from(stat.czxid).unwrap_or(0));
                    entry.owner = (stat.ephemeral_owner != 0).then(|| format!("{:x}", stat.ephemeral_owner));
                    listed.push(entry);
                }
                // Gone since the listing: not a contender any more.
                MultiReadResult::Error { err: ZkError::NoNode } => {}
                MultiReadResult::Error { err } => return Err(self.err_on(err, "read", &entry.key)),
                _ => {}
            }
        }
        Ok(listed)
    }

    /// A children watch on the directory (or an exists-watch while it is
    /// missing) until a contender appears.
    async fn wait_for_entry(&self, dir: &str) -> Result<()> {
        let dir = layout::dir_path(dir);
        loop {
            // No clone of the client is kept while the watch waits: `close()`
            // ends the session by dropping the last one.
            let client = self.client()?;
            let watcher = match client.list_and_watch_children(&dir).await {
                Ok((children, watcher)) => {
                    if !layout::contenders(&children).is_empty() {
                        return Ok(());
                    }
                    watcher
                }
                Err(ZkError::NoNode) => match client.check_and_watch_stat(&dir).await {
                    Ok((Some(_), _)) => continue,
                    Ok((None, watcher)) => watcher,
                    Err(error) => return Err(self.err(error)),
                },
                Err(error) => return Err(self.err_on(error, "read", &dir)),
            };
            drop(client);
            let event = watcher.changed().await;
            if event.event_type == EventType::Session {
                return Err(match event.session_state {
                    ZkState::Closed => Error::Closed {
                        session: self.id.clone(),
                    },
                    _ => self.err(ZkError::SessionExpired),
                });
            }
        }
    }

    /// One round trip: an exists-watch on the node (which also tells whether
    /// it is still there), then its event.
    ///
    /// On this session's own node (the watch a holder keeps), only its
    /// deletion ends the wait: a change of its data (an election's proclaim,
    /// a lock-delay mark) is watched past, and so it is on an election
    /// candidate's node (released without the mark). On another contender's
    /// node, a change of its data ends the wait too: a release changes the node's
    /// data and deletes it in one transaction (see `release_node`), and the
    /// one-shot watch hears only the change; the core's read after the wait
    /// then finds the node gone, or waits on it again when it is still
    /// there (a proclaim, a mark). With a lock-delay, how the wait ended is
    /// remembered for [`departure`](BackendSession::departure).
    ///
    /// A watch request that fails for want of a connection is sent again
    /// once the client has reconnected (the session's own tracking ends the
    /// wait if it is lost meanwhile), so that a wait ends only by what
    /// happened to the node, and `departure` can say how it went.
    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let own = entry.owner.as_deref() == Some(self.id.as_str());
        let remember = !own && !self.options.lock_delay().is_zero();
        if remember {
            lock(&self.wakes).remove(&entry.key);
        }
        // Whether the watch had to be asked for again: a node found gone
        // then may have gone at any time since the read that named it.
        let mut retried = false;
        let mut backoff = WATCH_RETRY_PAUSE;
        loop {
            let watcher = match self.watch_existing(entry, own).await {
                Ok(watcher) => watcher,
                Err((error, state)) if error.is_transient() => {
                    tracing::debug!(key = %entry.key, %error, "watch request failed; asking again once connected");
                    reconnected(state, backoff).await;
                    backoff = (backoff * 2).min(WATCH_RETRY_MAX_PAUSE);
                    retried = true;
                    continue;
                }
                Err((error, _)) => return Err(error),
            };
            let watcher = match watcher {
                Watched::Set(watcher) => watcher,
                Watched::Gone { across_reconnection } => {
                    if own {
                        lock(&self.held).remove(&entry.key);
                    }
                    // Gone before the watch was set: between the read that
                    // named it and this request, one round trip when asked
                    // once on one connection. ZooKeeper keeps no trace of
                    // how (see `departure`).
                    if remember {
                        self.note_wake(&entry.key, !retried && !across_reconnection && marks(entry.kind));
                    }
                    return Ok(());
                }
            };
            // On this session's own node the watch outlives this wait when
            // it is dropped (see `OwnWatch`).
            let event = if own {
                OwnWatch::new(watcher).await
            } else {
                watcher.changed().await
            };
            match event.event_type {
                EventType::NodeDeleted => {
                    if own {
                        lock(&self.held).remove(&entry.key);
                    }
                    if remember {
                        self.note_wake(&entry.key, false);
                    }
                    return Ok(());
                }
                EventType::NodeDataChanged if !own && marks(entry.kind) => {
                    if remember {
                        self.note_wake(&entry.key, true);
                    }
                    return Ok(());
                }
                EventType::Session => {
                    return Err(match event.session_state {
                        ZkState::Closed => Error::Closed {
                            session: self.id.clone(),
                        },
                        _ => self.err(ZkError::SessionExpired),
                    })
                }
                // This session's own node's data changed, or an election
                // candidate's (a proclaim): watch again.
                _ => {}
            }
        }
    }

    /// An election candidate's node is released without the mark (see
    /// `release_node`), so a candidate after it takes a resignation for a
    /// loss and is held back for its lock-delay.
    ///
    /// Released when the wait on `gone` was ended by the release mark (its
    /// data changed, and the read right after found it gone: both in one
    /// transaction, as only a release does) within the last `wake_memory`;
    /// lost when its deletion alone ended the wait (its session expired or
    /// was closed without handing it over), or when the read came later
    /// than that.
    ///
    /// Why a late read is a loss: a node's data changes for other reasons
    /// too (an election's proclaim, a lock-delay mark), and the node may be
    /// lost after such a change and before the waiter's read. Only the
    /// node's own session changes its data, which resets that session's
    /// expiry, so the session cannot expire within its timeout of the
    /// change; a read within `wake_memory` (at most a second, at most half
    /// this session's timeout) cannot have seen such an expiry unless the
    /// holder's session timeout is that short, or an administrator ended the
    /// session from elsewhere in that instant.
    ///
    /// A node already gone when the wait set its watch is taken as released:
    /// it went within the round trip between the read that named it and the
    /// watch, and ZooKeeper keeps no trace of how. A lockline holder cut off
    /// from the server declares its loss a safety margin before the server
    /// expires it, so a loss landing in that round trip is also one whose
    /// holder has already stopped.
    fn departure(&self, gone: &Entry) -> Departure {
        let now = Instant::now();
        let wake = lock(&self.wakes).get(&gone.key).copied();
        match wake {
            Some(wake) if wake.marked && now.saturating_duration_since(wake.at) < self.wake_memory => {
                Departure::Released
            }
            Some(wake) if !wake.marked => Departure::Lost { noticed: wake.at },
            _ => Departure::Lost { noticed: now },
        }
    }

    /// Deletes the very node, with the release mark (see `release_node`):
    /// its path carries a unique attempt id and sequence, so no newer node
    /// can have it.
    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let client = self.client()?;
        let _writing = self.writing();
        let removed = self.release_node(&client, &entry.key, marks(entry.kind)).await;
        if removed.is_ok() {
            lock(&self.held).remove(&entry.key);
        }
        removed
    }

    async fn abandon(&self, dir: &str, kind: EntryKind, attempt: &str) -> Result<()> {
        if lock(&self.refused).remove(attempt) {
            return Ok(());
        }
        let client = self.client()?;
        let dir = layout::dir_path(dir);
        let _writing = self.writing();
        for contender in self.children(&client, &dir).await? {
            if contender.attempt.as_deref() == Some(attempt) {
                let path = format!("{dir}/{}", contender.name);
                self.release_node(&client, &path, marks(kind)).await?;
                lock(&self.held).remove(&path);
            }
        }
        lock(&self.uncertain).remove(attempt);
        Ok(())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<()> {
        fits(value.len(), &entry.key)?;
        let client = self.client()?;
        let _writing = self.writing();
        match client.set_data(&entry.key, value, None).await {
            Ok(_) => Ok(()),
            Err(ZkError::NoNode) => Err(Error::LockLost { key: entry.key.clone() }),
            Err(error) => Err(self.err_on(error, "write", &entry.key)),
        }
    }

    /// One `multi` that begins with a `check` (version -1: exists) of the
    /// entry's node, then creates, sets and deletes. Which of create or set a
    /// put needs, and whether a delete has anything to delete, is read just
    /// before in one multi-read; a node that appears or vanishes in between
    /// fails the `multi` (nothing applied) and the whole write is tried again.
    /// A put whose parent is missing creates the missing parents (persistent,
    /// empty, with the session's ACL policy) and tries again: parents are
    /// made outside the fence, as Curator's `creatingParentsIfNeeded` and
    /// kazoo's `ensure_path` make them; the write itself is fenced.
    async fn write_if_held(&self, entry: &Entry, writes: &[Write]) -> Result<bool> {
        self.write_fenced(entry, writes).await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.read_key(key).await
    }

    async fn get_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>> {
        let client = self.client()?;
        match client.get_data(&entry.key).await {
            Ok((data, _)) => Ok(Some(data)),
            Err(ZkError::NoNode) => Ok(None),
            Err(error) => Err(self.err_on(error, "read", &entry.key)),
        }
    }

    /// A data watch on the node (`getData`), then its event: `None` on
    /// `NodeDeleted`; on `NodeDataChanged` the node is read again (and
    /// watched again if its data is back to `seen`).
    ///
    /// On another session's lock-mode node, the read after a change is a
    /// multi-read of the whole queue, in the same one round trip: a release
    /// marks the node and deletes it in one transaction (see
    /// `release_node`), so that read finds it gone, and the queue it read is
    /// kept for the `read_queue` the core makes next (which then sends
    /// nothing). A handoff thus costs the event, one multi-read and the
    /// update, and with a lock-delay the wait remembers how the node went for
    /// [`departure`](BackendSession::departure): released when the read
    /// after its data changed found it gone (or when it was gone already at
    /// the first read, as `wait_gone` takes it), lost on `NodeDeleted`.
    ///
    /// The edge, on the side of a release: another session marked the
    /// node (a waiter telling the holder it blocks) and the holder was lost
    /// within the round trip after that mark; the read then finds the node
    /// gone after a change, as after a release.
    ///
    /// A request that fails for want of a connection is sent again once the
    /// client has reconnected (the session's own tracking ends the wait if
    /// it is lost meanwhile), as `wait_gone` does: the wait ends only by
    /// what happened to the node, and a node found gone after such a retry
    /// counts as lost.
    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        let own = entry.owner.as_deref() == Some(self.id.as_str());
        let whole_queue = !own && entry.kind == EntryKind::Dlm;
        let remember = whole_queue && !self.options.lock_delay().is_zero();
        if remember {
            lock(&self.wakes).remove(&entry.key);
        }
        // Whether the node's data changed since the caller's read, and
        // whether a request had to be sent again (a node found gone then may
        // have gone at any time since).
        let mut changed = false;
        let mut retried = false;
        let mut backoff = WATCH_RETRY_PAUSE;
        loop {
            // The client clone is dropped before the wait, as in
            // `wait_for_entry`.
            let client = self.client()?;
            let failed = if changed && whole_queue {
                match self.read_after_change(&client, entry).await {
                    Ok(None) => {
                        if remember {
                            self.note_wake(&entry.key, !retried);
                        }
                        return Ok(None);
                    }
                    Ok(Some(data)) if data != seen => return Ok(Some(data)),
                    // Back to what the caller saw: watch again.
                    Ok(Some(_)) => None,
                    Err(error) => Some(error),
                }
            } else {
                None
            };
            let watched = match failed {
                Some(error) => Err(error),
                None => {
                    // Whether the connection changed while the request was out.
                    let mut connection = client.state_watcher();
                    connection.state();
                    match client.get_and_watch_data(&entry.key).await {
                        Ok(found) => Ok(found),
                        Err(ZkError::NoNode) => {
                            if remember {
                                // Gone between the read that named it and
                                // this one: as `wait_gone` takes it (see
                                // `departure`).
                                let across_reconnection =
                                    tokio::time::timeout(Duration::ZERO, connection.changed()).await.is_ok();
                                self.note_wake(&entry.key, !retried && !across_reconnection);
                            }
                            return Ok(None);
                        }
                        Err(error) => Err(self.err_on(error, "read", &entry.key)),
                    }
                }
            };
            let (data, _, watcher) = match watched {
                Ok(found) => found,
                // Sent again once the client has reconnected (the session's
                // own tracking ends the wait if it is lost meanwhile), so
                // that the wait ends only by what happened to the node.
                Err(error) if error.is_transient() => {
                    tracing::debug!(key = %entry.key, %error, "value watch failed; asking again once connected");
                    let state = client.state_watcher();
                    drop(client);
                    reconnected(Some(state), backoff).await;
                    backoff = (backoff * 2).min(WATCH_RETRY_MAX_PAUSE);
                    retried = true;
                    continue;
                }
                Err(error) => return Err(error),
            };
            drop(client);
            if data != seen {
                return Ok(Some(data));
            }
            let event = watcher.changed().await;
            match event.event_type {
                EventType::NodeDeleted => {
                    if remember {
                        self.note_wake(&entry.key, false);
                    }
                    return Ok(None);
                }
                EventType::Session => {
                    return Err(match event.session_state {
                        ZkState::Closed => Error::Closed {
                            session: self.id.clone(),
                        },
                        _ => self.err(ZkError::SessionExpired),
                    })
                }
                _ => changed = true,
            }
        }
    }

    /// One round trip when the contenders are those this session last saw
    /// under the name (by its last `read_queue`, or the listing of its
    /// append there), two otherwise: a multi-read of the directory's
    /// children, the value block (`<dir>/lockline-value-block`) and the data
    /// and stat of every child it expects. The answer is one snapshot (the
    /// server runs a multi-read between writes); it is used only if every
    /// contender the listing shows had its data read in it, else the read is
    /// sent again with the names just listed. A child gone since the
    /// listing the guess came from simply reads as missing.
    ///
    /// `version` is the node's data version, `changed` its `mzxid`, the
    /// entry's token its `czxid` and its owner the ephemeral owner.
    async fn read_queue(&self, dir: &str) -> Result<Queue> {
        self.read_dlm_queue(dir).await
    }

    /// One round trip: one `multi` of a version check on every entry named
    /// (`check` or `setData` with the version read; version -1, "exists",
    /// for an entry in `present`; a deleted entry is released as
    /// `release_node` does, its data set to the release mark at that version,
    /// then deleted), then the value block's `setData` (with a `create`
    /// before it at its first write). All its operations share the
    /// transaction's zxid, which is the token: the `mzxid` of its first
    /// `setData`. An update of checks alone creates, sets and deletes the
    /// stamp node `<dir>/lockline-stamp` in the same `multi`, for a `setData`
    /// stat (ZooKeeper answers a check without one, and some servers answer
    /// a create inside a `multi` without its stat).
    ///
    /// A failed check, set or delete (the node is gone, or at another
    /// version) fails the whole `multi`: `Ok(None)`, nothing written. An
    /// entry is identified by its path, which carries its attempt id and
    /// sequence number: a node deleted and made again under the same path
    /// would need the same attempt to get the same sequence number in a
    /// directory made anew, which lockline never does. Whether the block's
    /// node exists is guessed from the last read; a wrong guess fails the
    /// `multi` at the block's operation and it is sent again with the other.
    async fn update_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        self.update_dlm_queue(update).await
    }

    /// Asks the server: one request that needs a live session. Past the loss
    /// deadline the session is lost whatever the answer would be.
    async fn confirm(&self) -> Result<SessionState> {
        let current = *self.state.borrow();
        if current.is_over() {
            return Ok(current);
        }
        if Instant::now() >= self.liveness.deadline() {
            self.mark_lost("not confirmed within the loss deadline");
            return Ok(SessionState::Lost);
        }
        let client = self.client()?;
        let sent = Instant::now();
        match client.sync("/").await {
            Ok(()) => self.liveness.confirm(sent),
            Err(error) => return Err(self.err(error)),
        }
        Ok(*self.state.borrow())
    }

    /// Drops the client, which closes the ZooKeeper session: the server
    /// deletes its ephemeral nodes whatever their ACLs.
    ///
    /// A copy of the client held by a request still in flight (a future of
    /// the session parked unpolled mid-request) would keep the session open,
    /// so it is also closed from a second connection.
    fn give_up(&self, why: &str) {
        let session = self.session_info();
        self.mark_lost(why);
        if let Some(session) = session {
            tokio::spawn(crate::connect::close_remotely(
                self.backend.clone(),
                self.options.clone(),
                session,
            ));
        }
    }

    async fn close(&self) -> Result<()> {
        // Dropping the last client closes the ZooKeeper session, which deletes
        // its ephemeral nodes: the client library sends `CloseSession` and
        // reports `Closed` once the server has answered it.
        let timeout = self.options.request_timeout();
        let bound = timeout.saturating_sub(CLOSE_MARGIN).max(timeout / 2);
        let started = Instant::now();
        // A clean hand-over: the session's nodes are deleted with the
        // release mark first, so that lock-delayed waiters do not take the
        // close for a loss (the server deletes what is left the same way as
        // on expiry). Within half the bound, leaving the rest for the close.
        let client = lock(&self.client).clone();
        if let Some(client) = client {
            if *self.state.borrow() == SessionState::Live {
                self.hand_over(&client, bound / 2).await;
            }
        }
        let watcher = lock(&self.client).as_ref().map(Client::state_watcher);
        end(&self.client);
        self.tracker.abort();
        // A session already lost stays lost: closing it does not undo that.
        advance(&self.state, SessionState::Closed);
        // Answered in a round trip. Within the core's own bound (the request
        // timeout), so that the error can say what may hold the session.
        let remaining = bound.saturating_sub(started.elapsed());
        let confirmed = match watcher {
            Some(mut watcher) => {
                let closed = async {
                    loop {
                        match watcher.state() {
                            ZkState::Closed => return true,
                            // The client library also reports these on its
                            // own (its reconnect deadline passed): not a word
                            // from the server.
                            ZkState::Expired | ZkState::AuthFailed => return false,
                            _ => {}
                        }
                        watcher.changed().await;
                    }
                };
                tokio::time::timeout(remaining, closed).await.unwrap_or(false)
            }
            // Lost (or given up) before: its client was let go then.
            None => false,
        };
        if confirmed {
            return Ok(());
        }
        // Not confirmed by the first connection: attach with the session's
        // id and password from a second one, which the server answers with
        // "expired" once the session is gone.
        let remaining = bound.saturating_sub(started.elapsed());
        let remote = crate::connect::close_remotely(self.backend.clone(), self.options.clone(), self.info.clone());
        if tokio::time::timeout(remaining, remote).await.unwrap_or(false) {
            return Ok(());
        }
        Err(Error::unavailable(
            crate::error::BACKEND,
            format!(
                "the close of session {} was not confirmed within {bound:?}: the server is unreachable \
                 (the session then ends when its timeout runs out), or a request of this session is \
                 still in flight in a future that was polled and set aside (the session then stays \
                 open until that future is dropped)",
                self.id
            ),
        ))
    }
}

/// A request in flight that confirms the session: its send time and answer.
type Ping = std::pin::Pin<Box<dyn std::future::Future<Output = std::result::Result<(), ZkError>> + Send>>;

/// Keeps the session's state: a confirming request (a `sync`, which goes
/// through the leader) every `interval`, whose answer moves the confirmation
/// forward (see [`Liveness`]); `Lost`
/// once the loss deadline passes from the last confirmation (whatever the
/// client library reports, which under a silent partition comes only after its
/// own connection timeout); `Suspended` while a confirmation is overdue or the
/// client is disconnected; `Lost` on expiry or failed authentication. A lost
/// session is ended on the server as soon as it can be reached.
async fn track(
    client: Client,
    slot: Arc<StdMutex<Option<Client>>>,
    liveness: Arc<Liveness>,
    state: watch::Sender<SessionState>,
    interval: Duration,
) {
    let mut watcher = client.state_watcher();
    let mut over = state.subscribe();
    let retry = interval.min(Duration::from_millis(250));
    let mut next_ping = Instant::now() + interval;
    let mut ping: Option<(Instant, Ping)> = None;
    let ended = loop {
        let deadline = liveness.deadline();
        let overdue = ping.as_ref().map(|(sent, _)| *sent + interval);
        let idle = ping.is_none();
        let answer = async {
            match ping.as_mut() {
                Some((_, request)) => request.as_mut().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(deadline) => {
                if Instant::now() >= liveness.deadline() {
                    tracing::warn!(
                        loss_deadline = ?liveness.loss_deadline,
                        "ZooKeeper session not confirmed within the loss deadline; declaring it lost"
                    );
                    break SessionState::Lost;
                }
            }
            _ = over.wait_for(|s| s.is_over()) => break SessionState::Lost,
            next = watcher.changed() => match next {
                ZkState::SyncConnected | ZkState::ConnectedReadOnly => {
                    // Live again once a request confirms it; ask now.
                    next_ping = Instant::now();
                }
                ZkState::Disconnected => {
                    advance(&state, SessionState::Suspended);
                }
                ZkState::Closed => break SessionState::Closed,
                ZkState::AuthFailed => {
                    tracing::warn!("ZooKeeper rejected the session's credentials on reconnection; session lost");
                    break SessionState::Lost;
                }
                other => {
                    tracing::warn!(state = ?other, "ZooKeeper session expired");
                    break SessionState::Lost;
                }
            },
            answer = answer => {
                let sent = ping.take().map_or(deadline, |(sent, _)| sent);
                match answer {
                    Ok(_) => {
                        liveness.confirm(sent);
                        advance(&state, SessionState::Live);
                        next_ping = sent + interval;
                    }
                    Err(ZkError::SessionExpired) => break SessionState::Lost,
                    Err(ZkError::AuthFailed) => {
                        tracing::warn!("ZooKeeper rejected the session's credentials; session lost");
                        break SessionState::Lost;
                    }
                    Err(ZkError::ClientClosed) => break SessionState::Closed,
                    Err(error) => {
                        tracing::debug!(%error, "ZooKeeper session confirmation failed; retrying");
                        advance(&state, SessionState::Suspended);
                        next_ping = Instant::now() + retry;
                    }
                }
            }
            () = async {
                match overdue {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                // Unanswered for a whole interval: maybe lost. Keep waiting for
                // the answer (a late one still confirms its send time).
                advance(&state, SessionState::Suspended);
            }
            () = tokio::time::sleep_until(next_ping), if idle => {
                let confirming = client.clone();
                ping = Some((Instant::now(), Box::pin(async move { confirming.sync("/").await })));
            }
        }
    };
    advance(&state, ended);
    end(&slot);
}

/// The refusal of a wait behind `path`, a node this session may not read.
fn unreadable(path: &str) -> Error {
    Error::PermissionDenied {
        backend: crate::error::BACKEND,
        operation: "wait behind",
        key: path.to_owned(),
        reason: "the node ahead in the queue may not be read by this session's identity (ZooKeeper NoAuth on \
                 getData), and ZooKeeper delivers a watch's events only to a session that may read the node: \
                 every contender must be able to read the nodes it queues behind"
            .to_owned(),
    }
}
