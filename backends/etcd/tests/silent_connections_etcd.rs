//! One flow of a session goes silent while the others flow — what a NAT
//! gateway, a conntrack table or a cloud load balancer does to a flow that
//! sits idle (packets dropped, nothing reset). A session given several
//! endpoints holds one HTTP/2 connection per member and spreads its streams
//! over them: its lease keepalive stream may ride one connection and its
//! watch stream another. Each case puts a proxy in front of each member of a
//! 3-member cluster, finds which member carries the stream under test (from
//! the members' gRPC counters), freezes that one connection alone, and checks
//! that no queue freezes and that no holder keeps a lock the server may
//! hand to someone else.
//!
//! A session with a single endpoint has one connection for everything:
//! freezing it is a silent partition of that session, which
//! `faults_etcd/session_loss.rs` covers (`silent_partition_*`: the holder is suspended,
//! then lost before the server can expire its lease, and the next contender
//! is granted after its `lost()`).

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, Error, SessionOptions, SessionState};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

/// A session whose renewals outlive a frozen connection: its request
/// timeout (and so its HTTP/2 keepalive timeout) is well inside its loss
/// deadline (TTL 5 s: keepalive interval 1.67 s, loss deadline 4 s).
fn quick() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_request_timeout(Duration::from_secs(1))
}

/// A session on the other side of each case (a holder, a waiter), not
/// proxied: its HTTP/2 pings are as far apart as etcd's
/// `--grpc-keepalive-min-time` allows, so its streams stay where they are
/// and the members' counters move for the session under test only.
fn steady() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(20))
}

/// What a silent flow may cost a waiter at most: TTL + a keepalive interval
/// + the request timeout, and a second of slack for a busy machine.
fn settle_bound(options: &SessionOptions) -> Duration {
    options.ttl() + options.keepalive_interval() + options.request_timeout() + Duration::from_secs(1)
}

/// Three members, and a proxy in front of each.
fn proxied_cluster() -> (EtcdCluster, Vec<TcpProxy>) {
    let cluster = EtcdCluster::start_cluster(3).expect("start etcd");
    let proxies = (0..3)
        .map(|i| TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(i))).expect("proxy"))
        .collect();
    (cluster, proxies)
}

/// A client of its own that reaches every member through its proxy.
fn through(proxies: &[TcpProxy]) -> Client {
    Client::new(Etcd::new(
        proxies
            .iter()
            .map(|p| format!("http://{}", p.address()))
            .collect::<Vec<_>>(),
    ))
}

/// gRPC streams member `i` has started for `method` (`Watch`,
/// `LeaseKeepAlive`), from its `/metrics`.
fn started(cluster: &EtcdCluster, i: usize, method: &str) -> u64 {
    let metrics = cluster.metrics(i).expect("metrics");
    let label = format!("grpc_method=\"{method}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.trim().parse::<f64>().ok()))
        .map(|v| v as u64)
        .sum()
}

fn started_everywhere(cluster: &EtcdCluster, method: &str) -> Vec<u64> {
    (0..cluster.size()).map(|i| started(cluster, i, method)).collect()
}

/// The member that has started a stream of `method` since `before`: waits
/// for it (a stream opens when the session first needs it).
async fn member_starting(cluster: &EtcdCluster, method: &str, before: &[u64]) -> usize {
    bounded(&format!("a {method} stream starts"), async {
        loop {
            let now = started_everywhere(cluster, method);
            let grown: Vec<usize> = (0..now.len()).filter(|&i| now[i] > before[i]).collect();
            match grown.as_slice() {
                [one] => return *one,
                [] => tokio::time::sleep(Duration::from_millis(50)).await,
                more => panic!("{method} streams started on members {more:?} at once"),
            }
        }
    })
    .await
}

/// The connection a client holds through `proxy` now: the last it accepted.
fn current_connection(proxy: &TcpProxy) -> usize {
    proxy.connections_accepted().checked_sub(1).expect("a connection")
}

/// How the flow under test goes silent.
#[derive(Debug, Clone, Copy)]
enum Silence {
    /// No byte of the connection crosses, either way.
    Both,
    /// The client's bytes reach the member; its answers never come back.
    Answers,
}

/// Connect options as a user may hand them over (for TLS, say) with
/// [`Etcd::with_connect_options`]: no HTTP/2 keepalive, no request timeout.
fn bare(proxies: &[TcpProxy]) -> Client {
    Client::new(
        Etcd::new(
            proxies
                .iter()
                .map(|p| format!("http://{}", p.address()))
                .collect::<Vec<_>>(),
        )
        .with_connect_options(lockline_etcd::etcd_client::ConnectOptions::new()),
    )
}

/// A waiter reaches the members through proxies (a client made by
/// `connect`); its watch stream rides one member's connection and its
/// keepalive another's. That connection alone goes silent, then the holder
/// (direct) releases: the waiter is granted within TTL + a keepalive
/// interval + the request timeout (the silence is noticed, the watch
/// breaks, the waiter reads again and watches on a live connection), and
/// its session stays live throughout.
async fn silent_watch_flow(connect: fn(&[TcpProxy]) -> Client, silence: Silence) {
    let (cluster, proxies) = proxied_cluster();
    let name = "silent/watch";
    let holders = Client::new(Etcd::new(cluster.endpoints()));
    let holder_session = holders.session_with(steady()).await.expect("session");
    let before = started_everywhere(&cluster, "Watch");
    let guard = holder_session.mutex(name).expect("mutex").lock().await.expect("lock");
    // The holder's watch on its own entry: started before the counters
    // are read for the session under test.
    member_starting(&cluster, "Watch", &before).await;

    let mut tries = 0;
    let (_waiters, session, waiter, watch_member) = loop {
        tries += 1;
        assert!(tries <= 10, "the watch and the keepalive always shared a member");
        let keepalives = started_everywhere(&cluster, "LeaseKeepAlive");
        let watches = started_everywhere(&cluster, "Watch");
        let waiters = connect(&proxies);
        let session = waiters.session_with(quick()).await.expect("session");
        let keepalive_member = member_starting(&cluster, "LeaseKeepAlive", &keepalives).await;
        let mutex = session.mutex(name).expect("mutex");
        let waiter = spawn_queued(&waiters, async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
        .await;
        let watch_member = member_starting(&cluster, "Watch", &watches).await;
        if watch_member != keepalive_member {
            break (waiters, session, waiter, watch_member);
        }
        waiter.abort();
        let _ = waiter.await;
        session.close().await.expect("close");
    };

    let proxy = &proxies[watch_member];
    let frozen = current_connection(proxy);
    match silence {
        Silence::Both => proxy.freeze_connection(frozen),
        Silence::Answers => proxy.freeze_answers(frozen),
    }
    let released_at = Instant::now();
    guard.release().await.expect("release");
    let bound = settle_bound(&quick());
    let (granted_at, next) = match tokio::time::timeout(bound, waiter).await {
        Ok(joined) => joined.expect("task"),
        Err(_) => panic!(
            "the waiter was not granted within {bound:?} of the release: its watch stream's \
             connection went silent ({silence:?}) and nothing noticed"
        ),
    };
    let next = next.expect("the waiter is granted");
    println!(
        "watch flow silent ({silence:?}) on member {watch_member}: waiter granted {:?} after the \
         release (bound {bound:?}); client closed the silent connection: {}",
        granted_at - released_at,
        proxy.client_closed(frozen),
    );
    // Live, or back to live: a renewal slowed past a keepalive interval on
    // a busy machine suspends a session for a moment; one whose renewals
    // rode the silent connection would end `Lost`.
    let mut states = session.watch_state();
    let state = *bounded(
        "the waiter's session is live",
        states.wait_for(|s| matches!(s, SessionState::Live | SessionState::Lost | SessionState::Closed)),
    )
    .await
    .expect("the session's state");
    assert_eq!(state, SessionState::Live);
    // Without HTTP/2 keepalive the silent connection stays in the client's
    // rotation, and a request that lands on it fails after the request
    // timeout: thaw it before the release.
    proxy.thaw_connection(frozen);
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_watch_flow_costs_a_waiter_at_most_a_bound() {
    silent_watch_flow(through, Silence::Both).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_flow_that_loses_its_answers_costs_a_waiter_at_most_a_bound() {
    silent_watch_flow(through, Silence::Answers).await;
}

/// The same without HTTP/2 keepalive or a request timeout in the connect
/// options: the session's watch stream proves itself alive on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_watch_flow_without_http2_keepalive_costs_a_waiter_at_most_a_bound() {
    silent_watch_flow(bare, Silence::Both).await;
}

/// The probe costs a live stream nothing but its own round trip: a waiter
/// that waits quietly for several probe intervals (without HTTP/2
/// keepalive, so that only the watch stream's own probes run) keeps its one
/// watch stream, answered by the member each time, and is granted at once
/// on the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_watch_stream_on_a_live_connection_is_probed_not_replaced() {
    let (cluster, proxies) = proxied_cluster();
    let name = "quiet/watch";
    let holders = Client::new(Etcd::new(cluster.endpoints()));
    let holder_session = holders.session_with(steady()).await.expect("session");
    let before = started_everywhere(&cluster, "Watch");
    let guard = holder_session.mutex(name).expect("mutex").lock().await.expect("lock");
    // The holder's watch on its own entry: started before the counters
    // are read for the session under test.
    member_starting(&cluster, "Watch", &before).await;
    let watches = started_everywhere(&cluster, "Watch");
    let waiters = bare(&proxies);
    let session = waiters.session_with(quick()).await.expect("session");
    let mutex = session.mutex(name).expect("mutex");
    let waiter = spawn_queued(&waiters, async move { mutex.lock().await }).await;
    member_starting(&cluster, "Watch", &watches).await;
    let opened = started_everywhere(&cluster, "Watch");
    let wakeups = waiters.stats().wakeups;
    // A window, not an event: three probes go out and are answered in it.
    let options = quick();
    tokio::time::sleep(3 * (options.keepalive_interval() + options.request_timeout())).await;
    assert_eq!(
        started_everywhere(&cluster, "Watch"),
        opened,
        "a watch stream was opened again while the first was answering its probes"
    );
    assert_eq!(
        waiters.stats().wakeups,
        wakeups,
        "the waiter was woken without a release"
    );
    assert!(!waiter.is_finished());
    guard.release().await.expect("release");
    let next = bounded("the waiter is granted", waiter)
        .await
        .expect("task")
        .expect("lock");
    next.release().await.expect("release");
}

/// How a holder whose keepalive flow went silent ended.
enum Held {
    /// It renewed on another connection in time and kept its lock.
    Kept,
    /// It heard `lost()`.
    Lost,
}

/// A holder reaches the members through proxies, its keepalive stream on
/// one member's connection and its watch stream (on its own entry) on
/// another's; a waiter (direct) queues behind it. The keepalive's
/// connection alone goes silent. Returns how the holder ended, after
/// checking that nobody else was granted while it held, and that the waiter
/// is granted within TTL + a keepalive interval + the request timeout of the
/// holder's release or loss.
async fn silent_keepalive_flow(options: SessionOptions, silence: Silence) -> Held {
    let (cluster, proxies) = proxied_cluster();
    let name = "silent/keepalive";
    let mut tries = 0;
    let (holders, holder, guard, keepalive_member) = loop {
        tries += 1;
        assert!(tries <= 10, "the watch and the keepalive always shared a member");
        let keepalives = started_everywhere(&cluster, "LeaseKeepAlive");
        let watches = started_everywhere(&cluster, "Watch");
        let holders = through(&proxies);
        let holder = holders.session_with(options.clone()).await.expect("session");
        let keepalive_member = member_starting(&cluster, "LeaseKeepAlive", &keepalives).await;
        let guard = holder.mutex(name).expect("mutex").lock().await.expect("lock");
        let watch_member = member_starting(&cluster, "Watch", &watches).await;
        if watch_member != keepalive_member {
            break (holders, holder, guard, keepalive_member);
        }
        guard.release().await.expect("release");
        holder.close().await.expect("close");
    };
    let waiters = Client::new(Etcd::new(cluster.endpoints()));
    let waiter_session = waiters.session_with(steady()).await.expect("session");
    let mutex = waiter_session.mutex(name).expect("mutex");
    // What the holder's session said of itself when the waiter was granted:
    // the order of the two, as the library made it (its state is set
    // before anything it does about the loss), whenever the test's tasks
    // run.
    let holder_seen = holder.clone();
    let waiter = spawn_queued(&waiters, async move {
        let guard = mutex.lock().await;
        (Instant::now(), holder_seen.state(), guard)
    })
    .await;

    let proxy = &proxies[keepalive_member];
    let frozen = current_connection(proxy);
    let mut states = holder.watch_state();
    states.borrow_and_update();
    match silence {
        Silence::Both => proxy.freeze_connection(frozen),
        Silence::Answers => proxy.freeze_answers(frozen),
    }
    let silent_since = Instant::now();
    // The first renewal on the silent connection goes unanswered.
    bounded("the holder is suspended", states.wait_for(|s| *s != SessionState::Live))
        .await
        .expect("state");
    // Then it renews elsewhere in time, or it is lost.
    let state = *bounded(
        "the holder renews or is lost",
        states.wait_for(|s| matches!(s, SessionState::Live | SessionState::Lost)),
    )
    .await
    .expect("state");
    let held = if state == SessionState::Live {
        // Renewed on another connection: the lease lives on the server and
        // the lock is still the holder's, whom nobody replaced.
        let lease = i64::from_str_radix(holder.id(), 16).expect("hex lease id");
        let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .expect("side client");
        let left = side.lease_time_to_live(lease, None).await.expect("ttl").ttl();
        assert!(left > 0, "the renewed lease has no time left on the server");
        // A window, not an event: past the time the lease would have
        // expired unrenewed, the holder still holds and nobody else was
        // granted.
        tokio::time::sleep_until((silent_since + options.ttl() + Duration::from_secs(1)).into()).await;
        assert!(guard.is_held());
        assert!(!waiter.is_finished(), "someone else was granted while the holder held");
        guard.release().await.expect("release");
        Held::Kept
    } else {
        bounded("lost()", guard.lost()).await;
        assert!(!guard.is_held());
        assert!(matches!(guard.release().await, Err(Error::SessionLost { .. })));
        Held::Lost
    };
    let settled_at = Instant::now();
    let bound = settle_bound(&options);
    let (granted_at, holder_at_grant, next) = match tokio::time::timeout(bound, waiter).await {
        Ok(joined) => joined.expect("task"),
        Err(_) => panic!("the waiter was not granted within {bound:?} of the holder's release or loss"),
    };
    let next = next.expect("the waiter is granted");
    if let Held::Lost = held {
        assert_eq!(
            holder_at_grant,
            SessionState::Lost,
            "granted before the holder's session was lost"
        );
    }
    println!(
        "keepalive flow silent ({silence:?}) on member {keepalive_member}: holder {}, waiter granted {:?} after",
        if matches!(held, Held::Kept) {
            "kept its lock"
        } else {
            "lost"
        },
        granted_at - settled_at
    );
    next.release().await.expect("release");
    proxy.thaw_connection(frozen);
    drop(holders);
    held
}

/// With a request timeout well inside the loss deadline, a holder whose
/// keepalive flow goes silent renews on another connection in time and
/// keeps its lock; nobody else is granted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_keepalive_flow_is_replaced_in_time_and_the_holder_keeps_its_lock() {
    let held = silent_keepalive_flow(quick(), Silence::Both).await;
    assert!(matches!(held, Held::Kept), "the holder lost its lock");
}

/// The same when the renewals reach the member and only its answers are
/// lost (the lease is renewed on the server, the holder cannot tell): the
/// holder renews on another connection in time and keeps its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_flow_that_loses_its_answers_is_replaced_in_time_and_the_holder_keeps_its_lock() {
    let held = silent_keepalive_flow(quick(), Silence::Answers).await;
    assert!(matches!(held, Held::Kept), "the holder lost its lock");
}

/// With a request timeout longer than the loss deadline (the default 5 s
/// against a 4 s deadline), the renewal stuck on the silent flow cannot be
/// given up in time: the holder hears `lost()`, before the server can expire
/// its lease and before anyone else is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_keepalive_flow_past_the_loss_deadline_loses_the_holder_before_the_next_grant() {
    let held = silent_keepalive_flow(SessionOptions::new().with_ttl(Duration::from_secs(5)), Silence::Both).await;
    assert!(matches!(held, Held::Lost), "the holder kept its lock");
}
