//! Cancellation: `try_lock`, timeouts, dropped futures and dropped guards
//! leave no entry behind and hold nobody up.

use super::*;

/// `try_lock` on a taken lock returns `None` and leaves no entry; on a free lock
/// it takes it.
pub async fn try_lock_leaves_no_entry<F: Fixture>(fixture: &F) {
    let name = unique("try");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let other = sb.mutex(&name).expect("mutex");
    assert!(bounded("try_lock", other.try_lock()).await.expect("try_lock").is_none());
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "try_lock left an entry"
    );
    // Same session, taken by a sibling: also None, nothing written.
    assert!(bounded("try_lock", sa.mutex(&name).expect("mutex").try_lock())
        .await
        .expect("try_lock")
        .is_none());
    holder.release().await.expect("release");
    let guard = bounded("try_lock", other.try_lock()).await.expect("try_lock");
    let guard = guard.expect("a free lock is taken by try_lock");
    assert!(guard.is_held());
    guard.release().await.expect("release");
    assert!(keys(&other).await.is_empty());
}

/// `lock_timeout` on a taken lock fails with `Timeout` and leaves no entry; on a
/// free one it takes the lock.
pub async fn lock_timeout_leaves_no_entry<F: Fixture>(fixture: &F) {
    let name = unique("timeout");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let other = sb.mutex(&name).expect("mutex");
    let waited = Duration::from_millis(200);
    match bounded("lock_timeout", other.lock_timeout(waited)).await {
        Err(Error::Timeout { waited: reported, .. }) => assert_eq!(reported, waited),
        other => panic!("expected a timeout, got {other:?}"),
    }
    sb.flush().await;
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "lock_timeout left an entry"
    );
    holder.release().await.expect("release");
    let guard = bounded("lock_timeout", other.lock_timeout(waited))
        .await
        .expect("a free lock is taken within the timeout");
    guard.release().await.expect("release");
}

/// `lock_timeout(Duration::ZERO)` is one try, on every backend: a free lock is
/// granted, a lock taken by another session times out at once leaving no
/// entry, and a nested acquire of the same session times out saying so
/// (locks are not re-entrant), with any timeout.
pub async fn lock_timeout_zero_is_one_try<F: Fixture>(fixture: &F) {
    let name = unique("timeout-zero");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let mutex = sa.mutex(&name).expect("mutex");
    let holder = bounded("lock_timeout(0)", mutex.lock_timeout(Duration::ZERO))
        .await
        .expect("a free lock is granted by lock_timeout(0)");
    let other = sb.mutex(&name).expect("mutex");
    match bounded("lock_timeout(0)", other.lock_timeout(Duration::ZERO)).await {
        Err(Error::Timeout {
            waited,
            held_by_this_session,
            ..
        }) => {
            assert_eq!(waited, Duration::ZERO);
            assert!(!held_by_this_session, "another session holds it");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    sb.flush().await;
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "lock_timeout(0) left an entry"
    );
    for timeout in [Duration::ZERO, Duration::from_millis(100)] {
        match bounded("nested lock_timeout", mutex.lock_timeout(timeout)).await {
            Err(
                error @ Error::Timeout {
                    held_by_this_session: true,
                    ..
                },
            ) => {
                assert!(error.to_string().contains("held by this session"), "{error}");
            }
            other => panic!("a nested acquire must time out as held by this session, got {other:?}"),
        }
    }
    assert!(holder.is_held());
    holder.release().await.expect("release");
    sa.flush().await;
    assert!(keys(&other).await.is_empty());
}

/// A `lock()` future dropped while queued, or dropped right after it sent its
/// append, leaves no entry once the session's background cleanup has run, and
/// does not block later contenders.
pub async fn cancelled_lock_leaves_no_entry<F: Fixture>(fixture: &F) {
    let name = unique("cancel");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let other = sb.mutex(&name).expect("mutex");

    // Queued, then cancelled.
    let waiter = queue_waiter(&b, other.clone()).await;
    assert_eq!(keys(&other).await.len(), 2);
    waiter.abort();
    assert!(bounded("the aborted waiter ends", waiter).await.is_err());
    bounded("cleanup", sb.flush()).await;
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "a cancelled lock left an entry"
    );

    // Cancelled with its append in flight.
    for _ in 0..5 {
        let mut attempt = Box::pin(other.lock());
        assert!(poll_once(&mut attempt).is_pending());
        drop(attempt);
        bounded("cleanup", sb.flush()).await;
    }
    assert_eq!(
        keys(&other).await,
        vec![holder.key().to_owned()],
        "an interrupted append left an entry"
    );

    // The queue is not blocked by a ghost: a new contender gets the lock next.
    let third = sb.mutex(&name).expect("mutex");
    let next = queue_waiter(&b, third).await;
    holder.release().await.expect("release");
    let guard = bounded("the next contender", next).await.expect("task").expect("lock");
    guard.release().await.expect("release");
    assert!(b.stats().cleanups >= 1, "no cleanup counted");
}

/// A guard dropped without `release` releases in the background: the next
/// contender gets the lock.
pub async fn dropped_guard_releases<F: Fixture>(fixture: &F) {
    let name = unique("drop");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    drop(holder);
    let next = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    bounded("background release", sa.flush()).await;
    assert_eq!(a.stats().releases, 1);
    next.release().await.expect("release");
}

/// Cancelled waits of every recipe leave no entry behind.
pub async fn cancelled_recipes_leave_no_entry<F: Fixture>(fixture: &F) {
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let rw_name = unique("cancel-rw");
    let held = bounded("write", sa.rwlock(&rw_name).expect("rwlock").write())
        .await
        .expect("write");
    let rw = sb.rwlock(&rw_name).expect("rwlock");
    let waiting = spawn_queued(&b, async move { rw.read().await }).await;
    waiting.abort();
    let _ = waiting.await;

    let sem_name = unique("cancel-sem");
    let permit = bounded("acquire", sa.semaphore(&sem_name, 1).expect("semaphore").acquire())
        .await
        .expect("acquire");
    let sem = sb.semaphore(&sem_name, 1).expect("semaphore");
    let waiting = spawn_queued(&b, async move { sem.acquire().await }).await;
    waiting.abort();
    let _ = waiting.await;

    let el_name = unique("cancel-election");
    let leading = bounded("campaign", sa.election(&el_name).expect("election").campaign(b"a"))
        .await
        .expect("campaign");
    let election = sb.election(&el_name).expect("election");
    let waiting = spawn_queued(&b, async move { election.campaign(b"b").await }).await;
    waiting.abort();
    let _ = waiting.await;

    bounded("cleanup", sb.flush()).await;
    let rw = sb.rwlock(&rw_name).expect("rwlock");
    assert_eq!(bounded("list", rw.contenders()).await.expect("list").len(), 1);
    let sem = sb.semaphore(&sem_name, 1).expect("semaphore");
    assert_eq!(bounded("list", sem.contenders()).await.expect("list").len(), 1);
    let leader = bounded("leader", sb.election(&el_name).expect("election").leader())
        .await
        .expect("leader");
    assert_eq!(leader.map(|l| l.value().to_vec()), Some(b"a".to_vec()));
    held.release().await.expect("release");
    permit.release().await.expect("release");
    leading.resign().await.expect("resign");
    assert!(bounded("list", rw.contenders()).await.expect("list").is_empty());
    assert!(bounded("list", sem.contenders()).await.expect("list").is_empty());
}
