//! A Redis restart (with its data: an append-only file, fsynced always)
//! shorter than the loss deadline is ridden out as etcd and ZooKeeper ride
//! out a member restart: the session goes `Suspended`, then `Live` again,
//! keeps every lock, and nobody else is granted meanwhile. A restart longer
//! than the deadline still ends in `Lost` before any other grant.

use std::time::{Duration, Instant};

use lockline::conformance::bounded;
use lockline::{Client, Session, SessionOptions, SessionState, Write};
use lockline_redis::Redis;
use lockline_testkit::{RedisOptions, RedisServer};
use redis::AsyncCommands;
use tokio::sync::watch;

mod support;

/// TTL 3 s: renewals every second, loss deadline 2.4 s.
fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(3))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(1))
}

/// The waiter's session in the short restart: TTL 8 s. Its renewals are
/// not lined up with the kill as the holder's are (the last one may have
/// been a whole interval before it), and with the holder's TTL its loss
/// deadline could fall a few hundred ms after the restart, within the time
/// a loaded machine takes to start the server again and reconnect.
fn waiter_options() -> SessionOptions {
    options().with_ttl(Duration::from_secs(8))
}

fn persistent() -> RedisServer {
    RedisServer::start_with(&RedisOptions {
        append_only: true,
        ..RedisOptions::default()
    })
    .expect("start redis")
}

/// Every state the session goes through, as it goes through them.
fn record(session: &Session) -> watch::Receiver<Vec<SessionState>> {
    let (log, seen) = watch::channel(vec![session.state()]);
    let mut states = session.watch_state();
    tokio::spawn(async move {
        while states.changed().await.is_ok() {
            let state = *states.borrow_and_update();
            log.send_modify(|seen| seen.push(state));
        }
    });
    seen
}

fn states(seen: &watch::Receiver<Vec<SessionState>>) -> Vec<SessionState> {
    seen.borrow().clone()
}

/// Whether `seen` went `Suspended`, then `Live` again.
fn suspended_then_live(seen: &[SessionState]) -> bool {
    seen.iter()
        .position(|s| *s == SessionState::Suspended)
        .is_some_and(|at| seen[at..].contains(&SessionState::Live))
}

/// Kills the server, leaves it down for `outage` (the fault's length: there
/// is no event to await), and starts it again on the same port with its data.
fn restart(server: &mut RedisServer, outage: Duration) {
    server.member().kill().expect("kill redis");
    std::thread::sleep(outage);
    server.restart().expect("restart redis");
}

/// Down for 1.2 s, half the loss deadline: the holder keeps both locks,
/// `Suspended` then `Live`, its lock is never reported lost, the other
/// client's waiter stays waiting (its own session rides out the restart too)
/// and is woken by the release itself (its subscription made again), and a
/// fenced write after the restart lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_shorter_than_the_loss_deadline_keeps_every_lock() {
    let mut server = persistent();
    let holder_client = Client::new(Redis::new(server.url()));
    let waiter_client = Client::new(Redis::new(server.url()));
    let holder = holder_client.session_with(options()).await.expect("session");
    let other = waiter_client.session_with(waiter_options()).await.expect("session");
    let held = holder.mutex("ride/a").expect("mutex").lock().await.expect("lock");
    let also = holder.mutex("ride/b").expect("mutex").lock().await.expect("lock");
    let waiter = {
        let mutex = other.mutex("ride/a").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    lockline::conformance::wait_for_stats(&waiter_client, |s| s.waits >= 1).await;
    let holder_states = record(&holder);
    let other_states = record(&other);

    // Killed just after a renewal: the next one, a keepalive interval later,
    // falls in the outage; the loss deadline is 2.4 s after the renewal.
    let outage = options().loss_deadline() / 2;
    support::renewed(&mut support::side(&server.url()).await, held.key()).await;
    tokio::task::block_in_place(|| restart(&mut server, outage));

    // Suspended while the server was away, Live again once a renewal on a
    // new connection was confirmed.
    let mut watch = holder_states.clone();
    let seen = bounded(
        "the holder's session is live again",
        watch.wait_for(|seen| seen.contains(&SessionState::Lost) || suspended_then_live(seen)),
    )
    .await
    .expect("the recorder")
    .clone();
    assert!(
        !seen.contains(&SessionState::Lost) && suspended_then_live(&seen),
        "the holder's session was lost across a short restart: {seen:?}"
    );
    assert!(held.is_held() && also.is_held(), "a lock the server kept was let go");

    // A fenced write after the restart lands.
    held.write_if_held([Write::put("ride/state", "after the restart")])
        .await
        .expect("a fenced write after the restart");
    let mut side = support::side(&server.url()).await;
    let written: Option<String> = side.get("ride/state").await.expect("get");
    assert_eq!(written.as_deref(), Some("after the restart"));

    // Past the loss deadline counted from before the outage: still held,
    // nobody else granted, the waiter's session alive too.
    // Another renewal after that.
    support::renewed(&mut side, held.key()).await;
    if waiter.is_finished() {
        let (_, outcome) = waiter.await.expect("task");
        panic!(
            "the waiter's lock() ended while the lock was held: {:?}",
            outcome.map(|granted| granted.token())
        );
    }
    assert_eq!(holder.state(), SessionState::Live);
    assert_eq!(
        other.state(),
        SessionState::Live,
        "the waiter's session: {:?}",
        states(&other_states)
    );
    assert!(
        !states(&holder_states).contains(&SessionState::Lost),
        "{:?}",
        states(&holder_states)
    );
    assert!(held.is_held() && also.is_held());

    // The release wakes the waiter through its (re-made) subscription, well
    // before the entry's TTL (2-3 s) would have.
    let token = held.token();
    let released_at = Instant::now();
    held.release().await.expect("release");
    let (granted_at, granted) = bounded("the waiter is granted", waiter).await.expect("task");
    let granted = granted.expect("lock");
    assert!(
        granted_at - released_at < Duration::from_secs(1),
        "the waiter was granted {:?} after the release: its subscription was not made again",
        granted_at - released_at
    );
    assert!(granted.token() > token);
    granted.release().await.expect("release");
    also.release().await.expect("release");
    assert!(!states(&holder_states).contains(&SessionState::Lost));
}

/// Down for longer than the TTL: the holder is told its lock is lost (its
/// session `Suspended`, then `Lost`) before anyone else is granted it. The
/// waiter's session could not renew either: it is lost too, and its wait
/// fails; a new session after the restart is granted, after the holder heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_longer_than_the_loss_deadline_is_lost_before_any_other_grant() {
    let mut server = persistent();
    let holder_client = Client::new(Redis::new(server.url()));
    let waiter_client = Client::new(Redis::new(server.url()));
    let holder = holder_client.session_with(options()).await.expect("session");
    let other = waiter_client.session_with(options()).await.expect("session");
    let held = holder.mutex("long").expect("mutex").lock().await.expect("lock");
    let waiter = {
        let mutex = other.mutex("long").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&waiter_client, |s| s.waits >= 1).await;
    let holder_states = record(&holder);
    let lost = tokio::spawn(async move {
        held.lost().await;
        Instant::now()
    });

    let outage = options().ttl() + Duration::from_millis(500);
    tokio::task::block_in_place(|| restart(&mut server, outage));

    let lost_at = bounded("the holder hears of it", lost).await.expect("task");
    assert_eq!(holder.state(), SessionState::Lost);
    let seen = states(&holder_states);
    let suspended = seen.iter().position(|s| *s == SessionState::Suspended);
    let lost = seen.iter().position(|s| *s == SessionState::Lost);
    assert!(
        suspended.is_some() && suspended < lost,
        "not suspended before it was lost: {seen:?}"
    );
    match bounded("the waiter fails", waiter).await.expect("task") {
        Err(lockline::Error::SessionLost { .. }) => {}
        other => panic!("the waiter's session could not renew either; got {other:?}"),
    }
    let fresh = waiter_client.session_with(options()).await.expect("a new session");
    let guard = bounded("a new contender is granted", fresh.mutex("long").expect("mutex").lock())
        .await
        .expect("lock");
    let granted_at = Instant::now();
    assert!(
        lost_at <= granted_at,
        "granted {:?} before the holder was told",
        lost_at - granted_at
    );
    guard.release().await.expect("release");
}

/// A read right after a restart, before the session's next renewal: the
/// command connection the restart closed is made again for it, and the
/// read is answered instead of failing on the closed one (a listing of a
/// lock's queue here). Renewals are 10 s apart (TTL 30 s), so none comes
/// between the restart and the read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_right_after_a_restart_is_answered() {
    let mut server = persistent();
    let client = Client::new(Redis::new(server.url()));
    let session = client
        .session_with(options().with_ttl(Duration::from_secs(30)))
        .await
        .expect("session");
    let mutex = session.mutex("restart/read").expect("mutex");
    // The command connection is made and used.
    let held = mutex.lock().await.expect("lock");
    let seen = record(&session);

    tokio::task::block_in_place(|| restart(&mut server, Duration::from_millis(200)));

    let listed = bounded("a read after the restart", mutex.contenders())
        .await
        .expect("a read right after the restart");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key, held.key());
    held.release().await.expect("release");
    assert!(!states(&seen).contains(&SessionState::Lost), "{:?}", states(&seen));
}
