//! Multi-locks: all or nothing, never a deadlock.

use super::*;

/// Multi-locks: two sessions taking overlapping names in opposite orders,
/// over many rounds, both finish and never hold at once; a timeout, a
/// `try_lock` that finds one taken and a cancelled acquire leave nothing
/// held and no entry behind; a multi-guard's `lost()` fires when any part
/// is lost.
pub async fn multi_locks_are_all_or_nothing_and_never_deadlock<F: Fixture>(fixture: &F) {
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let (x, y, z) = (unique("multi-x"), unique("multi-y"), unique("multi-z"));
    let inside = Arc::new(AtomicUsize::new(0));
    let rounds = |s: Session, names: Vec<String>, inside: Arc<AtomicUsize>| async move {
        let multi = s.multi_lock(&names).expect("multi_lock");
        for _ in 0..15 {
            let guard = multi.lock().await.expect("lock all");
            assert!(guard.is_held());
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two multi-locks held at once");
            tokio::task::yield_now().await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.expect("release all");
        }
    };
    let one = tokio::spawn(rounds(
        sa.clone(),
        vec![x.clone(), y.clone(), z.clone()],
        Arc::clone(&inside),
    ));
    let other = tokio::spawn(rounds(
        sb.clone(),
        vec![z.clone(), y.clone(), x.clone()],
        Arc::clone(&inside),
    ));
    bounded("both multi-locks finish", async {
        one.await.expect("task");
        other.await.expect("task");
    })
    .await;

    // A timeout lets go of what it had taken, and leaves no entry behind.
    let held = lock(&sb.mutex(&y).expect("mutex")).await;
    let both = sa.multi_lock([&y, &x]).expect("multi_lock");
    assert_eq!(both.names().collect::<Vec<_>>(), [x.as_str(), y.as_str()]);
    match bounded("a multi-lock times out", both.lock_timeout(Duration::from_millis(300))).await {
        Err(Error::Timeout { name, waited, .. }) => {
            assert_eq!(name, y);
            assert_eq!(waited, Duration::from_millis(300));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    bounded("cleanup", sa.flush()).await;
    assert!(
        keys(&sa.mutex(&x).expect("mutex")).await.is_empty(),
        "the part taken is let go"
    );
    assert_eq!(keys(&sa.mutex(&y).expect("mutex")).await, vec![held.key().to_owned()]);
    // A try finds it taken: nothing held, nothing queued.
    assert!(bounded("try", both.try_lock()).await.expect("try_lock").is_none());
    bounded("cleanup", sa.flush()).await;
    assert!(keys(&sa.mutex(&x).expect("mutex")).await.is_empty());
    // A cancelled acquire, while it waits for the second: the same.
    let waiting = {
        let both = both.clone();
        spawn_queued(&a, async move { both.lock().await }).await
    };
    waiting.abort();
    assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
    bounded("cleanup", sa.flush()).await;
    assert!(keys(&sa.mutex(&x).expect("mutex")).await.is_empty());
    assert_eq!(keys(&sa.mutex(&y).expect("mutex")).await, vec![held.key().to_owned()]);
    held.release().await.expect("release");

    // Held together: tokens and sequencers of each; lost when any part is.
    let guard = bounded("lock all", both.lock()).await.expect("lock all");
    let tokens = guard.tokens();
    assert_eq!(tokens.len(), 2);
    assert_eq!(tokens[0].0, x);
    assert_eq!(guard.sequencers()[1].name(), y);
    let part = guard.guards()[1].entry().clone();
    assert!(bounded("remove", sb.backend_session().remove(&part))
        .await
        .expect("remove"));
    bounded("the multi-guard learns of the loss", guard.lost()).await;
    assert!(!guard.is_held());
    assert!(matches!(
        sa.multi_lock(Vec::<String>::new()),
        Err(Error::InvalidOptions { .. })
    ));
    assert!(matches!(sa.multi_lock([&x, &x]), Err(Error::InvalidOptions { .. })));
    drop(guard);
}
