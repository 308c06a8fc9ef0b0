//! The register and the tokens.

use super::*;

#[test]
fn writes_are_judged_in_the_order_of_their_times() {
    // A backend-fenced write of the older holder, reported after the newer
    // holder's: no token went back.
    let events = vec![grant(S, 0, 10), release(2 * S, 0, 10), grant(2 * S + 1, 1, 11)];
    let writes = vec![held_write(2 * S + 5, 1, 11, true), held_write(S + 5, 0, 10, true)];
    let report = check(&events, &writes, &[], bounds(3 * S));
    assert_clean(&report);
    // An unsure write counts as landed: a lower token after a higher one.
    let late = Write {
        unsure: true,
        ..held_write(2 * S + 9, 0, 10, false)
    };
    let report = check(&events, &[held_write(2 * S + 5, 1, 11, true), late], &[], bounds(3 * S));
    assert!(any_starts_with(&report, "register accepted token 10"), "{report}");
}

#[test]
fn the_register_order_applies_to_pw_and_ex_writes() {
    // EX (11) then PW (12), cleanly handed over; a write of token 11
    // landing after token 12's is a register going back.
    let events = vec![
        granted_in(S, 0, 11, LockMode::Ex),
        release(2 * S, 0, 11),
        granted_in(2 * S + 1, 1, 12, LockMode::Pw),
        release(3 * S, 1, 12),
    ];
    let in_order = [held_write(S + 5, 0, 11, true), held_write(2 * S + 5, 1, 12, true)];
    let report = check(&events, &in_order, &[], bounds(4 * S));
    assert_clean(&report);
    let back = [
        held_write(S + 5, 0, 11, true),
        held_write(2 * S + 5, 1, 12, true),
        held_write(2 * S + 9, 0, 11, true),
    ];
    let report = check(&events, &back, &[], bounds(4 * S));
    assert_eq!(
        starts_with(&report, "register accepted token 11 from c0.0"),
        1,
        "{report}"
    );
}

#[test]
fn mode_tokens_must_rise_over_incompatible_holders_only() {
    use LockMode::{Cr, Ex, Pr, Pw};
    // Two CR grants reported out of their tokens' order (compatible: no
    // order to keep); then EX with a token below theirs, or above.
    let ex_after_two_crs = |ex_token: u64| {
        check_events(
            &[
                granted_in(S, 0, 20, Cr),
                granted_in(S + S / 10, 1, 19, Cr),
                release(2 * S, 0, 20),
                release(2 * S, 1, 19),
                granted_in(3 * S, 2, ex_token, Ex),
                release(4 * S, 2, ex_token),
            ],
            5 * S,
        )
    };
    let report = ex_after_two_crs(18);
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(
        report.violations[0]
            .starts_with("fencing token did not increase: c2.0 was granted token 18 in EX at 3.000s after c0.0 was granted token 20 in CR"),
        "{report}"
    );
    assert_clean(&ex_after_two_crs(21));
    // An up-conversion to a writing mode must take a fresh token; one to
    // PR keeps its old token, below a writer that held meanwhile.
    let stale = vec![
        granted_in(S, 0, 10, Pr),
        converted(2 * S, 0, Pr, Pw, 10),
        release(3 * S, 0, 10),
    ];
    let report = check_events(&stale, 5 * S);
    assert_eq!(
        starts_with(
            &report,
            "fencing token did not increase: c0.0 was converted token 10 in PW"
        ),
        1,
        "{report}"
    );
    let kept = vec![
        granted_in(S / 2, 0, 10, Cr),
        granted_in(S, 1, 12, Pw),
        release(2 * S, 1, 12),
        converted(2 * S + S / 10, 0, Cr, Pr, 10),
        release(3 * S, 0, 10),
    ];
    assert_clean(&check_events(&kept, 5 * S));
}
