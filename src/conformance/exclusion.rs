//! Exclusion and order: one holder at a time, granted in queue order with
//! rising tokens, one wakeup per release.

use super::*;

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
            // Unbounded here: the join below bounds it from the release,
            // not from before the other waiters' sessions were opened.
            spawn_queued(&client, async move {
                let guard = mutex.lock().await.expect("lock");
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
            // Unbounded here: the join below bounds it from the release,
            // not from before the other 31 sessions were opened.
            spawn_queued(&client, async move {
                let guard = mutex.lock().await.expect("lock");
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
