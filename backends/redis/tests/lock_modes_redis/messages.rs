//! What a lock-mode update's messages say: the value it wrote, on the
//! channel of each entry it set, and the queue a hand-over left, on the
//! channel of each entry it deleted. A waiter decides from them without a
//! request of its own.

use super::*;

/// A hand-over (an update that grants a waiter and deletes the holder)
/// says on the holder's channel what it left: the waiter's next read of the
/// queue is answered from that message, as the queue was right after the
/// hand-over (a later change by another session is not in it), once; the
/// read after that goes to the server.
pub(super) async fn a_hand_over_tells_its_waiters_the_queue_it_left(fixture: &Fixture) {
    let (a, b, c) = fixture.three_sessions().await;
    let held = append(&a, "held", b"held EX").await;
    let next = append(&b, "next", b"waiting EX").await;
    let watching = watch_until_gone(fixture, &b, &held, b"held EX").await;
    hand_over(&a, &c, &held, &next, Some(b"left by the hand-over")).await;
    goes(watching).await;
    let after = read(&c).await;
    let later = append(&c, "later", b"waiting EX").await;

    let told = read(&b).await;
    assert_eq!(told, after, "the queue the hand-over left");
    assert_eq!(values(&told), vec![&b"granted EX"[..]]);
    assert_eq!(told.block.as_deref(), Some(&b"left by the hand-over"[..]));
    let read_again = read(&b).await;
    assert_eq!(entries(&read_again), vec![next, later], "read from the server");
}

/// Where the queue a hand-over left goes on past a request that waits for
/// EX and was never granted, its message carries the queue only through
/// that request: the waiter's read right after its wait
/// (`read_queue_woken`) is answered from it, as a prefix, with no script;
/// a plain `read_queue` does not take a prefix and reads from the server.
/// A queue with no such request is carried whole.
pub(super) async fn a_hand_over_tells_its_waiters_a_prefix_through_a_waiting_ex(fixture: &Fixture) {
    let waiting = [WAITING_EX, &b"0 0 0 0 00000000"[..]].concat();
    for plain_read in [false, true] {
        let (a, b, c) = fixture.three_sessions().await;
        let held = append(&a, &format!("held-{plain_read}"), b"held EX").await;
        let next = append(&b, &format!("next-{plain_read}"), b"waiting EX").await;
        let blocking = append(&c, &format!("blocking-{plain_read}"), &waiting).await;
        let behind = append(&c, &format!("behind-{plain_read}"), b"waiting PR").await;
        let watching = watch_until_gone(fixture, &b, &held, b"held EX").await;
        hand_over(&a, &c, &held, &next, None).await;
        // Counted before the watch ends: a queue heard is kept for a second,
        // and counting opens a connection to each server.
        let scripts = fixture.scripts_run().await;
        goes(watching).await;
        if plain_read {
            let whole = read(&b).await;
            assert_eq!(entries(&whole), vec![next.clone(), blocking.clone(), behind.clone()]);
            assert_eq!(fixture.scripts_run().await, scripts + 1, "read from the server");
            // Out of the way of the last case.
            for entry in [&next, &blocking, &behind] {
                assert!(c.remove(entry).await.expect("remove"));
            }
            continue;
        }
        let (told, whole) = bounded("the woken read", b.read_queue_woken(DIR)).await.expect("read");
        assert!(!whole, "a prefix");
        assert_eq!(entries(&told), vec![next.clone(), blocking.clone()]);
        assert_eq!(values(&told), vec![&b"granted EX"[..], &waiting[..]]);
        assert_eq!(fixture.scripts_run().await, scripts, "answered from the message");
        // Taken once: the next read goes to the server, and is whole.
        let (again, whole) = bounded("the next read", b.read_queue_woken(DIR)).await.expect("read");
        assert!(whole);
        assert_eq!(entries(&again), vec![next.clone(), blocking.clone(), behind.clone()]);
        for entry in [&next, &blocking, &behind] {
            assert!(c.remove(entry).await.expect("remove"));
        }
    }
    // No waiting EX request after the one handed the lock: the whole queue.
    let (a, b, c) = fixture.three_sessions().await;
    let held = append(&a, "held", b"held EX").await;
    let next = append(&b, "next", b"waiting EX").await;
    let behind = append(&c, "behind", b"waiting PR").await;
    let watching = watch_until_gone(fixture, &b, &held, b"held EX").await;
    hand_over(&a, &c, &held, &next, None).await;
    let scripts = fixture.scripts_run().await;
    goes(watching).await;
    let (told, whole) = bounded("the woken read", b.read_queue_woken(DIR)).await.expect("read");
    assert!(whole, "the whole queue");
    assert_eq!(entries(&told), vec![next, behind]);
    assert_eq!(fixture.scripts_run().await, scripts, "answered from the message");
}

/// A queue a hand-over's message carried is not used once the waiter's
/// own session changed a queue after its watch began: that change may be
/// missing from it. The read goes to the server.
pub(super) async fn a_queue_heard_is_not_used_after_a_change_of_the_session(fixture: &Fixture) {
    let (a, b, c) = fixture.three_sessions().await;
    let held = append(&a, "held", b"held EX").await;
    let next = append(&b, "next", b"waiting EX").await;
    let watching = watch_until_gone(fixture, &b, &held, b"held EX").await;
    // A write of the waiter's session while it watches.
    let own = append(&b, "own", b"waiting PR").await;
    hand_over(&a, &c, &held, &next, None).await;
    goes(watching).await;
    let later = append(&c, "later", b"waiting EX").await;
    assert_eq!(entries(&read(&b).await), vec![next, own, later], "read from the server");
}

/// The message of an update's write carries the value written: a watcher
/// goes past a value it does not want with no request of its own, and
/// looks once to confirm the one it wants. Counted on the servers: the
/// three updates and one look, where a look per message would make six.
pub(super) async fn a_value_message_is_watched_past_without_a_look(fixture: &Fixture) {
    let ttl = Duration::from_secs(120);
    let (a, b) = (fixture.open(ttl).await, fixture.open(ttl).await);
    let held = append(&a, "held", b"start").await;
    // Every script the case counts has run once already (loaded): a first
    // run's `NOSCRIPT` call and its retry would count twice.
    set_by_update(&a, &held, b"start").await;
    assert_eq!(b.get_value(&held).await.expect("look"), Some(b"start".to_vec()));
    let looks = fixture.scripts_run().await;
    let watching = watch_for_wanted(fixture, &b, &held).await;
    // Its first look, made once it has subscribed, comes before the count.
    fixture.scripts_reach(looks + 1).await;
    let scripts_before = fixture.scripts_run().await;
    two_unwanted_then_wanted(&a, &held, watching).await;
    assert_eq!(
        fixture.scripts_run().await - scripts_before,
        4,
        "three updates and one look"
    );
}

/// A hand-over's grant of another session's waiting request, in the mode
/// it asked for, is not said on the granted entry's channel: no one
/// watching a waiting request is let on by its grant, and the request's
/// owner learns of it from the message on the released entry's channel.
/// Every other write there is said, in order: a waiter's mark on the entry
/// once it holds, the owner's own write, another session's grant of an
/// entry that was converting, and an owner's grant of its own request.
/// Heard on a subscription of the case's own to every entry's channel.
pub(super) async fn a_hand_over_grant_is_not_said_on_the_granted_entrys_channel(fixture: &Fixture) {
    let (a, b, c) = fixture.three_sessions().await;
    let held = append(&a, "held", b"dlm2 EX EX 0 0 0 0 0000000a").await;
    let next = append(&b, "next", b"dlm2 - EX 0 0 0 0 0000000b").await;
    let converting = append(&b, "converting", b"dlm2 PR EX 0 0 3 9 0000000c").await;
    let own = append(&b, "own", b"dlm2 - PR 0 0 0 0 0000000d").await;
    let mut heard = fixture.every_entry_message(&next).await;

    let before = read(&c).await;
    let granted = [(&next, &b"dlm2 EX EX 0 0 0 0 00000001"[..])];
    let unchanged = [(&next, slot(&before, &next).version)];
    let hand_over = QueueUpdate {
        dir: DIR,
        unchanged: &unchanged,
        present: &[&held],
        set: &granted,
        delete: &[&held],
        block: None,
    };
    update(&a, &hand_over).await.expect("handed over");
    set_as_read(&c, &next, b"dlm2 EX EX 0 8 0 0 00000002").await;
    set_as_read(&b, &next, b"dlm2 EX EX 0 8 0 0 00000003").await;
    set_as_read(&a, &converting, b"dlm2 EX EX 0 0 0 0 00000004").await;
    set_as_read(&b, &own, b"dlm2 PR PR 0 0 0 0 00000005").await;

    let mut said = Vec::new();
    while said.len() < 5 {
        let message = bounded("the next message", heard.next()).await.expect("a message");
        let channel = message
            .get_channel_name()
            .rsplit(':')
            .next()
            .expect("an attempt")
            .to_owned();
        let payload = message.get_payload_bytes().to_vec();
        let what = if payload.starts_with(b"gone") {
            "gone".to_owned()
        } else {
            String::from_utf8_lossy(&payload[payload.len() - 2..]).into_owned()
        };
        said.push(format!("{channel} {what}"));
    }
    assert_eq!(
        said,
        ["held gone", "next 02", "next 03", "converting 04", "own 05"],
        "the grant of `next` (01) is the one write not said"
    );
}

/// Sets `entry`'s value by an update of `session` conditioned on the
/// version its read gives (as the core's updates are).
async fn set_as_read(session: &Arc<dyn BackendSession>, entry: &Entry, value: &[u8]) {
    let before = read(session).await;
    let unchanged = [(entry, slot(&before, entry).version)];
    let values = [(entry, value)];
    let change = QueueUpdate {
        dir: DIR,
        unchanged: &unchanged,
        present: &[],
        set: &values,
        delete: &[],
        block: None,
    };
    update(session, &change).await.expect("applied");
}

/// Two watches of one session on one lock hear two hand-overs, and the
/// one that heard the older ends last: the session's reads still never go
/// back to the older queue (the first read, answered from the newer
/// hand-over's message, counts as a read; the older queue, kept after it,
/// is not used).
pub(super) async fn an_older_hand_over_heard_last_is_not_read(fixture: &Fixture) {
    two_hand_overs_heard(fixture, true).await;
}

/// As above, with no read between the two watches' ends: the newer
/// hand-over's queue, kept first, stays kept, and the read answers it.
pub(super) async fn an_older_hand_over_heard_last_is_not_kept(fixture: &Fixture) {
    two_hand_overs_heard(fixture, false).await;
}

async fn two_hand_overs_heard(fixture: &Fixture, read_between: bool) {
    let (a, b, c) = fixture.three_sessions().await;
    let first_held = append(&a, "x1", b"held 1").await;
    let second_held = append(&a, "x2", b"held 2").await;
    let first_next = append(&b, "n1", b"waiting 1").await;
    let second_next = append(&b, "n2", b"waiting 2").await;
    let never = |_: &[u8]| false;
    // The look's script has run once already (loaded): a first run's
    // `NOSCRIPT` call counts as a script, and its retry, sent only when the
    // watch is polled again, would count once more at the end.
    assert_eq!(b.get_value(&first_held).await.expect("look"), Some(b"held 1".to_vec()));
    // The first watch subscribes and makes its look, then is left unpolled
    // until the end: it hears the first hand-over, and acts on it last.
    let looks = fixture.scripts_run().await;
    let mut first_watch = Box::pin(b.watch_value_until(&first_held, b"held 1", &never));
    tokio::select! {
        early = &mut first_watch => panic!("the first watch ended early: {early:?}"),
        () = async {
            fixture.subscribed("{modes/resource}:c:x1", 1).await;
            fixture.scripts_reach(looks + 1).await;
        } => {}
    }
    let looks = fixture.scripts_run().await;
    let second_watch = watch_until_gone(fixture, &b, &second_held, b"held 2").await;
    fixture.scripts_reach(looks + 1).await;
    hand_over(&a, &c, &first_held, &first_next, None).await;
    hand_over(&a, &c, &second_held, &second_next, None).await;
    let heard = bounded("the second holder goes", second_watch)
        .await
        .expect("join")
        .expect("watch");
    assert_eq!(heard, None);
    let newest = read(&c).await;
    if read_between {
        assert_eq!(read(&b).await, newest, "the second hand-over's queue");
    }
    // It decides from the message it heard, with no look.
    let scripts = fixture.scripts_run().await;
    let heard = bounded("the first holder goes", first_watch).await.expect("watch");
    assert_eq!(heard, None);
    assert_eq!(fixture.scripts_run().await, scripts, "the first watch looked again");
    // One more entry, by another session: a read from the server shows it,
    // a hand-over's queue does not.
    append(&c, "later", b"waiting 3").await;
    let told = read(&b).await;
    if read_between {
        assert_eq!(told, read(&c).await, "read from the server");
    } else {
        assert_eq!(told, newest, "the second hand-over's queue, not the first's");
    }
}

/// A watch of `held` by `session` that ends once it goes (no value is
/// wanted), subscribed before this returns.
async fn watch_until_gone(
    fixture: &Fixture,
    session: &Arc<dyn BackendSession>,
    held: &Entry,
    seen: &'static [u8],
) -> tokio::task::JoinHandle<lockline::Result<Option<Vec<u8>>>> {
    // The look's script run once first, so that the watch's look is one
    // script (not a `NOSCRIPT` answer and a retry).
    assert_eq!(session.get_value(held).await.expect("look"), Some(seen.to_vec()));
    let looks = fixture.scripts_run().await;
    let watching = {
        let (session, held) = (Arc::clone(session), held.clone());
        tokio::spawn(async move { session.watch_value_until(&held, seen, &|_| false).await })
    };
    let attempt = held.key.rsplit(':').next().expect("an attempt");
    fixture.subscribed(&format!("{{modes/resource}}:c:{attempt}"), 1).await;
    // Its look made too: a change made before it would be seen by the look,
    // not heard on the channel, and carry no queue.
    fixture.scripts_reach(looks + 1).await;
    watching
}

/// `held` hands over to `next` by an update of `session`: `next` granted
/// at its version as `reader` reads it, `held` deleted, `block` written.
async fn hand_over(
    session: &Arc<dyn BackendSession>,
    reader: &Arc<dyn BackendSession>,
    held: &Entry,
    next: &Entry,
    block: Option<&[u8]>,
) {
    let before = read(reader).await;
    let granted = [(next, &b"granted EX"[..])];
    let unchanged = [(next, slot(&before, next).version)];
    let hand_over = QueueUpdate {
        dir: DIR,
        unchanged: &unchanged,
        present: &[held],
        set: &granted,
        delete: &[held],
        block,
    };
    update(session, &hand_over).await.expect("handed over");
}

/// Waits for a watch of [`watch_until_gone`] to end with its entry gone.
async fn goes(watching: tokio::task::JoinHandle<lockline::Result<Option<Vec<u8>>>>) {
    let heard = bounded("the holder goes", watching)
        .await
        .expect("join")
        .expect("watch");
    assert_eq!(heard, None);
}

impl Fixture {
    /// Waits until the servers have run `count` scripts in all (see
    /// [`scripts_run`](Self::scripts_run)). The server is another process,
    /// with no event to await: look every 10 ms.
    async fn scripts_reach(&self, count: u64) {
        bounded("the scripts", async {
            while self.scripts_run().await < count {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }

    /// How many scripts the servers ran so far (`EVALSHA` calls in `INFO
    /// commandstats`, summed over the nodes).
    async fn scripts_run(&self) -> u64 {
        let mut total = 0;
        for url in self.urls() {
            let mut side = support::side(&url).await;
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut side)
                .await
                .expect("INFO commandstats");
            total += info
                .lines()
                .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |calls| calls.parse::<u64>().expect("a count of calls"));
        }
        total
    }
}
