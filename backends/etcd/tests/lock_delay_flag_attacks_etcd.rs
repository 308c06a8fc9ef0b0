//! Attacks on the pay-per-use hand-over marker: a release writes its marker
//! only while a lock-delayed contender's flag is on the lock, and a waiter
//! reads the marker as of the deletion it saw. Each case is one where the
//! flags come and go (a lock-delayed waiter lost while another waits), where
//! someone without a lock-delay sits between, where one marker stands for
//! several locks (a marker prefix, a namespace), where the holder's marker
//! was written by an earlier release, or where the recipe is an election:
//! an involuntary loss must never grant early, a clean release must never
//! hold back, and without lock-delay nothing lies beside the lock at any
//! revision.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued, until};
use lockline::{Client, Error, SessionOptions};
use lockline_etcd::etcd_client::GetOptions;
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

mod support;

use support::{lock, new_client, queue, queue_timed, revision, revoke, session, side};

const DELAY: Duration = Duration::from_secs(2);

fn options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(30))
}

fn delayed() -> SessionOptions {
    options().with_lock_delay(DELAY)
}

/// A lock-delayed waiter W1 queued behind a holder, and a second one W2
/// behind W1. W1's lease is revoked while it waits: its flag goes with it,
/// and W2's own flag must still make the holder's release write its marker
/// (a clean release grants W2 at once) while the holder's own loss still
/// holds W2 back for its delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delayed_waiter_lost_while_another_waits_leaves_it_protected() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut side = side(&cluster).await;
    let holders = new_client(&cluster);
    let first = new_client(&cluster);
    let second = new_client(&cluster);
    for holder_lost in [false, true] {
        let name = if holder_lost { "flags/lost" } else { "flags/released" };
        let holder = session(&holders, options()).await;
        let guard = lock(&holder, name).await;
        let w1 = session(&first, delayed()).await;
        let q1 = queue(&first, &w1, name).await;
        let w2 = session(&second, delayed()).await;
        let q2 = queue_timed(&second, &w2, name).await;
        let waits = second.stats().waits;
        revoke(&mut side, &w1).await;
        // W2 hears W1 go and waits on the holder before the holder goes:
        // two departures before one read are held back whatever they were.
        bounded("W2 waits on the holder", second.wait_for_stats(|s| s.waits > waits)).await;
        assert!(
            bounded("the lost waiter's acquire ends", q1)
                .await
                .expect("task")
                .is_err(),
            "a waiter whose lease was revoked was granted"
        );
        let flags = side
            .get(
                format!("{name}\0lockline/lock-delay-"),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .expect("get")
            .count();
        assert_eq!(flags, 1, "W2's flag alone should be left on {name}");
        let delays_before = second.stats().lock_delays;
        let ended = Instant::now();
        let mut kept = None;
        if holder_lost {
            kept = Some(guard);
            revoke(&mut side, &holder).await;
        } else {
            guard.release().await.expect("release");
        }
        let (at, granted) = bounded("W2's grant", q2).await.expect("task");
        let granted = granted.expect("W2 granted");
        if holder_lost {
            assert!(
                at - ended >= DELAY,
                "W2 was granted {:?} after the holder's loss, before its lock-delay of {DELAY:?}",
                at - ended
            );
            assert_eq!(second.stats().lock_delays, delays_before + 1, "the loss began no delay");
        } else {
            assert!(
                at - ended < DELAY,
                "W2 was held back {:?} after a clean release",
                at - ended
            );
            assert_eq!(
                second.stats().lock_delays,
                delays_before,
                "a clean release was taken for a loss"
            );
        }
        granted.release().await.expect("release");
        drop(kept);
        let _ = holder.close().await;
        let _ = w2.close().await;
    }
}

/// A waiter N without a lock-delay sits between the holder H and a
/// lock-delayed waiter W. H releases cleanly and N is granted; N's lease is
/// then revoked: W waited on N, so W is held back. Then N, waiting (not
/// holding), is lost, and H releases cleanly: W is granted at once, N's
/// departure as a waiter holding nothing back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_without_lock_delay_between_neither_lets_a_loss_through_nor_delays_a_release() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut side = side(&cluster).await;
    let holders = new_client(&cluster);
    let middle = new_client(&cluster);
    let waiters = new_client(&cluster);

    // 1: H releases, N granted, N lost: W held back.
    let name = "between/one";
    let h = session(&holders, options()).await;
    let hg = lock(&h, name).await;
    let n = session(&middle, options()).await;
    let nq = queue(&middle, &n, name).await;
    let w = session(&waiters, delayed()).await;
    let wq = queue_timed(&waiters, &w, name).await;
    hg.release().await.expect("release");
    let ng = bounded("N's grant", nq).await.expect("task").expect("N granted");
    assert_eq!(waiters.stats().lock_delays, 0);
    let lost_at = Instant::now();
    revoke(&mut side, &n).await;
    let (at, wg) = bounded("W's grant", wq).await.expect("task");
    assert!(
        at - lost_at >= DELAY,
        "W was granted {:?} after N's loss, before its lock-delay",
        at - lost_at
    );
    assert_eq!(waiters.stats().lock_delays, 1);
    wg.expect("W granted").release().await.expect("release");
    drop(ng);

    // 2: N lost while waiting, then H releases: W at once.
    let name = "between/two";
    let h = session(&holders, options()).await;
    let hg = lock(&h, name).await;
    let n = session(&middle, options()).await;
    let nq = queue(&middle, &n, name).await;
    let wq = queue_timed(&waiters, &w, name).await;
    let waits = waiters.stats().waits;
    revoke(&mut side, &n).await;
    assert!(bounded("N's acquire ends", nq).await.expect("task").is_err());
    // W sees N go and waits on H before H goes.
    bounded("W waits on H", waiters.wait_for_stats(|s| s.waits > waits)).await;
    let released_at = Instant::now();
    hg.release().await.expect("release");
    let (at, wg) = bounded("W's grant", wq).await.expect("task");
    assert!(
        at - released_at < DELAY,
        "W was held back {:?} after a clean release (a waiter lost before it holds nothing)",
        at - released_at
    );
    assert_eq!(
        waiters.stats().lock_delays,
        1,
        "a waiter's loss or a release began a delay"
    );
    wg.expect("W granted").release().await.expect("release");
}

/// Under a marker prefix (and a namespace) the holder has one hand-over
/// marker for every lock. It holds `a` and `b`; a lock-delayed waiter waits
/// on `a`; the holder releases `b` cleanly (its marker written, at that
/// revision), then another client deletes its entry of `a`: the waiter is
/// held back. Beside each lock, the same with the holder's marker of `a`
/// left by an earlier release of `a` itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_marker_never_makes_a_foreign_delete_a_hand_over() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut side = side(&cluster).await;
    let backend = || {
        Etcd::new(cluster.endpoints())
            .with_namespace("tenant/")
            .with_marker_prefix("markers/")
    };
    let holders = Client::new(backend());
    let waiters = Client::new(backend());
    let h = session(&holders, options()).await;
    let a = bounded("lock a", h.mutex("jobs/a").expect("mutex").lock())
        .await
        .expect("lock a");
    let b = bounded("lock b", h.mutex("jobs/b").expect("mutex").lock())
        .await
        .expect("lock b");
    let w = session(&waiters, delayed()).await;
    let wq = queue_timed(&waiters, &w, "jobs/a").await;
    b.release().await.expect("release b");
    let marker = side
        .get(format!("tenant/markers/released-{}", h.id()), None)
        .await
        .expect("get");
    let marker_written = !marker.kvs().is_empty()
        || !side
            .get(format!("markers/released-{}", h.id()), None)
            .await
            .expect("get")
            .kvs()
            .is_empty();
    assert!(
        marker_written,
        "the release of b wrote no marker though a lock-delayed waiter flagged the prefix"
    );
    let deleted_at = Instant::now();
    let deleted = side
        .delete(format!("tenant/jobs/a/{}", h.id()), None)
        .await
        .expect("delete");
    assert_eq!(deleted.deleted(), 1, "the holder's entry of a was not where expected");
    let (at, wg) = bounded("the waiter's grant", wq).await.expect("task");
    assert!(
        at - deleted_at >= DELAY,
        "granted {:?} after another client deleted the holder's entry, before the lock-delay",
        at - deleted_at
    );
    assert_eq!(waiters.stats().lock_delays, 1);
    wg.expect("granted").release().await.expect("release");
    drop(a);

    // Beside each lock: the holder released `c` once with a waiter
    // flagging it (marker written then), took it again, and its entry is
    // deleted by someone else.
    let holders = new_client(&cluster);
    let waiters = new_client(&cluster);
    let h = session(&holders, options()).await;
    let w = session(&waiters, delayed()).await;
    let c = bounded("lock c", h.mutex("jobs/c").expect("mutex").lock())
        .await
        .expect("lock c");
    let wq = queue(&waiters, &w, "jobs/c").await;
    c.release().await.expect("release c");
    let wg = bounded("the waiter's grant", wq).await.expect("task").expect("granted");
    assert_eq!(waiters.stats().lock_delays, 0, "a clean release was taken for a loss");
    let hq = queue(&holders, &h, "jobs/c").await;
    wg.release().await.expect("release");
    let c = bounded("the holder again", hq).await.expect("task").expect("granted");
    let wq = queue_timed(&waiters, &w, "jobs/c").await;
    let deleted_at = Instant::now();
    let deleted = side.delete(format!("jobs/c/{}", h.id()), None).await.expect("delete");
    assert_eq!(deleted.deleted(), 1);
    let (at, wg) = bounded("the waiter's grant", wq).await.expect("task");
    assert!(
        at - deleted_at >= DELAY,
        "granted {:?} after a foreign delete, the holder's marker left by its earlier release",
        at - deleted_at
    );
    wg.expect("granted").release().await.expect("release");
    drop(c);
}

/// Elections: a lock-delayed candidate behind a leader that resigns is
/// elected at once; behind a leader whose lease is revoked, after the delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delayed_candidate_tells_a_resignation_from_a_loss() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut side = side(&cluster).await;
    let leaders = new_client(&cluster);
    let candidates = new_client(&cluster);
    for lost in [false, true] {
        let leader = session(&leaders, options()).await;
        let held = bounded("campaign", leader.election("elect/x").expect("election").campaign(b"l"))
            .await
            .expect("leader");
        let candidate = session(&candidates, delayed()).await;
        let election = candidate.election("elect/x").expect("election");
        let queued = spawn_queued(&candidates, async move {
            let won = election.campaign(b"c").await;
            (Instant::now(), won)
        })
        .await;
        let before = candidates.stats().lock_delays;
        let ended = Instant::now();
        let mut kept = None;
        if lost {
            kept = Some(held);
            revoke(&mut side, &leader).await;
        } else {
            held.resign().await.expect("resign");
        }
        let (at, won) = bounded("the candidate's election", queued).await.expect("task");
        if lost {
            assert!(at - ended >= DELAY, "elected {:?} after the leader's loss", at - ended);
            assert_eq!(candidates.stats().lock_delays, before + 1);
        } else {
            assert!(at - ended < DELAY, "held back {:?} after a resignation", at - ended);
            assert_eq!(
                candidates.stats().lock_delays,
                before,
                "a resignation was taken for a loss"
            );
        }
        won.expect("elected").resign().await.expect("resign");
        drop(kept);
        let _ = candidate.close().await;
        let _ = leader.close().await;
    }
}

/// Without a lock-delay on any session, nothing ever lies beside the lock:
/// checked at every revision from the first lock to the end, through a
/// waiter's queueing, a release, a grant, and a close while holding with
/// another waiter queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lock_delay_nothing_lies_beside_the_lock_at_any_revision() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut side = side(&cluster).await;
    let holders = new_client(&cluster);
    let waiters = new_client(&cluster);
    let start = revision(&mut side).await;
    let h = session(&holders, options()).await;
    let g = lock(&h, "plain/x").await;
    let w = session(&waiters, options()).await;
    let wq = queue(&waiters, &w, "plain/x").await;
    let before_release = revision(&mut side).await;
    g.release().await.expect("release");
    let wg = bounded("grant", wq).await.expect("task").expect("granted");
    assert_eq!(
        revision(&mut side).await,
        before_release + 1,
        "a release and its grant took more than one revision"
    );
    let other = session(&holders, options()).await;
    let oq = queue(&holders, &other, "plain/x").await;
    let before_close = revision(&mut side).await;
    w.close().await.expect("close");
    let og = bounded("grant after a close", oq)
        .await
        .expect("task")
        .expect("granted");
    assert_eq!(
        revision(&mut side).await,
        before_close + 1,
        "a close of a session holding one lock took more than its revoke's revision"
    );
    drop(wg);
    og.release().await.expect("release");
    let end = revision(&mut side).await;
    for at in start.max(1)..=end {
        let beside = side
            .get(
                "plain/x\0",
                Some(GetOptions::new().with_prefix().with_keys_only().with_revision(at)),
            )
            .await
            .expect("get");
        assert!(
            beside.kvs().is_empty(),
            "at revision {at} something lay beside the lock: {:?}",
            beside
                .kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                .collect::<Vec<_>>()
        );
    }
}

/// The holder's release is sent before a lock-delayed waiter queues (kept
/// back in a proxy), and reaches the server only after the waiter's flag:
/// the nested compare is the server's, so the release writes its marker and
/// the waiter is granted at once. Then the same with another client
/// deleting the holder's entry after the waiter queued and before the
/// release gets through: the release answers `LockLost` (the lock was
/// flagged when the entry went) and the waiter is held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_before_the_waiters_flag_is_judged_by_the_server() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut side = side(&cluster).await;
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let holders = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let waiters = new_client(&cluster);
    let holder = session(&holders, options().with_request_timeout(Duration::from_secs(3))).await;
    let waiter = session(&waiters, delayed()).await;
    for foreign_delete in [false, true] {
        let name = if foreign_delete {
            "late/deleted"
        } else {
            "late/released"
        };
        let guard = lock(&holder, name).await;
        let key = guard.key().to_owned();
        proxy.set_requests_held(true);
        let before = proxy.held_request_bytes();
        let release = tokio::spawn(guard.release());
        until("the release sent into the proxy", || {
            proxy.held_request_bytes() != before
        })
        .await;
        let queued = queue_timed(&waiters, &waiter, name).await;
        let delays_before = waiters.stats().lock_delays;
        let ended = Instant::now();
        if foreign_delete {
            assert_eq!(side.delete(key.as_str(), None).await.expect("delete").deleted(), 1);
            proxy.orphan_connections();
        }
        proxy.set_requests_held(false);
        let released = bounded("release", release).await.expect("task");
        let (at, granted) = bounded("the waiter's grant", queued).await.expect("task");
        if foreign_delete {
            assert!(
                matches!(released, Err(Error::LockLost { .. })),
                "an entry another client deleted on a flagged lock was reported released: {released:?}"
            );
            assert!(at - ended >= DELAY, "granted {:?} after a foreign delete", at - ended);
            assert_eq!(waiters.stats().lock_delays, delays_before + 1);
        } else {
            released.expect("release");
            assert!(at - ended < DELAY, "held back {:?} after a release", at - ended);
            assert_eq!(
                waiters.stats().lock_delays,
                delays_before,
                "a release was taken for a loss"
            );
        }
        granted.expect("granted").release().await.expect("release");
    }
}

/// Two departures before one read: a lock-delayed waiter W waits on a
/// waiter N (no lock-delay) queued behind the holder H. N leaves cleanly
/// (its session closes), W's watch hears it, and before W's read after that
/// wake reaches the server, H's lease is revoked. W's read finds nobody
/// ahead: the entry it watched went cleanly, but the holder it queued behind
/// was lost, unseen. W must be held back for its delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_loss_unseen_behind_a_clean_departure_still_holds_back() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut side = side(&cluster).await;
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let holders = new_client(&cluster);
    let middle = new_client(&cluster);
    let waiters = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let name = "unseen/x";
    let h = session(&holders, options()).await;
    let guard = lock(&h, name).await;
    let n = session(&middle, options()).await;
    let nq = queue(&middle, &n, name).await;
    let w = session(&waiters, delayed()).await;
    let wq = queue_timed(&waiters, &w, name).await;
    proxy.set_requests_held(true);
    let before = proxy.held_request_bytes();
    n.close().await.expect("close");
    assert!(bounded("N's acquire ends", nq).await.expect("task").is_err());
    until("W's read after the wake, sent into the proxy", || {
        proxy.held_request_bytes() != before
    })
    .await;
    revoke(&mut side, &h).await;
    let lost_at = Instant::now();
    proxy.set_requests_held(false);
    let (at, granted) = bounded("W's grant", wq).await.expect("task");
    assert!(
        at - lost_at >= DELAY,
        "W was granted {:?} after the holder's loss (unseen behind a clean departure), before its lock-delay",
        at - lost_at
    );
    granted.expect("granted").release().await.expect("release");
    drop(guard);
}
