//! `Sql::with_reset_grace`: a holder whose connection is reset hears
//! `lost()` before the next grant, and a cut-off holder is outlived.

use super::*;

on_both!(
    with_the_reset_grace_a_holder_whose_connection_is_reset_hears_lost_first,
    with_the_reset_grace_a_cut_off_holder_is_outlived,
);

/// With `Sql::with_reset_grace`: the connection that holds a live holder's
/// lock is ended by the server (an administrator's terminate, a reset), which
/// frees the lock at once; the waiter goes past it only once the holder has
/// heard `lost()` and ended its session (at its next heartbeat).
async fn with_the_reset_grace_a_holder_whose_connection_is_reset_hears_lost_first(db: Db) {
    let url = db.url();
    let holders = Client::new(Sql::new(url.clone()));
    let waiters = Client::new(Sql::new(url).with_reset_grace());
    // Long enough that a loaded machine does not starve the holder's
    // renewals before its waiter queues (the waiter would then be granted
    // at once, and never wait).
    let ttl_ms = 6000;
    let ttl = Duration::from_millis(ttl_ms);
    let holder = holders.session_with(options(ttl_ms)).await.expect("session");
    let held = holder.mutex("reset").expect("mutex").lock().await.expect("lock");
    let waiter_session = waiters.session_with(options(ttl_ms)).await.expect("session");
    let waiter = timed_waiter(&waiters, &waiter_session, "reset").await;
    let id = holder.id().to_owned();
    if db.is_postgres() {
        db.sql(&format!(
            "SELECT pg_terminate_backend(pid) FROM lockline_sessions WHERE id = '{id}'"
        ));
    } else {
        let conn = db.sql(&format!("SELECT conn FROM lockline_sessions WHERE id = '{id}'"));
        db.sql(&format!("KILL CONNECTION {}", conn.trim()));
    }
    let reset_at = Instant::now();
    bounded("the holder hears of it", held.lost()).await;
    let lost_at = Instant::now();
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        lost_at <= granted_at,
        "with the reset grace the next holder was granted {:?} before the reset holder was told",
        lost_at - granted_at
    );
    let took = granted_at - reset_at;
    assert!(
        took < ttl,
        "the next holder was granted {took:?} after the reset (TTL {ttl:?}): the holder ends its session at its next heartbeat"
    );
    guard.release().await.expect("release");
}

/// With `Sql::with_reset_grace`: every connection of a holder is reset and
/// new ones refused (a crash or a partition that resets), so it can neither
/// renew nor end its session: the waiter goes past it once its heartbeat
/// has stood still for its TTL, after the holder's `lost()`.
async fn with_the_reset_grace_a_cut_off_holder_is_outlived(db: Db) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let far = Client::new(Sql::new(db.url_via(&proxy.address())));
    let waiters = Client::new(Sql::new(db.url()).with_reset_grace());
    // Long enough that a loaded machine's holder still holds when the
    // waiter queues and is not late on its last heartbeat before the cut.
    let ttl = 4000;
    let holder = far.session_with(options(ttl)).await.expect("session");
    let held = holder.mutex("cut").expect("mutex").lock().await.expect("lock");
    let waiter_session = waiters.session_with(options(ttl)).await.expect("session");
    let waiter = timed_waiter(&waiters, &waiter_session, "cut").await;
    // Cut right after a heartbeat of the holder: the TTL the waiter counts
    // then starts at the cut, however late a loaded machine's heartbeats.
    let beat_of = || {
        db.count(&format!(
            "SELECT beat FROM lockline_sessions WHERE id = '{}'",
            holder.id()
        ))
    };
    let beat = beat_of();
    until("a heartbeat of the holder", || beat_of() > beat).await;
    let cut_at = Instant::now();
    proxy.block();
    bounded("the holder hears of it", held.lost()).await;
    let lost_at = Instant::now();
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        lost_at <= granted_at,
        "with the reset grace the next holder was granted {:?} before the cut-off holder was told",
        lost_at - granted_at
    );
    let took = granted_at - cut_at;
    assert!(
        took >= Duration::from_millis(ttl) - Duration::from_millis(ttl / 3),
        "granted {took:?} after the cut: the reset holder was not outlived"
    );
    guard.release().await.expect("release");
    proxy.unblock();
}
