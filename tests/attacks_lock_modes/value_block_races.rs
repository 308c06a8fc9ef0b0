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
    // G holds NL before H is lost (a grant after the loss would clear the
    // name already).
    let mut first = lock(&g.resource(name).unwrap(), Nl).await;
    lost_pw_holder(&gated, h, name).await;
    // Read before the mark, the mark, the read after it: stalled there.
    let read = gated.trap(g, "read_queue");
    let task = tokio::spawn(async move {
        let outcome = first.convert(Cr).await;
        (first, outcome)
    });
    bounded("G's first read", read.reached).await.unwrap();
    let mark = gated.trap(g, "update_queue");
    let _ = read.resume.send(());
    bounded("G's mark", mark.reached).await.unwrap();
    let read = gated.trap(g, "read_queue");
    let _ = mark.resume.send(());
    bounded("G's read after its mark", read.reached).await.unwrap();
    let mut later = lock(&l.resource(name).unwrap(), Pw).await;
    later.set_value(b"v1").unwrap();
    bounded("L releases", later.release()).await.unwrap();
    let _ = read.resume.send(());
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
/// down-conversion that would have written it is cancelled between its
/// read (a listening lock reads first) and its write: the value stays
/// pending, and the release writes it. It was taken from the guard before
/// the write, and lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_value_set_survives_a_down_conversion_cancelled_before_its_write() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "lvb-race-down-cancelled";
    let resource = a.resource(name).unwrap().notify_blocking();
    let mut guard = lock(&resource, Ex).await;
    guard.set_value(b"v1").unwrap();
    {
        let armed = gated.trap(a, "read_queue");
        let mut down = std::pin::pin!(guard.convert(Nl));
        tokio::select! {
            outcome = &mut down => panic!("the trap did not stop the down-conversion: {outcome:?}"),
            _ = armed.reached => {}
        }
        // Dropped after its read, before its write.
    }
    bounded("release", guard.release()).await.unwrap();
    let seen = lock(&b.resource(name).unwrap(), Pr).await;
    let value = seen.value();
    assert_eq!(
        (value.bytes.as_slice(), value.sequence, value.valid),
        (&b"v1"[..], 1, true)
    );
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
