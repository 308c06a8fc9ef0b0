//! Lock-delay with real departures (a killed process, a silent cut, a
//! clean release or close), and a predecessor gone before the wait's watch
//! on it began.

use super::*;

/// Set in the child process of
/// `a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only`: the
/// endpoints it takes its lock on.
const DELAY_CHILD: &str = "LOCKLINE_TEST_LOCK_DELAY_CHILD";

/// Lock-delay with real departures: a lock-delayed waiter behind
/// a holder process killed outright, or a holder silently cut off (a proxy
/// that drops every packet), is granted no sooner than the server's removal
/// of the holder's key (at its lease's TTL after the last renewal the server
/// received, at most one keepalive interval before the kill or the cut) and
/// the lock-delay after it; behind a clean release or close, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only() {
    if let Ok(endpoints) = std::env::var(DELAY_CHILD) {
        // The child: take the lock, say so, and hold it until killed.
        let session = Client::new(Etcd::new(endpoints.split(',').map(str::to_owned)))
            .session_with(options(2))
            .await
            .expect("session");
        let guard = session
            .mutex("delay/killed")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        println!("held {}", guard.key());
        std::future::pending::<()>().await;
    }
    let delay = Duration::from_secs(2);
    let ttl = Duration::from_secs(2);
    // The server removes a key no sooner than this after the kill or cut.
    let removal = ttl - options(2).keepalive_interval();
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let waiting = client
        .session_with(options(2).with_lock_delay(delay))
        .await
        .expect("session");
    let granted = |name: &str| {
        let mutex = waiting.mutex(name).expect("mutex");
        async move {
            let guard = mutex.lock().await;
            (tokio::time::Instant::now(), guard)
        }
    };

    // A holder process killed outright.
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"));
    child
        .args([
            "--exact",
            "lock_delay::a_lock_delay_holds_back_after_a_killed_or_cut_off_holder_only",
            "--nocapture",
        ])
        .env(DELAY_CHILD, cluster.endpoints().join(","));
    let mut holder = lockline_testkit::LineChild::spawn(child).expect("start the holder process");
    loop {
        match holder.line(Duration::from_secs(30)) {
            Some(line) if line.starts_with("held delay/killed/") => break,
            Some(_) => {}
            None => panic!("the holder process never said it held the lock"),
        }
    }
    let waiter = spawn_queued(&client, granted("delay/killed")).await;
    let killed_at = tokio::time::Instant::now();
    holder.signal_and_wait(libc::SIGKILL).expect("kill the holder");
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(
        at - killed_at >= removal + delay,
        "granted {:?} after the kill: the server's removal (≥ {removal:?}) and the lock-delay ({delay:?}) had not both passed",
        at - killed_at
    );
    assert_eq!(client.stats().lock_delays, 1, "{:?}", client.stats());
    guard.expect("lock").release().await.expect("release");

    // A holder cut off silently: its key goes at its lease's TTL, then the
    // lock-delay.
    let (proxy, _far, cut) = through_a_proxy(&cluster, options(2)).await;
    let held = cut.mutex("delay/cut").expect("mutex").lock().await.expect("lock");
    let waiter = spawn_queued(&client, granted("delay/cut")).await;
    let cut_at = tokio::time::Instant::now();
    proxy.blackhole();
    bounded("the holder hears of it", held.lost()).await;
    let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    assert!(
        at - cut_at >= removal + delay,
        "granted {:?} after the cut: the server's removal (≥ {removal:?}) and the lock-delay ({delay:?}) had not both passed",
        at - cut_at
    );
    assert_eq!(client.stats().lock_delays, 2, "{:?}", client.stats());
    let guard = guard.expect("lock");
    assert!(guard.token() > held.token());
    guard.release().await.expect("release");
    proxy.heal();
    drop(cut);

    // A clean release, then a clean close: handed on at once.
    for close in [false, true] {
        let name = format!("delay/clean-{close}");
        let releasing = Client::new(Etcd::new(cluster.endpoints()))
            .session_with(options(2))
            .await
            .expect("session");
        let holder = releasing.mutex(&name).expect("mutex").lock().await.expect("lock");
        let waiter = spawn_queued(&client, granted(&name)).await;
        let released_at = tokio::time::Instant::now();
        if close {
            releasing.close().await.expect("close");
        } else {
            holder.release().await.expect("release");
        }
        let (at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
        assert!(
            at - released_at < delay,
            "a clean {} was held back: granted {:?} after it",
            if close { "close" } else { "release" },
            at - released_at
        );
        guard.expect("lock").release().await.expect("release");
    }
    assert_eq!(
        client.stats().lock_delays,
        2,
        "a lock-delay began after a clean hand-over"
    );
}

/// The race a lock-delayed waiter's wait can lose: its predecessor goes
/// between the read that showed it and the start of the watch on it, so the
/// watch never sees the deletion. Its revision is replayed from the server's
/// history, and the hand-over markers still tell a release and a close from
/// a revoked lease; a release whose history is compacted away before the
/// read counts as a loss (a lock-delay at worst), and the read still
/// succeeds. Driven step by step through the backend session, so
/// that the deletion falls in that window every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_predecessor_gone_before_the_watch_began_still_tells_release_from_loss() {
    use lockline::backend::{AppendRequest, Conflicts, Departure, Earlier, EntryKind};
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let waiting = client
        .session_with(options(5).with_lock_delay(Duration::from_secs(5)))
        .await
        .expect("session");
    let remote = waiting.backend_session();
    for (round, ending) in ["release", "close", "revoke", "compacted"].into_iter().enumerate() {
        let name = format!("delay/early-{ending}");
        let holding = client.session_with(options(5)).await.expect("session");
        let held = holding.mutex(&name).expect("mutex").lock().await.expect("lock");
        let attempt = format!("race{round}");
        let request = AppendRequest {
            dir: &name,
            kind: EntryKind::Mutex,
            attempt: &attempt,
            value: b"",
            conflicts: Conflicts::All,
            nearest: 1,
        };
        let appended = remote.append(&request).await.expect("append");
        let mine = appended.entry;
        let before = appended.nearest.expect("the nearest entry, read with the append");
        assert_eq!(before.len(), 1, "{before:?}");
        let predecessor = before[0].clone();
        assert_eq!(predecessor.key, held.key());
        // Gone after that read, before any watch on it.
        match ending {
            "close" => holding.close().await.expect("close"),
            "revoke" => revoke(&cluster, &holding).await,
            _ => held.release().await.expect("release"),
        }
        bounded("the wait ends", remote.wait_gone(&predecessor))
            .await
            .expect("wait");
        if ending == "compacted" {
            let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
                .await
                .expect("side client");
            let now = side
                .get("x", None)
                .await
                .expect("read")
                .header()
                .expect("header")
                .revision();
            side.compact(now, None).await.expect("compact");
        }
        let read = bounded("the read after it", remote.earlier(&mine, Conflicts::All, 1))
            .await
            .expect("read");
        assert_eq!(read, Earlier::Entries(Vec::new()), "{ending}");
        let departure = remote.departure(&predecessor);
        match ending {
            "revoke" | "compacted" => assert!(matches!(departure, Departure::Lost { .. }), "{ending}: {departure:?}"),
            _ => assert_eq!(departure, Departure::Released, "a clean {ending}"),
        }
        assert!(remote.remove(&mine).await.expect("remove"));
    }
}
