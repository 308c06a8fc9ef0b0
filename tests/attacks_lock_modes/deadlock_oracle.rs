//! Deadlock detection against an independent oracle (graph reduction over
//! the queue as read).

use super::*;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    granted: Option<LockMode>,
    requested: LockMode,
}

pub(crate) fn decode(value: &[u8]) -> Slot {
    let text = String::from_utf8_lossy(value);
    let words: Vec<&str> = text.split(' ').collect();
    Slot {
        granted: words.get(1).and_then(|w| w.parse().ok()),
        requested: words.get(2).and_then(|w| w.parse().ok()).unwrap_or(Ex),
    }
}

/// Whether the entry at `me` is kept waiting by the entry at `other`, by
/// the rule as documented (a request: every earlier entry, with both modes
/// of a conversion; a conversion: every other granted entry's held mode
/// and every earlier waiting request).
pub(crate) fn waits_for(queue: &[Slot], me: usize, other: usize) -> bool {
    let (m, o) = (queue[me], queue[other]);
    match m.granted {
        None => {
            other < me
                && (o.granted.is_some_and(|g| !g.compatible(m.requested)) || !o.requested.compatible(m.requested))
        }
        Some(g) if g == m.requested => false,
        Some(_) => match o.granted {
            Some(held) => !held.compatible(m.requested),
            None => other < me && !o.requested.compatible(m.requested),
        },
    }
}

/// Graph reduction: settled holders may all let go; any waiter no one
/// left keeps waiting is granted and then lets go; whether `me` is ever
/// granted.
pub(crate) fn ever_granted(mut queue: Vec<(usize, Slot)>, me: usize) -> bool {
    queue.retain(|(i, s)| *i == me || s.granted.is_none_or(|g| g != s.requested));
    loop {
        let slots: Vec<Slot> = queue.iter().map(|(_, s)| *s).collect();
        let free = (0..slots.len()).find(|&a| (0..slots.len()).all(|b| a == b || !waits_for(&slots, a, b)));
        match free {
            None => return false,
            Some(a) if queue[a].0 == me => return true,
            Some(a) => {
                queue.remove(a);
            }
        }
    }
}

/// Random small queues of holders, waiting requests and conversions: a
/// conversion fails with Deadlock exactly when, by graph reduction (every
/// settled holder letting go, every grantable waiter granted and letting
/// go), it could never be granted; otherwise it is granted at once or
/// waits.
#[tokio::test]
pub(crate) async fn held_deadlock_detection_matches_graph_reduction() {
    let store = MemoryBackend::new();
    let raw = store.open_session(&SessionOptions::new()).await.unwrap();
    let mut rng = Rng::new(4242);
    let (mut deadlocks, mut waits, mut grants) = (0, 0, 0);
    for scenario in 0..1500 {
        let name = format!("oracle-{scenario}");
        let mut sessions = Vec::new();
        for _ in 0..4 {
            sessions.push(Client::new(store.clone()).session().await.unwrap());
        }
        // Per session: a guard held (settled), or a task in progress.
        let mut held: Vec<Option<ResourceGuard>> = (0..4).map(|_| None).collect();
        #[allow(clippy::type_complexity)]
        let mut busy: Vec<Option<tokio::task::JoinHandle<Result<ResourceGuard, (ResourceGuard, Error)>>>> =
            (0..4).map(|_| None).collect();
        for _step in 0..10 {
            let i = rng.below(4);
            if busy[i].as_ref().is_some_and(|t| !t.is_finished()) {
                continue;
            }
            if let Some(t) = busy[i].take() {
                match t.await.unwrap() {
                    Ok(g) => held[i] = Some(g),
                    Err((g, _)) => held[i] = Some(g),
                }
            }
            match held[i].take() {
                None => {
                    let mode = LockMode::ALL[rng.below(6)];
                    let resource = sessions[i].resource(&name).unwrap();
                    busy[i] = Some(tokio::spawn(async move {
                        resource.lock(mode).await.map_err(|e| panic!("lock: {e}"))
                    }));
                }
                Some(mut g) => {
                    let to = LockMode::ALL[rng.below(6)];
                    if to.is_down_from(g.mode()) {
                        g.convert(to).await.unwrap();
                        held[i] = Some(g);
                    } else {
                        // The oracle, on the state the conversion will read.
                        let queue = futures::executor::block_on(raw.read_queue(&name)).unwrap();
                        let mut slots: Vec<(usize, Slot)> = queue
                            .slots
                            .iter()
                            .enumerate()
                            .map(|(k, s)| (k, decode(&s.value)))
                            .collect();
                        let me = queue.slots.iter().position(|s| s.entry.key == g.key()).unwrap();
                        slots[me].1.requested = to;
                        let expected = !ever_granted(slots.clone(), me);
                        let from = g.mode();
                        let task = tokio::spawn(async move {
                            match g.convert(to).await {
                                Ok(()) => Ok(g),
                                Err(e) => Err((g, e)),
                            }
                        });
                        for _ in 0..20 {
                            tokio::task::yield_now().await;
                        }
                        let view: Vec<String> = slots
                            .iter()
                            .map(|(_, s)| format!("{:?}/{}", s.granted, s.requested))
                            .collect();
                        if task.is_finished() {
                            match task.await.unwrap() {
                                Ok(g) => {
                                    assert!(!expected, "scenario {scenario}: {from}→{to} granted, oracle says deadlock: {view:?} (me {me})");
                                    grants += 1;
                                    held[i] = Some(g);
                                }
                                Err((g, Error::Deadlock { .. })) => {
                                    assert!(
                                        expected,
                                        "scenario {scenario}: {from}→{to} FALSE Deadlock: {view:?} (me {me})"
                                    );
                                    deadlocks += 1;
                                    held[i] = Some(g);
                                }
                                Err((_, e)) => panic!("scenario {scenario}: {e}"),
                            }
                        } else {
                            assert!(
                                !expected,
                                "scenario {scenario}: {from}→{to} waits, oracle says deadlock: {view:?} (me {me})"
                            );
                            waits += 1;
                            busy[i] = Some(task);
                        }
                    }
                }
            }
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
        }
        for t in busy.into_iter().flatten() {
            t.abort();
        }
        drop(held);
        for s in sessions {
            s.close().await.unwrap();
        }
        assert!(store.keys(&name).is_empty());
    }
    eprintln!("{deadlocks} deadlocks, {waits} waits, {grants} immediate grants");
    assert!(deadlocks > 10 && waits > 10);
}

/// Blocking notifications are paid for by those who listen: a waiter
/// behind a lock whose resource was not made with `notify_blocking` writes
/// no mark on it (the holder's entry is as its grant wrote it), and that
/// holder's `blocking()` is refused at once instead of waiting for ever.
#[tokio::test]
pub(crate) async fn held_no_mark_is_written_on_a_lock_that_does_not_listen() {
    let (store, s) = memory_sessions(2).await;
    let ((_, a), (cb, b)) = (&s[0], &s[1]);
    let name = "quiet";
    let holder = lock(&a.resource(name).unwrap(), Pr).await;
    let raw = store.open_session(&SessionOptions::new()).await.unwrap();
    let before = raw.read_queue(name).await.unwrap().slots[0].value.clone();
    let writer = b.resource(name).unwrap().notify_on_try();
    assert!(bounded("try EX", writer.try_lock(Ex)).await.unwrap().is_none());
    let waiting = tokio::spawn(async move { writer.lock(Ex).await });
    bounded("EX waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let after = raw.read_queue(name).await.unwrap().slots[0].value.clone();
    assert_eq!(before, after, "a mark was written on a holder that does not listen");
    assert!(matches!(holder.blocking().await, Err(Error::InvalidOptions { .. })));
    holder.release().await.unwrap();
    bounded("EX", waiting).await.unwrap().unwrap().release().await.unwrap();
}
