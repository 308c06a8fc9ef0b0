//! Leader election: [`Election`], the [`Leader`] observers see and the
//! [`Leadership`] a candidate holds once elected.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;

use crate::acquire::Acquire;
use crate::guard::{guard_surface, Hold};
use crate::session::SessionInner;
use crate::wait::{Patience, Rule};
use crate::{Entry, EntryKind, Error, FencingToken, Result, Session};

/// Leader election: candidates queue like a mutex's contenders; the first is
/// the leader, and its entry carries the value it proclaims.
///
/// On etcd the layout is Go's `concurrency.Election`: `<name>/<lease hex>` with
/// the value as the key's value, so `etcdctl elect <name>` and Go programs see
/// lockline's leader and lockline sees theirs. On ZooKeeper it is Curator's
/// `LeaderLatch`: `_c_<attempt>-latch-<seq>` under `/<name>`, the value as data.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// use futures::StreamExt;
///
/// let client = lockline::Client::memory();
/// let (a, b) = (client.session().await?, client.session().await?);
/// let election = a.election("scheduler")?;
/// let mut changes = Box::pin(b.election("scheduler")?.observe());
/// assert_eq!(changes.next().await.transpose()?, Some(None)); // nobody leads yet
///
/// let leadership = election.campaign(b"node-a").await?;
/// let leader = changes.next().await.transpose()?.flatten().expect("a leader");
/// assert_eq!(leader.value(), b"node-a");
/// assert_eq!(leader.token(), leadership.token());
///
/// leadership.proclaim(b"node-a, epoch 2").await?;
/// let leader = changes.next().await.transpose()?.flatten().expect("a leader");
/// assert_eq!(leader.value(), b"node-a, epoch 2");
///
/// leadership.resign().await?;
/// assert_eq!(changes.next().await.transpose()?, Some(None));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    session: Session,
    name: Arc<str>,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("session", &self.session.id())
            .finish()
    }
}

/// The current leader of an [`Election`], as observers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    entry: Entry,
    value: Vec<u8>,
}

impl Leader {
    /// The value the leader proclaimed.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The leader's fencing token: resources the leader writes to can reject
    /// older leaders with it.
    pub fn token(&self) -> FencingToken {
        self.entry.token
    }

    /// The key (etcd) or path (ZooKeeper) of the leader's entry.
    pub fn key(&self) -> &str {
        &self.entry.key
    }
}

// The recipe's constructor on `Session` lives beside the recipe: `session`
// imports no recipe.
impl Session {
    /// A leader election named `name` (see [`Election`]).
    ///
    /// # Errors
    ///
    /// As [`mutex`](Self::mutex).
    pub fn election(&self, name: &str) -> Result<Election> {
        self.inner.check_name(name)?;
        self.inner.check_usable()?;
        Ok(Election::new(self.clone(), name))
    }
}

impl Election {
    fn new(session: Session, name: &str) -> Self {
        Election {
            session,
            name: name.into(),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A candidacy with `value`: the mutex rule, queued in-process first
    /// (one key per session and name on etcd).
    fn candidacy<'a>(&'a self, value: &'a [u8]) -> Acquire<'a> {
        Acquire {
            session: &self.session,
            name: &self.name,
            kind: EntryKind::Election,
            rule: Rule::Exclusive,
            value,
            local: true,
            patience: Patience::Forever,
        }
    }

    /// Stands as a candidate with `value` and waits until elected.
    ///
    /// # Cancel safety
    ///
    /// Cancelling withdraws the candidacy; no entry is left behind.
    ///
    /// # Errors
    ///
    /// As [`Mutex::lock`](crate::Mutex::lock).
    pub async fn campaign(&self, value: &[u8]) -> Result<Leadership> {
        self.candidacy(value)
            .run()
            .await?
            .map(|hold| Leadership { hold })
            .ok_or_else(|| Error::Timeout {
                name: self.name.to_string(),
                waited: Duration::ZERO,
                held_by_this_session: false,
            })
    }

    /// Stands as a candidate with `value` and waits at most `timeout` to be
    /// elected, as [`Mutex::lock_timeout`](crate::Mutex::lock_timeout) does:
    /// `Duration::ZERO` makes one try (elected when nobody leads or waits).
    ///
    /// # Cancel safety
    ///
    /// Cancelling withdraws the candidacy; no entry is left behind.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time runs out (the candidacy is then
    /// withdrawn); otherwise as [`campaign`](Self::campaign).
    pub async fn campaign_timeout(&self, value: &[u8], timeout: Duration) -> Result<Leadership> {
        Ok(Leadership {
            hold: self.candidacy(value).within(timeout).await?,
        })
    }

    /// The current leader, if any.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] or a backend error when the read fails;
    /// [`Error::Closed`] / [`Error::SessionLost`] when the session is over.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        current_leader(&self.session.inner, &self.name).await
    }

    /// Every leader change, in order, starting with the current leader (or
    /// `None`): a new leader, a new proclaimed value, no leader. Observers need
    /// not be candidates. A leadership shorter than a server round trip may
    /// pass unseen; the stream never reports a stale leader after a newer one.
    ///
    /// Transient failures are retried; the stream ends after reporting
    /// [`Error::SessionLost`] or [`Error::Closed`] when the observing session
    /// is over.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        let state = Observer {
            inner: Arc::clone(&self.session.inner),
            name: Arc::clone(&self.name),
            shown: None,
            done: false,
        };
        futures::stream::unfold(state, |mut state| async move {
            let next = state.next().await?;
            Some((next, state))
        })
    }
}

async fn current_leader(inner: &SessionInner, name: &str) -> Result<Option<Leader>> {
    inner.check_usable()?;
    loop {
        let entries = inner.call(inner.remote.list(name)).await?;
        let Some(first) = entries.into_iter().next() else {
            return Ok(None);
        };
        // Gone between the two reads: look again.
        if let Some(value) = inner.call(inner.remote.get_value(&first)).await? {
            return Ok(Some(Leader { entry: first, value }));
        }
    }
}

struct Observer {
    inner: Arc<SessionInner>,
    name: Arc<str>,
    /// The last item the stream yielded (`None` before the first).
    shown: Option<Option<Leader>>,
    done: bool,
}

impl Observer {
    async fn next(&mut self) -> Option<Result<Option<Leader>>> {
        if self.done {
            return None;
        }
        let mut backoff = Duration::from_millis(50);
        loop {
            let outcome = async {
                let current = current_leader(&self.inner, &self.name).await?;
                if self.shown.as_ref() != Some(&current) {
                    return Ok(Some(current));
                }
                let remote = &self.inner.remote;
                match &current {
                    None => remote.wait_for_entry(&self.name).await?,
                    Some(leader) => {
                        remote.watch_value(&leader.entry, &leader.value).await?;
                    }
                }
                Ok(None)
            };
            let outcome = tokio::select! {
                biased;
                state = self.inner.over() => Err(self.inner.over_error(state)),
                outcome = outcome => outcome,
            };
            match outcome {
                Ok(Some(current)) => {
                    self.shown = Some(current.clone());
                    return Some(Ok(current));
                }
                Ok(None) => backoff = Duration::from_millis(50),
                Err(error) if error.is_transient() && !self.inner.state().is_over() => {
                    tracing::debug!(name = %self.name, %error, "observing an election failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
    }
}

/// The leadership won by [`Election::campaign`]. Dropping it resigns in the
/// background.
#[must_use = "leadership is resigned as soon as it is dropped"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct Leadership {
    hold: Hold,
}

guard_surface!(Leadership, "leadership");

impl Leadership {
    /// Replaces the value observers see, only while this leadership holds
    /// (fenced on the leader's own entry).
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the new value may or may not have been written.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] when the leadership's entry is gone, or the
    /// session's loss.
    pub async fn proclaim(&self, value: &[u8]) -> Result<()> {
        let inner = &self.hold.session().inner;
        inner.check_usable()?;
        match inner.call(inner.remote.set_value(self.hold.entry(), value)).await {
            Err(Error::LockLost { key }) => {
                let error = inner.vanished_error(&key).await;
                Err(error)
            }
            other => other,
        }
    }

    /// Steps down: deletes the leader's entry so the next candidate leads.
    /// The same as [`release`](Self::release).
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the resignation finishes in the background.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    pub async fn resign(self) -> Result<()> {
        self.release().await
    }
}
