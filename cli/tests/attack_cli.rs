//! Odd command lines: each is one line on standard error, exit status 1, no
//! panic, and never shows a password.

use std::process::{Command, Output};

const SECRET: &str = "hunter2-Qv93";

fn lockline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockline"))
        .args(args)
        .env_remove("ETCDCTL_ENDPOINTS")
        .env_remove("ETCDCTL_USER")
        .env_remove("ETCDCTL_PASSWORD")
        .env_remove("LOCKLINE_ZK_AUTH")
        .output()
        .expect("run lockline")
}

fn assert_refused_without_secret(args: &[&str]) -> String {
    let output = lockline(args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(
        !stderr.contains(SECRET) && !stdout.contains(SECRET),
        "{args:?} leaked the password: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

/// etcdctl users write `--user=root:PASSWORD` and `--password=PASSWORD`
/// (pflag's form): an option lockline does not know this way must not be
/// echoed whole.
#[test]
fn options_written_with_equals_never_show_the_password() {
    let user = format!("--user=root:{SECRET}");
    let password = format!("--password={SECRET}");
    let zk_auth = format!("--zk-auth=digest:bob:{SECRET}");
    for args in [
        vec!["lock", "--etcd", "http://127.0.0.1:1", user.as_str(), "x"],
        vec![
            "lock",
            "--etcd",
            "http://127.0.0.1:1",
            "--user",
            "root",
            password.as_str(),
            "x",
        ],
        vec!["lock", "--zookeeper", "127.0.0.1:1", zk_auth.as_str(), "x"],
    ] {
        assert_refused_without_secret(&args);
    }
}
