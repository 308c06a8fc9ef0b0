//! The demo the README shows runs and reports FIFO order, increasing tokens
//! and a rejected stale writer, on the memory backend and on a throwaway
//! Redis (`--redis`).

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
