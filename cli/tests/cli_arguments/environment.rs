//! The variables that stand in for flags: the TLS and credential ones fill
//! in for their backend only, and both endpoint variables without a flag
//! are refused.

use super::*;

/// The TLS and credential variables fill in what the flags leave out, for
/// their own backend only: the etcdctl ones for etcd, `LOCKLINE_ZK_AUTH` for
/// ZooKeeper; an empty one is unset. Seen from the outcome: a missing
/// certificate file or a half-set credential is refused (123) naming what
/// was used, a variable that does not apply leaves a server that nothing
/// answers at (122).
#[test]
fn the_tls_and_credential_variables_fill_in_for_their_backend_only() {
    let run = |args: &[&str], vars: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lockline"));
        for var in [
            "ETCDCTL_ENDPOINTS",
            "ZOOKEEPER_CONNECT",
            "DATABASE_URL",
            "ETCDCTL_CACERT",
            "ETCDCTL_CERT",
            "ETCDCTL_KEY",
            "ETCDCTL_USER",
            "ETCDCTL_PASSWORD",
            "LOCKLINE_ZK_AUTH",
        ] {
            command.env_remove(var);
        }
        let output = command
            .args(args)
            .envs(vars.iter().copied())
            .output()
            .expect("run lockline");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(!stderr.contains(SECRET), "{args:?} {vars:?}: {stderr}");
        (output.status.code(), stderr)
    };
    let etcd = ["lock", "--etcd", "https://127.0.0.1:1", "x"];
    let zk = ["lock", "--zookeeper", "127.0.0.1:1", "x"];
    let pg = ["lock", "--postgres", "postgres://app@127.0.0.1:1/app", "x"];
    let ca = ("ETCDCTL_CACERT", "/nonexistent/env-ca.pem");
    let (status, stderr) = run(&etcd, &[ca]);
    assert_eq!(status, Some(123), "{stderr}");
    assert!(stderr.contains("env-ca.pem"), "{stderr}");
    // The flag wins.
    let flagged = [
        "lock",
        "--etcd",
        "https://127.0.0.1:1",
        "--cacert",
        "/nonexistent/flag-ca.pem",
        "x",
    ];
    let (status, stderr) = run(&flagged, &[ca]);
    assert_eq!(status, Some(123), "{stderr}");
    assert!(
        stderr.contains("flag-ca.pem") && !stderr.contains("env-ca.pem"),
        "{stderr}"
    );
    // Not for ZooKeeper, not for SQL (which takes TLS in its URL).
    let cert = ("ETCDCTL_CERT", "/nonexistent/c.pem");
    for args in [&zk, &pg] {
        let (status, stderr) = run(args, &[ca, cert, ("ETCDCTL_USER", "carol")]);
        assert_eq!(status, Some(122), "{args:?}: {stderr}");
    }
    let (status, stderr) = run(&etcd, &[cert]);
    assert_eq!(status, Some(123), "{stderr}");
    assert!(stderr.contains("--cert and --key go together"), "{stderr}");
    // A user needs a password: NAME:PASSWORD, --password or ETCDCTL_PASSWORD.
    let http = ["lock", "--etcd", "http://127.0.0.1:1", "x"];
    let (status, stderr) = run(&http, &[("ETCDCTL_USER", "carol")]);
    assert_eq!(status, Some(123), "{stderr}");
    assert!(stderr.contains("no password"), "{stderr}");
    for vars in [
        &[("ETCDCTL_USER", "carol"), ("ETCDCTL_PASSWORD", SECRET)][..],
        &[("ETCDCTL_USER", &*format!("carol:{SECRET}"))][..],
        // A password without a user is not an error when it comes from
        // the environment, and an empty variable is unset.
        &[("ETCDCTL_PASSWORD", SECRET)][..],
        &[("ETCDCTL_USER", ""), ("ETCDCTL_CACERT", "")][..],
    ] {
        let (status, stderr) = run(&http, vars);
        assert_eq!(status, Some(122), "{vars:?}: {stderr}");
    }
    // LOCKLINE_ZK_AUTH is ZooKeeper's: checked there, not read for etcd.
    let zk_auth = ("LOCKLINE_ZK_AUTH", "world:bob:x");
    let (status, stderr) = run(&zk, &[zk_auth]);
    assert_eq!(status, Some(123), "{stderr}");
    assert!(stderr.contains("unknown scheme"), "{stderr}");
    let (status, stderr) = run(&http, &[zk_auth]);
    assert_eq!(status, Some(122), "{stderr}");
}

/// `ETCDCTL_ENDPOINTS` and `ZOOKEEPER_CONNECT` both set and no flag to pick
/// one: refused in one line naming both, status 123, nothing contacted.
#[test]
fn both_endpoint_variables_without_a_flag_are_refused_in_one_line() {
    let output = Command::new(env!("CARGO_BIN_EXE_lockline"))
        .args(["lock", "x", "true"])
        .env("ETCDCTL_ENDPOINTS", "http://127.0.0.1:2379")
        .env("ZOOKEEPER_CONNECT", "127.0.0.1:2181")
        .output()
        .expect("run lockline");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(123), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("ETCDCTL_ENDPOINTS") && stderr.contains("ZOOKEEPER_CONNECT") && stderr.contains("--zookeeper"),
        "{stderr}"
    );
}
