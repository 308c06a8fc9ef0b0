//! The conformance suite: one set of behavioural cases that every backend must
//! pass (DESIGN §7), generic over a [`Fixture`].
//!
//! A backend's tests implement [`Fixture`] and expand [`conformance_tests!`],
//! which declares one `#[tokio::test]` per case so that a failure names its case:
//!
//! ```text
//! lockline::conformance_tests!(MyFixture::start().await);
//! ```
//!
//! Every case panics (fails) on a wrong behaviour: this module is a test
//! suite, compiled only with the `conformance` feature, and its `expect`s and
//! `panic!`s are its assertions. None waits by sleeping. Where
//! a case must wait for something to happen elsewhere ("the waiter has queued")
//! it awaits the event through [`Client::wait_for_stats`]; every wait is bounded
//! by [`BOUND`] so that a broken backend fails instead of hanging.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;

mod lock_modes;
pub use lock_modes::*;

use crate::{Client, Error, FencingToken, LeaderSelector, Mutex, MutexGuard, Session, SessionOptions, Term, Write};

/// The longest any single step of a case may take before the case fails.
pub const BOUND: Duration = Duration::from_secs(20);

/// Opens clients of one backend and can end a session from outside.
#[async_trait]
pub trait Fixture: Send + Sync + 'static {
    /// A new client on the cluster under test, as another process would open.
    async fn client(&self) -> Client;

    /// Session options for the cases. No case waits for a TTL to run out
    /// (expiry is forced with [`expire`](Self::expire)), so the TTL only
    /// sets how long a session may go unconfirmed before its client declares
    /// it lost: long enough that a server slowed by the cases running in
    /// parallel on a small machine does not lose sessions the case relies on.
    fn options(&self) -> SessionOptions {
        SessionOptions::new().with_ttl(Duration::from_secs(6))
    }

    /// Ends `session` on the server from outside, as an expiry would (etcd:
    /// revoke its lease from another client; ZooKeeper: close it from a second
    /// connection; memory: [`MemoryBackend::expire`](crate::MemoryBackend::expire)).
    async fn expire(&self, session: &Session);

    /// Resolves once the server holds `session`'s watch on the entry `key`,
    /// for a case that must not end that entry before its waiter's watch is
    /// set: the waiter counts as waiting just before it sends the request
    /// that sets the watch. A backend that cannot tell how an entry went
    /// that was already gone when the watch was asked for (ZooKeeper keeps
    /// no trace) takes that departure for a release; [`expire`](Self::expire)
    /// may also hold the waiter's request back until after the expiry. The
    /// default returns at once (etcd replays a deletion from its history).
    async fn watch_set(&self, session: &Session, key: &str) {
        let _ = (session, key);
    }
}

/// Bounds a step of a case; a step that takes longer than [`BOUND`] fails the case.
pub async fn bounded<T>(what: &str, step: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, step).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: did not happen within {BOUND:?}"),
    }
}

/// Waits until `condition` holds, probing every 5 ms, for at most [`BOUND`]:
/// for state that has no event to await (a test proxy's byte counters,
/// another process's files).
pub async fn until(what: &str, condition: impl Fn() -> bool) {
    bounded(what, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

async fn session<F: Fixture>(fixture: &F, client: &Client) -> Session {
    bounded("open a session", client.session_with(fixture.options()))
        .await
        .expect("open a session")
}

async fn lock(mutex: &Mutex) -> MutexGuard {
    bounded("lock", mutex.lock()).await.expect("lock")
}

async fn keys(mutex: &Mutex) -> Vec<String> {
    bounded("list contenders", mutex.contenders())
        .await
        .expect("list contenders")
        .into_iter()
        .map(|e| e.key)
        .collect()
}

fn unique(name: &str) -> String {
    format!("conformance/{name}-{}", uuid::Uuid::new_v4().simple())
}

/// Spawns `acquire` (a `lock()`, `read()`, `campaign()`, ... on a session of
/// `client`) on its own task and returns once it is queued and waiting on its
/// predecessor, as `client`'s `waits` counter tells.
pub async fn spawn_queued<T, F>(client: &Client, acquire: F) -> tokio::task::JoinHandle<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let before = client.stats().waits;
    let task = tokio::spawn(acquire);
    bounded("the waiter queues", client.wait_for_stats(|s| s.waits > before)).await;
    task
}

async fn queue_waiter(client: &Client, mutex: Mutex) -> tokio::task::JoinHandle<crate::Result<MutexGuard>> {
    spawn_queued(client, async move { mutex.lock().await }).await
}

/// Takes the lock `name` on `session`, cuts the session off from the server
/// with `cut`, checks that it turns `Suspended` with the lock still held, then
/// reconnects it with `restore` and checks that it is `Live` again with the
/// lock still held. Returns the guard.
pub async fn suspend_and_revive(
    session: &Session,
    name: &str,
    cut: impl FnOnce(),
    restore: impl FnOnce(),
) -> MutexGuard {
    use crate::SessionState;
    let guard = lock(&session.mutex(name).expect("mutex")).await;
    let mut state = session.watch_state();
    cut();
    bounded("suspended", state.wait_for(|s| *s == SessionState::Suspended))
        .await
        .expect("state");
    assert!(guard.is_held(), "a suspended session's lock is not yet lost");
    restore();
    bounded("live again", state.wait_for(|s| *s == SessionState::Live))
        .await
        .expect("state");
    assert!(guard.is_held());
    guard
}

/// Runs `rounds` lock/release cycles on each mutex (one task each) while the
/// caller breaks the cluster, asserting that no two tasks ever hold at once.
/// Releases that fail in transit are tolerated (their removal goes on in the
/// background and the next contender waits for it).
#[derive(Debug)]
pub struct ExclusionWorkload {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    granted: tokio::sync::watch::Receiver<usize>,
}

impl ExclusionWorkload {
    /// Starts the tasks.
    pub fn start(mutexes: Vec<Mutex>, rounds: usize) -> Self {
        let inside = Arc::new(AtomicUsize::new(0));
        let (granted_tx, granted) = tokio::sync::watch::channel(0usize);
        let granted_tx = Arc::new(granted_tx);
        let tasks = mutexes
            .into_iter()
            .map(|mutex| {
                let (inside, granted_tx) = (Arc::clone(&inside), Arc::clone(&granted_tx));
                tokio::spawn(async move {
                    for _ in 0..rounds {
                        let guard = mutex.lock().await.expect("lock survives the fault");
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                        granted_tx.send_modify(|n| *n += 1);
                        // Hold across a little time so the fault hits held locks.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        match guard.release().await {
                            Ok(()) => {}
                            Err(error) if error.is_transient() => {}
                            Err(error) => panic!("release: {error}"),
                        }
                    }
                    mutex.session().close().await.ok();
                })
            })
            .collect();
        ExclusionWorkload { tasks, granted }
    }

    /// Waits until `grants` locks have been granted in all.
    pub async fn granted(&mut self, grants: usize) {
        bounded("grants", self.granted.wait_for(|&n| n >= grants))
            .await
            .expect("the workload is running");
    }

    /// Waits for every task and returns the number of grants.
    pub async fn finish(self) -> usize {
        for task in self.tasks {
            bounded("a worker finishes", task).await.expect("worker");
        }
        *self.granted.borrow()
    }
}

/// Polls a future once.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    let waker = futures_noop_waker();
    let mut cx = Context::from_waker(&waker);
    Pin::new(future).poll(&mut cx)
}

fn futures_noop_waker() -> std::task::Waker {
    std::task::Waker::noop().clone()
}

/// Many tasks on several sessions (and several tasks per session) take one lock
/// over many rounds; never are two inside at once.
pub async fn mutual_exclusion<F: Fixture>(fixture: &F) {
    let name = unique("exclusion");
    let inside = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = fixture.client().await;
        let session = session(fixture, &client).await;
        for _ in 0..2 {
            let mutex = session.mutex(&name).expect("mutex");
            let (inside, entered) = (Arc::clone(&inside), Arc::clone(&entered));
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = lock(&mutex).await;
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                    entered.fetch_add(1, Ordering::SeqCst);
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        bounded("a contender finishes", task).await.expect("contender task");
    }
    assert_eq!(entered.load(Ordering::SeqCst), 60);
}

/// Contenders of different sessions are granted in the order they queued, with
/// strictly increasing fencing tokens.
pub async fn fifo_order_and_increasing_tokens<F: Fixture>(fixture: &F) {
    let name = unique("fifo");
    let client = fixture.client().await;
    let holder_session = session(fixture, &client).await;
    let holder = lock(&holder_session.mutex(&name).expect("mutex")).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let session = session(fixture, &client).await;
        let mutex = session.mutex(&name).expect("mutex");
        let order = Arc::clone(&order);
        tasks.push(
            spawn_queued(&client, async move {
                let guard = lock(&mutex).await;
                order.lock().expect("order").push((i, guard.token()));
                guard.release().await.expect("release");
                drop(session);
            })
            .await,
        );
    }
    let first_token = holder.token();
    holder.release().await.expect("release");
    for task in tasks {
        bounded("a waiter finishes", task).await.expect("waiter task");
    }
    let order = order.lock().expect("order").clone();
    let ids: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4, 5], "grants out of queue order");
    let mut previous = first_token;
    for (_, token) in order {
        assert!(token > previous, "token {token} not above {previous}");
        previous = token;
    }
}

/// With 32 waiters queued, every release wakes exactly one of them: 32 wakeups
/// for 33 releases, however long the queue.
pub async fn one_wakeup_per_release<F: Fixture>(fixture: &F) {
    const WAITERS: usize = 32;
    let name = unique("herd");
    let client = fixture.client().await;
    let holder_session = session(fixture, &client).await;
    let holder = lock(&holder_session.mutex(&name).expect("mutex")).await;
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let session = session(fixture, &client).await;
        let mutex = session.mutex(&name).expect("mutex");
        tasks.push(
            spawn_queued(&client, async move {
                let guard = lock(&mutex).await;
                guard.release().await.expect("release");
                drop(session);
            })
            .await,
        );
    }
    let before = client.stats();
    assert_eq!(before.wakeups, 0, "a waiter was woken before any release");
    holder.release().await.expect("release");
    for task in tasks {
        bounded("a waiter finishes", task).await.expect("waiter task");
    }
    let after = client.stats();
    let releases = after.releases - before.releases;
    let wakeups = after.wakeups - before.wakeups;
    assert_eq!(releases, WAITERS as u64 + 1);
    assert_eq!(wakeups, WAITERS as u64, "{wakeups} wakeups for {releases} releases");
}

/// `try_lock` on a taken lock returns `None` and leaves no entry; on a free lock
/// it takes it.
pub async fn try_lock_leaves_no_entry<F: Fixture>(fixture: &F) {
    let name = unique("try");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let other = sb.mutex(&name).expect("mutex");
    assert!(bounded("try_lock", other.try_lock()).await.expect("try_lock").is_none());
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "try_lock left an entry"
    );
    // Same session, taken by a sibling: also None, nothing written.
    assert!(bounded("try_lock", sa.mutex(&name).expect("mutex").try_lock())
        .await
        .expect("try_lock")
        .is_none());
    holder.release().await.expect("release");
    let guard = bounded("try_lock", other.try_lock()).await.expect("try_lock");
    let guard = guard.expect("a free lock is taken by try_lock");
    assert!(guard.is_held());
    guard.release().await.expect("release");
    assert!(keys(&other).await.is_empty());
}

/// `lock_timeout` on a taken lock fails with `Timeout` and leaves no entry; on a
/// free one it takes the lock.
pub async fn lock_timeout_leaves_no_entry<F: Fixture>(fixture: &F) {
    let name = unique("timeout");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let other = sb.mutex(&name).expect("mutex");
    let waited = Duration::from_millis(200);
    match bounded("lock_timeout", other.lock_timeout(waited)).await {
        Err(Error::Timeout { waited: reported, .. }) => assert_eq!(reported, waited),
        other => panic!("expected a timeout, got {other:?}"),
    }
    sb.flush().await;
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "lock_timeout left an entry"
    );
    holder.release().await.expect("release");
    let guard = bounded("lock_timeout", other.lock_timeout(waited))
        .await
        .expect("a free lock is taken within the timeout");
    guard.release().await.expect("release");
}

/// `lock_timeout(Duration::ZERO)` is one try, on every backend: a free lock is
/// granted, a lock taken by another session times out at once leaving no
/// entry, and a nested acquire of the same session times out saying so
/// (locks are not re-entrant), with any timeout.
pub async fn lock_timeout_zero_is_one_try<F: Fixture>(fixture: &F) {
    let name = unique("timeout-zero");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let mutex = sa.mutex(&name).expect("mutex");
    let holder = bounded("lock_timeout(0)", mutex.lock_timeout(Duration::ZERO))
        .await
        .expect("a free lock is granted by lock_timeout(0)");
    let other = sb.mutex(&name).expect("mutex");
    match bounded("lock_timeout(0)", other.lock_timeout(Duration::ZERO)).await {
        Err(Error::Timeout {
            waited,
            held_by_this_session,
            ..
        }) => {
            assert_eq!(waited, Duration::ZERO);
            assert!(!held_by_this_session, "another session holds it");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    sb.flush().await;
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "lock_timeout(0) left an entry"
    );
    for timeout in [Duration::ZERO, Duration::from_millis(100)] {
        match bounded("nested lock_timeout", mutex.lock_timeout(timeout)).await {
            Err(
                error @ Error::Timeout {
                    held_by_this_session: true,
                    ..
                },
            ) => {
                assert!(error.to_string().contains("held by this session"), "{error}");
            }
            other => panic!("a nested acquire must time out as held by this session, got {other:?}"),
        }
    }
    assert!(holder.is_held());
    holder.release().await.expect("release");
    sa.flush().await;
    assert!(keys(&other).await.is_empty());
}

/// `Session::queue` lists a name's contenders in queue order, holder first,
/// each with its kind and the token it holds (or will hold) with.
pub async fn queue_lists_holder_then_waiters<F: Fixture>(fixture: &F) {
    let name = unique("queue");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    assert!(bounded("queue", sa.queue(&name)).await.expect("queue").is_empty());
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    let queue = bounded("queue", sb.queue(&name)).await.expect("queue");
    assert_eq!(queue.len(), 2, "{queue:?}");
    assert_eq!(queue[0].key, holder.key());
    assert_eq!(queue[0].token, holder.token());
    assert!(queue[1].token > queue[0].token, "{queue:?}");
    assert!(queue.iter().all(|c| c.kind == crate::EntryKind::Mutex), "{queue:?}");
    if let Some(owner) = &queue[0].owner {
        assert_eq!(owner, sa.id());
    }
    holder.release().await.expect("release");
    let next = bounded("the waiter is granted", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert_eq!(queue[1].token, next.token());
    assert_eq!(queue[1].key, next.key());
    next.release().await.expect("release");
    match bounded("queue", sa.queue("")).await {
        Err(Error::InvalidName { .. }) => {}
        other => panic!("an empty name must be refused, got {other:?}"),
    }
}

/// A `lock()` future dropped while queued, or dropped right after it sent its
/// append, leaves no entry once the session's background cleanup has run, and
/// does not block later contenders.
pub async fn cancelled_lock_leaves_no_entry<F: Fixture>(fixture: &F) {
    let name = unique("cancel");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let other = sb.mutex(&name).expect("mutex");

    // Queued, then cancelled.
    let waiter = queue_waiter(&b, other.clone()).await;
    assert_eq!(keys(&other).await.len(), 2);
    waiter.abort();
    assert!(bounded("the aborted waiter ends", waiter).await.is_err());
    bounded("cleanup", sb.flush()).await;
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "a cancelled lock left an entry"
    );

    // Cancelled with its append in flight.
    for _ in 0..5 {
        let mut attempt = Box::pin(other.lock());
        assert!(poll_once(&mut attempt).is_pending());
        drop(attempt);
        bounded("cleanup", sb.flush()).await;
    }
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "an interrupted append left an entry"
    );

    // The queue is not blocked by a ghost: a new contender gets the lock next.
    let third = sb.mutex(&name).expect("mutex");
    let next = queue_waiter(&b, third).await;
    holder.release().await.expect("release");
    let guard = bounded("the next contender", next).await.expect("task").expect("lock");
    guard.release().await.expect("release");
    assert!(b.stats().cleanups >= 1, "no cleanup counted");
}

/// A released guard's entry is fenced: a stale guard whose entry was deleted by
/// someone else cannot delete the newer holder's entry, and learns of its loss.
pub async fn fenced_release_spares_newer_holder<F: Fixture>(fixture: &F) {
    let name = unique("fence");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let stale = lock(&sa.mutex(&name).expect("mutex")).await;
    // Someone else deletes the holder's entry.
    let removed = bounded("remove", sb.backend_session().remove(stale.entry()))
        .await
        .expect("remove");
    assert!(removed);
    bounded("the stale holder learns of the loss", stale.lost()).await;
    assert!(!stale.is_held());
    // The same session takes the lock again: on etcd, the same key.
    let newer = lock(&sa.mutex(&name).expect("mutex")).await;
    assert!(newer.token() > stale.token());
    match bounded("stale release", stale.release()).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("a stale release must report the loss, got {other:?}"),
    }
    assert!(newer.is_held());
    assert_eq!(
        keys(&sb.mutex(&name).expect("mutex")).await,
        vec![newer.key().to_owned()]
    );
    // And a contender of another session still waits for the newer holder.
    assert!(bounded("try_lock", sb.mutex(&name).expect("mutex").try_lock())
        .await
        .expect("try_lock")
        .is_none());
    newer.release().await.expect("release");
}

/// The primitive itself: removing an old entry never removes a newer entry of
/// the same session under the same name.
pub async fn fenced_remove_primitive<F: Fixture>(fixture: &F) {
    let name = unique("fence-primitive");
    let client = fixture.client().await;
    let s = session(fixture, &client).await;
    let first = lock(&s.mutex(&name).expect("mutex")).await;
    let old = first.entry().clone();
    first.release().await.expect("release");
    let second = lock(&s.mutex(&name).expect("mutex")).await;
    assert!(!bounded("remove", s.backend_session().remove(&old))
        .await
        .expect("remove"));
    assert!(second.is_held());
    assert_eq!(
        keys(&s.mutex(&name).expect("mutex")).await,
        vec![second.key().to_owned()]
    );
    second.release().await.expect("release");
}

/// A lost session resolves its holders' `lost()`, makes `release()` report it,
/// and fails its queued `lock()` calls at once; the next session gets the lock.
pub async fn session_loss<F: Fixture>(fixture: &F) {
    let name = unique("loss");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    fixture.expire(&sa).await;
    bounded("the holder learns of the loss", holder.lost()).await;
    assert!(!holder.is_held());
    bounded("the session reports the loss", sa.lost()).await;
    match holder.release().await {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("release after loss must report it, got {other:?}"),
    }
    let next = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(next.is_held());
    assert!(matches!(sa.mutex(&name).expect_err("over"), Error::SessionLost { .. }));

    // A queued contender whose own session is lost fails at once.
    let c = fixture.client().await;
    let sc = session(fixture, &c).await;
    let queued = queue_waiter(&c, sc.mutex(&name).expect("mutex")).await;
    fixture.expire(&sc).await;
    match bounded("the queued lock fails", queued).await.expect("task") {
        Err(Error::SessionLost { .. }) => {}
        other => {
            panic!("a queued lock on a lost session must fail with SessionLost, got {other:?}")
        }
    }
    assert!(
        next.is_held(),
        "the holder was disturbed by another session's loss (its session: {:?})",
        sb.state()
    );
    next.release().await.expect("release");
}

/// Checks a sequencer through a client with no session of its own, after
/// a round trip through its text form.
async fn current(checker: &Client, sequencer: &crate::Sequencer) -> bool {
    let text = sequencer.to_string();
    let parsed: crate::Sequencer = text.parse().expect("a sequencer's text parses");
    assert_eq!(&parsed, sequencer, "{text} does not round-trip");
    bounded("check a sequencer", checker.check(&parsed))
        .await
        .expect("check")
}

/// A sequencer is current while its holder holds, and not after a release,
/// after the holder's session is lost, or once a later holder holds: for a
/// mutex, the sides of a read/write lock, semaphore permits and a
/// leadership, checked by a client with no session of its own.
pub async fn sequencers_are_current_only_while_held<F: Fixture>(fixture: &F) {
    let checker = fixture.client().await;
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);

    // A mutex: current while held; not after release; the next holder's is.
    let name = unique("sequencer");
    let first = lock(&sa.mutex(&name).expect("mutex")).await;
    let old = first.sequencer();
    assert_eq!(old.name(), name);
    assert_eq!(old.mode(), crate::Mode::Mutex);
    assert_eq!(old.token(), first.token());
    assert!(current(&checker, &old).await, "a held mutex's sequencer is current");
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    assert!(current(&checker, &old).await, "a waiter does not make the holder stale");
    first.release().await.expect("release");
    let next = bounded("the waiter", waiter).await.expect("task").expect("lock");
    assert!(!current(&checker, &old).await, "a released holder's sequencer is stale");
    assert!(current(&checker, &next.sequencer()).await);
    let forged = crate::Sequencer::new(&name, crate::Mode::Read, next.token());
    assert!(!current(&checker, &forged).await, "another mode is not the holder's");
    next.release().await.expect("release");

    // Read/write: readers together, a writer behind them not yet.
    let rw = unique("sequencer-rw");
    let r1 = bounded("read", sa.rwlock(&rw).expect("rwlock").read())
        .await
        .expect("read");
    let r2 = bounded("read", sb.rwlock(&rw).expect("rwlock").read())
        .await
        .expect("read");
    assert_eq!(r1.sequencer().mode(), crate::Mode::Read);
    assert!(current(&checker, &r1.sequencer()).await && current(&checker, &r2.sequencer()).await);
    let writer = {
        let lock = sa.rwlock(&rw).expect("rwlock");
        spawn_queued(&a, async move { lock.write().await }).await
    };
    let (s1, s2) = (r1.sequencer(), r2.sequencer());
    r1.release().await.expect("release");
    assert!(!current(&checker, &s1).await);
    assert!(current(&checker, &s2).await, "a reader still reading stays current");
    r2.release().await.expect("release");
    let w = bounded("the writer", writer).await.expect("task").expect("write");
    assert_eq!(w.sequencer().mode(), crate::Mode::Write);
    assert!(current(&checker, &w.sequencer()).await && !current(&checker, &s2).await);
    w.release().await.expect("release");

    // A semaphore of 2: two permits current, a third waits, then holds.
    let sem = unique("sequencer-sem");
    let p1 = bounded("acquire", sa.semaphore(&sem, 2).expect("semaphore").acquire())
        .await
        .expect("acquire");
    let p2 = bounded("acquire", sb.semaphore(&sem, 2).expect("semaphore").acquire())
        .await
        .expect("acquire");
    assert_eq!(p1.sequencer().mode(), crate::Mode::Permit { permits: 2 });
    assert!(current(&checker, &p1.sequencer()).await && current(&checker, &p2.sequencer()).await);
    let third = {
        let semaphore = sa.semaphore(&sem, 2).expect("semaphore");
        spawn_queued(&a, async move { semaphore.acquire().await }).await
    };
    let s1 = p1.sequencer();
    p1.release().await.expect("release");
    let p3 = bounded("the third permit", third)
        .await
        .expect("task")
        .expect("acquire");
    assert!(!current(&checker, &s1).await);
    assert!(current(&checker, &p2.sequencer()).await && current(&checker, &p3.sequencer()).await);
    p2.release().await.expect("release");
    p3.release().await.expect("release");

    // A leadership, then the leader's session lost.
    let election = unique("sequencer-election");
    let leader = bounded("campaign", sa.election(&election).expect("election").campaign(b"a"))
        .await
        .expect("campaign");
    let sequencer = leader.sequencer();
    assert_eq!(sequencer.mode(), crate::Mode::Leadership);
    assert!(current(&checker, &sequencer).await);
    let held = lock(&sa.mutex(&name).expect("mutex")).await;
    let held_sequencer = held.sequencer();
    fixture.expire(&sa).await;
    bounded("the leader learns of the loss", leader.lost()).await;
    bounded("the holder learns of the loss", held.lost()).await;
    assert!(
        !current(&checker, &sequencer).await,
        "a lost leader's sequencer is stale"
    );
    assert!(
        !current(&checker, &held_sequencer).await,
        "a lost holder's sequencer is stale"
    );
}

/// Multi-locks: two sessions taking overlapping names in opposite orders,
/// over many rounds, both finish and never hold at once; a timeout, a
/// `try_lock` that finds one taken and a cancelled acquire leave nothing
/// held and no entry behind; a multi-guard's `lost()` fires when any part
/// is lost.
pub async fn multi_locks_are_all_or_nothing_and_never_deadlock<F: Fixture>(fixture: &F) {
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let (x, y, z) = (unique("multi-x"), unique("multi-y"), unique("multi-z"));
    let inside = Arc::new(AtomicUsize::new(0));
    let rounds = |s: Session, names: Vec<String>, inside: Arc<AtomicUsize>| async move {
        let multi = s.multi_lock(&names).expect("multi_lock");
        for _ in 0..15 {
            let guard = multi.lock().await.expect("lock all");
            assert!(guard.is_held());
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two multi-locks held at once");
            tokio::task::yield_now().await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.expect("release all");
        }
    };
    let one = tokio::spawn(rounds(
        sa.clone(),
        vec![x.clone(), y.clone(), z.clone()],
        Arc::clone(&inside),
    ));
    let other = tokio::spawn(rounds(
        sb.clone(),
        vec![z.clone(), y.clone(), x.clone()],
        Arc::clone(&inside),
    ));
    bounded("both multi-locks finish", async {
        one.await.expect("task");
        other.await.expect("task");
    })
    .await;

    // A timeout lets go of what it had taken, and leaves no entry behind.
    let held = lock(&sb.mutex(&y).expect("mutex")).await;
    let both = sa.multi_lock([&y, &x]).expect("multi_lock");
    assert_eq!(both.names().collect::<Vec<_>>(), [x.as_str(), y.as_str()]);
    match bounded("a multi-lock times out", both.lock_timeout(Duration::from_millis(300))).await {
        Err(Error::Timeout { name, waited, .. }) => {
            assert_eq!(name, y);
            assert_eq!(waited, Duration::from_millis(300));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    bounded("cleanup", sa.flush()).await;
    assert!(
        keys(&sa.mutex(&x).expect("mutex")).await.is_empty(),
        "the part taken is let go"
    );
    assert_eq!(keys(&sa.mutex(&y).expect("mutex")).await, vec![held.key().to_owned()]);
    // A try finds it taken: nothing held, nothing queued.
    assert!(bounded("try", both.try_lock()).await.expect("try_lock").is_none());
    bounded("cleanup", sa.flush()).await;
    assert!(keys(&sa.mutex(&x).expect("mutex")).await.is_empty());
    // A cancelled acquire, while it waits for the second: the same.
    let waiting = {
        let both = both.clone();
        spawn_queued(&a, async move { both.lock().await }).await
    };
    waiting.abort();
    assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
    bounded("cleanup", sa.flush()).await;
    assert!(keys(&sa.mutex(&x).expect("mutex")).await.is_empty());
    assert_eq!(keys(&sa.mutex(&y).expect("mutex")).await, vec![held.key().to_owned()]);
    held.release().await.expect("release");

    // Held together: tokens and sequencers of each; lost when any part is.
    let guard = bounded("lock all", both.lock()).await.expect("lock all");
    let tokens = guard.tokens();
    assert_eq!(tokens.len(), 2);
    assert_eq!(tokens[0].0, x);
    assert_eq!(guard.sequencers()[1].name(), y);
    let part = guard.guards()[1].entry().clone();
    assert!(bounded("remove", sb.backend_session().remove(&part))
        .await
        .expect("remove"));
    bounded("the multi-guard learns of the loss", guard.lost()).await;
    assert!(!guard.is_held());
    assert!(matches!(
        sa.multi_lock(Vec::<String>::new()),
        Err(Error::InvalidOptions { .. })
    ));
    assert!(matches!(sa.multi_lock([&x, &x]), Err(Error::InvalidOptions { .. })));
    drop(guard);
}

/// Lock-delay: a contender next in line after a holder whose session was
/// lost (the fixture's expiry) is granted no sooner than its lock-delay
/// after the loss, and shows as delayed in the queue meanwhile; after a
/// clean `release()` or `close()` it is granted at once, with no
/// lock-delay begun. A lock-delay over a minute is refused.
pub async fn lock_delay_holds_back_after_an_involuntary_loss_only<F: Fixture>(fixture: &F) {
    let delay = Duration::from_millis(1500);
    let delayed = fixture.options().with_lock_delay(delay);
    let (a, b) = (fixture.client().await, fixture.client().await);
    let waiting_session = bounded("open a session", b.session_with(delayed.clone()))
        .await
        .expect("session");

    // An involuntary loss: held back for the lock-delay, marked meanwhile.
    let name = unique("lock-delay");
    let lost_session = session(fixture, &a).await;
    let holder = lock(&lost_session.mutex(&name).expect("mutex")).await;
    let waiter = {
        let mutex = waiting_session.mutex(&name).expect("mutex");
        spawn_queued(&b, async move {
            let guard = mutex.lock().await;
            (tokio::time::Instant::now(), guard)
        })
        .await
    };
    fixture.watch_set(&waiting_session, holder.key()).await;
    let lost_at = tokio::time::Instant::now();
    fixture.expire(&lost_session).await;
    bounded("the lock-delay begins", b.wait_for_stats(|s| s.lock_delays >= 1)).await;
    let queue = bounded("contenders", waiting_session.queue(&name))
        .await
        .expect("queue");
    let first = queue.first().expect("the waiter is in the queue");
    assert!(
        first.delayed_until.is_some() || waiter.is_finished(),
        "a contender in lock-delay shows it: {queue:?}"
    );
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        granted_at - lost_at >= delay,
        "granted {:?} after the holder's loss, within the lock-delay of {delay:?}",
        granted_at - lost_at
    );
    assert!(guard.token() > holder.token());
    let queue = bounded("contenders", waiting_session.queue(&name))
        .await
        .expect("queue");
    assert!(
        queue.iter().all(|c| c.delayed_until.is_none()),
        "the mark is cleared: {queue:?}"
    );
    guard.release().await.expect("release");

    // A clean release, then a clean close: handed on at once.
    let before = b.stats().lock_delays;
    for close in [false, true] {
        let name = unique("lock-delay-clean");
        let releasing = session(fixture, &a).await;
        let holder = lock(&releasing.mutex(&name).expect("mutex")).await;
        let waiter = {
            let mutex = waiting_session.mutex(&name).expect("mutex");
            spawn_queued(&b, async move { mutex.lock().await }).await
        };
        let released_at = tokio::time::Instant::now();
        if close {
            bounded("close", releasing.close()).await.expect("close");
            drop(holder);
        } else {
            holder.release().await.expect("release");
        }
        let guard = bounded("the waiter is granted", waiter)
            .await
            .expect("task")
            .expect("lock");
        assert!(
            released_at.elapsed() < delay,
            "a clean {} was held back: granted {:?} after it",
            if close { "close" } else { "release" },
            released_at.elapsed()
        );
        guard.release().await.expect("release");
    }
    assert_eq!(
        b.stats().lock_delays,
        before,
        "a lock-delay began after a clean hand-over"
    );
    let too_long = fixture.options().with_lock_delay(Duration::from_secs(61));
    match b.session_with(too_long).await {
        Err(Error::InvalidOptions { reason }) => assert!(reason.contains("lock-delay"), "{reason}"),
        other => panic!("a lock-delay over a minute must be refused, got {other:?}"),
    }
}

/// Several tasks of one session contend for one name: they exclude each other
/// and all finish.
pub async fn same_session_contention<F: Fixture>(fixture: &F) {
    let name = unique("same-session");
    let client = fixture.client().await;
    let s = session(fixture, &client).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mutex = s.mutex(&name).expect("mutex");
        let inside = Arc::clone(&inside);
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = lock(&mutex).await;
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        bounded("a task finishes", task).await.expect("task");
    }
    assert!(keys(&s.mutex(&name).expect("mutex")).await.is_empty());
}

/// A guard dropped without `release` releases in the background: the next
/// contender gets the lock.
pub async fn dropped_guard_releases<F: Fixture>(fixture: &F) {
    let name = unique("drop");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    drop(holder);
    let next = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    bounded("background release", sa.flush()).await;
    assert_eq!(a.stats().releases, 1);
    next.release().await.expect("release");
}

/// Names a backend cannot store and absurd options get typed errors.
pub async fn invalid_input_is_rejected<F: Fixture>(fixture: &F) {
    let client = fixture.client().await;
    let s = session(fixture, &client).await;
    // A trailing '/' ("a/") is etcd-only: each backend's tests check it.
    for name in ["", "/", "a//b", "a//", "a/../b", "nul\0byte", "bell\u{7}"] {
        match s.mutex(name) {
            Err(Error::InvalidName { .. }) => {}
            other => panic!("name {name:?} must be refused, got {other:?}"),
        }
    }
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_secs(2 * 24 * 3600),
    ] {
        match client.session_with(SessionOptions::new().with_ttl(ttl)).await {
            Err(Error::InvalidOptions { .. }) => {}
            other => panic!("ttl {ttl:?} must be refused, got {other:?}"),
        }
    }
    let margin_too_big = SessionOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_safety_margin(Duration::from_secs(3));
    assert!(matches!(
        client.session_with(margin_too_big).await,
        Err(Error::InvalidOptions { .. })
    ));
}

/// After `close()` everything the session held is released, holders learn it,
/// and every further use fails with `Closed`.
pub async fn closed_session_rejects_use<F: Fixture>(fixture: &F) {
    let name = unique("closed");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let mutex = sa.mutex(&name).expect("mutex");
    let held = lock(&mutex).await;
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    bounded("close", sa.close()).await.expect("close");
    bounded("the holder learns", held.lost()).await;
    assert!(!held.is_held());
    let next = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(matches!(held.release().await, Err(Error::Closed { .. })));
    assert!(matches!(mutex.lock().await, Err(Error::Closed { .. })));
    assert!(matches!(mutex.try_lock().await, Err(Error::Closed { .. })));
    assert!(matches!(sa.mutex(&name), Err(Error::Closed { .. })));
    assert!(bounded("close again", sa.close()).await.is_ok());
    next.release().await.expect("release");
}

/// Readers share a read/write lock; a writer excludes readers and writers.
pub async fn readers_share_writers_exclude<F: Fixture>(fixture: &F) {
    let name = unique("rw-share");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let r1 = bounded("read", sa.rwlock(&name).expect("rwlock").read())
        .await
        .expect("read");
    let r2 = bounded("read", sb.rwlock(&name).expect("rwlock").read())
        .await
        .expect("read");
    assert!(r1.is_held() && r2.is_held());
    let readers_token = r1.token().max(r2.token());
    let rw = sb.rwlock(&name).expect("rwlock");
    assert!(bounded("try_write", rw.try_write()).await.expect("try_write").is_none());
    r1.release().await.expect("release");
    r2.release().await.expect("release");
    let w = bounded("write", rw.write()).await.expect("write");
    assert!(bounded("try_read", sa.rwlock(&name).expect("rwlock").try_read())
        .await
        .expect("try_read")
        .is_none());
    assert!(bounded("try_write", sa.rwlock(&name).expect("rwlock").try_write())
        .await
        .expect("try_write")
        .is_none());
    assert!(
        w.token() > readers_token,
        "the writer's token is not above the readers'"
    );
    w.release().await.expect("release");
    assert!(bounded("list", rw.contenders()).await.expect("list").is_empty());
}

/// A waiting writer is not starved: a reader arriving after it waits behind it.
pub async fn waiting_writer_is_not_starved<F: Fixture>(fixture: &F) {
    let name = unique("rw-fifo");
    let client = fixture.client().await;
    let (s1, s2, s3) = (
        session(fixture, &client).await,
        session(fixture, &client).await,
        session(fixture, &client).await,
    );
    let first_reader = bounded("read", s1.rwlock(&name).expect("rwlock").read())
        .await
        .expect("read");
    let writer_lock = s2.rwlock(&name).expect("rwlock");
    let writer = spawn_queued(&client, async move { writer_lock.write().await }).await;
    let late_lock = s3.rwlock(&name).expect("rwlock");
    assert!(
        bounded("try_read", late_lock.try_read())
            .await
            .expect("try_read")
            .is_none(),
        "a late reader overtook a waiting writer"
    );
    let late_reader = spawn_queued(&client, async move { late_lock.read().await }).await;
    first_reader.release().await.expect("release");
    let write = bounded("the writer", writer).await.expect("task").expect("write");
    assert!(!late_reader.is_finished(), "a reader holds beside a writer");
    write.release().await.expect("release");
    let read = bounded("the late reader", late_reader)
        .await
        .expect("task")
        .expect("read");
    read.release().await.expect("release");
}

/// Readers and writers over many rounds: a writer is always alone.
pub async fn rwlock_exclusion_under_load<F: Fixture>(fixture: &F) {
    let name = unique("rw-load");
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let client = fixture.client().await;
        let s = session(fixture, &client).await;
        let rw = s.rwlock(&name).expect("rwlock");
        let (readers, writers) = (Arc::clone(&readers), Arc::clone(&writers));
        tasks.push(tokio::spawn(async move {
            for _ in 0..6 {
                if i % 3 == 0 {
                    let guard = bounded("write", rw.write()).await.expect("write");
                    assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "a reader beside a writer");
                    tokio::task::yield_now().await;
                    writers.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                } else {
                    let guard = bounded("read", rw.read()).await.expect("read");
                    readers.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(writers.load(Ordering::SeqCst), 0, "a reader beside a writer");
                    tokio::task::yield_now().await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }
            drop(s);
        }));
    }
    for task in tasks {
        bounded("a contender finishes", task).await.expect("task");
    }
}

/// A semaphore never has more than its permits' worth of holders.
pub async fn semaphore_bound_is_never_exceeded<F: Fixture>(fixture: &F) {
    const PERMITS: usize = 3;
    let name = unique("sem-load");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let client = fixture.client().await;
        let s = session(fixture, &client).await;
        for _ in 0..2 {
            let semaphore = s.semaphore(&name, PERMITS).expect("semaphore");
            let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let permit = bounded("acquire", semaphore.acquire()).await.expect("acquire");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= PERMITS, "{now} holders of {PERMITS} permits");
                    most.fetch_max(now, Ordering::SeqCst);
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        bounded("a contender finishes", task).await.expect("task");
    }
    assert!(most.load(Ordering::SeqCst) <= PERMITS);
}

/// A full semaphore refuses `try_acquire`, queues `acquire`, and a release
/// wakes exactly the one waiter.
pub async fn semaphore_waits_herd_free<F: Fixture>(fixture: &F) {
    let name = unique("sem-wait");
    let client = fixture.client().await;
    let (s1, s2, s3) = (
        session(fixture, &client).await,
        session(fixture, &client).await,
        session(fixture, &client).await,
    );
    assert!(matches!(s1.semaphore(&name, 0), Err(Error::InvalidOptions { .. })));
    let a = bounded("acquire", s1.semaphore(&name, 2).expect("semaphore").acquire())
        .await
        .expect("acquire");
    let b = bounded("acquire", s2.semaphore(&name, 2).expect("semaphore").acquire())
        .await
        .expect("acquire");
    let third = s3.semaphore(&name, 2).expect("semaphore");
    assert!(bounded("try_acquire", third.try_acquire())
        .await
        .expect("try")
        .is_none());
    let waiter = spawn_queued(&client, async move { third.acquire().await }).await;
    let wakeups = client.stats().wakeups;
    a.release().await.expect("release");
    let c = bounded("the waiter", waiter).await.expect("task").expect("acquire");
    assert_eq!(client.stats().wakeups - wakeups, 1);
    assert!(b.is_held() && c.is_held());
    b.release().await.expect("release");
    c.release().await.expect("release");
}

/// Cancelled waits of every recipe leave no entry behind.
pub async fn cancelled_recipes_leave_no_entry<F: Fixture>(fixture: &F) {
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let rw_name = unique("cancel-rw");
    let held = bounded("write", sa.rwlock(&rw_name).expect("rwlock").write())
        .await
        .expect("write");
    let rw = sb.rwlock(&rw_name).expect("rwlock");
    let waiting = spawn_queued(&b, async move { rw.read().await }).await;
    waiting.abort();
    let _ = waiting.await;

    let sem_name = unique("cancel-sem");
    let permit = bounded("acquire", sa.semaphore(&sem_name, 1).expect("semaphore").acquire())
        .await
        .expect("acquire");
    let sem = sb.semaphore(&sem_name, 1).expect("semaphore");
    let waiting = spawn_queued(&b, async move { sem.acquire().await }).await;
    waiting.abort();
    let _ = waiting.await;

    let el_name = unique("cancel-election");
    let leading = bounded("campaign", sa.election(&el_name).expect("election").campaign(b"a"))
        .await
        .expect("campaign");
    let election = sb.election(&el_name).expect("election");
    let waiting = spawn_queued(&b, async move { election.campaign(b"b").await }).await;
    waiting.abort();
    let _ = waiting.await;

    bounded("cleanup", sb.flush()).await;
    let rw = sb.rwlock(&rw_name).expect("rwlock");
    assert_eq!(bounded("list", rw.contenders()).await.expect("list").len(), 1);
    let sem = sb.semaphore(&sem_name, 1).expect("semaphore");
    assert_eq!(bounded("list", sem.contenders()).await.expect("list").len(), 1);
    let leader = bounded("leader", sb.election(&el_name).expect("election").leader())
        .await
        .expect("leader");
    assert_eq!(leader.map(|l| l.value().to_vec()), Some(b"a".to_vec()));
    held.release().await.expect("release");
    permit.release().await.expect("release");
    leading.resign().await.expect("resign");
    assert!(bounded("list", rw.contenders()).await.expect("list").is_empty());
    assert!(bounded("list", sem.contenders()).await.expect("list").is_empty());
}

/// An election: the first candidate leads, observers (candidates or not) see
/// every change in order, a lost session ends its leadership and the next
/// candidate takes over.
pub async fn election_observe_and_session_loss<F: Fixture>(fixture: &F) {
    use futures::StreamExt;
    let name = unique("election");
    let (a, b, o) = (fixture.client().await, fixture.client().await, fixture.client().await);
    let (sa, sb, so) = (
        session(fixture, &a).await,
        session(fixture, &b).await,
        session(fixture, &o).await,
    );
    let mut changes = Box::pin(so.election(&name).expect("election").observe());
    macro_rules! next {
        () => {
            bounded("an observed change", changes.next())
                .await
                .expect("the stream goes on")
                .expect("observe")
        };
    }
    assert_eq!(next!(), None, "nobody leads yet");
    let leading = bounded("campaign", sa.election(&name).expect("election").campaign(b"alpha"))
        .await
        .expect("campaign");
    let seen = next!().expect("a leader");
    assert_eq!((seen.value(), seen.token()), (&b"alpha"[..], leading.token()));

    let candidate = sb.election(&name).expect("election");
    let second = spawn_queued(&b, async move { candidate.campaign(b"beta").await }).await;

    leading.proclaim(b"alpha-2").await.expect("proclaim");
    assert_eq!(next!().expect("a leader").value(), b"alpha-2");

    fixture.expire(&sa).await;
    bounded("the leader learns", leading.lost()).await;
    assert!(!leading.is_held());
    assert!(leading.proclaim(b"stale").await.is_err(), "a lost leader proclaimed");
    let beta = bounded("the second candidate leads", second)
        .await
        .expect("task")
        .expect("campaign");
    // The observer may or may not catch the instant between the two leaders.
    let mut seen = next!();
    if seen.is_none() {
        seen = next!();
    }
    let seen = seen.expect("the new leader");
    assert_eq!(seen.value(), b"beta");
    assert_eq!(seen.token(), beta.token());
    assert!(beta.token() > leading.token());
    let current = bounded("leader", so.election(&name).expect("election").leader())
        .await
        .expect("leader");
    assert_eq!(current.map(|l| l.value().to_vec()), Some(b"beta".to_vec()));
    beta.resign().await.expect("resign");
    assert_eq!(next!(), None);
}

/// A lock name for fenced-write cases, absolute so that the same text is a
/// valid key on every backend, and the base of the keys those cases write.
fn fenced_names(what: &str) -> (String, String) {
    let name = format!("/{}", unique(what));
    let data = format!("{name}-data");
    (name, data)
}

async fn read(session: &Session, key: &str) -> Option<Vec<u8>> {
    bounded("read", session.read(key)).await.expect("read")
}

fn bytes(text: &str) -> Option<Vec<u8>> {
    Some(text.as_bytes().to_vec())
}

/// A holder's fenced writes land, all of them in one call, and every
/// session reads them back; puts overwrite and create, deletes remove (a
/// missing key is no error); an empty batch checks the fence alone.
pub async fn fenced_write_lands_while_held<F: Fixture>(fixture: &F) {
    let (name, data) = fenced_names("fenced");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let (one, two, three) = (
        format!("{data}/one"),
        format!("{data}/two"),
        format!("{data}/deep/three"),
    );
    assert_eq!(read(&sb, &one).await, None);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    bounded(
        "write",
        holder.write_if_held([Write::put(&one, "1"), Write::put(&two, "2"), Write::put(&three, "3")]),
    )
    .await
    .expect("a holder's fenced write lands");
    assert_eq!(read(&sb, &one).await, bytes("1"));
    assert_eq!(read(&sb, &two).await, bytes("2"));
    assert_eq!(read(&sb, &three).await, bytes("3"));
    bounded(
        "write",
        holder.write_if_held([
            Write::put(&one, "1b"),
            Write::delete(&two),
            Write::delete(format!("{data}/never-written")),
        ]),
    )
    .await
    .expect("overwrite and delete");
    assert_eq!(read(&sb, &one).await, bytes("1b"));
    assert_eq!(read(&sb, &two).await, None);
    assert_eq!(read(&sa, &three).await, bytes("3"));
    bounded("write", holder.write_if_held([]))
        .await
        .expect("an empty batch checks the fence");
    holder.release().await.expect("release");
    // Guarded state outlives the lock and the session.
    sa.close().await.expect("close");
    assert_eq!(read(&sb, &one).await, bytes("1b"));
}

/// After its session expired and a newer holder was granted, a stale
/// holder's fenced writes (several in one call) fail with `SessionLost` and
/// change nothing, whether the client knows of the loss yet (the backend
/// primitive, fenced on the server) or not; the newer holder's land.
pub async fn fenced_write_refused_after_session_loss<F: Fixture>(fixture: &F) {
    let (name, data) = fenced_names("fenced-loss");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let (one, two, three) = (format!("{data}/one"), format!("{data}/two"), format!("{data}/three"));
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    bounded(
        "write",
        holder.write_if_held([Write::put(&one, "1"), Write::put(&two, "2")]),
    )
    .await
    .expect("write");
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    fixture.expire(&sa).await;
    let newer = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    let stale_batch = [
        Write::put(&one, "stale"),
        Write::delete(&two),
        Write::put(&three, "stale"),
    ];
    match bounded(
        "a stale write through the backend",
        sa.backend_session().write_if_held(holder.entry(), &stale_batch),
    )
    .await
    {
        Ok(false) | Err(Error::SessionLost { .. }) => {}
        other => panic!("the server must refuse a lost session's fenced write, got {other:?}"),
    }
    bounded("the holder learns of the loss", holder.lost()).await;
    match bounded("a stale write", holder.write_if_held(stale_batch.clone())).await {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("a lost holder's fenced write must fail with SessionLost, got {other:?}"),
    }
    assert_eq!(read(&sb, &one).await, bytes("1"), "a stale write landed");
    assert_eq!(read(&sb, &two).await, bytes("2"), "a stale delete landed");
    assert_eq!(read(&sb, &three).await, None, "a stale create landed");
    bounded(
        "write",
        newer.write_if_held([Write::put(&one, "newer"), Write::delete(&two)]),
    )
    .await
    .expect("the newer holder writes");
    assert_eq!(read(&sb, &one).await, bytes("newer"));
    assert_eq!(read(&sb, &two).await, None);
    newer.release().await.expect("release");
}

/// After its entry was deleted by someone else and the same session took
/// the lock again (on etcd: the same key, a newer create revision), the
/// stale holder's fenced writes fail with `LockLost` and change nothing:
/// the fence is the entry itself, not its key.
pub async fn fenced_write_refused_after_entry_deleted<F: Fixture>(fixture: &F) {
    let (name, data) = fenced_names("fenced-deleted");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let (one, two) = (format!("{data}/one"), format!("{data}/two"));
    let stale = lock(&sa.mutex(&name).expect("mutex")).await;
    bounded("write", stale.write_if_held([Write::put(&one, "1")]))
        .await
        .expect("write");
    let removed = bounded("remove", sb.backend_session().remove(stale.entry()))
        .await
        .expect("remove");
    assert!(removed);
    let batch = [Write::put(&one, "stale"), Write::put(&two, "stale")];
    let refused = bounded(
        "a stale write",
        sa.backend_session().write_if_held(stale.entry(), &batch),
    )
    .await
    .expect("write_if_held");
    assert!(!refused, "the server applied a write fenced on a deleted entry");
    bounded("the stale holder learns of the loss", stale.lost()).await;
    let newer = lock(&sa.mutex(&name).expect("mutex")).await;
    assert!(newer.token() > stale.token());
    let refused = bounded(
        "a stale write",
        sa.backend_session().write_if_held(stale.entry(), &batch),
    )
    .await
    .expect("write_if_held");
    assert!(
        !refused,
        "the server applied a write fenced on an older entry of the same key"
    );
    match bounded("a stale write", stale.write_if_held(batch.clone())).await {
        Err(Error::LockLost { key }) => assert_eq!(key, stale.key()),
        other => panic!("a stale holder's fenced write must fail with LockLost, got {other:?}"),
    }
    assert_eq!(read(&sb, &one).await, bytes("1"), "a stale write landed");
    assert_eq!(read(&sb, &two).await, None, "a stale write landed");
    bounded("write", newer.write_if_held(batch))
        .await
        .expect("the newer holder writes");
    assert_eq!(read(&sb, &two).await, bytes("stale"));
    newer.release().await.expect("release");
}

/// A batch with one bad write (an empty key, a key twice, a key under the
/// lock's own entries) is refused whole with a typed error: nothing of it is
/// written; reads refuse an empty key too.
pub async fn fenced_write_batch_is_all_or_nothing<F: Fixture>(fixture: &F) {
    let (name, data) = fenced_names("fenced-batch");
    let client = fixture.client().await;
    let s = session(fixture, &client).await;
    let (one, two) = (format!("{data}/one"), format!("{data}/two"));
    let holder = lock(&s.mutex(&name).expect("mutex")).await;
    bounded("write", holder.write_if_held([Write::put(&one, "1")]))
        .await
        .expect("write");
    let refused = [
        (
            vec![Write::put(&one, "2"), Write::put(&two, "2"), Write::put("", "x")],
            "an empty key",
        ),
        (
            vec![Write::put(&one, "2"), Write::put(&two, "2"), Write::delete(&one)],
            "a key twice",
        ),
        (
            vec![Write::put(&two, "2"), Write::put(format!("{name}/state"), "x")],
            "a key under the lock's own entries",
        ),
    ];
    for (batch, what) in refused {
        match bounded("a refused batch", holder.write_if_held(batch)).await {
            Err(Error::InvalidName { .. } | Error::InvalidOptions { .. }) => {}
            other => panic!("a batch with {what} must be refused, got {other:?}"),
        }
        assert_eq!(
            read(&s, &one).await,
            bytes("1"),
            "a batch with {what} was partly written"
        );
        assert_eq!(read(&s, &two).await, None, "a batch with {what} was partly written");
    }
    match bounded("read", s.read("")).await {
        Err(Error::InvalidName { .. }) => {}
        other => panic!("an empty key must be refused, got {other:?}"),
    }
    assert!(holder.is_held());
    holder.release().await.expect("release");
}

/// The works of leaders running now, by term id, for the selector case.
type Running = Arc<std::sync::Mutex<Vec<(usize, Term)>>>;

/// Takes a leader's work off [`Running`] when dropped: by returning or by
/// being cancelled.
struct Leaving(Running, usize);

impl Drop for Leaving {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(id, _)| *id != self.1);
    }
}

/// Three leader selectors compete; the current leader's session is expired
/// five times from outside. Each kill leads to a new leader with a higher
/// token on another session, the killed leader's work is dropped, and
/// shutdown ends every selector with the terms it served and leaves nobody
/// leading.
///
/// An expiry by the server is instant: the killed leader's client learns of
/// it one event later, and a successor may start in between (no client can
/// prevent that; only the loss deadline does, for a session that stops being
/// confirmed). So when a work starts while another still runs, the case
/// asserts what makes that harmless: the server already refuses every fenced
/// write of the older one.
pub async fn leader_selector_survives_leader_kills<F: Fixture>(fixture: &F) {
    const SELECTORS: usize = 3;
    const KILLS: usize = 5;
    let name = unique("selector");
    let running: Running = Arc::default();
    let next_id = Arc::new(AtomicUsize::new(0));
    let (elected_tx, mut elected) = tokio::sync::mpsc::unbounded_channel::<(FencingToken, Session, usize)>();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut selectors = Vec::new();
    for i in 0..SELECTORS {
        let selector = LeaderSelector::new(fixture.client().await, &name, format!("selector-{i}"))
            .with_session_options(fixture.options())
            .with_pause(Duration::from_millis(20));
        let mut stopped = stopped.clone();
        let (running, next_id, elected_tx) = (Arc::clone(&running), Arc::clone(&next_id), elected_tx.clone());
        let shutdown = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        selectors.push(tokio::spawn(selector.run(shutdown, move |term: Term| {
            let id = next_id.fetch_add(1, Ordering::SeqCst);
            let others: Vec<Term> = {
                let mut now = running.lock().expect("running");
                let others = now.iter().map(|(_, t)| t.clone()).collect();
                now.push((id, term.clone()));
                others
            };
            let leaving = Leaving(Arc::clone(&running), id);
            let elected_tx = elected_tx.clone();
            async move {
                let _leaving = leaving;
                for other in others {
                    match other.write_if_held([]).await {
                        Err(Error::SessionLost { .. } | Error::LockLost { .. }) => {}
                        held => panic!(
                            "term {} (token {}) started while term {} (token {}) still held: {held:?}",
                            term.number(),
                            term.token(),
                            other.number(),
                            other.token()
                        ),
                    }
                }
                let _ = elected_tx.send((term.token(), term.session().clone(), id));
                // Works until cancelled.
                std::future::pending::<()>().await;
            }
        })));
    }
    drop(elected_tx);
    let (mut token, mut leader, mut id) = bounded("a first leader", elected.recv()).await.expect("elected");
    for kill in 0..KILLS {
        fixture.expire(&leader).await;
        let (next_token, next, next_id) = bounded(&format!("a new leader after kill {kill}"), elected.recv())
            .await
            .expect("elected");
        assert!(next_token > token, "token {next_token} after {token}");
        assert_ne!(next.id(), leader.id(), "the expired session led again");
        bounded("the killed leader's work is dropped", async {
            while running.lock().expect("running").iter().any(|(other, _)| *other == id) {
                tokio::task::yield_now().await;
            }
        })
        .await;
        (token, leader, id) = (next_token, next, next_id);
    }
    stop.send_replace(true);
    let mut terms = 0;
    for selector in selectors {
        terms += bounded("a selector shuts down", selector)
            .await
            .expect("selector task")
            .expect("the selector ends without error");
    }
    assert!(terms > KILLS as u64, "{terms} terms for {KILLS} kills");
    assert!(
        running.lock().expect("running").is_empty(),
        "a work still runs after shutdown"
    );
    let observer = session(fixture, &fixture.client().await).await;
    let after = bounded("leader", observer.election(&name).expect("election").leader())
        .await
        .expect("leader");
    assert!(after.is_none(), "someone still leads after shutdown: {after:?}");
}

/// One [`LeaderSelector`] per client, each client behind a link of its own
/// that `cut(i, true)` silently partitions (packets dropped, nothing reset)
/// and `cut(i, false)` heals. The current leader's link is cut `kills` times:
/// at most one work runs at any moment (the cut leader's client declares
/// its session lost, dropping the work, before the server can expire it and
/// elect another), each cut is followed by a new leader on another client
/// with a higher token, and shutdown ends every selector.
pub async fn selectors_exclude_under_partitions(
    clients: Vec<Client>,
    options: SessionOptions,
    cut: impl Fn(usize, bool),
    kills: usize,
) {
    let name = unique("selector-partitions");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (elected_tx, mut elected) = tokio::sync::mpsc::unbounded_channel::<(usize, FencingToken)>();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut selectors = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let selector = LeaderSelector::new(client, &name, format!("selector-{i}"))
            .with_session_options(options.clone())
            .with_pause(Duration::from_millis(20));
        let mut stopped = stopped.clone();
        let shutdown = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let (inside, most, elected_tx) = (Arc::clone(&inside), Arc::clone(&most), elected_tx.clone());
        selectors.push(tokio::spawn(selector.run(shutdown, move |term: Term| {
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let leaving = Counted(Arc::clone(&inside));
            let _ = elected_tx.send((i, term.token()));
            async move {
                let _leaving = leaving;
                std::future::pending::<()>().await;
            }
        })));
    }
    drop(elected_tx);
    let (mut leader, mut token) = bounded("a first leader", elected.recv()).await.expect("elected");
    for kill in 0..kills {
        cut(leader, true);
        let (next, next_token) = bounded(&format!("a new leader after cut {kill}"), elected.recv())
            .await
            .expect("elected");
        assert_ne!(next, leader, "the cut-off selector led again while cut off");
        assert!(next_token > token, "token {next_token} after {token}");
        assert_eq!(most.load(Ordering::SeqCst), 1, "two works ran at once after cut {kill}");
        cut(leader, false);
        (leader, token) = (next, next_token);
    }
    stop.send_replace(true);
    for selector in selectors {
        bounded("a selector shuts down", selector)
            .await
            .expect("selector task")
            .expect("the selector ends without error");
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two works ran at once");
    assert_eq!(inside.load(Ordering::SeqCst), 0, "a work still runs after shutdown");
}

/// A value too large for the server (a campaign's, a proclaim's, a fenced
/// write's) is refused at once with `InvalidOptions` saying so, never
/// retried until the caller gives up, and leaves no entry. `key` is a
/// fenced-write key valid on the backend under test. Not for the memory
/// backend, which has no size limit.
pub async fn values_too_large_are_refused(client: &Client, key: &str) {
    let session = bounded("open a session", client.session()).await.expect("session");
    let huge = vec![b'a'; 3 << 20];
    let too_large = |what: &str, outcome: crate::Result<()>| match outcome {
        Err(Error::InvalidOptions { reason }) => assert!(reason.contains("too large"), "{what}: {reason}"),
        other => panic!("{what}: expected InvalidOptions, got {other:?}"),
    };
    let name = unique("large");
    let election = session.election(&name).expect("election");
    too_large(
        "campaign",
        bounded("campaign", election.campaign(&huge)).await.map(drop),
    );
    assert!(
        bounded("queue", session.queue(&name)).await.expect("queue").is_empty(),
        "no candidate left behind"
    );
    let guard = lock(&session.mutex(&unique("large-m")).expect("mutex")).await;
    too_large(
        "fenced write",
        bounded(
            "fenced write",
            guard.write_if_held([crate::Write::put(key, huge.clone())]),
        )
        .await,
    );
    let leadership = bounded("campaign", election.campaign(b"small"))
        .await
        .expect("campaign");
    too_large("proclaim", bounded("proclaim", leadership.proclaim(&huge)).await);
    assert!(leadership.is_held() && guard.is_held());
    guard.release().await.expect("release");
    leadership.resign().await.expect("resign");
}

/// Counts a running work down when it is dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Lock names under one base: nested names (`db`, `db/read`, `db/x`) and
/// names whose segments are recipe words of some backend's layout.
const WORD_NAMES: &[&str] = &[
    "db",
    "db/read",
    "db/write",
    "db/semaphore",
    "db/x",
    "db/lock",
    "db/election",
    "db/latch",
    "db/lease",
    "db/__READ__",
    "db/__WRIT__",
    "db/__lock__",
    "read",
    "write/read",
    "semaphore",
    "election",
    "lock",
    "latch",
    "lease",
    "__READ__",
];

/// Lock names whose segments are recipe words (`read`, `write`, `semaphore`,
/// `election`, `lock`, `latch`, `lease`, `__READ__`, ...) and nested names
/// (`db` with `db/read` and `db/x`) are separate locks on every backend: all
/// can be held at once, a waiter is granted when its own lock is released
/// while the others stay held, and each name still excludes.
pub async fn recipe_words_and_nested_names_are_separate_locks<F: Fixture>(fixture: &F) {
    let base = unique("words");
    let names: Vec<String> = WORD_NAMES.iter().map(|n| format!("{base}/{n}")).collect();
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);

    // Every name held at once by one session: none blocks another.
    let mut held = Vec::new();
    for name in &names {
        let guard = bounded("try_lock", sa.mutex(name).expect("mutex").try_lock())
            .await
            .expect("try_lock");
        held.push(guard.unwrap_or_else(|| panic!("{name} is blocked by other locks")));
    }
    // Each still excludes another session, nested keys created after the
    // holder's notwithstanding.
    for name in &names {
        let other = bounded("try_lock", sb.mutex(name).expect("mutex").try_lock())
            .await
            .expect("try_lock");
        assert!(other.is_none(), "{name} granted to a second session");
    }
    // A waiter is granted when its own lock's holder leaves, while every
    // other lock stays held (released in reverse, so that each waiter's
    // nearest keys under its prefix belong to other locks).
    let mut granted = Vec::new();
    for (name, guard) in names.iter().zip(held).rev() {
        let mutex = sb.mutex(name).expect("mutex");
        let waiter = queue_waiter(&b, mutex).await;
        guard.release().await.expect("release");
        let next = bounded(&format!("{name}: the waiter is granted"), waiter)
            .await
            .expect("task")
            .expect("lock");
        granted.push(next);
    }
    for guard in granted {
        guard.release().await.expect("release");
    }

    // The other recipes too.
    let rw_names = [
        format!("{base}/rw"),
        format!("{base}/rw/read"),
        format!("{base}/rw/write"),
    ];
    let mut writers = Vec::new();
    for name in &rw_names {
        let write = bounded("try_write", sa.rwlock(name).expect("rwlock").try_write())
            .await
            .expect("try_write");
        writers.push(write.unwrap_or_else(|| panic!("rwlock {name} is blocked by other locks")));
        let read = bounded("try_read", sb.rwlock(name).expect("rwlock").try_read())
            .await
            .expect("try_read");
        assert!(read.is_none(), "rwlock {name}: a reader beside a writer");
    }
    let sem_names = [
        format!("{base}/sem"),
        format!("{base}/sem/semaphore"),
        format!("{base}/sem/lock"),
    ];
    let mut permits = Vec::new();
    for name in &sem_names {
        let permit = bounded("try_acquire", sa.semaphore(name, 1).expect("semaphore").try_acquire())
            .await
            .expect("try_acquire");
        permits.push(permit.unwrap_or_else(|| panic!("semaphore {name} is blocked by other locks")));
        let second = bounded("try_acquire", sb.semaphore(name, 1).expect("semaphore").try_acquire())
            .await
            .expect("try_acquire");
        assert!(second.is_none(), "semaphore {name}: two permits of one");
    }
    let el_names = [
        format!("{base}/el"),
        format!("{base}/el/election"),
        format!("{base}/el/latch"),
    ];
    let mut leaders = Vec::new();
    for name in &el_names {
        let leading = bounded(
            &format!("{name}: campaign"),
            sa.election(name).expect("election").campaign(b"a"),
        )
        .await
        .expect("campaign");
        leaders.push(leading);
    }
    for guard in writers {
        guard.release().await.expect("release");
    }
    for permit in permits {
        permit.release().await.expect("release");
    }
    for leading in leaders {
        leading.resign().await.expect("resign");
    }

    // Mutual exclusion on every name at once, two sessions contending on each.
    let inside: Vec<Arc<AtomicUsize>> = names.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (name, inside) in names.iter().zip(&inside) {
        for session in [&sa, &sb] {
            let mutex = session.mutex(name).expect("mutex");
            let (inside, name) = (Arc::clone(inside), name.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    let guard = lock(&mutex).await;
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "{name}: two holders at once");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        bounded("a contender finishes", task).await.expect("contender task");
    }
    for name in &names {
        assert!(
            keys(&sa.mutex(name).expect("mutex")).await.is_empty(),
            "{name}: entries left"
        );
    }
}

/// Declares one `#[tokio::test]` per conformance case, each with a fixture made
/// by the given expression (which may `.await`).
#[macro_export]
macro_rules! conformance_tests {
    ($fixture:expr) => {
        $crate::conformance_tests!(@cases $fixture;
            mutual_exclusion,
            fifo_order_and_increasing_tokens,
            one_wakeup_per_release,
            try_lock_leaves_no_entry,
            lock_timeout_leaves_no_entry,
            lock_timeout_zero_is_one_try,
            queue_lists_holder_then_waiters,
            cancelled_lock_leaves_no_entry,
            fenced_release_spares_newer_holder,
            fenced_remove_primitive,
            session_loss,
            same_session_contention,
            dropped_guard_releases,
            invalid_input_is_rejected,
            closed_session_rejects_use,
            readers_share_writers_exclude,
            waiting_writer_is_not_starved,
            rwlock_exclusion_under_load,
            semaphore_bound_is_never_exceeded,
            semaphore_waits_herd_free,
            cancelled_recipes_leave_no_entry,
            election_observe_and_session_loss,
            recipe_words_and_nested_names_are_separate_locks,
            fenced_write_lands_while_held,
            fenced_write_refused_after_session_loss,
            fenced_write_refused_after_entry_deleted,
            fenced_write_batch_is_all_or_nothing,
            leader_selector_survives_leader_kills,
            sequencers_are_current_only_while_held,
            multi_locks_are_all_or_nothing_and_never_deadlock,
            lock_modes_follow_the_matrix,
            lock_modes_never_bypass_a_waiter,
            lock_modes_convert_down_at_once,
            lock_modes_convert_up_with_priority,
            lock_modes_detect_conversion_deadlock,
            lock_modes_value_block,
            lock_modes_tell_holders_they_block,
            lock_modes_leave_nothing_when_given_up,
            lock_modes_fence_and_lose,
            lock_modes_mixed_crowd_is_herd_free,
            lock_modes_multi_resource_all_or_nothing,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $fixture;
                $crate::conformance::$case(&fixture).await;
            }
        )*
    };
}
