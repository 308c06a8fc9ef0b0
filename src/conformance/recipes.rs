//! Recipes: read/write locks, semaphores, elections and leader selectors over
//! the one wait rule.

use super::*;

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

/// Counts a running work down when it is dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
