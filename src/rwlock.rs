//! The distributed read/write lock and its two guards.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Acquire;
use crate::guard::{guard_surface, Hold};
use crate::wait::{Patience, Rule};
use crate::{Contender, EntryKind, Error, Result, Session};

/// A distributed read/write lock: readers share it, writers exclude everyone.
///
/// Contenders queue in creation order, readers and writers together. A reader
/// waits only on the nearest earlier writer; a writer waits on the entry just
/// before it. So a waiting writer is never starved: readers that arrive after
/// it queue behind it.
///
/// On etcd the entries are `<name>/read/<lease>-<attempt>` and
/// `<name>/write/<lease>-<attempt>`; on ZooKeeper Curator's
/// `_c_<attempt>-__READ__<seq>` and `_c_<attempt>-__WRIT__<seq>` (so Curator's
/// `InterProcessReadWriteLock` and kazoo's `ReadLock`/`WriteLock` given the
/// pattern queue with lockline's). Do not use one name as both a mutex and a
/// read/write lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// let client = lockline::Client::memory();
/// let (a, b) = (client.session().await?, client.session().await?);
/// let r1 = a.rwlock("catalog")?.read().await?;
/// let r2 = b.rwlock("catalog")?.read().await?; // readers share
/// assert!(b.rwlock("catalog")?.try_write().await?.is_none());
/// r1.release().await?;
/// r2.release().await?;
/// let w = b.rwlock("catalog")?.write().await?;
/// assert!(a.rwlock("catalog")?.try_read().await?.is_none());
/// w.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RwLock {
    session: Session,
    name: Arc<str>,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.name)
            .field("session", &self.session.id())
            .finish()
    }
}

// The recipe's constructor on `Session` lives beside the recipe: `session`
// imports no recipe.
impl Session {
    /// A read/write lock named `name` (see [`RwLock`]). No server call is made.
    ///
    /// # Errors
    ///
    /// As [`mutex`](Self::mutex).
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        self.inner.check_name(name)?;
        self.inner.check_usable()?;
        Ok(RwLock::new(self.clone(), name))
    }
}

impl RwLock {
    fn new(session: Session, name: &str) -> Self {
        RwLock {
            session,
            name: name.into(),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn acquire(&self, write: bool, patience: Patience) -> Acquire<'_> {
        Acquire {
            session: &self.session,
            name: &self.name,
            kind: if write { EntryKind::Write } else { EntryKind::Read },
            rule: if write { Rule::Exclusive } else { Rule::Shared },
            value: b"",
            local: false,
            patience,
        }
    }

    async fn wait(&self, write: bool) -> Result<Hold> {
        self.acquire(write, Patience::Forever)
            .run()
            .await?
            .ok_or_else(|| Error::Timeout {
                name: self.name.to_string(),
                waited: Duration::ZERO,
                held_by_this_session: false,
            })
    }

    /// Waits for a shared (read) hold.
    ///
    /// # Cancel safety
    ///
    /// Cancelling removes this contender from the queue; no entry is left behind.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    pub async fn read(&self) -> Result<ReadGuard> {
        self.wait(false).await.map(|hold| ReadGuard { hold })
    }

    /// Waits for the exclusive (write) hold.
    ///
    /// # Cancel safety
    ///
    /// Cancelling removes this contender from the queue; no entry is left behind.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    pub async fn write(&self) -> Result<WriteGuard> {
        self.wait(true).await.map(|hold| WriteGuard { hold })
    }

    /// Takes a read hold if no writer holds or waits, without waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancelling leaves no entry behind.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        Ok(self
            .acquire(false, Patience::Never)
            .run()
            .await?
            .map(|hold| ReadGuard { hold }))
    }

    /// Takes the write hold if nobody holds or waits, without waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancelling leaves no entry behind.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        Ok(self
            .acquire(true, Patience::Never)
            .run()
            .await?
            .map(|hold| WriteGuard { hold }))
    }

    /// Every contender queued on this lock, first-created first.
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

/// A shared hold on a [`RwLock`]. Dropping it releases in the background.
#[must_use = "the hold is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct ReadGuard {
    hold: Hold,
}

guard_surface!(ReadGuard, "read hold");

/// The exclusive hold on a [`RwLock`]. Dropping it releases in the background.
#[must_use = "the hold is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct WriteGuard {
    hold: Hold,
}

guard_surface!(WriteGuard, "write hold");
