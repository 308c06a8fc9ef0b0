//! The distributed counting semaphore and its permit.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Acquire;
use crate::guard::{guard_surface, Hold};
use crate::wait::{Patience, Rule};
use crate::{Contender, EntryKind, Error, Result, Session};

/// The most permits a semaphore may have.
pub const MAX_PERMITS: usize = 10_000;

/// A distributed counting semaphore: at most `permits` holders at a time.
///
/// Contenders queue in creation order; a contender holds when fewer than
/// `permits` entries are ahead of it, and otherwise waits on the one entry
/// `permits` places ahead (herd-free). When an entry nearer to it leaves first,
/// it keeps waiting for that one entry; the bound is never exceeded, but a
/// permit can stay unused until that entry leaves.
///
/// The number of permits is not stored on the server: every contender applies
/// its own. Contenders that disagree get the bound each of them asked for (a
/// contender with 3 permits holds while 2 are ahead of it, whatever the others
/// said); give every user of a name the same number.
///
/// On etcd the entries are `<name>/semaphore/<lease>-<attempt>`; on ZooKeeper
/// `_c_<attempt>-lease-<seq>` under `/<name>`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// let session = lockline::Client::memory().session().await?;
/// let pool = session.semaphore("db-connections", 2)?;
/// let a = pool.acquire().await?;
/// let b = pool.acquire().await?;
/// assert!(pool.try_acquire().await?.is_none()); // both permits taken
/// a.release().await?;
/// let c = pool.acquire().await?;
/// # drop((b, c));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    session: Session,
    name: Arc<str>,
    permits: usize,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .field("session", &self.session.id())
            .finish()
    }
}

// The recipe's constructor on `Session` lives beside the recipe: `session`
// imports no recipe.
impl Session {
    /// A semaphore named `name` allowing `permits` holders (see [`Semaphore`]).
    ///
    /// # Errors
    ///
    /// As [`mutex`](Self::mutex), and [`Error::InvalidOptions`] for 0 permits
    /// or more than [`MAX_PERMITS`].
    pub fn semaphore(&self, name: &str, permits: usize) -> Result<Semaphore> {
        self.inner.check_name(name)?;
        self.inner.check_usable()?;
        Semaphore::new(self.clone(), name, permits)
    }
}

impl Semaphore {
    fn new(session: Session, name: &str, permits: usize) -> Result<Self> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(Error::InvalidOptions {
                reason: format!("a semaphore needs 1..={MAX_PERMITS} permits, not {permits}"),
            });
        }
        Ok(Semaphore {
            session,
            name: name.into(),
            permits,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many holders it allows at a time.
    pub fn permits(&self) -> usize {
        self.permits
    }

    fn acquiring(&self, patience: Patience) -> Acquire<'_> {
        Acquire {
            session: &self.session,
            name: &self.name,
            kind: EntryKind::Semaphore,
            rule: Rule::Permits(self.permits),
            value: b"",
            local: false,
            patience,
        }
    }

    /// Waits in line for a permit.
    ///
    /// # Cancel safety
    ///
    /// Cancelling removes this contender from the queue; no entry is left behind.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    pub async fn acquire(&self) -> Result<Permit> {
        self.acquiring(Patience::Forever)
            .run()
            .await?
            .map(|hold| Permit { hold })
            .ok_or_else(|| Error::Timeout {
                name: self.name.to_string(),
                waited: Duration::ZERO,
                held_by_this_session: false,
            })
    }

    /// Takes a permit if one is free, without waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancelling leaves no entry behind.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        Ok(self.acquiring(Patience::Never).run().await?.map(|hold| Permit { hold }))
    }

    /// Every holder and waiter, first-created first.
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

/// A permit of a [`Semaphore`]. Dropping it releases in the background.
#[must_use = "the permit is released as soon as it is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct Permit {
    hold: Hold,
}

guard_surface!(Permit, "permit");
