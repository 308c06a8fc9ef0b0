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

use std::fmt;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Queue, QueueUpdate, Slot};
use crate::guard::{watch_entry, EntryWatch, Hold};
use crate::sequencer::Mode;
use crate::session::SessionInner;
use crate::wait::{Acquire, Patience, PendingEntry, Rule};
use crate::{AppendRequest, Conflicts, Entry, EntryKind, Error, FencingToken, LockMode, Result, Session, Write};

/// The largest lock value block, in bytes.
pub const MAX_LOCK_VALUE: usize = 1024;

/// The first pause before retrying a transient failure; it doubles up to 1 s.
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------
// The state an entry's value carries.

/// One entry's state, as its value holds it: `dlm2 <granted|-> <requested>
/// <token> <blocked> <since> <conv> <nonce>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    /// The mode held, or `None` for a request still waiting.
    granted: Option<LockMode>,
    /// The mode asked for: the granted mode when settled, the new mode while
    /// converting, the request's mode while waiting.
    requested: LockMode,
    /// The grant's fencing token; 0: the token is the write that set this
    /// state (its [`Slot::changed`]).
    token: u64,
    /// The modes waiters blocked by this entry asked for (bits of
    /// [`LockMode::bit`]).
    blocked: u8,
    /// While converting: when the conversion was marked, in the server's
    /// order of writes (0 when written: that write's [`Slot::changed`]).
    /// Of the conversions on a cycle, the one marked last gives up.
    since: u64,
    /// While converting: the conversion's id, so that taking back a
    /// cancelled conversion never takes back a later one.
    conv: u32,
}

const STATE_HEAD: &str = "dlm2";

/// A bit of [`State::blocked`] beside the modes' bits: the entry's holder
/// listens for blocking notifications (its resource was made with
/// [`Resource::notify_blocking`]). Waiters mark only entries that carry it,
/// so a resource whose holders do not listen pays no write for them.
const LISTENING: u8 = 1 << 6;

impl State {
    fn waiting(mode: LockMode) -> State {
        State {
            granted: None,
            requested: mode,
            token: 0,
            blocked: 0,
            since: 0,
            conv: 0,
        }
    }

    fn held(mode: LockMode, token: u64) -> State {
        State {
            granted: Some(mode),
            requested: mode,
            token,
            blocked: 0,
            since: 0,
            conv: 0,
        }
    }

    fn converting(self) -> Option<LockMode> {
        self.granted.filter(|&g| g != self.requested).map(|_| self.requested)
    }

    /// The value bytes; a fresh nonce makes every write differ from every
    /// earlier one, so a watcher never misses a change that came back.
    fn encode(self) -> Vec<u8> {
        let granted = self.granted.map_or("-", LockMode::label);
        let nonce: u32 = rand_nonce();
        format!(
            "{STATE_HEAD} {granted} {} {} {} {} {} {nonce:08x}",
            self.requested, self.token, self.blocked, self.since, self.conv
        )
        .into_bytes()
    }

    /// Reads a value; one lockline did not write counts as a waiting EX
    /// request (it blocks everyone behind it, and nobody waits for it to be
    /// granted).
    fn decode(value: &[u8], changed: u64) -> State {
        Self::parse(value, changed).unwrap_or(State::waiting(LockMode::Ex))
    }

    fn parse(value: &[u8], changed: u64) -> Option<State> {
        let text = std::str::from_utf8(value).ok()?;
        let mut words = text.split(' ');
        if words.next()? != STATE_HEAD {
            return None;
        }
        let granted = match words.next()? {
            "-" => None,
            mode => Some(mode.parse().ok()?),
        };
        let requested = words.next()?.parse().ok()?;
        let token = match words.next()?.parse().ok()? {
            0 if granted.is_some() => changed,
            token => token,
        };
        let blocked = words.next()?.parse().ok()?;
        let converting = granted.is_some_and(|g| g != requested);
        let since = match words.next()?.parse().ok()? {
            0 if converting => changed,
            since => since,
        };
        let conv = words.next()?.parse().ok()?;
        Some(State {
            granted,
            requested,
            token,
            blocked,
            since,
            conv,
        })
    }
}

fn rand_nonce() -> u32 {
    let bytes = *uuid::Uuid::new_v4().as_bytes();
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

// ---------------------------------------------------------------------------
// The lock value block.

/// A resource's lock value block as a grant or a conversion found it (see
/// [`ResourceGuard::value`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockValue {
    /// The value last written by a PW or EX holder (empty if never written).
    pub bytes: Vec<u8>,
    /// How many times it was written: rises by one with each write.
    pub sequence: u64,
    /// `false` when a PW or EX holder lost its lock involuntarily (its
    /// session expired, its process died) since the last write: the value
    /// may be stale, until the next PW or EX holder writes it.
    pub valid: bool,
}

/// The block as stored: `lvb1 <sequence> <valid> <holder order> <holder key
/// length>\n<holder key><bytes>`. The holder is the PW or EX entry granted
/// since the last write, if any: its entry gone without a release that
/// cleared it means an involuntary loss.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Block {
    value: LockValue,
    holder: Option<(String, i64)>,
}

impl Block {
    fn fresh() -> Block {
        Block {
            value: LockValue {
                bytes: Vec::new(),
                sequence: 0,
                valid: true,
            },
            holder: None,
        }
    }

    fn encode(&self) -> Vec<u8> {
        let (key, order) = self.holder.as_ref().map_or(("", 0), |(k, o)| (k.as_str(), *o));
        let mut out = format!(
            "lvb1 {} {} {order} {}\n{key}",
            self.value.sequence,
            u8::from(self.value.valid),
            key.len()
        )
        .into_bytes();
        out.extend_from_slice(&self.value.bytes);
        out
    }

    fn decode(stored: Option<&[u8]>) -> Block {
        let Some(stored) = stored else {
            return Block::fresh();
        };
        Self::parse(stored).unwrap_or(Block {
            value: LockValue {
                bytes: Vec::new(),
                sequence: 0,
                valid: false,
            },
            holder: None,
        })
    }

    fn parse(stored: &[u8]) -> Option<Block> {
        let line_end = stored.iter().position(|&b| b == b'\n')?;
        let head = std::str::from_utf8(&stored[..line_end]).ok()?;
        let mut words = head.split(' ');
        if words.next()? != "lvb1" {
            return None;
        }
        let sequence = words.next()?.parse().ok()?;
        let valid = words.next()? == "1";
        let order: i64 = words.next()?.parse().ok()?;
        let key_len: usize = words.next()?.parse().ok()?;
        let rest = &stored[line_end + 1..];
        if rest.len() < key_len {
            return None;
        }
        let key = std::str::from_utf8(&rest[..key_len]).ok()?;
        Some(Block {
            value: LockValue {
                bytes: rest[key_len..].to_vec(),
                sequence,
                valid,
            },
            holder: (!key.is_empty()).then(|| (key.to_owned(), order)),
        })
    }

    /// The value as a holder granted now sees it, given the queue it was
    /// granted from.
    fn seen(&self, view: &View) -> LockValue {
        let mut value = self.value.clone();
        if let Some((key, order)) = &self.holder {
            let alive = view.slots.iter().any(|(slot, state)| {
                slot.entry.key == *key && slot.entry.order == *order && state.granted.is_some_and(LockMode::sole_writer)
            });
            value.valid &= alive;
        }
        value
    }

    /// Whether the block names a PW or EX holder whose entry is gone: it
    /// lost its lock without a release (or was dropped).
    fn lost_holder(&self, view: &View) -> bool {
        self.holder.as_ref().is_some_and(|(key, order)| {
            !view
                .slots
                .iter()
                .any(|(slot, _)| slot.entry.key == *key && slot.entry.order == *order)
        })
    }

    /// The block a grant outside PW and EX writes: `None` (no write) unless
    /// it names a lost holder, which it then clears, keeping the block not
    /// valid (a lock-delay after that loss is served once).
    fn cleared_if_lost(&self, view: &View) -> Option<Block> {
        self.lost_holder(view).then(|| Block {
            value: self.seen(view),
            holder: None,
        })
    }

    /// The block a PW or EX grant writes: it names the new holder, and
    /// keeps the knowledge that an earlier one was lost.
    fn granted_to(&self, view: &View, entry: &Entry) -> Block {
        Block {
            value: self.seen(view),
            holder: Some((entry.key.clone(), entry.order)),
        }
    }
}

// ---------------------------------------------------------------------------
// The rule, over one read.

/// One read of a resource, decoded.
#[derive(Debug)]
struct View {
    slots: Vec<(Slot, State)>,
    block: Block,
}

impl View {
    fn new(name: &str, queue: Queue) -> Result<View> {
        if let Some(other) = queue.slots.iter().find(|s| s.entry.kind != EntryKind::Dlm) {
            return Err(Error::mixed_recipes(name, EntryKind::Dlm, &other.entry));
        }
        let block = Block::decode(queue.block.as_deref());
        let slots = queue
            .slots
            .into_iter()
            .map(|slot| {
                let state = State::decode(&slot.value, slot.changed);
                (slot, state)
            })
            .collect();
        Ok(View { slots, block })
    }

    fn position(&self, entry: &Entry) -> Option<usize> {
        self.slots
            .iter()
            .position(|(s, _)| s.entry.key == entry.key && s.entry.order == entry.order)
    }

    /// Every entry that keeps entry `at` from being granted, in queue order.
    fn blockers(&self, at: usize) -> Vec<usize> {
        let me = self.slots[at].1;
        match me.granted {
            Some(_) => {
                let Some(target) = me.converting() else {
                    return Vec::new();
                };
                (0..self.slots.len())
                    .filter(|&j| j != at)
                    .filter(|&j| {
                        let other = self.slots[j].1;
                        match other.granted {
                            Some(held) => !held.compatible(target),
                            None => j < at && !other.requested.compatible(target),
                        }
                    })
                    .collect()
            }
            None => (0..at)
                .filter(|&j| {
                    let other = self.slots[j].1;
                    let held = other.granted.is_some_and(|g| !g.compatible(me.requested));
                    held || !other.requested.compatible(me.requested)
                })
                .collect(),
        }
    }

    /// The one entry `at` waits on: a conversion the first blocker in queue
    /// order, a request the nearest earlier one.
    fn blocker(&self, at: usize) -> Option<usize> {
        let blockers = self.blockers(at);
        if self.slots[at].1.granted.is_some() {
            blockers.first().copied()
        } else {
            blockers.last().copied()
        }
    }

    /// Whether `from` reaches `to` through entries that wait.
    fn reaches(&self, from: usize, to: usize) -> bool {
        let waits = |j: usize| {
            let state = self.slots[j].1;
            state.granted.is_none() || state.converting().is_some()
        };
        let mut seen = Vec::new();
        let mut stack = vec![from];
        while let Some(at) = stack.pop() {
            for next in self.blockers(at) {
                if next == to {
                    return true;
                }
                if waits(next) && !seen.contains(&next) {
                    seen.push(next);
                    stack.push(next);
                }
            }
        }
        false
    }

    /// Whether the conversion `at` lies on a cycle that its own mark closed:
    /// a cycle through waiting entries none of whose other conversions was
    /// marked after it (ties: the later entry). That conversion gives up;
    /// a cycle closed by a later mark is that one's to break. (Deferring to
    /// any later mark on a cycle is wrong: that mark may close another
    /// cycle, and once it is taken back the first one stands with no one
    /// awake to see it — the model's `DeferToAnyLaterMark`.)
    fn closes_cycle(&self, at: usize) -> bool {
        let key = |j: usize| (self.slots[j].1.since, self.slots[j].0.entry.order);
        let passable = |j: usize| {
            let state = self.slots[j].1;
            match state.converting() {
                Some(_) => key(j) < key(at),
                None => state.granted.is_none(),
            }
        };
        let mut seen = Vec::new();
        let mut stack = vec![at];
        while let Some(from) = stack.pop() {
            for next in self.blockers(from) {
                if next == at {
                    return true;
                }
                if passable(next) && !seen.contains(&next) {
                    seen.push(next);
                    stack.push(next);
                }
            }
        }
        false
    }

    /// Whether `at` lies on a cycle of entries that wait on each other.
    fn in_cycle(&self, at: usize) -> bool {
        self.reaches(at, at)
    }

    /// The condition of a decision on entry `at`: every entry the rule
    /// looked at, at the version read. A request looks at the entries
    /// before it; a conversion at all of them.
    fn unchanged(&self, at: usize) -> Vec<(&Entry, i64)> {
        let upto = if self.slots[at].1.granted.is_some() {
            self.slots.len()
        } else {
            at + 1
        };
        self.slots[..upto].iter().map(|(s, _)| (&s.entry, s.version)).collect()
    }
}

// ---------------------------------------------------------------------------
// The recipe.

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

impl Resource {
    pub(crate) fn new(session: Session, name: &str) -> Self {
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
        let value = State {
            blocked: if self.notify_blocking { LISTENING } else { 0 },
            ..State::waiting(mode)
        }
        .encode();
        let request = AppendRequest {
            dir: &self.name,
            kind: EntryKind::Dlm,
            attempt: &attempt,
            value: &value,
            conflicts: Conflicts::All,
            nearest: 0,
        };
        let tries = std::sync::atomic::AtomicU32::new(0);
        let appended = acquire
            .retrying(|| {
                tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                inner.remote.append(&request)
            })
            .await;
        pending.retried = tries.load(std::sync::atomic::Ordering::Relaxed) > 1;
        if let Err(error) = &appended {
            if error.is_refusal() && !pending.retried {
                pending.disarm();
            }
        }
        let mine = appended?.entry;
        inner.counters.bump(|c| &c.appends);
        pending.entry = Some(mine.clone());
        let notify = !matches!(patience, Patience::Never) || self.notify_on_try;
        let mut own_watch: Option<EntryWatch> = None;
        let mut backoff = INITIAL_BACKOFF;
        // The entry this contender last waited on and saw go: how it went
        // decides a lock-delay.
        let mut last_gone: Option<Entry> = None;
        let delay = inner.options.lock_delay();
        let mut delayed = false;
        loop {
            let queue = acquire.retrying(|| inner.remote.read_queue(&self.name)).await?;
            let view = View::new(&self.name, queue)?;
            let Some(at) = view.position(&mine) else {
                pending.disarm();
                return Err(inner.vanished_error(&mine.key).await);
            };
            let Some(on) = view.blocker(at) else {
                let state = inner.state();
                if state.is_over() {
                    return Err(inner.over_error(state));
                }
                // Next after a holder that lost its lock involuntarily: hold
                // back for the lock-delay, then look once more.
                if let Some(gone) = last_gone.take().filter(|_| !delay.is_zero()) {
                    if let crate::backend::Departure::Lost { noticed } = inner.remote.departure(&gone) {
                        delayed = true;
                        if acquire
                            .hold_back(&mine, noticed + delay, &mut pending, &mut own_watch)
                            .await?
                            .is_some()
                        {
                            return Ok(None);
                        }
                        continue;
                    }
                }
                if let Some(until) = inner.remote.grant_not_before().filter(|&t| t > Instant::now()) {
                    if acquire
                        .hold_back(&mine, until, &mut pending, &mut own_watch)
                        .await?
                        .is_some()
                    {
                        return Ok(None);
                    }
                    continue;
                }
                // After a PW or EX holder lost its lock (the block still
                // names it), the lock-delay too, once.
                if !delayed && !delay.is_zero() && mode != LockMode::Nl && view.block.lost_holder(&view) {
                    delayed = true;
                    let until = Instant::now() + delay;
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
                    blocked: view.slots[at].1.blocked,
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
                let update = QueueUpdate {
                    dir: &self.name,
                    unchanged: &unchanged,
                    present: &[],
                    set: &[(&mine, &granted)],
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
                return Ok(Some(self.guard(
                    mine,
                    mode,
                    token,
                    value,
                    own_watch,
                    &attempt,
                    pending.retried,
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
                gone = own.as_mut() => match gone {
                    Ok(()) => {
                        pending.disarm();
                        return Err(inner.vanished_error(&mine.key).await);
                    }
                    Err(error) if error.is_transient() => {
                        own_watch = None;
                        acquire.back_off(&error, &mut backoff).await?;
                    }
                    Err(error) => return Err(error),
                },
                changed = changed(inner, &blocker, seen, view.slots[at].1) => match changed {
                    Ok(gone) => {
                        inner.counters.bump(|c| &c.wakeups);
                        last_gone = gone.then_some(blocker);
                    }
                    Err(error) if error.is_transient() => acquire.back_off(&error, &mut backoff).await?,
                    Err(error) => return Err(error),
                },
                () = deadline => {
                    pending.remove_now().await;
                    return Ok(None);
                }
            }
        }
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
        guard
    }
}

/// What a guard knows of its lock, changed by conversions.
#[derive(Debug)]
struct Cell {
    mode: LockMode,
    token: u64,
    /// The value block as the grant or the last up-conversion found it.
    value: LockValue,
    /// A value set by [`ResourceGuard::set_value`], written when the lock
    /// leaves PW and EX.
    pending: Option<Vec<u8>>,
    /// The blocked modes the holder was told of.
    told: u8,
    /// A conversion's write was sent and its answer never came: the mode
    /// above may be less than what the server holds, until a read tells.
    uncertain: bool,
}

/// A resource held in a [`LockMode`]. Dropped without
/// [`release`](Self::release), it releases in the background (a PW or EX
/// holder writes its value block then too).
#[must_use = "dropping the guard releases the lock"]
pub struct ResourceGuard {
    hold: Hold,
    resource: Resource,
    entry: Entry,
    cell: Arc<std::sync::Mutex<Cell>>,
}

impl fmt::Debug for ResourceGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceGuard")
            .field("key", &self.entry.key)
            .field("mode", &self.mode())
            .field("token", &self.token())
            .finish()
    }
}

impl ResourceGuard {
    fn cell(&self) -> std::sync::MutexGuard<'_, Cell> {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mode the lock is held in now.
    pub fn mode(&self) -> LockMode {
        self.cell().mode
    }

    /// The fencing token of the grant, or of the last up-conversion to CW,
    /// PW or EX: above every token granted on this resource before it.
    pub fn token(&self) -> FencingToken {
        FencingToken::new(self.cell().token)
    }

    /// The entry's key (etcd) or path (ZooKeeper).
    pub fn key(&self) -> &str {
        &self.entry.key
    }

    /// A sequencer for the lock as held now (`lock-MODE`, the token): a
    /// resource that cannot keep the highest token it has seen asks
    /// [`Client::check`](crate::Client::check) whether it is still current.
    /// It stops being current when the lock is released, lost or converted.
    pub fn sequencer(&self) -> crate::Sequencer {
        let cell = self.cell();
        crate::Sequencer::new(
            &*self.resource.name,
            Mode::Lock(cell.mode),
            FencingToken::new(cell.token),
        )
    }

    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.resource.name
    }

    /// The session that holds the lock.
    pub fn session(&self) -> &Session {
        self.hold.session()
    }

    /// Whether the lock is still held, as far as this client knows.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Resolves once the lock may no longer be held (see
    /// [`MutexGuard::lost`](crate::MutexGuard::lost)).
    ///
    /// # Cancel safety
    ///
    /// Only waits; cancelling it changes nothing.
    pub async fn lost(&self) {
        self.hold.lost().await;
    }

    /// The lock value block as the grant, or the last up-conversion, found
    /// it (with this holder's own [`set_value`](Self::set_value) once it is
    /// written).
    pub fn value(&self) -> LockValue {
        self.cell().value.clone()
    }

    /// Sets the lock value block, written when this lock leaves PW and EX
    /// (its release or a down-conversion), fenced like any write: a holder
    /// that lost its lock writes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::WrongMode`] unless held in PW or EX;
    /// [`Error::InvalidOptions`] for more than [`MAX_LOCK_VALUE`] bytes.
    pub fn set_value(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_LOCK_VALUE {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "a lock value block holds at most {MAX_LOCK_VALUE} bytes, not {}",
                    bytes.len()
                ),
            });
        }
        let mode = self.mode();
        if !mode.sole_writer() {
            return Err(self.wrong_mode("set the lock value block", "PW or EX", mode));
        }
        self.cell().pending = Some(bytes.to_vec());
        self.sync_release_block();
        Ok(())
    }

    fn wrong_mode(&self, operation: &'static str, needs: &'static str, held: LockMode) -> Error {
        Error::WrongMode {
            name: self.resource.name.to_string(),
            operation,
            needs,
            held,
        }
    }

    /// The block this holder writes when it leaves PW and EX now.
    fn leaving_block(&self) -> Option<Vec<u8>> {
        let cell = self.cell();
        if !cell.mode.sole_writer() {
            return None;
        }
        let mut value = cell.value.clone();
        if let Some(bytes) = &cell.pending {
            value.bytes.clone_from(bytes);
            value.sequence += 1;
            value.valid = true;
        }
        Some(Block { value, holder: None }.encode())
    }

    fn sync_release_block(&mut self) {
        let block = self.leaving_block();
        self.hold.set_release_block(block);
    }

    /// Applies `writes` only while the lock is held in CW, PW or EX (see
    /// [`MutexGuard::write_if_held`](crate::MutexGuard::write_if_held)).
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the writes may or may not have been applied, all or none.
    ///
    /// # Errors
    ///
    /// [`Error::WrongMode`] in NL, CR or PR; otherwise as
    /// [`MutexGuard::write_if_held`](crate::MutexGuard::write_if_held).
    pub async fn write_if_held(&self, writes: impl IntoIterator<Item = Write>) -> Result<()> {
        let mode = self.mode();
        if !mode.writes() {
            return Err(self.wrong_mode("fenced writes", "CW, PW or EX", mode));
        }
        self.hold.write_if_held(writes.into_iter().collect()).await
    }

    /// Resolves with a mode that a waiter blocked by this lock asks for,
    /// once per mode: the DLM's blocking notification. A caching holder
    /// then converts down or releases. Only for a lock taken through a
    /// resource made with [`Resource::notify_blocking`]. Waiting requests
    /// always tell the holder they wait on; `try_lock` calls only with
    /// [`Resource::notify_on_try`].
    ///
    /// # Cancel safety
    ///
    /// Cancelling it loses no notification: the next call hears it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a lock whose resource was not made
    /// with [`Resource::notify_blocking`] (no waiter would ever tell it);
    /// as [`release`](Self::release) when the lock is lost.
    pub async fn blocking(&self) -> Result<LockMode> {
        if !self.resource.notify_blocking {
            return Err(Error::InvalidOptions {
                reason: format!(
                    "{:?} hears of no waiter: take it through `Resource::notify_blocking()` to call `blocking()`",
                    &*self.resource.name
                ),
            });
        }
        let inner = &self.hold.session().inner;
        let mut seen = match inner.call(inner.remote.get_value(&self.entry)).await? {
            Some(value) => value,
            None => return Err(inner.vanished_error(&self.entry.key).await),
        };
        loop {
            let state = State::decode(&seen, 0);
            {
                let mut cell = self.cell();
                let fresh = state.blocked & !cell.told;
                let mode = cell.mode;
                if let Some(asked) = LockMode::ALL
                    .into_iter()
                    .rev()
                    .find(|m| fresh & m.bit() != 0 && !m.compatible(mode))
                {
                    cell.told |= asked.bit();
                    return Ok(asked);
                }
            }
            let watched = tokio::select! {
                biased;
                state = inner.over() => return Err(inner.over_error(state)),
                watched = inner.remote.watch_value(&self.entry, &seen) => watched,
            };
            match watched {
                Ok(Some(value)) => seen = value,
                Ok(None) => return Err(inner.vanished_error(&self.entry.key).await),
                Err(error) if error.is_transient() => {
                    tokio::time::sleep(INITIAL_BACKOFF).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Converts the lock to `mode` in place, keeping its place in the
    /// queue: a down-conversion at once, an up-conversion once every other
    /// holder is compatible with `mode`, ahead of every request behind it.
    ///
    /// # Cancel safety
    ///
    /// Cancelling an up-conversion gives it up: the lock keeps the mode it
    /// held (a background cleanup takes the conversion back).
    ///
    /// # Errors
    ///
    /// [`Error::Deadlock`] when it would wait for ever (the lock keeps its
    /// mode, or is NL with [`Resource::demote_on_deadlock`]); as
    /// [`release`](Self::release) when the lock is lost, as soon as
    /// [`lost`](Self::lost) would resolve, whatever request of the
    /// conversion is still in flight (the guard is borrowed while it
    /// converts, so the call itself tells of the loss).
    pub async fn convert(&mut self, mode: LockMode) -> Result<()> {
        self.converting(mode, Patience::Forever).await.map(|_| ())
    }

    /// Converts only if that needs no wait; `Ok(false)` otherwise, the mode
    /// unchanged. A conversion that would deadlock fails as
    /// [`convert`](Self::convert) does (demoted to NL with
    /// [`Resource::demote_on_deadlock`]).
    ///
    /// # Cancel safety
    ///
    /// As [`convert`](Self::convert).
    ///
    /// # Errors
    ///
    /// As [`convert`](Self::convert).
    pub async fn try_convert(&mut self, mode: LockMode) -> Result<bool> {
        self.converting(mode, Patience::Never).await
    }

    /// As [`convert`](Self::convert), waiting at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`convert`](Self::convert).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when it runs out (the mode unchanged), and as
    /// [`convert`](Self::convert).
    pub async fn convert_timeout(&mut self, mode: LockMode, timeout: Duration) -> Result<()> {
        let patience = if timeout.is_zero() {
            Patience::Never
        } else {
            crate::wait::patience_for(timeout)
        };
        if self.converting(mode, patience).await? {
            Ok(())
        } else {
            Err(Error::Timeout {
                name: self.resource.name.to_string(),
                waited: timeout,
                held_by_this_session: false,
            })
        }
    }

    async fn converting(&mut self, mode: LockMode, patience: Patience) -> Result<bool> {
        if let Some(error) = self.known_loss().await {
            return Err(error);
        }
        // The whole conversion ends as soon as the lock is lost, a request
        // of it still in flight or not (one stuck in an outage runs until
        // the request timeout, past the loss deadline): its holder cannot
        // watch `lost()` while it converts, the guard being borrowed.
        let lost = self.hold.lost_owned();
        let outcome = tokio::select! {
            biased;
            () = lost => None,
            outcome = self.convert_now(mode, patience) => Some(outcome),
        };
        match outcome {
            Some(outcome) => outcome,
            None => Err(self.known_loss().await.unwrap_or_else(|| Error::LockLost {
                key: self.entry.key.clone(),
            })),
        }
    }

    async fn convert_now(&mut self, mode: LockMode, patience: Patience) -> Result<bool> {
        self.resync().await?;
        let from = self.mode();
        if mode == from {
            return Ok(true);
        }
        if mode.is_down_from(from) {
            self.down(mode).await?;
            return Ok(true);
        }
        let mut cleanup = ConversionCleanup {
            session: self.hold.session().clone(),
            name: self.resource.name.clone(),
            entry: self.entry.clone(),
            conv: None,
        };
        let outcome = self.up(mode, patience, &mut cleanup).await;
        match &outcome {
            // Granted: nothing to take back.
            Ok(true) => cleanup.conv = None,
            // Given up or failed: take the mark back now (a drop meanwhile
            // leaves it to the background).
            Ok(false) | Err(_) => cleanup.take_back().await,
        }
        outcome
    }

    async fn known_loss(&self) -> Option<Error> {
        if self.hold.is_held() {
            return None;
        }
        let inner = &self.hold.session().inner;
        let state = inner.state();
        Some(if state.is_over() {
            inner.over_error(state)
        } else {
            inner.vanished_error(&self.entry.key).await
        })
    }

    /// After a conversion whose answer never came (the call was cancelled
    /// in flight), reads what the server holds for this lock: the guard
    /// under-claims meanwhile (the mode before an up-conversion, the mode
    /// after a down-conversion), never over-claims.
    async fn resync(&mut self) -> Result<()> {
        if !self.cell().uncertain {
            return Ok(());
        }
        let inner = self.hold.session().inner.clone();
        let queue = inner.call(inner.remote.read_queue(&self.resource.name)).await?;
        let Some(slot) = queue
            .slots
            .iter()
            .find(|s| s.entry.key == self.entry.key && s.entry.order == self.entry.order)
        else {
            return Err(inner.vanished_error(&self.entry.key).await);
        };
        let state = State::decode(&slot.value, slot.changed);
        let block = Block::decode(queue.block.as_deref());
        {
            let mut cell = self.cell();
            if let Some(held) = state.granted {
                if held != cell.mode {
                    // Entering PW or EX, the grant read the block as it is
                    // now (no one else writes it meanwhile).
                    if held.sole_writer() && !cell.mode.sole_writer() {
                        cell.value = block.value;
                    }
                    cell.mode = held;
                    cell.token = state.token;
                    cell.told = 0;
                }
            }
            cell.uncertain = false;
        }
        self.sync_release_block();
        Ok(())
    }

    /// A down-conversion: one write (a listening lock's reads first, to keep
    /// the marks of the waiters it still blocks).
    async fn down(&mut self, mode: LockMode) -> Result<()> {
        let inner = self.hold.session().inner.clone();
        let token = self.cell().token;
        let block = (!mode.sole_writer()).then(|| self.leaving_block()).flatten();
        // The lower mode first: a call cancelled in flight leaves the guard
        // claiming less than the server may hold, never more.
        let pending = {
            let mut cell = self.cell();
            cell.uncertain = true;
            cell.mode = mode;
            cell.told = 0;
            if block.is_some() {
                cell.pending.take()
            } else {
                None
            }
        };
        self.hold.set_release_block(None);
        if self.resource.notify_blocking {
            self.down_keeping_marks(mode, token, block.as_deref()).await?;
        } else {
            // No waiter marks a lock that does not listen: one write, at
            // whatever version.
            let value = State::held(mode, token).encode();
            let update = QueueUpdate {
                dir: &self.resource.name,
                unchanged: &[],
                present: &[&self.entry],
                set: &[(&self.entry, &value)],
                delete: &[],
                block: block.as_deref(),
            };
            if inner.call(inner.remote.update_queue(&update)).await?.is_none() {
                return Err(inner.vanished_error(&self.entry.key).await);
            }
        }
        {
            let mut cell = self.cell();
            if let Some(bytes) = pending {
                cell.value.bytes = bytes;
                cell.value.sequence += 1;
                cell.value.valid = true;
            }
            cell.uncertain = false;
        }
        self.sync_release_block();
        Ok(())
    }

    /// A listening lock's down-conversion: one read, then one write
    /// conditioned on the entry as read, keeping the marks of the waiters it
    /// still blocks (its holder is told of them again).
    async fn down_keeping_marks(&self, mode: LockMode, token: u64, block: Option<&[u8]>) -> Result<()> {
        let inner = &self.hold.session().inner;
        loop {
            let queue = inner.call(inner.remote.read_queue(&self.resource.name)).await?;
            let Some(slot) = queue
                .slots
                .iter()
                .find(|s| s.entry.key == self.entry.key && s.entry.order == self.entry.order)
            else {
                return Err(inner.vanished_error(&self.entry.key).await);
            };
            let marks = State::decode(&slot.value, slot.changed).blocked;
            let still = LockMode::ALL
                .into_iter()
                .filter(|m| marks & m.bit() != 0 && !m.compatible(mode))
                .fold(marks & LISTENING, |bits, m| bits | m.bit());
            let value = State {
                blocked: still,
                ..State::held(mode, token)
            }
            .encode();
            let unchanged = [(&slot.entry, slot.version)];
            let update = QueueUpdate {
                dir: &self.resource.name,
                unchanged: &unchanged,
                present: &[],
                set: &[(&self.entry, &value)],
                delete: &[],
                block,
            };
            if inner.call(inner.remote.update_queue(&update)).await?.is_some() {
                return Ok(());
            }
        }
    }

    /// An up-conversion: mark the entry as converting (conditioned on its
    /// own version only), then read again and decide from that read alone:
    /// whatever was granted without seeing the mark had its grant
    /// conditioned on this entry's earlier version, so it was granted
    /// before the mark and shows in the read; whatever reads after the mark
    /// counts this entry with its new mode. Of the conversions on a cycle,
    /// the one marked last gives up.
    async fn up(&mut self, mode: LockMode, patience: Patience, cleanup: &mut ConversionCleanup) -> Result<bool> {
        let session = self.hold.session().clone();
        let inner = &session.inner;
        let acquire = self.resource.acquire(patience);
        let from = self.mode();
        let token = self.cell().token;
        let notify = !matches!(patience, Patience::Never) || self.resource.notify_on_try;
        let delay = inner.options.lock_delay();
        let mut delayed = false;
        let mut last_gone: Option<Entry> = None;
        let mut backoff = INITIAL_BACKOFF;
        loop {
            let queue = acquire
                .retrying(|| inner.remote.read_queue(&self.resource.name))
                .await?;
            let mut view = View::new(&self.resource.name, queue)?;
            let Some(at) = view.position(&self.entry) else {
                return Err(inner.vanished_error(&self.entry.key).await);
            };
            let mine = view.slots[at].1;
            let marked = cleanup
                .conv
                .is_some_and(|conv| mine.converting() == Some(mode) && mine.conv == conv);
            if !marked {
                // As if marked: a conversion that would wait and close a
                // cycle of marks already there is the last one; one that
                // would wait in a try gives up before writing anything.
                view.slots[at].1.requested = mode;
                if view.blocker(at).is_some() {
                    if view.in_cycle(at) {
                        return Err(self.deadlock(from, mode).await);
                    }
                    if let Patience::Never = patience {
                        if notify {
                            if let Some(on) = view.blocker(at) {
                                self.resource.mark(&view, at, on).await;
                            }
                        }
                        return Ok(false);
                    }
                }
                let conv = rand_nonce() | 1;
                let value = State {
                    granted: Some(from),
                    requested: mode,
                    token,
                    blocked: mine.blocked,
                    since: 0,
                    conv,
                }
                .encode();
                let slot = &view.slots[at].0;
                let unchanged = [(&slot.entry, slot.version)];
                let update = QueueUpdate {
                    dir: &self.resource.name,
                    unchanged: &unchanged,
                    present: &[],
                    set: &[(&slot.entry, &value)],
                    delete: &[],
                    block: None,
                };
                // Armed before the write: a mark whose answer is lost (and
                // whose retry then fails its condition) is still taken back.
                cleanup.conv = Some(conv);
                acquire.retrying(|| inner.remote.update_queue(&update)).await?;
                continue;
            }
            if view.closes_cycle(at) {
                return Err(self.deadlock(from, mode).await);
            }
            let Some(on) = view.blocker(at) else {
                // Next after a holder that lost its lock involuntarily: the
                // lock-delay first.
                let lost = last_gone
                    .take()
                    .filter(|_| !delay.is_zero())
                    .map(|gone| inner.remote.departure(&gone));
                let noticed = match lost {
                    Some(crate::backend::Departure::Lost { noticed }) => Some(noticed),
                    _ if !delayed && !delay.is_zero() && view.block.lost_holder(&view) => Some(Instant::now()),
                    _ => None,
                };
                if let Some(noticed) = noticed.filter(|_| mode != LockMode::Nl) {
                    delayed = true;
                    inner.counters.bump(|c| &c.lock_delays);
                    if !self.pause_until(noticed + delay, patience).await? {
                        return Ok(false);
                    }
                    continue;
                }
                let granted_token = if mode.writes() { 0 } else { token };
                let value = State {
                    blocked: mine.blocked,
                    ..State::held(mode, granted_token)
                }
                .encode();
                let block = if mode.sole_writer() && !from.sole_writer() {
                    Some(view.block.granted_to(&view, &self.entry))
                } else {
                    view.block.cleared_if_lost(&view)
                };
                let block_bytes = block.as_ref().map(Block::encode);
                let unchanged = view.unchanged(at);
                let update = QueueUpdate {
                    dir: &self.resource.name,
                    unchanged: &unchanged,
                    present: &[],
                    set: &[(&self.entry, &value)],
                    delete: &[],
                    block: block_bytes.as_deref(),
                };
                // The grant's answer is awaited past the deadline (within the
                // request timeout): a grant the server made is never reported
                // as a timeout. The guard claims nothing new until it comes.
                self.cell().uncertain = true;
                let Some(fresh) = self.granting(&update).await? else {
                    self.cell().uncertain = false;
                    continue;
                };
                let mut cell = self.cell();
                cell.mode = mode;
                cell.told = 0;
                cell.uncertain = false;
                if mode.writes() {
                    cell.token = fresh;
                }
                cell.value = match &block {
                    Some(block) if mode.sole_writer() && !from.sole_writer() => block.value.clone(),
                    _ => view.block.seen(&view),
                };
                drop(cell);
                self.sync_release_block();
                return Ok(true);
            };
            if let Patience::Never = patience {
                if notify {
                    self.resource.mark(&view, at, on).await;
                }
                return Ok(false);
            }
            let mut seen = view.slots[on].0.value.clone();
            if notify {
                if let Some(written) = self.resource.mark(&view, at, on).await {
                    seen = written;
                }
            }
            let blocker = view.slots[on].0.entry.clone();
            let deadline = patience.deadline();
            inner.counters.bump(|c| &c.waits);
            tokio::select! {
                biased;
                state = inner.over() => return Err(inner.over_error(state)),
                () = self.hold.lost() => {
                    return Err(self.known_loss().await.unwrap_or_else(|| Error::LockLost { key: self.entry.key.clone() }));
                }
                changed = changed(inner, &blocker, seen, view.slots[at].1) => match changed {
                    Ok(gone) => {
                        inner.counters.bump(|c| &c.wakeups);
                        last_gone = gone.then_some(blocker);
                    }
                    Err(error) if error.is_transient() => acquire.back_off(&error, &mut backoff).await?,
                    Err(error) => return Err(error),
                },
                () = deadline => return Ok(false),
            }
        }
    }

    /// Applies a conversion's grant, retrying a transient failure within the
    /// request timeout whatever the caller's deadline.
    async fn granting(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        let inner = &self.hold.session().inner;
        let until = Instant::now() + inner.options.request_timeout();
        let mut pause = INITIAL_BACKOFF;
        loop {
            match inner.call(inner.remote.update_queue(update)).await {
                Err(error) if error.is_transient() && Instant::now() + pause < until && !inner.state().is_over() => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                other => return other,
            }
        }
    }

    /// Waits until `until` (a lock-delay) unless the session ends, the lock
    /// is lost or the deadline passes first: `Ok(false)` for the deadline.
    async fn pause_until(&self, until: Instant, patience: Patience) -> Result<bool> {
        let inner = &self.hold.session().inner;
        let deadline = patience.deadline();
        tokio::select! {
            biased;
            state = inner.over() => Err(inner.over_error(state)),
            () = self.hold.lost() => Err(self.known_loss().await.unwrap_or_else(|| Error::LockLost { key: self.entry.key.clone() })),
            () = deadline => Ok(false),
            () = tokio::time::sleep_until(until) => Ok(true),
        }
    }

    async fn deadlock(&mut self, from: LockMode, to: LockMode) -> Error {
        let held = if self.resource.demote_on_deadlock {
            match self.down(LockMode::Nl).await {
                Ok(()) => LockMode::Nl,
                Err(error) => return error,
            }
        } else {
            from
        };
        Error::Deadlock {
            name: self.resource.name.to_string(),
            from,
            to,
            held,
        }
    }

    /// Releases the lock: a fenced removal of its entry; a PW or EX holder
    /// writes the lock value block with it.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the release finishes in the background.
    ///
    /// # Errors
    ///
    /// [`Error::SessionLost`] or [`Error::LockLost`] when the lock was lost
    /// before the release, [`Error::Unavailable`] when the server cannot be
    /// reached (the removal goes on in the background).
    pub async fn release(mut self) -> Result<()> {
        if self.hold.is_held() {
            // Best effort: a guard that cannot tell its mode writes no block.
            if self.resync().await.is_err() {
                self.hold.set_release_block(None);
            }
        }
        self.hold.release().await
    }
}

/// Takes a cancelled, timed-out or failed conversion back, so that it
/// leaves nothing behind: the entry is set back to its held mode if it is
/// still marked with this very conversion.
struct ConversionCleanup {
    session: Session,
    name: Arc<str>,
    entry: Entry,
    /// The conversion's id once its mark may have been written.
    conv: Option<u32>,
}

impl ConversionCleanup {
    /// Takes the mark back now; if this is cancelled, the drop does it in
    /// the background.
    async fn take_back(&mut self) {
        let Some(conv) = self.conv else {
            return;
        };
        if take_back(&self.session.inner, &self.name, &self.entry, conv)
            .await
            .is_ok()
        {
            self.conv = None;
        }
    }
}

impl Drop for ConversionCleanup {
    fn drop(&mut self) {
        let Some(conv) = self.conv.take() else {
            return;
        };
        let (inner, name, entry) = (self.session.inner.clone(), self.name.clone(), self.entry.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let mut pause = INITIAL_BACKOFF;
                for _ in 0..8 {
                    match take_back(&inner, &name, &entry, conv).await {
                        Ok(()) => return,
                        Err(error) if error.is_transient() => {
                            tracing::debug!(key = %entry.key, %error, "taking back a cancelled conversion; retrying");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_secs(1));
                        }
                        Err(error) => {
                            tracing::warn!(key = %entry.key, %error, "could not take back a cancelled conversion");
                            return;
                        }
                    }
                }
            });
        }
    }
}

/// Resolves once `entry` is gone (`true`) or no longer blocks `me` (`false`):
/// a down-conversion, a conversion given up or granted. A change that
/// leaves it blocking (a request granted in the mode it asked for, a
/// waiter's mark) is watched past without a read: a release or a
/// conversion wakes only the waiters it lets on.
async fn changed(inner: &SessionInner, entry: &Entry, mut seen: Vec<u8>, me: State) -> Result<bool> {
    loop {
        match inner.remote.watch_value(entry, &seen).await? {
            None => return Ok(true),
            Some(value) if !blocks(State::decode(&value, 0), me) => return Ok(false),
            Some(value) => seen = value,
        }
    }
}

/// Whether an entry in state `other` keeps `me` waiting, as
/// [`View::blockers`] counts it (`other` earlier than `me` when it is a
/// waiting request and `me` converts).
fn blocks(other: State, me: State) -> bool {
    match me.converting() {
        Some(target) => match other.granted {
            Some(held) => !held.compatible(target),
            None => !other.requested.compatible(target),
        },
        None => other.granted.is_some_and(|g| !g.compatible(me.requested)) || !other.requested.compatible(me.requested),
    }
}

/// Sets `entry` back to the mode it holds if it is still marked with the
/// conversion `conv`.
async fn take_back(inner: &SessionInner, name: &str, entry: &Entry, conv: u32) -> Result<()> {
    loop {
        let queue = inner.call(inner.remote.read_queue(name)).await?;
        let Some(slot) = queue
            .slots
            .iter()
            .find(|s| s.entry.key == entry.key && s.entry.order == entry.order)
        else {
            return Ok(());
        };
        let state = State::decode(&slot.value, slot.changed);
        let Some(held) = state
            .granted
            .filter(|_| state.converting().is_some() && state.conv == conv)
        else {
            return Ok(());
        };
        let value = State {
            blocked: state.blocked,
            ..State::held(held, state.token)
        }
        .encode();
        let unchanged = [(&slot.entry, slot.version)];
        let update = QueueUpdate {
            dir: name,
            unchanged: &unchanged,
            present: &[],
            set: &[(&slot.entry, &value)],
            delete: &[],
            block: None,
        };
        if inner.call(inner.remote.update_queue(&update)).await?.is_some() {
            return Ok(());
        }
    }
}

/// Whether the holder of a `lock-MODE` sequencer with `token` still holds
/// `name` in that mode: its entry is granted in it with that token.
pub(crate) async fn current(session: &Session, name: &str, mode: LockMode, token: FencingToken) -> Result<bool> {
    let inner = &session.inner;
    inner.check_usable()?;
    let queue = inner.call(inner.remote.read_queue(name)).await?;
    Ok(queue.slots.iter().any(|slot| {
        let state = State::decode(&slot.value, slot.changed);
        slot.entry.kind == EntryKind::Dlm && state.granted == Some(mode) && state.token == token.get()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockMode::*;

    fn view(states: &[State]) -> View {
        View {
            slots: states
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let entry = Entry {
                        key: format!("r/{i}"),
                        kind: EntryKind::Dlm,
                        order: i as i64,
                        token: FencingToken::new(i as u64),
                        owner: None,
                    };
                    let slot = Slot {
                        entry,
                        value: s.encode(),
                        version: 1,
                        changed: i as u64,
                    };
                    (slot, *s)
                })
                .collect(),
            block: Block::fresh(),
        }
    }

    fn converting(from: LockMode, to: LockMode) -> State {
        State {
            granted: Some(from),
            requested: to,
            token: 1,
            blocked: 0,
            since: 0,
            conv: 0,
        }
    }

    #[test]
    fn states_round_trip() {
        let marked = State {
            since: 5,
            conv: 7,
            ..converting(Pr, Ex)
        };
        for state in [State::waiting(Pw), State::held(Cr, 17), marked] {
            assert_eq!(State::decode(&state.encode(), 99), state);
        }
        assert_eq!(
            State::decode(&converting(Pr, Ex).encode(), 99).since,
            99,
            "a mark's own write order"
        );
        assert_eq!(State::decode(&State::held(Ex, 0).encode(), 42).token, 42);
        assert_eq!(State::decode(b"rubbish", 1), State::waiting(Ex));
        assert_ne!(
            State::held(Ex, 3).encode(),
            State::held(Ex, 3).encode(),
            "a nonce per write"
        );
    }

    #[test]
    fn blocks_round_trip() {
        let block = Block {
            value: LockValue {
                bytes: b"a\nb c".to_vec(),
                sequence: 4,
                valid: true,
            },
            holder: Some(("x/dlm/1 2".to_owned(), 9)),
        };
        assert_eq!(Block::decode(Some(&block.encode())), block);
        assert_eq!(Block::decode(None), Block::fresh());
        assert!(!Block::decode(Some(b"junk")).value.valid);
    }

    #[test]
    fn a_request_waits_on_the_nearest_earlier_blocker() {
        let v = view(&[State::held(Pw, 1), State::held(Cr, 2), State::waiting(Pr)]);
        assert_eq!(v.blocker(2), Some(0));
        let v = view(&[State::held(Pr, 1), State::waiting(Ex), State::waiting(Cr)]);
        assert_eq!(v.blocker(2), Some(1), "CR waits behind a waiting EX: no bypass");
    }

    #[test]
    fn a_converting_entry_blocks_with_both_modes() {
        let v = view(&[converting(Cw, Pr), State::waiting(Pr)]);
        assert_eq!(v.blocker(1), Some(0));
        let v = view(&[converting(Cw, Pr), State::waiting(Cw)]);
        assert_eq!(v.blocker(1), Some(0));
    }

    #[test]
    fn an_up_conversion_waits_for_granted_entries_and_earlier_requests_only() {
        let v = view(&[converting(Pr, Ex), State::held(Pr, 2), State::waiting(Pr)]);
        assert_eq!(v.blockers(0), vec![1]);
        let v = view(&[State::waiting(Ex), converting(Cr, Pw)]);
        assert_eq!(v.blockers(1), vec![0], "an earlier waiting request it conflicts with");
    }

    #[test]
    fn two_readers_converting_up_deadlock() {
        let v = view(&[converting(Pr, Ex), converting(Pr, Ex)]);
        assert!(v.in_cycle(1));
        let v = view(&[converting(Pr, Ex), State::held(Pr, 2)]);
        assert!(!v.in_cycle(0));
    }

    #[test]
    fn the_conversion_whose_mark_closed_a_cycle_gives_up() {
        let marked = |since| State {
            since,
            ..converting(Pr, Ex)
        };
        let v = view(&[marked(1), marked(2)]);
        assert!(v.closes_cycle(1) && !v.closes_cycle(0));
        // Three: the last closes a cycle, and so does the second (with the
        // first alone): each gives up rather than wait on the other.
        let v = view(&[marked(1), marked(2), marked(3)]);
        assert!(v.closes_cycle(2) && v.closes_cycle(1) && !v.closes_cycle(0));
    }

    #[test]
    fn a_cycle_through_a_waiting_request_is_found() {
        // PR→EX, a PW request behind it, a CR holder converting to PR.
        let v = view(&[converting(Pr, Ex), State::waiting(Pw), converting(Cr, Pr)]);
        // entry 2 (CR→PR) waits for the earlier PW request; the PW request
        // waits for entry 0; entry 0 (→EX) waits for granted entry 2.
        assert!(v.in_cycle(2));
    }
}
