//! Sessions through the server's outages: forgotten ones given up, short
//! outages ridden out.

use super::*;

#[test]
fn a_session_that_outlives_a_restart_that_forgot_it_is_caught() {
    let volatile = Bounds {
        forgets_sessions: crate::Backend::RedisVolatile.forgets_sessions(),
        ..bounds(30 * S)
    };
    let restart = vec![server_fault(FaultKind::KillServer, 10 * S, 11 * S)];
    let events = vec![
        session(S, 0, "a"),
        session(S, 1, "b"),
        session(2 * S, 2, "c"),
        session_over(3 * S, 2, "c"),
        session(3 * S, 2, "d"),
        grant(4 * S, 0, 10),
        session_over(11 * S + S / 2, 0, "a"),
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
    let outage = |start: u64, length: u64| server_fault(FaultKind::KillServer, start, start + length);
    let events = vec![
        grant(S, 0, 10),
        lost(3 * S + S / 2, 0, 10),
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
    let next = holder_fault(FaultKind::BlackholeHolder, 0, 3 * S, Some(8 * S));
    let report = check(&events, &[], &[outage(2 * S, 8 * S / 10), next], ride);
    assert!(!any_starts_with(&report, "a session lost"), "{report}");
    assert_eq!(report.ridden_out, (1, 1));
    // A backend with nothing to ride out judges nothing.
    let report = check(&events, &[], &[outage(2 * S, 8 * S / 10)], bounds(20 * S));
    assert_eq!(report.ridden_out, (0, 0));
}
