//! One acquire by the wait rule: append an entry, wait on the one entry the
//! rule names until it may hold, then hand the entry to a guard; and the
//! pending entry that removes what an acquire leaves behind when it ends
//! without a grant (what makes every acquire cancel-safe).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use crate::contender::DELAY_MARK;
use crate::guard::{watch_entry, EntryWatch, Hold};
use crate::sequencer::Mode;
use crate::session::SessionInner;
use crate::wait::{patience_for, Patience, Rule};
use crate::{AppendRequest, Appended, Earlier, Entry, EntryKind, Error, Result, Session};

/// The first pause before retrying a transient failure; it doubles up to
/// [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// One acquire: what to append and how to wait.
#[derive(Debug)]
pub(crate) struct Acquire<'a> {
    pub(crate) session: &'a Session,
    pub(crate) name: &'a str,
    pub(crate) kind: EntryKind,
    pub(crate) rule: Rule,
    pub(crate) value: &'a [u8],
    /// Queue same-session contenders in-process first (the session has one
    /// entry per name in this kind's layout).
    pub(crate) local: bool,
    pub(crate) patience: Patience,
}

/// How an acquire ended when it did not fail.
pub(crate) enum Outcome {
    Held(Hold),
    /// Taken, and the acquire may not wait ([`Patience::Never`]). `here`:
    /// this session itself holds or waits for it.
    Busy {
        here: bool,
    },
}

impl Acquire<'_> {
    /// Runs the acquire. `Ok(None)` only for [`Patience::Never`] when the lock is
    /// taken.
    pub(crate) async fn run(self) -> Result<Option<Hold>> {
        Ok(match self.attempt().await? {
            Outcome::Held(hold) => Some(hold),
            Outcome::Busy { .. } => None,
        })
    }

    /// Runs the acquire waiting at most `timeout`: [`Error::Timeout`] when it
    /// runs out. `Duration::ZERO` makes one try and never waits, like a
    /// `try_*` call, on every backend: a free lock is granted.
    pub(crate) async fn within(mut self, timeout: Duration) -> Result<Hold> {
        self.patience = if timeout.is_zero() {
            Patience::Never
        } else {
            patience_for(timeout)
        };
        let (name, waited) = (self.name.to_owned(), timeout);
        match self.attempt().await? {
            Outcome::Held(hold) => Ok(hold),
            Outcome::Busy { here } => Err(Error::Timeout {
                name,
                waited,
                held_by_this_session: here,
            }),
        }
    }

    /// Runs the acquire inside a span naming the lock, the session and (once
    /// granted) the token, and records its metrics; an acquire dropped
    /// before it ends counts as a cancellation.
    async fn attempt(self) -> Result<Outcome> {
        use tracing::Instrument;
        let inner = &self.session.inner;
        let tracker = crate::observe::Acquiring::start(&inner.counters, inner.backend_name(), self.kind, self.name);
        let span = tracing::debug_span!(
            "lockline.acquire",
            lock = self.name,
            session = inner.remote.id(),
            kind = ?self.kind,
            token = tracing::field::Empty,
        );
        let outcome = self.attempt_tracked(&tracker).instrument(span).await;
        match &outcome {
            Ok(Outcome::Held(_)) => tracker.granted(),
            Ok(Outcome::Busy { .. }) => tracker.busy(),
            Err(error) => tracker.failed(error),
        }
        outcome
    }

    async fn attempt_tracked(self, tracker: &crate::observe::Acquiring) -> Result<Outcome> {
        let inner = &self.session.inner;
        inner.check_usable()?;
        let local = if self.local {
            match self.local_permit().await? {
                Some(permit) => Some(permit),
                None => return Ok(Outcome::Busy { here: true }),
            }
        } else {
            None
        };
        // The session may have ended while this task waited for its turn in
        // the same-session queue.
        inner.check_usable()?;
        let attempt = uuid::Uuid::new_v4().simple().to_string();
        let mut pending = PendingEntry {
            session: inner,
            dir: self.name,
            kind: self.kind,
            attempt: Some(attempt.clone()),
            entry: None,
            retried: false,
            local,
        };
        let request = AppendRequest {
            dir: self.name,
            kind: self.kind,
            attempt: &attempt,
            value: self.value,
            conflicts: self.rule.conflicts(),
            nearest: self.rule.depth(),
        };
        let appended = self.append(&request, &mut pending).await?;
        let mine = appended.entry;
        let mut own_watch = None;
        if let Some(busy) = self
            .wait_turn(&mine, appended.nearest, &mut pending, &mut own_watch, tracker)
            .await?
        {
            return Ok(busy);
        }
        let local = pending.local.take();
        let retried = pending
            .retried
            .then(|| (self.name.to_owned(), self.kind, attempt.clone()));
        pending.disarm();
        inner.counters.bump(|c| &c.grants);
        tracing::Span::current().record("token", mine.token.get());
        let mode = match self.kind {
            EntryKind::Read => Mode::Read,
            EntryKind::Write => Mode::Write,
            EntryKind::Semaphore => Mode::Permit {
                permits: self.rule.depth(),
            },
            EntryKind::Election => Mode::Leadership,
            _ => Mode::Mutex,
        };
        let held = Hold::new(self.session.clone(), mine, local, own_watch, self.name, mode, retried);
        Ok(Outcome::Held(held))
    }

    /// Appends the entry, retried as [`retrying`](Self::retrying) retries,
    /// and arms `pending` with it: whatever the append made is removed if
    /// the acquire ends without a grant.
    pub(crate) async fn append(&self, request: &AppendRequest<'_>, pending: &mut PendingEntry<'_>) -> Result<Appended> {
        let inner = &self.session.inner;
        let tries = std::sync::atomic::AtomicU32::new(0);
        let appended = self
            .retrying(|| {
                tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                inner.remote.append(request)
            })
            .await;
        // An append tried more than once may still have an earlier try in
        // flight, which can reach the server after this acquire is given up:
        // its cleanup must then fence the whole attempt, not just the entry.
        pending.retried = tries.load(std::sync::atomic::Ordering::Relaxed) > 1;
        if let Err(error) = &appended {
            if error.is_refusal() && !pending.retried {
                // The server answered the one try with a refusal: it created
                // nothing, and a cleanup would be refused the same way.
                pending.disarm();
            }
        }
        let appended = appended?;
        inner.counters.bump(|c| &c.appends);
        pending.entry = Some(appended.entry.clone());
        Ok(appended)
    }

    /// Waits until the rule lets `mine` hold (`Ok(None)`). `Ok(Some(Busy))`:
    /// not held and the entry removed (a `try_*` call that found the lock taken).
    async fn wait_turn(
        &self,
        mine: &Entry,
        mut known: Option<Vec<Entry>>,
        pending: &mut PendingEntry<'_>,
        own_watch: &mut Option<EntryWatch>,
        tracker: &crate::observe::Acquiring,
    ) -> Result<Option<Outcome>> {
        let inner = &self.session.inner;
        let mut backoff = INITIAL_BACKOFF;
        // The entry this contender last waited on and saw go: how it went
        // decides a lock-delay.
        let mut last_gone: Option<Entry> = None;
        // The entry a wait was on when an error cut it short: if the next
        // read finds it gone, it went unseen, and how it went still decides.
        let mut interrupted: Option<Entry> = None;
        // While queued, also watch my own entry (one watch for the whole wait,
        // handed on to the guard once granted): if it vanishes (session
        // expired, someone deleted it) the wait ends at once instead of when
        // the predecessor leaves (DESIGN §6.2, §6.3).
        loop {
            let nearest = match known.take() {
                // Read with the append: no second round trip.
                Some(nearest) => Earlier::Entries(nearest),
                None => {
                    self.retrying(|| inner.remote.earlier(mine, self.rule.conflicts(), self.rule.depth()))
                        .await?
                }
            };
            let nearest = match nearest {
                Earlier::Entries(entries) => {
                    // Entries only leave the queue ahead of mine: one the read
                    // no longer shows is gone.
                    if let Some(blocker) = interrupted.take() {
                        if !entries.iter().any(|e| e.key == blocker.key) {
                            last_gone = Some(blocker);
                        }
                    }
                    entries
                }
                Earlier::Gone => {
                    // DESIGN §6.2: my own entry vanished while I waited; never a
                    // false grant.
                    pending.disarm();
                    return Err(inner.vanished_error(&mine.key).await);
                }
            };
            // Never queue with another recipe's entries under the same name
            // (a permit holder beside a lock holder): refuse, and leave.
            if let Some(other) = nearest.iter().find(|e| !self.kind.queues_with(e.kind)) {
                return Err(Error::mixed_recipes(self.name, self.kind, other));
            }
            let Some(blocker) = self.rule.blocker(&nearest) else {
                // Never a grant on a session that is over: the server may
                // already have handed its entries' places to others.
                let state = inner.state();
                if state.is_over() {
                    return Err(inner.over_error(state));
                }
                // Next in line after a holder that lost its lock
                // involuntarily: hold back for the lock-delay, then look
                // once more.
                let delay = inner.options.lock_delay();
                if let Some(gone) = last_gone.take().filter(|_| !delay.is_zero()) {
                    if let crate::backend::Departure::Lost { noticed } = inner.remote.departure(&gone) {
                        tracker.delayed();
                        if let Some(busy) = self.hold_back(mine, noticed + delay, pending, own_watch).await? {
                            return Ok(Some(busy));
                        }
                        continue;
                    }
                }
                // The backend's server restarted recently: hold back until
                // every holder from before could have heard `lost()`.
                if let Some(until) = inner.remote.grant_not_before().filter(|&at| at > Instant::now()) {
                    if let Some(busy) = self.hold_back(mine, until, pending, own_watch).await? {
                        return Ok(Some(busy));
                    }
                    continue;
                }
                return Ok(None);
            };
            // Held or awaited by this very session (a read lock under a write
            // lock of the same session): the wait can only end when that
            // other holder lets go. Said in the timeout's message.
            let here = blocker.owner.as_deref() == Some(inner.remote.id());
            if let Some(orphan) = inner.orphan(blocker) {
                // One of this session's own leftovers (a dropped guard, a
                // cancelled acquire) whose background removal has not finished:
                // remove it now rather than wait for it, then look again.
                tracing::debug!(key = %mine.key, orphan = %blocker.key, "removing own leftover entry");
                self.retrying(|| inner.clean(&orphan)).await?;
                continue;
            }
            if let Patience::Never = self.patience {
                pending.remove_now().await;
                return Ok(Some(Outcome::Busy { here }));
            }
            let deadline = self.patience.deadline();
            let own = own_watch.get_or_insert_with(|| watch_entry(inner, mine));
            let blocked = inner.remote.wait_gone(blocker);
            // The gauge first: whoever awaits the `waits` counter sees it.
            tracker.waiting();
            inner.counters.bump(|c| &c.waits);
            tokio::select! {
                biased;
                state = inner.over() => return Err(inner.over_error(state)),
                gone = own.as_mut() => {
                    self.own_watch_ended(gone, mine, pending, own_watch, &mut backoff).await?;
                    interrupted = Some(blocker.clone());
                }
                gone = blocked => match gone {
                    Ok(()) => {
                        inner.counters.bump(|c| &c.wakeups);
                        tracker.woken();
                        tracing::trace!(key = %mine.key, after = %blocker.key, "woken");
                        last_gone = Some(blocker.clone());
                    }
                    // The watch broke (a member went down): look again once the
                    // cluster answers; the session's own tracking ends the wait
                    // if it is lost meanwhile.
                    Err(error) if error.is_transient() => {
                        interrupted = Some(blocker.clone());
                        self.back_off(&error, &mut backoff).await?;
                    }
                    Err(error) => return Err(error),
                },
                () = deadline => {
                    pending.remove_now().await;
                    return Err(self.timeout_error(here));
                }
            }
        }
    }

    /// What a waiting acquire does when the watch on its own entry ends: the
    /// entry vanished (the session's loss, or someone deleted it), an error;
    /// or the watch failed, an error unless the failure is transient, when
    /// the watch is dropped (the next wait opens another) after a backoff.
    pub(crate) async fn own_watch_ended(
        &self,
        ended: Result<()>,
        mine: &Entry,
        pending: &mut PendingEntry<'_>,
        own_watch: &mut Option<EntryWatch>,
        backoff: &mut Duration,
    ) -> Result<()> {
        match ended {
            Ok(()) => {
                pending.disarm();
                Err(self.session.inner.vanished_error(&mine.key).await)
            }
            Err(error) if error.is_transient() => {
                *own_watch = None;
                self.back_off(&error, backoff).await
            }
            Err(error) => Err(error),
        }
    }

    /// Waits until `until` before a grant (a lock-delay), still watching
    /// the session, this contender's own entry and the deadline; marks the
    /// entry meanwhile so that `contenders()` shows it (not an election
    /// candidate's: its value is its proclamation). `Ok(Some(Busy))` never;
    /// `Err` when the wait ends otherwise.
    ///
    /// The mark is written before the lock-delay is counted, as the `waits`
    /// gauge comes before its counter: whoever sees `lock_delays` go up and
    /// then lists the queue finds the mark (unless writing it failed).
    pub(crate) async fn hold_back(
        &self,
        mine: &Entry,
        until: Instant,
        pending: &mut PendingEntry<'_>,
        own_watch: &mut Option<EntryWatch>,
    ) -> Result<Option<Outcome>> {
        let inner = &self.session.inner;
        tracing::debug!(key = %mine.key, left = ?until.saturating_duration_since(Instant::now()), "lock-delay after an involuntary loss");
        let marked = !matches!(mine.kind, EntryKind::Election | EntryKind::Dlm)
            && inner
                .call(inner.remote.set_value(mine, &delay_mark(until)))
                .await
                .is_ok();
        // The mark first: whoever awaits the `lock_delays` counter sees it.
        inner.counters.bump(|c| &c.lock_delays);
        let deadline = self.patience.deadline();
        let own = own_watch.get_or_insert_with(|| watch_entry(inner, mine));
        let outcome = tokio::select! {
            biased;
            state = inner.over() => Err(inner.over_error(state)),
            gone = own.as_mut() => match gone {
                Ok(()) => {
                    pending.disarm();
                    Err(inner.vanished_error(&mine.key).await)
                }
                Err(error) => Err(error),
            },
            () = deadline => {
                pending.remove_now().await;
                Err(self.timeout_error(false))
            }
            () = tokio::time::sleep_until(until) => Ok(None),
        };
        if marked && outcome.is_ok() {
            // Best effort: a mark left behind says a time already past.
            let _ = inner.call(inner.remote.set_value(mine, b"")).await;
        }
        outcome
    }

    async fn local_permit(&self) -> Result<Option<OwnedMutexGuard<()>>> {
        let queue = self.session.inner.local_queue(self.name, self.kind);
        match self.patience {
            Patience::Never => Ok(queue.try_lock_owned().ok()),
            Patience::Forever => Ok(Some(queue.lock_owned().await)),
            Patience::Until(at, _) => match tokio::time::timeout_at(at, queue.lock_owned()).await {
                Ok(permit) => Ok(Some(permit)),
                // Queued behind another holder or waiter of this session.
                Err(_) => Err(self.timeout_error(true)),
            },
        }
    }

    /// Runs a server call bounded by the request timeout and the deadline; a
    /// transient failure is retried (the primitives are idempotent: a retried
    /// append finds its own entry) until the session is over, the deadline
    /// passes, or, for `try_*` calls, at once.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let inner = &self.session.inner;
        let mut backoff = INITIAL_BACKOFF;
        loop {
            match self.bounded(inner.call(call())).await {
                Err(error) if error.is_transient() && !matches!(self.patience, Patience::Never) => {
                    self.back_off(&error, &mut backoff).await?;
                }
                outcome => return outcome,
            }
        }
    }

    /// Waits out a retry's backoff, unless the session ends or the deadline
    /// passes first.
    pub(crate) async fn back_off(&self, error: &Error, backoff: &mut Duration) -> Result<()> {
        let inner = &self.session.inner;
        tracing::debug!(name = self.name, %error, ?backoff, "transient failure while acquiring; retrying");
        let pause = *backoff;
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
        tokio::select! {
            biased;
            state = inner.over() => Err(inner.over_error(state)),
            result = self.bounded(async { tokio::time::sleep(pause).await; Ok(()) }) => result,
        }
    }

    /// Bounds a server call by the deadline, if there is one.
    pub(crate) async fn bounded<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        match self.patience {
            Patience::Until(at, _) => match tokio::time::timeout_at(at, call).await {
                Ok(result) => result,
                Err(_) => Err(self.timeout_error(false)),
            },
            Patience::Forever | Patience::Never => call.await,
        }
    }

    pub(crate) fn timeout_error(&self, held_by_this_session: bool) -> Error {
        let waited = match self.patience {
            Patience::Until(_, waited) => waited,
            Patience::Forever | Patience::Never => Duration::ZERO,
        };
        Error::Timeout {
            name: self.name.to_owned(),
            waited,
            held_by_this_session,
        }
    }
}

/// The value a contender in lock-delay gives its entry meanwhile:
/// `lockline-delay-until:` and the end of the delay in milliseconds since
/// the Unix epoch, as [`Contender::delayed_until`](crate::Contender) reads it.
fn delay_mark(until: Instant) -> Vec<u8> {
    let left = until.saturating_duration_since(Instant::now());
    let at = std::time::SystemTime::now() + left;
    let ms = at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("{DELAY_MARK}{ms}").into_bytes()
}

/// An entry (or an append in flight) that is not yet a grant. Dropped armed, it
/// removes the entry through the session's background cleanup: that is what
/// makes every acquire cancel-safe (DESIGN §6.4).
pub(crate) struct PendingEntry<'a> {
    pub(crate) session: &'a Arc<SessionInner>,
    pub(crate) dir: &'a str,
    pub(crate) kind: EntryKind,
    pub(crate) attempt: Option<String>,
    pub(crate) entry: Option<Entry>,
    /// Whether the append was tried more than once (an earlier try may still
    /// be on its way to the server).
    pub(crate) retried: bool,
    /// The same-session queue permit: let go only once the entry is gone, so the
    /// next same-session contender never finds this entry still there.
    pub(crate) local: Option<OwnedMutexGuard<()>>,
}

impl PendingEntry<'_> {
    pub(crate) fn disarm(&mut self) {
        self.attempt = None;
        self.entry = None;
    }

    /// Removes the entry now (a `try_*` that lost, a deadline that passed); if
    /// that fails it is left to the background cleanup.
    pub(crate) async fn remove_now(&mut self) {
        let Some(entry) = self.entry.clone() else {
            return;
        };
        // A lock-mode request leaves as a release does (a release may have
        // handed it the lock meanwhile).
        let removal = async {
            if entry.kind == EntryKind::Dlm {
                crate::mode_rule::hand_over(
                    &*self.session.remote,
                    &self.session.counters,
                    self.dir,
                    &entry,
                    None,
                    None,
                )
                .await
            } else {
                self.session.remote.remove(&entry).await
            }
        };
        if let Ok(Ok(_)) = tokio::time::timeout(self.session.options.request_timeout(), removal).await {
            if self.retried {
                // Gone now; what an earlier try may still bring is fenced by
                // the attempt's abandonment, on drop.
                self.entry = None;
            } else {
                self.disarm();
            }
        }
    }
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        let local = self.local.take();
        let attempt = self.attempt.take();
        let entry = self.entry.take();
        // An append tried once that returned its entry made exactly that
        // entry: removing it removes everything the attempt made. Otherwise
        // (the append was cancelled in flight, or retried) the attempt is
        // abandoned as a whole: its entry if known, whatever else it made, and
        // whatever a try still on its way may make (DESIGN §6.10).
        match (attempt, entry) {
            (Some(attempt), entry) if self.retried || entry.is_none() => {
                self.session
                    .spawn_abandon(self.dir.to_owned(), self.kind, attempt, entry, local, None);
            }
            (_, Some(entry)) => {
                self.session
                    .spawn_remove_in(self.dir.to_owned(), entry, "cancelled acquire", local, None);
            }
            (_, None) => drop(local),
        }
    }
}
