//! Several resources taken as one, each in its own lock mode: all or
//! nothing, in one canonical order.

use std::time::Duration;

use futures::future::select_all;
use tokio::time::Instant;

use crate::{Error, LockMode, Resource, ResourceGuard, Result, Sequencer, Session};

/// Several [`Resource`]s taken as one, each in its own [`LockMode`], all or
/// nothing — the lock-mode form of [`MultiLock`](crate::MultiLock).
///
/// The resources are taken in their names' byte order, whatever order they
/// were given in, so two multi-resource locks with overlapping names never
/// deadlock against each other (the names as the backend stores them: on
/// ZooKeeper `x` and `/x` are one path, so one resource, and a name given
/// in both spellings is given twice). An acquire that fails, runs out of time or
/// is cancelled lets go of what it had taken and leaves no entry behind.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// use lockline::LockMode;
/// let session = lockline::Client::memory().session().await?;
/// let both = session.multi_resource([("orders", LockMode::Pw), ("catalog", LockMode::Pr)])?;
/// let guard = both.lock().await?; // catalog in PR, then orders in PW
/// assert_eq!(guard.guards()[1].mode(), LockMode::Pw);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiResource {
    parts: Vec<(Resource, LockMode)>,
}

/// The resources of a [`MultiResource`], all held, in name order.
///
/// Dropping it releases each in the background;
/// [`release`](Self::release) releases them all and reports the first
/// failure.
#[must_use = "the locks are released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct MultiResourceGuard {
    guards: Vec<ResourceGuard>,
}

impl Session {
    /// Several resources taken as one, each in its mode (see
    /// [`MultiResource`]). No server call is made.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for no names or a name given twice; as
    /// [`resource`](Self::resource) for a name that cannot be stored.
    pub fn multi_resource<I, S>(&self, parts: I) -> Result<MultiResource>
    where
        I: IntoIterator<Item = (S, LockMode)>,
        S: AsRef<str>,
    {
        let mut named: Vec<(String, LockMode)> = parts.into_iter().map(|(n, m)| (n.as_ref().to_owned(), m)).collect();
        if named.is_empty() {
            return Err(Error::InvalidOptions {
                reason: "a multi-resource lock needs at least one name".into(),
            });
        }
        // In the order of the names as the backend stores them, two names
        // stored alike being one resource.
        let backend = &self.inner.backend;
        named.sort_by(|a, b| backend.stored_name(&a.0).cmp(&backend.stored_name(&b.0)));
        if let Some(twice) = named
            .windows(2)
            .find(|pair| backend.stored_name(&pair[0].0) == backend.stored_name(&pair[1].0))
        {
            return Err(Error::InvalidOptions {
                reason: if twice[0].0 == twice[1].0 {
                    format!("the name {:?} is given twice to one multi-resource lock", twice[0].0)
                } else {
                    format!(
                        "the names {:?} and {:?} are one resource on this backend, given twice to one \
                         multi-resource lock",
                        twice[0].0, twice[1].0
                    )
                },
            });
        }
        let parts = named
            .into_iter()
            .map(|(name, mode)| Ok((self.resource(&name)?, mode)))
            .collect::<Result<_>>()?;
        Ok(MultiResource { parts })
    }
}

impl MultiResource {
    /// The names and modes, in the order they are taken.
    pub fn parts(&self) -> impl Iterator<Item = (&str, LockMode)> {
        self.parts.iter().map(|(r, m)| (r.name(), *m))
    }

    /// Takes every resource in its mode, in order, waiting in each queue.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the call lets go of the resources already taken and
    /// leaves the queue it was waiting in; no entry is left behind.
    ///
    /// # Errors
    ///
    /// As [`Resource::lock`], for the first that fails; the ones taken
    /// before it are released first.
    pub async fn lock(&self) -> Result<MultiResourceGuard> {
        let mut guards = Vec::with_capacity(self.parts.len());
        for (resource, mode) in &self.parts {
            match resource.lock(*mode).await {
                Ok(guard) => guards.push(guard),
                Err(error) => return Err(give_back(guards, error).await),
            }
        }
        Ok(MultiResourceGuard { guards })
    }

    /// Takes every resource, waiting at most `timeout` in all.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] naming the resource it was waiting for (`waited`
    /// is the whole `timeout`), having let go of the others; otherwise as
    /// [`lock`](Self::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MultiResourceGuard> {
        let deadline = Instant::now().checked_add(timeout);
        let mut guards = Vec::with_capacity(self.parts.len());
        for (resource, mode) in &self.parts {
            let left = deadline.map_or(timeout, |at| at.saturating_duration_since(Instant::now()));
            match resource.lock_timeout(*mode, left).await {
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
        Ok(MultiResourceGuard { guards })
    }

    /// Takes every resource if each is free in its mode now: `None`, with
    /// nothing held, otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Errors
    ///
    /// As [`Resource::try_lock`].
    pub async fn try_lock(&self) -> Result<Option<MultiResourceGuard>> {
        let mut guards = Vec::with_capacity(self.parts.len());
        for (resource, mode) in &self.parts {
            match resource.try_lock(*mode).await {
                Ok(Some(guard)) => guards.push(guard),
                Ok(None) => {
                    release_all(guards).await?;
                    return Ok(None);
                }
                Err(error) => return Err(give_back(guards, error).await),
            }
        }
        Ok(Some(MultiResourceGuard { guards }))
    }
}

async fn give_back(guards: Vec<ResourceGuard>, error: Error) -> Error {
    if let Err(release) = release_all(guards).await {
        tracing::debug!(%release, "releasing the part of a failed multi-resource lock");
    }
    error
}

async fn release_all(guards: Vec<ResourceGuard>) -> Result<()> {
    let outcomes = futures::future::join_all(guards.into_iter().map(ResourceGuard::release)).await;
    outcomes.into_iter().collect()
}

impl MultiResourceGuard {
    /// Each resource's guard, in name order.
    pub fn guards(&self) -> &[ResourceGuard] {
        &self.guards
    }

    /// Each resource's sequencer, in name order.
    pub fn sequencers(&self) -> Vec<Sequencer> {
        self.guards.iter().map(ResourceGuard::sequencer).collect()
    }

    /// Whether every resource is still held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(ResourceGuard::is_held)
    }

    /// Resolves once any of the resources may no longer be held.
    ///
    /// # Cancel safety
    ///
    /// Only waits; cancelling it changes nothing.
    pub async fn lost(&self) {
        let losses = self.guards.iter().map(|g| Box::pin(g.lost()));
        select_all(losses).await;
    }

    /// Releases every resource.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the releases finish in the background.
    ///
    /// # Errors
    ///
    /// The first failure of [`ResourceGuard::release`].
    pub async fn release(self) -> Result<()> {
        release_all(self.guards).await
    }
}
