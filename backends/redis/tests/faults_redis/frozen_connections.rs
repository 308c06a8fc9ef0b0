//! One of a session's two connections (command or pub/sub) goes silent
//! alone, under a holder or a waiter: it is given up within the bound and
//! the queue goes on.

use super::*;

/// Which of a session's two connections a test freezes alone.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Frozen {
    /// The command connection: appends, reads, releases and renewals.
    Command,
    /// The pub/sub connection: the one wakeup of each release.
    PubSub,
}

/// The most a frozen connection may cost (DESIGN rule 18): the next
/// contender is granted within a TTL, a keepalive interval and a request
/// timeout.
fn frozen_bound(options: &SessionOptions) -> Duration {
    options.ttl() + options.keepalive_interval() + options.request_timeout()
}

/// TTL 6 s: renewals every 2 s, loss deadline 4.8 s, probe timeout 1 s. A
/// renewal caught on the frozen connection is given up at 3 s at the
/// latest, which leaves the try on a new connection 1.8 s before the
/// deadline: room enough on a machine under load (with a TTL of 2 s it was
/// 0.47 s, and a loaded machine sometimes took longer, losing the session
/// safely but not keeping the lock as these tests assert).
fn frozen_options() -> SessionOptions {
    options(6000)
}

/// How many clients `server` has connected now (`INFO clients`; the
/// `redis-cli` asking counts itself, the same each time).
fn connected_clients(server: &RedisServer) -> usize {
    server
        .cli(&["INFO", "clients"])
        .expect("INFO clients")
        .lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients")
}

/// Opens a session through `proxy` and tells which of the proxy's
/// connections are its own: the command connection, made while the session
/// opens, then the pub/sub connection its background task makes next. Both
/// must have reached the server before one is frozen: the proxy joins a
/// connection to the server on a thread of its own, and one frozen before
/// it was joined is never joined, so its client's end is never seen closed.
/// A setup that made more than two connections (a first pub/sub attempt
/// that went unanswered on a loaded machine) is ambiguous, and done again.
async fn session_through(
    server: &RedisServer,
    proxy: &TcpProxy,
    client: &Client,
    options: SessionOptions,
) -> (Session, [usize; 2]) {
    for _ in 0..3 {
        let before = connected_clients(server);
        let first = proxy.connections_accepted();
        let session = client.session_with(options.clone()).await.expect("session");
        assert!(
            proxy.connections_accepted() > first,
            "the command connection is made while the session opens"
        );
        // The server is another process, with no event to await: look every 20 ms.
        bounded("both connections reach the server", async {
            while connected_clients(server) < before + 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if proxy.connections_accepted() == first + 2 {
            return (session, [first, first + 1]);
        }
        session.close().await.expect("close");
    }
    panic!("every try to open a session through the proxy made more than two connections");
}

/// The number of `frozen` among a session's connections.
fn number_of(frozen: Frozen, connections: [usize; 2]) -> usize {
    match frozen {
        Frozen::Command => connections[0],
        Frozen::PubSub => connections[1],
    }
}

/// What both cases of a frozen connection start from: a server, a proxy in
/// front of it, a client through the proxy (`far`) and one straight to the
/// server (`near`), the options and their bound, the lock's name, and a
/// session of `far` whose own connections are known.
struct FrozenSetUp {
    server: RedisServer,
    proxy: TcpProxy,
    far: Client,
    near: Client,
    options: SessionOptions,
    bound: Duration,
    name: String,
    session: Session,
    connections: [usize; 2],
}

impl FrozenSetUp {
    /// Sets up the case of `role` (`holder` or `waiter`) for `frozen`.
    async fn set_up(frozen: Frozen, role: &str) -> Self {
        let server = RedisServer::start().expect("start redis");
        let (proxy, far) = through_a_proxy(&server);
        let near = Client::new(Redis::new(server.url()));
        let options = frozen_options();
        let bound = frozen_bound(&options);
        let name = format!("frozen/{frozen:?}/{role}");
        let (session, connections) = session_through(&server, &proxy, &far, options.clone()).await;
        Self {
            server,
            proxy,
            far,
            near,
            options,
            bound,
            name,
            session,
            connections,
        }
    }
}

/// One of a holder's connections goes silent alone (a NAT forgetting one
/// idle flow; nothing closed or reset) while another client waits: the
/// holder gives the frozen connection up within the bound (a round trip on
/// it went unanswered: a renewal on the command connection, a ping on the
/// pub/sub one) and carries on over a new one. It keeps its lock, renewed
/// on the server after the freeze (the remaining and new connections prove
/// it alive), the waiter is not granted meanwhile, and is granted as soon as
/// the holder releases.
async fn a_holder_with_one_frozen_connection(frozen: Frozen) {
    let FrozenSetUp {
        server,
        proxy,
        near,
        options,
        bound,
        name,
        session: holder,
        connections,
        ..
    } = FrozenSetUp::set_up(frozen, "holder").await;
    let held = holder.mutex(&name).expect("mutex").lock().await.expect("lock");
    let other = near.session_with(options.clone()).await.expect("session");
    let waiter = {
        let mutex = other.mutex(&name).expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    lockline::conformance::wait_for_stats(&near, |s| s.waits >= 1).await;
    let mut side = support::side(&server.url()).await;

    let number = number_of(frozen, connections);
    let frozen_at = Instant::now();
    proxy.freeze_connection(number);
    lockline::conformance::until("the frozen connection is given up", || proxy.client_closed(number)).await;
    let given_up = frozen_at.elapsed();
    assert!(
        given_up <= bound,
        "the frozen {frozen:?} connection was given up {given_up:?} after the freeze, past {bound:?}"
    );
    support::renewed(&mut side, held.key()).await;
    assert!(
        held.is_held(),
        "the holder lost its lock though its other connections flow"
    );
    assert!(!waiter.is_finished(), "the waiter was granted while the lock was held");
    let token = held.token();
    let released_at = Instant::now();
    held.release().await.expect("release");
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        granted_at - released_at <= bound,
        "granted {:?} after the release",
        granted_at - released_at
    );
    assert!(guard.token() > token);
    guard.release().await.expect("release");
    assert_eq!(holder.state(), SessionState::Live);
    proxy.thaw_connection(number);
}

/// One of a waiter's connections goes silent alone while it waits, and its
/// predecessor releases right after: the queue does not freeze. The waiter
/// is granted within the bound (a release it did not hear on a frozen
/// pub/sub connection is caught when the connection's ping goes unanswered
/// and it is made again; a grant over a frozen command connection goes on
/// over a new one), gives the frozen connection up, holds while the
/// contender behind it waits, and that one is granted once it releases.
async fn a_waiter_with_one_frozen_connection(frozen: Frozen) {
    let FrozenSetUp {
        server,
        proxy,
        far,
        near,
        options,
        bound,
        name,
        session: waiting,
        connections,
    } = FrozenSetUp::set_up(frozen, "waiter").await;
    let holder = near.session_with(options.clone()).await.expect("session");
    let held = holder.mutex(&name).expect("mutex").lock().await.expect("lock");
    let granted = |session: &Session| {
        let mutex = session.mutex(&name).expect("mutex");
        async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        }
    };
    let waiter = tokio::spawn(granted(&waiting));
    lockline::conformance::wait_for_stats(&far, |s| s.waits >= 1).await;
    // A contender behind it, on another client.
    let last = near.session_with(options.clone()).await.expect("session");
    let behind = tokio::spawn(granted(&last));
    lockline::conformance::wait_for_stats(&near, |s| s.waits >= 1).await;

    let number = number_of(frozen, connections);
    let frozen_at = Instant::now();
    proxy.freeze_connection(number);
    let released_at = Instant::now();
    held.release().await.expect("release");
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("the waiter's lock");
    assert!(
        granted_at - released_at <= bound,
        "the waiter was granted {:?} after the release, past {bound:?}",
        granted_at - released_at
    );
    lockline::conformance::until("the frozen connection is given up", || proxy.client_closed(number)).await;
    let given_up = frozen_at.elapsed();
    assert!(
        given_up <= bound,
        "the frozen {frozen:?} connection was given up {given_up:?} after the freeze, past {bound:?}"
    );
    let mut side = support::side(&server.url()).await;
    support::renewed(&mut side, guard.key()).await;
    assert!(guard.is_held(), "the waiter lost the lock it was granted");
    assert!(
        !behind.is_finished(),
        "the contender behind was granted while the lock was held"
    );
    let released_at = Instant::now();
    guard.release().await.expect("release");
    let (granted_at, next) = bounded("the contender behind is granted", behind).await.expect("task");
    assert!(
        granted_at - released_at <= bound,
        "granted {:?} after the release",
        granted_at - released_at
    );
    next.expect("lock").release().await.expect("release");
    assert_eq!(waiting.state(), SessionState::Live);
    proxy.thaw_connection(number);
}

/// As [`a_waiter_with_one_frozen_connection`], for a lock-mode waiter the
/// release hands the lock over to: the hand-over's message, which carries
/// the queue it left, goes to a waiter one of whose connections is frozen
/// (a message lost on a frozen pub/sub connection; a read it no longer
/// needs on a frozen command connection). The waiter still holds within the
/// bound, and keeps its lock.
async fn a_lock_mode_waiter_with_one_frozen_connection(frozen: Frozen) {
    use lockline::LockMode;
    let FrozenSetUp {
        server,
        proxy,
        far,
        near,
        options,
        bound,
        name,
        session: waiting,
        connections,
    } = FrozenSetUp::set_up(frozen, "lock-mode-waiter").await;
    let granted = |session: &Session| {
        let resource = session.resource(&name).expect("resource");
        async move {
            let guard = resource.lock(LockMode::Ex).await;
            (Instant::now(), guard)
        }
    };
    // The holder, a contender behind it (granted by itself, with the queue
    // read then), and the waiter behind that one, which it hands over to.
    let holder = near.session_with(options.clone()).await.expect("session");
    let held = holder
        .resource(&name)
        .expect("resource")
        .lock(LockMode::Ex)
        .await
        .expect("lock");
    let next = near.session_with(options.clone()).await.expect("session");
    let next_granted = tokio::spawn(granted(&next));
    lockline::conformance::wait_for_stats(&near, |s| s.waits >= 1).await;
    let waiter = tokio::spawn(granted(&waiting));
    lockline::conformance::wait_for_stats(&far, |s| s.waits >= 1).await;
    held.release().await.expect("release");
    let (_, handing) = bounded("the next contender is granted", next_granted)
        .await
        .expect("task");
    let handing = handing.expect("lock");

    let number = number_of(frozen, connections);
    proxy.freeze_connection(number);
    let handovers = near.stats().handovers;
    let released_at = Instant::now();
    handing.release().await.expect("release");
    assert_eq!(
        near.stats().handovers,
        handovers + 1,
        "the release handed the lock over"
    );
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("the waiter's lock");
    assert!(
        granted_at - released_at <= bound,
        "the waiter was granted {:?} after the release, past {bound:?}",
        granted_at - released_at
    );
    lockline::conformance::until("the frozen connection is given up", || proxy.client_closed(number)).await;
    let mut side = support::side(&server.url()).await;
    support::renewed(&mut side, guard.key()).await;
    assert!(guard.is_held(), "the waiter lost the lock it was handed");
    guard.release().await.expect("release");
    assert_eq!(waiting.state(), SessionState::Live);
    proxy.thaw_connection(number);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_mode_waiter_whose_pubsub_connection_goes_silent_alone_is_handed_the_lock() {
    a_lock_mode_waiter_with_one_frozen_connection(Frozen::PubSub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_mode_waiter_whose_command_connection_goes_silent_alone_is_handed_the_lock() {
    a_lock_mode_waiter_with_one_frozen_connection(Frozen::Command).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_command_connection_goes_silent_alone_replaces_it_and_keeps_its_lock() {
    a_holder_with_one_frozen_connection(Frozen::Command).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_pubsub_connection_goes_silent_alone_replaces_it_and_keeps_its_lock() {
    a_holder_with_one_frozen_connection(Frozen::PubSub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_command_connection_goes_silent_alone_is_granted_and_the_queue_goes_on() {
    a_waiter_with_one_frozen_connection(Frozen::Command).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_pubsub_connection_goes_silent_alone_is_granted_and_the_queue_goes_on() {
    a_waiter_with_one_frozen_connection(Frozen::PubSub).await;
}
