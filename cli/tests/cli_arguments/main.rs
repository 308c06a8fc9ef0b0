//! Odd command lines: each is one line on standard error, exit status 123, no
//! panic, and never shows a password; and what the command prints when asked
//! for help, its version or completions.
//!
//! One test binary, a module per family: `secrets` (never shown),
//! `refusals` (one-line usage errors), `environment` (variables that stand
//! in for flags), `help` (help, version, completions, and the docs).

use std::process::{Command, Output};

const SECRET: &str = "hunter2-Qv93";

/// `--user`, `--password` and `--zk-auth` written with '=', each carrying
/// [`SECRET`] as its password.
fn secret_options() -> [String; 3] {
    [
        format!("--user=root:{SECRET}"),
        format!("--password={SECRET}"),
        format!("--zk-auth=digest:bob:{SECRET}"),
    ]
}

fn lockline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockline"))
        .args(args)
        .env_remove("ETCDCTL_ENDPOINTS")
        .env_remove("ZOOKEEPER_CONNECT")
        .env_remove("ETCDCTL_USER")
        .env_remove("ETCDCTL_PASSWORD")
        .env_remove("LOCKLINE_ZK_AUTH")
        .env_remove("DATABASE_URL")
        .output()
        .expect("run lockline")
}

/// Refused with `status` (123 for bad arguments, 122 when the arguments are
/// fine and nothing answers at the endpoint).
fn assert_refused_without_secret(args: &[&str], status: i32) -> String {
    let output = lockline(args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(status), "{args:?}: {stderr}");
    assert!(
        !stderr.contains(SECRET) && !stdout.contains(SECRET),
        "{args:?} leaked the password: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

mod environment;

mod help;

mod refusals;

mod secrets;
