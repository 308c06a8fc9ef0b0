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
    let ttl = Duration::from_secs(120);
    let (a, b, c) = (
        fixture.open(ttl).await,
        fixture.open(ttl).await,
        fixture.open(ttl).await,
    );
    let held = append(&a, "held", b"held EX").await;
    let next = append(&b, "next", b"waiting EX").await;
    let before = read(&c).await;
    let watching = {
        let (b, held) = (Arc::clone(&b), held.clone());
        tokio::spawn(async move { b.watch_value_until(&held, b"held EX", &|_| false).await })
    };
    fixture.subscribed("{modes/resource}:c:held", 1).await;
    let granted = [(&next, &b"granted EX"[..])];
    let unchanged = [(&next, slot(&before, &next).version)];
    let hand_over = QueueUpdate {
        dir: DIR,
        unchanged: &unchanged,
        present: &[&held],
        set: &granted,
        delete: &[&held],
        block: Some(b"left by the hand-over"),
    };
    update(&a, &hand_over).await.expect("handed over");
    let heard = bounded("the holder goes", watching)
        .await
        .expect("join")
        .expect("watch");
    assert_eq!(heard, None);
    let after = read(&c).await;
    let later = append(&c, "later", b"waiting EX").await;

    let told = read(&b).await;
    assert_eq!(told, after, "the queue the hand-over left");
    assert_eq!(values(&told), vec![&b"granted EX"[..]]);
    assert_eq!(told.block.as_deref(), Some(&b"left by the hand-over"[..]));
    let read_again = read(&b).await;
    assert_eq!(entries(&read_again), vec![next, later], "read from the server");
}

/// A queue a hand-over's message carried is not used once the waiter's
/// own session changed a queue after its watch began: that change may be
/// missing from it. The read goes to the server.
pub(super) async fn a_queue_heard_is_not_used_after_a_change_of_the_session(fixture: &Fixture) {
    let ttl = Duration::from_secs(120);
    let (a, b, c) = (
        fixture.open(ttl).await,
        fixture.open(ttl).await,
        fixture.open(ttl).await,
    );
    let held = append(&a, "held", b"held EX").await;
    let next = append(&b, "next", b"waiting EX").await;
    let watching = {
        let (b, held) = (Arc::clone(&b), held.clone());
        tokio::spawn(async move { b.watch_value_until(&held, b"held EX", &|_| false).await })
    };
    fixture.subscribed("{modes/resource}:c:held", 1).await;
    // A write of the waiter's session while it watches.
    let own = append(&b, "own", b"waiting PR").await;
    let before = read(&c).await;
    let granted = [(&next, &b"granted EX"[..])];
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
    let heard = bounded("the holder goes", watching)
        .await
        .expect("join")
        .expect("watch");
    assert_eq!(heard, None);
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
    let set = |value: &'static [u8]| {
        let (a, held) = (Arc::clone(&a), held.clone());
        async move {
            let values = [(&held, value)];
            let change = QueueUpdate {
                dir: DIR,
                unchanged: &[],
                present: &[&held],
                set: &values,
                delete: &[],
                block: None,
            };
            update(&a, &change).await.expect("applied");
        }
    };
    // Every script the case counts has run once already (loaded).
    set(b"start").await;
    let watching = {
        let (b, held) = (Arc::clone(&b), held.clone());
        tokio::spawn(async move {
            b.watch_value_until(&held, b"start", &|v| v.starts_with(b"wanted"))
                .await
        })
    };
    fixture.subscribed("{modes/resource}:c:held", 1).await;
    let scripts_before = fixture.scripts_run().await;
    for value in [&b"unwanted-1"[..], b"unwanted-2", b"wanted"] {
        set(value).await;
    }
    let heard = bounded("the wanted value", watching)
        .await
        .expect("join")
        .expect("watch");
    assert_eq!(heard.as_deref(), Some(&b"wanted"[..]));
    assert_eq!(
        fixture.scripts_run().await - scripts_before,
        4,
        "three updates and one look"
    );
}

impl Fixture {
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
