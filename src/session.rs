//! Sessions: a liveness scope on the server, the background removal of
//! what guards and acquires leave behind, and what every recipe asks of a
//! session (names checked, calls bounded, errors told apart).
//!
//! Here the session and its public calls; in `end` where it stands and the
//! waits on its end; in `cleanup` the background removal; in `calls` what
//! every recipe asks of it; in `local_queue` the same-session queues.

mod calls;
mod cleanup;
mod end;
mod local_queue;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::stats::Counters;

use crate::{
    Backend, BackendSession, Contender, EntryKind, Error, FencingToken, LockMode, Result, SessionOptions, SessionState,
};

use cleanup::Orphan;
use end::{follow_end, EndSignal, Following};
use local_queue::LocalQueues;

/// A liveness scope on the server: an etcd lease kept alive by this process, or
/// a ZooKeeper session.
///
/// Everything a session creates is ephemeral: if the process dies, the server
/// deletes it once the TTL passes. One session serves any number of locks.
/// Cheap to clone; clones are the same session.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// use lockline::{Client, SessionState};
///
/// let session = Client::memory().session().await?;
/// assert_eq!(session.state(), SessionState::Live);
/// let _held = session.mutex("a")?.lock().await?;
/// session.close().await?; // releases everything the session held
/// assert_eq!(session.state(), SessionState::Closed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<SessionInner>,
}

pub(crate) struct SessionInner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) remote: Arc<dyn BackendSession>,
    pub(crate) options: SessionOptions,
    pub(crate) counters: Arc<Counters>,
    runtime: Handle,
    closed: AtomicBool,
    closed_tx: watch::Sender<bool>,
    /// The session's end, set by one task per session (see [`EndSignal`]).
    end: Arc<EndSignal>,
    background: watch::Sender<usize>,
    local_queues: std::sync::Mutex<LocalQueues>,
    orphans: std::sync::Mutex<Vec<Orphan>>,
    next_orphan: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id())
            .field("backend", &self.inner.backend.name())
            .field("state", &self.state())
            .finish()
    }
}

impl Session {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        remote: Arc<dyn BackendSession>,
        options: SessionOptions,
        counters: Arc<Counters>,
    ) -> Self {
        let runtime = Handle::current();
        let closed_tx = watch::Sender::new(false);
        let end = Arc::new(EndSignal::default());
        // Holds only receivers: it keeps neither the session nor its backend
        // session alive, and ends with the session.
        let gauge = crate::observe::SessionGauge::opened(Arc::clone(&counters), backend.name());
        runtime.spawn(follow_end(
            remote.state(),
            closed_tx.subscribe(),
            Following(Arc::clone(&end)),
            gauge,
        ));
        Session {
            inner: Arc::new(SessionInner {
                backend,
                remote,
                options,
                counters,
                runtime,
                closed: AtomicBool::new(false),
                closed_tx,
                end,
                background: watch::Sender::new(0),
                local_queues: std::sync::Mutex::default(),
                orphans: std::sync::Mutex::default(),
                next_orphan: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// The session's id: the etcd lease id in lowercase hex, the ZooKeeper
    /// session id in hex, a counter on the memory backend.
    pub fn id(&self) -> &str {
        self.inner.remote.id()
    }

    /// The options the session was opened with.
    pub fn options(&self) -> &SessionOptions {
        &self.inner.options
    }

    /// Where the session stands now.
    pub fn state(&self) -> SessionState {
        self.inner.state()
    }

    /// Every state the session moves through, as a `watch` receiver (closed
    /// sessions report `Closed` through [`state`](Self::state), not here).
    /// Use it to notice `Suspended` (connection trouble, locks maybe still
    /// held) before `Lost`.
    pub fn watch_state(&self) -> watch::Receiver<SessionState> {
        self.inner.remote.state()
    }

    /// Resolves when the session is over: `Lost` (expired, revoked, or not
    /// confirmed past the loss deadline) or `Closed`. Returns that state.
    ///
    /// Every lock the session held must then be assumed held by others.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes the state.
    pub async fn lost(&self) -> SessionState {
        self.inner.over().await
    }

    /// Every contender queued under `name`, whatever the recipe, from every
    /// client (etcdctl, Go's `concurrency`, Curator, kazoo), in queue order:
    /// holders first. One read; nothing is written.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockline::Result<()> {
    /// let session = lockline::Client::memory().session().await?;
    /// let _guard = session.mutex("jobs/nightly")?.lock().await?;
    /// let queue = session.queue("jobs/nightly").await?;
    /// assert_eq!(queue.len(), 1);
    /// assert_eq!(queue[0].token, _guard.token());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// As [`mutex`](Self::mutex), and [`Error::Unavailable`] or a backend
    /// error when the read fails.
    pub async fn queue(&self, name: &str) -> Result<Vec<Contender>> {
        self.inner.check_name(name)?;
        self.inner.contenders(name).await
    }

    /// Whether `sequencer` is current, as [`Client::check`](crate::Client::check)
    /// answers, read through this session: for a caller that opens a session
    /// for the check and closes it after (the `lockline check` command), where
    /// `Client::check` keeps one open for the next check. One read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// As [`queue`](Self::queue).
    pub async fn check(&self, sequencer: &crate::Sequencer) -> Result<bool> {
        if let crate::Mode::Lock(mode) = sequencer.mode() {
            return current(self, sequencer.name(), mode, sequencer.token()).await;
        }
        let entries = self.queue(sequencer.name()).await?;
        Ok(crate::wait::current(&entries, sequencer))
    }

    /// The value of `key` in the lock's own store (an etcd key, an absolute
    /// ZooKeeper path), or `None` when it does not exist: one plain read, to
    /// see what [`write_if_held`](crate::MutexGuard::write_if_held) wrote.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockline::Result<()> {
    /// let session = lockline::Client::memory().session().await?;
    /// assert_eq!(session.read("config/epoch").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a key the backend cannot store,
    /// [`Error::Closed`] or [`Error::SessionLost`] when the session is over,
    /// [`Error::Unavailable`] or a backend error when the read fails.
    pub async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.check_key(key)?;
        self.inner.check_usable()?;
        match self.inner.call(self.inner.remote.read(key)).await {
            Ok(value) => Ok(value),
            Err(error) => Err(self.inner.label(error)),
        }
    }

    /// Waits until every background release and cleanup this session started
    /// (guards dropped without `release()`, cancelled acquires) has finished.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes; the background work goes on.
    pub async fn flush(&self) {
        let mut rx = self.inner.background.subscribe();
        // The sender lives in `inner`, which `self` keeps alive: no error here.
        let _ = rx.wait_for(|pending| *pending == 0).await;
    }

    /// Closes the session on the server (revokes the lease, closes the ZooKeeper
    /// session): every lock it held is released at once and every call on it
    /// afterwards fails with [`Error::Closed`]. Closing twice is fine.
    ///
    /// Returns once the server has confirmed the close (etcd answered the
    /// revoke; ZooKeeper answered `CloseSession`; Redis deleted the session's
    /// entries and key), so a process may exit right after it without
    /// leaving its locks held until the TTL runs out. A confirmation that
    /// does not come within the request timeout is an
    /// [`Error::Unavailable`]; calling `close` again asks the server again
    /// (a lost or already closed session included), so `Ok` always means the
    /// server has confirmed.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the session is marked closed locally and the server ends it
    /// when its TTL passes.
    ///
    /// # Errors
    ///
    /// A backend error when the server could not be told; the session is closed
    /// locally all the same.
    pub async fn close(&self) -> Result<()> {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.closed_tx.send_replace(true);
        // Told here, not one task later: a held lock's monitor lets go of
        // the backend's watch at once (on ZooKeeper, a request in flight
        // there keeps the session open until it is dropped).
        let state = self.inner.state();
        self.inner.end.update(|cell| {
            cell.ended.get_or_insert(state);
        });
        let timeout = self.inner.options.request_timeout();
        match tokio::time::timeout(timeout, self.inner.remote.close()).await {
            Ok(result) => result,
            Err(_) => Err(Error::unavailable(
                self.inner.backend.name(),
                format!(
                    "the server did not confirm the close of session {} within {timeout:?}; \
                     what it held is released when its TTL runs out",
                    self.id()
                ),
            )),
        }
    }

    /// The backend session underneath, for backend-specific inspection.
    pub fn backend_session(&self) -> &Arc<dyn BackendSession> {
        &self.inner.remote
    }
}

/// Whether the holder of a `lock-MODE` sequencer with `token` still holds
/// `name` in that mode: its entry is granted in it with that token.
async fn current(session: &Session, name: &str, mode: LockMode, token: FencingToken) -> Result<bool> {
    let inner = &session.inner;
    inner.check_usable()?;
    let queue = inner.call(inner.remote.read_queue(name)).await?;
    Ok(queue.slots.iter().any(|slot| {
        let state = crate::mode_rule::State::decode(&slot.value, slot.changed);
        slot.entry.kind == EntryKind::Dlm && state.granted == Some(mode) && state.token == token.get()
    }))
}
