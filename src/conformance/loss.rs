//! Loss: a lost or closed session tells its holders, fails its waiters and
//! lets the next contender in; a suspended session that comes back still holds.

use super::*;

/// Takes the lock `name` on `session`, cuts the session off from the server
/// with `cut`, checks that it turns `Suspended` with the lock still held, then
/// reconnects it with `restore` and checks that it is `Live` again with the
/// lock still held. Returns the guard.
pub async fn suspend_and_revive(
    session: &Session,
    name: &str,
    cut: impl FnOnce(),
    restore: impl FnOnce(),
) -> MutexGuard {
    use crate::SessionState;
    let guard = lock(&session.mutex(name).expect("mutex")).await;
    let mut state = session.watch_state();
    cut();
    bounded("suspended", state.wait_for(|s| *s == SessionState::Suspended))
        .await
        .expect("state");
    assert!(guard.is_held(), "a suspended session's lock is not yet lost");
    restore();
    bounded("live again", state.wait_for(|s| *s == SessionState::Live))
        .await
        .expect("state");
    assert!(guard.is_held());
    guard
}

/// A lost session resolves its holders' `lost()`, makes `release()` report it,
/// and fails its queued `lock()` calls at once; the next session gets the lock.
pub async fn session_loss<F: Fixture>(fixture: &F) {
    let name = unique("loss");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    fixture.expire(&sa).await;
    bounded("the holder learns of the loss", holder.lost()).await;
    assert!(!holder.is_held());
    bounded("the session reports the loss", sa.lost()).await;
    match holder.release().await {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("release after loss must report it, got {other:?}"),
    }
    let next = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(next.is_held());
    assert!(matches!(sa.mutex(&name).expect_err("over"), Error::SessionLost { .. }));

    // A queued contender whose own session is lost fails at once.
    let c = fixture.client().await;
    let sc = session(fixture, &c).await;
    let queued = queue_waiter(&c, sc.mutex(&name).expect("mutex")).await;
    fixture.expire(&sc).await;
    match bounded("the queued lock fails", queued).await.expect("task") {
        Err(Error::SessionLost { .. }) => {}
        other => {
            panic!("a queued lock on a lost session must fail with SessionLost, got {other:?}")
        }
    }
    assert!(
        next.is_held(),
        "the holder was disturbed by another session's loss (its session: {:?})",
        sb.state()
    );
    next.release().await.expect("release");
}

/// After `close()` everything the session held is released, holders learn it,
/// and every further use fails with `Closed`.
pub async fn closed_session_rejects_use<F: Fixture>(fixture: &F) {
    let name = unique("closed");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let mutex = sa.mutex(&name).expect("mutex");
    let held = lock(&mutex).await;
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    bounded("close", sa.close()).await.expect("close");
    bounded("the holder learns", held.lost()).await;
    assert!(!held.is_held());
    let next = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(matches!(held.release().await, Err(Error::Closed { .. })));
    assert!(matches!(mutex.lock().await, Err(Error::Closed { .. })));
    assert!(matches!(mutex.try_lock().await, Err(Error::Closed { .. })));
    assert!(matches!(sa.mutex(&name), Err(Error::Closed { .. })));
    assert!(bounded("close again", sa.close()).await.is_ok());
    next.release().await.expect("release");
}
