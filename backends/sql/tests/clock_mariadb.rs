//! No time zone of the database decides anything on MariaDB/MySQL: every
//! connection lockline opens works in UTC, and its reading of the server's
//! clock is the epoch's count whatever the session's zone.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockline::Client;
use lockline_sql::Sql;

mod attack_kit;
mod support;

use attack_kit::{options, step};

fn now_us() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970");
    i64::try_from(since.as_micros()).expect("microseconds")
}

/// The server's default zone, and the zone the user's URL asks the driver
/// to set (`?timezone=`), is one with daylight saving time whose clocks
/// went back an hour a second ago (its local times happen twice for the
/// next hour). The fencing tokens, which a server's first session moves
/// past the server's clock, and the server start that session records,
/// are read from the clock as it is, not an hour early; and every
/// connection lockline opened (its guard, control and wait connections)
/// set its session to UTC itself, after the driver's settings.
///
/// Was a defect, now fixed: the clock was read as `UNIX_TIMESTAMP(SYSDATE(6))`, a
/// local time turned back into the epoch's count, which in the repeated
/// hour gives the first of the two instants: an hour early. The driver
/// sets UTC by default, but a `timezone` in the URL replaced it; the first
/// token then lay an hour behind the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dst_change_of_the_server_zone_moves_no_clock_reading() {
    let (server, url) = support::mariadb();
    server
        .add_fallback_time_zone("Lockline/Fallback")
        .expect("add the time zone");
    server
        .sql("SET GLOBAL time_zone = 'Lockline/Fallback'; SET GLOBAL log_output = 'TABLE'; SET GLOBAL general_log = 1")
        .expect("set the server's zone and log");
    // The premise: in a new session, the local clock turned back into the
    // epoch's count is an hour early.
    let early = server
        .sql(
            "SELECT TIMESTAMPDIFF(SECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP()) \
             - CAST(UNIX_TIMESTAMP(SYSDATE()) AS SIGNED)",
        )
        .expect("read the clock");
    let early: i64 = early.trim().parse().expect("seconds");
    assert!(
        (3590..=3610).contains(&early),
        "a session in the zone reads its local time back {early} s early, not an hour"
    );

    let client = Client::new(Sql::new(format!("{url}?timezone=Lockline%2FFallback")));
    let before = now_us();
    let (a, b) = (
        client.session_with(options(10_000)).await.expect("session"),
        client.session_with(options(10_000)).await.expect("session"),
    );
    let held = a.mutex("clock").expect("mutex").lock().await.expect("lock");
    let after = now_us();
    // The first session after the server started moved the id counter past
    // the server's clock.
    let first = held.token();
    let token = i64::try_from(first.get()).expect("token");
    let slack = Duration::from_secs(60).as_micros() as i64;
    assert!(
        token > before - slack && token < after + slack,
        "the first token {token} is {} s from the clock ({after} µs)",
        (token - after) / 1_000_000
    );
    // And recorded when the server started: its clock less its uptime.
    let started = server
        .sql(
            "SELECT m.started_us, CAST(s.VARIABLE_VALUE AS SIGNED) FROM lockline.lockline_meta m \
             JOIN information_schema.GLOBAL_STATUS s ON s.VARIABLE_NAME = 'UPTIME'",
        )
        .expect("read the server start");
    let fields: Vec<i64> = started
        .split_whitespace()
        .map(|f| f.parse().expect("a number"))
        .collect();
    let (started_us, uptime_s) = (fields[0], fields[1]);
    let expected = now_us() - uptime_s * 1_000_000;
    assert!(
        (started_us - expected).abs() < slack,
        "the server start was recorded {} s from the clock less the uptime",
        (started_us - expected) / 1_000_000
    );

    // A waiter opens a wait connection too, and blocks on the server there.
    let waiter = {
        let mutex = b.mutex("clock").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    step("the waiter blocks on the server", async {
        while server.user_locks().expect("count locks").waiting == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    held.release().await.expect("release");
    let next = step("the waiter", waiter).await.expect("task").expect("lock");
    assert!(next.token() > first);
    next.release().await.expect("release");

    // lockline's connections are the TCP ones (the test's own client uses
    // the socket): each that ran a statement of lockline's had set its
    // session to UTC (one still being opened may have run nothing yet).
    let log = |sql: &str| -> Vec<String> {
        let out = server.sql(sql).expect("read the general log");
        out.lines()
            .map(str::to_owned)
            .filter(|l| !l.trim().is_empty())
            .collect()
    };
    let tcp = "thread_id IN (SELECT thread_id FROM mysql.general_log \
               WHERE command_type = 'Connect' AND argument LIKE '%TCP/IP%')";
    let used = log(&format!(
        "SELECT DISTINCT thread_id FROM mysql.general_log WHERE {tcp} \
         AND command_type IN ('Query', 'Execute', 'Prepare') AND argument NOT LIKE 'SET %' ORDER BY thread_id"
    ));
    let in_utc = log(&format!(
        "SELECT DISTINCT thread_id FROM mysql.general_log WHERE {tcp} \
         AND argument LIKE 'SET SESSION %time_zone = ''+00:00''%' ORDER BY thread_id"
    ));
    assert!(
        used.len() >= 5,
        "two sessions use a guard and a control connection each, and the waiter a wait connection: {used:?}"
    );
    let unset: Vec<&String> = used.iter().filter(|t| !in_utc.contains(t)).collect();
    assert!(
        unset.is_empty(),
        "connections that did not set their session to UTC: {unset:?}"
    );
}
