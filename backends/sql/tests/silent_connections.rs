//! One connection of a session goes silent while the others flow — what a
//! NAT gateway, a conntrack table or a cloud load balancer does to a flow
//! that sits idle (packets dropped, nothing reset) — on PostgreSQL and on
//! MariaDB. A session of the SQL backend lives on several connections: the
//! one that holds its guards (opened first), its control connection
//! (second), and wait connections (then). Each case freezes exactly one of
//! them through a proxy and checks that no queue freezes, that a holder
//! hears `lost()` before anyone else is granted, and that the next
//! contender is granted within TTL + a keepalive interval + the request
//! timeout.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, until};
use lockline::{Client, Error, Session, SessionOptions, SessionState};
use lockline_sql::Sql;
use lockline_testkit::TcpProxy;

#[macro_use]
mod support;

use support::db::Db;

/// The connection that holds the session's guards: the first it opens.
const GUARD: usize = 0;
/// The session's control connection (heartbeats): the second.
const CONTROL: usize = 1;
/// The session's first wait connection: the third.
const FIRST_WAIT: usize = 2;

/// Short enough that the silences below are judged within seconds, long
/// enough that a session on a machine kept busy (the suite runs several
/// test binaries at once beside two CPU hogs) keeps renewing: at 2 s, a
/// waiter's session was lost to starvation before it queued.
const TTL_MS: u64 = 4000;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_millis(TTL_MS))
        .with_connect_timeout(Duration::from_secs(5))
        .with_request_timeout(REQUEST_TIMEOUT)
}

/// The bound the issue of a silent connection must be settled within: TTL +
/// a keepalive interval + the request timeout, and three seconds of slack
/// for a busy machine (a MariaDB waiter beside two CPU hogs and the suite's
/// builds has been seen granted 2.0 s past the bound without its slack).
fn settle_bound(options: &SessionOptions) -> Duration {
    options.ttl() + options.keepalive_interval() + options.request_timeout() + Duration::from_secs(3)
}

on_both!(
    a_silent_guard_connection_loses_its_holder_before_the_next_grant,
    a_release_on_a_silent_guard_connection_fails_and_frees_the_lock,
    an_acquire_whose_answer_is_lost_does_not_block_the_queue,
    a_silent_control_connection_is_replaced_and_the_holder_keeps_its_lock,
    a_silent_wait_connection_is_replaced_and_the_queue_moves,
    a_step_of_the_database_clock_decides_nothing,
);

/// A client of its own whose every connection goes through `proxy`.
fn proxied(db: &Db, proxy: &TcpProxy) -> Client {
    Client::new(Sql::new(db.url_via(&proxy.address())))
}

/// A proxy in front of the database, a client whose every connection goes
/// through it, and a client that connects directly.
fn far_and_near(db: &Db) -> (TcpProxy, Client, Client) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = proxied(db, &proxy);
    (proxy, far, Client::new(Sql::new(db.url())))
}

/// The waiter behind a session whose guard connection went silent at
/// `frozen_at` is granted within the bound, after that session was lost.
async fn granted_past_a_silent_session(
    waiter: tokio::task::JoinHandle<lockline::Result<lockline::MutexGuard>>,
    frozen_at: Instant,
    silent: &Session,
) {
    let guard = bounded("the waiter is granted", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(
        frozen_at.elapsed() < settle_bound(&options()),
        "the waiter was granted {:?} after the guard connection went silent",
        frozen_at.elapsed()
    );
    assert_eq!(silent.state(), SessionState::Lost);
    guard.release().await.expect("release");
}

/// Waits until the proxy has accepted connection `number`.
async fn accepted(proxy: &TcpProxy, number: usize) {
    lockline::conformance::until("the proxy accepts the connection", || {
        proxy.connections_accepted() > number
    })
    .await;
}

/// A holder whose guard connection alone goes silent while its control
/// connection keeps renewing: the server still sees both connections, so
/// nobody else can end the session. The holder proves its guard connection
/// alive every keepalive interval, hears nothing, declares itself lost and
/// ends the session from a fresh connection; the waiter is then granted.
async fn a_silent_guard_connection_loses_its_holder_before_the_next_grant(db: Db) {
    let (proxy, far, near) = far_and_near(&db);
    let holder_session = far.session_with(options()).await.expect("session");
    let held = holder_session
        .mutex("guard")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let other = near.session_with(options()).await.expect("session");
    let waiter = {
        let mutex = other.mutex("guard").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    bounded("the waiter queues", near.wait_for_stats(|s| s.waits >= 1)).await;
    let frozen_at = Instant::now();
    proxy.freeze_connection(GUARD);
    bounded("the holder hears of it", held.lost()).await;
    let lost_at = Instant::now();
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        lost_at <= granted_at,
        "the next holder was granted {:?} before the holder was told",
        lost_at - granted_at
    );
    let took = granted_at - frozen_at;
    assert!(
        took < settle_bound(&options()),
        "the next holder was granted {took:?} after the guard connection went silent"
    );
    assert!(guard.token() > held.token());
    assert_eq!(holder_session.state(), SessionState::Lost);
    guard.release().await.expect("release");
    proxy.thaw_connection(GUARD);
}

/// A release sent on a guard connection that has gone silent is not
/// retried for as long as the session lives: it fails (never `Ok`), the
/// session is lost and ended, and the waiter behind it is granted.
async fn a_release_on_a_silent_guard_connection_fails_and_frees_the_lock(db: Db) {
    let (proxy, far, near) = far_and_near(&db);
    let holder_session = far.session_with(options()).await.expect("session");
    let held = holder_session
        .mutex("release")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let other = near.session_with(options()).await.expect("session");
    let waiter = {
        let mutex = other.mutex("release").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    bounded("the waiter queues", near.wait_for_stats(|s| s.waits >= 1)).await;
    proxy.freeze_connection(GUARD);
    let frozen_at = Instant::now();
    let released = bounded("the release returns", held.release()).await;
    assert!(
        matches!(
            released,
            Err(Error::Unavailable { .. } | Error::LockLost { .. } | Error::SessionLost { .. })
        ),
        "a release on a silent connection answered {released:?}"
    );
    granted_past_a_silent_session(waiter, frozen_at, &holder_session).await;
    proxy.thaw_connection(GUARD);
}

/// An acquire whose request reached the server (its entry appended at the
/// head, its guard taken) but whose answer never came back: the acquire
/// fails, the session is lost and ended, and its entry does not stand at
/// the head of the queue for ever.
async fn an_acquire_whose_answer_is_lost_does_not_block_the_queue(db: Db) {
    let (proxy, far, near) = far_and_near(&db);
    let session = far.session_with(options()).await.expect("session");
    let mutex = session.mutex("answer").expect("mutex");
    proxy.freeze_answers(GUARD);
    let frozen_at = Instant::now();
    let acquire = tokio::spawn(async move { mutex.lock().await });
    // The entry reaches the server: a contender behind it waits.
    let other = near.session_with(options()).await.expect("session");
    let waiter = {
        let mutex = other.mutex("answer").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    let acquired = bounded("the acquire returns", acquire).await.expect("task");
    assert!(acquired.is_err(), "an acquire with no answer returned {acquired:?}");
    granted_past_a_silent_session(waiter, frozen_at, &session).await;
    proxy.thaw_connection(GUARD);
}

/// A holder whose control connection alone goes silent, with default
/// options: the stuck renewal is given up in time and a fresh control
/// connection renews before the loss deadline, so the holder keeps its
/// lock (and nobody else is granted it).
async fn a_silent_control_connection_is_replaced_and_the_holder_keeps_its_lock(db: Db) {
    let (proxy, far, near) = far_and_near(&db);
    let defaults = SessionOptions::default();
    let session = far.session_with(defaults.clone()).await.expect("session");
    let held = session.mutex("control").expect("mutex").lock().await.expect("lock");
    accepted(&proxy, CONTROL).await;
    proxy.freeze_connection(CONTROL);
    let replaced = CONTROL + 1;
    bounded("a fresh control connection is opened", accepted(&proxy, replaced)).await;
    // Over two loss deadlines: the lock would have been lost by now if
    // the fresh connection had not renewed in time.
    let watch = defaults.loss_deadline() * 2;
    let lost = tokio::time::timeout(watch, held.lost()).await;
    assert!(
        lost.is_err(),
        "the holder lost its lock although only its control connection went silent"
    );
    assert!(held.is_held());
    assert_eq!(session.state(), SessionState::Live);
    let other = near.session().await.expect("session");
    let taken = other
        .mutex("control")
        .expect("mutex")
        .try_lock()
        .await
        .expect("try_lock");
    assert!(taken.is_none(), "another session was granted a lock still held");
    held.release().await.expect("release");
    proxy.thaw_connection(CONTROL);
}

/// A waiter whose wait connection goes silent during its server-side wait
/// never hears the release over it; it gives the connection up after the
/// wait's bound and the request timeout, waits again on a fresh one, and is
/// granted — the queue does not freeze behind it.
async fn a_silent_wait_connection_is_replaced_and_the_queue_moves(db: Db) {
    let (proxy, far, near) = far_and_near(&db);
    let holder_session = near.session_with(options()).await.expect("session");
    let held = holder_session.mutex("wait").expect("mutex").lock().await.expect("lock");
    let waiter_session = far.session_with(options()).await.expect("session");
    let waiter = {
        let mutex = waiter_session.mutex("wait").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    bounded("the waiter queues", far.wait_for_stats(|s| s.waits >= 1)).await;
    accepted(&proxy, FIRST_WAIT).await;
    proxy.freeze_connection(FIRST_WAIT);
    held.release().await.expect("release");
    let released_at = Instant::now();
    let guard = bounded("the waiter is granted", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(
        released_at.elapsed() < settle_bound(&options()),
        "the waiter was granted {:?} after the release",
        released_at.elapsed()
    );
    assert_eq!(waiter_session.state(), SessionState::Live);
    guard.release().await.expect("release");
    proxy.thaw_connection(FIRST_WAIT);
}

/// A step of the database server's clock (NTP, a VM migration), as the
/// session rows see it: every heartbeat stamp suddenly 60 s behind the
/// server's clock (a step forward) — the holder is healthy and renewing,
/// so it keeps its lock and the waiter is not granted; and 60 s ahead (a
/// step back) for a holder that went silent — it is still ended on time.
/// No wall clock decides: a waiter judges an owner by its own clock.
async fn a_step_of_the_database_clock_decides_nothing(db: Db) {
    let client = Client::new(Sql::new(db.url()));
    let holder = client.session_with(options()).await.expect("session");
    let held = holder.mutex("clock").expect("mutex").lock().await.expect("lock");
    let waiter_session = client.session_with(options()).await.expect("session");
    let waiter = {
        let mutex = waiter_session.mutex("clock").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    bounded("the waiter queues", client.wait_for_stats(|s| s.waits >= 1)).await;
    let stamps = |shift_s: i64, session: &str| {
        format!("UPDATE lockline_sessions SET renewed_us = renewed_us + {shift_s} * 1000000 WHERE id = '{session}'")
    };
    db.sql(&stamps(-60, holder.id()));
    // Three TTLs: a waiter that trusted the stamps would have ended the
    // healthy holder at once.
    let watch = options().ttl() * 3;
    let lost = tokio::time::timeout(watch, held.lost()).await;
    assert!(
        lost.is_err(),
        "a healthy holder lost its lock to a step of the database's clock"
    );
    assert!(!waiter.is_finished(), "the waiter was granted a lock still held");
    held.release().await.expect("release");
    let guard = bounded("the waiter is granted", waiter)
        .await
        .expect("task")
        .expect("lock");
    // Now the holder goes silent with its stamp 60 s ahead.
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = proxied(&db, &proxy);
    let silent = far.session_with(options()).await.expect("session");
    guard.release().await.expect("release");
    let silent_guard = silent.mutex("clock").expect("mutex").lock().await.expect("lock");
    let next = {
        let mutex = waiter_session.mutex("clock").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    bounded("the waiter queues", client.wait_for_stats(|s| s.waits >= 2)).await;
    proxy.blackhole();
    db.sql(&stamps(60, silent.id()));
    let cut_at = Instant::now();
    let guard = bounded("the next contender is granted", next)
        .await
        .expect("task")
        .expect("lock");
    assert!(
        cut_at.elapsed() < settle_bound(&options()),
        "a silent holder whose stamp was 60 s ahead was ended {:?} after it went silent",
        cut_at.elapsed()
    );
    assert!(!silent_guard.is_held());
    guard.release().await.expect("release");
    proxy.heal();
}

/// The timers of the established TCP connections whose local port is `port`
/// (the server's side of its clients' connections), from `/proc/net/tcp`:
/// (timer kind, ticks until it fires); kind 2 is the keepalive timer, ticks
/// are hundredths of a second.
fn server_side_timers(port: u16) -> Vec<(u8, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
            // 01: ESTABLISHED.
            if local_port != port || *fields.get(3)? != "01" {
                return None;
            }
            let (kind, when) = fields.get(5)?.split_once(':')?;
            Some((kind.parse().ok()?, u64::from_str_radix(when, 16).ok()?))
        })
        .collect()
}

/// The second line of defence: PostgreSQL probes each of a session's
/// connections once it has been idle for a keepalive interval (its own
/// default waits two hours), so that a server whose client vanished without
/// a word ends the connection and frees its guards and slot — only after the
/// client's own bounds have declared the session lost (a unit test checks
/// the arithmetic). Read from the kernel's table of the server's sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_probes_an_idle_connection_within_a_keepalive_interval() {
    let server = support::postgres();
    let client = Client::new(Sql::new(server.url()));
    let session = bounded("open a session", client.session_with(options()))
        .await
        .expect("session");
    let mutex = session.mutex("probed").expect("mutex");
    let guard = bounded("lock", mutex.lock()).await.expect("lock");
    // A connection whose last segment awaits its acknowledgement shows its
    // retransmission timer for that moment: read until each shows its
    // keepalive timer, no further than a keepalive interval (whole seconds,
    // at least one: 200 ticks with this TTL) away. PostgreSQL's own default
    // would be two hours.
    let probed =
        |timers: &[(u8, u64)]| timers.len() >= 2 && timers.iter().all(|&(kind, ticks)| kind == 2 && ticks <= 200);
    until(
        "every connection of the session is probed within a keepalive interval",
        || probed(&server_side_timers(server.port())),
    )
    .await;
    assert_eq!(session.state(), SessionState::Live, "the session lives on");
    bounded("release", guard.release()).await.expect("release");
    bounded("close", session.close()).await.expect("close");
}
