//! The lock-mode family: [`Resource`]s in the six DLM modes, their
//! conversions, the lock value block and blocking notifications.

use std::time::Duration;

use super::{bounded, session, spawn_queued, unique, Fixture};
use crate::{Client, Error, LockMode, ModeContender, Resource, ResourceGuard, Session, Write};

use LockMode::*;

async fn lock_in(resource: &Resource, mode: LockMode) -> ResourceGuard {
    bounded("lock in a mode", resource.lock(mode))
        .await
        .unwrap_or_else(|e| panic!("lock {} in {mode}: {e}", resource.name()))
}

async fn try_in(resource: &Resource, mode: LockMode) -> Option<ResourceGuard> {
    bounded("try a mode", resource.try_lock(mode))
        .await
        .unwrap_or_else(|e| panic!("try {} in {mode}: {e}", resource.name()))
}

async fn contenders(resource: &Resource) -> Vec<ModeContender> {
    bounded("list contenders", resource.contenders())
        .await
        .expect("list contenders")
}

async fn release(guard: ResourceGuard) {
    bounded("release", guard.release()).await.expect("release");
}

async fn two<F: Fixture>(fixture: &F) -> (Client, Session, Client, Session) {
    let (ca, cb) = (fixture.client().await, fixture.client().await);
    let a = session(fixture, &ca).await;
    let b = session(fixture, &cb).await;
    (ca, a, cb, b)
}

/// Every pair of the VMS matrix: granted together exactly when compatible.
pub async fn lock_modes_follow_the_matrix<F: Fixture>(fixture: &F) {
    let (_ca, a, _cb, b) = two(fixture).await;
    for held in LockMode::ALL {
        for asked in LockMode::ALL {
            let name = unique(&format!("matrix-{held}-{asked}"));
            let first = lock_in(&a.resource(&name).expect("resource"), held).await;
            let second = try_in(&b.resource(&name).expect("resource"), asked).await;
            assert_eq!(
                second.is_some(),
                held.compatible(asked),
                "{asked} asked while {held} is held"
            );
            if let Some(second) = second {
                assert!(second.token() > first.token(), "every grant takes a fresh token");
                release(second).await;
            }
            release(first).await;
            assert!(contenders(&a.resource(&name).expect("resource")).await.is_empty());
        }
    }
}

/// A compatible newcomer never overtakes an earlier waiter it conflicts
/// with; the waiter is granted when the holder lets go, then the newcomer.
pub async fn lock_modes_never_bypass_a_waiter<F: Fixture>(fixture: &F) {
    let (_ca, a, cb, b) = two(fixture).await;
    let cc = fixture.client().await;
    let c = session(fixture, &cc).await;
    let name = unique("bypass");
    let reader = lock_in(&a.resource(&name).expect("resource"), Pr).await;
    let writer = b.resource(&name).expect("resource");
    let waiting = spawn_queued(&cb, async move { writer.lock(Pw).await }).await;
    let newcomer = c.resource(&name).expect("resource");
    assert!(
        try_in(&newcomer, Pr).await.is_none(),
        "PR, compatible with the PR holder, waits behind the PW request"
    );
    let later = spawn_queued(&cc, async move { newcomer.lock(Pr).await }).await;
    release(reader).await;
    let writer = bounded("the PW request is granted", waiting)
        .await
        .expect("join")
        .expect("PW granted");
    assert!(!later.is_finished(), "the PR request still waits for the writer");
    release(writer).await;
    let reader = bounded("then the PR request", later).await.expect("join").expect("PR");
    release(reader).await;
}

/// A down-conversion is granted at once, keeps the token, and wakes the
/// waiter it unblocks.
pub async fn lock_modes_convert_down_at_once<F: Fixture>(fixture: &F) {
    let (_ca, a, cb, b) = two(fixture).await;
    let name = unique("down");
    let mut holder = lock_in(&a.resource(&name).expect("resource"), Ex).await;
    let token = holder.token();
    let reader = b.resource(&name).expect("resource");
    let waiting = spawn_queued(&cb, async move { reader.lock(Pr).await }).await;
    bounded("convert down", holder.convert(Pr)).await.expect("EX to PR");
    assert_eq!(holder.mode(), Pr);
    assert_eq!(holder.token(), token, "a down-conversion keeps the token");
    let reader = bounded("the PR waiter is granted beside it", waiting)
        .await
        .expect("join")
        .expect("PR");
    bounded("convert down to NL", holder.convert(Nl))
        .await
        .expect("PR to NL");
    release(reader).await;
    release(holder).await;
}

/// An up-conversion waits for the other holders only, has priority over
/// every request behind it, and takes a token above every token so far.
pub async fn lock_modes_convert_up_with_priority<F: Fixture>(fixture: &F) {
    let (ca, a, cb, b) = two(fixture).await;
    let cc = fixture.client().await;
    let c = session(fixture, &cc).await;
    let name = unique("up");
    let mut first = lock_in(&a.resource(&name).expect("resource"), Pr).await;
    let second = lock_in(&b.resource(&name).expect("resource"), Pr).await;
    let writer = c.resource(&name).expect("resource");
    let request = spawn_queued(&cc, async move { writer.lock(Ex).await }).await;
    let converting = spawn_queued(&ca, async move { first.convert(Ex).await.map(|()| first) }).await;
    let listed = contenders(&b.resource(&name).expect("resource")).await;
    assert_eq!(listed[0].converting_to(), Some(Ex), "the list shows the conversion");
    let highest = second.token();
    release(second).await;
    let first = bounded("the conversion is granted", converting)
        .await
        .expect("join")
        .expect("PR to EX");
    assert_eq!(first.mode(), Ex);
    assert!(first.token() > highest, "a fresh token above every earlier one");
    assert!(!request.is_finished(), "the EX request behind waits");
    let _ = cb;
    release(first).await;
    let last = bounded("then the request", request).await.expect("join").expect("EX");
    release(last).await;
}

/// Two PR holders converting to EX: the later conversion fails at once and
/// keeps its mode (or is demoted to NL when asked), the earlier goes on.
pub async fn lock_modes_detect_conversion_deadlock<F: Fixture>(fixture: &F) {
    let (ca, a, _cb, b) = two(fixture).await;
    for demote in [false, true] {
        let name = unique("deadlock");
        let mut first = lock_in(&a.resource(&name).expect("resource"), Pr).await;
        let resource = b.resource(&name).expect("resource");
        let resource = if demote {
            resource.demote_on_deadlock()
        } else {
            resource
        };
        let mut second = lock_in(&resource, Pr).await;
        let converting = spawn_queued(&ca, async move { first.convert(Ex).await.map(|()| first) }).await;
        match bounded("the later conversion", second.convert(Ex)).await {
            Err(Error::Deadlock { from, to, held, .. }) => {
                assert_eq!((from, to), (Pr, Ex));
                assert_eq!(held, if demote { Nl } else { Pr });
            }
            other => panic!("expected a deadlock, got {other:?}"),
        }
        assert_eq!(second.mode(), if demote { Nl } else { Pr });
        // Demoted to NL, it no longer stands in the way.
        let mut second = Some(second);
        if !demote {
            release(second.take().expect("held")).await;
        }
        let first = bounded("the earlier conversion", converting)
            .await
            .expect("join")
            .expect("granted once the other lets go");
        assert_eq!(first.mode(), Ex);
        release(first).await;
        if let Some(second) = second {
            release(second).await;
        }
    }
}

/// The lock value block: returned with grants, written only by PW and EX
/// holders as they leave those modes, its sequence rising, not valid after
/// a PW or EX holder's involuntary loss until the next write.
pub async fn lock_modes_value_block<F: Fixture>(fixture: &F) {
    let (_ca, a, _cb, b) = two(fixture).await;
    let name = unique("lvb");
    let resource = a.resource(&name).expect("resource");
    let fresh = lock_in(&resource, Pr).await;
    assert_eq!((fresh.value().sequence, fresh.value().valid), (0, true));
    release(fresh).await;

    let mut writer = lock_in(&resource, Ex).await;
    writer.set_value(b"v1").expect("EX writes");
    release(writer).await;
    let mut reader = lock_in(&resource, Pr).await;
    assert_eq!(reader.value().bytes, b"v1");
    assert_eq!((reader.value().sequence, reader.value().valid), (1, true));
    assert!(
        matches!(reader.set_value(b"no"), Err(Error::WrongMode { .. })),
        "PR does not write the block"
    );
    assert!(matches!(
        bounded(
            "a PR fenced write",
            reader.write_if_held([Write::put(unique("k"), "x")])
        )
        .await,
        Err(Error::WrongMode { .. })
    ));
    release(reader).await;

    let mut writer = lock_in(&resource, Pw).await;
    writer.set_value(b"v2").expect("PW writes");
    bounded("down to CR", writer.convert(Cr)).await.expect("PW to CR");
    let reader = lock_in(&b.resource(&name).expect("resource"), Pr).await;
    assert_eq!(reader.value().bytes, b"v2");
    assert_eq!(reader.value().sequence, 2);
    release(reader).await;
    release(writer).await;

    // A PW holder lost involuntarily: the block is not valid.
    let cx = fixture.client().await;
    let x = session(fixture, &cx).await;
    let mut doomed = lock_in(&x.resource(&name).expect("resource"), Pw).await;
    doomed.set_value(b"never written").expect("PW writes");
    fixture.expire(&x).await;
    bounded("the holder hears of the loss", doomed.lost()).await;
    let reader = lock_in(&resource, Pr).await;
    assert_eq!(reader.value().bytes, b"v2", "the lost holder wrote nothing");
    assert!(!reader.value().valid, "not valid after a PW holder's loss");
    release(reader).await;
    let writer = lock_in(&resource, Ex).await;
    assert!(!writer.value().valid, "still not valid for the next writer");
    release(writer).await;
    let mut writer = lock_in(&resource, Ex).await;
    writer.set_value(b"v3").expect("EX writes");
    release(writer).await;
    let reader = lock_in(&resource, Cr).await;
    assert_eq!(reader.value().bytes, b"v3");
    assert_eq!((reader.value().sequence, reader.value().valid), (3, true));
    release(reader).await;
}

/// A release hands over: in its one write it grants the waiters its
/// departure lets in, each with a token above every earlier one, and the
/// value block as the releaser left it; the waiters learn it from their
/// wake and write nothing themselves. A holder decides from the queue it
/// read when it was granted: here each one is granted with the others
/// already queued behind it (a holder granted before anyone waited
/// releases plainly, and its waiter grants itself). What it hands over it
/// counts in [`ClientStats::handovers`](crate::ClientStats::handovers).
pub async fn lock_modes_release_hands_over<F: Fixture>(fixture: &F) {
    let (ca, a, cb, b) = two(fixture).await;
    let (cc, cz) = (fixture.client().await, fixture.client().await);
    let (c, z) = (session(fixture, &cc).await, session(fixture, &cz).await);
    let name = unique("hand-over");
    // Z, granted before anyone waited, lets the first one in.
    let gate = lock_in(&z.resource(&name).expect("resource"), Ex).await;
    let (ra, rb, rc) = (
        a.resource(&name).expect("resource"),
        b.resource(&name).expect("resource"),
        c.resource(&name).expect("resource"),
    );
    let first = spawn_queued(&ca, async move { ra.lock(Pr).await }).await;
    let second = spawn_queued(&cb, async move { rb.lock(Ex).await }).await;
    let third = spawn_queued(&cc, async move { rc.lock(Pr).await }).await;
    release(gate).await;
    let first = bounded("the first PR waiter is granted", first)
        .await
        .expect("task")
        .expect("PR");
    let before = ca.stats().handovers;
    let first_token = first.token();
    release(first).await;
    assert_eq!(ca.stats().handovers, before + 1, "the PR release handed the lock over");
    let mut second = bounded("the EX waiter is granted", second)
        .await
        .expect("task")
        .expect("EX");
    assert!(
        second.token() > first_token,
        "{:?} after {first_token:?}",
        second.token()
    );
    assert_eq!((second.value().sequence, second.value().valid), (0, true));
    second.set_value(b"v1").expect("EX writes");
    let second_token = second.token();
    let before = cb.stats().handovers;
    release(second).await;
    assert_eq!(cb.stats().handovers, before + 1, "the EX release handed the lock over");
    let third = bounded("the PR waiter is granted", third)
        .await
        .expect("task")
        .expect("PR");
    assert!(third.token() > second_token);
    assert_eq!(third.value().bytes, b"v1");
    assert_eq!((third.value().sequence, third.value().valid), (1, true));
    let listed = contenders(&third.session().resource(&name).expect("resource")).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].granted, Some(Pr));
    release(third).await;
}

/// A waiter dropped just as a release hands it the lock (before or after it
/// learned) leaves nothing behind and the value block valid: its leaving
/// is a release, not an involuntary loss.
pub async fn lock_modes_waiter_dropped_as_it_is_handed_the_lock<F: Fixture>(fixture: &F) {
    let (_ca, a, cb, b) = two(fixture).await;
    let name = unique("handed-and-dropped");
    let resource = a.resource(&name).expect("resource");
    let mut holder = lock_in(&resource, Ex).await;
    holder.set_value(b"kept").expect("EX writes");
    let rb = b.resource(&name).expect("resource");
    let waiter = spawn_queued(&cb, async move { rb.lock(Ex).await }).await;
    let left = |s: &crate::ClientStats| s.cleanups + s.releases;
    let before = left(&cb.stats());
    release(holder).await;
    waiter.abort();
    let _ = waiter.await;
    // However far it got (waiting, handed the lock, its guard returned),
    // its leaving ends as one background cleanup or release.
    bounded("the dropped waiter leaves", cb.wait_for_stats(|s| left(s) > before)).await;
    assert!(
        contenders(&resource).await.is_empty(),
        "the dropped waiter left its entry"
    );
    let next = lock_in(&resource, Ex).await;
    assert_eq!(next.value().bytes, b"kept");
    assert_eq!(
        (next.value().sequence, next.value().valid),
        (1, true),
        "{:?}",
        next.value()
    );
    release(next).await;
}

/// A holder that listens (`notify_blocking`) hears once per mode that a
/// waiter it blocks asks for it; a `try_lock` tells it only when asked to;
/// a holder that does not listen is refused `blocking()` at once.
pub async fn lock_modes_tell_holders_they_block<F: Fixture>(fixture: &F) {
    let (_ca, a, cb, b) = two(fixture).await;
    let name = unique("blocking");
    let holder = lock_in(&a.resource(&name).expect("resource").notify_blocking(), Pr).await;
    let other = b.resource(&name).expect("resource");
    assert!(try_in(&other, Ex).await.is_none());
    let quiet = tokio::time::timeout(Duration::from_millis(200), holder.blocking()).await;
    assert!(quiet.is_err(), "a try_lock does not tell unless asked: {quiet:?}");
    assert!(try_in(&other.clone().notify_on_try(), Ex).await.is_none());
    assert_eq!(bounded("told of EX", holder.blocking()).await.expect("blocking"), Ex);
    let pw = other.clone();
    let waiting = spawn_queued(&cb, async move { pw.lock(Pw).await }).await;
    assert_eq!(bounded("told of PW", holder.blocking()).await.expect("blocking"), Pw);
    waiting.abort();
    let _ = waiting.await;
    let again = spawn_queued(&cb, async move { other.lock(Pw).await }).await;
    let quiet = tokio::time::timeout(Duration::from_millis(200), holder.blocking()).await;
    assert!(quiet.is_err(), "told once per mode: {quiet:?}");
    let deaf = lock_in(&a.resource(&name).expect("resource"), Nl).await;
    assert!(matches!(
        bounded("blocking without notify_blocking", deaf.blocking()).await,
        Err(Error::InvalidOptions { .. })
    ));
    release(deaf).await;
    release(holder).await;
    let granted = bounded("the waiter", again).await.expect("join").expect("PW");
    release(granted).await;
}

/// Timed-out, tried and cancelled requests and conversions leave nothing.
pub async fn lock_modes_leave_nothing_when_given_up<F: Fixture>(fixture: &F) {
    let (ca, a, cb, b) = two(fixture).await;
    let name = unique("given-up");
    let resource = b.resource(&name).expect("resource");
    let holder = lock_in(&a.resource(&name).expect("resource"), Ex).await;
    assert!(try_in(&resource, Cr).await.is_none());
    let timed_out = bounded("a timeout", resource.lock_timeout(Pr, Duration::from_millis(100))).await;
    assert!(matches!(timed_out, Err(Error::Timeout { .. })), "{timed_out:?}");
    let cancelled = resource.clone();
    let task = spawn_queued(&cb, async move { cancelled.lock(Pw).await }).await;
    task.abort();
    let _ = task.await;
    let listed = bounded("settled", async {
        loop {
            let listed = contenders(&resource).await;
            if listed.len() == 1 {
                return listed;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(listed[0].granted, Some(Ex));
    release(holder).await;

    // Conversions given up keep the mode held and mark nothing.
    let mut first = lock_in(&a.resource(&name).expect("resource"), Pr).await;
    let second = lock_in(&resource, Pr).await;
    assert!(!bounded("try_convert", first.try_convert(Ex))
        .await
        .expect("try_convert"));
    let timed_out = bounded("convert_timeout", first.convert_timeout(Ex, Duration::from_millis(100))).await;
    assert!(matches!(timed_out, Err(Error::Timeout { .. })), "{timed_out:?}");
    assert_eq!(first.mode(), Pr);
    assert!(contenders(&resource).await.iter().all(|c| c.converting_to().is_none()));
    let converting = spawn_queued(&ca, async move {
        let outcome = first.convert(Ex).await;
        (first, outcome)
    })
    .await;
    converting.abort();
    let _ = converting.await;
    bounded("the cancelled conversion is taken back", async {
        while contenders(&resource).await.iter().any(|c| c.converting_to().is_some()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    release(second).await;
}

/// Up-conversions to writing modes take fresh tokens (a CR holder that saw
/// a PW writer come and go), a lost holder is told, sequencers name the
/// mode, and no other recipe queues under a resource's name.
pub async fn lock_modes_fence_and_lose<F: Fixture>(fixture: &F) {
    let (ca, a, _cb, b) = two(fixture).await;
    let name = unique("fence");
    let mut reader = lock_in(&a.resource(&name).expect("resource"), Cr).await;
    let writer = lock_in(&b.resource(&name).expect("resource"), Pw).await;
    let seen = writer.token();
    let sequencer = writer.sequencer();
    assert_eq!(sequencer.to_string().split(':').nth(1), Some("lock-PW"));
    assert!(bounded("check", ca.check(&sequencer)).await.expect("check"));
    release(writer).await;
    assert!(!bounded("check", ca.check(&sequencer)).await.expect("check"));
    bounded("CR to PW", reader.convert(Pw)).await.expect("convert");
    assert!(reader.token() > seen, "above the writer that came and went");
    // Absolute, as every backend takes it (a ZooKeeper path must be).
    let key = format!("/{}", unique("fenced-key"));
    bounded("a PW fenced write", reader.write_if_held([Write::put(&key, "1")]))
        .await
        .expect("PW writes while held");

    match bounded("a mutex under the name", a.mutex(&name).expect("mutex").try_lock()).await {
        Err(Error::InvalidName { .. }) => {}
        other => panic!("a mutex must not queue with lock modes: {other:?}"),
    }
    let cm = fixture.client().await;
    let m = session(fixture, &cm).await;
    let other = unique("mutex-first");
    let mutex = bounded("lock", m.mutex(&other).expect("mutex").lock())
        .await
        .expect("lock");
    match bounded(
        "a resource under a mutex's name",
        m.resource(&other).expect("r").try_lock(Nl),
    )
    .await
    {
        Err(Error::InvalidName { .. }) => {}
        other => panic!("lock modes must not queue with a mutex: {other:?}"),
    }
    // The refused request leaves nothing, while the mutex still holds (its
    // entry would block the mutex's own waiters, a peer's too).
    bounded("the refused request's cleanup", m.flush()).await;
    let listed = bounded("contenders", m.mutex(&other).expect("mutex").contenders())
        .await
        .expect("contenders");
    assert_eq!(listed.len(), 1, "a refused lock-mode request left an entry: {listed:?}");
    bounded("release", mutex.release()).await.expect("release");

    fixture.expire(&a).await;
    bounded("the lost holder is told", reader.lost()).await;
    assert!(!reader.is_held());
    let next = lock_in(&b.resource(&name).expect("resource"), Ex).await;
    release(next).await;
}

/// 64 contenders in mixed modes with conversions: never two incompatible
/// holders, and a release wakes at most 1.05 waiters on average.
pub async fn lock_modes_mixed_crowd_is_herd_free<F: Fixture>(fixture: &F) {
    use std::sync::{Arc, Mutex as Std};
    let client = fixture.client().await;
    let name = unique("crowd");
    let holders: Arc<Std<Vec<(usize, LockMode)>>> = Arc::default();
    let modes = [Cr, Pr, Ex, Pw, Nl, Pr, Cw, Ex];
    let before = client.stats();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let session = session(fixture, &client).await;
        let resource = session.resource(&name).expect("resource");
        let holders = Arc::clone(&holders);
        let mode = modes[i % modes.len()];
        tasks.push(tokio::spawn(async move {
            let mut guard = resource.lock(mode).await.expect("lock");
            let enter = |held: &mut Vec<(usize, LockMode)>, mode: LockMode| {
                for (other, theirs) in held.iter() {
                    assert!(theirs.compatible(mode), "{i} in {mode} beside {other} in {theirs}");
                }
                held.push((i, mode));
            };
            enter(&mut holders.lock().expect("holders"), mode);
            tokio::task::yield_now().await;
            if mode == Pr && i % 3 == 0 {
                holders.lock().expect("holders").retain(|(who, _)| *who != i);
                guard.convert(Nl).await.expect("down");
                enter(&mut holders.lock().expect("holders"), Nl);
            }
            holders.lock().expect("holders").retain(|(who, _)| *who != i);
            guard.release().await.expect("release");
            session.close().await.expect("close");
        }));
    }
    for task in tasks {
        bounded("a contender ends", task).await.expect("contender");
    }
    let after = client.stats();
    let wakeups = after.wakeups - before.wakeups;
    let releases = after.releases - before.releases;
    assert_eq!(releases, 64);
    assert!(
        wakeups as f64 <= 1.05 * releases as f64,
        "{wakeups} wakeups for {releases} releases"
    );
}

/// Several resources taken as one, each in its mode: all or nothing.
pub async fn lock_modes_multi_resource_all_or_nothing<F: Fixture>(fixture: &F) {
    let (_ca, a, _cb, b) = two(fixture).await;
    let (first, second) = (unique("multi-a"), unique("multi-b"));
    let holder = lock_in(&a.resource(&second).expect("resource"), Ex).await;
    let both = b
        .multi_resource([(second.as_str(), Pr), (first.as_str(), Pr)])
        .expect("multi");
    assert!(bounded("try both", both.try_lock()).await.expect("try").is_none());
    assert!(
        contenders(&b.resource(&first).expect("resource")).await.is_empty(),
        "the part taken is let go"
    );
    release(holder).await;
    let held = bounded("lock both", both.lock()).await.expect("lock both");
    let modes: Vec<_> = held.guards().iter().map(|g| (g.name().to_owned(), g.mode())).collect();
    assert_eq!(modes, vec![(first.clone(), Pr), (second.clone(), Pr)], "in name order");
    let beside = a
        .multi_resource([(first.as_str(), Cr), (second.as_str(), Pr)])
        .expect("multi");
    let beside = bounded("compatible modes", beside.try_lock())
        .await
        .expect("try")
        .expect("CR and PR beside PR");
    assert!(matches!(
        a.multi_resource([(first.as_str(), Cr), (first.as_str(), Pr)]),
        Err(Error::InvalidOptions { .. })
    ));
    bounded("release", beside.release()).await.expect("release");
    bounded("release", held.release()).await.expect("release");
}

/// With a lock-delay, the next holder waits it out after a PW or EX
/// holder's involuntary loss, and not after a release.
pub async fn lock_modes_lock_delay_after_an_involuntary_loss_only<F: Fixture>(fixture: &F) {
    let delay = Duration::from_millis(1500);
    let (ca, cb) = (fixture.client().await, fixture.client().await);
    let waiting = bounded(
        "open a session",
        cb.session_with(fixture.options().with_lock_delay(delay)),
    )
    .await
    .expect("session");
    for lost in [true, false] {
        let name = unique("modes-lock-delay");
        let doomed = session(fixture, &ca).await;
        let holder = lock_in(&doomed.resource(&name).expect("resource"), Ex).await;
        let resource = waiting.resource(&name).expect("resource");
        let waiter = spawn_queued(&cb, async move {
            let guard = resource.lock(Pr).await;
            (tokio::time::Instant::now(), guard)
        })
        .await;
        fixture.watch_set(&waiting, holder.key()).await;
        let before = cb.stats().lock_delays;
        let at = tokio::time::Instant::now();
        if lost {
            fixture.expire(&doomed).await;
        } else {
            release(holder).await;
        }
        let (granted_at, guard) = bounded("the waiter is granted", waiter).await.expect("task");
        let guard = guard.expect("PR");
        if lost {
            assert!(granted_at - at >= delay, "granted {:?} after the loss", granted_at - at);
            assert!(cb.stats().lock_delays > before);
        } else {
            assert_eq!(cb.stats().lock_delays, before, "no lock-delay after a release");
        }
        release(guard).await;
    }
}
