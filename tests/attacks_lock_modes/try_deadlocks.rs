//! A `try_` request's entry and a `try_convert`'s mark stand in the queue
//! for a moment, but never wait: the one leaves and the other gives up
//! where it would wait. A conversion that finds a cycle only through such
//! an entry is not deadlocked, and waits (`State::never_waits`). Each case
//! stalls the try at one of its calls, and failed with `Deadlock` before.

use super::*;

/// A holds PR, B holds NL. A's `try_convert(EX)` reads (nothing blocks
/// it) and is stalled there; B converts NL→CR (A unmarked); A's mark is
/// written and A stalled after it. B's CR→PW waits for A's PR alone: the
/// cycle through A's mark (EX blocked by B's CR) is one A never waits on.
/// B waits; A's try gives up; B is granted PW once A lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_try_convert_mark_closes_no_deadlock() {
    let (gated, s) = gated_sessions(2).await;
    let (a, (cb, b)) = (&s[0].1, (&s[1].0, &s[1].1));
    let name = "try-convert-no-deadlock";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let mut second = lock(&b.resource(name).unwrap(), Nl).await;
    let read = gated.trap(a, "read_queue");
    let trying = tokio::spawn(async move {
        let outcome = first.try_convert(Ex).await;
        (first, outcome)
    });
    bounded("A's read", read.reached).await.unwrap();
    bounded("B NL→CR", second.convert(Cr)).await.unwrap();
    let mark = gated.trap(a, "update_queue");
    let _ = read.resume.send(());
    bounded("A's mark", mark.reached).await.unwrap();
    let waits = cb.stats().waits;
    let converting = tokio::spawn(async move {
        let outcome = second.convert(Pw).await;
        (second, outcome)
    });
    bounded("B waits", cb.wait_for_stats(|st| st.waits > waits)).await;
    let _ = mark.resume.send(());
    let (first, tried) = bounded("A's try", trying).await.unwrap();
    assert!(!tried.expect("A's try_convert"), "A's EX was blocked by B's CR");
    assert_eq!(first.mode(), Pr);
    bounded("A releases", first.release()).await.unwrap();
    let (second, outcome) = bounded("B's conversion", converting).await.unwrap();
    outcome.expect("B's CR→PW waits for A's PR, and is granted once it goes");
    assert_eq!(second.mode(), Pw);
}

/// X holds PR. C's `try_lock(PW)` appends (its entry waits behind X) and
/// is stalled there; Y is granted CR; X converts PR→EX and waits for Y.
/// Y's CR→PR then waits for C's PW request, which waits on X, which waits
/// on Y: a cycle only through C's entry, which never waits. Y waits; C
/// leaves; Y is granted PR beside X's PR, and X's EX once both let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_try_request_entry_closes_no_deadlock() {
    let (gated, s) = gated_sessions(3).await;
    let ((cx, x), c, (cy, y)) = ((&s[0].0, &s[0].1), &s[1].1, (&s[2].0, &s[2].1));
    let name = "try-lock-no-deadlock";
    let mut xg = lock(&x.resource(name).unwrap(), Pr).await;
    let append = gated.trap(c, "append");
    let rc = c.resource(name).unwrap();
    let trying = tokio::spawn(async move { rc.try_lock(Pw).await.map(|g| g.is_some()) });
    bounded("C's append", append.reached).await.unwrap();
    let mut yg = lock(&y.resource(name).unwrap(), Cr).await;
    let waits = cx.stats().waits;
    let x_converting = tokio::spawn(async move {
        let outcome = xg.convert(Ex).await;
        (xg, outcome)
    });
    bounded("X waits", cx.wait_for_stats(|st| st.waits > waits)).await;
    let waits = cy.stats().waits;
    let y_converting = tokio::spawn(async move {
        let outcome = yg.convert(Pr).await;
        (yg, outcome)
    });
    bounded("Y waits", cy.wait_for_stats(|st| st.waits > waits)).await;
    let _ = append.resume.send(());
    assert!(!bounded("C's try", trying).await.unwrap().expect("C's try_lock"));
    let (yg, outcome) = bounded("Y's conversion", y_converting).await.unwrap();
    outcome.expect("Y's CR→PR is granted once C's entry is gone");
    assert_eq!(yg.mode(), Pr);
    bounded("Y releases", yg.release()).await.unwrap();
    let (xg, outcome) = bounded("X's conversion", x_converting).await.unwrap();
    outcome.expect("X's PR→EX is granted once Y goes");
    assert_eq!(xg.mode(), Ex);
}

/// A try's mark does not hide a real deadlock. A holds PR, B holds NL. A's `try_convert(EX)` writes its (even)
/// mark and is dropped there; its background take-back is stalled after
/// its read. B converts NL→PR. A's guard then converts to EX, waiting (it
/// finds its own stale try mark and marks again); B's PR→EX closes a real
/// cycle and must fail with Deadlock (no hang).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_waiting_conversion_after_a_dropped_try_still_finds_its_deadlock() {
    let (gated, s) = gated_sessions(2).await;
    let ((ca, a), b) = ((&s[0].0, &s[0].1), &s[1].1);
    let name = "try-then-wait-deadlock";
    let mut ga = lock(&a.resource(name).unwrap(), Pr).await;
    let mut gb = lock(&b.resource(name).unwrap(), Nl).await;
    let tb = {
        let mark = gated.trap(a, "update_queue");
        let mut trying = Box::pin(ga.try_convert(Ex));
        tokio::select! {
            outcome = &mut trying => panic!("not stopped: {outcome:?}"),
            _ = mark.reached => {}
        }
        // The take-back's read: stalled.
        let tb = gated.trap(a, "read_queue");
        drop(trying);
        drop(mark.resume);
        tb
    };
    {
        bounded("take-back read", tb.reached).await.unwrap();
        let listing = listed(&b.resource(name).unwrap()).await;
        eprintln!("after A's try mark: {:?}", modes(&listing));
        bounded("B NL→PR", gb.convert(Pr)).await.unwrap();
        let waits = ca.stats().waits;
        let a_conv = tokio::spawn(async move {
            let out = ga.convert(Ex).await;
            (ga, out)
        });
        bounded("A waits", ca.wait_for_stats(|st| st.waits > waits)).await;
        let out = bounded("B's PR→EX", gb.convert(Ex)).await;
        let _ = tb.resume.send(());
        match out {
            Err(Error::Deadlock { .. }) => {}
            other => panic!("B's PR→EX: expected Deadlock, got {other:?}"),
        }
        gb.release().await.unwrap();
        let (ga, out) = bounded("A", a_conv).await.unwrap();
        out.unwrap();
        assert_eq!(ga.mode(), Ex);
    }
}
