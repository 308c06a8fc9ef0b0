//! Sequencers and lock-delay: a sequencer is current only while its grant
//! holds; a lock-delay follows an involuntary loss only.

use super::*;

/// Checks a sequencer through a client with no session of its own, after
/// a round trip through its text form.
async fn current(checker: &Client, sequencer: &crate::Sequencer) -> bool {
    let text = sequencer.to_string();
    let parsed: crate::Sequencer = text.parse().expect("a sequencer's text parses");
    assert_eq!(&parsed, sequencer, "{text} does not round-trip");
    bounded("check a sequencer", checker.check(&parsed))
        .await
        .expect("check")
}

/// A sequencer is current while its holder holds, and not after a release,
/// after the holder's session is lost, or once a later holder holds: for a
/// mutex, the sides of a read/write lock, semaphore permits and a
/// leadership, checked by a client with no session of its own.
pub async fn sequencers_are_current_only_while_held<F: Fixture>(fixture: &F) {
    let checker = fixture.client().await;
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);

    // A mutex: current while held; not after release; the next holder's is.
    let name = unique("sequencer");
    let first = lock(&sa.mutex(&name).expect("mutex")).await;
    let old = first.sequencer();
    assert_eq!(old.name(), name);
    assert_eq!(old.mode(), crate::Mode::Mutex);
    assert_eq!(old.token(), first.token());
    assert!(current(&checker, &old).await, "a held mutex's sequencer is current");
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    assert!(current(&checker, &old).await, "a waiter does not make the holder stale");
    first.release().await.expect("release");
    let next = bounded("the waiter", waiter).await.expect("task").expect("lock");
    assert!(!current(&checker, &old).await, "a released holder's sequencer is stale");
    assert!(current(&checker, &next.sequencer()).await);
    let forged = crate::Sequencer::new(&name, crate::Mode::Read, next.token());
    assert!(!current(&checker, &forged).await, "another mode is not the holder's");
    next.release().await.expect("release");

    // Read/write: readers together, a writer behind them not yet.
    let rw = unique("sequencer-rw");
    let r1 = bounded("read", sa.rwlock(&rw).expect("rwlock").read())
        .await
        .expect("read");
    let r2 = bounded("read", sb.rwlock(&rw).expect("rwlock").read())
        .await
        .expect("read");
    assert_eq!(r1.sequencer().mode(), crate::Mode::Read);
    assert!(current(&checker, &r1.sequencer()).await && current(&checker, &r2.sequencer()).await);
    let writer = {
        let lock = sa.rwlock(&rw).expect("rwlock");
        spawn_queued(&a, async move { lock.write().await }).await
    };
    let (s1, s2) = (r1.sequencer(), r2.sequencer());
    r1.release().await.expect("release");
    assert!(!current(&checker, &s1).await);
    assert!(current(&checker, &s2).await, "a reader still reading stays current");
    r2.release().await.expect("release");
    let w = bounded("the writer", writer).await.expect("task").expect("write");
    assert_eq!(w.sequencer().mode(), crate::Mode::Write);
    assert!(current(&checker, &w.sequencer()).await && !current(&checker, &s2).await);
    w.release().await.expect("release");

    // A semaphore of 2: two permits current, a third waits, then holds.
    let sem = unique("sequencer-sem");
    let p1 = bounded("acquire", sa.semaphore(&sem, 2).expect("semaphore").acquire())
        .await
        .expect("acquire");
    let p2 = bounded("acquire", sb.semaphore(&sem, 2).expect("semaphore").acquire())
        .await
        .expect("acquire");
    assert_eq!(p1.sequencer().mode(), crate::Mode::Permit { permits: 2 });
    assert!(current(&checker, &p1.sequencer()).await && current(&checker, &p2.sequencer()).await);
    let third = {
        let semaphore = sa.semaphore(&sem, 2).expect("semaphore");
        spawn_queued(&a, async move { semaphore.acquire().await }).await
    };
    let s1 = p1.sequencer();
    p1.release().await.expect("release");
    let p3 = bounded("the third permit", third)
        .await
        .expect("task")
        .expect("acquire");
    assert!(!current(&checker, &s1).await);
    assert!(current(&checker, &p2.sequencer()).await && current(&checker, &p3.sequencer()).await);
    p2.release().await.expect("release");
    p3.release().await.expect("release");

    // A leadership, then the leader's session lost.
    let election = unique("sequencer-election");
    let leader = bounded("campaign", sa.election(&election).expect("election").campaign(b"a"))
        .await
        .expect("campaign");
    let sequencer = leader.sequencer();
    assert_eq!(sequencer.mode(), crate::Mode::Leadership);
    assert!(current(&checker, &sequencer).await);
    let held = lock(&sa.mutex(&name).expect("mutex")).await;
    let held_sequencer = held.sequencer();
    fixture.expire(&sa).await;
    bounded("the leader learns of the loss", leader.lost()).await;
    bounded("the holder learns of the loss", held.lost()).await;
    assert!(
        !current(&checker, &sequencer).await,
        "a lost leader's sequencer is stale"
    );
    assert!(
        !current(&checker, &held_sequencer).await,
        "a lost holder's sequencer is stale"
    );
}

/// Lock-delay: a contender next in line after a holder whose session was
/// lost (the fixture's expiry) is granted no sooner than its lock-delay
/// after the loss, and shows as delayed in the queue meanwhile; after a
/// clean `release()` or `close()` it is granted at once, with no
/// lock-delay begun. A lock-delay over a minute is refused.
pub async fn lock_delay_holds_back_after_an_involuntary_loss_only<F: Fixture>(fixture: &F) {
    let delay = Duration::from_millis(1500);
    let delayed = fixture.options().with_lock_delay(delay);
    let (a, b) = (fixture.client().await, fixture.client().await);
    let waiting_session = bounded("open a session", b.session_with(delayed.clone()))
        .await
        .expect("session");

    // An involuntary loss: held back for the lock-delay, marked meanwhile.
    let name = unique("lock-delay");
    let lost_session = session(fixture, &a).await;
    let holder = lock(&lost_session.mutex(&name).expect("mutex")).await;
    let waiter = {
        let mutex = waiting_session.mutex(&name).expect("mutex");
        spawn_queued(&b, async move {
            let guard = mutex.lock().await;
            (tokio::time::Instant::now(), guard)
        })
        .await
    };
    fixture.watch_set(&waiting_session, holder.key()).await;
    let lost_at = tokio::time::Instant::now();
    fixture.expire(&lost_session).await;
    bounded("the lock-delay begins", b.wait_for_stats(|s| s.lock_delays >= 1)).await;
    let queue = bounded("contenders", waiting_session.queue(&name))
        .await
        .expect("queue");
    let first = queue.first().expect("the waiter is in the queue");
    assert!(
        first.delayed_until.is_some() || waiter.is_finished(),
        "a contender in lock-delay shows it: {queue:?}"
    );
    let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        granted_at - lost_at >= delay,
        "granted {:?} after the holder's loss, within the lock-delay of {delay:?}",
        granted_at - lost_at
    );
    assert!(guard.token() > holder.token());
    let queue = bounded("contenders", waiting_session.queue(&name))
        .await
        .expect("queue");
    assert!(
        queue.iter().all(|c| c.delayed_until.is_none()),
        "the mark is cleared: {queue:?}"
    );
    guard.release().await.expect("release");

    // A clean release, then a clean close: handed on at once.
    let before = b.stats().lock_delays;
    for close in [false, true] {
        let name = unique("lock-delay-clean");
        let releasing = session(fixture, &a).await;
        let holder = lock(&releasing.mutex(&name).expect("mutex")).await;
        let waiter = {
            let mutex = waiting_session.mutex(&name).expect("mutex");
            spawn_queued(&b, async move { mutex.lock().await }).await
        };
        let released_at = tokio::time::Instant::now();
        if close {
            bounded("close", releasing.close()).await.expect("close");
            drop(holder);
        } else {
            holder.release().await.expect("release");
        }
        let guard = bounded("the waiter is granted", waiter)
            .await
            .expect("task")
            .expect("lock");
        assert!(
            released_at.elapsed() < delay,
            "a clean {} was held back: granted {:?} after it",
            if close { "close" } else { "release" },
            released_at.elapsed()
        );
        guard.release().await.expect("release");
    }
    assert_eq!(
        b.stats().lock_delays,
        before,
        "a lock-delay began after a clean hand-over"
    );
    let too_long = fixture.options().with_lock_delay(Duration::from_secs(61));
    match b.session_with(too_long).await {
        Err(Error::InvalidOptions { reason }) => assert!(reason.contains("lock-delay"), "{reason}"),
        other => panic!("a lock-delay over a minute must be refused, got {other:?}"),
    }
}
