//! The distributed mutex and its guard.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Acquire;
use crate::guard::{guard_surface, Hold};
use crate::wait::{Patience, Rule};
use crate::{Contender, Entry, EntryKind, Error, Result, Session};

/// A distributed mutual-exclusion lock.
///
/// Contenders line up in a queue kept by the server, in the order their entries
/// were created; each waits on the one entry just before its own, so a release
/// wakes exactly one waiter. Grants are FIFO across sessions. Contenders of one
/// session for one name queue in-process first (the etcd layout gives a session
/// one key per name), so they also exclude each other.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// let session = lockline::Client::memory().session().await?;
/// let mutex = session.mutex("billing/run")?;
/// let guard = mutex.lock().await?;
/// assert!(mutex.try_lock().await?.is_none()); // taken
/// // ... write to the resource with guard.token() ...
/// guard.release().await?;
/// assert!(mutex.try_lock().await?.is_some());
/// # Ok(()) }
/// ```
///
/// # Not re-entrant
///
/// A session that holds a mutex and calls [`lock`](Self::lock) on the same
/// name again **waits forever**: the second call queues behind the first
/// guard, which it never releases (like `tokio::sync::Mutex` and etcd's Go
/// `concurrency.Mutex`, unlike Curator's `InterProcessMutex`). Pass the guard
/// down instead of locking again. [`lock_timeout`](Self::lock_timeout)
/// and [`try_lock`](Self::try_lock) show the mistake rather than hang: the
/// timeout's [`Error::Timeout`] has `held_by_this_session` set and its
/// message says "held by this session", and `try_lock` returns `None`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// # use std::time::Duration;
/// let session = lockline::Client::memory().session().await?;
/// let mutex = session.mutex("billing/run")?;
/// let _outer = mutex.lock().await?;
/// let nested = mutex.lock_timeout(Duration::from_millis(10)).await.unwrap_err();
/// assert!(nested.to_string().contains("held by this session"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Mutex {
    session: Session,
    name: Arc<str>,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("name", &self.name)
            .field("session", &self.session.id())
            .finish()
    }
}

// The recipe's constructor on `Session` lives beside the recipe: `session`
// imports no recipe.
impl Session {
    /// A mutex named `name` (see [`Mutex`]). No server call is made.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when the name cannot be stored, [`Error::Closed`] or
    /// [`Error::SessionLost`] when the session is over.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        self.inner.check_name(name)?;
        self.inner.check_usable()?;
        Ok(Mutex::new(self.clone(), name))
    }
}

impl Mutex {
    fn new(session: Session, name: &str) -> Self {
        Mutex {
            session,
            name: name.into(),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session the mutex acquires on.
    pub fn session(&self) -> &Session {
        &self.session
    }

    fn acquire(&self, patience: Patience) -> Acquire<'_> {
        Acquire {
            session: &self.session,
            name: &self.name,
            kind: EntryKind::Mutex,
            rule: Rule::Exclusive,
            value: b"",
            local: true,
            patience,
        }
    }

    /// Waits in line for the lock and returns a guard once it is held.
    ///
    /// Never polls: the contender waits on its predecessor's entry alone.
    ///
    /// # Cancel safety
    ///
    /// Cancelling a call to `lock` removes this contender from the queue; no
    /// entry is left behind (the removal runs in the session's background and is
    /// retried; [`Session::flush`] waits for it).
    ///
    /// # Errors
    ///
    /// [`Error::SessionLost`] as soon as the session is lost while waiting (also
    /// when the session expired and its entry vanished: never a false grant),
    /// [`Error::Closed`] after [`Session::close`], [`Error::Unavailable`] when a
    /// request times out.
    pub async fn lock(&self) -> Result<MutexGuard> {
        match self.acquire(Patience::Forever).run().await? {
            Some(hold) => Ok(MutexGuard { hold }),
            None => Err(Error::Timeout {
                name: self.name.to_string(),
                waited: Duration::ZERO,
                held_by_this_session: false,
            }),
        }
    }

    /// Takes the lock if nobody holds it or waits for it, without waiting.
    /// Returns `None` when it is taken (also when this same session holds
    /// it: locks are not re-entrant); its entry is then removed before this
    /// returns.
    ///
    /// # Cancel safety
    ///
    /// Cancelling leaves no entry behind (removed in the background).
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        Ok(self
            .acquire(Patience::Never)
            .run()
            .await?
            .map(|hold| MutexGuard { hold }))
    }

    /// Waits for the lock at most `timeout`.
    ///
    /// `Duration::ZERO` makes one try and never waits, on every backend: a
    /// free lock is granted, a taken one gives [`Error::Timeout`] at once
    /// (what [`try_lock`](Self::try_lock) does, as an error). Any other
    /// timeout bounds everything, round trips included: one shorter than a
    /// round trip to the server times out even on a free lock.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock): cancelled, it leaves no entry behind.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time runs out; the contender has then left the
    /// queue. Its `held_by_this_session` is set when what it waited behind is
    /// this same session (a nested lock). Otherwise as [`lock`](Self::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        let hold = self.acquire(Patience::Forever).within(timeout).await?;
        Ok(MutexGuard { hold })
    }

    /// Every contender queued on this lock (the holder first), from every
    /// client, as the server stores them.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] or a backend error when the read fails.
    pub async fn contenders(&self) -> Result<Vec<Contender>> {
        self.session.inner.contenders(&self.name).await
    }
}

/// A held [`Mutex`].
///
/// `'static` and `Send`: move it into a task. Dropping it releases the lock in
/// the background; [`release`](Self::release) does it now and reports failure.
#[must_use = "the lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MutexGuard {
    hold: Hold,
}

guard_surface!(MutexGuard, "lock");

impl MutexGuard {
    /// The entry that holds the lock.
    pub fn entry(&self) -> &Entry {
        self.hold.entry()
    }
}
