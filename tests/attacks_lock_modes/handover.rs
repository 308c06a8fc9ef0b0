//! Hand-over attacks: a release (or a leaving request) grants, in its one
//! write, the waiting requests its departure lets in; they learn it from
//! their wake.

use super::*;

/// The value block as a grant reports it: (bytes, sequence, valid).
pub(crate) fn block_of(guard: &ResourceGuard) -> (Vec<u8>, u64, bool) {
    let value = guard.value();
    (value.bytes, value.sequence, value.valid)
}

/// The next holder: locks `resource` in EX, timed, and lets go again.
/// Returns the value block it found (as [`block_of`] reads it) and how long
/// its lock took.
async fn next_holder_finds(resource: &Resource) -> ((Vec<u8>, u64, bool), Duration) {
    let started = Instant::now();
    let next = lock(resource, Ex).await;
    let took = started.elapsed();
    let block = block_of(&next);
    next.release().await.unwrap();
    (block, took)
}

/// A request dropped while its append is in flight (applied in the store,
/// its answer not back) is abandoned by attempt, and `abandon` deletes its
/// entry plainly. A release that handed that entry EX in between named it
/// in the value block, so its plain deletion reads as an involuntary loss:
/// the next holder finds the block not valid and is held back for its
/// lock-delay, though nobody lost anything.
///
/// 1. A holds EX and sets the block to `v1`.
/// 2. B's `lock(EX)` appends (applied), and is dropped before the answer
///    comes back: its `PendingEntry` knows the attempt only.
/// 3. A releases: `hand_over` grants B's entry EX and names it in the block.
/// 4. B's cleanup abandons the attempt: a plain delete.
/// 5. C (lock-delay 1 s) locks EX: the block names a gone PW/EX holder.
#[tokio::test]
pub(crate) async fn request_abandoned_after_it_was_handed_the_lock_leaves_the_value_block_not_valid_but_kept() {
    let delay = Duration::from_millis(1000);
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let (_cc, c) = delayed_session(gated.clone(), delay).await;
    let name = "abandoned-handed";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    // A conversion, even to the mode held, drops the read the grant was
    // made from: the release reads the queue and hands over to the waiter
    // queued since (a holder granted before anyone waited otherwise
    // releases plainly, and its waiter grants itself).
    holder.convert(Ex).await.unwrap();
    holder.set_value(b"v1").unwrap();
    let armed = gated.trap(b, "append");
    let rb = b.resource(name).unwrap();
    let mut request = Box::pin(rb.lock(Ex));
    assert!(poll!(&mut request).is_pending());
    armed.reached.await.unwrap();
    holder.release().await.unwrap();
    assert_eq!(
        modes(&listed(&ra).await),
        vec![(Some(Ex), Ex)],
        "the release handed B's entry the lock"
    );
    drop(request);
    drop(armed.resume);
    until_queue(&ra, "B's abandoned request leaves", <[ModeContender]>::is_empty).await;
    let (block, took) = next_holder_finds(&c.resource(name).unwrap()).await;
    // The documented limit: an attempt abandoned without its entry known
    // leaves as a lost holder would. Conservative: the value is kept and
    // said not valid, and the lock-delay is served, never skipped.
    assert_eq!(block, (b"v1".to_vec(), 1, false), "the value kept, not said valid");
    assert!(took >= delay, "C held back only {took:?} (lock-delay {delay:?})");
}

/// A timed request handed the lock before its deadline, whose wake read is
/// still in flight when the deadline passes, is told `Timeout` (the read
/// at the top of the wait loop is bounded by the deadline), and its
/// background cleanup passes on the lock it was granted. The promise: a
/// timed request handed the lock keeps it; the deadline branch of the
/// select checks for that, but not a deadline that cuts the wake's read.
///
/// 1. A holds EX; B waits `lock_timeout(EX, 400 ms)`.
/// 2. A releases before B's deadline: B's entry is granted EX in the store.
/// 3. B wakes and reads; the read is applied, its answer held past the
///    deadline (a slow round trip).
/// 4. B reports `Timeout`.
#[tokio::test]
pub(crate) async fn timed_request_handed_the_lock_keeps_it_when_its_wake_read_outlives_the_deadline() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let cb = &s[1].0;
    let name = "handed-read-at-deadline";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    // A conversion, even to the mode held, drops the read the grant was
    // made from: the release reads the queue and hands over to the waiter
    // queued since (a holder granted before anyone waited otherwise
    // releases plainly, and its waiter grants itself).
    holder.convert(Ex).await.unwrap();
    let rb = b.resource(name).unwrap();
    let timeout = Duration::from_millis(400);
    let waiting = tokio::spawn(async move { rb.lock_timeout(Ex, timeout).await });
    bounded("B waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let armed = gated.trap(b, "read_queue");
    holder.release().await.unwrap();
    armed.reached.await.unwrap();
    assert_eq!(
        modes(&listed(&ra).await),
        vec![(Some(Ex), Ex)],
        "B was handed EX before its deadline"
    );
    tokio::time::sleep(timeout + Duration::from_millis(200)).await;
    let _ = armed.resume.send(());
    let outcome = bounded("B's outcome", waiting).await.unwrap();
    let guard = outcome.unwrap_or_else(|e| panic!("B was handed EX before its deadline, and was told: {e}"));
    assert_eq!(guard.mode(), Ex);
    guard.release().await.unwrap();
}

/// A waiter next after a holder lost involuntarily is held back for its
/// lock-delay — unless another departure hands it the lock between the
/// loss and its wake read: `hand_over` looks only at a lost holder the
/// block names (PW/EX), never at `departure()`, and the waiter checks
/// `handed` before the lock-delay. Before the hand-over that departure was
/// a plain delete and the waiter held back.
///
/// 1. A holds PR; X (lock-delay 1 s) waits for EX on A; Y waits for EX
///    behind X.
/// 2. A's session expires; X's watch sees A gone (held there a moment, as
///    a watch event in transit is).
/// 3. Y's request is cancelled: its leaving hands X the lock (A gone,
///    nothing named lost in the block).
/// 4. X reads, finds itself granted, and returns at once.
#[tokio::test]
pub(crate) async fn lock_delay_holds_when_a_departure_hands_over_between_the_loss_and_the_wake() {
    let delay = Duration::from_millis(1000);
    let gated = Gated::default();
    let name = "delay-handed-before-wake";
    let ReaderThenDelayedWriter {
        clients: _clients,
        a,
        x,
        y,
        reader,
        waiting,
        behind,
    } = reader_then_delayed_writer(gated.clone(), name, delay).await;
    let armed = gated.trap(&x, "watch_value");
    let lost_at = Instant::now();
    assert!(gated.store.expire(a.id()));
    armed.reached.await.unwrap();
    behind.abort();
    let _ = behind.await;
    let ryy = y.resource(name).unwrap();
    until_queue(&ryy, "Y leaves", |q| q.len() == 1).await;
    let _ = armed.resume.send(());
    let (at, outcome) = bounded("X granted", waiting).await.unwrap();
    let granted = outcome.unwrap();
    drop(reader);
    assert!(
        at - lost_at >= delay,
        "EX granted {:?} after the PR holder's involuntary loss (lock-delay {delay:?})",
        at - lost_at
    );
    granted.release().await.unwrap();
}

/// During a lock-delay "the contender is not the holder, nobody is"
/// (docs/sequencers.md). A waiter behind the held-back contender that
/// leaves hands it the lock at once: the store shows it granted EX, with a
/// token, while its delay runs.
///
/// 1. A holds PR; X (lock-delay 1 s) waits for EX; Y waits for EX behind X.
/// 2. A's session expires; X begins its lock-delay.
/// 3. Y is cancelled: its leaving grants X during the delay.
#[tokio::test]
pub(crate) async fn nobody_holds_during_a_lock_delay_when_a_waiter_behind_leaves() {
    let delay = Duration::from_millis(1500);
    let store = MemoryBackend::new();
    let name = "delay-handed-during";
    let ReaderThenDelayedWriter {
        clients: [_ca, cx, _cy],
        a,
        y,
        reader,
        waiting,
        behind,
        ..
    } = reader_then_delayed_writer(store.clone(), name, delay).await;
    let lost_at = Instant::now();
    assert!(store.expire(a.id()));
    bounded("X's lock-delay begins", cx.wait_for_stats(|st| st.lock_delays >= 1)).await;
    behind.abort();
    let _ = behind.await;
    let rq = y.resource(name).unwrap();
    until_queue(&rq, "Y leaves", |q| q.len() == 1).await;
    let during = listed(&rq).await;
    let checked_at = lost_at.elapsed();
    assert!(checked_at < delay, "checked too late ({checked_at:?}) to tell");
    assert_eq!(
        modes(&during),
        vec![(None, Ex)],
        "{checked_at:?} into X's lock-delay, the store shows X holding"
    );
    let (_, granted) = bounded("X granted", waiting).await.unwrap();
    let granted = granted.unwrap();
    drop(reader);
    granted.release().await.unwrap();
}

/// A dropped PW/EX guard releases in the background "and writes the block
/// as `release()` would". Its hand-over reads first; when that read fails
/// (a transient error), the fallback is a plain delete: the value set is
/// lost and the block still names the gone holder, so the next holder
/// finds it not valid and is held back for its lock-delay.
#[tokio::test]
pub(crate) async fn dropped_guard_whose_hand_over_read_fails_still_writes_the_value_block() {
    let delay = Duration::from_millis(1000);
    let (gated, s) = gated_sessions(1).await;
    let a = &s[0].1;
    let (_cc, c) = delayed_session(gated.clone(), delay).await;
    let name = "dropped-read-fails";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    holder.set_value(b"v1").unwrap();
    gated.lose_answer(a, "read_queue");
    drop(holder);
    let rc = c.resource(name).unwrap();
    until_queue(&rc, "the dropped guard's entry leaves", <[ModeContender]>::is_empty).await;
    let (block, took) = next_holder_finds(&rc).await;
    assert_eq!(block, (b"v1".to_vec(), 1, true), "the dropped guard's value block");
    assert!(took < delay, "held back {took:?} after a clean (dropped-guard) release");
}

/// A guard whose append was retried (its first answer lost) is let go on
/// drop through `spawn_abandon`, whose cleanup hands over with no value
/// block: a PW/EX holder's `set_value` is never written, though a dropped
/// guard "writes the block as `release()` would".
#[tokio::test]
pub(crate) async fn dropped_guard_after_a_retried_append_writes_its_value_block() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let name = "dropped-retried-append";
    let ra = a.resource(name).unwrap();
    gated.lose_answer(a, "append");
    let mut holder = lock(&ra, Ex).await;
    holder.set_value(b"v1").unwrap();
    drop(holder);
    let rb = b.resource(name).unwrap();
    until_queue(&rb, "the dropped guard's entry leaves", <[ModeContender]>::is_empty).await;
    let next = lock(&rb, Ex).await;
    assert_eq!(
        block_of(&next),
        (b"v1".to_vec(), 1, true),
        "the dropped guard's value block"
    );
    next.release().await.unwrap();
}

/// Held: a release whose hand-over write is applied and its answer lost is
/// tried again, finds its entry gone and reports success; the successor
/// holds with a higher token and the block as the releaser left it.
#[tokio::test]
pub(crate) async fn held_release_whose_hand_over_answer_is_lost() {
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let cb = &s[1].0;
    let name = "release-answer-lost";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    holder.set_value(b"v1").unwrap();
    let first = holder.token();
    let rb = b.resource(name).unwrap();
    let waiting = tokio::spawn(async move { rb.lock(Ex).await });
    bounded("B waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    gated.lose_answer(a, "update_queue");
    holder
        .release()
        .await
        .expect("a retried release whose first try applied");
    let next = bounded("B granted", waiting).await.unwrap().unwrap();
    assert!(next.token() > first);
    assert_eq!(block_of(&next), (b"v1".to_vec(), 1, true));
    assert_eq!(modes(&listed(&ra).await), vec![(Some(Ex), Ex)]);
    next.release().await.unwrap();
}

/// A waiting request that is cancelled leaves through `hand_over`, which
/// reads the queue and, when its departure lets nobody in, removes the
/// entry with a plain, unconditional delete. A release that hands it EX
/// between that read and that delete names it in the value block; the
/// delete then reads as an involuntary loss: the next holder finds the
/// block not valid and is held back for its lock-delay. (A waiter that
/// times out or is dropped exactly as it is handed the lock.)
///
/// 1. A holds EX and sets the block to `v1`; B waits for EX.
/// 2. B is cancelled; its cleanup's `hand_over` reads: B waiting, A
///    holding, nobody let in.
/// 3. A releases: its `hand_over` grants B EX and names B in the block.
/// 4. B's cleanup deletes its entry plainly (`alone`).
/// 5. C (lock-delay 1 s) locks EX.
#[tokio::test]
pub(crate) async fn request_cancelled_as_it_is_handed_the_lock_leaves_the_value_block_valid_and_no_lock_delay() {
    let delay = Duration::from_millis(1000);
    let (gated, s) = gated_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let cb = &s[1].0;
    let (_cc, c) = delayed_session(gated.clone(), delay).await;
    let name = "cancelled-as-handed";
    let ra = a.resource(name).unwrap();
    let mut holder = lock(&ra, Ex).await;
    // A conversion, even to the mode held, drops the read the grant was
    // made from: the release reads the queue and hands over to the waiter
    // queued since (a holder granted before anyone waited otherwise
    // releases plainly, and its waiter grants itself).
    holder.convert(Ex).await.unwrap();
    holder.set_value(b"v1").unwrap();
    let rb = b.resource(name).unwrap();
    let waiting = tokio::spawn(async move { rb.lock(Ex).await });
    bounded("B waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let armed = gated.trap(b, "read_queue");
    waiting.abort();
    let _ = waiting.await;
    armed.reached.await.unwrap();
    holder.release().await.unwrap();
    let rc = c.resource(name).unwrap();
    assert_eq!(
        modes(&listed(&rc).await),
        vec![(Some(Ex), Ex)],
        "A's release handed B EX"
    );
    let _ = armed.resume.send(());
    until_queue(&rc, "B's cancelled request leaves", <[ModeContender]>::is_empty).await;
    let (block, took) = next_holder_finds(&rc).await;
    assert_eq!(
        block,
        (b"v1".to_vec(), 1, true),
        "nobody lost a PW/EX lock involuntarily: the block stays valid"
    );
    assert!(
        took < delay,
        "C held back {took:?} (lock-delay {delay:?}) after clean departures only"
    );
}

/// A session closed while it holds EX: the server deletes its entry
/// without the value block's write, so the block still names it and the
/// next holder finds the value kept but not valid, and serves its
/// lock-delay, as after a loss (the documented limit; a release before the
/// close keeps the block valid).
#[tokio::test]
pub(crate) async fn session_closed_while_holding_ex_ends_its_lock_as_a_loss_does() {
    let delay = Duration::from_millis(1000);
    let store = MemoryBackend::new();
    let ca = Client::new(store.clone());
    let a = ca.session().await.unwrap();
    let (_cc, c) = delayed_session(store.clone(), delay).await;
    let name = "closed-while-holding";
    let mut writer = lock(&a.resource(name).unwrap(), Ex).await;
    writer.set_value(b"v1").unwrap();
    writer.convert(Nl).await.unwrap();
    writer.convert(Ex).await.unwrap();
    a.close().await.unwrap();
    drop(writer);
    let rc = c.resource(name).unwrap();
    until_queue(&rc, "the closed session's entry is gone", <[ModeContender]>::is_empty).await;
    let (block, took) = next_holder_finds(&rc).await;
    // The documented limit: the server ends a closed session's entries
    // without the value block's write, so the block reads as after a loss
    // (release a PW or EX lock before closing to keep it valid).
    assert_eq!(block, (b"v1".to_vec(), 1, false), "the value kept, not said valid");
    assert!(took >= delay, "held back only {took:?} (lock-delay {delay:?})");
}

/// Held: a chain of exclusive hand-overs wakes one waiter per release, and
/// every release hands over.
#[tokio::test]
pub(crate) async fn held_exclusive_hand_over_chain_wakes_one_waiter_per_release() {
    let store = MemoryBackend::new();
    let client = Client::new(store.clone());
    let name = "hand-over-chain";
    let first = client.session().await.unwrap();
    let holder = lock(&first.resource(name).unwrap(), Ex).await;
    let n = 6;
    let mut tasks = Vec::new();
    for i in 0..n {
        let session = client.session().await.unwrap();
        let resource = session.resource(name).unwrap();
        tasks.push(tokio::spawn(async move {
            let guard = resource.lock(Ex).await.expect("EX");
            guard.release().await.expect("release");
            drop(session);
        }));
        bounded("queued", client.wait_for_stats(|st| st.waits >= (i + 1) as u64)).await;
    }
    let before = client.stats();
    holder.release().await.unwrap();
    for task in tasks {
        bounded("chain", task).await.unwrap();
    }
    let after = client.stats();
    let releases = after.releases - before.releases;
    let wakeups = after.wakeups - before.wakeups;
    let handovers = after.handovers - before.handovers;
    assert_eq!(releases, n as u64 + 1);
    // Every release but the last, and but the first: its holder was granted
    // before anyone waited, so it releases plainly and the first waiter
    // grants itself (from a read that sees the others).
    assert_eq!(
        handovers,
        n as u64 - 1,
        "every release but the first and the last handed over"
    );
    assert!(wakeups <= releases, "{wakeups} wakeups for {releases} releases");
}

/// Waits until the wrapper has given `at_least` prefixes in all, bounded.
async fn until_prefixes(what: &str, ctl: &Ctl, at_least: usize) {
    bounded(what, async {
        loop {
            // Registered before the count is read: a prefix given in
            // between still wakes it.
            let told = ctl.prefix_given.notified();
            if ctl.prefixes_given.load(std::sync::atomic::Ordering::SeqCst) >= at_least {
                return;
            }
            told.await;
        }
    })
    .await;
}

/// Locks `resource` in `mode` in a task of its own.
fn locking(resource: &Resource, mode: LockMode) -> tokio::task::JoinHandle<ResourceGuard> {
    let resource = resource.clone();
    tokio::spawn(async move { lock(&resource, mode).await })
}

/// A waiter handed the lock learns it from a prefix of the queue (through
/// the first request that waits for EX and was never granted, as a
/// hand-over's message on Redis carries it), with no read of the whole
/// queue; and its own release hands over from that prefix.
///
/// B, C, E wait for EX and D for PR behind A's EX. B grants itself (A was
/// granted before anyone waited, so released plainly); B's release hands C
/// the lock, and C's wake read is the prefix [C, E]; C's release hands E
/// the lock; E's hands D its PR.
#[tokio::test]
pub(crate) async fn a_waiter_handed_the_lock_decides_from_a_prefix_of_the_queue() {
    use std::sync::atomic::Ordering::SeqCst;
    let (gated, s) = gated_sessions(5).await;
    gated.ctl.prefixes.store(true, SeqCst);
    let name = "prefix-handed";
    let r: Vec<Resource> = s.iter().map(|(_, session)| session.resource(name).unwrap()).collect();
    let a = lock(&r[0], Ex).await;
    let b = locking(&r[1], Ex);
    until_queue(&r[0], "B waits", |q| q.len() == 2).await;
    let c = locking(&r[2], Ex);
    until_queue(&r[0], "C waits", |q| q.len() == 3).await;
    let e = locking(&r[3], Ex);
    until_queue(&r[0], "E waits", |q| q.len() == 4).await;
    let d = locking(&r[4], Pr);
    until_queue(&r[0], "D waits", |q| q.len() == 5).await;
    a.release().await.unwrap();
    let b = bounded("B", b).await.unwrap();
    // Nothing reads the whole queue from B's release to C's grant.
    let (prefixes, whole) = (
        gated.ctl.prefixes_given.load(SeqCst),
        gated.ctl.whole_reads.load(SeqCst),
    );
    b.release().await.unwrap();
    let c = bounded("C", c).await.unwrap();
    assert_eq!(gated.ctl.whole_reads.load(SeqCst), whole, "a read of the whole queue");
    assert_eq!(
        gated.ctl.prefixes_given.load(SeqCst),
        prefixes + 1,
        "C's wake read a prefix"
    );
    assert_eq!(c.mode(), Ex);
    assert_eq!(
        modes(&listed(&r[0]).await),
        vec![(Some(Ex), Ex), (None, Ex), (None, Pr)],
        "C holds; E and D wait"
    );
    c.release().await.unwrap();
    let e = bounded("E", e).await.unwrap();
    assert_eq!(modes(&listed(&r[0]).await), vec![(Some(Ex), Ex), (None, Pr)]);
    e.release().await.unwrap();
    let d = bounded("D", d).await.unwrap();
    assert_eq!(d.mode(), Pr);
    d.release().await.unwrap();
    assert!(listed(&r[0]).await.is_empty());
}

/// A waiter whose wake read is a prefix of the queue that ends before its
/// own entry (a request waiting for EX, never granted, stands before it)
/// reads the whole queue and waits on, where it would otherwise take its
/// entry for gone.
///
/// A holds EX; Z waits for EX, Y for PR, W for CW (W waits on Y, the
/// nearest that blocks it). Y gives up: W wakes, its read ends at Z, and W
/// waits on Z; it is granted once A and Z are gone.
#[tokio::test]
pub(crate) async fn a_waiter_past_the_end_of_a_prefix_reads_the_whole_queue() {
    use std::sync::atomic::Ordering::SeqCst;
    let (gated, s) = gated_sessions(4).await;
    gated.ctl.prefixes.store(true, SeqCst);
    let name = "prefix-past";
    let r: Vec<Resource> = s.iter().map(|(_, session)| session.resource(name).unwrap()).collect();
    let a = lock(&r[0], Ex).await;
    let z = locking(&r[1], Ex);
    until_queue(&r[0], "Z waits", |q| q.len() == 2).await;
    let y = locking(&r[2], Pr);
    until_queue(&r[0], "Y waits", |q| q.len() == 3).await;
    let w = locking(&r[3], Cw);
    until_queue(&r[0], "W waits", |q| q.len() == 4).await;
    let prefixes = gated.ctl.prefixes_given.load(SeqCst);
    y.abort();
    until_prefixes("W's wake read", &gated.ctl, prefixes + 1).await;
    until_queue(&r[0], "Y leaves", |q| q.len() == 3).await;
    assert!(!w.is_finished(), "W still waits");
    a.release().await.unwrap();
    let z = bounded("Z", z).await.unwrap();
    assert!(!w.is_finished(), "W waits for Z");
    z.release().await.unwrap();
    let w = bounded("W", w).await.expect("W is granted CW");
    assert_eq!(w.mode(), Cw);
    w.release().await.unwrap();
}
