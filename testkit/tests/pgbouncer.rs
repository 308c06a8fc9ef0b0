//! PgBouncer in front of PostgreSQL: it runs as the `postgres` user when the
//! tests run as root, lets the superuser through with its password, pools as
//! told (a transaction pool of one shares one backend among its clients, and
//! an advisory lock taken through one client is held for all), refuses an
//! unknown startup parameter unless told to ignore it, and dies when dropped.

use std::path::Path;
use std::process::{Command, Output};

use lockline_testkit::{PgBouncer, PgBouncerOptions, PgOptions, PgServer, PoolMode};

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The real uid of a process.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    let line = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid line");
    line.split_whitespace()
        .nth(1)
        .expect("real uid")
        .parse()
        .expect("a number")
}

fn server() -> PgServer {
    PgServer::start_with(&PgOptions {
        durable: false,
        ..PgOptions::default()
    })
    .expect("start postgres")
}

/// `psql` through the pooler with its URL, running `sql`, with `pgoptions`
/// (libpq's `PGOPTIONS`, sent as the `options` startup parameter) if given.
fn through(server: &PgServer, bouncer: &PgBouncer, sql: &str, pgoptions: Option<&str>) -> Output {
    let mut command: Command = server.psql_command();
    command
        .args(["-X", "-A", "-t", "-q", "-w", "-v", "ON_ERROR_STOP=1"])
        .args(["-d", &bouncer.url(), "-c", sql])
        .env("PGCONNECT_TIMEOUT", "10");
    if let Some(pgoptions) = pgoptions {
        command.env("PGOPTIONS", pgoptions);
    }
    command.output().expect("run psql")
}

fn answer(server: &PgServer, bouncer: &PgBouncer, sql: &str) -> String {
    let output = through(server, bouncer, sql, None);
    assert!(output.status.success(), "{sql}: {}", text(&output));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn a_transaction_pool_of_one_shares_one_backend_and_its_advisory_locks() {
    let mut server = server();
    let mut bouncer = PgBouncer::start(
        &server,
        &PgBouncerOptions {
            pool_mode: PoolMode::Transaction,
            default_pool_size: 1,
            ignore_startup_parameters: Vec::new(),
        },
    )
    .expect("start pgbouncer");
    let pid = bouncer.member().pid().expect("running");
    let me = uid_of(std::process::id());
    let postgres_uid = uid_of(server.member().pid().expect("running"));
    assert_eq!(uid_of(pid), if me == 0 { postgres_uid } else { me });
    assert!(bouncer
        .url()
        .ends_with(&format!("@127.0.0.1:{}/postgres", bouncer.port())));
    assert_eq!(bouncer.server_port(), server.port());

    // Two clients, one after the other, on one backend: a session-level
    // advisory lock taken through the first is the second's too.
    let first = answer(
        &server,
        &bouncer,
        "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(42)) l;",
    );
    let second = answer(
        &server,
        &bouncer,
        "SELECT pg_backend_pid() || ' ' || pg_try_advisory_lock(42);",
    );
    assert_eq!(second, format!("{first} true"), "the clients did not share one backend");
    assert_eq!(server.advisory_locks().expect("count").held, 1);

    // PgBouncer's default refuses a startup parameter it does not track.
    let refused = through(&server, &bouncer, "SELECT 1;", Some("-c lock_timeout=1s"));
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("unsupported startup parameter: options"),
        "{}",
        text(&refused)
    );

    let dir = bouncer.dir().to_owned();
    drop(bouncer);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pgbouncer outlived its drop"
    );
    assert!(!dir.exists(), "its directory outlived its drop");
}

#[test]
fn a_session_pool_ignoring_options_gives_each_client_a_clean_backend() {
    let server = server();
    let bouncer = PgBouncer::start(
        &server,
        &PgBouncerOptions {
            pool_mode: PoolMode::Session,
            default_pool_size: 1,
            ignore_startup_parameters: vec!["options".to_owned()],
        },
    )
    .expect("start pgbouncer");
    // Accepted, and dropped: the setting does not reach the server.
    let output = through(&server, &bouncer, "SHOW lock_timeout;", Some("-c lock_timeout=1s"));
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "0");
    // A session-level lock ends with its client: the backend is reset
    // before the next one gets it.
    answer(&server, &bouncer, "SELECT pg_advisory_lock(42);");
    assert_eq!(answer(&server, &bouncer, "SELECT pg_try_advisory_lock(42);"), "t");
}
