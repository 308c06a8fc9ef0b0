//! Regressions: each reproduces, in the fewest steps, a defect an outside
//! review found (its doc comment says why it happened and how it is fixed);
//! they pass now and guard the fix.

use super::*;

/// Converts `guard`, held on `session`, to `mode`, and drops the conversion
/// once the store has applied its `update_queue` (cancelled with the answer
/// in flight); the answer never comes. `what` names the conversion.
async fn convert_cancelled_in_flight(
    gated: &Gated,
    session: &Session,
    guard: &mut ResourceGuard,
    mode: LockMode,
    what: &str,
) {
    let armed = gated.trap(session, "update_queue");
    {
        let converting = guard.convert(mode);
        tokio::select! {
            outcome = converting => panic!("the trap did not stop the {what}: {outcome:?}"),
            _ = armed.reached => {}
        }
    }
    drop(armed.resume);
}

/// Was a bug: two incompatible modes granted at once. An up-conversion's grant is
/// conditioned on the entries its read saw (`View::unchanged` for a granted
/// entry: every slot *of that read*), not on "no entry appended since". A
/// request appended after the conversion's read is granted beside the old
/// mode (the conversion is not marked yet), and then the conversion's
/// update applies: PR→EX granted beside a fresh PR. On the memory backend
/// the window is a parallel thread between `read_queue` and
/// `update_queue`; on any server it is a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_up_conversion_granted_beside_an_entry_appended_after_its_read() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "stale-grant";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let armed = gated.trap(a, "read_queue");
    let converting = tokio::spawn(async move {
        let outcome = first.convert(Ex).await;
        (first, outcome)
    });
    bounded("the conversion read the queue", armed.reached).await.unwrap();
    // The conversion is not marked yet: a PR request is compatible with all.
    let second = bounded("try PR", b.resource(name).unwrap().try_lock(Pr))
        .await
        .unwrap()
        .expect("PR beside an unconverted PR");
    let _ = armed.resume.send(());
    let _ = tokio::time::timeout(SHORT, async {
        while !converting.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let queue = listed(&b.resource(name).unwrap()).await;
    let outcome = compatible_holders(&queue);
    assert!(
        outcome.is_ok(),
        "incompatible holders: {} (queue {:?}; second still held: {})",
        outcome.unwrap_err(),
        modes(&queue),
        second.is_held()
    );
}

/// Was a bug: a conversion deadlock is not detected. Same root cause as above,
/// for the conversion's *mark*: it is conditioned on the entries of the
/// read that found no cycle, so a holder granted after that read and
/// converting meanwhile (its own check saw no cycle: the first was not
/// marked yet) is not seen. Both marks apply, neither conversion fails
/// with `Error::Deadlock`, and both wait for ever. (Usually a waiter's
/// blocking mark on the first entry changes its version and makes its
/// mark fail and re-read; a holder already marked with EX by an earlier
/// waiter is not marked again, so nothing saves it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_conversion_deadlock_missed_when_the_other_holder_came_after_the_read() {
    let (gated, s) = gated_sessions(4).await;
    let (a, b, c, d) = (&s[0].1, &s[1].1, &s[2].1, &s[3].1);
    let name = "stale-mark";
    let mut first = lock(&a.resource(name).unwrap().notify_blocking(), Pr).await;
    // An earlier waiter told the first holder of EX (its blocked bits).
    assert!(
        bounded("try EX", d.resource(name).unwrap().notify_on_try().try_lock(Ex))
            .await
            .unwrap()
            .is_none()
    );
    let third = lock(&c.resource(name).unwrap(), Pr).await;
    let armed = gated.trap(a, "read_queue");
    let converting_a = tokio::spawn(async move {
        let outcome = first.convert(Ex).await;
        (first, outcome)
    });
    bounded("a read the queue", armed.reached).await.unwrap();
    let mut second = lock(&b.resource(name).unwrap(), Pr).await;
    let converting_b = tokio::spawn(async move {
        let outcome = second.convert(Ex).await;
        (second, outcome)
    });
    bounded("b waits", s[1].0.wait_for_stats(|st| st.waits >= 1)).await;
    let _ = armed.resume.send(());
    // One of the two conversions closes a cycle: it must fail at once,
    // while the third holder still holds.
    let finished = tokio::time::timeout(SHORT, async {
        loop {
            if converting_a.is_finished() || converting_b.is_finished() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let queue = listed(&c.resource(name).unwrap()).await;
    assert!(
        finished.is_ok(),
        "PR→EX and PR→EX wait on each other for ever, neither told Deadlock: {:?}",
        modes(&queue)
    );
    let (done, other) = if converting_a.is_finished() {
        (converting_a, converting_b)
    } else {
        (converting_b, converting_a)
    };
    let (guard, outcome) = done.await.unwrap();
    assert!(matches!(outcome, Err(Error::Deadlock { .. })), "{outcome:?}");
    guard.release().await.unwrap();
    third.release().await.unwrap();
    let (guard, outcome) = bounded("the other conversion", other).await.unwrap();
    outcome.unwrap();
    assert_eq!(guard.mode(), Ex);
    guard.release().await.unwrap();
}

/// Was a bug: a cancelled conversion's background cleanup takes back a *later*
/// conversion of the same guard to the same mode. `ConversionCleanup::drop`
/// spawns `take_back(from, to)`, which resets the entry whenever it is
/// marked `from → to`: it cannot tell the cancelled conversion's mark from
/// the next one's. The next conversion goes on waiting, unmarked: requests
/// behind it no longer count its new mode (they overtake it), and another
/// holder's conversion no longer sees the cycle, so a plain PR/PR → EX/EX
/// deadlock goes undetected and both wait for ever.
#[tokio::test]
pub(crate) async fn regression_cancelled_conversion_cleanup_unmarks_the_next_conversion() {
    let (_store, s) = memory_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "take-back-race";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let mut second = lock(&b.resource(name).unwrap(), Pr).await;
    // A conversion dropped while it waits (a `select!`, a `timeout`).
    assert!(tokio::time::timeout(Duration::from_millis(50), first.convert(Ex))
        .await
        .is_err());
    // Asked again at once.
    let mut again = pin!(first.convert(Ex));
    assert!(poll!(&mut again).is_pending());
    tokio::time::sleep(Duration::from_millis(50)).await; // the cleanup runs
    let queue = listed(&b.resource(name).unwrap()).await;
    let still_marked = queue[0].converting_to() == Some(Ex);
    // The other holder converts too: that closes a cycle.
    let outcome = tokio::select! {
        outcome = second.convert(Ex) => Some(outcome),
        _ = &mut again => None,
        () = tokio::time::sleep(SHORT) => None,
    };
    assert!(
        matches!(outcome, Some(Err(Error::Deadlock { .. }))),
        "expected Deadlock for the second PR→EX, got {outcome:?}; the first conversion \
         still waiting was marked after the cleanup: {still_marked} ({:?})",
        modes(&queue)
    );
}

/// BUG (same root cause as the one above): after the background cleanup
/// of a dropped PR→EX erased the next PR→EX's mark, a PR newcomer is
/// granted ahead of that conversion, which still waits: a compatible
/// newcomer overtakes an earlier request it conflicts with.
#[tokio::test]
pub(crate) async fn regression_cancelled_conversion_cleanup_lets_a_newcomer_overtake_the_next_conversion() {
    let (_store, s) = memory_sessions(3).await;
    let (a, b, c) = (&s[0].1, &s[1].1, &s[2].1);
    let name = "take-back-overtake";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let _second = lock(&b.resource(name).unwrap(), Pr).await;
    assert!(tokio::time::timeout(Duration::from_millis(50), first.convert(Ex))
        .await
        .is_err());
    let mut again = pin!(first.convert(Ex));
    assert!(poll!(&mut again).is_pending());
    tokio::time::sleep(Duration::from_millis(50)).await; // the cleanup runs
    let newcomer = bounded("try PR", c.resource(name).unwrap().try_lock(Pr)).await.unwrap();
    assert!(
        newcomer.is_none(),
        "a PR newcomer was granted while an earlier PR→EX conversion waits (it must wait behind it)"
    );
}

/// Was a bug: a holder is never told that a waiter is blocked by it. A request
/// marks only the *granted* entry it waits on (`Resource::mark` returns on
/// `state.granted?`). A request waiting on an earlier *waiting* request
/// marks nothing; when that request is granted in the mode it asked for,
/// `changed()` watches past it (the modes it blocks with are unchanged),
/// so the waiter never reads again and never marks it. The holder's
/// `blocking()` never resolves: a caching PR holder that lets go when told
/// (the docs' recipe) holds on for ever, and the EX request waits for ever.
#[tokio::test]
pub(crate) async fn regression_blocking_never_told_to_a_request_granted_while_a_waiter_waited_on_it() {
    let (_store, s) = memory_sessions(3).await;
    let ((_, a), (cb, b), (cc, c)) = (&s[0], &s[1], &s[2]);
    let name = "never-told";
    let holder = lock(&a.resource(name).unwrap(), Ex).await;
    let reader = b.resource(name).unwrap().notify_blocking();
    let reading = tokio::spawn(async move { reader.lock(Pr).await });
    bounded("PR waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let writer = c.resource(name).unwrap();
    let writing = tokio::spawn(async move { writer.lock(Ex).await });
    bounded("EX waits", cc.wait_for_stats(|st| st.waits >= 1)).await;
    holder.release().await.unwrap();
    let cached = bounded("PR granted", reading).await.unwrap().unwrap();
    // The EX request is blocked by this PR holder alone.
    let told = tokio::time::timeout(SHORT, cached.blocking()).await;
    assert!(
        matches!(told, Ok(Ok(Ex))),
        "the PR holder blocking an EX request was not told: {told:?} (EX request finished: {})",
        writing.is_finished()
    );
}

/// Was a bug: a down-conversion cancelled after the store applied it leaves the
/// guard believing the old mode. `down()` updates the guard's `Cell` only
/// after `update_queue` returns; dropped in between (a response in
/// flight), the entry is NL on the server while `mode()` says EX and
/// `is_held()` is true. Another session is then granted EX, and the stale
/// guard's `write_if_held` (fenced on the entry's existence only) is
/// accepted beside it.
#[tokio::test]
pub(crate) async fn regression_down_conversion_cancelled_in_flight_leaves_a_stale_ex_guard() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "cancelled-down";
    let mut holder = lock(&a.resource(name).unwrap(), Ex).await;
    // Cancelled with its update applied.
    convert_cancelled_in_flight(&gated, a, &mut holder, Nl, "down-conversion").await;
    // The guard claims no more than the server may hold.
    assert_eq!(holder.mode(), Nl);
    let other = bounded("try EX", b.resource(name).unwrap().try_lock(Ex)).await.unwrap();
    let write = bounded("a fenced write", holder.write_if_held([Write::put("stale/data", "x")])).await;
    assert!(other.is_some(), "the down-conversion applied: EX is free");
    assert!(
        matches!(write, Err(Error::WrongMode { .. })),
        "a fenced write beside the new EX holder: {write:?}"
    );
}

/// BUG (same root cause as the one above): the stale EX guard's release
/// writes the lock value block, after another EX holder wrote it and after
/// a PW holder lost its lock involuntarily. A reader then sees the stale
/// guard's value, a sequence that did not rise past the last writer's, and
/// `valid` although the last PW holder was lost without writing.
#[tokio::test]
pub(crate) async fn regression_stale_guard_overwrites_the_value_block_and_marks_it_valid() {
    let (gated, s) = gated_sessions(4).await;
    let (a, b, h, r) = (&s[0].1, &s[1].1, &s[2].1, &s[3].1);
    let name = "stale-lvb";
    let mut stale = lock(&a.resource(name).unwrap(), Ex).await;
    stale.set_value(b"stale").unwrap();
    convert_cancelled_in_flight(&gated, a, &mut stale, Nl, "down-conversion").await;
    // The next EX holder writes v1 (sequence 1)...
    let mut next = lock(&b.resource(name).unwrap(), Ex).await;
    next.set_value(b"from b").unwrap();
    next.release().await.unwrap();
    // ...then a PW holder is lost without writing: not valid from now on.
    let mut doomed = lock(&h.resource(name).unwrap(), Pw).await;
    doomed.set_value(b"never written").unwrap();
    assert!(gated.store.expire(h.id()));
    bounded("lost", doomed.lost()).await;
    // The stale guard lets go.
    let _ = stale.release().await;
    let seen = lock(&r.resource(name).unwrap(), Pr).await.value();
    assert!(
        !seen.valid && seen.sequence >= 1 && seen.bytes == b"from b",
        "after b wrote 'from b' (sequence 1) and a PW holder was lost, a reader sees {:?} \
         ({:?}, sequence {}, valid {})",
        seen,
        String::from_utf8_lossy(&seen.bytes),
        seen.sequence,
        seen.valid
    );
}

/// Was a bug: an up-conversion cancelled after its grant applied leaves the
/// guard believing the old mode (the `Cell` is updated after
/// `update_queue` returns, and the cleanup's `take_back` sees the entry
/// no longer `from → to` and does nothing). The server holds EX for a
/// guard that says PR: a PR request the holder thinks compatible waits
/// until it lets go, and the value block names it as its PW/EX holder,
/// so its clean release leaves the block not valid.
#[tokio::test]
pub(crate) async fn regression_up_conversion_cancelled_in_flight_leaves_the_guard_in_the_old_mode() {
    let (gated, s) = gated_sessions(3).await;
    let (a, b, c) = (&s[0].1, &s[1].1, &s[2].1);
    let name = "cancelled-up";
    let mut holder = lock(&a.resource(name).unwrap(), Pr).await;
    convert_cancelled_in_flight(&gated, a, &mut holder, Ex, "conversion").await;
    tokio::time::sleep(Duration::from_millis(50)).await; // the cleanup runs
    let queue = listed(&b.resource(name).unwrap()).await;
    let beside = bounded("try PR", b.resource(name).unwrap().try_lock(Pr)).await.unwrap();
    let granted_beside = beside.is_some();
    let believed = holder.mode();
    drop(beside);
    holder.release().await.unwrap();
    let value = lock(&c.resource(name).unwrap(), Pr).await.value();
    assert!(
        queue[0].granted == Some(believed),
        "the guard says {believed}, the server says {:?}; a PR request beside it granted: \
         {granted_beside}; after its clean release the value block is valid: {}",
        queue[0].granted,
        value.valid
    );
}

/// Was a bug: `convert_timeout` reports `Timeout` ("the mode unchanged") for a
/// conversion the store granted. The grant's `update_queue` runs under the
/// deadline (`Acquire::retrying` → `bounded` → `timeout_at`); when the
/// deadline falls while its answer is on its way, the call is dropped
/// after it applied, `up()` returns `Err(Timeout)`, and nothing takes the
/// grant back (the cleanup is not armed on the grant path, and `take_back`
/// would not touch an entry no longer converting). Found by the stress with
/// round trips, with no future dropped by the caller. `lock_timeout` has
/// the same window: a grant applied, then the entry removed as a timed-out
/// request (a PW/EX one leaves the value block not valid).
#[tokio::test]
pub(crate) async fn regression_convert_timeout_reports_timeout_for_a_conversion_the_store_granted() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "timeout-in-flight";
    let mut holder = lock(&a.resource(name).unwrap(), Pr).await;
    let armed = gated.trap(a, "update_queue");
    let outcome = holder.convert_timeout(Ex, Duration::from_millis(200)).await;
    drop(armed);
    let queue = listed(&b.resource(name).unwrap()).await;
    assert!(
        !matches!(outcome, Err(Error::Timeout { .. })) || queue[0].granted == Some(holder.mode()),
        "convert_timeout said {outcome:?} (the guard keeps {}), the store holds {:?}",
        holder.mode(),
        queue[0].granted
    );
}

/// Was a bug: a conversion mark left behind, and a false deadlock from it. When
/// `convert_timeout` runs out it takes its mark back inline
/// (`ConversionCleanup::take_back`), which sets `armed = false` *before*
/// its two awaits; a caller that drops the future meanwhile (a `select!`
/// on shutdown, an outer timeout a little longer) leaves the entry marked
/// PR→EX for good, and nobody converting. Then the other PR holder's
/// PR→EX, which only has to wait for this PR holder to let go, fails with
/// `Error::Deadlock` (the phantom conversion closes a cycle), and PR
/// requests behind wait as if an EX conversion were ahead of them.
#[tokio::test]
pub(crate) async fn regression_timed_out_conversion_dropped_during_its_cleanup_leaves_a_phantom_mark() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "phantom-mark";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let mut second = lock(&b.resource(name).unwrap(), Pr).await;
    {
        let mut converting = pin!(first.convert_timeout(Ex, Duration::from_millis(200)));
        assert!(poll!(&mut converting).is_pending(), "waits for the other PR holder");
        // Its next read of the queue is the cleanup's, once the deadline passed.
        let armed = gated.trap(a, "read_queue");
        tokio::select! {
            outcome = &mut converting => panic!("the trap did not stop the cleanup: {outcome:?}"),
            _ = armed.reached => {}
        }
    } // dropped during the cleanup
    tokio::time::sleep(Duration::from_millis(50)).await;
    let queue = listed(&b.resource(name).unwrap()).await;
    assert_eq!(first.mode(), Pr);
    let outcome = tokio::time::timeout(Duration::from_millis(300), second.convert(Ex)).await;
    assert!(
        !matches!(outcome, Ok(Err(Error::Deadlock { .. }))) && queue[0].converting_to().is_none(),
        "a PR→EX that only waits for a PR holder failed: {outcome:?}; the queue after the \
         dropped cleanup: {:?} (nobody converts)",
        modes(&queue)
    );
}

/// Was a bug: an up-conversion is granted without the lock-delay after an
/// involuntary loss. `request_inner` holds back after a lost blocker;
/// `up()` has no such step, so an NL → EX conversion gets EX at once
/// after the EX holder's session expired, while its owner may still be
/// writing. The docs: lock-delay "works as for the other recipes".
#[tokio::test]
pub(crate) async fn regression_up_conversion_skips_the_lock_delay() {
    let delay = Duration::from_millis(1000);
    let store = MemoryBackend::new();
    let ca = Client::new(store.clone());
    let a = ca.session().await.unwrap();
    let (cb, b) = delayed_session(store.clone(), delay).await;
    let name = "delay-conversion";
    let holder = lock(&a.resource(name).unwrap(), Ex).await;
    let mut place = lock(&b.resource(name).unwrap(), Nl).await;
    let converting = tokio::spawn(async move {
        let outcome = place.convert(Ex).await;
        (Instant::now(), place, outcome)
    });
    bounded("the conversion waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let lost_at = Instant::now();
    assert!(store.expire(a.id()));
    let (at, _place, outcome) = bounded("converted", converting).await.unwrap();
    outcome.unwrap();
    drop(holder);
    assert!(
        at - lost_at >= delay,
        "EX granted by conversion {:?} after the EX holder's loss (lock-delay {delay:?})",
        at - lost_at
    );
}

/// Was a bug: the lock-delay is skipped when the lost PW/EX holder was not the
/// one entry the waiter waited on. An EX request behind a PW holder and a
/// CR holder waits on the nearest (CR); the PW holder's session expires
/// (no wake-up: it waits on CR); the CR holder releases; `departure(CR)`
/// says released, so EX is granted at once after the PW holder's loss.
#[tokio::test]
pub(crate) async fn regression_lock_delay_skipped_when_the_lost_writer_was_not_the_entry_waited_on() {
    let delay = Duration::from_millis(1000);
    let store = MemoryBackend::new();
    let (cw, cr) = (Client::new(store.clone()), Client::new(store.clone()));
    let w = cw.session().await.unwrap();
    let r = cr.session().await.unwrap();
    let (cx, x) = delayed_session(store.clone(), delay).await;
    let name = "delay-nearest";
    let writer = lock(&w.resource(name).unwrap(), Pw).await;
    let reader = lock(&r.resource(name).unwrap(), Cr).await;
    let resource = x.resource(name).unwrap();
    let waiting = tokio::spawn(async move {
        let outcome = resource.lock(Ex).await;
        (Instant::now(), outcome)
    });
    bounded("EX waits", cx.wait_for_stats(|st| st.waits >= 1)).await;
    let lost_at = Instant::now();
    assert!(store.expire(w.id()));
    drop(writer);
    reader.release().await.unwrap();
    let (at, outcome) = bounded("EX granted", waiting).await.unwrap();
    let _granted = outcome.unwrap();
    assert!(
        at - lost_at >= delay,
        "EX granted {:?} after the PW holder's involuntary loss (lock-delay {delay:?})",
        at - lost_at
    );
}

/// BUG (divergence from the model's Convert step, which finds the entry
/// gone and learns the loss before anything else): converting to the mode
/// already held returns `Ok` without looking, even when the lock is lost
/// (`converting()` returns before `known_loss()`). The docs: errors "as
/// release when the lock is lost".
#[tokio::test]
pub(crate) async fn regression_convert_to_the_same_mode_on_a_lost_lock_succeeds() {
    let (store, s) = memory_sessions(1).await;
    let a = &s[0].1;
    let mut guard = lock(&a.resource("same-mode").unwrap(), Pr).await;
    assert!(store.expire(a.id()));
    bounded("lost", guard.lost()).await;
    let outcome = guard.convert(Pr).await;
    assert!(
        matches!(outcome, Err(Error::SessionLost { .. })),
        "convert(PR) of a lost PR lock: {outcome:?}"
    );
}

/// Was a bug: a panic on caller input (DESIGN §6.8): `Instant::now() + timeout`
/// overflows for a very long timeout in `lock_timeout`, `convert_timeout`
/// and `MultiResource::lock_timeout` (the older recipes' `within` has the
/// same line).
#[tokio::test]
pub(crate) async fn regression_very_long_timeouts_panic() {
    let (_store, s) = memory_sessions(1).await;
    let a = s[0].1.clone();
    let outcomes = tokio::spawn(async move {
        let resource = a.resource("long").unwrap();
        let guard = resource.lock_timeout(Pr, Duration::MAX).await;
        let mut guard = guard.unwrap();
        guard.convert_timeout(Ex, Duration::MAX).await.unwrap();
        guard.release().await.unwrap();
        let multi = a.multi_resource([("long", Pr)]).unwrap();
        multi
            .lock_timeout(Duration::MAX)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    })
    .await;
    assert!(
        outcomes.is_ok(),
        "a timeout of Duration::MAX panicked: {:?}",
        outcomes.err().map(|e| e.to_string())
    );
}

/// Was a claim of the design notes ("a release wakes only those it
/// unblocks"), now "only the waiters that waited on it": holders PR, PR; an EX request waits on the nearest (the
/// second PR); the first PR converts to EX and waits on the first blocker
/// in queue order (the second PR too). The second PR's release wakes both;
/// only the conversion is unblocked: two wake-ups for one unblocked waiter.
#[tokio::test]
pub(crate) async fn regression_one_release_wakes_a_waiter_it_does_not_unblock() {
    let (_store, s) = memory_sessions(3).await;
    let ((ca, a), (_, b), (cc, c)) = (&s[0], &s[1], &s[2]);
    let name = "extra-wakeup";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let second = lock(&b.resource(name).unwrap(), Pr).await;
    let writer = c.resource(name).unwrap();
    let writing = tokio::spawn(async move { writer.lock(Ex).await });
    bounded("EX waits", cc.wait_for_stats(|st| st.waits >= 1)).await;
    let converting = tokio::spawn(async move {
        let outcome = first.convert(Ex).await;
        (first, outcome)
    });
    bounded("the conversion waits", ca.wait_for_stats(|st| st.waits >= 1)).await;
    let before = ca.stats().wakeups + cc.stats().wakeups;
    second.release().await.unwrap();
    let (first, outcome) = bounded("converted", converting).await.unwrap();
    outcome.unwrap();
    // The EX request wakes (if it does) right after the release.
    let _ = tokio::time::timeout(Duration::from_millis(200), cc.wait_for_stats(|st| st.wakeups >= 1)).await;
    let woken = ca.stats().wakeups + cc.stats().wakeups - before;
    assert!(!writing.is_finished());
    first.release().await.unwrap();
    bounded("EX", writing).await.unwrap().unwrap().release().await.unwrap();
    // Both waited on the released entry: a release wakes the waiters that
    // waited on it, and no one else (the model's promise).
    assert_eq!(woken, 2, "two waiters waited on the release, {woken} woken");
}

/// BUG (memory backend): an append racing its session's expiry leaves an
/// entry no one will ever delete. `MemorySession::append` checks that the
/// session is live (`check_live`, on its state receiver) *before* taking
/// the store's lock; `Store::end` (expire, close) deletes the session's
/// entries under the lock in between; the append then inserts an entry
/// owned by a session that is over. A waiting request left so blocks every
/// request it conflicts with for ever (the randomized stress below hits it
/// too: a waiting CW entry of an expired session, left for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_memory_append_racing_expiry_leaves_an_orphan_entry() {
    let store = MemoryBackend::new();
    let mut orphans = Vec::new();
    for round in 0..20000 {
        let session = store.open_session(&SessionOptions::new()).await.unwrap();
        let id = session.id().to_owned();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let appender = {
            let session = Arc::clone(&session);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let request = AppendRequest {
                    dir: "orphan",
                    kind: EntryKind::Dlm,
                    attempt: "a",
                    value: b"dlm1 - EX 0 0 0",
                    conflicts: Conflicts::All,
                    nearest: 0,
                };
                barrier.wait();
                futures::executor::block_on(session.append(&request)).is_ok()
            })
        };
        let expirer = {
            let store = store.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                store.expire(&id)
            })
        };
        let appended = appender.join().unwrap();
        assert!(expirer.join().unwrap());
        let left = store.keys("orphan");
        if !left.is_empty() {
            orphans.push(format!("round {round}: append ok {appended}, left {left:?}"));
            break;
        }
        drop(session);
    }
    assert!(
        orphans.is_empty(),
        "an entry outlived its session's expiry: {orphans:?} (session state: expired)"
    );
}

/// A sweep: cancellation at every await point of `lock(PW)`,
/// `convert(EX)` (up), `convert(NL)` (down) and `release()`, each call of
/// the backend answering one poll later (as a round trip would). After
/// each cut: the guard's mode must be no more than the server's, no conversion mark may
/// be left, and — no lock having been lost — the value block must stay
/// valid; once everything is released no entry may be left. Lists every
/// cut that breaks one of these.
#[tokio::test]
pub(crate) async fn regression_cancellation_at_every_await_point_sweep() {
    let mut broken: Vec<String> = Vec::new();
    for op in ["lock PW", "convert PR→EX", "convert EX→NL", "release EX"] {
        for cut in 1..=12usize {
            let (gated, s) = gated_sessions(2).await;
            let (a, b) = (&s[0].1, &s[1].1);
            let name = "sweep";
            let resource = a.resource(name).unwrap();
            // A written, valid block to start from.
            let mut first = lock(&resource, Ex).await;
            first.set_value(b"v1").unwrap();
            first.release().await.unwrap();
            let mut guard = match op {
                "lock PW" => None,
                "convert PR→EX" => Some(lock(&resource, Pr).await),
                _ => Some(lock(&resource, Ex).await),
            };
            gated.yielding(a);
            let mut finished = false;
            let mut fresh = None;
            {
                let future: std::pin::Pin<Box<dyn Future<Output = Option<ResourceGuard>> + Send + '_>> = match op {
                    "lock PW" => Box::pin(async { resource.lock(Pw).await.ok() }),
                    "convert PR→EX" => {
                        let g = guard.as_mut().unwrap();
                        Box::pin(async move {
                            g.convert(Ex).await.unwrap();
                            None
                        })
                    }
                    "convert EX→NL" => {
                        let g = guard.as_mut().unwrap();
                        Box::pin(async move {
                            g.convert(Nl).await.unwrap();
                            None
                        })
                    }
                    _ => {
                        let g = guard.take().unwrap();
                        Box::pin(async move {
                            g.release().await.unwrap();
                            None
                        })
                    }
                };
                let mut future = future;
                for _ in 0..cut {
                    if let std::task::Poll::Ready(got) = poll!(&mut future) {
                        finished = true;
                        fresh = got;
                        break;
                    }
                }
            } // dropped here if not finished
            if fresh.is_some() {
                guard = fresh;
            }
            tokio::time::sleep(Duration::from_millis(30)).await; // background cleanups
            let queue = listed(&b.resource(name).unwrap()).await;
            let what = format!("{op}, cut after {cut} polls");
            if queue.iter().any(|c| c.converting_to().is_some()) {
                broken.push(format!("{what}: a conversion mark left: {:?}", modes(&queue)));
            }
            if let Some(g) = &guard {
                // The guard may claim less than the server holds (a
                // conversion whose answer never came), never more.
                let server = queue.iter().find(|c| c.key == g.key()).and_then(|c| c.granted);
                if !server.is_some_and(|held| g.mode().is_down_from(held)) {
                    broken.push(format!("{what}: the guard says {}, the server {server:?}", g.mode()));
                }
            }
            if let Some(g) = guard.take() {
                let _ = g.release().await;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
            let left = gated.store.keys(name);
            if !left.is_empty() {
                broken.push(format!("{what}: entries left: {left:?}"));
            }
            let seen = lock(&b.resource(name).unwrap(), Pr).await;
            // An acquire cancelled in the instant its PW grant was made
            // never held it for its caller: the block it named its holder
            // in is not valid after it, as after a loss (documented).
            if !seen.value().valid && op != "lock PW" {
                broken.push(format!("{what}: value block not valid though no lock was lost"));
            }
            seen.release().await.unwrap();
            if finished {
                break;
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken cuts:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

// ===========================================================================

/// The append's window of the queue (`AppendRequest::nearest`): an EX
/// request's append reads back the 4 entries before it and itself; a
/// request in any other mode reads the whole queue (a reader behind readers
/// would find no blocker in a window, and read again).
#[tokio::test]
async fn an_ex_append_reads_a_window_of_four_and_other_modes_the_whole_queue() {
    let (gated, mut sessions) = gated_sessions(8).await;
    let (_, asker) = sessions.pop().expect("session");
    let mut held = Vec::new();
    for (_, session) in &sessions {
        let resource = session.resource("window").expect("resource");
        held.push(resource.lock(LockMode::Pr).await.expect("PR"));
    }
    let resource = asker.resource("window").expect("resource");
    for (mode, slots) in [
        (LockMode::Ex, 5),
        (LockMode::Cw, 8),
        (LockMode::Pw, 8),
        (LockMode::Nl, 8),
    ] {
        let before: HashSet<(String, String)> = gated.ctl.appended.lock().unwrap().keys().cloned().collect();
        // Each is blocked by the PR holders but NL, which is granted.
        let guard = resource.try_lock(mode).await.expect("try");
        assert_eq!(guard.is_some(), mode == LockMode::Nl, "{mode}");
        drop(guard);
        let appended = gated.ctl.appended.lock().unwrap();
        let mine: Vec<&Appended> = appended
            .iter()
            .filter(|(key, _)| key.0 == asker.id() && !before.contains(*key))
            .map(|(_, appended)| appended)
            .collect();
        assert_eq!(mine.len(), 1, "{mode}: one append");
        let queue = mine[0].queue.as_ref().expect("the queue, read with the append");
        assert_eq!(queue.slots.len(), slots, "{mode}: entries read back with the append");
    }
    drop(held);
}

/// Was a bug: two incompatible modes granted at once. An up-conversion (A,
/// PR→PW) decides from its read after its mark, and its grant is
/// conditioned on the entries of that read. An entry appended after that
/// read (B) is granted NL (a request counts A's PW, which NL is compatible
/// with) and converts NL→PR: a conversion counts a granted entry by its
/// held mode, and A holds PR. A's grant then applied: PW beside PR. Now a
/// conversion's grant writes every other conversion towards a mode its own
/// conflicts with again, as it is, so A's grant fails its condition and A
/// reads again. The store is audited after every update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_up_conversion_granted_beside_a_later_entry_converted_up() {
    let (gated, sessions) = gated_sessions(2).await;
    gated.ctl.audit.store(true, std::sync::atomic::Ordering::SeqCst);
    let (a, b) = (&sessions[0].1, &sessions[1].1);
    let (converting, second) = converted_beside_a_stalled_conversion(&gated, a, b, "race-conv", Pr, Pr).await;
    // A's next write, decided from its read without B: held once applied
    // (or refused), while B still holds PR.
    let grant = gated.trap(a, "update_queue");
    let task = converting.resume();
    bounded("A's grant from its read", grant.reached).await.unwrap();
    let violations = gated.ctl.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    let _ = grant.resume.send(());
    // A waits on B now; B lets go, and A is granted.
    bounded("B releases", second.release()).await.unwrap();
    let (first, outcome) = bounded("A converts", task).await.unwrap();
    outcome.unwrap();
    assert_eq!(first.mode(), Pw);
    let violations = gated.ctl.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
}

/// Was a bug, the same race seen in the value block: A (CR→PW) decides from
/// a read that does not show B; B appends NL, converts NL→PW (A's held CR
/// is compatible with it), writes the block and releases. A's grant then
/// applied and wrote the block as its read had it: B's completed write was
/// lost, and every later grant saw the value before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_up_conversion_overwrote_a_completed_value_block() {
    let (gated, sessions) = gated_sessions(3).await;
    let (a, b, c) = (&sessions[0].1, &sessions[1].1, &sessions[2].1);
    let name = "race-conv-lvb";
    let (converting, mut second) = converted_beside_a_stalled_conversion(&gated, a, b, name, Cr, Pw).await;
    second.set_value(b"v1").unwrap();
    bounded("B releases", second.release()).await.unwrap();
    let task = converting.resume();
    let (first, outcome) = bounded("A converts", task).await.unwrap();
    outcome.unwrap();
    let seen = first.value();
    assert_eq!(
        (seen.sequence, seen.bytes.as_slice()),
        (1, &b"v1"[..]),
        "A's grant after B's write"
    );
    bounded("A releases", first.release()).await.unwrap();
    let after = bounded("C PW", c.resource(name).unwrap().lock(Pw)).await.unwrap();
    assert_eq!(after.value().sequence, 1, "C after B's write");
}

/// A (`a`) holds `held` on `name` and converts to PW, stalled right after
/// its read that follows its mark; then B (`b`) is granted NL and converts
/// to `later`, which must be granted (a conversion counts A by the mode it
/// holds). Returns A's stalled conversion and B's guard.
async fn converted_beside_a_stalled_conversion(
    gated: &Gated,
    a: &Session,
    b: &Session,
    name: &str,
    held: LockMode,
    later: LockMode,
) -> (Stalled<(ResourceGuard, lockline::Result<()>)>, ResourceGuard) {
    let mut first = bounded("A's lock", a.resource(name).unwrap().lock(held)).await.unwrap();
    let converting = stalled_after_its_read(gated, a, async move {
        let outcome = first.convert(Pw).await;
        (first, outcome)
    })
    .await;
    // A holds a read without B, and will grant from it.
    let mut second = bounded("try NL", b.resource(name).unwrap().try_lock(Nl))
        .await
        .unwrap()
        .expect("NL beside anything");
    assert!(
        bounded("B's try_convert", second.try_convert(later)).await.unwrap(),
        "NL→{later} beside a {held} holder converting to PW"
    );
    (converting, second)
}

/// An up-conversion of `session` run as `convert`, held after its second
/// read of the queue (the one after its mark), from which it decides.
struct Stalled<T> {
    task: tokio::task::JoinHandle<T>,
    resume: oneshot::Sender<()>,
}

impl<T> Stalled<T> {
    fn resume(self) -> tokio::task::JoinHandle<T> {
        let _ = self.resume.send(());
        self.task
    }
}

async fn stalled_after_its_read<T: Send + 'static>(
    gated: &Gated,
    session: &Session,
    convert: impl Future<Output = T> + Send + 'static,
) -> Stalled<T> {
    let read = gated.trap(session, "read_queue");
    let task = tokio::spawn(convert);
    bounded("the conversion's first read", read.reached).await.unwrap();
    let mark = gated.trap(session, "update_queue");
    let _ = read.resume.send(());
    bounded("the conversion's mark", mark.reached).await.unwrap();
    let read = gated.trap(session, "read_queue");
    let _ = mark.resume.send(());
    bounded("the conversion's read after its mark", read.reached)
        .await
        .unwrap();
    Stalled {
        task,
        resume: read.resume,
    }
}

/// Was a bug: a cancelled conversion's mark left for good. The background
/// take-back of a conversion dropped after its mark gave up after eight
/// failed tries (about five seconds of a server not answering), and the
/// mark stayed on a live holder's entry: every later request but NL
/// waited for ever behind it. It now tries until it is done or the session
/// is over, and `flush` waits for it. Here the session's reads fail ten
/// times in a row after the drop, then answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_a_cancelled_conversion_is_taken_back_after_a_long_outage() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "take-back-outage";
    let resource = b.resource(name).unwrap();
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let second = lock(&resource, Pr).await;
    {
        let mut converting = std::pin::pin!(first.convert(Ex));
        bounded("the conversion's mark", async {
            loop {
                tokio::select! {
                    outcome = &mut converting => panic!("EX beside another PR: {outcome:?}"),
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
                if listed(&resource).await.iter().any(|c| c.converting_to() == Some(Ex)) {
                    return;
                }
            }
        })
        .await;
        for _ in 0..10 {
            gated.lose_answer(a, "read_queue");
        }
    }
    bounded("the session's background work", a.flush()).await;
    assert_eq!(first.mode(), Pr);
    let queue = listed(&resource).await;
    assert!(queue.iter().all(|c| c.converting_to().is_none()), "{:?}", modes(&queue));
    // Nothing but the two PR holders: a third PR is let in beside them.
    let third = bounded("PR beside two PR", resource.try_lock(Pr)).await.unwrap();
    assert!(third.is_some(), "{:?}", modes(&listed(&resource).await));
    drop(third);
    first.release().await.unwrap();
    second.release().await.unwrap();
}

/// Was a bug: a lock-mode guard dropped outside a runtime (on a thread of
/// its own) was removed as a plain delete: its value block was never
/// written, so the next holder saw the block not valid as after a loss,
/// and lost the value set. The drop now hands over and writes the block on
/// the session's runtime, as a drop inside one does, and `flush` waits for
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_a_guard_dropped_outside_a_runtime_writes_its_value_block() {
    let (_store, s) = memory_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "dropped-off-runtime";
    let mut writer = lock(&a.resource(name).unwrap(), Pw).await;
    writer.set_value(b"v1").unwrap();
    std::thread::spawn(move || drop(writer)).join().unwrap();
    bounded("the dropped guard's release", a.flush()).await;
    let next = bounded("PW after the drop", b.resource(name).unwrap().try_lock(Pw))
        .await
        .unwrap()
        .expect("free once the dropped guard's release ran");
    let value = next.value();
    assert_eq!(
        (value.bytes.as_slice(), value.sequence, value.valid),
        (&b"v1"[..], 1, true),
        "the block as the dropped guard left it"
    );
    next.release().await.unwrap();
}

/// Was a deviation: a guard whose up-conversion was cancelled after its
/// grant landed (the answer never came) claims its old mode until it
/// learns more. Its next conversion up from that mode to a writing one
/// learned the mode held and, that mode being the one asked or above it,
/// kept the landed grant's token: below the token of a lock granted beside
/// it meanwhile (CR beside PW; CW beside CW). Fencing held (the mode was
/// held throughout), but an up-conversion to CW, PW or EX takes a fresh
/// token above every token granted so far, and this one now does. (The
/// same-mode case was found by an outside review of the first fix.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_an_up_conversion_after_a_cancelled_one_that_landed_takes_a_fresh_token() {
    // (held, converted to and landed, granted beside meanwhile, asked next)
    let cases = [
        (Nl, Pw, Cr, Cw),
        (Nl, Pw, Cr, Pw),
        (Nl, Cw, Cw, Cw),
        (Pr, Ex, Nl, Pw),
        (Cr, Ex, Nl, Ex),
    ];
    // Both ways a conversion's write goes: blind, and (a lock that listens
    // for the waiters it blocks) after a read that keeps their marks.
    for listening in [false, true] {
        for (held, landed, beside, asked) in cases {
            up_after_a_cancelled_one_that_landed(listening, held, landed, beside, asked).await;
        }
    }
}

async fn up_after_a_cancelled_one_that_landed(
    listening: bool,
    held: LockMode,
    landed: LockMode,
    beside: LockMode,
    asked: LockMode,
) {
    let case = format!("{held} → {landed} landed, {beside} beside, then {asked} (listening: {listening})");
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "fresh-after-landed";
    let resource = b.resource(name).unwrap();
    let mine = a.resource(name).unwrap();
    let mine = if listening { mine.notify_blocking() } else { mine };
    let mut guard = lock(&mine, held).await;
    {
        // The conversion's mark, then its grant: each stopped once applied;
        // the grant's answer never comes, the call being dropped.
        let mark = gated.trap(a, "update_queue");
        let mut converting = std::pin::pin!(guard.convert(landed));
        bounded("the conversion's mark", async {
            tokio::select! {
                outcome = &mut converting => panic!("{case}: converted without its mark: {outcome:?}"),
                _ = mark.reached => {}
            }
        })
        .await;
        let grant = gated.trap(a, "update_queue");
        let _ = mark.resume.send(());
        bounded("the conversion's grant", async {
            tokio::select! {
                outcome = &mut converting => panic!("{case}: the grant's answer came: {outcome:?}"),
                _ = grant.reached => {}
            }
        })
        .await;
    }
    assert!(
        guard.mode().is_down_from(held),
        "{case}: the guard claims {}",
        guard.mode()
    );
    let queue = listed(&resource).await;
    assert_eq!(modes(&queue), vec![(Some(landed), landed)], "{case}: the grant landed");
    let landed_token = queue[0].token.expect("the landed grant's token");
    // A lock beside it, granted with a token above the landed grant's.
    let other = lock(&resource, beside).await;
    assert!(
        other.token() > landed_token,
        "{case}: {} against {landed_token}",
        other.token()
    );

    bounded("the next conversion", guard.convert(asked))
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(guard.mode(), asked, "{case}");
    assert!(
        guard.token() > other.token(),
        "{case}: the up-conversion took {}, below the {} granted before it",
        guard.token(),
        other.token()
    );
    let queue = listed(&resource).await;
    let mine = queue
        .iter()
        .find(|c| c.granted == Some(asked) && c.session.as_deref() == Some(a.id()));
    assert_eq!(
        mine.and_then(|c| c.token),
        Some(guard.token()),
        "{case}: the server holds the guard's token: {:?}",
        modes(&queue)
    );
    other.release().await.unwrap();
    guard.release().await.unwrap();
}
