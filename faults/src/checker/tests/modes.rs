//! Holders judged by their lock modes: compatible ones share, incompatible
//! ones overlap as mutex holders would, conversions cut sections.

use super::*;
use LockMode::{Cr, Cw, Ex, Nl, Pr, Pw};

/// c0 holds `held` from 1 s to 4 s; c1 is granted `asked` at 2 s, beside
/// it, and releases at 3 s. Neither was faulted.
fn side_by_side(held: LockMode, asked: LockMode) -> Report {
    check_events(
        &[
            granted_in(S, 0, 10, held),
            granted_in(2 * S, 1, 11, asked),
            release(3 * S, 1, 11),
            release(4 * S, 0, 10),
        ],
        5 * S,
    )
}

#[test]
fn two_running_holders_in_incompatible_modes_are_caught_and_compatible_ones_pass() {
    for held in LockMode::ALL {
        for asked in LockMode::ALL {
            let report = side_by_side(held, asked);
            if held.compatible(asked) {
                assert_eq!(
                    report.violations,
                    Vec::<String>::new(),
                    "{held} beside {asked}: {report}"
                );
                assert_eq!((report.overlaps_compatible, report.overlaps_raw), (1, 0));
            } else {
                assert_eq!(report.violations.len(), 1, "{held} beside {asked}: {report}");
                assert_first(
                    &report,
                    &format!(
                        "lost() after the next grant: c0.0 (token 10 in {held}, granted 1.000s, not frozen) still held when c1.0 (token 11 in {asked}) was granted"
                    ),
                );
            }
        }
    }
    // The rule the brief states, row by row.
    let beside = |a: LockMode, b: LockMode| side_by_side(a, b).violations.is_empty();
    assert!(LockMode::ALL.iter().all(|&m| beside(Ex, m) == (m == Nl)));
    assert!(LockMode::ALL.iter().all(|&m| beside(Pw, m) == matches!(m, Nl | Cr)));
    assert!([Cw, Pw, Ex].iter().all(|&m| !beside(Pr, m)));
}

#[test]
fn an_up_conversion_beside_an_incompatible_holder_is_caught() {
    // c0 and c1 share PR; c1 converts to EX at 2 s while c0 still holds
    // (until 3 s).
    let events = vec![
        granted_in(S, 0, 10, Pr),
        granted_in(S + S / 2, 1, 11, Pr),
        converting(S + S / 2 + 1, 1, Pr, Ex),
        converted(2 * S, 1, Pr, Ex, 12),
        release(3 * S, 0, 10),
        release(4 * S, 1, 12),
    ];
    let report = check_events(&events, 5 * S);
    assert_eq!(report.violations.len(), 1, "{report}");
    assert_first(
        &report,
        "lost() after the next grant: c0.0 (token 10 in PR, granted 1.000s, not frozen) still held when c1.0 (token 12 in EX) was converted at 2.000s",
    );
    assert_eq!(report.grants, 2, "a conversion is no grant");
    assert_eq!(report.conversions, (1, 0));
    // Converted once c0 let go: fine.
    let events = vec![
        granted_in(S, 0, 10, Pr),
        granted_in(S + S / 2, 1, 11, Pr),
        release(S + 9 * S / 10, 0, 10),
        converted(2 * S, 1, Pr, Ex, 12),
        release(4 * S, 1, 12),
    ];
    let report = check_events(&events, 5 * S);
    assert_clean(&report);
    assert_eq!(report.overlaps_compatible, 1, "PR beside PR before the conversion");
}

#[test]
fn a_down_conversion_shares_from_when_it_was_asked_for_and_not_before() {
    // c0 holds EX from 1 s and converts down to CR at 2 s; c1 is granted
    // PR (compatible with CR, not with EX).
    let run = |granted: u64| {
        check_events(
            &[
                granted_in(S, 0, 10, Ex),
                converted(2 * S, 0, Ex, Cr, 10),
                granted_in(granted, 1, 11, Pr),
                release(3 * S, 1, 11),
                release(4 * S, 0, 10),
            ],
            5 * S,
        )
    };
    let after = run(2 * S + S / 10);
    assert_clean(&after);
    assert_eq!(after.conversions, (0, 1));
    let before = run(2 * S - S / 10);
    assert_eq!(before.violations.len(), 1, "{before}");
    assert_first(&before, "lost() after the next grant: c0.0 (token 10 in EX");
}

#[test]
fn a_frozen_mode_holder_is_judged_as_a_frozen_mutex_holder() {
    // c0 holds PW, is frozen from 1.1 s to 5 s; c1 is granted EX at 4 s
    // (c0's session expired); c0 wakes and writes once before it hears
    // lost().
    let events = vec![
        granted_in(S, 0, 10, Pw),
        ev(S + S / 10, 0, What::Paused),
        granted_in(4 * S, 1, 11, Ex),
        ev(5 * S, 0, What::Resumed),
        lost(5 * S + S / 5, 0, 10),
        release(6 * S, 1, 11),
    ];
    let pause = vec![holder_fault(FaultKind::PauseHolder, 0, S + S / 10, Some(5 * S))];
    let newer_then_stale = |stale_landed: bool| {
        [
            held_write(4 * S + S / 2, 1, 11, true),
            held_write(5 * S + S / 10, 0, 10, stale_landed),
        ]
    };
    let refused = newer_then_stale(false);
    let report = check(&events, &refused, &pause, bounds(10 * S));
    assert_clean(&report);
    assert_eq!((report.overlaps_raw, report.overlaps_fenced), (1, 1));
    // The stale write landed: fencing failed.
    let report = check(&events, &newer_then_stale(true), &pause, bounds(10 * S));
    assert_eq!(
        starts_with(&report, "unfenced overlap: c0.0 (token 10 in PW)"),
        1,
        "{report}"
    );
    assert_eq!(starts_with(&report, "register accepted token 10"), 1, "{report}");
    // The same without the freeze: a running holder beside EX.
    let running: Vec<Event> = events
        .iter()
        .filter(|e| !matches!(e.what, What::Paused | What::Resumed))
        .cloned()
        .collect();
    let report = check(&running, &refused, &[], bounds(10 * S));
    assert_eq!(starts_with(&report, "lost() after the next grant"), 1, "{report}");
}

#[test]
fn a_reset_mode_holder_gets_the_reset_allowance_and_no_more() {
    // As for a mutex on PostgreSQL: c0's connections are reset at 2 s, the
    // server frees its EX at once, c1 is granted PR at 2.1 s, c0 hears
    // lost() at 2.6 s; every write of c0 after that grant refused.
    let events = vec![
        granted_in(S, 0, 10, Ex),
        granted_in(2 * S + S / 10, 1, 11, Pr),
        lost(2 * S + 6 * S / 10, 0, 10),
    ];
    let cut = vec![holder_fault(FaultKind::CutHolder, 0, 2 * S, Some(3 * S))];
    let refused = [held_write(2 * S + S / 5, 0, 10, false)];
    let report = check(&events, &refused, &cut, postgres_resets(4 * S, S));
    assert_clean(&report);
    assert_eq!(report.reset_holders_late.0, 1);
    let report = check(&events, &refused, &cut, postgres_resets(4 * S, S / 2));
    assert_eq!(starts_with(&report, "lost() after the next grant"), 1, "{report}");
    // Where a reset frees nothing (etcd), no allowance.
    let report = check(&events, &refused, &cut, bounds(4 * S));
    assert_eq!(starts_with(&report, "lost() after the next grant"), 1, "{report}");
}

#[test]
fn a_conversion_from_a_mode_not_held_is_caught() {
    let report = check_events(&[granted_in(S, 0, 10, Ex), converted(2 * S, 0, Pr, Pw, 11)], 3 * S);
    assert_eq!(
        starts_with(
            &report,
            "c0.0 reported a conversion from PR to PW at 2.000s while holding in EX"
        ),
        1,
        "{report}"
    );
}

#[test]
fn a_blackholed_holder_counts_against_the_next_incompatible_grant() {
    // c0 holds CR, blackholed at 2 s; c1 is granted PR at 2.5 s (beside
    // CR: it says nothing); c0 hears lost() at 4 s; c2 is granted EX at 5 s.
    let events = vec![
        granted_in(S, 0, 10, Cr),
        granted_in(2 * S + S / 2, 1, 11, Pr),
        lost(4 * S, 0, 10),
        release(4 * S + S / 2, 1, 11),
        granted_in(5 * S, 2, 12, Ex),
        release(6 * S, 2, 12),
    ];
    let blackhole = vec![holder_fault(FaultKind::BlackholeHolder, 0, 2 * S, Some(5 * S))];
    let report = check(&events, &[], &blackhole, bounds(10 * S));
    assert_clean(&report);
    assert_eq!(report.blackholed_holders, (1, 1));
}

#[test]
fn an_up_conversion_the_server_made_before_the_next_grant_ends_the_old_mode_there() {
    // c0 holds PR (token 10) and converts up to CW; the server converts it
    // with token 12 and grants c1 CW with token 13 before c0 hears of its
    // conversion: CW beside CW, in the server's order.
    let run = |c1_token: u64| {
        check_events(
            &[
                granted_in(S, 0, 10, Pr),
                converting(2 * S, 0, Pr, Cw),
                granted_in(2 * S + S / 10, 1, c1_token, Cw),
                converted(2 * S + S / 5, 0, Pr, Cw, 12),
                release(3 * S, 1, c1_token),
                release(4 * S, 0, 12),
            ],
            5 * S,
        )
    };
    let ordered = run(13);
    assert_clean(&ordered);
    // Granted CW before the conversion (token 11 < 12): beside PR.
    let beside = run(11);
    assert_eq!(beside.violations.len(), 1, "{beside}");
    assert_first(&beside, "lost() after the next grant: c0.0 (token 10 in PR");
}

#[test]
fn a_grant_while_a_cw_holder_waits_to_convert_to_pr_is_counted_not_judged() {
    // c0 holds CW (token 10) and asks for PR at 2 s; c1 is granted PR at
    // 2.1 s, and c0 hears of its conversion at 2.2 s (a CW to PR
    // conversion keeps its token: nothing orders the two on the server).
    let run = |c1_granted: u64, c0_converts: bool| {
        let mut events = vec![
            granted_in(S, 0, 10, Cw),
            converting(2 * S, 0, Cw, Pr),
            granted_in(c1_granted, 1, 11, Pr),
        ];
        if c0_converts {
            events.push(converted(2 * S + S / 5, 0, Cw, Pr, 10));
        } else {
            events.push(ev(2 * S + S / 5, 0, What::ConvertTimeout { from: Cw, to: Pr }));
        }
        events.extend([release(3 * S, 1, 11), release(4 * S, 0, 10)]);
        check_events(&events, 5 * S)
    };
    let waited = run(2 * S + S / 10, true);
    assert_clean(&waited);
    assert_eq!(waited.overlaps_conversion_unordered, 1, "{waited}");
    // Granted before c0 asked: PR beside CW.
    let before = run(2 * S - S / 10, true);
    assert_first(&before, "lost() after the next grant: c0.0 (token 10 in CW");
    // The conversion timed out: c0 kept CW, and PR was granted beside it.
    let kept = run(2 * S + S / 10, false);
    assert_first(&kept, "lost() after the next grant: c0.0 (token 10 in CW");
    assert_eq!(kept.overlaps_conversion_unordered, 0);
}
