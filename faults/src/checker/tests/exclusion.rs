//! Overlapping holders: fenced, frozen, reset or forgotten by the server,
//! and `lost()` first.

use super::*;

#[test]
fn clean_handoffs_pass() {
    let events = vec![
        grant(S, 0, 10),
        release(2 * S, 0, 10),
        grant(2 * S + 1, 1, 11),
        dropped(3 * S, 1, 11),
        grant(8 * S, 0, 12),
        release(13 * S, 0, 12),
        grant(14 * S, 1, 13),
    ];
    let writes = vec![write(S + 5, 0, 10, true), write(2 * S + 5, 1, 11, true)];
    let report = check(&events, &writes, &[], bounds(20 * S));
    assert_clean(&report);
    assert_eq!(report.grants, 4);
    assert_eq!(report.overlaps_raw, 0);
}

#[test]
fn a_late_lost_and_an_accepted_stale_write_are_caught() {
    let events = vec![grant(S, 0, 10), grant(4 * S, 1, 11), lost(4 * S + S / 2, 0, 10)];
    let writes = vec![write(4 * S + 1, 0, 10, true), write(4 * S + 2, 1, 11, true)];
    let report = check(&events, &writes, &[], bounds(6 * S));
    assert_eq!(report.overlaps_raw, 1);
    assert_eq!(report.violations.len(), 2, "{report}");
    assert!(report.violations[0].starts_with("unfenced overlap"));
    assert!(report.violations[1].starts_with("lost() after the next grant"));
}

/// c0 is granted token 10 at 1 s and frozen from just after until 5 s;
/// c1 is granted token 11 at 4 s; c0 hears `lost()` once it wakes.
fn frozen_holder() -> (Vec<Event>, Vec<Fault>) {
    let events = vec![
        grant(S, 0, 10),
        ev(S + 1, 0, What::Paused),
        grant(4 * S, 1, 11),
        ev(5 * S, 0, What::Resumed),
        lost(5 * S + 10, 0, 10),
    ];
    let pause = holder_fault(FaultKind::PauseHolder, 0, S + 1, Some(5 * S));
    (events, vec![pause])
}

#[test]
fn a_frozen_holder_caught_by_fencing_is_explained() {
    let (mut events, faults) = frozen_holder();
    events.extend([release(6 * S, 1, 11), grant(6 * S + 1, 0, 12)]);
    let writes = vec![write(4 * S + 1, 1, 11, true), write(5 * S + 5, 0, 10, false)];
    let report = check(&events, &writes, &faults, bounds(10 * S));
    assert_clean(&report);
    assert_eq!((report.overlaps_raw, report.overlaps_fenced), (1, 1));
    assert_eq!(report.worst_recovery.map(|(s, _)| s.round()), Some(3.0));
}

#[test]
fn a_frozen_holder_s_write_landing_after_the_next_grant_is_caught_where_the_lock_fences() {
    // A frozen holder wakes up after the next grant and writes before the
    // newer holder does: the token register orders that write before the
    // newer holder's; a backend that fences on the lock itself must refuse it.
    let (events, faults) = frozen_holder();
    let stale_then_newer = |stale: Write, newer: Write| check(&events, &[stale, newer], &faults, bounds(10 * S));
    let token = stale_then_newer(write(5 * S + 5, 0, 10, true), write(5 * S + 9, 1, 11, true));
    assert_clean(&token);
    let held = stale_then_newer(held_write(5 * S + 5, 0, 10, true), held_write(5 * S + 9, 1, 11, true));
    assert_eq!(held.violations.len(), 1, "{held}");
    assert!(held.violations[0].starts_with("unfenced overlap"), "{held}");
    // Refused by the backend: explained.
    let refused = stale_then_newer(held_write(5 * S + 5, 0, 10, false), held_write(5 * S + 9, 1, 11, true));
    assert_clean(&refused);
    assert_eq!(refused.overlaps_fenced, 1);
}

#[test]
fn a_reset_holder_may_hold_on_only_as_long_as_the_backend_takes_to_notice() {
    // The holder's connections are reset at 2 s; the server frees the lock
    // at once and grants it at 2.1 s; the holder notices at 2.6 s.
    let events = vec![
        grant(S, 0, 10),
        grant(2 * S + S / 10, 1, 11),
        lost(2 * S + 6 * S / 10, 0, 10),
    ];
    let cut = vec![holder_fault(FaultKind::CutHolder, 0, 2 * S, Some(3 * S))];
    let refused = [held_write(2 * S + S / 5, 0, 10, false)];
    // A backend where a reset frees nothing: lost() must come first.
    let strict = check(&events, &refused, &cut, bounds(4 * S));
    assert_first(&strict, "lost() after the next grant");
    // Noticed within the bound, every later write refused: counted, not a violation.
    let lenient = postgres_resets(4 * S, S);
    let report = check(&events, &refused, &cut, lenient);
    assert_clean(&report);
    assert_eq!(report.reset_holders_late.0, 1);
    // A write that landed after the next grant is still a violation.
    let landed = [held_write(2 * S + S / 5, 0, 10, true)];
    let report = check(&events, &landed, &cut, lenient);
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].starts_with("unfenced overlap"), "{report}");
    // Noticed too late.
    let report = check(&events, &refused, &cut, postgres_resets(4 * S, S / 2));
    assert_first(&report, "lost() after the next grant");
    // Reset of another holder: no excuse.
    let other = vec![Fault {
        holder: Some(tag(2)),
        ..cut[0].clone()
    }];
    let report = check(&events, &refused, &other, lenient);
    assert_first(&report, "lost() after the next grant");
}

#[test]
fn a_holder_granted_while_the_server_crashes_is_reset_as_well() {
    // From a long run on PostgreSQL (seed 23): a backend is killed at
    // 287.741 s; the postmaster ends every session a little later. c1 is
    // granted at 287.770 s, in between; c4 is granted again at 287.965 s
    // after the crash recovery; c1 learns only when it releases at
    // 288.083 s, every write after that grant refused.
    let ms = |m: u64| m * 1_000_000;
    let events = vec![
        grant(ms(287_132), 4, 349),
        release(ms(287_762), 4, 349),
        grant(ms(287_770), 1, 350),
        grant(ms(287_965), 4, 351),
        release(ms(288_083), 1, 350),
    ];
    let writes = [
        held_write(ms(287_903), 1, 350, false),
        held_write(ms(287_975), 1, 350, false),
        held_write(ms(288_033), 4, 351, true),
    ];
    let crash = vec![Fault {
        target: "backend 11554".into(),
        ..server_fault(FaultKind::CrashBackend, ms(287_741), ms(287_924))
    }];
    // The window as a backend without a restart grace has it (lockline-sql
    // has one now, and the checker no longer excuses a crash there: see
    // below).
    let lenient = Bounds {
        reset_notice: 2 * S,
        reset_kinds: &[FaultKind::CrashBackend],
        ..bounds(ms(290_000))
    };
    let report = check(&events, &writes, &crash, lenient);
    assert_clean(&report);
    assert_eq!(report.reset_holders_late.0, 1);
    // PostgreSQL's restart grace: a crash excuses nothing.
    let strict = Bounds {
        reset_kinds: crate::Backend::Postgres.forgets(),
        ..lenient
    };
    let report = check(&events, &writes, &crash, strict);
    assert_first(&report, "lost() after the next grant");
    // The same without a crash is a violation.
    let report = check(&events, &writes, &[], lenient);
    assert_first(&report, "lost() after the next grant");
}

#[test]
fn a_holder_a_restart_without_persistence_forgot_may_hold_until_its_next_renewal() {
    // Redis without persistence: c0 holds token 10; the server is killed
    // at 2 s and back, empty, at 3 s; c1 is granted token 11 at 3.1 s;
    // c0 writes once at 3.2 s (before c1 writes at 3.3 s) and hears
    // lost() at its next renewal, 3.5 s.
    let heard_at = |t: u64| vec![grant(S, 0, 10), grant(3 * S + S / 10, 1, 11), lost(t, 0, 10)];
    let events = heard_at(3 * S + S / 2);
    let writes = [
        write(3 * S + S / 5, 0, 10, true),
        write(3 * S + 3 * S / 10, 1, 11, true),
    ];
    let restart = vec![server_fault(FaultKind::KillServer, 2 * S, 3 * S)];
    let volatile = Bounds {
        reset_notice: 2 * S,
        reset_kinds: crate::Backend::RedisVolatile.forgets(),
        reset_at_end: true,
        ..bounds(6 * S)
    };
    let report = check(&events, &writes, &restart, volatile);
    assert_clean(&report);
    assert_eq!(report.reset_holders_late.0, 1);
    assert!((report.reset_holders_late.1 - 0.5).abs() < 1e-9, "{report}");
    // With the data kept (an append-only file), a restart frees nothing:
    // the same history breaks lost() first and the register.
    let kept = Bounds {
        reset_kinds: crate::Backend::Redis.forgets(),
        ..volatile
    };
    let report = check(&events, &writes, &restart, kept);
    assert!(any_starts_with(&report, "lost() after the next grant"), "{report}");
    assert!(any_starts_with(&report, "unfenced overlap"), "{report}");
    // Heard too late after the server's return (counted from it, not
    // from the kill).
    let report = check(&heard_at(5 * S + S / 10), &writes, &restart, volatile);
    assert!(any_starts_with(&report, "lost() after the next grant"), "{report}");
    // A stale write accepted after the newer holder wrote is not excused.
    let after_newer = [
        write(3 * S + 3 * S / 10, 1, 11, true),
        write(3 * S + 2 * S / 5, 0, 10, true),
    ];
    let report = check(&events, &after_newer, &restart, volatile);
    assert!(any_starts_with(&report, "unfenced overlap"), "{report}");
    // A pause of the server forgets nothing: no excuse.
    let pause = vec![Fault {
        kind: FaultKind::PauseServer,
        ..restart[0].clone()
    }];
    let report = check(&events, &writes, &pause, volatile);
    assert!(any_starts_with(&report, "lost() after the next grant"), "{report}");
}
