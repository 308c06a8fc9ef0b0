use super::*;

const S: u64 = 1_000_000_000;

fn tag(slot: usize) -> Tag {
    Tag { slot, incarnation: 0 }
}

fn ev(t: u64, slot: usize, what: What) -> Event {
    Event {
        t,
        tag: tag(slot),
        what,
    }
}

fn grant(t: u64, slot: usize, token: u64) -> Event {
    ev(
        t,
        slot,
        What::Grant {
            token,
            key: String::new(),
            mode: None,
        },
    )
}

/// A lock-mode grant.
fn granted_in(t: u64, slot: usize, token: u64, mode: LockMode) -> Event {
    ev(
        t,
        slot,
        What::Grant {
            token,
            key: String::new(),
            mode: Some(mode),
        },
    )
}

fn converted(t: u64, slot: usize, from: LockMode, to: LockMode, token: u64) -> Event {
    ev(t, slot, What::Converted { from, to, token })
}

fn release(t: u64, slot: usize, token: u64) -> Event {
    ev(t, slot, What::Release { token, dropped: false })
}

fn starts_with(report: &Report, head: &str) -> usize {
    report.violations.iter().filter(|v| v.starts_with(head)).count()
}

fn write(t: u64, slot: usize, token: u64, accepted: bool) -> Write {
    Write {
        t,
        tag: tag(slot),
        token,
        seq: 0,
        accepted,
        fence: Fence::Token,
        unsure: false,
    }
}

fn held_write(t: u64, slot: usize, token: u64, accepted: bool) -> Write {
    Write {
        fence: Fence::Held,
        ..write(t, slot, token, accepted)
    }
}

fn bounds(stop: u64) -> Bounds {
    Bounds {
        start: 0,
        stop,
        recovery: 8 * S,
        reset_notice: 0,
        reset_kinds: &[],
        reset_at_end: false,
        ride_out: 0,
        ride_out_kinds: &[],
        loss_deadline: 2 * S,
        forgets_sessions: &[],
        lock_delay: 0,
    }
}

#[test]
fn clean_handoffs_pass() {
    let events = vec![
        grant(S, 0, 10),
        ev(
            2 * S,
            0,
            What::Release {
                token: 10,
                dropped: false,
            },
        ),
        grant(2 * S + 1, 1, 11),
        ev(
            3 * S,
            1,
            What::Release {
                token: 11,
                dropped: true,
            },
        ),
        grant(8 * S, 0, 12),
        ev(
            13 * S,
            0,
            What::Release {
                token: 12,
                dropped: false,
            },
        ),
        grant(14 * S, 1, 13),
    ];
    let writes = vec![write(S + 5, 0, 10, true), write(2 * S + 5, 1, 11, true)];
    let report = check(&events, &writes, &[], bounds(20 * S));
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    assert_eq!(report.grants, 4);
    assert_eq!(report.overlaps_raw, 0);
}

#[test]
fn a_late_lost_and_an_accepted_stale_write_are_caught() {
    let events = vec![
        grant(S, 0, 10),
        grant(4 * S, 1, 11),
        ev(4 * S + S / 2, 0, What::Lost { token: 10 }),
    ];
    let writes = vec![write(4 * S + 1, 0, 10, true), write(4 * S + 2, 1, 11, true)];
    let report = check(&events, &writes, &[], bounds(6 * S));
    assert_eq!(report.overlaps_raw, 1);
    assert_eq!(report.violations.len(), 2, "{report}");
    assert!(report.violations[0].starts_with("unfenced overlap"));
    assert!(report.violations[1].starts_with("lost() after the next grant"));
}

#[test]
fn a_frozen_holder_caught_by_fencing_is_explained() {
    let events = vec![
        grant(S, 0, 10),
        ev(S + 1, 0, What::Paused),
        grant(4 * S, 1, 11),
        ev(5 * S, 0, What::Resumed),
        ev(5 * S + 10, 0, What::Lost { token: 10 }),
        ev(
            6 * S,
            1,
            What::Release {
                token: 11,
                dropped: false,
            },
        ),
        grant(6 * S + 1, 0, 12),
    ];
    let writes = vec![write(4 * S + 1, 1, 11, true), write(5 * S + 5, 0, 10, false)];
    let faults = vec![Fault {
        kind: FaultKind::PauseHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: S + 1,
        end: Some(5 * S),
    }];
    let report = check(&events, &writes, &faults, bounds(10 * S));
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    assert_eq!((report.overlaps_raw, report.overlaps_fenced), (1, 1));
    assert_eq!(report.worst_recovery.map(|(s, _)| s.round()), Some(3.0));
}

#[test]
fn a_frozen_holder_s_write_landing_after_the_next_grant_is_caught_where_the_lock_fences() {
    // A frozen holder wakes up after the next grant and writes before the
    // newer holder does: the token register orders that write before the
    // newer holder's; a backend that fences on the lock itself must refuse it.
    let events = vec![
        grant(S, 0, 10),
        ev(S + 1, 0, What::Paused),
        grant(4 * S, 1, 11),
        ev(5 * S, 0, What::Resumed),
        ev(5 * S + 10, 0, What::Lost { token: 10 }),
    ];
    let faults = vec![Fault {
        kind: FaultKind::PauseHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: S + 1,
        end: Some(5 * S),
    }];
    let token = check(
        &events,
        &[write(5 * S + 5, 0, 10, true), write(5 * S + 9, 1, 11, true)],
        &faults,
        bounds(10 * S),
    );
    assert_eq!(token.violations, Vec::<String>::new(), "{token}");
    let held = check(
        &events,
        &[held_write(5 * S + 5, 0, 10, true), held_write(5 * S + 9, 1, 11, true)],
        &faults,
        bounds(10 * S),
    );
    assert_eq!(held.violations.len(), 1, "{held}");
    assert!(held.violations[0].starts_with("unfenced overlap"), "{held}");
    // Refused by the backend: explained.
    let refused = check(
        &events,
        &[held_write(5 * S + 5, 0, 10, false), held_write(5 * S + 9, 1, 11, true)],
        &faults,
        bounds(10 * S),
    );
    assert_eq!(refused.violations, Vec::<String>::new(), "{refused}");
    assert_eq!(refused.overlaps_fenced, 1);
}

#[test]
fn a_reset_holder_may_hold_on_only_as_long_as_the_backend_takes_to_notice() {
    // The holder's connections are reset at 2 s; the server frees the lock
    // at once and grants it at 2.1 s; the holder notices at 2.6 s.
    let events = vec![
        grant(S, 0, 10),
        grant(2 * S + S / 10, 1, 11),
        ev(2 * S + 6 * S / 10, 0, What::Lost { token: 10 }),
    ];
    let cut = vec![Fault {
        kind: FaultKind::CutHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: 2 * S,
        end: Some(3 * S),
    }];
    let refused = [held_write(2 * S + S / 5, 0, 10, false)];
    // A backend where a reset frees nothing: lost() must come first.
    let strict = check(&events, &refused, &cut, bounds(4 * S));
    assert!(
        strict.violations[0].starts_with("lost() after the next grant"),
        "{strict}"
    );
    // Noticed within the bound, every later write refused: counted, not a violation.
    let lenient = Bounds {
        reset_notice: S,
        reset_kinds: crate::Backend::Postgres.forgets(),
        ..bounds(4 * S)
    };
    let report = check(&events, &refused, &cut, lenient);
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    assert_eq!(report.reset_holders_late.0, 1);
    // A write that landed after the next grant is still a violation.
    let landed = [held_write(2 * S + S / 5, 0, 10, true)];
    let report = check(&events, &landed, &cut, lenient);
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].starts_with("unfenced overlap"), "{report}");
    // Noticed too late.
    let tight = Bounds {
        reset_notice: S / 2,
        ..lenient
    };
    let report = check(&events, &refused, &cut, tight);
    assert!(
        report.violations[0].starts_with("lost() after the next grant"),
        "{report}"
    );
    // Reset of another holder: no excuse.
    let other = vec![Fault {
        holder: Some(tag(2)),
        ..cut[0].clone()
    }];
    let report = check(&events, &refused, &other, lenient);
    assert!(
        report.violations[0].starts_with("lost() after the next grant"),
        "{report}"
    );
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
        ev(
            ms(287_762),
            4,
            What::Release {
                token: 349,
                dropped: false,
            },
        ),
        grant(ms(287_770), 1, 350),
        grant(ms(287_965), 4, 351),
        ev(
            ms(288_083),
            1,
            What::Release {
                token: 350,
                dropped: false,
            },
        ),
    ];
    let writes = [
        held_write(ms(287_903), 1, 350, false),
        held_write(ms(287_975), 1, 350, false),
        held_write(ms(288_033), 4, 351, true),
    ];
    let crash = vec![Fault {
        kind: FaultKind::CrashBackend,
        target: "backend 11554".into(),
        holder: None,
        start: ms(287_741),
        end: Some(ms(287_924)),
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
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    assert_eq!(report.reset_holders_late.0, 1);
    // PostgreSQL's restart grace: a crash excuses nothing.
    let strict = Bounds {
        reset_kinds: crate::Backend::Postgres.forgets(),
        ..lenient
    };
    let report = check(&events, &writes, &crash, strict);
    assert!(
        report.violations[0].starts_with("lost() after the next grant"),
        "{report}"
    );
    // The same without a crash is a violation.
    let report = check(&events, &writes, &[], lenient);
    assert!(
        report.violations[0].starts_with("lost() after the next grant"),
        "{report}"
    );
}

#[test]
fn a_holder_a_restart_without_persistence_forgot_may_hold_until_its_next_renewal() {
    // Redis without persistence: c0 holds token 10; the server is killed
    // at 2 s and back, empty, at 3 s; c1 is granted token 11 at 3.1 s;
    // c0 writes once at 3.2 s (before c1 writes at 3.3 s) and hears
    // lost() at its next renewal, 3.5 s.
    let events = vec![
        grant(S, 0, 10),
        grant(3 * S + S / 10, 1, 11),
        ev(3 * S + S / 2, 0, What::Lost { token: 10 }),
    ];
    let writes = [
        write(3 * S + S / 5, 0, 10, true),
        write(3 * S + 3 * S / 10, 1, 11, true),
    ];
    let restart = vec![Fault {
        kind: FaultKind::KillServer,
        target: "the server".into(),
        holder: None,
        start: 2 * S,
        end: Some(3 * S),
    }];
    let volatile = Bounds {
        reset_notice: 2 * S,
        reset_kinds: crate::Backend::RedisVolatile.forgets(),
        reset_at_end: true,
        ..bounds(6 * S)
    };
    let report = check(&events, &writes, &restart, volatile);
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    assert_eq!(report.reset_holders_late.0, 1);
    assert!((report.reset_holders_late.1 - 0.5).abs() < 1e-9, "{report}");
    // With the data kept (an append-only file), a restart frees nothing:
    // the same history breaks lost() first and the register.
    let kept = Bounds {
        reset_kinds: crate::Backend::Redis.forgets(),
        ..volatile
    };
    let report = check(&events, &writes, &restart, kept);
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.starts_with("lost() after the next grant")),
        "{report}"
    );
    assert!(
        report.violations.iter().any(|v| v.starts_with("unfenced overlap")),
        "{report}"
    );
    // Heard too late after the server's return (counted from it, not
    // from the kill).
    let late = vec![
        grant(S, 0, 10),
        grant(3 * S + S / 10, 1, 11),
        ev(5 * S + S / 10, 0, What::Lost { token: 10 }),
    ];
    let report = check(&late, &writes, &restart, volatile);
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.starts_with("lost() after the next grant")),
        "{report}"
    );
    // A stale write accepted after the newer holder wrote is not excused.
    let after_newer = [
        write(3 * S + 3 * S / 10, 1, 11, true),
        write(3 * S + 2 * S / 5, 0, 10, true),
    ];
    let report = check(&events, &after_newer, &restart, volatile);
    assert!(
        report.violations.iter().any(|v| v.starts_with("unfenced overlap")),
        "{report}"
    );
    // A pause of the server forgets nothing: no excuse.
    let pause = vec![Fault {
        kind: FaultKind::PauseServer,
        ..restart[0].clone()
    }];
    let report = check(&events, &writes, &pause, volatile);
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.starts_with("lost() after the next grant")),
        "{report}"
    );
}

#[test]
fn a_session_that_outlives_a_restart_that_forgot_it_is_caught() {
    let volatile = Bounds {
        forgets_sessions: crate::Backend::RedisVolatile.forgets_sessions(),
        ..bounds(30 * S)
    };
    let restart = vec![Fault {
        kind: FaultKind::KillServer,
        target: "the server".into(),
        holder: None,
        start: 10 * S,
        end: Some(11 * S),
    }];
    let session = |t: u64, slot: usize, id: &str| ev(t, slot, What::Session { id: id.into() });
    let over = |t: u64, slot: usize, id: &str| ev(t, slot, What::SessionOver { id: id.into() });
    let events = vec![
        session(S, 0, "a"),
        session(S, 1, "b"),
        session(2 * S, 2, "c"),
        over(3 * S, 2, "c"),
        session(3 * S, 2, "d"),
        grant(4 * S, 0, 10),
        over(11 * S + S / 2, 0, "a"),
        session(11 * S + S / 2, 0, "e"),
        grant(12 * S, 0, 20),
        // c2's session "d" is never given up; c1 was killed (by a
        // later fault) before it gave its session up: not judged.
        ev(12 * S, 1, What::Killed),
    ];
    let report = check(&events, &[], &restart, volatile);
    assert_eq!(report.forgotten_sessions, (2, 1), "{report}");
    let lived: Vec<&String> = report
        .violations
        .iter()
        .filter(|v| v.starts_with("a forgotten session lived on"))
        .collect();
    assert_eq!(lived.len(), 1, "{report}");
    assert!(lived[0].contains("c2.0's session d"), "{report}");
    // A restart with the data forgets nothing: not judged.
    let kept = Bounds {
        forgets_sessions: crate::Backend::Redis.forgets_sessions(),
        ..volatile
    };
    assert_eq!(check(&events, &[], &restart, kept).forgotten_sessions, (0, 0));
}

#[test]
fn a_session_lost_to_a_short_outage_of_the_server_is_caught() {
    let ride = Bounds {
        ride_out: S,
        ride_out_kinds: crate::Backend::Redis.rides_out(),
        ..bounds(6 * S)
    };
    let outage = |start: u64, length: u64| Fault {
        kind: FaultKind::KillServer,
        target: "the server".into(),
        holder: None,
        start,
        end: Some(start + length),
    };
    let events = vec![
        grant(S, 0, 10),
        ev(3 * S + S / 2, 0, What::Lost { token: 10 }),
        ev(
            3 * S + S / 2,
            1,
            What::Error {
                message: "lock: session 1f lost".into(),
            },
        ),
        grant(4 * S, 1, 11),
    ];
    // Back within 0.8 s: both losses are violations, in one line.
    let short = check(&events, &[], &[outage(2 * S, 8 * S / 10)], ride);
    let lost: Vec<&String> = short
        .violations
        .iter()
        .filter(|v| v.starts_with("a session lost to a short outage"))
        .collect();
    assert_eq!(lost.len(), 1, "{short}");
    assert!(
        lost[0].contains("c0.0 heard lost()") && lost[0].contains("c1.0 at"),
        "{short}"
    );
    assert_eq!(short.ridden_out, (1, 0));
    // Longer than the bound: losses are legitimate.
    let long = check(&events, &[], &[outage(2 * S, 3 * S / 2)], ride);
    assert!(long.violations.is_empty(), "{long}");
    assert_eq!(long.ridden_out, (0, 0));
    // Losses after the next fault began are that fault's.
    let next = Fault {
        kind: FaultKind::BlackholeHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: 3 * S,
        end: Some(8 * S),
    };
    let report = check(&events, &[], &[outage(2 * S, 8 * S / 10), next], ride);
    assert!(
        !report.violations.iter().any(|v| v.starts_with("a session lost")),
        "{report}"
    );
    assert_eq!(report.ridden_out, (1, 1));
    // A backend with nothing to ride out judges nothing.
    let report = check(&events, &[], &[outage(2 * S, 8 * S / 10)], bounds(20 * S));
    assert_eq!(report.ridden_out, (0, 0));
}

#[test]
fn writes_are_judged_in_the_order_of_their_times() {
    // A backend-fenced write of the older holder, reported after the newer
    // holder's: no token went back.
    let events = vec![
        grant(S, 0, 10),
        ev(
            2 * S,
            0,
            What::Release {
                token: 10,
                dropped: false,
            },
        ),
        grant(2 * S + 1, 1, 11),
    ];
    let writes = vec![held_write(2 * S + 5, 1, 11, true), held_write(S + 5, 0, 10, true)];
    let report = check(&events, &writes, &[], bounds(3 * S));
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    // An unsure write counts as landed: a lower token after a higher one.
    let mut late = held_write(2 * S + 9, 0, 10, false);
    late.unsure = true;
    let report = check(&events, &[held_write(2 * S + 5, 1, 11, true), late], &[], bounds(3 * S));
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.starts_with("register accepted token 10")),
        "{report}"
    );
}

#[test]
fn a_fault_whose_recovery_window_outlasts_the_run_is_not_judged() {
    let events = vec![
        grant(S, 0, 10),
        ev(
            2 * S,
            0,
            What::Release {
                token: 10,
                dropped: false,
            },
        ),
    ];
    let fault = |start| Fault {
        kind: FaultKind::KillMember,
        target: "n1".into(),
        holder: None,
        start,
        end: Some(start + 1),
    };
    // Three seconds before the end, with an 8 s bound: not judged.
    let late = check(&events, &[], &[fault(3 * S)], bounds(6 * S));
    assert!(!late.violations.iter().any(|v| v.starts_with("no grant")), "{late}");
    // Long enough before the end: judged.
    let early = check(&events, &[], &[fault(3 * S)], bounds(20 * S));
    assert!(early.violations.iter().any(|v| v.starts_with("no grant")), "{early}");
}

#[test]
fn slow_recovery_stalls_and_backward_tokens_are_caught() {
    let events = vec![
        grant(S, 0, 10),
        ev(S + 1, 0, What::Killed),
        grant(11 * S, 1, 9),
        ev(
            12 * S,
            1,
            What::Release {
                token: 9,
                dropped: false,
            },
        ),
    ];
    let faults = vec![Fault {
        kind: FaultKind::KillHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: S,
        end: Some(S + 1),
    }];
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
fn a_grant_sooner_than_the_lock_delay_after_an_involuntary_loss_is_caught() {
    let delay = 3 * S / 2;
    let bounds = Bounds {
        lock_delay: delay,
        ..bounds(20 * S)
    };
    let kill = Fault {
        kind: FaultKind::KillHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: 2 * S,
        end: None,
    };
    let run = |granted: u64, extra: Vec<Event>| {
        let mut events = vec![
            grant(S, 0, 10),
            ev(S + 1, 1, What::Waiting),
            ev(2 * S, 0, What::Killed),
            grant(granted, 1, 11),
        ];
        events.extend(extra);
        check(&events, &[], std::slice::from_ref(&kill), bounds)
    };
    // Half a second after the kill: within the delay.
    let early = run(2 * S + S / 2, Vec::new());
    assert!(
        early.violations.iter().any(|v| v.starts_with("lock-delay broken")),
        "{early}"
    );
    assert_eq!(early.lock_delay_checks, 1);
    // Past the delay: fine.
    let late = run(4 * S, Vec::new());
    assert!(late.violations.is_empty(), "{late}");
    assert_eq!(late.lock_delay_checks, 1);
    // A waiter ahead of it gave up in between: handed on at once, not
    // judged.
    let gave_up = run(
        2 * S + S / 2,
        vec![ev(S, 2, What::Waiting), ev(2 * S + S / 4, 2, What::Timeout)],
    );
    assert!(gave_up.violations.is_empty(), "{gave_up}");
    assert_eq!(gave_up.lock_delay_checks, 0);
    // One behind it gave up: that does not hand on to it; judged.
    let behind = run(
        2 * S + S / 2,
        vec![ev(S + 2, 2, What::Waiting), ev(2 * S + S / 4, 2, What::Timeout)],
    );
    assert!(
        behind.violations.iter().any(|v| v.starts_with("lock-delay broken")),
        "{behind}"
    );
    // A waiter that came after the fault: not judged either.
    let mut events = vec![
        grant(S, 0, 10),
        ev(2 * S, 0, What::Killed),
        ev(2 * S + 1, 1, What::Waiting),
        grant(2 * S + S / 2, 1, 11),
    ];
    events.sort_by_key(|e| e.t);
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
        ev(S + 1, 1, What::Waiting),
        ev(
            2 * S + S / 4,
            0,
            What::Release {
                token: 10,
                dropped: false,
            },
        ),
        grant(2 * S + S / 2, 1, 11),
    ];
    let kept = check(&events, &[], &[pause], bounds);
    assert!(kept.violations.is_empty(), "{kept}");
    assert_eq!(kept.lock_delay_checks, 0);
}

use LockMode::{Cr, Cw, Ex, Nl, Pr, Pw};

#[test]
fn two_running_holders_in_incompatible_modes_are_caught_and_compatible_ones_pass() {
    // c0 holds in `held` from 1 s to 4 s; c1 is granted `asked` at 2 s,
    // beside it, and releases at 3 s. Neither was faulted.
    for held in LockMode::ALL {
        for asked in LockMode::ALL {
            let events = vec![
                granted_in(S, 0, 10, held),
                granted_in(2 * S, 1, 11, asked),
                release(3 * S, 1, 11),
                release(4 * S, 0, 10),
            ];
            let report = check(&events, &[], &[], bounds(5 * S));
            if held.compatible(asked) {
                assert_eq!(
                    report.violations,
                    Vec::<String>::new(),
                    "{held} beside {asked}: {report}"
                );
                assert_eq!((report.overlaps_compatible, report.overlaps_raw), (1, 0));
            } else {
                assert_eq!(report.violations.len(), 1, "{held} beside {asked}: {report}");
                assert!(
                    report.violations[0].starts_with(&format!(
                        "lost() after the next grant: c0.0 (token 10 in {held}, granted 1.000s, not frozen) still held when c1.0 (token 11 in {asked}) was granted"
                    )),
                    "{report}"
                );
            }
        }
    }
    // The rule the brief states, row by row.
    let beside = |a: LockMode, b: LockMode| {
        let events = vec![
            granted_in(S, 0, 10, a),
            granted_in(2 * S, 1, 11, b),
            release(3 * S, 1, 11),
            release(4 * S, 0, 10),
        ];
        check(&events, &[], &[], bounds(5 * S)).violations.is_empty()
    };
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
        ev(S + S / 2 + 1, 1, What::Converting { from: Pr, to: Ex }),
        converted(2 * S, 1, Pr, Ex, 12),
        release(3 * S, 0, 10),
        release(4 * S, 1, 12),
    ];
    let report = check(&events, &[], &[], bounds(5 * S));
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(
        report.violations[0].starts_with(
            "lost() after the next grant: c0.0 (token 10 in PR, granted 1.000s, not frozen) still held when c1.0 (token 12 in EX) was converted at 2.000s"
        ),
        "{report}"
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
    let report = check(&events, &[], &[], bounds(5 * S));
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    assert_eq!(report.overlaps_compatible, 1, "PR beside PR before the conversion");
}

#[test]
fn a_down_conversion_shares_from_when_it_was_asked_for_and_not_before() {
    // c0 holds EX from 1 s and converts down to CR at 2 s; c1 is granted
    // PR (compatible with CR, not with EX).
    let run = |granted: u64| {
        let events = vec![
            granted_in(S, 0, 10, Ex),
            converted(2 * S, 0, Ex, Cr, 10),
            granted_in(granted, 1, 11, Pr),
            release(3 * S, 1, 11),
            release(4 * S, 0, 10),
        ];
        check(&events, &[], &[], bounds(5 * S))
    };
    let after = run(2 * S + S / 10);
    assert_eq!(after.violations, Vec::<String>::new(), "{after}");
    assert_eq!(after.conversions, (0, 1));
    let before = run(2 * S - S / 10);
    assert_eq!(before.violations.len(), 1, "{before}");
    assert!(
        before.violations[0].starts_with("lost() after the next grant: c0.0 (token 10 in EX"),
        "{before}"
    );
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
        ev(5 * S + S / 5, 0, What::Lost { token: 10 }),
        release(6 * S, 1, 11),
    ];
    let pause = vec![Fault {
        kind: FaultKind::PauseHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: S + S / 10,
        end: Some(5 * S),
    }];
    let refused = [
        held_write(4 * S + S / 2, 1, 11, true),
        held_write(5 * S + S / 10, 0, 10, false),
    ];
    let report = check(&events, &refused, &pause, bounds(10 * S));
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    assert_eq!((report.overlaps_raw, report.overlaps_fenced), (1, 1));
    // The stale write landed: fencing failed.
    let landed = [
        held_write(4 * S + S / 2, 1, 11, true),
        held_write(5 * S + S / 10, 0, 10, true),
    ];
    let report = check(&events, &landed, &pause, bounds(10 * S));
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
        ev(2 * S + 6 * S / 10, 0, What::Lost { token: 10 }),
    ];
    let cut = vec![Fault {
        kind: FaultKind::CutHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: 2 * S,
        end: Some(3 * S),
    }];
    let refused = [held_write(2 * S + S / 5, 0, 10, false)];
    let lenient = Bounds {
        reset_notice: S,
        reset_kinds: crate::Backend::Postgres.forgets(),
        ..bounds(4 * S)
    };
    let report = check(&events, &refused, &cut, lenient);
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    assert_eq!(report.reset_holders_late.0, 1);
    let tight = Bounds {
        reset_notice: S / 2,
        ..lenient
    };
    let report = check(&events, &refused, &cut, tight);
    assert_eq!(starts_with(&report, "lost() after the next grant"), 1, "{report}");
    // Where a reset frees nothing (etcd), no allowance.
    let report = check(&events, &refused, &cut, bounds(4 * S));
    assert_eq!(starts_with(&report, "lost() after the next grant"), 1, "{report}");
}

#[test]
fn mode_tokens_must_rise_over_incompatible_holders_only() {
    // Two CR grants reported out of their tokens' order (compatible: no
    // order to keep); then EX with a token below theirs.
    let events = vec![
        granted_in(S, 0, 20, Cr),
        granted_in(S + S / 10, 1, 19, Cr),
        release(2 * S, 0, 20),
        release(2 * S, 1, 19),
        granted_in(3 * S, 2, 18, Ex),
        release(4 * S, 2, 18),
    ];
    let report = check(&events, &[], &[], bounds(5 * S));
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(
        report.violations[0]
            .starts_with("fencing token did not increase: c2.0 was granted token 18 in EX at 3.000s after c0.0 was granted token 20 in CR"),
        "{report}"
    );
    let fine = vec![
        granted_in(S, 0, 20, Cr),
        granted_in(S + S / 10, 1, 19, Cr),
        release(2 * S, 0, 20),
        release(2 * S, 1, 19),
        granted_in(3 * S, 2, 21, Ex),
        release(4 * S, 2, 21),
    ];
    let report = check(&fine, &[], &[], bounds(5 * S));
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    // An up-conversion to a writing mode must take a fresh token; one to
    // PR keeps its old token, below a writer that held meanwhile.
    let stale = vec![
        granted_in(S, 0, 10, Pr),
        converted(2 * S, 0, Pr, Pw, 10),
        release(3 * S, 0, 10),
    ];
    let report = check(&stale, &[], &[], bounds(5 * S));
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
    let report = check(&kept, &[], &[], bounds(5 * S));
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
}

#[test]
fn the_register_order_applies_to_pw_and_ex_writes() {
    // EX (11) then PW (12), cleanly handed over; a write of token 11
    // landing after token 12's is a register going back.
    let events = vec![
        granted_in(S, 0, 11, Ex),
        release(2 * S, 0, 11),
        granted_in(2 * S + 1, 1, 12, Pw),
        release(3 * S, 1, 12),
    ];
    let in_order = [held_write(S + 5, 0, 11, true), held_write(2 * S + 5, 1, 12, true)];
    let report = check(&events, &in_order, &[], bounds(4 * S));
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
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
fn recovery_counts_no_nl_grant() {
    // A holder killed at 1 s; only NL grants follow (they wait for
    // nobody): no recovery. A CR grant within the bound is one.
    let kill = vec![Fault {
        kind: FaultKind::KillHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: S,
        end: Some(S + 1),
    }];
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

#[test]
fn a_conversion_from_a_mode_not_held_is_caught() {
    let events = vec![granted_in(S, 0, 10, Ex), converted(2 * S, 0, Pr, Pw, 11)];
    let report = check(&events, &[], &[], bounds(3 * S));
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
        ev(4 * S, 0, What::Lost { token: 10 }),
        release(4 * S + S / 2, 1, 11),
        granted_in(5 * S, 2, 12, Ex),
        release(6 * S, 2, 12),
    ];
    let blackhole = vec![Fault {
        kind: FaultKind::BlackholeHolder,
        target: "c0.0".into(),
        holder: Some(tag(0)),
        start: 2 * S,
        end: Some(5 * S),
    }];
    let report = check(&events, &[], &blackhole, bounds(10 * S));
    assert_eq!(report.violations, Vec::<String>::new(), "{report}");
    assert_eq!(report.blackholed_holders, (1, 1));
}

#[test]
fn an_up_conversion_the_server_made_before_the_next_grant_ends_the_old_mode_there() {
    // c0 holds PR (token 10) and converts up to CW; the server converts it
    // with token 12 and grants c1 CW with token 13 before c0 hears of its
    // conversion: CW beside CW, in the server's order.
    let run = |c1_token: u64| {
        let events = vec![
            granted_in(S, 0, 10, Pr),
            ev(2 * S, 0, What::Converting { from: Pr, to: Cw }),
            granted_in(2 * S + S / 10, 1, c1_token, Cw),
            converted(2 * S + S / 5, 0, Pr, Cw, 12),
            release(3 * S, 1, c1_token),
            release(4 * S, 0, 12),
        ];
        check(&events, &[], &[], bounds(5 * S))
    };
    let ordered = run(13);
    assert_eq!(ordered.violations, Vec::<String>::new(), "{ordered}");
    // Granted CW before the conversion (token 11 < 12): beside PR.
    let beside = run(11);
    assert_eq!(beside.violations.len(), 1, "{beside}");
    assert!(
        beside.violations[0].starts_with("lost() after the next grant: c0.0 (token 10 in PR"),
        "{beside}"
    );
}
