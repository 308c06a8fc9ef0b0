//! The lock-delay after an involuntary loss.

use super::*;

#[test]
fn a_grant_sooner_than_the_lock_delay_after_an_involuntary_loss_is_caught() {
    let bounds = Bounds {
        lock_delay: 3 * S / 2,
        ..bounds(20 * S)
    };
    let kill = holder_fault(FaultKind::KillHolder, 0, 2 * S, None);
    let waiting = |t: u64, slot: usize| ev(t, slot, What::Waiting);
    // c0 holds from 1 s and is killed at 2 s; c1 waits from just after
    // 1 s and is granted at `granted`; `extra` events besides.
    let run = |granted: u64, extra: Vec<Event>| {
        let mut events = vec![
            grant(S, 0, 10),
            waiting(S + 1, 1),
            ev(2 * S, 0, What::Killed),
            grant(granted, 1, 11),
        ];
        events.extend(extra);
        check(&events, &[], std::slice::from_ref(&kill), bounds)
    };
    // Half a second after the kill: within the delay.
    let early = run(2 * S + S / 2, Vec::new());
    assert!(any_starts_with(&early, "lock-delay broken"), "{early}");
    assert_eq!(early.lock_delay_checks, 1);
    // Past the delay: fine.
    let late = run(4 * S, Vec::new());
    assert!(late.violations.is_empty(), "{late}");
    assert_eq!(late.lock_delay_checks, 1);
    // A waiter ahead of it gave up in between: handed on at once, not
    // judged.
    let gave_up = run(2 * S + S / 2, vec![waiting(S, 2), ev(2 * S + S / 4, 2, What::Timeout)]);
    assert!(gave_up.violations.is_empty(), "{gave_up}");
    assert_eq!(gave_up.lock_delay_checks, 0);
    // Its give-up logged just after the grant it let in (the removal comes
    // before the log): still a clean departure, not judged.
    let logged_after = run(
        2 * S + S / 2,
        vec![waiting(S, 2), ev(2 * S + S / 2 + S / 100, 2, What::Timeout)],
    );
    assert!(logged_after.violations.is_empty(), "{logged_after}");
    assert_eq!(logged_after.lock_delay_checks, 0);
    // A give-up logged long after the grant did not let it in: judged.
    let long_after = run(2 * S + S / 2, vec![waiting(S, 2), ev(4 * S, 2, What::Timeout)]);
    assert!(any_starts_with(&long_after, "lock-delay broken"), "{long_after}");
    // One behind it gave up: that does not hand on to it; judged.
    let behind = run(
        2 * S + S / 2,
        vec![waiting(S + 2, 2), ev(2 * S + S / 4, 2, What::Timeout)],
    );
    assert!(any_starts_with(&behind, "lock-delay broken"), "{behind}");
    // A waiter that came after the fault: not judged either.
    let events = vec![
        grant(S, 0, 10),
        ev(2 * S, 0, What::Killed),
        waiting(2 * S + 1, 1),
        grant(2 * S + S / 2, 1, 11),
    ];
    let newcomer = check(&events, &[], std::slice::from_ref(&kill), bounds);
    assert!(newcomer.violations.is_empty(), "{newcomer}");
    assert_eq!(newcomer.lock_delay_checks, 0);
    // A paused holder that kept its lock (no lost()), then released: not judged.
    let pause = Fault {
        kind: FaultKind::PauseHolder,
        ..kill.clone()
    };
    let events = vec![
        grant(S, 0, 10),
        waiting(S + 1, 1),
        release(2 * S + S / 4, 0, 10),
        grant(2 * S + S / 2, 1, 11),
    ];
    let kept = check(&events, &[], &[pause], bounds);
    assert!(kept.violations.is_empty(), "{kept}");
    assert_eq!(kept.lock_delay_checks, 0);
}
