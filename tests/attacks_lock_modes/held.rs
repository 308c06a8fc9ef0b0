//! Attacks that held from the start: the compatibility matrix, conversion
//! deadlocks, blocking notifications, no bypass, multi-resource locks, odd
//! input.

use super::*;

/// Every pair of modes, each order, by `lock` (waiting) rather than
/// `try_lock`: the second is granted at once exactly when compatible, and
/// otherwise as soon as the first lets go.
#[tokio::test]
pub(crate) async fn held_matrix_by_waiting_requests() {
    let (_store, s) = memory_sessions(2).await;
    let ((_, a), (cb, b)) = (&s[0], &s[1]);
    for held in LockMode::ALL {
        for asked in LockMode::ALL {
            let name = format!("wait-matrix-{held}-{asked}");
            let first = lock(&a.resource(&name).unwrap(), held).await;
            let resource = b.resource(&name).unwrap();
            let waits_before = cb.stats().waits;
            let second = tokio::spawn(async move { resource.lock(asked).await });
            if held.compatible(asked) {
                let g = bounded("granted", second).await.unwrap().unwrap();
                assert!(g.token() > first.token());
                g.release().await.unwrap();
            } else {
                bounded("waits", cb.wait_for_stats(|st| st.waits > waits_before)).await;
                assert!(!second.is_finished());
                first.release().await.unwrap();
                let g = bounded("granted after the release", second).await.unwrap().unwrap();
                g.release().await.unwrap();
                assert!(listed(&a.resource(&name).unwrap()).await.is_empty());
                continue;
            }
            first.release().await.unwrap();
            assert!(listed(&a.resource(&name).unwrap()).await.is_empty());
        }
    }
}

/// Every conversion pair among two compatible holders (A: a → a', then
/// B: b → b'): the second fails with Deadlock exactly when each waits for
/// the other's granted mode; otherwise both end granted (no false
/// deadlock, no hang), each in its new mode, and a deadlock leaves B in b.
#[tokio::test]
pub(crate) async fn held_every_conversion_pair_deadlocks_exactly_when_it_must() {
    let (_store, s) = memory_sessions(2).await;
    let (a, b) = (&s[0].1, &s[1].1);
    let mut checked = 0;
    for ma in LockMode::ALL {
        for mb in LockMode::ALL {
            if !ma.compatible(mb) {
                continue;
            }
            for ta in LockMode::ALL {
                for tb in LockMode::ALL {
                    if ta.is_down_from(ma) || tb.is_down_from(mb) {
                        continue;
                    }
                    let name = format!("pairs-{ma}-{mb}-{ta}-{tb}");
                    let mut ga = lock(&a.resource(&name).unwrap(), ma).await;
                    let mut gb = lock(&b.resource(&name).unwrap(), mb).await;
                    let a_blocked = !mb.compatible(ta);
                    let b_blocked = !ma.compatible(tb);
                    let conv_a = tokio::spawn(async move {
                        let outcome = ga.convert(ta).await;
                        (ga, outcome)
                    });
                    if a_blocked {
                        until_queue(&b.resource(&name).unwrap(), "A marked", |q| {
                            q.first().is_some_and(|c| c.converting_to() == Some(ta))
                        })
                        .await;
                    } else {
                        let (ga2, outcome) = bounded("A at once", conv_a).await.unwrap();
                        outcome.unwrap();
                        assert_eq!(ga2.mode(), ta);
                        // B now faces A's new mode.
                        let outcome = bounded("B", async {
                            tokio::time::timeout(Duration::from_millis(100), gb.convert(tb)).await
                        })
                        .await;
                        match outcome {
                            Ok(Ok(())) => assert!(ta.compatible(tb), "{name}: B granted beside {ta}"),
                            Err(_) => assert!(!ta.compatible(tb), "{name}: B should be granted"),
                            Ok(Err(e)) => panic!("{name}: B: {e}"),
                        }
                        ga2.release().await.unwrap();
                        gb.release().await.unwrap();
                        checked += 1;
                        continue;
                    }
                    let outcome = bounded("B converts", async {
                        tokio::time::timeout(Duration::from_millis(300), gb.convert(tb)).await
                    })
                    .await;
                    match (b_blocked, outcome) {
                        (true, Ok(Err(Error::Deadlock { held, .. }))) => {
                            assert_eq!(held, mb);
                            assert_eq!(gb.mode(), mb);
                            gb.release().await.unwrap();
                            let (ga, outcome) = bounded("A after B let go", conv_a).await.unwrap();
                            outcome.unwrap();
                            ga.release().await.unwrap();
                        }
                        (false, Ok(Ok(()))) => {
                            // B granted first: A waits for B's new mode, or not.
                            assert_eq!(gb.mode(), tb);
                            gb.release().await.unwrap();
                            let (ga, outcome) = bounded("A", conv_a).await.unwrap();
                            outcome.unwrap();
                            ga.release().await.unwrap();
                        }
                        (b_blocked, other) => panic!("{name}: B blocked {b_blocked}: {other:?}"),
                    }
                    assert!(listed(&a.resource(&name).unwrap()).await.is_empty(), "{name}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 50, "{checked}");
}

/// The cycle through a waiting request (PR→EX, a PW request waiting
/// behind it, a CR holder after that request converting to PR, which
/// waits for the PW request) is found by the conversion that closes it,
/// and only by it; the others go on once it gives up.
#[tokio::test]
pub(crate) async fn held_cycle_through_a_waiting_request_is_detected_once() {
    let (_store, s) = memory_sessions(3).await;
    let ((ca, a), (cb, b), (_, c)) = (&s[0], &s[1], &s[2]);
    let name = "cycle3";
    let mut reader = lock(&a.resource(name).unwrap(), Pr).await;
    let writer = b.resource(name).unwrap();
    let writing = tokio::spawn(async move { writer.lock(Pw).await });
    bounded("PW waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    let mut concurrent = lock(&c.resource(name).unwrap(), Cr).await;
    let converting = tokio::spawn(async move {
        let outcome = reader.convert(Ex).await;
        (reader, outcome)
    });
    bounded("PR→EX waits", ca.wait_for_stats(|st| st.waits >= 1)).await;
    let outcome = bounded("CR→PR", concurrent.convert(Pr)).await;
    assert!(matches!(outcome, Err(Error::Deadlock { .. })), "{outcome:?}");
    assert_eq!(concurrent.mode(), Cr);
    assert!(!converting.is_finished() && !writing.is_finished());
    concurrent.release().await.unwrap();
    let (reader, outcome) = bounded("PR→EX granted", converting).await.unwrap();
    outcome.unwrap();
    reader.release().await.unwrap();
    bounded("PW", writing).await.unwrap().unwrap().release().await.unwrap();
}

/// CW ⇄ PR, where neither mode covers the other: both are up-conversions,
/// waiters behind count both modes, and the one blocked by the old mode
/// only is woken when the conversion is granted.
#[tokio::test]
pub(crate) async fn held_cw_pr_conversions_both_ways() {
    let (_store, s) = memory_sessions(3).await;
    let ((_, a), (cb, b), (cc, c)) = (&s[0], &s[1], &s[2]);
    let name = "cw-pr";
    let mut mixed = lock(&a.resource(name).unwrap(), Cw).await;
    // PR request: blocked by CW (held) — waits on it.
    let pr = b.resource(name).unwrap();
    let reading = tokio::spawn(async move { pr.lock(Pr).await });
    bounded("PR waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    // CW → PR: the PR request is earlier? No: it is behind; the
    // conversion only waits for granted entries and earlier requests.
    bounded("CW→PR", mixed.convert(Pr)).await.unwrap();
    let reader = bounded("the PR request is woken and granted", reading)
        .await
        .unwrap()
        .unwrap();
    // PR → CW now waits for the other PR holder; a CW request behind it
    // waits too (it counts the conversion with PR and CW).
    let converting = tokio::spawn(async move {
        let outcome = mixed.convert(Cw).await;
        (mixed, outcome)
    });
    until_queue(&c.resource(name).unwrap(), "marked", |q| {
        q[0].converting_to() == Some(Cw)
    })
    .await;
    let cw = c.resource(name).unwrap();
    assert!(bounded("try CW", cw.try_lock(Cw)).await.unwrap().is_none());
    let writing = tokio::spawn(async move { cw.lock(Cw).await });
    bounded("CW waits", cc.wait_for_stats(|st| st.waits >= 1)).await;
    let queue = listed(&c.resource(name).unwrap()).await;
    compatible_holders(&queue).unwrap();
    reader.release().await.unwrap();
    let (mixed, outcome) = bounded("PR→CW", converting).await.unwrap();
    outcome.unwrap();
    assert_eq!(mixed.mode(), Cw);
    let other = bounded("the CW request beside it", writing).await.unwrap().unwrap();
    let queue = listed(&c.resource(name).unwrap()).await;
    compatible_holders(&queue).unwrap();
    other.release().await.unwrap();
    mixed.release().await.unwrap();
}

/// A conversion given up — by its timeout (inline cleanup) or by dropping
/// it (background cleanup) — wakes the request behind it that was blocked
/// by its new mode only: no lost wake-up, no mark left.
#[tokio::test]
pub(crate) async fn held_given_up_conversion_wakes_the_request_behind() {
    for dropped in [false, true] {
        let (_store, s) = memory_sessions(3).await;
        let ((_, a), (_, b), (cc, c)) = (&s[0], &s[1], &s[2]);
        let name = "give-up-wakes";
        let mut first = lock(&a.resource(name).unwrap(), Pr).await;
        let second = lock(&b.resource(name).unwrap(), Pr).await;
        let (tx, rx) = oneshot::channel::<()>();
        let converting = tokio::spawn(async move {
            if dropped {
                tokio::select! {
                    _ = first.convert(Ex) => panic!("granted"),
                    _ = rx => {}
                }
            } else {
                let outcome = first.convert_timeout(Ex, Duration::from_millis(300)).await;
                assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
            }
            first
        });
        until_queue(&c.resource(name).unwrap(), "marked", |q| {
            q[0].converting_to() == Some(Ex)
        })
        .await;
        let reader = c.resource(name).unwrap();
        let reading = tokio::spawn(async move { reader.lock(Pr).await });
        bounded("PR waits behind the conversion", cc.wait_for_stats(|st| st.waits >= 1)).await;
        let _ = tx.send(());
        let first = bounded("given up", converting).await.unwrap();
        assert_eq!(first.mode(), Pr);
        let third = bounded("PR woken", reading).await.unwrap().unwrap();
        let queue = listed(&c.resource(name).unwrap()).await;
        assert!(queue.iter().all(|e| e.converting_to().is_none()), "{:?}", modes(&queue));
        for g in [first, second, third] {
            g.release().await.unwrap();
        }
    }
}

/// A session expiring mid-conversion: the conversion fails with
/// SessionLost, its entry (and mark) go, and the request it blocked is
/// granted; a waiter whose own session expires fails at once.
#[tokio::test]
pub(crate) async fn held_session_expiring_mid_conversion() {
    let (store, s) = memory_sessions(3).await;
    let ((ca, a), (_, b), (cc, c)) = (&s[0], &s[1], &s[2]);
    let name = "expire-mid";
    let mut first = lock(&a.resource(name).unwrap(), Pr).await;
    let second = lock(&b.resource(name).unwrap(), Pr).await;
    let converting = tokio::spawn(async move { first.convert(Ex).await });
    bounded("waits", ca.wait_for_stats(|st| st.waits >= 1)).await;
    let ex = c.resource(name).unwrap();
    let writing = tokio::spawn(async move { ex.lock(Ex).await });
    bounded("EX waits", cc.wait_for_stats(|st| st.waits >= 1)).await;
    assert!(store.expire(a.id()));
    let outcome = bounded("conversion ends", converting).await.unwrap();
    assert!(matches!(outcome, Err(Error::SessionLost { .. })), "{outcome:?}");
    assert_eq!(listed(&b.resource(name).unwrap()).await.len(), 2);
    second.release().await.unwrap();
    bounded("EX", writing).await.unwrap().unwrap().release().await.unwrap();
    assert!(store.keys(name).is_empty());
}

/// Same-session contenders: two tasks of one session in EX exclude each
/// other; a session's PR and another task's EX request of the same
/// session wait; closing the session leaves nothing.
#[tokio::test]
pub(crate) async fn held_same_session_contenders_exclude_each_other() {
    let (store, s) = memory_sessions(1).await;
    let (ca, a) = (&s[0].0, &s[0].1);
    let name = "same-session";
    let first = lock(&a.resource(name).unwrap(), Ex).await;
    let again = a.resource(name).unwrap();
    let second = tokio::spawn(async move { again.lock(Ex).await });
    bounded("waits", ca.wait_for_stats(|st| st.waits >= 1)).await;
    assert!(bounded("try", a.resource(name).unwrap().try_lock(Cr))
        .await
        .unwrap()
        .is_none());
    first.release().await.unwrap();
    let second = bounded("second", second).await.unwrap().unwrap();
    assert_eq!(listed(&a.resource(name).unwrap()).await.len(), 1);
    drop(second);
    a.close().await.unwrap();
    assert!(store.keys(name).is_empty());
}

/// Blocking notifications: told once per mode, by waiting requests and
/// waiting conversions, never by try_lock / try_convert / zero timeouts
/// without notify_on_try; told again after a conversion.
#[tokio::test]
pub(crate) async fn held_blocking_told_once_per_mode_and_not_by_tries() {
    let (_store, s) = memory_sessions(3).await;
    let ((_, a), (cb, b), (_, c)) = (&s[0], &s[1], &s[2]);
    let name = "told";
    let mut holder = lock(&a.resource(name).unwrap().notify_blocking(), Pr).await;
    let other = b.resource(name).unwrap();
    assert!(bounded("try", other.try_lock(Ex)).await.unwrap().is_none());
    assert!(matches!(
        bounded("zero", other.lock_timeout(Pw, Duration::ZERO)).await,
        Err(Error::Timeout { .. })
    ));
    let mut peer = lock(&c.resource(name).unwrap(), Pr).await;
    assert!(!bounded("try_convert", peer.try_convert(Ex)).await.unwrap());
    assert!(matches!(
        bounded("zero convert", peer.convert_timeout(Pw, Duration::ZERO)).await,
        Err(Error::Timeout { .. })
    ));
    let quiet = tokio::time::timeout(Duration::from_millis(200), holder.blocking()).await;
    assert!(quiet.is_err(), "told by a try: {quiet:?}");
    peer.release().await.unwrap();
    let waiting = tokio::spawn(async move { other.lock(Ex).await });
    bounded("EX waits", cb.wait_for_stats(|st| st.waits >= 1)).await;
    assert_eq!(bounded("told", holder.blocking()).await.unwrap(), Ex);
    let quiet = tokio::time::timeout(Duration::from_millis(200), holder.blocking()).await;
    assert!(quiet.is_err(), "told twice: {quiet:?}");
    // Converted (PR → CR, still blocking EX): told again.
    bounded("down", holder.convert(Cr)).await.unwrap();
    assert_eq!(bounded("told after converting", holder.blocking()).await.unwrap(), Ex);
    holder.release().await.unwrap();
    bounded("EX", waiting).await.unwrap().unwrap().release().await.unwrap();
}

/// No bypass, by every request order: a compatible newcomer never
/// overtakes an earlier waiter it conflicts with (checked on each grant
/// against the queue order).
#[tokio::test]
pub(crate) async fn held_no_bypass_random_orders() {
    let (_store, s) = memory_sessions(6).await;
    let mut rng = Rng::new(7);
    for round in 0..40 {
        let name = format!("bypass-{round}");
        let order: Vec<LockMode> = (0..6).map(|_| LockMode::ALL[rng.below(6)]).collect();
        let grants = Arc::new(Std::new(Vec::<usize>::new()));
        let mut tasks = Vec::new();
        for (i, mode) in order.iter().copied().enumerate() {
            let resource = s[i].1.resource(&name).unwrap();
            let client = s[i].0.clone();
            let appends = client.stats().appends;
            let grants = Arc::clone(&grants);
            tasks.push(tokio::spawn(async move {
                let guard = resource.lock(mode).await.unwrap();
                grants.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(3)).await;
                guard.release().await.unwrap();
            }));
            bounded("appended", client.wait_for_stats(|st| st.appends > appends)).await;
        }
        for t in tasks {
            bounded("task", t).await.unwrap();
        }
        let grants = grants.lock().unwrap().clone();
        // i granted before an earlier j it conflicts with: a bypass.
        for (pos, &i) in grants.iter().enumerate() {
            for &j in &grants[pos + 1..] {
                assert!(
                    j >= i || order[i].compatible(order[j]),
                    "round {round}: {i} ({}) granted before earlier {j} ({}); order {order:?}, grants {grants:?}",
                    order[i],
                    order[j]
                );
            }
        }
    }
}

/// Multi-resource locks over overlapping names given in opposite orders,
/// in conflicting modes, many rounds, with cancellations: no deadlock, no
/// entry left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn held_multi_resource_opposite_orders() {
    let (store, s) = memory_sessions(4).await;
    let names = ["m-a", "m-b", "m-c"];
    let mut tasks = Vec::new();
    for (i, (_, session)) in s.iter().enumerate() {
        let session = session.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(100 + i as u64);
            for _ in 0..60 {
                let mut parts: Vec<(&str, LockMode)> = Vec::new();
                for n in names {
                    if rng.below(3) > 0 {
                        parts.push((n, [Pr, Ex, Pw, Cw][rng.below(4)]));
                    }
                }
                if parts.is_empty() {
                    parts.push((names[rng.below(3)], Ex));
                }
                if rng.below(2) == 0 {
                    parts.reverse();
                }
                let multi = session.multi_resource(parts).unwrap();
                match rng.below(3) {
                    0 => {
                        if let Ok(g) = tokio::time::timeout(Duration::from_millis(2), multi.lock()).await {
                            g.unwrap().release().await.unwrap();
                        }
                    }
                    1 => {
                        if let Some(g) = multi.try_lock().await.unwrap() {
                            g.release().await.unwrap();
                        }
                    }
                    _ => {
                        let g = multi.lock().await.unwrap();
                        tokio::task::yield_now().await;
                        g.release().await.unwrap();
                    }
                }
            }
        }));
    }
    for t in tasks {
        bounded("a multi-resource task ends (no deadlock)", t).await.unwrap();
    }
    bounded("cleanups", async {
        while names.iter().any(|n| !store.keys(n).is_empty()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Odd input: no panic, typed errors.
#[tokio::test]
pub(crate) async fn held_odd_input() {
    let (_store, s) = memory_sessions(1).await;
    let a = &s[0].1;
    for text in ["", " pw", "pw ", "P W", "ＰＷ", "p\u{0}w", "ex\n", "nl\u{301}", "🙂"] {
        assert!(
            matches!(text.parse::<LockMode>(), Err(Error::InvalidOptions { .. })),
            "{text:?}"
        );
    }
    assert_eq!("eX".parse::<LockMode>().unwrap(), Ex);
    for name in ["", "/", "//", "a//b", "a/./b", "..", "x/.."] {
        assert!(matches!(a.resource(name), Err(Error::InvalidName { .. })), "{name:?}");
    }
    assert!(matches!(
        a.multi_resource(Vec::<(&str, LockMode)>::new()),
        Err(Error::InvalidOptions { .. })
    ));
    assert!(a.multi_resource([("", Pr)]).is_err());
    let name = "odd value";
    let mut g = lock(&a.resource(name).unwrap(), Ex).await;
    assert!(matches!(
        g.set_value(&vec![0u8; lockline::MAX_LOCK_VALUE + 1]),
        Err(Error::InvalidOptions { .. })
    ));
    let tricky: Vec<u8> = b"lvb1 9 1 3 3\nabc\n\xff\x00 dlm1 EX EX 0 0"
        .iter()
        .copied()
        .cycle()
        .take(lockline::MAX_LOCK_VALUE)
        .collect();
    g.set_value(&tricky).unwrap();
    g.release().await.unwrap();
    let r = lock(&a.resource(name).unwrap(), Cr).await;
    assert_eq!(r.value().bytes, tricky);
    assert!(r.value().valid);
    r.release().await.unwrap();
    // Names that look like the encodings.
    for name in ["dlm1 EX EX 0 0 0", "lvb1 1 1 0 0", "x\u{1F642}"] {
        if let Ok(resource) = a.resource(name) {
            lock(&resource, Ex).await.release().await.unwrap();
        }
    }
}
