//! Resources locked in the six lock modes of a distributed lock manager,
//! with conversions, a lock value block and blocking notifications.
//!
//! Every contender is one entry of [`EntryKind::Dlm`] whose value says its
//! state: the mode it asks for, whether it is granted (and in which mode,
//! with which token), and which modes waiters blocked by it asked for. The
//! rule is the one `lockline-model` checks (docs/design-notes.md):
//!
//! - a request is granted when its mode is compatible with every earlier
//!   entry, granted or waiting (a converting entry counts with both of its
//!   modes); otherwise it waits on the nearest earlier entry that blocks it;
//! - an up-conversion is granted when its new mode is compatible with every
//!   other granted entry and every earlier waiting request; otherwise it
//!   waits on the first of them in queue order; requests behind it count it
//!   with its new mode, so it has priority over them;
//! - a conversion that would close a cycle of entries waiting on each other
//!   fails at once, decided from the read that would mark it;
//! - a waiter wakes when the one entry it waits on is gone *or changed*
//!   (a down-conversion, a conversion granted or given up), reads once and
//!   decides again;
//! - a grant, and its decision, are one conditional update: it applies only
//!   if no entry the decision read has changed since; every grant, and
//!   every up-conversion to a writing mode, takes a fresh token from that
//!   update.
//!
//! The rule over one read of the queue, and the hand-over a release makes,
//! are in `mode_rule`; here are the resource, its requests and its guard's
//! conversions.

use std::fmt;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::{Acquire, PendingEntry};
use crate::backend::{Queue, QueueUpdate};
use crate::guard::{watch_entry, EntryWatch, Hold};
use crate::sequencer::Mode;
use crate::session::SessionInner;
use crate::wait::{Patience, Rule};
use crate::{AppendRequest, Conflicts, Entry, EntryKind, Error, FencingToken, LockMode, Result, Session, Write};

mod guard;

use crate::mode_rule::{blocks, Block, LockValue, State, View, LISTENING, TRY_REQUEST, WAITS};
use guard::Cell;
pub use guard::ResourceGuard;

/// The largest lock value block, in bytes.
pub const MAX_LOCK_VALUE: usize = 1024;

/// The first pause before retrying a transient failure; it doubles up to 1 s.
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);

/// How many entries before a new request its append reads back, where the
/// backend can read fewer than the whole queue (0: the whole queue). An EX
/// request is blocked by every entry before it but a settled NL holder, so a
/// few nearly always hold its blocker; a request in another mode may be
/// compatible with many (readers behind readers) and would then read the
/// whole queue after its window, so it reads the whole queue at once.
fn window(mode: LockMode) -> usize {
    if mode == LockMode::Ex {
        4
    } else {
        0
    }
}

/// A resource locked in one of the six [`LockMode`]s of a distributed lock
/// manager (VMS, the Linux kernel's `fs/dlm`): NL, CR, CW, PR, PW and EX,
/// with conversions in place, a lock value block and blocking notifications.
///
/// Contenders queue in creation order, every mode in one queue. A request
/// is granted when its mode is compatible with every earlier contender,
/// granted or waiting: a compatible newcomer never overtakes an earlier
/// waiter it conflicts with. A holder converts its lock in place
/// ([`ResourceGuard::convert`]): down at once, up with priority over every
/// request behind it. A conversion that would deadlock fails at once with
/// [`Error::Deadlock`]. Every grant, and every up-conversion to CW, PW or
/// EX, carries a fresh fencing token above every token granted before.
///
/// The read/write lock ([`RwLock`](crate::RwLock)) is the PR/EX special
/// case with its peers' layouts; a resource's entries are lockline's own,
/// and neither queues with another recipe under one name.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// use lockline::LockMode;
/// let client = lockline::Client::memory();
/// let (a, b) = (client.session().await?, client.session().await?);
/// let reader = a.resource("catalog")?.lock(LockMode::Pr).await?;
/// // One PW writer beside concurrent (CR) readers, not beside PR readers.
/// assert!(b.resource("catalog")?.try_lock(LockMode::Pw).await?.is_none());
/// let watcher = b.resource("catalog")?.lock(LockMode::Cr).await?;
/// reader.release().await?;
/// let mut writer = a.resource("catalog")?.lock(LockMode::Pw).await?;
/// writer.set_value(b"version 2")?;
/// writer.convert(LockMode::Cr).await?; // writes the value block
/// assert_eq!(watcher.value().bytes, b""); // as it was when granted
/// let again = b.resource("catalog")?.lock(LockMode::Pr).await?;
/// assert_eq!(again.value().bytes, b"version 2");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Resource {
    session: Session,
    name: Arc<str>,
    notify_blocking: bool,
    notify_on_try: bool,
    demote_on_deadlock: bool,
}

impl fmt::Debug for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resource")
            .field("name", &self.name)
            .field("session", &self.session.id())
            .finish()
    }
}

/// One contender of a resource, as [`Resource::contenders`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModeContender {
    /// The entry's key or path.
    pub key: String,
    /// The session that owns it, where the backend can tell.
    pub session: Option<String>,
    /// The mode held, or `None` for a request still waiting.
    pub granted: Option<LockMode>,
    /// The mode asked for (the mode held when settled).
    pub requested: LockMode,
    /// The grant's fencing token (`None` while waiting).
    pub token: Option<FencingToken>,
}

impl ModeContender {
    /// The mode a conversion in progress asks for.
    pub fn converting_to(&self) -> Option<LockMode> {
        self.granted.filter(|&g| g != self.requested).map(|_| self.requested)
    }
}

// The recipe's constructor on `Session` lives beside the recipe: `session`
// imports no recipe.
impl Session {
    /// A resource named `name`, locked in the six DLM lock modes (see
    /// [`Resource`]). No server call is made.
    ///
    /// # Errors
    ///
    /// As [`mutex`](Self::mutex).
    pub fn resource(&self, name: &str) -> Result<crate::Resource> {
        self.inner.check_name(name)?;
        self.inner.check_usable()?;
        Ok(crate::Resource::new(self.clone(), name))
    }
}

impl Resource {
    fn new(session: Session, name: &str) -> Self {
        Resource {
            session,
            name: name.into(),
            notify_blocking: false,
            notify_on_try: false,
            demote_on_deadlock: false,
        }
    }

    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes the locks taken through this resource hear of the waiters they
    /// block ([`ResourceGuard::blocking`]): their entries say so, from the
    /// request on, and a waiter marks the one entry it waits on when that
    /// entry listens. Without it no waiter writes a mark: a resource whose
    /// holders do not listen pays nothing for blocking notifications.
    #[must_use]
    pub fn notify_blocking(mut self) -> Self {
        self.notify_blocking = true;
        self
    }

    /// Makes `try_lock` and `try_convert` tell the listening holders they
    /// find in the way ([`ResourceGuard::blocking`]), as waiting requests
    /// always do.
    #[must_use]
    pub fn notify_on_try(mut self) -> Self {
        self.notify_on_try = true;
        self
    }

    /// Makes a conversion that would deadlock demote the lock to NL (as the
    /// Linux DLM's `DLM_LKF_CONVDEADLK` does) instead of keeping the mode it
    /// held. It still fails with [`Error::Deadlock`], naming NL as held.
    #[must_use]
    pub fn demote_on_deadlock(mut self) -> Self {
        self.demote_on_deadlock = true;
        self
    }

    fn acquire(&self, patience: Patience) -> Acquire<'_> {
        Acquire {
            session: &self.session,
            name: &self.name,
            kind: EntryKind::Dlm,
            rule: Rule::Exclusive,
            value: b"",
            local: false,
            patience,
        }
    }

    /// Waits until the resource is granted in `mode`.
    ///
    /// # Cancel safety
    ///
    /// Cancelling removes this contender from the queue; no entry is left behind.
    ///
    /// # Errors
    ///
    /// [`Error::SessionLost`] or [`Error::Closed`] when the session ends
    /// first, [`Error::InvalidName`] when another recipe queues under the
    /// name, [`Error::Unavailable`] when the server cannot be reached.
    pub async fn lock(&self, mode: LockMode) -> Result<ResourceGuard> {
        match self.request(mode, Patience::Forever).await? {
            Some(guard) => Ok(guard),
            None => Err(self.acquire(Patience::Forever).timeout_error(false)),
        }
    }

    /// Takes the resource in `mode` if that needs no wait; `Ok(None)`
    /// otherwise, leaving nothing behind.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    pub async fn try_lock(&self, mode: LockMode) -> Result<Option<ResourceGuard>> {
        self.request(mode, Patience::Never).await
    }

    /// As [`lock`](Self::lock), waiting at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when it runs out (the contender has left the
    /// queue), and as [`lock`](Self::lock).
    pub async fn lock_timeout(&self, mode: LockMode, timeout: Duration) -> Result<ResourceGuard> {
        let patience = if timeout.is_zero() {
            Patience::Never
        } else {
            crate::wait::patience_for(timeout)
        };
        match self.request(mode, patience).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::Timeout {
                name: self.name.to_string(),
                waited: timeout,
                held_by_this_session: false,
            }),
        }
    }

    /// Every contender in queue order, with its mode, its grant and its
    /// conversion. One read.
    ///
    /// # Cancel safety
    ///
    /// Only reads.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    pub async fn contenders(&self) -> Result<Vec<ModeContender>> {
        let inner = &self.session.inner;
        inner.check_usable()?;
        let queue = inner.call(inner.remote.read_queue(&self.name)).await?;
        let view = View::new(&self.name, queue)?;
        Ok(view
            .slots
            .into_iter()
            .map(|(slot, state)| ModeContender {
                key: slot.entry.key,
                session: slot.entry.owner,
                granted: state.granted,
                requested: state.requested,
                token: state.granted.map(|_| FencingToken::new(state.token)),
            })
            .collect())
    }

    async fn request(&self, mode: LockMode, patience: Patience) -> Result<Option<ResourceGuard>> {
        use tracing::Instrument;
        let span = tracing::debug_span!("lockline.acquire", lock = &*self.name, mode = %mode);
        self.request_inner(mode, patience).instrument(span).await
    }

    async fn request_inner(&self, mode: LockMode, patience: Patience) -> Result<Option<ResourceGuard>> {
        let acquire = self.acquire(patience);
        let inner = &self.session.inner;
        inner.check_usable()?;
        let attempt = uuid::Uuid::new_v4().simple().to_string();
        let mut pending = PendingEntry {
            session: inner,
            dir: &self.name,
            kind: EntryKind::Dlm,
            attempt: Some(attempt.clone()),
            entry: None,
            retried: false,
            local: None,
        };
        // A `try_` request is never handed the lock, nor is a request of a
        // session with a lock-delay: a hand-over cannot see the delay it
        // may owe, so it grants itself after serving it.
        let waits = if matches!(patience, Patience::Never) || !inner.options.lock_delay().is_zero() {
            0
        } else {
            WAITS
        };
        let value = State {
            blocked: if self.notify_blocking { LISTENING | waits } else { waits },
            conv: if matches!(patience, Patience::Never) {
                TRY_REQUEST
            } else {
                0
            },
            ..State::waiting(mode)
        }
        .encode();
        let request = AppendRequest {
            dir: &self.name,
            kind: EntryKind::Dlm,
            attempt: &attempt,
            value: &value,
            conflicts: Conflicts::All,
            nearest: window(mode),
        };
        let appended = acquire.append(&request, &mut pending).await?;
        let mine = appended.entry;
        // The queue as the append read it, where the backend could: the
        // first decision needs no read of its own.
        let mut read = appended.queue;
        let notify = !matches!(patience, Patience::Never) || self.notify_on_try;
        let mut own_watch: Option<EntryWatch> = None;
        let mut backoff = INITIAL_BACKOFF;
        // The entry this contender last waited on and saw go: how it went
        // decides a lock-delay.
        let mut last_gone: Option<Entry> = None;
        let delay = inner.options.lock_delay();
        let mut delayed = false;
        // Whether the last wait ended with a change of the entry waited on:
        // the next read may then be a prefix of the queue.
        let mut woken = false;
        loop {
            // Whether this is the append's window of the queue.
            let windowed = read.is_some() && request.nearest > 0;
            let mut prefix = false;
            let queue = match read.take() {
                Some(queue) => Ok(queue),
                None if std::mem::take(&mut woken) => acquire
                    .retrying(|| inner.remote.read_queue_woken(&self.name))
                    .await
                    .map(|(queue, whole)| {
                        prefix = !whole;
                        queue
                    }),
                None => acquire.retrying(|| inner.remote.read_queue(&self.name)).await,
            };
            let queue = match queue {
                Ok(queue) => queue,
                // The deadline passed while it read, perhaps woken by the
                // release that handed it the lock.
                Err(Error::Timeout { .. }) => {
                    return Ok(self.give_up(&mine, mode, &mut own_watch, &attempt, &mut pending).await);
                }
                Err(error) => return Err(error),
            };
            let view = View::new(&self.name, queue)?;
            let Some(at) = view.position(&mine) else {
                // Past the end of a prefix (another contender's wake read
                // it): read the whole queue.
                if prefix {
                    continue;
                }
                pending.disarm();
                return Err(inner.vanished_error(&mine.key).await);
            };
            // The append's window of the queue, when the backend read one
            // and it may not reach the head (exactly `nearest` entries
            // before this one: fewer reach the head, and more are the
            // whole queue, from a backend that reads no window): the
            // nearest blocker in it is the nearest of all (waiting on it is
            // what the whole queue would decide), but anything else is
            // decided from the whole.
            if windowed && at == request.nearest && view.blocker(at).is_none() {
                continue;
            }
            // Granted by the release of the entry it waited on, in that
            // release's write (the write's place in the server's order is
            // the token).
            let view = match self.handed(view, at, &mine, mode, &mut own_watch, &attempt, pending.retried) {
                Ok(guard) => {
                    pending.disarm();
                    inner.counters.bump(|c| &c.grants);
                    return Ok(Some(guard));
                }
                Err(view) => view,
            };
            // A prefix of the queue holds every entry before this one, so
            // its nearest blocker; nothing else is decided from it.
            if prefix && view.blocker(at).is_none() {
                continue;
            }
            let Some(on) = view.blocker(at) else {
                let state = inner.state();
                if state.is_over() {
                    return Err(inner.over_error(state));
                }
                // Next after a holder that lost its lock involuntarily: hold
                // back for the lock-delay, then look once more.
                let lost = last_gone.take().filter(|_| !delay.is_zero()).and_then(|gone| {
                    match inner.remote.departure(&gone) {
                        crate::backend::Departure::Lost { noticed } => Some(noticed + delay),
                        _ => None,
                    }
                });
                let hold_until = if let Some(until) = lost {
                    delayed = true;
                    Some(until)
                } else if let Some(until) = inner.remote.grant_not_before().filter(|&t| t > Instant::now()) {
                    Some(until)
                } else if !delayed && !delay.is_zero() && mode != LockMode::Nl && view.block.lost_holder(&view) {
                    // After a PW or EX holder lost its lock (the block still
                    // names it), the lock-delay too, once.
                    delayed = true;
                    Some(Instant::now() + delay)
                } else {
                    None
                };
                if let Some(until) = hold_until {
                    if acquire
                        .hold_back(&mine, until, &mut pending, &mut own_watch)
                        .await?
                        .is_some()
                    {
                        return Ok(None);
                    }
                    continue;
                }
                let granted = State {
                    blocked: view.slots[at].1.blocked & !WAITS,
                    ..State::held(mode, 0)
                }
                .encode();
                let block = if mode.sole_writer() {
                    Some(view.block.granted_to(&view, &mine))
                } else {
                    view.block.cleared_if_lost(&view)
                };
                let block_bytes = block.as_ref().map(Block::encode);
                let unchanged = view.unchanged(at);
                // A PW or EX grant writes again the earlier entries whose
                // grants may be pending from an older read (see
                // `View::pending_before`).
                let touched = if mode.sole_writer() {
                    view.pending_before(at, &[])
                } else {
                    Vec::new()
                };
                let mut set: Vec<(&Entry, &[u8])> = vec![(&mine, granted.as_slice())];
                set.extend(touched.iter().map(|(j, v)| (&view.slots[*j].0.entry, v.as_slice())));
                let update = QueueUpdate {
                    dir: &self.name,
                    unchanged: &unchanged,
                    present: &[],
                    set: &set,
                    delete: &[],
                    block: block_bytes.as_deref(),
                };
                let Some(token) = acquire.retrying(|| inner.remote.update_queue(&update)).await? else {
                    // Something the decision read changed meanwhile: read again.
                    continue;
                };
                pending.disarm();
                inner.counters.bump(|c| &c.grants);
                let value = match &block {
                    Some(block) if mode.sole_writer() => block.value.clone(),
                    _ => view.block.seen(&view),
                };
                // What its release decides from: the queue as read, with
                // the block as this grant left it.
                let granted_from = Some(View {
                    block: block.unwrap_or(view.block),
                    ..view
                });
                return Ok(Some(self.guard(
                    mine,
                    mode,
                    token,
                    value,
                    own_watch,
                    &attempt,
                    pending.retried,
                    granted_from,
                )));
            };
            let blocker = &view.slots[on].0;
            if let Patience::Never = patience {
                if notify {
                    self.mark(&view, at, on).await;
                }
                pending.remove_now().await;
                return Ok(None);
            }
            let mut seen = blocker.value.clone();
            if notify {
                if let Some(marked) = self.mark(&view, at, on).await {
                    seen = marked;
                }
            }
            let blocker = blocker.entry.clone();
            let deadline = patience.deadline();
            let own = own_watch.get_or_insert_with(|| watch_entry(inner, &mine));
            inner.counters.bump(|c| &c.waits);
            tokio::select! {
                biased;
                state = inner.over() => return Err(inner.over_error(state)),
                gone = own.as_mut() => {
                    acquire.own_watch_ended(gone, &mine, &mut pending, &mut own_watch, &mut backoff).await?;
                }
                changed = changed(inner, &blocker, seen, view.slots[at].1) => {
                    woken = woke(inner, &acquire, changed, blocker, &mut last_gone, &mut backoff).await?;
                }
                () = deadline => return Ok(self.give_up(&mine, mode, &mut own_watch, &attempt, &mut pending).await),
            }
        }
    }

    /// A timed request whose deadline passed: unless a release handed it
    /// the lock meanwhile (it was granted before it gave up, and keeps it),
    /// its entry leaves (as a release does, should a hand-over come in
    /// between) and it returns `None`.
    async fn give_up(
        &self,
        mine: &Entry,
        mode: LockMode,
        own_watch: &mut Option<EntryWatch>,
        attempt: &str,
        pending: &mut PendingEntry<'_>,
    ) -> Option<ResourceGuard> {
        let inner = &self.session.inner;
        let read = inner.call(inner.remote.read_queue(&self.name)).await;
        if let Ok(view) = read.and_then(|queue| View::new(&self.name, queue)) {
            if let Some(at) = view.position(mine) {
                if let Ok(guard) = self.handed(view, at, mine, mode, own_watch, attempt, pending.retried) {
                    pending.disarm();
                    inner.counters.bump(|c| &c.grants);
                    return Some(guard);
                }
            }
        }
        pending.remove_now().await;
        None
    }

    /// The guard of entry `at` (`mine`) when a release granted it `mode`
    /// in its own write: its token is that write's place in the server's
    /// order, its value the block that write left. The view goes to the
    /// guard (its release decides from it), or back when not granted.
    #[allow(clippy::too_many_arguments)]
    fn handed(
        &self,
        view: View,
        at: usize,
        mine: &Entry,
        mode: LockMode,
        own_watch: &mut Option<EntryWatch>,
        attempt: &str,
        retried: bool,
    ) -> std::result::Result<ResourceGuard, View> {
        let state = view.slots[at].1;
        if state.granted != Some(mode) || state.converting().is_some() {
            return Err(view);
        }
        let value = view.block.seen(&view);
        Ok(self.guard(
            mine.clone(),
            mode,
            state.token,
            value,
            own_watch.take(),
            attempt,
            retried,
            Some(view),
        ))
    }

    /// Marks the entry `on` with the mode entry `at` asks for, if it
    /// listens and is not marked with it yet: its holder's
    /// [`blocking`](ResourceGuard::blocking) then hears of it. Returns the
    /// value written. Best effort: a mark that fails is taken again on the
    /// next read, if still blocked.
    async fn mark(&self, view: &View, at: usize, on: usize) -> Option<Vec<u8>> {
        let (slot, state) = &view.slots[on];
        let asked = view.slots[at].1.requested;
        // A waiting request is marked too: its grant keeps the mark, so its
        // holder hears of the waiter behind it.
        let held = state.granted.is_some_and(|g| !g.compatible(asked));
        if !held && state.requested.compatible(asked) {
            return None;
        }
        if state.blocked & LISTENING == 0 || state.blocked & asked.bit() != 0 {
            return None;
        }
        let marked = State {
            blocked: state.blocked | asked.bit(),
            token: state.token,
            ..*state
        }
        .encode();
        let mine = &view.slots[at].0;
        let unchanged = [(&slot.entry, slot.version), (&mine.entry, mine.version)];
        let update = QueueUpdate {
            dir: &self.name,
            unchanged: &unchanged,
            present: &[],
            set: &[(&slot.entry, &marked)],
            delete: &[],
            block: None,
        };
        let inner = &self.session.inner;
        match inner.call(inner.remote.update_queue(&update)).await {
            Ok(Some(_)) => Some(marked),
            _ => None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn guard(
        &self,
        mine: Entry,
        mode: LockMode,
        token: u64,
        value: LockValue,
        own_watch: Option<EntryWatch>,
        attempt: &str,
        retried: bool,
        granted_from: Option<View>,
    ) -> ResourceGuard {
        let held = Entry {
            token: FencingToken::new(token),
            ..mine
        };
        let retried = retried.then(|| (self.name.to_string(), EntryKind::Dlm, attempt.to_owned()));
        let hold = Hold::new(
            self.session.clone(),
            held.clone(),
            None,
            own_watch,
            &self.name,
            Mode::Lock(mode),
            retried,
        );
        let mut guard = ResourceGuard {
            hold,
            resource: self.clone(),
            entry: held,
            cell: Arc::new(std::sync::Mutex::new(Cell {
                mode,
                token,
                value: value.clone(),
                pending: None,
                told: 0,
                uncertain: false,
            })),
        };
        guard.sync_release_block();
        guard.hold.set_release_view(granted_from);
        guard
    }
}

/// Resolves once `entry` is gone (`true`) or no longer blocks `me` (`false`):
/// a down-conversion, a conversion given up or granted. A change that
/// leaves it blocking (a request granted in the mode it asked for, a
/// waiter's mark) is watched past without a read: a release or a
/// conversion wakes only the waiters it lets on.
async fn changed(inner: &SessionInner, entry: &Entry, seen: Vec<u8>, me: State) -> Result<bool> {
    let wanted = move |value: &[u8]| !blocks(State::decode(value, 0), me);
    Ok(inner.remote.watch_blocker_until(entry, &seen, &wanted).await?.is_none())
}

/// What a waiter does once [`changed`] resolved (`changed`): counts the
/// wake-up, keeping the entry it waited on in `last_gone` if that entry is
/// gone (how it went decides a lock-delay), and returns `true`; or backs
/// off a transient failure of the watch, and returns `false`.
async fn woke(
    inner: &SessionInner,
    acquire: &Acquire<'_>,
    changed: Result<bool>,
    blocker: Entry,
    last_gone: &mut Option<Entry>,
    backoff: &mut Duration,
) -> Result<bool> {
    match changed {
        Ok(gone) => {
            inner.counters.bump(|c| &c.wakeups);
            *last_gone = gone.then_some(blocker);
            Ok(true)
        }
        Err(error) if error.is_transient() => acquire.back_off(&error, backoff).await.map(|()| false),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests;
