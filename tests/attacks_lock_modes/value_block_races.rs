//! A grant outside PW and EX that clears a lost holder's name from the
//! value block (`Block::cleared_if_lost`) writes the block as the read that
//! decided it had it, and its condition does not cover an entry appended
//! after that read. A PW holder appended since (compatible with the grant's
//! mode) writes the block in between; the older grant then overwrote that
//! completed write. A PW or EX grant now writes again every earlier entry
//! whose grant may be pending (`View::pending_before`), so that grant fails
//! its condition and reads again. Each case fails without that.

use super::*;

/// A PW holder's session expires without a release: the block names a
/// holder that is gone.
async fn lost_pw_holder(gated: &Gated, h: &Session, name: &str) {
    let doomed = lock(&h.resource(name).unwrap(), Pw).await;
    assert!(gated.store.expire(h.id()));
    bounded("lost", doomed.lost()).await;
}

/// After R's write, the next PW holder must see L's completed write.
async fn assert_sees_v1(c: &Session, name: &str, what: &str) {
    let after = bounded("C PW", c.resource(name).unwrap().lock(Pw)).await.unwrap();
    let seen = after.value();
    assert!(
        seen.sequence == 1 && seen.bytes == b"v1" && seen.valid,
        "{what}: after L wrote 'v1' (sequence 1, valid) and released, the next PW holder sees {:?} \
         (sequence {}, valid {})",
        String::from_utf8_lossy(&seen.bytes),
        seen.sequence,
        seen.valid
    );
}

/// A request's own grant. R's CR request decides from its append's read
/// (the block names the lost H: clear it) and is stalled there, before its
/// grant's write; L asks PW behind R (CR is compatible with PW), is
/// granted, writes `v1` and leaves PW. R's grant is conditioned on the
/// entries before it and itself only: before the fix it applied, and wrote
/// the block as its read had it; now L's grant wrote R's entry again, and
/// R reads again. R asks with `try_lock` (never handed the lock, so its
/// own grant is the one that writes) and L releases; or R asks with `lock`
/// and L converts down to NL, which hands nothing over.
async fn request_stalled_beside_a_later_writer(name: &str, plain: bool) {
    let (gated, s) = gated_sessions(4).await;
    let (h, r, l, c) = (&s[0].1, &s[1].1, &s[2].1, &s[3].1);
    lost_pw_holder(&gated, h, name).await;
    let armed = gated.trap(r, "append");
    let rr = r.resource(name).unwrap();
    let requesting = tokio::spawn(async move {
        if plain {
            rr.lock(Cr).await.map(Some)
        } else {
            rr.try_lock(Cr).await
        }
    });
    bounded("R's append", armed.reached).await.unwrap();
    let mut later = lock(&l.resource(name).unwrap(), Pw).await;
    later.set_value(b"v1").unwrap();
    let still = if plain {
        bounded("L converts down", later.convert(Nl)).await.unwrap();
        Some(later)
    } else {
        bounded("L releases", later.release()).await.unwrap();
        None
    };
    let _ = armed.resume.send(());
    let reader = bounded("R", requesting).await.unwrap().unwrap().expect("CR granted");
    bounded("R releases", reader.release()).await.unwrap();
    if let Some(later) = still {
        bounded("L releases", later.release()).await.unwrap();
    }
    assert_sees_v1(c, name, if plain { "request, L converted down" } else { "request" }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_request_grant_cleared_the_block_over_a_later_writer() {
    request_stalled_beside_a_later_writer("lvb-race-request", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_request_grant_cleared_the_block_over_a_writer_converted_down() {
    request_stalled_beside_a_later_writer("lvb-race-request-down", true).await;
}

/// G holds NL; H, holding PW, is lost (the block names it); G converts to
/// CR and is stalled after its read after the mark (before the loss, a
/// grant would clear the name already). Returns G's conversion and the
/// sender that lets it go on.
async fn nl_to_cr_stalled_after_a_loss(
    gated: &Gated,
    g: &Session,
    h: &Session,
    name: &str,
) -> (
    tokio::task::JoinHandle<(ResourceGuard, lockline::Result<()>)>,
    oneshot::Sender<()>,
) {
    let mut first = lock(&g.resource(name).unwrap(), Nl).await;
    lost_pw_holder(gated, h, name).await;
    let read = gated.trap(g, "read_queue");
    let task = tokio::spawn(async move {
        let outcome = first.convert(Cr).await;
        (first, outcome)
    });
    bounded("G's first read", read.reached).await.unwrap();
    let mark = gated.trap(g, "update_queue");
    let _ = read.resume.send(());
    bounded("G's mark", mark.reached).await.unwrap();
    let after = gated.trap(g, "read_queue");
    let _ = mark.resume.send(());
    bounded("G's read after its mark", after.reached).await.unwrap();
    (task, after.resume)
}

/// An up-conversion's grant (NL→CR, not a writer: it clears the lost
/// name). G holds NL and converts to CR, stalled after its read after the
/// mark; L asks PW (G counts NL and CR, both compatible), writes `v1`,
/// releases (a conversion is never handed over to). G's grant is
/// conditioned on the entries of its read, which L is not among: before
/// the fix it applied; now L's grant wrote G's entry again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_conversion_grant_cleared_the_block_over_a_later_writer() {
    let (gated, s) = gated_sessions(4).await;
    let (h, g, l, c) = (&s[0].1, &s[1].1, &s[2].1, &s[3].1);
    let name = "lvb-race-conversion";
    let (task, resume) = nl_to_cr_stalled_after_a_loss(&gated, g, h, name).await;
    let mut later = lock(&l.resource(name).unwrap(), Pw).await;
    later.set_value(b"v1").unwrap();
    bounded("L releases", later.release()).await.unwrap();
    let _ = resume.send(());
    let (first, outcome) = bounded("G converts", task).await.unwrap();
    outcome.unwrap();
    assert_eq!(first.mode(), Cr);
    bounded("G releases", first.release()).await.unwrap();
    assert_sees_v1(c, name, "conversion").await;
}

/// Control: the same steps with R's grant written before L comes: the
/// next PW holder sees L's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_request_granted_before_a_later_writer_leaves_its_block_alone() {
    let (gated, s) = gated_sessions(4).await;
    let (h, r, l, c) = (&s[0].1, &s[1].1, &s[2].1, &s[3].1);
    let name = "lvb-race-control";
    lost_pw_holder(&gated, h, name).await;
    let reader = bounded("R", r.resource(name).unwrap().try_lock(Cr))
        .await
        .unwrap()
        .expect("CR granted");
    let mut later = lock(&l.resource(name).unwrap(), Pw).await;
    later.set_value(b"v1").unwrap();
    bounded("L releases", later.release()).await.unwrap();
    bounded("R releases", reader.release()).await.unwrap();
    assert_sees_v1(c, name, "control").await;
}

/// A value set while EX is written when the lock leaves EX, even when a
/// conversion out of EX (to `to`; a listening lock's down-conversion reads
/// first) is cancelled between its read and its write. The value stays
/// pending; the guard is then released (`release`), or dropped, whose
/// release writes the block it kept when its read shows the lock still EX.
/// Before the fixes the down-conversion took the value from the guard
/// before its write and cleared the release block, and it was lost.
async fn value_survives_a_cancelled_conversion(name: &str, to: LockMode, release: bool) {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let resource = a.resource(name).unwrap().notify_blocking();
    let mut guard = lock(&resource, Ex).await;
    guard.set_value(b"v1").unwrap();
    {
        let armed = gated.trap(a, "read_queue");
        let mut down = std::pin::pin!(guard.convert(to));
        tokio::select! {
            outcome = &mut down => panic!("the trap did not stop the conversion: {outcome:?}"),
            _ = armed.reached => {}
        }
        // Dropped after its read, before its write.
    }
    let rb = b.resource(name).unwrap();
    if release {
        bounded("release", guard.release()).await.unwrap();
    } else {
        drop(guard);
        until_queue(&rb, "A's entry leaves", <[ModeContender]>::is_empty).await;
    }
    let seen = lock(&rb, Pr).await;
    let value = seen.value();
    assert_eq!(
        (value.bytes.as_slice(), value.sequence, value.valid),
        (&b"v1"[..], 1, true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_value_set_survives_a_down_conversion_cancelled_before_its_write() {
    value_survives_a_cancelled_conversion("lvb-race-down-cancelled", Nl, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_value_set_survives_a_cancelled_down_conversion_and_a_dropped_guard() {
    value_survives_a_cancelled_conversion("lvb-race-down-cancelled-drop", Nl, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_value_set_survives_a_cancelled_ex_to_pw_and_a_dropped_guard() {
    value_survives_a_cancelled_conversion("lvb-race-ex-pw-cancelled-drop", Pw, false).await;
}

/// The same down-conversion let through: its write carries the value, and
/// the release after it writes nothing more (the next holder sees one
/// write, not two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_value_set_is_written_once_by_a_down_conversion() {
    let (_gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "lvb-race-down-once";
    let resource = a.resource(name).unwrap().notify_blocking();
    let mut guard = lock(&resource, Ex).await;
    guard.set_value(b"v1").unwrap();
    bounded("down", guard.convert(Nl)).await.unwrap();
    bounded("release", guard.release()).await.unwrap();
    let seen = lock(&b.resource(name).unwrap(), Pr).await;
    let value = seen.value();
    assert_eq!(
        (value.bytes.as_slice(), value.sequence, value.valid),
        (&b"v1"[..], 1, true)
    );
}

async fn next_pw_sees(c: &Session, name: &str) -> (Vec<u8>, u64, bool) {
    let after = bounded("C PW", c.resource(name).unwrap().lock(Pw)).await.unwrap();
    let v = after.value();
    after.release().await.unwrap();
    (v.bytes, v.sequence, v.valid)
}

/// A takes CR on `name` and converts to PW; its grant is applied and its
/// answer lost (after its mark and its read after it). Returns A's guard
/// once the conversion returned, in PW.
async fn cr_to_pw_with_the_grant_answer_lost(gated: &Gated, a: &Session, name: &str) -> ResourceGuard {
    let mut g = lock(&a.resource(name).unwrap(), Cr).await;
    let mark = gated.trap(a, "update_queue");
    let task = tokio::spawn(async move {
        let out = g.convert(Pw).await;
        (g, out)
    });
    bounded("A's mark", mark.reached).await.unwrap();
    let read = gated.trap(a, "read_queue");
    let _ = mark.resume.send(());
    bounded("A's read after its mark", read.reached).await.unwrap();
    // The next update_queue of A is the grant: applied, answer lost.
    gated.lose_answer(a, "update_queue");
    let _ = read.resume.send(());
    let (g, out) = bounded("A converts", task).await.unwrap();
    out.unwrap();
    assert_eq!(g.mode(), Pw);
    g
}

/// An up-conversion CR→PW whose grant is applied and whose answer is
/// lost. Before the fix: `granting` resends the same conditioned update, which fails (its
/// own version changed); `up` then sets the mode back to CR and re-reads,
/// finds itself PW "not marked", and writes a fresh mark `CR→PW` over its
/// own PW grant. Its second grant then read a block naming itself as a
/// holder not in PW: not valid, though no holder was ever lost. Now the
/// read after the failed resend finds the grant landed, and takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_an_up_conversion_whose_grant_answer_was_lost_keeps_the_block_valid() {
    let (gated, s) = gated_sessions(2).await;
    let (a, c) = (&s[0].1, &s[1].1);
    let name = "lvb-race-up-lost-answer";
    let g = cr_to_pw_with_the_grant_answer_lost(&gated, a, name).await;
    let v = g.value();
    let seen_by_a = (v.bytes.clone(), v.sequence, v.valid);
    g.release().await.unwrap();
    let seen_by_c = next_pw_sees(c, name).await;
    assert_eq!(
        (seen_by_a, seen_by_c),
        ((vec![], 0, true), (vec![], 0, true)),
        "(A after its PW grant, the next PW holder): no holder was ever lost"
    );
}

/// The same with a second CR holder B. Before the fix A's mark over its
/// own grant put the store back to CR converting to PW for a moment, and
/// another conversion counted A by CR. Now A writes nothing after the
/// lost answer: the store shows A in PW, B's CR→PW waits for it, and is
/// granted with the block valid once A goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_an_up_conversion_whose_grant_answer_was_lost_writes_no_mark_over_it() {
    let (gated, s) = gated_sessions(2).await;
    let (a, (cb, b)) = (&s[0].1, (&s[1].0, &s[1].1));
    let name = "lvb-race-up-lost-answer-b";
    let mut gb = lock(&b.resource(name).unwrap(), Cr).await;
    let ga = cr_to_pw_with_the_grant_answer_lost(&gated, a, name).await;
    let rb = b.resource(name).unwrap();
    assert_eq!(modes(&listed(&rb).await), vec![(Some(Cr), Cr), (Some(Pw), Pw)]);
    let waits = cb.stats().waits;
    let converting = tokio::spawn(async move {
        let out = gb.convert(Pw).await;
        (gb, out)
    });
    bounded("B waits", cb.wait_for_stats(|st| st.waits > waits)).await;
    ga.release().await.unwrap();
    let (gb, out) = bounded("B converts", converting).await.unwrap();
    out.unwrap();
    let value = gb.value();
    assert!(
        value.valid,
        "B, granted PW with no holder ever lost, sees the block not valid: {value:?}"
    );
    gb.release().await.unwrap();
}

/// X holds PR, W waits for PW behind it, X's release hands W the lock
/// (counted on X's client), and W writes `v1` and releases.
async fn writer_handed_the_lock_writes_v1(x: (&Client, &Session), w: (&Client, &Session), name: &str) {
    let ((cx, x), (cw, w)) = (x, w);
    let mut xg = lock(&x.resource(name).unwrap(), Pr).await;
    // A conversion drops the grant's read: the release reads and hands over.
    xg.convert(Pr).await.unwrap();
    let rw = w.resource(name).unwrap();
    let writer = tokio::spawn(async move { rw.lock(Pw).await });
    bounded("W waits", cw.wait_for_stats(|st| st.waits >= 1)).await;
    let before = cx.stats().handovers;
    xg.release().await.unwrap();
    let mut wg = bounded("W", writer).await.unwrap().unwrap();
    assert_eq!(cx.stats().handovers, before + 1, "X's release handed over");
    wg.set_value(b"v1").unwrap();
    wg.release().await.unwrap();
}

/// A PW request handed the lock writes the stalled grants before it
/// again, as its own grant would. H lost (block names it). R
/// `try_lock(CR)` decides from its append's read (clear H), stalled. X
/// gets PR (clears H itself). W waits for PW behind X. X's release hands W
/// PW (R is a try: not handed). W writes v1, releases. R's stale grant
/// must not overwrite v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_writer_handed_the_lock_writes_a_stalled_request_again() {
    let (gated, s) = gated_sessions(5).await;
    let (h, r, (cx, x), (cw, w), c) = (&s[0].1, &s[1].1, (&s[2].0, &s[2].1), (&s[3].0, &s[3].1), &s[4].1);
    let name = "lvb-race-handover-stale-request";
    lost_pw_holder(&gated, h, name).await;
    let armed = gated.trap(r, "append");
    let rr = r.resource(name).unwrap();
    let trying = tokio::spawn(async move { rr.try_lock(Cr).await });
    bounded("R's append", armed.reached).await.unwrap();
    writer_handed_the_lock_writes_v1((cx, x), (cw, w), name).await;
    let _ = armed.resume.send(());
    let rg = bounded("R", trying).await.unwrap().unwrap();
    if let Some(rg) = rg {
        rg.release().await.unwrap();
    }
    assert_eq!(next_pw_sees(c, name).await, (b"v1".to_vec(), 1, true));
}

/// The same with the stale grant an up-conversion NL→CR (stalled
/// after its read after its mark) and the writer handed PW by X's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_writer_handed_the_lock_writes_a_stalled_conversion_again() {
    let (gated, s) = gated_sessions(5).await;
    let (h, g, (cx, x), (cw, w), c) = (&s[0].1, &s[1].1, (&s[2].0, &s[2].1), (&s[3].0, &s[3].1), &s[4].1);
    let name = "lvb-race-handover-stale-conversion";
    let (task, resume) = nl_to_cr_stalled_after_a_loss(&gated, g, h, name).await;
    writer_handed_the_lock_writes_v1((cx, x), (cw, w), name).await;
    let _ = resume.send(());
    let (first, outcome) = bounded("G converts", task).await.unwrap();
    outcome.unwrap();
    first.release().await.unwrap();
    assert_eq!(next_pw_sees(c, name).await, (b"v1".to_vec(), 1, true));
}

/// The hand-over made by a try withdrawing: Y holds CR (its grant
/// clears H's name, after R's stale read). X's `try_lock(EX)` appends
/// (blocked by Y), stalled; W waits for PW behind X; X withdraws and its
/// leaving hands W PW (CR beside PW).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_writer_handed_the_lock_by_a_withdrawing_try_writes_a_stalled_request_again() {
    let (gated, s) = gated_sessions(6).await;
    let (h, r, (cx, x), (cw, w), c, y) = (
        &s[0].1,
        &s[1].1,
        (&s[2].0, &s[2].1),
        (&s[3].0, &s[3].1),
        &s[4].1,
        &s[5].1,
    );
    let name = "lvb-race-try-withdraw-stale-request";
    lost_pw_holder(&gated, h, name).await;
    let armed = gated.trap(r, "append");
    let rr = r.resource(name).unwrap();
    let trying = tokio::spawn(async move { rr.try_lock(Cr).await });
    bounded("R's append", armed.reached).await.unwrap();
    let yg = lock(&y.resource(name).unwrap(), Cr).await;
    let xa = gated.trap(x, "append");
    let rx = x.resource(name).unwrap();
    let xtry = tokio::spawn(async move { rx.try_lock(Ex).await.map(|g| g.is_some()) });
    bounded("X's append", xa.reached).await.unwrap();
    let rw = w.resource(name).unwrap();
    let writer = tokio::spawn(async move { rw.lock(Pw).await });
    bounded("W waits", cw.wait_for_stats(|st| st.waits >= 1)).await;
    let before = cx.stats().handovers;
    let _ = xa.resume.send(());
    assert!(!bounded("X's try", xtry).await.unwrap().unwrap());
    let mut wg = bounded("W", writer).await.unwrap().unwrap();
    assert_eq!(cx.stats().handovers, before + 1, "X's withdrawal handed over");
    wg.set_value(b"v1").unwrap();
    wg.release().await.unwrap();
    let _ = armed.resume.send(());
    if let Some(rg) = bounded("R", trying).await.unwrap().unwrap() {
        rg.release().await.unwrap();
    }
    yg.release().await.unwrap();
    assert_eq!(next_pw_sees(c, name).await, (b"v1".to_vec(), 1, true));
}
