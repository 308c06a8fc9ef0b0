//! The entry point: a [`Client`] on one cluster through one backend, which
//! opens sessions, keeps the counters of what they did and checks
//! sequencers.

use std::fmt;
use std::sync::Arc;

use crate::stats::Counters;
use crate::{Backend, ClientStats, Error, Result, Session, SessionOptions};

/// The entry point: a handle on one cluster through one backend.
///
/// Cheap to clone (an `Arc`); clones share the backend and the counters. Open a
/// [`Session`] to take locks.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// let client = lockline::Client::memory();
/// let session = client.session().await?;
/// let guard = session.mutex("jobs/nightly")?.lock().await?;
/// println!("holding with fencing token {}", guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    backend: Arc<dyn Backend>,
    counters: Arc<Counters>,
    /// The session [`check`](Client::check) reads through, opened at the
    /// first check and kept for the next ones (shared by clones).
    checker: Arc<tokio::sync::Mutex<Option<Session>>>,
}

impl Client {
    /// Checks a lock name as a session of this client would, without a
    /// server: for loops that must refuse a bad name before they connect.
    pub(crate) fn check_name(&self, name: &str) -> Result<()> {
        crate::name::validate(name)?;
        self.backend.validate_name(name)
    }

    /// Whether `name` is a lock name this client's sessions accept (the
    /// core's rules and the backend's own), decided here, without a
    /// server: for a program that must refuse a bad name before it
    /// connects.
    ///
    /// ```
    /// let client = lockline::Client::memory();
    /// assert!(client.validate_name("jobs/nightly").is_ok());
    /// assert!(matches!(client.validate_name("jobs//nightly"), Err(lockline::Error::InvalidName { .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] saying what is wrong with it.
    pub fn validate_name(&self, name: &str) -> Result<()> {
        self.check_name(name)
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client over any backend.
    pub fn new(backend: impl Backend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A client over a shared backend.
    pub fn from_arc(backend: Arc<dyn Backend>) -> Self {
        Client {
            backend,
            counters: Arc::default(),
            checker: Arc::default(),
        }
    }

    /// The backend's name (`memory`, `etcd`, `zookeeper`).
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// What this client's sessions have done so far.
    pub fn stats(&self) -> ClientStats {
        self.counters.snapshot()
    }

    /// Waits until this client's counters satisfy `predicate`, and returns them.
    ///
    /// Lets a test or a demo await an event ("the third contender has queued",
    /// "two waiters were woken") instead of sleeping.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockline::Result<()> {
    /// let client = lockline::Client::memory();
    /// let session = client.session().await?;
    /// let holder = session.mutex("q")?.lock().await?;
    /// let other = client.session().await?;
    /// let waiter = tokio::spawn(async move { other.mutex("q")?.lock().await });
    /// client.wait_for_stats(|s| s.appends == 2).await; // the waiter is queued
    /// holder.release().await?;
    /// waiter.await.expect("task")?.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn wait_for_stats(&self, predicate: impl FnMut(&ClientStats) -> bool) -> ClientStats {
        self.counters.wait_for(predicate).await
    }

    /// Asks the server whether `sequencer` is still current: whether the
    /// entry it names still exists under its lock's name with its fencing
    /// token, and holds by the wait rule (first in the queue for a mutex, a
    /// write lock or a leadership; no earlier write entry for a read lock;
    /// fewer than its permits of earlier entries for a semaphore permit) as
    /// the server answers. One read of the lock's queue: linearizable on
    /// etcd (a quorum read), on Redis (one node's state) and on PostgreSQL
    /// and MariaDB (the primary); on ZooKeeper as current as the server the
    /// client is connected to, which may lag the leader slightly; on the
    /// memory backend exact.
    ///
    /// A resource that cannot remember the highest token it accepted asks
    /// this before acting for a holder ([Chubby's
    /// `CheckSequencer`](crate::Sequencer)); it needs no session of its own:
    /// the client opens one at its first check and keeps it for the next.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockline::Result<()> {
    /// let client = lockline::Client::memory();
    /// let holder = client.session().await?;
    /// let guard = holder.mutex("jobs/report")?.lock().await?;
    /// let sequencer = guard.sequencer().to_string(); // sent to the resource
    /// // The resource, with a client of its own on the same cluster:
    /// assert!(client.check(&sequencer.parse()?).await?);
    /// guard.release().await?;
    /// assert!(!client.check(&sequencer.parse()?).await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (a session opened for it is kept).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name the backend cannot store;
    /// [`Error::Unavailable`] when the cluster cannot be reached, or a
    /// backend error when the read fails.
    pub async fn check(&self, sequencer: &crate::Sequencer) -> Result<bool> {
        self.check_name(sequencer.name())?;
        let session = {
            let mut checker = self.checker.lock().await;
            match checker.as_ref() {
                Some(session) if !session.state().is_over() => session.clone(),
                _ => {
                    let session = self.session().await?;
                    *checker = Some(session.clone());
                    session
                }
            }
        };
        session.check(sequencer).await
    }

    /// Opens a session with the default [`SessionOptions`].
    ///
    /// # Cancel safety
    ///
    /// Cancelling the call leaves no session behind that keeps itself alive.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when the cluster cannot be reached within the
    /// connect timeout.
    pub async fn session(&self) -> Result<Session> {
        self.session_with(SessionOptions::default()).await
    }

    /// Opens a session with the given options.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the call leaves no session behind that keeps itself alive.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for options that do not validate,
    /// [`Error::Unavailable`] when the cluster cannot be reached within the
    /// connect timeout.
    pub async fn session_with(&self, options: SessionOptions) -> Result<Session> {
        options.validate()?;
        let opening = self.backend.open_session(&options);
        let backend_session = match tokio::time::timeout(options.connect_timeout(), opening).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(Error::unavailable(
                    self.backend.name(),
                    match self.backend.describe() {
                        target if target.is_empty() => format!("no session within {:?}", options.connect_timeout()),
                        target => format!("no session with {target} within {:?}", options.connect_timeout()),
                    },
                ))
            }
        };
        self.counters.bump(|c| &c.sessions);
        Ok(Session::new(
            Arc::clone(&self.backend),
            backend_session,
            options,
            Arc::clone(&self.counters),
        ))
    }
}
