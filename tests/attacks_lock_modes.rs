//! Attacks on the six DLM lock modes (`Resource`), their conversions, the
//! lock value block, blocking notifications and multi-resource locks, on the
//! in-process backend.
//!
//! Tests whose name starts with `regression_` each reproduce a defect an
//! outside review found (the smallest reproduction; its doc comment says
//! why it happened and how it is fixed): they pass now and guard the fix.
//! `held_` and `stress_` tests are attacks that held from the start.
//!
//! Some attacks need an answer "in flight": the operation applied in the
//! store while its caller has not resumed yet, which is what every real
//! backend's round trip is. The memory backend answers synchronously, so
//! `Gated` wraps it: it delegates every primitive to a `MemoryBackend` and
//! can stop one session's next call of one primitive *after* the store
//! applied it (a trap), or yield after every call (for cancellation at
//! every await point).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex as Std};
use std::time::Duration;

use futures::poll;
use lockline::async_trait;
use lockline::backend::{
    AppendRequest, Appended, Backend, BackendSession, Conflicts, Departure, Earlier, Entry, Queue, QueueUpdate,
};
use lockline::{
    Client, EntryKind, Error, LockMode, MemoryBackend, ModeContender, Resource, ResourceGuard, Session, SessionOptions,
    SessionState, Write,
};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use LockMode::*;

// ---------------------------------------------------------------------------
// Helpers.

const PATIENCE: Duration = Duration::from_secs(10);
/// How long a test gives something that should happen at once (a grant, a
/// notification, a deadlock error) before calling it a hang.
const SHORT: Duration = Duration::from_secs(2);

async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: no outcome within {PATIENCE:?}"),
    }
}

async fn lock(resource: &Resource, mode: LockMode) -> ResourceGuard {
    bounded("lock", resource.lock(mode))
        .await
        .unwrap_or_else(|e| panic!("lock {} in {mode}: {e}", resource.name()))
}

async fn listed(resource: &Resource) -> Vec<ModeContender> {
    bounded("contenders", resource.contenders()).await.expect("contenders")
}

/// The granted modes of a queue are pairwise compatible.
fn compatible_holders(queue: &[ModeContender]) -> Result<(), String> {
    let granted: Vec<(&str, LockMode)> = queue
        .iter()
        .filter_map(|c| c.granted.map(|g| (c.key.as_str(), g)))
        .collect();
    for (i, (ka, a)) in granted.iter().enumerate() {
        for (kb, b) in &granted[i + 1..] {
            if !a.compatible(*b) {
                return Err(format!("{ka} granted {a} beside {kb} granted {b}"));
            }
        }
    }
    Ok(())
}

fn modes(queue: &[ModeContender]) -> Vec<(Option<LockMode>, LockMode)> {
    queue.iter().map(|c| (c.granted, c.requested)).collect()
}

async fn memory_sessions(n: usize) -> (MemoryBackend, Vec<(Client, Session)>) {
    let store = MemoryBackend::new();
    let mut out = Vec::new();
    for _ in 0..n {
        let client = Client::new(store.clone());
        let session = client.session().await.expect("session");
        out.push((client, session));
    }
    (store, out)
}

/// Waits until `resource`'s queue satisfies `predicate` (the store offers no
/// event for "somebody else's entry changed"; a bounded poll of one read).
async fn until_queue(resource: &Resource, what: &str, mut predicate: impl FnMut(&[ModeContender]) -> bool) {
    bounded(what, async {
        loop {
            if predicate(&listed(resource).await) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

// ---------------------------------------------------------------------------
// The gated memory backend.

#[derive(Default)]
struct Ctl {
    traps: Std<Vec<Trap>>,
    yielding: Std<HashSet<String>>,
    /// When set, every `update_queue` is serialized with a read of the
    /// queue right after it, which must show pairwise compatible grants
    /// (grants are made by `update_queue` only, so this checks every state
    /// the store passes through).
    audit: std::sync::atomic::AtomicBool,
    serial: tokio::sync::Mutex<()>,
    violations: Std<Vec<String>>,
    /// `(session, op)`: that session's next call of `op` is applied and its
    /// answer lost (it says `Unavailable`).
    lose: Std<Vec<(String, &'static str)>>,
    /// Every append applied, by (session, attempt).
    appended: Std<HashMap<(String, String), Appended>>,
}

/// The granted mode in a lock-mode entry's value (`dlm2 <granted> ...`).
fn granted_in(value: &[u8]) -> Option<LockMode> {
    let text = std::str::from_utf8(value).ok()?;
    let mut words = text.split(' ');
    if words.next()? != "dlm2" {
        return None;
    }
    words.next()?.parse().ok()
}

struct Trap {
    session: String,
    op: &'static str,
    reached: Option<oneshot::Sender<()>>,
    resume: oneshot::Receiver<()>,
}

#[derive(Clone, Default)]
struct Gated {
    store: MemoryBackend,
    ctl: Arc<Ctl>,
}

impl fmt::Debug for Gated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gated").field("store", &self.store).finish()
    }
}

/// A trap set: `reached` resolves once the call applied; sending on (or
/// dropping) `resume` lets the caller go on.
struct Armed {
    reached: oneshot::Receiver<()>,
    resume: oneshot::Sender<()>,
}

impl Gated {
    /// Stops `session`'s next call of `op` after the store applied it.
    fn trap(&self, session: &Session, op: &'static str) -> Armed {
        let (reached_tx, reached) = oneshot::channel();
        let (resume, resume_rx) = oneshot::channel();
        self.ctl.traps.lock().unwrap().push(Trap {
            session: session.id().to_owned(),
            op,
            reached: Some(reached_tx),
            resume: resume_rx,
        });
        Armed { reached, resume }
    }

    /// Makes `session`'s next call of `op` lose its answer after the store
    /// applied it: the caller hears `Unavailable`.
    fn lose_answer(&self, session: &Session, op: &'static str) {
        self.ctl.lose.lock().unwrap().push((session.id().to_owned(), op));
    }

    /// Makes every call of `session` yield once after it applied.
    fn yielding(&self, session: &Session) {
        self.ctl.yielding.lock().unwrap().insert(session.id().to_owned());
    }
}

#[async_trait]
impl Backend for Gated {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn open_session(&self, options: &SessionOptions) -> lockline::Result<Arc<dyn BackendSession>> {
        let inner = self.store.open_session(options).await?;
        Ok(Arc::new(GatedSession {
            inner,
            ctl: Arc::clone(&self.ctl),
        }))
    }
}

struct GatedSession {
    inner: Arc<dyn BackendSession>,
    ctl: Arc<Ctl>,
}

impl fmt::Debug for GatedSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedSession").field("id", &self.inner.id()).finish()
    }
}

impl GatedSession {
    /// Whether this call of `op` loses its answer (see `Gated::lose_answer`).
    fn lost<T>(&self, op: &'static str, out: lockline::Result<T>) -> lockline::Result<T> {
        let mut lose = self.ctl.lose.lock().unwrap();
        match lose.iter().position(|(s, o)| s == self.inner.id() && *o == op) {
            Some(at) => {
                lose.remove(at);
                Err(Error::unavailable("memory", format!("{op}: answer lost (test)")))
            }
            None => out,
        }
    }

    /// Only the traps of `after`, no yield (for `watch_value`, which the
    /// cancellation sweep does not count as an await point).
    async fn trapped(&self, op: &'static str) {
        let trap = {
            let mut traps = self.ctl.traps.lock().unwrap();
            let id = self.inner.id();
            traps
                .iter()
                .position(|t| t.session == id && t.op == op)
                .map(|at| traps.remove(at))
        };
        if let Some(mut trap) = trap {
            if let Some(reached) = trap.reached.take() {
                let _ = reached.send(());
            }
            let _ = (&mut trap.resume).await;
        }
    }

    async fn after(&self, op: &'static str) {
        let trap = {
            let mut traps = self.ctl.traps.lock().unwrap();
            let id = self.inner.id();
            traps
                .iter()
                .position(|t| t.session == id && t.op == op)
                .map(|at| traps.remove(at))
        };
        if let Some(mut trap) = trap {
            if let Some(reached) = trap.reached.take() {
                let _ = reached.send(());
            }
            let _ = (&mut trap.resume).await;
        }
        let yielding = self.ctl.yielding.lock().unwrap().contains(self.inner.id());
        if yielding {
            tokio::task::yield_now().await;
        }
    }
}

#[async_trait]
impl BackendSession for GatedSession {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn state(&self) -> watch::Receiver<SessionState> {
        self.inner.state()
    }
    async fn append(&self, request: &AppendRequest<'_>) -> lockline::Result<Appended> {
        // A retried append finds its own entry, as every server backend's
        // does (the memory backend never loses an answer, so never needs to).
        let key = (self.inner.id().to_owned(), request.attempt.to_owned());
        if let Some(appended) = self.ctl.appended.lock().unwrap().get(&key) {
            return Ok(appended.clone());
        }
        let out = self.inner.append(request).await;
        if let Ok(appended) = &out {
            self.ctl.appended.lock().unwrap().insert(key, appended.clone());
        }
        self.after("append").await;
        self.lost("append", out)
    }
    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> lockline::Result<Earlier> {
        self.inner.earlier(entry, conflicts, count).await
    }
    async fn list(&self, dir: &str) -> lockline::Result<Vec<Entry>> {
        self.inner.list(dir).await
    }
    async fn wait_for_entry(&self, dir: &str) -> lockline::Result<()> {
        self.inner.wait_for_entry(dir).await
    }
    async fn wait_gone(&self, entry: &Entry) -> lockline::Result<()> {
        self.inner.wait_gone(entry).await
    }
    async fn remove(&self, entry: &Entry) -> lockline::Result<bool> {
        let out = self.inner.remove(entry).await;
        self.after("remove").await;
        self.lost("remove", out)
    }
    async fn abandon(&self, dir: &str, kind: EntryKind, attempt: &str) -> lockline::Result<()> {
        self.inner.abandon(dir, kind, attempt).await
    }
    async fn set_value(&self, entry: &Entry, value: &[u8]) -> lockline::Result<()> {
        self.inner.set_value(entry, value).await
    }
    async fn get_value(&self, entry: &Entry) -> lockline::Result<Option<Vec<u8>>> {
        self.inner.get_value(entry).await
    }
    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> lockline::Result<Option<Vec<u8>>> {
        let out = self.inner.watch_value(entry, seen).await;
        self.trapped("watch_value").await;
        out
    }
    async fn write_if_held(&self, entry: &Entry, writes: &[Write]) -> lockline::Result<bool> {
        self.inner.write_if_held(entry, writes).await
    }
    async fn read(&self, key: &str) -> lockline::Result<Option<Vec<u8>>> {
        self.inner.read(key).await
    }
    fn departure(&self, gone: &Entry) -> Departure {
        self.inner.departure(gone)
    }
    fn grant_not_before(&self) -> Option<Instant> {
        self.inner.grant_not_before()
    }
    async fn removed_by_me(&self, entry: &Entry) -> lockline::Result<Option<bool>> {
        self.inner.removed_by_me(entry).await
    }
    async fn read_queue(&self, dir: &str) -> lockline::Result<Queue> {
        let out = self.inner.read_queue(dir).await;
        self.after("read_queue").await;
        self.lost("read_queue", out)
    }
    async fn update_queue(&self, update: &QueueUpdate<'_>) -> lockline::Result<Option<u64>> {
        let out = if self.ctl.audit.load(std::sync::atomic::Ordering::SeqCst) {
            let _serial = self.ctl.serial.lock().await;
            let out = self.inner.update_queue(update).await;
            if let Ok(queue) = self.inner.read_queue(update.dir).await {
                let granted: Vec<(String, LockMode)> = queue
                    .slots
                    .iter()
                    .filter_map(|s| granted_in(&s.value).map(|g| (s.entry.key.clone(), g)))
                    .collect();
                for (i, (ka, a)) in granted.iter().enumerate() {
                    for (kb, b) in &granted[i + 1..] {
                        if !a.compatible(*b) {
                            self.ctl
                                .violations
                                .lock()
                                .unwrap()
                                .push(format!("store: {ka} granted {a} beside {kb} granted {b} ({granted:?})"));
                        }
                    }
                }
            }
            out
        } else {
            self.inner.update_queue(update).await
        };
        self.after("update_queue").await;
        self.lost("update_queue", out)
    }
    async fn confirm(&self) -> lockline::Result<SessionState> {
        self.inner.confirm().await
    }
    async fn close(&self) -> lockline::Result<()> {
        self.inner.close().await
    }
    fn give_up(&self, why: &str) {
        self.inner.give_up(why);
    }
}

async fn gated_sessions(n: usize) -> (Gated, Vec<(Client, Session)>) {
    let gated = Gated::default();
    let mut out = Vec::new();
    for _ in 0..n {
        let client = Client::new(gated.clone());
        let session = client.session().await.expect("session");
        out.push((client, session));
    }
    (gated, out)
}

// ===========================================================================
// Bugs (these tests fail on purpose).

/// Was a bug ( two incompatible modes granted at once. An up-conversion's grant is
/// conditioned on the entries its read saw (`View::unchanged` for a granted
/// entry: every slot *of that read*), not on "no entry appended since". A
/// request appended after the conversion's read is granted beside the old
/// mode (the conversion is not marked yet), and then the conversion's
/// update applies: PR→EX granted beside a fresh PR. On the memory backend
/// the window is a parallel thread between `read_queue` and
/// `update_queue`; on any server it is a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_up_conversion_granted_beside_an_entry_appended_after_its_read() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "stale-grant";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let armed = gated.trap(a, "read_queue");
    let converting = tokio::spawn(async move {
        let outcome = first.convert(Ex).await;
        (first, outcome)
    });
    bounded("the conversion read the queue", armed.reached).await.unwrap();
    // The conversion is not marked yet: a PR request is compatible with all.
    let second = bounded("try PR", b.resource(name).unwrap().try_lock(Pr))
        .await
        .unwrap()
        .expect("PR beside an unconverted PR");
    let _ = armed.resume.send(());
    let _ = tokio::time::timeout(SHORT, async {
        while !converting.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let queue = listed(&b.resource(name).unwrap()).await;
    let outcome = compatible_holders(&queue);
    assert!(
        outcome.is_ok(),
        "incompatible holders: {} (queue {:?}; second still held: {})",
        outcome.unwrap_err(),
        modes(&queue),
        second.is_held()
    );
}

/// Was a bug ( a conversion deadlock is not detected. Same root cause as above,
/// for the conversion's *mark*: it is conditioned on the entries of the
/// read that found no cycle, so a holder granted after that read and
/// converting meanwhile (its own check saw no cycle: the first was not
/// marked yet) is not seen. Both marks apply, neither conversion fails
/// with `Error::Deadlock`, and both wait for ever. (Usually a waiter's
/// blocking mark on the first entry changes its version and makes its
/// mark fail and re-read; a holder already marked with EX by an earlier
/// waiter is not marked again, so nothing saves it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_conversion_deadlock_missed_when_the_other_holder_came_after_the_read() {
    let (gated, s) = gated_sessions(4).await;
    let (a, b, c, d) = (&s[0].1, &s[1].1, &s[2].1, &s[3].1);
    let name = "stale-mark";
    let mut first = lock(&a.resource(name).unwrap().notify_blocking(), Pr).await;
    // An earlier waiter told the first holder of EX (its blocked bits).
    assert!(
        bounded("try EX", d.resource(name).unwrap().notify_on_try().try_lock(Ex))
            .await
            .unwrap()
            .is_none()
    );
    let third = lock(&c.resource(name).unwrap(), Pr).await;
    let armed = gated.trap(a, "read_queue");
    let converting_a = tokio::spawn(async move {
        let outcome = first.convert(Ex).await;
        (first, outcome)
    });
    bounded("a read the queue", armed.reached).await.unwrap();
    let mut second = lock(&b.resource(name).unwrap(), Pr).await;
    let converting_b = tokio::spawn(async move {
        let outcome = second.convert(Ex).await;
        (second, outcome)
    });
    bounded("b waits", s[1].0.wait_for_stats(|st| st.waits >= 1)).await;
    let _ = armed.resume.send(());
    // One of the two conversions closes a cycle: it must fail at once,
    // while the third holder still holds.
    let finished = tokio::time::timeout(SHORT, async {
        loop {
            if converting_a.is_finished() || converting_b.is_finished() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let queue = listed(&c.resource(name).unwrap()).await;
    assert!(
        finished.is_ok(),
        "PR→EX and PR→EX wait on each other for ever, neither told Deadlock: {:?}",
        modes(&queue)
    );
    let (done, other) = if converting_a.is_finished() {
        (converting_a, converting_b)
    } else {
        (converting_b, converting_a)
    };
    let (guard, outcome) = done.await.unwrap();
    assert!(matches!(outcome, Err(Error::Deadlock { .. })), "{outcome:?}");
    guard.release().await.unwrap();
    third.release().await.unwrap();
    let (guard, outcome) = bounded("the other conversion", other).await.unwrap();
    outcome.unwrap();
    assert_eq!(guard.mode(), Ex);
    guard.release().await.unwrap();
}

/// Was a bug ( a cancelled conversion's background cleanup takes back a *later*
/// conversion of the same guard to the same mode. `ConversionCleanup::drop`
/// spawns `take_back(from, to)`, which resets the entry whenever it is
/// marked `from → to`: it cannot tell the cancelled conversion's mark from
/// the next one's. The next conversion goes on waiting, unmarked: requests
/// behind it no longer count its new mode (they overtake it), and another
/// holder's conversion no longer sees the cycle, so a plain PR/PR → EX/EX
/// deadlock goes undetected and both wait for ever.
#[tokio::test]
async fn regression_cancelled_conversion_cleanup_unmarks_the_next_conversion() {
    let (_store, s) = memory_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "take-back-race";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let mut second = lock(&b.resource(name).unwrap(), Pr).await;
    // A conversion dropped while it waits (a `select!`, a `timeout`).
    assert!(tokio::time::timeout(Duration::from_millis(50), first.convert(Ex))
        .await
        .is_err());
    // Asked again at once.
    let mut again = pin!(first.convert(Ex));
    assert!(poll!(&mut again).is_pending());
    tokio::time::sleep(Duration::from_millis(50)).await; // the cleanup runs
    let queue = listed(&b.resource(name).unwrap()).await;
    let still_marked = queue[0].converting_to() == Some(Ex);
    // The other holder converts too: that closes a cycle.
    let outcome = tokio::select! {
        outcome = second.convert(Ex) => Some(outcome),
        _ = &mut again => None,
        () = tokio::time::sleep(SHORT) => None,
    };
    assert!(
        matches!(outcome, Some(Err(Error::Deadlock { .. }))),
        "expected Deadlock for the second PR→EX, got {outcome:?}; the first conversion \
         still waiting was marked after the cleanup: {still_marked} ({:?})",
        modes(&queue)
    );
}

/// BUG (same root cause as the one above): after the background cleanup
/// of a dropped PR→EX erased the next PR→EX's mark, a PR newcomer is
/// granted ahead of that conversion, which still waits: a compatible
/// newcomer overtakes an earlier request it conflicts with.
#[tokio::test]
async fn regression_cancelled_conversion_cleanup_lets_a_newcomer_overtake_the_next_conversion() {
    let (_store, s) = memory_sessions(3).await;
    let (a, b, c) = (&s[0].1, &s[1].1, &s[2].1);
    let name = "take-back-overtake";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let _second = lock(&b.resource(name).unwrap(), Pr).await;
    assert!(tokio::time::timeout(Duration::from_millis(50), first.convert(Ex))
        .await
        .is_err());
    let mut again = pin!(first.convert(Ex));
    assert!(poll!(&mut again).is_pending());
    tokio::time::sleep(Duration::from_millis(50)).await; // the cleanup runs
    let newcomer = bounded("try PR", c.resource(name).unwrap().try_lock(Pr)).await.unwrap();
    assert!(
        newcomer.is_none(),
        "a PR newcomer was granted while an earlier PR→EX conversion waits (it must wait behind it)"
    );
}

/// Was a bug ( a holder is never told that a waiter is blocked by it. A request
/// marks only the *granted* entry it waits on (`Resource::mark` returns on
/// `state.granted?`). A request waiting on an earlier *waiting* request
/// marks nothing; when that request is granted in the mode it asked for,
/// `changed()` watches past it (the modes it blocks with are unchanged),
/// so the waiter never reads again and never marks it. The holder's
/// `blocking()` never resolves: a caching PR holder that lets go when told
/// (the docs' recipe) holds on for ever, and the EX request waits for ever.
#[tokio::test]
async fn regression_blocking_never_told_to_a_request_granted_while_a_waiter_waited_on_it() {
    let (_store, s) = memory_sessions(3).await;
    let ((_, a), (cb, b), (cc, c)) = (&s[0], &s[1], &s[2]);
    let name = "never-told";
    let holder = lock(&a.resource(name).unwrap(), Ex).await;
    let reader = b.resource(name).unwrap().notify_blocking();
    let reading = tokio::spawn(async move { reader.lock(Pr).await });
    bounded("PR waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let writer = c.resource(name).unwrap();
    let writing = tokio::spawn(async move { writer.lock(Ex).await });
    bounded("EX waits", cc.wait_for_stats(|st| st.waits >= 1)).await;
    holder.release().await.unwrap();
    let cached = bounded("PR granted", reading).await.unwrap().unwrap();
    // The EX request is blocked by this PR holder alone.
    let told = tokio::time::timeout(SHORT, cached.blocking()).await;
    assert!(
        matches!(told, Ok(Ok(Ex))),
        "the PR holder blocking an EX request was not told: {told:?} (EX request finished: {})",
        writing.is_finished()
    );
}

/// Was a bug ( a down-conversion cancelled after the store applied it leaves the
/// guard believing the old mode. `down()` updates the guard's `Cell` only
/// after `update_queue` returns; dropped in between (a response in
/// flight), the entry is NL on the server while `mode()` says EX and
/// `is_held()` is true. Another session is then granted EX, and the stale
/// guard's `write_if_held` (fenced on the entry's existence only) is
/// accepted beside it.
#[tokio::test]
async fn regression_down_conversion_cancelled_in_flight_leaves_a_stale_ex_guard() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "cancelled-down";
    let mut holder = lock(&a.resource(name).unwrap(), Ex).await;
    let armed = gated.trap(a, "update_queue");
    {
        let down = holder.convert(Nl);
        tokio::select! {
            outcome = down => panic!("the trap did not stop the down-conversion: {outcome:?}"),
            _ = armed.reached => {}
        }
    } // cancelled with its update applied
    drop(armed.resume);
    // The guard claims no more than the server may hold.
    assert_eq!(holder.mode(), Nl);
    let other = bounded("try EX", b.resource(name).unwrap().try_lock(Ex)).await.unwrap();
    let write = bounded("a fenced write", holder.write_if_held([Write::put("stale/data", "x")])).await;
    assert!(other.is_some(), "the down-conversion applied: EX is free");
    assert!(
        matches!(write, Err(Error::WrongMode { .. })),
        "a fenced write beside the new EX holder: {write:?}"
    );
}

/// BUG (same root cause as the one above): the stale EX guard's release
/// writes the lock value block, after another EX holder wrote it and after
/// a PW holder lost its lock involuntarily. A reader then sees the stale
/// guard's value, a sequence that did not rise past the last writer's, and
/// `valid` although the last PW holder was lost without writing.
#[tokio::test]
async fn regression_stale_guard_overwrites_the_value_block_and_marks_it_valid() {
    let (gated, s) = gated_sessions(4).await;
    let (a, b, h, r) = (&s[0].1, &s[1].1, &s[2].1, &s[3].1);
    let name = "stale-lvb";
    let mut stale = lock(&a.resource(name).unwrap(), Ex).await;
    stale.set_value(b"stale").unwrap();
    let armed = gated.trap(a, "update_queue");
    {
        let down = stale.convert(Nl);
        tokio::select! {
            outcome = down => panic!("the trap did not stop the down-conversion: {outcome:?}"),
            _ = armed.reached => {}
        }
    }
    drop(armed.resume);
    // The next EX holder writes v1 (sequence 1)...
    let mut next = lock(&b.resource(name).unwrap(), Ex).await;
    next.set_value(b"from b").unwrap();
    next.release().await.unwrap();
    // ...then a PW holder is lost without writing: not valid from now on.
    let mut doomed = lock(&h.resource(name).unwrap(), Pw).await;
    doomed.set_value(b"never written").unwrap();
    assert!(gated.store.expire(h.id()));
    bounded("lost", doomed.lost()).await;
    // The stale guard lets go.
    let _ = stale.release().await;
    let seen = lock(&r.resource(name).unwrap(), Pr).await.value();
    assert!(
        !seen.valid && seen.sequence >= 1 && seen.bytes == b"from b",
        "after b wrote 'from b' (sequence 1) and a PW holder was lost, a reader sees {:?} \
         ({:?}, sequence {}, valid {})",
        seen,
        String::from_utf8_lossy(&seen.bytes),
        seen.sequence,
        seen.valid
    );
}

/// Was a bug ( an up-conversion cancelled after its grant applied leaves the
/// guard believing the old mode (the `Cell` is updated after
/// `update_queue` returns, and the cleanup's `take_back` sees the entry
/// no longer `from → to` and does nothing). The server holds EX for a
/// guard that says PR: a PR request the holder thinks compatible waits
/// until it lets go, and the value block names it as its PW/EX holder,
/// so its clean release leaves the block not valid.
#[tokio::test]
async fn regression_up_conversion_cancelled_in_flight_leaves_the_guard_in_the_old_mode() {
    let (gated, s) = gated_sessions(3).await;
    let (a, b, c) = (&s[0].1, &s[1].1, &s[2].1);
    let name = "cancelled-up";
    let mut holder = lock(&a.resource(name).unwrap(), Pr).await;
    let armed = gated.trap(a, "update_queue");
    {
        let up = holder.convert(Ex);
        tokio::select! {
            outcome = up => panic!("the trap did not stop the conversion: {outcome:?}"),
            _ = armed.reached => {}
        }
    }
    drop(armed.resume);
    tokio::time::sleep(Duration::from_millis(50)).await; // the cleanup runs
    let queue = listed(&b.resource(name).unwrap()).await;
    let beside = bounded("try PR", b.resource(name).unwrap().try_lock(Pr)).await.unwrap();
    let granted_beside = beside.is_some();
    let believed = holder.mode();
    drop(beside);
    holder.release().await.unwrap();
    let value = lock(&c.resource(name).unwrap(), Pr).await.value();
    assert!(
        queue[0].granted == Some(believed),
        "the guard says {believed}, the server says {:?}; a PR request beside it granted: \
         {granted_beside}; after its clean release the value block is valid: {}",
        queue[0].granted,
        value.valid
    );
}

/// Was a bug ( `convert_timeout` reports `Timeout` ("the mode unchanged") for a
/// conversion the store granted. The grant's `update_queue` runs under the
/// deadline (`Acquire::retrying` → `bounded` → `timeout_at`); when the
/// deadline falls while its answer is on its way, the call is dropped
/// after it applied, `up()` returns `Err(Timeout)`, and nothing takes the
/// grant back (the cleanup is not armed on the grant path, and `take_back`
/// would not touch an entry no longer converting). Found by the stress with
/// round trips, with no future dropped by the caller. `lock_timeout` has
/// the same window: a grant applied, then the entry removed as a timed-out
/// request (a PW/EX one leaves the value block not valid).
#[tokio::test]
async fn regression_convert_timeout_reports_timeout_for_a_conversion_the_store_granted() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "timeout-in-flight";
    let mut holder = lock(&a.resource(name).unwrap(), Pr).await;
    let armed = gated.trap(a, "update_queue");
    let outcome = holder.convert_timeout(Ex, Duration::from_millis(200)).await;
    drop(armed);
    let queue = listed(&b.resource(name).unwrap()).await;
    assert!(
        !matches!(outcome, Err(Error::Timeout { .. })) || queue[0].granted == Some(holder.mode()),
        "convert_timeout said {outcome:?} (the guard keeps {}), the store holds {:?}",
        holder.mode(),
        queue[0].granted
    );
}

/// Was a bug ( a conversion mark left behind, and a false deadlock from it. When
/// `convert_timeout` runs out it takes its mark back inline
/// (`ConversionCleanup::take_back`), which sets `armed = false` *before*
/// its two awaits; a caller that drops the future meanwhile (a `select!`
/// on shutdown, an outer timeout a little longer) leaves the entry marked
/// PR→EX for good, and nobody converting. Then the other PR holder's
/// PR→EX, which only has to wait for this PR holder to let go, fails with
/// `Error::Deadlock` (the phantom conversion closes a cycle), and PR
/// requests behind wait as if an EX conversion were ahead of them.
#[tokio::test]
async fn regression_timed_out_conversion_dropped_during_its_cleanup_leaves_a_phantom_mark() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "phantom-mark";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let mut second = lock(&b.resource(name).unwrap(), Pr).await;
    {
        let mut converting = pin!(first.convert_timeout(Ex, Duration::from_millis(200)));
        assert!(poll!(&mut converting).is_pending(), "waits for the other PR holder");
        // Its next read of the queue is the cleanup's, once the deadline passed.
        let armed = gated.trap(a, "read_queue");
        tokio::select! {
            outcome = &mut converting => panic!("the trap did not stop the cleanup: {outcome:?}"),
            _ = armed.reached => {}
        }
    } // dropped during the cleanup
    tokio::time::sleep(Duration::from_millis(50)).await;
    let queue = listed(&b.resource(name).unwrap()).await;
    assert_eq!(first.mode(), Pr);
    let outcome = tokio::time::timeout(Duration::from_millis(300), second.convert(Ex)).await;
    assert!(
        !matches!(outcome, Ok(Err(Error::Deadlock { .. }))) && queue[0].converting_to().is_none(),
        "a PR→EX that only waits for a PR holder failed: {outcome:?}; the queue after the \
         dropped cleanup: {:?} (nobody converts)",
        modes(&queue)
    );
}

/// Was a bug ( an up-conversion is granted without the lock-delay after an
/// involuntary loss. `request_inner` holds back after a lost blocker;
/// `up()` has no such step, so an NL → EX conversion gets EX at once
/// after the EX holder's session expired, while its owner may still be
/// writing. The docs: lock-delay "works as for the other recipes".
#[tokio::test]
async fn regression_up_conversion_skips_the_lock_delay() {
    let delay = Duration::from_millis(1000);
    let store = MemoryBackend::new();
    let (ca, cb) = (Client::new(store.clone()), Client::new(store.clone()));
    let a = ca.session().await.unwrap();
    let b = cb
        .session_with(SessionOptions::new().with_lock_delay(delay))
        .await
        .unwrap();
    let name = "delay-conversion";
    let holder = lock(&a.resource(name).unwrap(), Ex).await;
    let mut place = lock(&b.resource(name).unwrap(), Nl).await;
    let converting = tokio::spawn(async move {
        let outcome = place.convert(Ex).await;
        (Instant::now(), place, outcome)
    });
    bounded("the conversion waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let lost_at = Instant::now();
    assert!(store.expire(a.id()));
    let (at, _place, outcome) = bounded("converted", converting).await.unwrap();
    outcome.unwrap();
    drop(holder);
    assert!(
        at - lost_at >= delay,
        "EX granted by conversion {:?} after the EX holder's loss (lock-delay {delay:?})",
        at - lost_at
    );
}

/// Was a bug ( the lock-delay is skipped when the lost PW/EX holder was not the
/// one entry the waiter waited on. An EX request behind a PW holder and a
/// CR holder waits on the nearest (CR); the PW holder's session expires
/// (no wake-up: it waits on CR); the CR holder releases; `departure(CR)`
/// says released, so EX is granted at once after the PW holder's loss.
#[tokio::test]
async fn regression_lock_delay_skipped_when_the_lost_writer_was_not_the_entry_waited_on() {
    let delay = Duration::from_millis(1000);
    let store = MemoryBackend::new();
    let (cw, cr, cx) = (
        Client::new(store.clone()),
        Client::new(store.clone()),
        Client::new(store.clone()),
    );
    let w = cw.session().await.unwrap();
    let r = cr.session().await.unwrap();
    let x = cx
        .session_with(SessionOptions::new().with_lock_delay(delay))
        .await
        .unwrap();
    let name = "delay-nearest";
    let writer = lock(&w.resource(name).unwrap(), Pw).await;
    let reader = lock(&r.resource(name).unwrap(), Cr).await;
    let resource = x.resource(name).unwrap();
    let waiting = tokio::spawn(async move {
        let outcome = resource.lock(Ex).await;
        (Instant::now(), outcome)
    });
    bounded("EX waits", cx.wait_for_stats(|st| st.waits >= 1)).await;
    let lost_at = Instant::now();
    assert!(store.expire(w.id()));
    drop(writer);
    reader.release().await.unwrap();
    let (at, outcome) = bounded("EX granted", waiting).await.unwrap();
    let _granted = outcome.unwrap();
    assert!(
        at - lost_at >= delay,
        "EX granted {:?} after the PW holder's involuntary loss (lock-delay {delay:?})",
        at - lost_at
    );
}

/// BUG (divergence from the model's Convert step, which finds the entry
/// gone and learns the loss before anything else): converting to the mode
/// already held returns `Ok` without looking, even when the lock is lost
/// (`converting()` returns before `known_loss()`). The docs: errors "as
/// release when the lock is lost".
#[tokio::test]
async fn regression_convert_to_the_same_mode_on_a_lost_lock_succeeds() {
    let (store, s) = memory_sessions(1).await;
    let a = &s[0].1;
    let mut guard = lock(&a.resource("same-mode").unwrap(), Pr).await;
    assert!(store.expire(a.id()));
    bounded("lost", guard.lost()).await;
    let outcome = guard.convert(Pr).await;
    assert!(
        matches!(outcome, Err(Error::SessionLost { .. })),
        "convert(PR) of a lost PR lock: {outcome:?}"
    );
}

/// Was a bug ( a panic on caller input (DESIGN §6.8): `Instant::now() + timeout`
/// overflows for a very long timeout in `lock_timeout`, `convert_timeout`
/// and `MultiResource::lock_timeout` (the older recipes' `within` has the
/// same line).
#[tokio::test]
async fn regression_very_long_timeouts_panic() {
    let (_store, s) = memory_sessions(1).await;
    let a = s[0].1.clone();
    let outcomes = tokio::spawn(async move {
        let resource = a.resource("long").unwrap();
        let guard = resource.lock_timeout(Pr, Duration::MAX).await;
        let mut guard = guard.unwrap();
        guard.convert_timeout(Ex, Duration::MAX).await.unwrap();
        guard.release().await.unwrap();
        let multi = a.multi_resource([("long", Pr)]).unwrap();
        multi
            .lock_timeout(Duration::MAX)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    })
    .await;
    assert!(
        outcomes.is_ok(),
        "a timeout of Duration::MAX panicked: {:?}",
        outcomes.err().map(|e| e.to_string())
    );
}

/// Was a claim of the design notes ("a release wakes only those it
/// unblocks"), now "only the waiters that waited on it": holders PR, PR; an EX request waits on the nearest (the
/// second PR); the first PR converts to EX and waits on the first blocker
/// in queue order (the second PR too). The second PR's release wakes both;
/// only the conversion is unblocked: two wake-ups for one unblocked waiter.
#[tokio::test]
async fn regression_one_release_wakes_a_waiter_it_does_not_unblock() {
    let (_store, s) = memory_sessions(3).await;
    let ((ca, a), (_, b), (cc, c)) = (&s[0], &s[1], &s[2]);
    let name = "extra-wakeup";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let second = lock(&b.resource(name).unwrap(), Pr).await;
    let writer = c.resource(name).unwrap();
    let writing = tokio::spawn(async move { writer.lock(Ex).await });
    bounded("EX waits", cc.wait_for_stats(|st| st.waits >= 1)).await;
    let converting = tokio::spawn(async move {
        let outcome = first.convert(Ex).await;
        (first, outcome)
    });
    bounded("the conversion waits", ca.wait_for_stats(|st| st.waits >= 1)).await;
    let before = ca.stats().wakeups + cc.stats().wakeups;
    second.release().await.unwrap();
    let (first, outcome) = bounded("converted", converting).await.unwrap();
    outcome.unwrap();
    // The EX request wakes (if it does) right after the release.
    let _ = tokio::time::timeout(Duration::from_millis(200), cc.wait_for_stats(|st| st.wakeups >= 1)).await;
    let woken = ca.stats().wakeups + cc.stats().wakeups - before;
    assert!(!writing.is_finished());
    first.release().await.unwrap();
    bounded("EX", writing).await.unwrap().unwrap().release().await.unwrap();
    // Both waited on the released entry: a release wakes the waiters that
    // waited on it, and no one else (the model's promise).
    assert_eq!(woken, 2, "two waiters waited on the release, {woken} woken");
}

/// BUG (memory backend): an append racing its session's expiry leaves an
/// entry no one will ever delete. `MemorySession::append` checks that the
/// session is live (`check_live`, on its state receiver) *before* taking
/// the store's lock; `Store::end` (expire, close) deletes the session's
/// entries under the lock in between; the append then inserts an entry
/// owned by a session that is over. A waiting request left so blocks every
/// request it conflicts with for ever (the randomized stress below hits it
/// too: a waiting CW entry of an expired session, left for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_memory_append_racing_expiry_leaves_an_orphan_entry() {
    let store = MemoryBackend::new();
    let mut orphans = Vec::new();
    for round in 0..20000 {
        let session = store.open_session(&SessionOptions::new()).await.unwrap();
        let id = session.id().to_owned();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let appender = {
            let session = Arc::clone(&session);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let request = AppendRequest {
                    dir: "orphan",
                    kind: EntryKind::Dlm,
                    attempt: "a",
                    value: b"dlm1 - EX 0 0 0",
                    conflicts: Conflicts::All,
                    nearest: 0,
                };
                barrier.wait();
                futures::executor::block_on(session.append(&request)).is_ok()
            })
        };
        let expirer = {
            let store = store.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                store.expire(&id)
            })
        };
        let appended = appender.join().unwrap();
        assert!(expirer.join().unwrap());
        let left = store.keys("orphan");
        if !left.is_empty() {
            orphans.push(format!("round {round}: append ok {appended}, left {left:?}"));
            break;
        }
        drop(session);
    }
    assert!(
        orphans.is_empty(),
        "an entry outlived its session's expiry: {orphans:?} (session state: expired)"
    );
}

/// A sweep: cancellation at every await point of `lock(PW)`,
/// `convert(EX)` (up), `convert(NL)` (down) and `release()`, each call of
/// the backend answering one poll later (as a round trip would). After
/// each cut: the guard's mode must be no more than the server's, no conversion mark may
/// be left, and — no lock having been lost — the value block must stay
/// valid; once everything is released no entry may be left. Lists every
/// cut that breaks one of these.
#[tokio::test]
async fn regression_cancellation_at_every_await_point_sweep() {
    let mut broken: Vec<String> = Vec::new();
    for op in ["lock PW", "convert PR→EX", "convert EX→NL", "release EX"] {
        for cut in 1..=12usize {
            let (gated, s) = gated_sessions(2).await;
            let (a, b) = (&s[0].1, &s[1].1);
            let name = "sweep";
            let resource = a.resource(name).unwrap();
            // A written, valid block to start from.
            let mut first = lock(&resource, Ex).await;
            first.set_value(b"v1").unwrap();
            first.release().await.unwrap();
            let mut guard = match op {
                "lock PW" => None,
                "convert PR→EX" => Some(lock(&resource, Pr).await),
                _ => Some(lock(&resource, Ex).await),
            };
            gated.yielding(a);
            let mut finished = false;
            let mut fresh = None;
            {
                let future: std::pin::Pin<Box<dyn Future<Output = Option<ResourceGuard>> + Send + '_>> = match op {
                    "lock PW" => Box::pin(async { resource.lock(Pw).await.ok() }),
                    "convert PR→EX" => {
                        let g = guard.as_mut().unwrap();
                        Box::pin(async move {
                            g.convert(Ex).await.unwrap();
                            None
                        })
                    }
                    "convert EX→NL" => {
                        let g = guard.as_mut().unwrap();
                        Box::pin(async move {
                            g.convert(Nl).await.unwrap();
                            None
                        })
                    }
                    _ => {
                        let g = guard.take().unwrap();
                        Box::pin(async move {
                            g.release().await.unwrap();
                            None
                        })
                    }
                };
                let mut future = future;
                for _ in 0..cut {
                    if let std::task::Poll::Ready(got) = poll!(&mut future) {
                        finished = true;
                        fresh = got;
                        break;
                    }
                }
            } // dropped here if not finished
            if fresh.is_some() {
                guard = fresh;
            }
            tokio::time::sleep(Duration::from_millis(30)).await; // background cleanups
            let queue = listed(&b.resource(name).unwrap()).await;
            let what = format!("{op}, cut after {cut} polls");
            if queue.iter().any(|c| c.converting_to().is_some()) {
                broken.push(format!("{what}: a conversion mark left: {:?}", modes(&queue)));
            }
            if let Some(g) = &guard {
                // The guard may claim less than the server holds (a
                // conversion whose answer never came), never more.
                let server = queue.iter().find(|c| c.key == g.key()).and_then(|c| c.granted);
                if !server.is_some_and(|held| g.mode().is_down_from(held)) {
                    broken.push(format!("{what}: the guard says {}, the server {server:?}", g.mode()));
                }
            }
            if let Some(g) = guard.take() {
                let _ = g.release().await;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
            let left = gated.store.keys(name);
            if !left.is_empty() {
                broken.push(format!("{what}: entries left: {left:?}"));
            }
            let seen = lock(&b.resource(name).unwrap(), Pr).await;
            // An acquire cancelled in the instant its PW grant was made
            // never held it for its caller: the block it named its holder
            // in is not valid after it, as after a loss (documented).
            if !seen.value().valid && op != "lock PW" {
                broken.push(format!("{what}: value block not valid though no lock was lost"));
            }
            seen.release().await.unwrap();
            if finished {
                break;
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken cuts:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

// ===========================================================================
// Attacks that held.

/// Every pair of modes, each order, by `lock` (waiting) rather than
/// `try_lock`: the second is granted at once exactly when compatible, and
/// otherwise as soon as the first lets go.
#[tokio::test]
async fn held_matrix_by_waiting_requests() {
    let (_store, s) = memory_sessions(2).await;
    let ((_, a), (cb, b)) = (&s[0], &s[1]);
    for held in LockMode::ALL {
        for asked in LockMode::ALL {
            let name = format!("wait-matrix-{held}-{asked}");
            let first = lock(&a.resource(&name).unwrap(), held).await;
            let resource = b.resource(&name).unwrap();
            let waits_before = cb.stats().waits;
            let second = tokio::spawn(async move { resource.lock(asked).await });
            if held.compatible(asked) {
                let g = bounded("granted", second).await.unwrap().unwrap();
                assert!(g.token() > first.token());
                g.release().await.unwrap();
            } else {
                bounded("waits", cb.wait_for_stats(|st| st.waits > waits_before)).await;
                assert!(!second.is_finished());
                first.release().await.unwrap();
                let g = bounded("granted after the release", second).await.unwrap().unwrap();
                g.release().await.unwrap();
                assert!(listed(&a.resource(&name).unwrap()).await.is_empty());
                continue;
            }
            first.release().await.unwrap();
            assert!(listed(&a.resource(&name).unwrap()).await.is_empty());
        }
    }
}

/// Every conversion pair among two compatible holders (A: a → a', then
/// B: b → b'): the second fails with Deadlock exactly when each waits for
/// the other's granted mode; otherwise both end granted (no false
/// deadlock, no hang), each in its new mode, and a deadlock leaves B in b.
#[tokio::test]
async fn held_every_conversion_pair_deadlocks_exactly_when_it_must() {
    let (_store, s) = memory_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let mut checked = 0;
    for ma in LockMode::ALL {
        for mb in LockMode::ALL {
            if !ma.compatible(mb) {
                continue;
            }
            for ta in LockMode::ALL {
                for tb in LockMode::ALL {
                    if ta.is_down_from(ma) || tb.is_down_from(mb) {
                        continue;
                    }
                    let name = format!("pairs-{ma}-{mb}-{ta}-{tb}");
                    let mut ga = lock(&a.resource(&name).unwrap(), ma).await;
                    let mut gb = lock(&b.resource(&name).unwrap(), mb).await;
                    let a_blocked = !mb.compatible(ta);
                    let b_blocked = !ma.compatible(tb);
                    let conv_a = tokio::spawn(async move {
                        let outcome = ga.convert(ta).await;
                        (ga, outcome)
                    });
                    if a_blocked {
                        until_queue(&b.resource(&name).unwrap(), "A marked", |q| {
                            q.first().is_some_and(|c| c.converting_to() == Some(ta))
                        })
                        .await;
                    } else {
                        let (ga2, outcome) = bounded("A at once", conv_a).await.unwrap();
                        outcome.unwrap();
                        assert_eq!(ga2.mode(), ta);
                        // B now faces A's new mode.
                        let outcome = bounded("B", async {
                            tokio::time::timeout(Duration::from_millis(100), gb.convert(tb)).await
                        })
                        .await;
                        match outcome {
                            Ok(Ok(())) => assert!(ta.compatible(tb), "{name}: B granted beside {ta}"),
                            Err(_) => assert!(!ta.compatible(tb), "{name}: B should be granted"),
                            Ok(Err(e)) => panic!("{name}: B: {e}"),
                        }
                        ga2.release().await.unwrap();
                        gb.release().await.unwrap();
                        checked += 1;
                        continue;
                    }
                    let outcome = bounded("B converts", async {
                        tokio::time::timeout(Duration::from_millis(300), gb.convert(tb)).await
                    })
                    .await;
                    match (b_blocked, outcome) {
                        (true, Ok(Err(Error::Deadlock { held, .. }))) => {
                            assert_eq!(held, mb);
                            assert_eq!(gb.mode(), mb);
                            gb.release().await.unwrap();
                            let (ga, outcome) = bounded("A after B let go", conv_a).await.unwrap();
                            outcome.unwrap();
                            ga.release().await.unwrap();
                        }
                        (false, Ok(Ok(()))) => {
                            // B granted first: A waits for B's new mode, or not.
                            assert_eq!(gb.mode(), tb);
                            gb.release().await.unwrap();
                            let (ga, outcome) = bounded("A", conv_a).await.unwrap();
                            outcome.unwrap();
                            ga.release().await.unwrap();
                        }
                        (b_blocked, other) => panic!("{name}: B blocked {b_blocked}: {other:?}"),
                    }
                    assert!(listed(&a.resource(&name).unwrap()).await.is_empty(), "{name}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 50, "{checked}");
}

/// The cycle through a waiting request (PR→EX, a PW request waiting
/// behind it, a CR holder after that request converting to PR, which
/// waits for the PW request) is found by the conversion that closes it,
/// and only by it; the others go on once it gives up.
#[tokio::test]
async fn held_cycle_through_a_waiting_request_is_detected_once() {
    let (_store, s) = memory_sessions(3).await;
    let ((ca, a), (cb, b), (_, c)) = (&s[0], &s[1], &s[2]);
    let name = "cycle3";
    let mut reader = lock(&a.resource(name).unwrap(), Pr).await;
    let writer = b.resource(name).unwrap();
    let writing = tokio::spawn(async move { writer.lock(Pw).await });
    bounded("PW waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let mut concurrent = lock(&c.resource(name).unwrap(), Cr).await;
    let converting = tokio::spawn(async move {
        let outcome = reader.convert(Ex).await;
        (reader, outcome)
    });
    bounded("PR→EX waits", ca.wait_for_stats(|st| st.waits >= 1)).await;
    let outcome = bounded("CR→PR", concurrent.convert(Pr)).await;
    assert!(matches!(outcome, Err(Error::Deadlock { .. })), "{outcome:?}");
    assert_eq!(concurrent.mode(), Cr);
    assert!(!converting.is_finished() && !writing.is_finished());
    concurrent.release().await.unwrap();
    let (reader, outcome) = bounded("PR→EX granted", converting).await.unwrap();
    outcome.unwrap();
    reader.release().await.unwrap();
    bounded("PW", writing).await.unwrap().unwrap().release().await.unwrap();
}

/// CW ⇄ PR, where neither mode covers the other: both are up-conversions,
/// waiters behind count both modes, and the one blocked by the old mode
/// only is woken when the conversion is granted.
#[tokio::test]
async fn held_cw_pr_conversions_both_ways() {
    let (_store, s) = memory_sessions(3).await;
    let ((_, a), (cb, b), (cc, c)) = (&s[0], &s[1], &s[2]);
    let name = "cw-pr";
    let mut mixed = lock(&a.resource(name).unwrap(), Cw).await;
    // PR request: blocked by CW (held) — waits on it.
    let pr = b.resource(name).unwrap();
    let reading = tokio::spawn(async move { pr.lock(Pr).await });
    bounded("PR waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    // CW → PR: the PR request is earlier? No: it is behind; the
    // conversion only waits for granted entries and earlier requests.
    bounded("CW→PR", mixed.convert(Pr)).await.unwrap();
    let reader = bounded("the PR request is woken and granted", reading)
        .await
        .unwrap()
        .unwrap();
    // PR → CW now waits for the other PR holder; a CW request behind it
    // waits too (it counts the conversion with PR and CW).
    let converting = tokio::spawn(async move {
        let outcome = mixed.convert(Cw).await;
        (mixed, outcome)
    });
    until_queue(&c.resource(name).unwrap(), "marked", |q| {
        q[0].converting_to() == Some(Cw)
    })
    .await;
    let cw = c.resource(name).unwrap();
    assert!(bounded("try CW", cw.try_lock(Cw)).await.unwrap().is_none());
    let writing = tokio::spawn(async move { cw.lock(Cw).await });
    bounded("CW waits", cc.wait_for_stats(|st| st.waits >= 1)).await;
    let queue = listed(&c.resource(name).unwrap()).await;
    compatible_holders(&queue).unwrap();
    reader.release().await.unwrap();
    let (mixed, outcome) = bounded("PR→CW", converting).await.unwrap();
    outcome.unwrap();
    assert_eq!(mixed.mode(), Cw);
    let other = bounded("the CW request beside it", writing).await.unwrap().unwrap();
    let queue = listed(&c.resource(name).unwrap()).await;
    compatible_holders(&queue).unwrap();
    other.release().await.unwrap();
    mixed.release().await.unwrap();
}

/// A conversion given up — by its timeout (inline cleanup) or by dropping
/// it (background cleanup) — wakes the request behind it that was blocked
/// by its new mode only: no lost wake-up, no mark left.
#[tokio::test]
async fn held_given_up_conversion_wakes_the_request_behind() {
    for dropped in [false, true] {
        let (_store, s) = memory_sessions(3).await;
        let ((_, a), (_, b), (cc, c)) = (&s[0], &s[1], &s[2]);
        let name = "give-up-wakes";
        let mut first = lock(&a.resource(name).unwrap(), Pr).await;
        let second = lock(&b.resource(name).unwrap(), Pr).await;
        let (tx, rx) = oneshot::channel::<()>();
        let converting = tokio::spawn(async move {
            if dropped {
                tokio::select! {
                    _ = first.convert(Ex) => panic!("granted"),
                    _ = rx => {}
                }
            } else {
                let outcome = first.convert_timeout(Ex, Duration::from_millis(300)).await;
                assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
            }
            first
        });
        until_queue(&c.resource(name).unwrap(), "marked", |q| {
            q[0].converting_to() == Some(Ex)
        })
        .await;
        let reader = c.resource(name).unwrap();
        let reading = tokio::spawn(async move { reader.lock(Pr).await });
        bounded("PR waits behind the conversion", cc.wait_for_stats(|st| st.waits >= 1)).await;
        let _ = tx.send(());
        let first = bounded("given up", converting).await.unwrap();
        assert_eq!(first.mode(), Pr);
        let third = bounded("PR woken", reading).await.unwrap().unwrap();
        let queue = listed(&c.resource(name).unwrap()).await;
        assert!(queue.iter().all(|e| e.converting_to().is_none()), "{:?}", modes(&queue));
        for g in [first, second, third] {
            g.release().await.unwrap();
        }
    }
}

/// A session expiring mid-conversion: the conversion fails with
/// SessionLost, its entry (and mark) go, and the request it blocked is
/// granted; a waiter whose own session expires fails at once.
#[tokio::test]
async fn held_session_expiring_mid_conversion() {
    let (store, s) = memory_sessions(3).await;
    let ((ca, a), (_, b), (cc, c)) = (&s[0], &s[1], &s[2]);
    let name = "expire-mid";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let second = lock(&b.resource(name).unwrap(), Pr).await;
    let converting = tokio::spawn(async move { first.convert(Ex).await });
    bounded("waits", ca.wait_for_stats(|st| st.waits >= 1)).await;
    let ex = c.resource(name).unwrap();
    let writing = tokio::spawn(async move { ex.lock(Ex).await });
    bounded("EX waits", cc.wait_for_stats(|st| st.waits >= 1)).await;
    assert!(store.expire(a.id()));
    let outcome = bounded("conversion ends", converting).await.unwrap();
    assert!(matches!(outcome, Err(Error::SessionLost { .. })), "{outcome:?}");
    assert_eq!(listed(&b.resource(name).unwrap()).await.len(), 2);
    second.release().await.unwrap();
    bounded("EX", writing).await.unwrap().unwrap().release().await.unwrap();
    assert!(store.keys(name).is_empty());
}

/// Same-session contenders: two tasks of one session in EX exclude each
/// other; a session's PR and another task's EX request of the same
/// session wait; closing the session leaves nothing.
#[tokio::test]
async fn held_same_session_contenders_exclude_each_other() {
    let (store, s) = memory_sessions(1).await;
    let (ca, a) = (&s[0].0, &s[0].1);
    let name = "same-session";
    let first = lock(&a.resource(name).unwrap(), Ex).await;
    let again = a.resource(name).unwrap();
    let second = tokio::spawn(async move { again.lock(Ex).await });
    bounded("waits", ca.wait_for_stats(|st| st.waits >= 1)).await;
    assert!(bounded("try", a.resource(name).unwrap().try_lock(Cr))
        .await
        .unwrap()
        .is_none());
    first.release().await.unwrap();
    let second = bounded("second", second).await.unwrap().unwrap();
    assert_eq!(listed(&a.resource(name).unwrap()).await.len(), 1);
    drop(second);
    a.close().await.unwrap();
    assert!(store.keys(name).is_empty());
}

/// Blocking notifications: told once per mode, by waiting requests and
/// waiting conversions, never by try_lock / try_convert / zero timeouts
/// without notify_on_try; told again after a conversion.
#[tokio::test]
async fn held_blocking_told_once_per_mode_and_not_by_tries() {
    let (_store, s) = memory_sessions(3).await;
    let ((_, a), (cb, b), (_, c)) = (&s[0], &s[1], &s[2]);
    let name = "told";
    let mut holder = lock(&a.resource(name).unwrap().notify_blocking(), Pr).await;
    let other = b.resource(name).unwrap();
    assert!(bounded("try", other.try_lock(Ex)).await.unwrap().is_none());
    assert!(matches!(
        bounded("zero", other.lock_timeout(Pw, Duration::ZERO)).await,
        Err(Error::Timeout { .. })
    ));
    let mut peer = lock(&c.resource(name).unwrap(), Pr).await;
    assert!(!bounded("try_convert", peer.try_convert(Ex)).await.unwrap());
    assert!(matches!(
        bounded("zero convert", peer.convert_timeout(Pw, Duration::ZERO)).await,
        Err(Error::Timeout { .. })
    ));
    let quiet = tokio::time::timeout(Duration::from_millis(200), holder.blocking()).await;
    assert!(quiet.is_err(), "told by a try: {quiet:?}");
    peer.release().await.unwrap();
    let waiting = tokio::spawn(async move { other.lock(Ex).await });
    bounded("EX waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    assert_eq!(bounded("told", holder.blocking()).await.unwrap(), Ex);
    let quiet = tokio::time::timeout(Duration::from_millis(200), holder.blocking()).await;
    assert!(quiet.is_err(), "told twice: {quiet:?}");
    // Converted (PR → CR, still blocking EX): told again.
    bounded("down", holder.convert(Cr)).await.unwrap();
    assert_eq!(bounded("told after converting", holder.blocking()).await.unwrap(), Ex);
    holder.release().await.unwrap();
    bounded("EX", waiting).await.unwrap().unwrap().release().await.unwrap();
}

/// No bypass, by every request order: a compatible newcomer never
/// overtakes an earlier waiter it conflicts with (checked on each grant
/// against the queue order).
#[tokio::test]
async fn held_no_bypass_random_orders() {
    let (_store, s) = memory_sessions(6).await;
    let mut rng = Rng::new(7);
    for round in 0..40 {
        let name = format!("bypass-{round}");
        let order: Vec<LockMode> = (0..6).map(|_| LockMode::ALL[rng.below(6)]).collect();
        let grants = Arc::new(Std::new(Vec::<usize>::new()));
        let mut tasks = Vec::new();
        for (i, mode) in order.iter().copied().enumerate() {
            let resource = s[i].1.resource(&name).unwrap();
            let client = s[i].0.clone();
            let appends = client.stats().appends;
            let grants = Arc::clone(&grants);
            tasks.push(tokio::spawn(async move {
                let guard = resource.lock(mode).await.unwrap();
                grants.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(3)).await;
                guard.release().await.unwrap();
            }));
            bounded("appended", client.wait_for_stats(|st| st.appends > appends)).await;
        }
        for t in tasks {
            bounded("task", t).await.unwrap();
        }
        let grants = grants.lock().unwrap().clone();
        // i granted before an earlier j it conflicts with: a bypass.
        for (pos, &i) in grants.iter().enumerate() {
            for &j in &grants[pos + 1..] {
                assert!(
                    j >= i || order[i].compatible(order[j]),
                    "round {round}: {i} ({}) granted before earlier {j} ({}); order {order:?}, grants {grants:?}",
                    order[i],
                    order[j]
                );
            }
        }
    }
}

/// Multi-resource locks over overlapping names given in opposite orders,
/// in conflicting modes, many rounds, with cancellations: no deadlock, no
/// entry left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_multi_resource_opposite_orders() {
    let (store, s) = memory_sessions(4).await;
    let names = ["m-a", "m-b", "m-c"];
    let mut tasks = Vec::new();
    for (i, (_, session)) in s.iter().enumerate() {
        let session = session.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(100 + i as u64);
            for _ in 0..60 {
                let mut parts: Vec<(&str, LockMode)> = Vec::new();
                for n in names {
                    if rng.below(3) > 0 {
                        parts.push((n, [Pr, Ex, Pw, Cw][rng.below(4)]));
                    }
                }
                if parts.is_empty() {
                    parts.push((names[rng.below(3)], Ex));
                }
                if rng.below(2) == 0 {
                    parts.reverse();
                }
                let multi = session.multi_resource(parts).unwrap();
                match rng.below(3) {
                    0 => {
                        if let Ok(g) = tokio::time::timeout(Duration::from_millis(2), multi.lock()).await {
                            g.unwrap().release().await.unwrap();
                        }
                    }
                    1 => {
                        if let Some(g) = multi.try_lock().await.unwrap() {
                            g.release().await.unwrap();
                        }
                    }
                    _ => {
                        let g = multi.lock().await.unwrap();
                        tokio::task::yield_now().await;
                        g.release().await.unwrap();
                    }
                }
            }
        }));
    }
    for t in tasks {
        bounded("a multi-resource task ends (no deadlock)", t).await.unwrap();
    }
    bounded("cleanups", async {
        while names.iter().any(|n| !store.keys(n).is_empty()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Odd input: no panic, typed errors.
#[tokio::test]
async fn held_odd_input() {
    let (_store, s) = memory_sessions(1).await;
    let a = &s[0].1;
    for text in ["", " pw", "pw ", "P W", "ＰＷ", "p\u{0}w", "ex\n", "nl\u{301}", "🙂"] {
        assert!(
            matches!(text.parse::<LockMode>(), Err(Error::InvalidOptions { .. })),
            "{text:?}"
        );
    }
    assert_eq!("eX".parse::<LockMode>().unwrap(), Ex);
    for name in ["", "/", "//", "a//b", "a/./b", "..", "x/.."] {
        assert!(matches!(a.resource(name), Err(Error::InvalidName { .. })), "{name:?}");
    }
    assert!(matches!(
        a.multi_resource(Vec::<(&str, LockMode)>::new()),
        Err(Error::InvalidOptions { .. })
    ));
    assert!(a.multi_resource([("", Pr)]).is_err());
    let name = "odd value";
    let mut g = lock(&a.resource(name).unwrap(), Ex).await;
    assert!(matches!(
        g.set_value(&vec![0u8; lockline::MAX_LOCK_VALUE + 1]),
        Err(Error::InvalidOptions { .. })
    ));
    let tricky: Vec<u8> = b"lvb1 9 1 3 3\nabc\n\xff\x00 dlm1 EX EX 0 0"
        .iter()
        .copied()
        .cycle()
        .take(lockline::MAX_LOCK_VALUE)
        .collect();
    g.set_value(&tricky).unwrap();
    g.release().await.unwrap();
    let r = lock(&a.resource(name).unwrap(), Cr).await;
    assert_eq!(r.value().bytes, tricky);
    assert!(r.value().valid);
    r.release().await.unwrap();
    // Names that look like the encodings.
    for name in ["dlm1 EX EX 0 0 0", "lvb1 1 1 0 0", "x\u{1F642}"] {
        if let Ok(resource) = a.resource(name) {
            lock(&resource, Ex).await.release().await.unwrap();
        }
    }
}

// ---------------------------------------------------------------------------
// The randomized stress with a checker.

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The most restrictive mode whose conflicts both `a` and `b` have: what
/// a holder converting between them holds for sure.
fn meet(a: LockMode, b: LockMode) -> LockMode {
    let conflicts = |m: LockMode| LockMode::ALL.into_iter().filter(move |&o| !m.compatible(o));
    LockMode::ALL
        .into_iter()
        .rev()
        .find(|&m| conflicts(m).all(|o| !a.compatible(o) && !b.compatible(o)))
        .unwrap_or(Nl)
}

#[derive(Default)]
struct Checker {
    /// A raw session of the store, to read the queue synchronously.
    raw: Option<Arc<dyn BackendSession>>,
    /// Every registration, in order, for the report.
    log: Vec<String>,
    /// task -> (session id, mode, how) as the task believes it holds.
    holders: HashMap<usize, (String, LockMode, String)>,
    expired: HashSet<String>,
    violations: Vec<String>,
    /// The highest token of a PW/EX grant registered so far.
    sole_max: u64,
    /// The highest value-block sequence whose write completed.
    written: u64,
    deadlocks: u64,
    grants: u64,
    conversions: u64,
}

impl Checker {
    /// Registers what `task` now believes it holds; returns whether that
    /// broke exclusion.
    fn enter(&mut self, task: usize, session: &str, mode: LockMode, what: &str) -> bool {
        if self.expired.contains(session) {
            return false;
        }
        let before = self.violations.len();
        for (other, (theirs, held, how)) in &self.holders {
            if *other != task && !held.compatible(mode) {
                self.violations.push(format!(
                    "{what}: task {task} ({session}) in {mode} beside task {other} ({theirs}) in {held} (by {how})"
                ));
            }
        }
        self.holders.insert(task, (session.to_owned(), mode, what.to_owned()));
        let broke = self.violations.len() > before;
        if broke {
            if let Some(raw) = &self.raw {
                let queue = futures::executor::block_on(raw.read_queue("stress")).expect("raw read");
                let all: Vec<String> = queue
                    .slots
                    .iter()
                    .map(|s| format!("{} {}", s.entry.key, String::from_utf8_lossy(&s.value)))
                    .collect();
                let recent: Vec<&String> = self.log.iter().rev().take(16).collect();
                if let Some(last) = self.violations.last_mut() {
                    last.push_str(&format!("; store now: {all:?}; recent: {recent:?}"));
                }
            }
        }
        broke
    }

    /// Checks that the store shows `key` granted in `mode` (what the guard
    /// says) or more (a conversion whose answer never came: the guard
    /// claims less until its next call), unless the session was expired.
    fn observe(&mut self, task: usize, session: &str, key: &str, mode: LockMode, what: &str) {
        if self.expired.contains(session) {
            return;
        }
        let Some(raw) = &self.raw else { return };
        let queue = futures::executor::block_on(raw.read_queue("stress")).expect("raw read");
        let mine = queue.slots.iter().find(|s| s.entry.key == key);
        let server = mine.map(|s| String::from_utf8_lossy(&s.value).into_owned());
        let granted = mine.and_then(|s| granted_in(&s.value));
        let line = format!("task {task} ({session}) {what}: guard {mode}, store {server:?}");
        if !granted.is_some_and(|held| mode.is_down_from(held)) {
            let all: Vec<String> = queue
                .slots
                .iter()
                .map(|s| format!("{} {}", s.entry.key, String::from_utf8_lossy(&s.value)))
                .collect();
            self.violations.push(format!(
                "{line}; store: {all:?}; recent: {:?}",
                self.log.iter().rev().take(12).collect::<Vec<_>>()
            ));
        }
        self.log.push(line);
    }

    /// Adds the server's view to the last violation.
    fn server_saw(&mut self, queue: &[ModeContender]) {
        if let Some(last) = self.violations.last_mut() {
            last.push_str(&format!("; the server then: {:?}", modes(queue)));
        }
    }

    fn check_value(&mut self, value: &lockline::LockValue, before: u64, what: &str) {
        if value.sequence < before {
            self.violations.push(format!(
                "{what}: sequence {} below a completed write {before}",
                value.sequence
            ));
        }
        if value.valid {
            let expected = if value.sequence == 0 {
                Vec::new()
            } else {
                format!("v{}", value.sequence).into_bytes()
            };
            if value.bytes != expected {
                self.violations.push(format!(
                    "{what}: valid block {:?} at sequence {}",
                    String::from_utf8_lossy(&value.bytes),
                    value.sequence
                ));
            }
        }
    }
}

// The checker's lock is taken once every task has ended.
#[allow(clippy::await_holding_lock)]
async fn stress(seed: u64, tasks: usize, rounds: usize, hows: &'static [usize], round_trips: bool) {
    let gated = Gated::default();
    gated.ctl.audit.store(true, std::sync::atomic::Ordering::SeqCst);
    let store = gated.store.clone();
    let client = Client::new(gated.clone());
    let name = "stress";
    let checker = Arc::new(Std::new(Checker {
        raw: Some(store.open_session(&SessionOptions::new()).await.unwrap()),
        ..Checker::default()
    }));
    let live: Arc<Std<Vec<String>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // The server-side checker: every read of the queue has compatible holders.
    let watcher = {
        let session = client.session().await.unwrap();
        let checker = Arc::clone(&checker);
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let resource = session.resource(name).unwrap();
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(queue) = resource.contenders().await {
                    if let Err(why) = compatible_holders(&queue) {
                        checker
                            .lock()
                            .unwrap()
                            .violations
                            .push(format!("server: {why}: {:?}", modes(&queue)));
                    }
                }
                reads += 1;
                tokio::task::yield_now().await;
            }
            reads
        })
    };
    // Expiries.
    let chaos = {
        let store = store.clone();
        let checker = Arc::clone(&checker);
        let live = Arc::clone(&live);
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut rng = Rng::new(seed ^ 0xC4A05);
            let mut expired = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(15 + rng.below(20) as u64)).await;
                let victim = {
                    let live = live.lock().unwrap();
                    if live.is_empty() {
                        continue;
                    }
                    live[rng.below(live.len())].clone()
                };
                let mut c = checker.lock().unwrap();
                if store.expire(&victim) {
                    c.log.push(format!("expired {victim}"));
                    c.expired.insert(victim.clone());
                    c.holders.retain(|_, (s, _, _)| *s != victim);
                    expired += 1;
                }
            }
            expired
        })
    };

    let mut handles = Vec::new();
    for task in 0..tasks {
        let client = client.clone();
        let checker = Arc::clone(&checker);
        let live = Arc::clone(&live);
        let gated = gated.clone();
        handles.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed.wrapping_add(task as u64 * 7919));
            let mut session: Option<Session> = None;
            for round in 0..rounds {
                let s = match &session {
                    Some(s) if !s.state().is_over() => s.clone(),
                    _ => {
                        let s = client.session().await.unwrap();
                        if round_trips {
                            gated.yielding(&s);
                        }
                        live.lock().unwrap().push(s.id().to_owned());
                        session = Some(s.clone());
                        s
                    }
                };
                let id = s.id().to_owned();
                let Ok(resource) = s.resource(name) else { continue };
                let mode = LockMode::ALL[rng.below(6)];
                let (before_written, before_sole) = {
                    let c = checker.lock().unwrap();
                    (c.written, c.sole_max)
                };
                let ms = Duration::from_millis(1 + rng.below(25) as u64);
                let how = hows[rng.below(hows.len())];
                let got = match how {
                    0 => resource.lock(mode).await.map(Some),
                    1 => match resource.lock_timeout(mode, ms).await {
                        Err(Error::Timeout { .. }) => Ok(None),
                        other => other.map(Some),
                    },
                    2 => resource.try_lock(mode).await,
                    _ => match tokio::time::timeout(ms, resource.lock(mode)).await {
                        Err(_) => Ok(None),
                        Ok(other) => other.map(Some),
                    },
                };
                let mut guard = match got {
                    Ok(Some(g)) => g,
                    Ok(None) => continue,
                    Err(Error::SessionLost { .. } | Error::Closed { .. } | Error::LockLost { .. }) => continue,
                    Err(e) => panic!("task {task} round {round}: lock {mode}: {e}"),
                };
                let broke = {
                    let mut c = checker.lock().unwrap();
                    c.grants += 1;
                    let what = format!("grant {mode} (how {how})");
                    c.observe(task, &id, guard.key(), mode, &what);
                    let broke = c.enter(task, &id, mode, &what);
                    c.check_value(&guard.value(), before_written, "grant");
                    if mode.sole_writer() && !c.expired.contains(&id) {
                        if guard.token().get() <= before_sole {
                            c.violations.push(format!(
                                "grant {mode}: token {} not above an earlier PW/EX token {before_sole}",
                                guard.token()
                            ));
                        }
                        c.sole_max = c.sole_max.max(guard.token().get());
                    }
                    broke
                };
                if broke {
                    if let Ok(queue) = resource.contenders().await {
                        checker.lock().unwrap().server_saw(&queue);
                    }
                }
                let mut wrote = None;
                // An up-conversion dropped in flight may have been granted:
                // the guard learns it at its next call (until then `mode()`
                // under-claims), so a later call may find the lock in it.
                let mut dropped_to: Option<LockMode> = None;
                for _ in 0..rng.below(4) {
                    let from = guard.mode();
                    if from.sole_writer() && rng.below(2) == 0 {
                        let next = guard.value().sequence + 1;
                        guard.set_value(format!("v{next}").as_bytes()).unwrap();
                        wrote = Some(next);
                    }
                    let to = LockMode::ALL[rng.below(6)];
                    if to.is_down_from(from) {
                        checker
                            .lock()
                            .unwrap()
                            .enter(task, &id, to, &format!("down {from}→{to}"));
                        match guard.convert(to).await {
                            Ok(()) => {
                                checker.lock().unwrap().observe(
                                    task,
                                    &id,
                                    guard.key(),
                                    to,
                                    &format!("down {from}→{to} done"),
                                );
                                if from.sole_writer() && !to.sole_writer() {
                                    if let Some(w) = wrote.take() {
                                        let mut c = checker.lock().unwrap();
                                        c.written = c.written.max(w);
                                    }
                                }
                            }
                            Err(_) => break,
                        }
                        continue;
                    }
                    let (before_written, before_sole) = {
                        let c = checker.lock().unwrap();
                        (c.written, c.sole_max)
                    };
                    let ms = Duration::from_millis(1 + rng.below(25) as u64);
                    let how = hows[rng.below(hows.len())];
                    // While it converts, the store holds `from` or `to`: the
                    // checker counts the mode both imply (CR for CW ⇄ PR).
                    let either = meet(from, to);
                    if either != from {
                        checker
                            .lock()
                            .unwrap()
                            .enter(task, &id, either, &format!("converting {from}→{to}"));
                    }
                    let outcome = match how {
                        0 => guard.convert(to).await.map(|()| true),
                        1 => match guard.convert_timeout(to, ms).await {
                            Err(Error::Timeout { .. }) => Ok(false),
                            other => other.map(|()| true),
                        },
                        2 => guard.try_convert(to).await,
                        _ => match tokio::time::timeout(ms, guard.convert(to)).await {
                            Err(_) => {
                                dropped_to = Some(to);
                                Ok(false)
                            }
                            Ok(other) => other.map(|()| true),
                        },
                    };
                    match outcome {
                        Ok(true) => {
                            let broke = {
                                let mut c = checker.lock().unwrap();
                                c.conversions += 1;
                                let what = format!("up {from}→{to} (how {how})");
                                c.observe(task, &id, guard.key(), to, &what);
                                let broke = c.enter(task, &id, to, &what);
                                if to.sole_writer() && !from.sole_writer() {
                                    c.check_value(&guard.value(), before_written, "up-conversion");
                                }
                                if to.writes() && !c.expired.contains(&id) && guard.token().get() <= before_sole {
                                    c.violations.push(format!(
                                        "up-conversion to {to}: token {} not above {before_sole}",
                                        guard.token()
                                    ));
                                }
                                if to.sole_writer() && !c.expired.contains(&id) {
                                    c.sole_max = c.sole_max.max(guard.token().get());
                                }
                                broke
                            };
                            if broke {
                                if let Ok(queue) = resource.contenders().await {
                                    checker.lock().unwrap().server_saw(&queue);
                                }
                            }
                        }
                        Ok(false) => {
                            let mut c = checker.lock().unwrap();
                            let what = format!("gave up {from}→{to} (how {how})");
                            // A conversion dropped in flight may have been
                            // granted (the guard learns it at its next
                            // conversion or release): the store may hold
                            // either mode, the guard claims the lower.
                            // Otherwise the call read the store first: the
                            // guard's mode is the store's.
                            let now = guard.mode();
                            if how != 3 {
                                c.observe(task, &id, guard.key(), now, &what);
                            }
                            c.enter(task, &id, now, &what);
                        }
                        Err(Error::Deadlock { held, .. }) => {
                            let mut c = checker.lock().unwrap();
                            let what = format!("deadlock {from}→{to} (how {how})");
                            c.observe(task, &id, guard.key(), from, &what);
                            c.enter(task, &id, from, &what);
                            c.deadlocks += 1;
                            if held != guard.mode() || (held != from && Some(held) != dropped_to) {
                                c.violations.push(format!(
                                    "deadlock left {held}/{} from {from} (a dropped conversion to {dropped_to:?})",
                                    guard.mode()
                                ));
                            }
                        }
                        Err(_) => break,
                    }
                    if rng.below(3) == 0 {
                        tokio::time::sleep(Duration::from_millis(rng.below(3) as u64)).await;
                    }
                }
                {
                    let mut c = checker.lock().unwrap();
                    c.holders.remove(&task);
                    c.log.push(format!("task {task} ({id}) lets go of {}", guard.mode()));
                }
                if rng.below(6) == 0 {
                    drop(guard); // background release; a PW/EX value is then not valid
                } else {
                    let sole = guard.mode().sole_writer();
                    if guard.release().await.is_ok() && sole {
                        if let Some(w) = wrote {
                            let mut c = checker.lock().unwrap();
                            c.written = c.written.max(w);
                        }
                    }
                }
            }
            if let Some(s) = session {
                let _ = s.close().await;
            }
        }));
    }
    let ended = tokio::time::timeout(Duration::from_secs(90), futures::future::join_all(handles)).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let reads = watcher.await.unwrap();
    let expired = chaos.await.unwrap();
    let queue = {
        let s = client.session().await.unwrap();
        s.resource(name).unwrap().contenders().await.unwrap()
    };
    let mut c = checker.lock().unwrap();
    c.violations
        .extend(gated.ctl.violations.lock().unwrap().iter().cloned());
    eprintln!(
        "seed {seed}: {} grants, {} up-conversions, {} deadlocks, {expired} expiries, {reads} checker reads",
        c.grants, c.conversions, c.deadlocks
    );
    assert!(
        c.violations.is_empty(),
        "seed {seed}: violations:\n{}",
        c.violations.join("\n")
    );
    let ended = ended.unwrap_or_else(|_| panic!("seed {seed}: tasks hung; queue {:?}", modes(&queue)));
    for outcome in ended {
        outcome.unwrap();
    }
    let expired_ids = c.expired.clone();
    drop(c);
    let settled = tokio::time::timeout(Duration::from_secs(5), async {
        while !store.keys(name).is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    if settled.is_err() {
        let s = client.session().await.unwrap();
        let left = s.resource(name).unwrap().contenders().await.unwrap();
        let described: Vec<String> = left
            .iter()
            .map(|c| {
                let owner = c.session.clone().unwrap_or_default();
                format!(
                    "{} {:?}/{} owner {owner} (expired by the test: {})",
                    c.key,
                    c.granted,
                    c.requested,
                    expired_ids.contains(&owner)
                )
            })
            .collect();
        panic!(
            "seed {seed}: entries left after every session ended:\n{}",
            described.join("\n")
        );
    }
}

/// Random modes, conversions (up, down, CW ⇄ PR), timeouts, tries and
/// expiries; cancellations only through the library's own timeouts. The
/// checker: every state the store passes through has compatible grants;
/// what each task believes it holds is what the store holds and is
/// compatible with what the others believe; PW/EX tokens rise; a valid
/// value block is the last write; no entry is left at the end. Held,
/// except that it can hit (rarely) the memory backend's append/expiry race
/// (`bug_memory_append_racing_expiry_leaves_an_orphan_entry`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_random_modes_without_dropped_futures() {
    for seed in 1..=4 {
        stress(seed, 10, 40, &[0, 1, 2], false).await;
    }
}

/// The same with `lock()` and `convert()` futures dropped by an outer
/// timeout (the background cleanups). Held, but for the memory backend's
/// append/expiry race, which it hits now and then (an entry of an expired
/// session left for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_random_modes_with_dropped_futures() {
    for seed in 11..=14 {
        stress(seed, 10, 40, &[0, 1, 2, 3], false).await;
    }
}

/// BUG (found by this stress): the same, every backend call answering one
/// poll later (a round trip): `convert_timeout` / `lock_timeout` deadlines
/// fall while a grant's answer is on its way, and the guard disagrees with
/// the store (see
/// `bug_convert_timeout_reports_timeout_for_a_conversion_the_store_granted`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_stress_round_trips_with_timeouts() {
    for seed in 21..=26 {
        stress(seed, 10, 40, &[0, 1, 2], true).await;
    }
}

/// Round trips, with no timeout and no dropped future at all (waiting
/// `lock`/`convert` and tries only): exclusion, deadlock detection and
/// cleanup on their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_random_modes_with_round_trips_without_timeouts() {
    for seed in 41..=44 {
        stress(seed, 10, 40, &[0, 2], true).await;
    }
}

/// BUG (found by this stress): round trips and dropped futures together —
/// guards that disagree with the store after a cut in flight, and now and
/// then an orphan entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_stress_round_trips_with_dropped_futures() {
    for seed in 31..=34 {
        stress(seed, 10, 40, &[0, 1, 2, 3], true).await;
    }
}

// ---------------------------------------------------------------------------
// Deadlock detection against an independent oracle.

#[derive(Debug, Clone, Copy)]
struct Slot {
    granted: Option<LockMode>,
    requested: LockMode,
}

fn decode(value: &[u8]) -> Slot {
    let text = String::from_utf8_lossy(value);
    let words: Vec<&str> = text.split(' ').collect();
    Slot {
        granted: words.get(1).and_then(|w| w.parse().ok()),
        requested: words.get(2).and_then(|w| w.parse().ok()).unwrap_or(Ex),
    }
}

/// Whether the entry at `me` is kept waiting by the entry at `other`, by
/// the rule as documented (a request: every earlier entry, with both modes
/// of a conversion; a conversion: every other granted entry's held mode
/// and every earlier waiting request).
fn waits_for(queue: &[Slot], me: usize, other: usize) -> bool {
    let (m, o) = (queue[me], queue[other]);
    match m.granted {
        None => {
            other < me
                && (o.granted.is_some_and(|g| !g.compatible(m.requested)) || !o.requested.compatible(m.requested))
        }
        Some(g) if g == m.requested => false,
        Some(_) => match o.granted {
            Some(held) => !held.compatible(m.requested),
            None => other < me && !o.requested.compatible(m.requested),
        },
    }
}

/// Graph reduction: settled holders may all let go; any waiter no one
/// left keeps waiting is granted and then lets go; whether `me` is ever
/// granted.
fn ever_granted(mut queue: Vec<(usize, Slot)>, me: usize) -> bool {
    queue.retain(|(i, s)| *i == me || s.granted.is_none_or(|g| g != s.requested));
    loop {
        let slots: Vec<Slot> = queue.iter().map(|(_, s)| *s).collect();
        let free = (0..slots.len()).find(|&a| (0..slots.len()).all(|b| a == b || !waits_for(&slots, a, b)));
        match free {
            None => return false,
            Some(a) if queue[a].0 == me => return true,
            Some(a) => {
                queue.remove(a);
            }
        }
    }
}

/// Random small queues of holders, waiting requests and conversions: a
/// conversion fails with Deadlock exactly when, by graph reduction (every
/// settled holder letting go, every grantable waiter granted and letting
/// go), it could never be granted; otherwise it is granted at once or
/// waits.
#[tokio::test]
async fn held_deadlock_detection_matches_graph_reduction() {
    let store = MemoryBackend::new();
    let raw = store.open_session(&SessionOptions::new()).await.unwrap();
    let mut rng = Rng::new(4242);
    let (mut deadlocks, mut waits, mut grants) = (0, 0, 0);
    for scenario in 0..1500 {
        let name = format!("oracle-{scenario}");
        let mut sessions = Vec::new();
        for _ in 0..4 {
            sessions.push(Client::new(store.clone()).session().await.unwrap());
        }
        // Per session: a guard held (settled), or a task in progress.
        let mut held: Vec<Option<ResourceGuard>> = (0..4).map(|_| None).collect();
        #[allow(clippy::type_complexity)]
        let mut busy: Vec<Option<tokio::task::JoinHandle<Result<ResourceGuard, (ResourceGuard, Error)>>>> =
            (0..4).map(|_| None).collect();
        for _step in 0..10 {
            let i = rng.below(4);
            if busy[i].as_ref().is_some_and(|t| !t.is_finished()) {
                continue;
            }
            if let Some(t) = busy[i].take() {
                match t.await.unwrap() {
                    Ok(g) => held[i] = Some(g),
                    Err((g, _)) => held[i] = Some(g),
                }
            }
            match held[i].take() {
                None => {
                    let mode = LockMode::ALL[rng.below(6)];
                    let resource = sessions[i].resource(&name).unwrap();
                    busy[i] = Some(tokio::spawn(async move {
                        resource.lock(mode).await.map_err(|e| panic!("lock: {e}"))
                    }));
                }
                Some(mut g) => {
                    let to = LockMode::ALL[rng.below(6)];
                    if to.is_down_from(g.mode()) {
                        g.convert(to).await.unwrap();
                        held[i] = Some(g);
                    } else {
                        // The oracle, on the state the conversion will read.
                        let queue = futures::executor::block_on(raw.read_queue(&name)).unwrap();
                        let mut slots: Vec<(usize, Slot)> = queue
                            .slots
                            .iter()
                            .enumerate()
                            .map(|(k, s)| (k, decode(&s.value)))
                            .collect();
                        let me = queue.slots.iter().position(|s| s.entry.key == g.key()).unwrap();
                        slots[me].1.requested = to;
                        let expected = !ever_granted(slots.clone(), me);
                        let from = g.mode();
                        let task = tokio::spawn(async move {
                            match g.convert(to).await {
                                Ok(()) => Ok(g),
                                Err(e) => Err((g, e)),
                            }
                        });
                        for _ in 0..20 {
                            tokio::task::yield_now().await;
                        }
                        let view: Vec<String> = slots
                            .iter()
                            .map(|(_, s)| format!("{:?}/{}", s.granted, s.requested))
                            .collect();
                        if task.is_finished() {
                            match task.await.unwrap() {
                                Ok(g) => {
                                    assert!(!expected, "scenario {scenario}: {from}→{to} granted, oracle says deadlock: {view:?} (me {me})");
                                    grants += 1;
                                    held[i] = Some(g);
                                }
                                Err((g, Error::Deadlock { .. })) => {
                                    assert!(
                                        expected,
                                        "scenario {scenario}: {from}→{to} FALSE Deadlock: {view:?} (me {me})"
                                    );
                                    deadlocks += 1;
                                    held[i] = Some(g);
                                }
                                Err((_, e)) => panic!("scenario {scenario}: {e}"),
                            }
                        } else {
                            assert!(
                                !expected,
                                "scenario {scenario}: {from}→{to} waits, oracle says deadlock: {view:?} (me {me})"
                            );
                            waits += 1;
                            busy[i] = Some(task);
                        }
                    }
                }
            }
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
        }
        for t in busy.into_iter().flatten() {
            t.abort();
        }
        drop(held);
        for s in sessions {
            s.close().await.unwrap();
        }
        assert!(store.keys(&name).is_empty());
    }
    eprintln!("{deadlocks} deadlocks, {waits} waits, {grants} immediate grants");
    assert!(deadlocks > 10 && waits > 10);
}

/// Blocking notifications are paid for by those who listen: a waiter
/// behind a lock whose resource was not made with `notify_blocking` writes
/// no mark on it (the holder's entry is as its grant wrote it), and that
/// holder's `blocking()` is refused at once instead of waiting for ever.
#[tokio::test]
async fn held_no_mark_is_written_on_a_lock_that_does_not_listen() {
    let (store, s) = memory_sessions(2).await;
    let ((_, a), (cb, b)) = (&s[0], &s[1]);
    let name = "quiet";
    let holder = lock(&a.resource(name).unwrap(), Pr).await;
    let raw = store.open_session(&SessionOptions::new()).await.unwrap();
    let before = raw.read_queue(name).await.unwrap().slots[0].value.clone();
    let writer = b.resource(name).unwrap().notify_on_try();
    assert!(bounded("try EX", writer.try_lock(Ex)).await.unwrap().is_none());
    let waiting = tokio::spawn(async move { writer.lock(Ex).await });
    bounded("EX waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let after = raw.read_queue(name).await.unwrap().slots[0].value.clone();
    assert_eq!(before, after, "a mark was written on a holder that does not listen");
    assert!(matches!(holder.blocking().await, Err(Error::InvalidOptions { .. })));
    holder.release().await.unwrap();
    bounded("EX", waiting).await.unwrap().unwrap().release().await.unwrap();
}

// ===========================================================================
// Hand-over attacks: a release (or a leaving request) grants, in its one
// write, the waiting requests its departure lets in; they learn it from their
// wake. Tests that fail now assert the promised behaviour.

/// The value block as a grant reports it: (bytes, sequence, valid).
fn block_of(guard: &ResourceGuard) -> (Vec<u8>, u64, bool) {
    let value = guard.value();
    (value.bytes, value.sequence, value.valid)
}

/// A request dropped while its append is in flight (applied in the store,
/// its answer not back) is abandoned by attempt, and `abandon` deletes its
/// entry plainly. A release that handed that entry EX in between named it
/// in the value block, so its plain deletion reads as an involuntary loss:
/// the next holder finds the block not valid and is held back for its
/// lock-delay, though nobody lost anything.
///
/// 1. A holds EX and sets the block to `v1`.
/// 2. B's `lock(EX)` appends (applied), and is dropped before the answer
///    comes back: its `PendingEntry` knows the attempt only.
/// 3. A releases: `hand_over` grants B's entry EX and names it in the block.
/// 4. B's cleanup abandons the attempt: a plain delete.
/// 5. C (lock-delay 1 s) locks EX: the block names a gone PW/EX holder.
#[tokio::test]
async fn request_abandoned_after_it_was_handed_the_lock_leaves_the_value_block_not_valid_but_kept() {
    let delay = Duration::from_millis(1000);
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let cc = Client::new(gated.clone());
    let c = cc
        .session_with(SessionOptions::new().with_lock_delay(delay))
        .await
        .unwrap();
    let name = "abandoned-handed";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    // A conversion, even to the mode held, drops the read the grant was
    // made from: the release reads the queue and hands over to the waiter
    // queued since (a holder granted before anyone waited otherwise
    // releases plainly, and its waiter grants itself).
    holder.convert(Ex).await.unwrap();
    holder.set_value(b"v1").unwrap();
    let armed = gated.trap(b, "append");
    let rb = b.resource(name).unwrap();
    let mut request = Box::pin(rb.lock(Ex));
    assert!(poll!(&mut request).is_pending());
    armed.reached.await.unwrap();
    holder.release().await.unwrap();
    assert_eq!(
        modes(&listed(&ra).await),
        vec![(Some(Ex), Ex)],
        "the release handed B's entry the lock"
    );
    drop(request);
    drop(armed.resume);
    until_queue(&ra, "B's abandoned request leaves", <[ModeContender]>::is_empty).await;
    let started = Instant::now();
    let next = lock(&c.resource(name).unwrap(), Ex).await;
    let took = started.elapsed();
    // The documented limit: an attempt abandoned without its entry known
    // leaves as a lost holder would. Conservative: the value is kept and
    // said not valid, and the lock-delay is served, never skipped.
    assert_eq!(
        block_of(&next),
        (b"v1".to_vec(), 1, false),
        "the value kept, not said valid"
    );
    assert!(took >= delay, "C held back only {took:?} (lock-delay {delay:?})");
    next.release().await.unwrap();
}

/// A timed request handed the lock before its deadline, whose wake read is
/// still in flight when the deadline passes, is told `Timeout` (the read
/// at the top of the wait loop is bounded by the deadline), and its
/// background cleanup passes on the lock it was granted. The promise: a
/// timed request handed the lock keeps it; the deadline branch of the
/// select checks for that, but not a deadline that cuts the wake's read.
///
/// 1. A holds EX; B waits `lock_timeout(EX, 400 ms)`.
/// 2. A releases before B's deadline: B's entry is granted EX in the store.
/// 3. B wakes and reads; the read is applied, its answer held past the
///    deadline (a slow round trip).
/// 4. B reports `Timeout`.
#[tokio::test]
async fn timed_request_handed_the_lock_keeps_it_when_its_wake_read_outlives_the_deadline() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let cb = &s[1].0;
    let name = "handed-read-at-deadline";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    // A conversion, even to the mode held, drops the read the grant was
    // made from: the release reads the queue and hands over to the waiter
    // queued since (a holder granted before anyone waited otherwise
    // releases plainly, and its waiter grants itself).
    holder.convert(Ex).await.unwrap();
    let rb = b.resource(name).unwrap();
    let timeout = Duration::from_millis(400);
    let waiting = tokio::spawn(async move { rb.lock_timeout(Ex, timeout).await });
    bounded("B waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let armed = gated.trap(b, "read_queue");
    holder.release().await.unwrap();
    armed.reached.await.unwrap();
    assert_eq!(
        modes(&listed(&ra).await),
        vec![(Some(Ex), Ex)],
        "B was handed EX before its deadline"
    );
    tokio::time::sleep(timeout + Duration::from_millis(200)).await;
    let _ = armed.resume.send(());
    let outcome = bounded("B's outcome", waiting).await.unwrap();
    let guard = outcome.unwrap_or_else(|e| panic!("B was handed EX before its deadline, and was told: {e}"));
    assert_eq!(guard.mode(), Ex);
    guard.release().await.unwrap();
}

/// A waiter next after a holder lost involuntarily is held back for its
/// lock-delay — unless another departure hands it the lock between the
/// loss and its wake read: `hand_over` looks only at a lost holder the
/// block names (PW/EX), never at `departure()`, and the waiter checks
/// `handed` before the lock-delay. Before the hand-over that departure was
/// a plain delete and the waiter held back.
///
/// 1. A holds PR; X (lock-delay 1 s) waits for EX on A; Y waits for EX
///    behind X.
/// 2. A's session expires; X's watch sees A gone (held there a moment, as
///    a watch event in transit is).
/// 3. Y's request is cancelled: its leaving hands X the lock (A gone,
///    nothing named lost in the block).
/// 4. X reads, finds itself granted, and returns at once.
#[tokio::test]
async fn lock_delay_holds_when_a_departure_hands_over_between_the_loss_and_the_wake() {
    let delay = Duration::from_millis(1000);
    let gated = Gated::default();
    let (ca, cx, cy) = (
        Client::new(gated.clone()),
        Client::new(gated.clone()),
        Client::new(gated.clone()),
    );
    let a = ca.session().await.unwrap();
    let x = cx
        .session_with(SessionOptions::new().with_lock_delay(delay))
        .await
        .unwrap();
    let y = cy.session().await.unwrap();
    let name = "delay-handed-before-wake";
    let reader = lock(&a.resource(name).unwrap(), Pr).await;
    let rx = x.resource(name).unwrap();
    let waiting = tokio::spawn(async move {
        let outcome = rx.lock(Ex).await;
        (Instant::now(), outcome)
    });
    bounded("X waits", cx.wait_for_stats(|st| st.waits >= 1)).await;
    let ry = y.resource(name).unwrap();
    let behind = tokio::spawn(async move { ry.lock(Ex).await });
    bounded("Y waits", cy.wait_for_stats(|st| st.waits >= 1)).await;
    let armed = gated.trap(&x, "watch_value");
    let lost_at = Instant::now();
    assert!(gated.store.expire(a.id()));
    armed.reached.await.unwrap();
    behind.abort();
    let _ = behind.await;
    let ryy = y.resource(name).unwrap();
    until_queue(&ryy, "Y leaves", |q| q.len() == 1).await;
    let _ = armed.resume.send(());
    let (at, outcome) = bounded("X granted", waiting).await.unwrap();
    let granted = outcome.unwrap();
    drop(reader);
    assert!(
        at - lost_at >= delay,
        "EX granted {:?} after the PR holder's involuntary loss (lock-delay {delay:?})",
        at - lost_at
    );
    granted.release().await.unwrap();
}

/// During a lock-delay "the contender is not the holder, nobody is"
/// (docs/sequencers.md). A waiter behind the held-back contender that
/// leaves hands it the lock at once: the store shows it granted EX, with a
/// token, while its delay runs.
///
/// 1. A holds PR; X (lock-delay 1 s) waits for EX; Y waits for EX behind X.
/// 2. A's session expires; X begins its lock-delay.
/// 3. Y is cancelled: its leaving grants X during the delay.
#[tokio::test]
async fn nobody_holds_during_a_lock_delay_when_a_waiter_behind_leaves() {
    let delay = Duration::from_millis(1500);
    let store = MemoryBackend::new();
    let (ca, cx, cy) = (
        Client::new(store.clone()),
        Client::new(store.clone()),
        Client::new(store.clone()),
    );
    let a = ca.session().await.unwrap();
    let x = cx
        .session_with(SessionOptions::new().with_lock_delay(delay))
        .await
        .unwrap();
    let y = cy.session().await.unwrap();
    let name = "delay-handed-during";
    let reader = lock(&a.resource(name).unwrap(), Pr).await;
    let rx = x.resource(name).unwrap();
    let waiting = tokio::spawn(async move { rx.lock(Ex).await });
    bounded("X waits", cx.wait_for_stats(|st| st.waits >= 1)).await;
    let ry = y.resource(name).unwrap();
    let behind = tokio::spawn(async move { ry.lock(Ex).await });
    bounded("Y waits", cy.wait_for_stats(|st| st.waits >= 1)).await;
    let lost_at = Instant::now();
    assert!(store.expire(a.id()));
    bounded("X's lock-delay begins", cx.wait_for_stats(|st| st.lock_delays >= 1)).await;
    behind.abort();
    let _ = behind.await;
    let rq = y.resource(name).unwrap();
    until_queue(&rq, "Y leaves", |q| q.len() == 1).await;
    let during = listed(&rq).await;
    let checked_at = lost_at.elapsed();
    assert!(checked_at < delay, "checked too late ({checked_at:?}) to tell");
    assert_eq!(
        modes(&during),
        vec![(None, Ex)],
        "{checked_at:?} into X's lock-delay, the store shows X holding"
    );
    let granted = bounded("X granted", waiting).await.unwrap().unwrap();
    drop(reader);
    granted.release().await.unwrap();
}

/// A dropped PW/EX guard releases in the background "and writes the block
/// as `release()` would". Its hand-over reads first; when that read fails
/// (a transient error), the fallback is a plain delete: the value set is
/// lost and the block still names the gone holder, so the next holder
/// finds it not valid and is held back for its lock-delay.
#[tokio::test]
async fn dropped_guard_whose_hand_over_read_fails_still_writes_the_value_block() {
    let delay = Duration::from_millis(1000);
    let (gated, s) = gated_sessions(1).await;
    let a = &s[0].1;
    let cc = Client::new(gated.clone());
    let c = cc
        .session_with(SessionOptions::new().with_lock_delay(delay))
        .await
        .unwrap();
    let name = "dropped-read-fails";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    holder.set_value(b"v1").unwrap();
    gated.lose_answer(a, "read_queue");
    drop(holder);
    let rc = c.resource(name).unwrap();
    until_queue(&rc, "the dropped guard's entry leaves", <[ModeContender]>::is_empty).await;
    let started = Instant::now();
    let next = lock(&rc, Ex).await;
    let took = started.elapsed();
    assert_eq!(
        block_of(&next),
        (b"v1".to_vec(), 1, true),
        "the dropped guard's value block"
    );
    assert!(took < delay, "held back {took:?} after a clean (dropped-guard) release");
    next.release().await.unwrap();
}

/// A guard whose append was retried (its first answer lost) is let go on
/// drop through `spawn_abandon`, whose cleanup hands over with no value
/// block: a PW/EX holder's `set_value` is never written, though a dropped
/// guard "writes the block as `release()` would".
#[tokio::test]
async fn dropped_guard_after_a_retried_append_writes_its_value_block() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "dropped-retried-append";
    let ra = a.resource(name).unwrap();
    gated.lose_answer(a, "append");
    let mut holder = lock(&ra, Ex).await;
    holder.set_value(b"v1").unwrap();
    drop(holder);
    let rb = b.resource(name).unwrap();
    until_queue(&rb, "the dropped guard's entry leaves", <[ModeContender]>::is_empty).await;
    let next = lock(&rb, Ex).await;
    assert_eq!(
        block_of(&next),
        (b"v1".to_vec(), 1, true),
        "the dropped guard's value block"
    );
    next.release().await.unwrap();
}

/// Held: a release whose hand-over write is applied and its answer lost is
/// tried again, finds its entry gone and reports success; the successor
/// holds with a higher token and the block as the releaser left it.
#[tokio::test]
async fn held_release_whose_hand_over_answer_is_lost() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let cb = &s[1].0;
    let name = "release-answer-lost";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    holder.set_value(b"v1").unwrap();
    let first = holder.token();
    let rb = b.resource(name).unwrap();
    let waiting = tokio::spawn(async move { rb.lock(Ex).await });
    bounded("B waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    gated.lose_answer(a, "update_queue");
    holder
        .release()
        .await
        .expect("a retried release whose first try applied");
    let next = bounded("B granted", waiting).await.unwrap().unwrap();
    assert!(next.token() > first);
    assert_eq!(block_of(&next), (b"v1".to_vec(), 1, true));
    assert_eq!(modes(&listed(&ra).await), vec![(Some(Ex), Ex)]);
    next.release().await.unwrap();
}

/// A waiting request that is cancelled leaves through `hand_over`, which
/// reads the queue and, when its departure lets nobody in, removes the
/// entry with a plain, unconditional delete. A release that hands it EX
/// between that read and that delete names it in the value block; the
/// delete then reads as an involuntary loss: the next holder finds the
/// block not valid and is held back for its lock-delay. (A waiter that
/// times out or is dropped exactly as it is handed the lock.)
///
/// 1. A holds EX and sets the block to `v1`; B waits for EX.
/// 2. B is cancelled; its cleanup's `hand_over` reads: B waiting, A
///    holding, nobody let in.
/// 3. A releases: its `hand_over` grants B EX and names B in the block.
/// 4. B's cleanup deletes its entry plainly (`alone`).
/// 5. C (lock-delay 1 s) locks EX.
#[tokio::test]
async fn request_cancelled_as_it_is_handed_the_lock_leaves_the_value_block_valid_and_no_lock_delay() {
    let delay = Duration::from_millis(1000);
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let cb = &s[1].0;
    let cc = Client::new(gated.clone());
    let c = cc
        .session_with(SessionOptions::new().with_lock_delay(delay))
        .await
        .unwrap();
    let name = "cancelled-as-handed";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    // A conversion, even to the mode held, drops the read the grant was
    // made from: the release reads the queue and hands over to the waiter
    // queued since (a holder granted before anyone waited otherwise
    // releases plainly, and its waiter grants itself).
    holder.convert(Ex).await.unwrap();
    holder.set_value(b"v1").unwrap();
    let rb = b.resource(name).unwrap();
    let waiting = tokio::spawn(async move { rb.lock(Ex).await });
    bounded("B waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let armed = gated.trap(b, "read_queue");
    waiting.abort();
    let _ = waiting.await;
    armed.reached.await.unwrap();
    holder.release().await.unwrap();
    let rc = c.resource(name).unwrap();
    assert_eq!(
        modes(&listed(&rc).await),
        vec![(Some(Ex), Ex)],
        "A's release handed B EX"
    );
    let _ = armed.resume.send(());
    until_queue(&rc, "B's cancelled request leaves", <[ModeContender]>::is_empty).await;
    let started = Instant::now();
    let next = lock(&rc, Ex).await;
    let took = started.elapsed();
    assert_eq!(
        block_of(&next),
        (b"v1".to_vec(), 1, true),
        "nobody lost a PW/EX lock involuntarily: the block stays valid"
    );
    assert!(
        took < delay,
        "C held back {took:?} (lock-delay {delay:?}) after clean departures only"
    );
    next.release().await.unwrap();
}

/// A session closed while it holds EX: the server deletes its entry
/// without the value block's write, so the block still names it and the
/// next holder finds the value kept but not valid, and serves its
/// lock-delay, as after a loss (the documented limit; a release before the
/// close keeps the block valid).
#[tokio::test]
async fn session_closed_while_holding_ex_ends_its_lock_as_a_loss_does() {
    let delay = Duration::from_millis(1000);
    let store = MemoryBackend::new();
    let (ca, cc) = (Client::new(store.clone()), Client::new(store.clone()));
    let a = ca.session().await.unwrap();
    let c = cc
        .session_with(SessionOptions::new().with_lock_delay(delay))
        .await
        .unwrap();
    let name = "closed-while-holding";
    let mut writer = lock(&a.resource(name).unwrap(), Ex).await;
    writer.set_value(b"v1").unwrap();
    writer.convert(Nl).await.unwrap();
    writer.convert(Ex).await.unwrap();
    a.close().await.unwrap();
    drop(writer);
    let rc = c.resource(name).unwrap();
    until_queue(&rc, "the closed session's entry is gone", <[ModeContender]>::is_empty).await;
    let started = Instant::now();
    let next = lock(&rc, Ex).await;
    let took = started.elapsed();
    // The documented limit: the server ends a closed session's entries
    // without the value block's write, so the block reads as after a loss
    // (release a PW or EX lock before closing to keep it valid).
    assert_eq!(
        block_of(&next),
        (b"v1".to_vec(), 1, false),
        "the value kept, not said valid"
    );
    assert!(took >= delay, "held back only {took:?} (lock-delay {delay:?})");
    next.release().await.unwrap();
}

/// Held: a chain of exclusive hand-overs wakes one waiter per release, and
/// every release hands over.
#[tokio::test]
async fn held_exclusive_hand_over_chain_wakes_one_waiter_per_release() {
    let store = MemoryBackend::new();
    let client = Client::new(store.clone());
    let name = "hand-over-chain";
    let first = client.session().await.unwrap();
    let holder = lock(&first.resource(name).unwrap(), Ex).await;
    let n = 6;
    let mut tasks = Vec::new();
    for i in 0..n {
        let session = client.session().await.unwrap();
        let resource = session.resource(name).unwrap();
        tasks.push(tokio::spawn(async move {
            let guard = resource.lock(Ex).await.expect("EX");
            guard.release().await.expect("release");
            drop(session);
        }));
        bounded("queued", client.wait_for_stats(|st| st.waits >= (i + 1) as u64)).await;
    }
    let before = client.stats();
    holder.release().await.unwrap();
    for task in tasks {
        bounded("chain", task).await.unwrap();
    }
    let after = client.stats();
    let releases = after.releases - before.releases;
    let wakeups = after.wakeups - before.wakeups;
    let handovers = after.handovers - before.handovers;
    assert_eq!(releases, n as u64 + 1);
    // Every release but the last, and but the first: its holder was granted
    // before anyone waited, so it releases plainly and the first waiter
    // grants itself (from a read that sees the others).
    assert_eq!(
        handovers,
        n as u64 - 1,
        "every release but the first and the last handed over"
    );
    assert!(wakeups <= releases, "{wakeups} wakeups for {releases} releases");
}
