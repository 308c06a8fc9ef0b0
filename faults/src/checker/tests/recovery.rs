//! Recovery after faults, stalls, and the grants they count.

use super::*;

#[test]
fn a_fault_whose_recovery_window_outlasts_the_run_is_not_judged() {
    let events = vec![grant(S, 0, 10), release(2 * S, 0, 10)];
    let kill_member = |start| Fault {
        kind: FaultKind::KillMember,
        target: "n1".into(),
        holder: None,
        start,
        end: Some(start + 1),
    };
    // Three seconds before the end, with an 8 s bound: not judged.
    let late = check(&events, &[], &[kill_member(3 * S)], bounds(6 * S));
    assert!(!any_starts_with(&late, "no grant"), "{late}");
    // Long enough before the end: judged.
    let early = check(&events, &[], &[kill_member(3 * S)], bounds(20 * S));
    assert!(any_starts_with(&early, "no grant"), "{early}");
}

#[test]
fn slow_recovery_stalls_and_backward_tokens_are_caught() {
    let events = vec![
        grant(S, 0, 10),
        ev(S + 1, 0, What::Killed),
        grant(11 * S, 1, 9),
        release(12 * S, 1, 9),
    ];
    let faults = vec![holder_fault(FaultKind::KillHolder, 0, S, Some(S + 1))];
    let report = check(&events, &[], &faults, bounds(20 * S));
    let kinds: Vec<&str> = report
        .violations
        .iter()
        .map(|v| v.split(':').next().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        ["fencing token did not increase", "slow recovery", "stall"],
        "{report}"
    );
}

#[test]
fn recovery_counts_no_nl_grant() {
    use LockMode::{Cr, Ex, Nl};
    // A holder killed at 1 s; only NL grants follow (they wait for
    // nobody): no recovery. A CR grant within the bound is one.
    let kill = vec![holder_fault(FaultKind::KillHolder, 0, S, Some(S + 1))];
    let mut events = vec![
        granted_in(S / 2, 0, 10, Ex),
        ev(S, 0, What::Killed),
        granted_in(2 * S, 1, 11, Nl),
        release(3 * S, 1, 11),
        granted_in(12 * S, 2, 12, Nl),
        release(13 * S, 2, 12),
    ];
    let report = check(&events, &[], &kill, bounds(20 * S));
    assert_eq!(starts_with(&report, "no grant after kill-holder"), 1, "{report}");
    events.push(granted_in(4 * S, 3, 13, Cr));
    events.push(release(5 * S, 3, 13));
    events.sort_by_key(|e| e.t);
    let report = check(&events, &[], &kill, bounds(20 * S));
    assert_eq!(starts_with(&report, "no grant after"), 0, "{report}");
    assert_eq!(starts_with(&report, "slow recovery"), 0, "{report}");
}
