//! The demo the README shows runs and reports FIFO order, increasing tokens
//! and a rejected stale writer, on the memory backend and on a throwaway
//! Redis (`--redis`), PostgreSQL (`--postgres-local`) and MariaDB
//! (`--mariadb-local`).

use std::process::Command;

fn demo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lockline-demo"))
        .args(args)
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn assert_report(stdout: &str, backend: &str) {
    assert!(stdout.contains(&format!("({backend} backend)")), "{stdout}");
    assert!(
        stdout.contains("FIFO round-robin order yes, fencing tokens strictly increasing yes"),
        "{stdout}"
    );
    assert!(stdout.contains("rejected by the fenced resource: yes"), "{stdout}");
}

#[test]
fn on_the_memory_backend() {
    assert_report(&demo(&["--workers", "3", "--rounds", "2"]), "memory");
}

#[test]
fn on_a_throwaway_redis() {
    assert_report(&demo(&["--redis", "--workers", "3", "--rounds", "2"]), "redis");
}

#[test]
fn on_a_throwaway_postgres() {
    let stdout = demo(&["--postgres-local", "--workers", "3", "--rounds", "2"]);
    assert!(stdout.contains("started a throwaway PostgreSQL"), "{stdout}");
    assert_report(&stdout, "postgres");
}

#[test]
fn on_a_throwaway_mariadb() {
    let stdout = demo(&["--mariadb-local", "--workers", "3", "--rounds", "2"]);
    assert!(stdout.contains("started a throwaway MariaDB"), "{stdout}");
    assert_report(&stdout, "mysql");
}

/// `--postgres URL`: a database someone else runs (here one the test starts).
#[test]
fn on_a_postgres_given_by_url() {
    let options = lockline_testkit::PgOptions {
        durable: false,
        ..Default::default()
    };
    let server = lockline_testkit::PgServer::start_with(&options).expect("start PostgreSQL");
    let stdout = demo(&["--postgres", &server.url(), "--workers", "2", "--rounds", "2"]);
    assert!(!stdout.contains("throwaway"), "{stdout}");
    assert_report(&stdout, "postgres");
}

/// A URL of the other engine, or none, is refused without being echoed.
#[test]
fn refuses_a_database_url_of_the_other_engine() {
    for args in [
        ["--postgres", "mysql://app:hunter2-Qv93@db/app"],
        ["--mysql", "postgres://app:hunter2-Qv93@db/app"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lockline-demo"))
            .args(args)
            .output()
            .expect("run the demo");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("takes a") && !stderr.contains("hunter2"), "{stderr}");
    }
}
