//! Several mutexes taken as one: all or nothing, in one canonical order.

use std::time::Duration;

use futures::future::select_all;
use tokio::time::Instant;

use crate::{Error, FencingToken, Mutex, MutexGuard, Result, Sequencer, Session};

/// Several named mutexes taken as one, all or nothing (Redisson's
/// `MultiLock`, DistributedLock's `TryAcquireAllLocks`).
///
/// The mutexes are always taken in one canonical order (their names' byte
/// order), whatever order they were given in, so two multi-locks with
/// overlapping names never deadlock against each other: both queue for the
/// smallest name first. An acquire that fails, runs out of time or is
/// cancelled lets go of what it had taken and leaves no entry behind.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// let session = lockline::Client::memory().session().await?;
/// let both = session.multi_lock(["accounts/bob", "accounts/alice"])?;
/// let guard = both.lock().await?; // alice first, then bob
/// for sequencer in guard.sequencers() {
///     println!("{} with token {}", sequencer.name(), sequencer.token());
/// }
/// guard.release().await?; // all of them
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiLock {
    mutexes: Vec<Mutex>,
}

/// The mutexes of a [`MultiLock`], all held.
///
/// Dropping it releases each in the background (as dropping each
/// [`MutexGuard`] would); [`release`](Self::release) releases them all and
/// reports the first failure.
#[must_use = "the locks are released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<MutexGuard>,
}

impl Session {
    /// Several mutexes of this session, to take as one (see [`MultiLock`]).
    /// The names may come in any order; they are taken in the byte order of
    /// the names as the backend stores them (on ZooKeeper, without a
    /// leading `/`: `x` and `/x` are one path, so one lock).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name the backend cannot store;
    /// [`Error::InvalidOptions`] for no name at all, or a name given twice,
    /// in one spelling or two the backend stores alike (a session's second
    /// acquire of a name would wait for its first);
    /// [`Error::Closed`] or [`Error::SessionLost`] when the session is over.
    pub fn multi_lock<I, S>(&self, names: I) -> Result<MultiLock>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut names: Vec<String> = names.into_iter().map(|n| n.as_ref().to_owned()).collect();
        if names.is_empty() {
            return Err(Error::InvalidOptions {
                reason: "a multi-lock needs at least one name".into(),
            });
        }
        // In the order of the names as the backend stores them, two names
        // stored alike being one lock.
        let backend = &self.inner.backend;
        names.sort_by(|a, b| backend.stored_name(a).cmp(&backend.stored_name(b)));
        if let Some(twice) = names
            .windows(2)
            .find(|pair| backend.stored_name(&pair[0]) == backend.stored_name(&pair[1]))
        {
            return Err(Error::InvalidOptions {
                reason: if twice[0] == twice[1] {
                    format!("the name {:?} is given twice to one multi-lock", twice[0])
                } else {
                    format!(
                        "the names {:?} and {:?} are one lock on this backend, given twice to one multi-lock",
                        twice[0], twice[1]
                    )
                },
            });
        }
        let mutexes = names.iter().map(|name| self.mutex(name)).collect::<Result<_>>()?;
        Ok(MultiLock { mutexes })
    }
}

impl MultiLock {
    /// The names, in the order they are taken.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.mutexes.iter().map(Mutex::name)
    }

    /// Takes every mutex, in order, waiting in each one's queue.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the call lets go of the mutexes already taken and leaves
    /// the queue it was waiting in; no entry is left behind.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`], for the first mutex that fails; the ones taken
    /// before it are released first.
    pub async fn lock(&self) -> Result<MultiGuard> {
        let mut guards = Vec::with_capacity(self.mutexes.len());
        for mutex in &self.mutexes {
            match mutex.lock().await {
                Ok(guard) => guards.push(guard),
                Err(error) => return Err(give_back(guards, error).await),
            }
        }
        Ok(MultiGuard { guards })
    }

    /// Takes every mutex, waiting at most `timeout` in all.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] naming the mutex it was waiting for when the time
    /// ran out (`waited` is the whole `timeout`), having let go of the
    /// others; otherwise as [`lock`](Self::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MultiGuard> {
        let deadline = Instant::now().checked_add(timeout);
        let mut guards = Vec::with_capacity(self.mutexes.len());
        for mutex in &self.mutexes {
            let left = deadline.map_or(timeout, |at| at.saturating_duration_since(Instant::now()));
            match mutex.lock_timeout(left).await {
                Ok(guard) => guards.push(guard),
                Err(Error::Timeout {
                    name,
                    held_by_this_session,
                    ..
                }) => {
                    let error = Error::Timeout {
                        name,
                        waited: timeout,
                        held_by_this_session,
                    };
                    return Err(give_back(guards, error).await);
                }
                Err(error) => return Err(give_back(guards, error).await),
            }
        }
        Ok(MultiGuard { guards })
    }

    /// Takes every mutex if each is free now, without waiting: `None`, with
    /// nothing held, when one is taken.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Errors
    ///
    /// As [`Mutex::try_lock`].
    pub async fn try_lock(&self) -> Result<Option<MultiGuard>> {
        let mut guards = Vec::with_capacity(self.mutexes.len());
        for mutex in &self.mutexes {
            match mutex.try_lock().await {
                Ok(Some(guard)) => guards.push(guard),
                Ok(None) => {
                    release_all(guards).await?;
                    return Ok(None);
                }
                Err(error) => return Err(give_back(guards, error).await),
            }
        }
        Ok(Some(MultiGuard { guards }))
    }
}

/// Releases what a failed acquire took, and returns its error.
async fn give_back(guards: Vec<MutexGuard>, error: Error) -> Error {
    if let Err(release) = release_all(guards).await {
        tracing::debug!(%release, "releasing the part of a failed multi-lock");
    }
    error
}

/// Releases every guard, all of them even when one fails; the first failure.
async fn release_all(guards: Vec<MutexGuard>) -> Result<()> {
    let outcomes = futures::future::join_all(guards.into_iter().map(MutexGuard::release)).await;
    outcomes.into_iter().collect()
}

impl MultiGuard {
    /// Each mutex's guard, in the order they were taken.
    pub fn guards(&self) -> &[MutexGuard] {
        &self.guards
    }

    /// Each mutex's name and fencing token, in the order they were taken.
    pub fn tokens(&self) -> Vec<(String, FencingToken)> {
        self.guards
            .iter()
            .map(|g| (g.sequencer().name().to_owned(), g.token()))
            .collect()
    }

    /// Each mutex's [`Sequencer`], in the order they were taken.
    pub fn sequencers(&self) -> Vec<Sequencer> {
        self.guards.iter().map(MutexGuard::sequencer).collect()
    }

    /// Whether every mutex is still held as far as this client knows.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(MutexGuard::is_held)
    }

    /// Resolves when any of the mutexes may no longer be held (see
    /// [`MutexGuard::lost`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        let losses = self.guards.iter().map(|g| Box::pin(g.lost()));
        select_all(losses).await;
    }

    /// Releases every mutex (all of them, even when one fails).
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the releases finish in the background, as on drop.
    ///
    /// # Errors
    ///
    /// The first failure, as [`MutexGuard::release`] reports it.
    pub async fn release(self) -> Result<()> {
        release_all(self.guards).await
    }
}
