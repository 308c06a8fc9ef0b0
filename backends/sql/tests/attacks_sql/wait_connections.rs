//! The bounded wait connections: waiters nearest the heads of their
//! queues are served, however many older waits there are.

use super::*;

/// A session waiting on two locks with one wait connection: the first lock
/// (older holder) stays held, the second is released. The second lock's
/// head waiter must be granted: it is at the head of its queue, the lock
/// is free, and nobody else holds or wants it.
async fn a_free_lock_reaches_its_head_with_one_wait_connection(db: Db) {
    let url = db.url();
    let holders = Client::new(Sql::new(url.clone()));
    let (h1, h2) = (
        holders.session_with(options(10_000)).await.expect("session"),
        holders.session_with(options(10_000)).await.expect("session"),
    );
    let long = h1.mutex("held-long").expect("mutex").lock().await.expect("lock");
    let short = h2.mutex("held-short").expect("mutex").lock().await.expect("lock");
    let waiting = Client::new(Sql::new(url.clone()).with_wait_connections(1));
    let w = waiting.session_with(options(10_000)).await.expect("session");
    let on_long = {
        let mutex = w.mutex("held-long").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&waiting, |s| s.waits >= 1).await;
    let on_short = {
        let mutex = w.mutex("held-short").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&waiting, |s| s.waits >= 2).await;
    short.release().await.expect("release");
    let granted = within(Duration::from_secs(5), on_short).await;
    long.release().await.expect("release");
    let granted = granted.unwrap_or_else(|| {
        panic!("a free lock was not granted to the head of its queue within 5 s: its waiter had no wait connection")
    });
    granted.expect("task").expect("lock").release().await.expect("release");
    step("the other lock", on_long)
        .await
        .expect("task")
        .expect("lock")
        .release()
        .await
        .expect("release");
}

/// The same with the default 16 wait connections and a realistic load: a
/// session campaigning in 16 elections that others lead (each candidate
/// waits for as long as the leader leads) can still take an ordinary lock
/// that another session holds for a moment.
async fn campaigns_do_not_starve_a_mutex_waiter(db: Db) {
    let url = db.url();
    let leaders = Client::new(Sql::new(url.clone()));
    let leader = leaders.session_with(options(10_000)).await.expect("session");
    let mut leading = Vec::new();
    for i in 0..lockline_sql::DEFAULT_WAIT_CONNECTIONS {
        let election = leader.election(&format!("shard/{i}")).expect("election");
        leading.push(election.campaign(b"leader").await.expect("campaign"));
    }
    let holder = leaders.session_with(options(10_000)).await.expect("session");
    let held = holder.mutex("ordinary").expect("mutex").lock().await.expect("lock");
    let client = Client::new(Sql::new(url.clone()));
    let service = client.session_with(options(10_000)).await.expect("session");
    let mut candidates = Vec::new();
    for i in 0..lockline_sql::DEFAULT_WAIT_CONNECTIONS {
        let election = service.election(&format!("shard/{i}")).expect("election");
        candidates.push(tokio::spawn(async move { election.campaign(b"standby").await }));
    }
    let n = lockline_sql::DEFAULT_WAIT_CONNECTIONS as u64;
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= n).await;
    let waiter = {
        let mutex = service.mutex("ordinary").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits > n).await;
    held.release().await.expect("release");
    let granted = within(Duration::from_secs(5), waiter).await;
    for c in &candidates {
        c.abort();
    }
    let granted = granted.unwrap_or_else(|| {
        panic!("a mutex released by its holder was not granted to its only waiter within 5 s: the session's 16 wait connections were all taken by its campaigns")
    });
    granted.expect("task").expect("lock").release().await.expect("release");
}

// Was a defect, now fixed (liveness: starvation, and deadlock with no lock cycle): pool.rs
// gives wait connections by the predecessor's id (session.rs `wait_gone`
// passes `entry.order` as the priority), not by the place in its queue, and
// a wait keeps its connection for as long as its predecessor lives
// (session.rs `WaitTask::wait` loops on Reaped::Renewed without giving the
// connection back); only a *smaller* priority preempts. So n waits on old
// entries (election candidates and observers wait indefinitely by design)
// hold every wait connection, and the head of any newer lock's queue is
// never told its lock is free. docs/sql.md ("given to the waiters nearest the
// heads of their queues"; "a waiter beyond that, on a lock nearer no head
// than the others, waits in the process") promises otherwise: here both
// waiters are at the head of their queues. If the holder of the old lock
// itself waits behind this session on the newer lock, it is a deadlock no
// lock ordering caused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_free_lock_reaches_its_head_with_one_wait_connection() {
    a_free_lock_reaches_its_head_with_one_wait_connection(Db::postgres()).await;
}

// Was a defect, now fixed: as postgres_a_free_lock_reaches_its_head_with_one_wait_connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_free_lock_reaches_its_head_with_one_wait_connection() {
    a_free_lock_reaches_its_head_with_one_wait_connection(Db::mariadb()).await;
}

// Was a defect, now fixed: as postgres_a_free_lock_reaches_its_head_with_one_wait_connection,
// with the default 16 wait connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_campaigns_do_not_starve_a_mutex_waiter() {
    campaigns_do_not_starve_a_mutex_waiter(Db::postgres()).await;
}

/// No lock-order cycle, yet a deadlock through the wait connections: H1
/// holds A and then wants B (order A, B); session W (one wait connection)
/// has one task waiting for A and another for B; H2 releases B. W's B-task
/// is next for B, then H1, which then releases A for W's A-task.
async fn waits_of_one_session_never_deadlock_without_a_lock_cycle(db: Db) {
    let url = db.url();
    let holders = Client::new(Sql::new(url.clone()));
    let (h1, h2) = (
        holders.session_with(options(10_000)).await.expect("session"),
        holders.session_with(options(10_000)).await.expect("session"),
    );
    let a = h1.mutex("order/a").expect("mutex").lock().await.expect("lock");
    let b = h2.mutex("order/b").expect("mutex").lock().await.expect("lock");
    let waiting = Client::new(Sql::new(url.clone()).with_wait_connections(1));
    let w = waiting.session_with(options(10_000)).await.expect("session");
    let w_a = {
        let mutex = w.mutex("order/a").expect("mutex");
        tokio::spawn(async move { mutex.lock().await?.release().await })
    };
    lockline::conformance::wait_for_stats(&waiting, |s| s.waits >= 1).await;
    let w_b = {
        let mutex = w.mutex("order/b").expect("mutex");
        tokio::spawn(async move { mutex.lock().await?.release().await })
    };
    lockline::conformance::wait_for_stats(&waiting, |s| s.waits >= 2).await;
    let h1_b = {
        let mutex = h1.mutex("order/b").expect("mutex");
        tokio::spawn(async move {
            let b = mutex.lock().await?;
            b.release().await?;
            a.release().await
        })
    };
    lockline::conformance::wait_for_stats(&holders, |s| s.waits >= 1).await;
    b.release().await.expect("release");
    let all = async {
        w_b.await.expect("task").expect("W's B");
        h1_b.await.expect("task").expect("H1's B, then A");
        w_a.await.expect("task").expect("W's A");
    };
    assert!(
        within(Duration::from_secs(10), all).await.is_some(),
        "deadlock: W's B-waiter never got a wait connection (W's A-waiter keeps it, waiting for H1, which waits behind W on B)"
    );
}

// Was a defect, now fixed: the deadlock form of postgres_a_free_lock_reaches_its_head_with_one_wait_connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waits_of_one_session_never_deadlock_without_a_lock_cycle() {
    waits_of_one_session_never_deadlock_without_a_lock_cycle(Db::postgres()).await;
}

/// Ten sessions queue on one lock on a server that allows 24 connections
/// (each session keeps two, one holding its locks and one renewing it, and
/// wants one more to wait on: 30 in all): every one is granted, in queue
/// order, the waiters beyond the server's connections looked at without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_many_sessions_on_few_connections_are_granted_in_order() {
    let server = lockline_testkit::PgServer::start_with(&lockline_testkit::PgOptions {
        durable: false,
        max_connections: 24,
        ..Default::default()
    })
    .expect("start postgres");
    let db = Db::Pg(server);
    let client = Client::new(Sql::new(db.url()));
    let mut sessions = Vec::new();
    for _ in 0..10 {
        sessions.push(client.session_with(options(10_000)).await.expect("session"));
    }
    let first = sessions[0].mutex("crowd").expect("mutex").lock().await.expect("lock");
    let order = Arc::new(std::sync::Mutex::new(vec![first.token().get()]));
    let mut tasks: Vec<tokio::task::JoinHandle<lockline::Result<()>>> = Vec::new();
    for (i, session) in sessions.iter().enumerate().skip(1) {
        let mutex = session.mutex("crowd").expect("mutex");
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let guard = mutex.lock().await?;
            order.lock().unwrap().push(guard.token().get());
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await
        }));
        lockline::conformance::wait_for_stats(&client, |s| s.appends > i as u64).await;
    }
    first.release().await.expect("release");
    for task in tasks {
        step("every contender is granted", task)
            .await
            .expect("task")
            .expect("lock");
    }
    let order = order.lock().unwrap().clone();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "granted out of queue order: {order:?}"
    );
}

/// Was a defect, now fixed: a waiter dropped while its session opened a
/// wait connection for it kept that connection's slot in the pool for the
/// life of the session: after enough such drops no waiter of the session
/// got a wait connection again, and waiters were left to the overflow
/// poll. Here a session with two wait connections has one waiter that
/// keeps waiting, and a second dropped 150 times at points 1 to 60 ms
/// into its wait (some while its connection opens); then two waiters that
/// keep waiting both wait on the server, and both are granted once the
/// holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_waiter_dropped_as_its_wait_connection_opens_gives_the_slot_back() {
    use lockline::LockMode::Pr;
    let (db, _holder, held, session) = behind_an_ex_holder("pool/slot", 2).await;
    let url = db.url();
    let resource = session.resource("pool/slot").unwrap();
    let mut side = Side::connect(&url).await;

    let first = {
        let resource = resource.clone();
        tokio::spawn(async move { resource.lock(Pr).await })
    };
    side.until_at_least("the first waiter waits on the server", WAITS_ON_SERVER, 1)
        .await;
    for round in 0..150u64 {
        let after = Duration::from_micros(1_000 + (round * 7_919) % 60_000);
        let _ = tokio::time::timeout(after, resource.lock(Pr)).await;
    }
    step("the dropped waiters' cleanups", session.flush()).await;

    let second = {
        let resource = resource.clone();
        tokio::spawn(async move { resource.lock(Pr).await })
    };
    side.until_at_least("both waiters wait on the server", WAITS_ON_SERVER, 2)
        .await;
    held.release().await.expect("release");
    for waiter in [first, second] {
        let granted = step("a waiter granted", waiter).await.expect("task").expect("PR");
        granted.release().await.expect("release");
    }
}

/// Was a defect, now fixed: a waiter's wait task runs on the waiter's
/// runtime, and one dropped with it (a runtime of its own that shut down
/// while the waiter waited on the server) kept its slot of the session's
/// wait connections for the session's life. With one wait connection, no
/// later waiter of the session waited on the server again (each was left
/// to the overflow poll). Here the later waiter waits on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_wait_dropped_with_its_runtime_gives_the_slot_back() {
    use lockline::LockMode::Pr;
    let (db, _holder, held, session) = behind_an_ex_holder("pool/runtime", 1).await;
    let url = db.url();
    let resource = session.resource("pool/runtime").unwrap();
    let mut side = Side::connect(&url).await;

    // A waiter on a runtime of its own thread waits on the server, then
    // its future is dropped and its runtime shut down.
    {
        let (resource, url) = (resource.clone(), url.clone());
        on_a_runtime_of_its_own(|| async move {
            let mut side = Side::connect(&url).await;
            tokio::select! {
                outcome = resource.lock(Pr) => panic!("granted beside EX: {:?}", outcome.map(|g| g.token())),
                () = side.until_at_least("the first waiter waits on the server", WAITS_ON_SERVER, 1) => {}
            }
        })
        .await;
    }
    step("the dropped waiter's cleanup", session.flush()).await;
    side.until("its server wait ended with its connection", WAITS_ON_SERVER, |count| {
        count == 0
    })
    .await;

    the_next_waiter_waits_on_the_server(&resource, held, &mut side).await;
}

/// As above, with the runtime shut down right as the wait's task is
/// spawned, before that task is first polled: its slot must come back as
/// well (one wait connection: a slot kept for good leaves every later
/// waiter of the session without one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_wait_task_dropped_before_it_ran_gives_the_slot_back() {
    use lockline::LockMode::Pr;
    let (db, _holder, held, session) = behind_an_ex_holder("pool/unpolled", 1).await;
    let url = db.url();
    let resource = session.resource("pool/unpolled").unwrap();
    let mut side = Side::connect(&url).await;

    // The waiter runs on a current-thread runtime of its own, polled by
    // hand: once a poll of it has spawned a task (the wait's, the only task
    // a waiter spawns on its own runtime), the runtime is shut down in that
    // same poll, so the task never runs.
    let spawned = {
        let resource = resource.clone();
        on_a_runtime_of_its_own(|| async move {
            let mut lock = std::pin::pin!(resource.lock(Pr));
            let metrics = tokio::runtime::Handle::current().metrics();
            let spawned = std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(outcome) = std::future::Future::poll(lock.as_mut(), cx) {
                    panic!("granted beside EX: {:?}", outcome.map(|g| g.token()));
                }
                if metrics.num_alive_tasks() > 0 {
                    return std::task::Poll::Ready(());
                }
                std::task::Poll::Pending
            });
            tokio::time::timeout(Duration::from_secs(30), spawned).await.is_ok()
        })
        .await
    };
    assert!(spawned, "the waiter spawned no task within 30 s");
    step("the dropped waiter's cleanup", session.flush()).await;
    assert_eq!(
        side.int(WAITS_ON_SERVER).await,
        0,
        "the wait task never ran, yet a wait is on the server"
    );

    the_next_waiter_waits_on_the_server(&resource, held, &mut side).await;
}

/// Runs `work` on a current-thread runtime of its own, on a blocking
/// thread, and shuts that runtime down as soon as `work` returns: whatever
/// `work` left spawned on it is dropped with it.
async fn on_a_runtime_of_its_own<T, F>(work: impl FnOnce() -> F + Send + 'static) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = T>,
{
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let out = runtime.block_on(work());
        drop(runtime);
        out
    })
    .await
    .expect("the runtime's thread")
}

/// With the slot of a dropped waiter back, a next waiter in PR waits on
/// the server (not on the overflow poll), and is granted once `held` (EX)
/// is released.
async fn the_next_waiter_waits_on_the_server(
    resource: &lockline::Resource,
    held: lockline::ResourceGuard,
    side: &mut Side,
) {
    let next = {
        let resource = resource.clone();
        tokio::spawn(async move { resource.lock(lockline::LockMode::Pr).await })
    };
    side.until_at_least("the next waiter waits on the server", WAITS_ON_SERVER, 1)
        .await;
    held.release().await.expect("release");
    let granted = step("the next waiter granted", next).await.expect("task").expect("PR");
    granted.release().await.expect("release");
}

/// What a waiter's `lockline_watch` waiting on the server looks like in
/// `pg_stat_activity`: the count of them.
const WAITS_ON_SERVER: &str = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%lockline_watch%' \
                               AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()";

/// A PostgreSQL server, a session holding `name` in EX (kept alive), that
/// hold, and another session with `wait_connections` wait connections.
async fn behind_an_ex_holder(
    name: &str,
    wait_connections: usize,
) -> (Db, lockline::Session, lockline::ResourceGuard, lockline::Session) {
    let db = Db::postgres();
    let url = db.url();
    let holders = Client::new(Sql::new(url.clone()));
    let holder = holders.session_with(options(20_000)).await.expect("session");
    let held = holder
        .resource(name)
        .unwrap()
        .lock(lockline::LockMode::Ex)
        .await
        .expect("EX");
    let client = Client::new(Sql::new(url).with_wait_connections(wait_connections));
    let session = client.session_with(options(20_000)).await.expect("session");
    (db, holder, held, session)
}
