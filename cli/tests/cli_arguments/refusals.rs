//! Odd values, conflicting servers, malformed endpoints and other usage
//! errors: each refused in one line on standard error, exit status 123, no
//! panic.

use super::*;

/// Odd values: a directory or a missing file as a certificate, a key
/// without a certificate, empty user names. One line each, exit status 123.
#[test]
fn odd_values_are_one_line_errors() {
    let dir = std::env::temp_dir();
    let dir = dir.to_str().expect("UTF-8 temporary directory");
    let user = format!(":{SECRET}");
    let zk_auth = format!("digest::{SECRET}");
    for args in [
        vec!["lock", "--etcd", "https://127.0.0.1:1", "--cacert", dir, "x"],
        vec![
            "lock",
            "--etcd",
            "https://127.0.0.1:1",
            "--cacert",
            "/nonexistent/ca.pem",
            "x",
        ],
        vec![
            "lock",
            "--etcd",
            "https://127.0.0.1:1",
            "--cacert",
            dir,
            "--key",
            "/k.pem",
            "x",
        ],
        vec!["lock", "--etcd", "http://127.0.0.1:1", "--user", user.as_str(), "x"],
        vec!["lock", "--zookeeper", "127.0.0.1:1", "--zk-auth", zk_auth.as_str(), "x"],
        vec!["lock", "--zookeeper", "127.0.0.1:1", "--zk-auth", "digest::", "x"],
        vec!["lock", "--etcd", "http://127.0.0.1:1", "--password", SECRET, "x"],
    ] {
        let stderr = assert_refused_without_secret(&args, 123);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
}

/// Both servers at once, or an endpoint that cannot be one, is refused in
/// one line before anything is contacted: a port out of range is not port
/// 80, and an etcd URL given to `--zookeeper` is named as such.
#[test]
fn conflicting_servers_and_malformed_endpoints_are_refused_in_one_line() {
    for (args, says) in [
        (
            vec![
                "lock",
                "--etcd",
                "http://127.0.0.1:2379",
                "--zookeeper",
                "127.0.0.1:2181",
                "x",
            ],
            "cannot be used together",
        ),
        (
            vec![
                "lock",
                "--zookeeper",
                "127.0.0.1:2181",
                "--etcd",
                "http://127.0.0.1:2379",
                "x",
            ],
            "cannot be used together",
        ),
        (
            vec!["lock", "--etcd", "http://127.0.0.1:99999", "x"],
            "not a port number",
        ),
        (vec!["lock", "--etcd", "http://127.0.0.1", "x"], "no port"),
        (vec!["lock", "--etcd", "ftp://127.0.0.1:2379", "x"], "unknown scheme"),
        (
            vec!["lock", "--zookeeper", "http://127.0.0.1:2181", "x"],
            "looks like an etcd URL",
        ),
        (vec!["lock", "--zookeeper", "127.0.0.1:70000", "x"], "not a port number"),
        (vec!["lock", "--zookeeper", "127.0.0.1/apps", "x"], "has no port"),
    ] {
        let stderr = assert_refused_without_secret(&args, 123);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(lines[0].contains(says), "{args:?}: {stderr}");
    }
}

/// Usage errors of the subcommands: 123, never a panic.
#[test]
fn usage_errors_exit_123() {
    for args in [
        vec!["unlock", "x"],
        vec!["lock", "--etcd", "http://127.0.0.1:1"],
        vec!["elect", "--etcd", "http://127.0.0.1:1", "x"],
        vec!["elect", "-l", "--etcd", "http://127.0.0.1:1", "x", "proposal"],
        vec!["list", "--etcd", "http://127.0.0.1:1", "x", "extra"],
        vec!["lock", "-l", "--etcd", "http://127.0.0.1:1", "x"],
        vec!["lock", "--etcd", "http://127.0.0.1:1", "--ttl", "soon", "x"],
        vec![
            "lock",
            "--etcd",
            "http://127.0.0.1:1",
            "--lock-delay",
            "61",
            "x",
            "true",
        ],
        vec![
            "lock",
            "--etcd",
            "http://127.0.0.1:1",
            "--lock-delay",
            "-1",
            "x",
            "true",
        ],
        vec![
            "lock",
            "--etcd",
            "http://127.0.0.1:1",
            "--lock-delay",
            "abc",
            "x",
            "true",
        ],
        vec!["elect", "--etcd", "http://127.0.0.1:1", "--lock-delay=61", "x", "p"],
        vec!["list", "--etcd", "http://127.0.0.1:1", "--lock-delay", "1", "x"],
        vec!["check", "--etcd", "http://127.0.0.1:1"],
        vec!["check", "--etcd", "http://127.0.0.1:1", "lockline1:mutex:7:x", "extra"],
        vec![
            "check",
            "--etcd",
            "http://127.0.0.1:1",
            "--lock-delay",
            "1",
            "lockline1:mutex:7:x",
        ],
        vec!["lock", "--etcd", "http://127.0.0.1:1", "--verbose", "x"],
        // The recipes: one at a time, -n without a timeout, and for lock.
        vec!["lock", "--etcd", "http://127.0.0.1:1", "-s", "--limit", "2", "x"],
        vec!["lock", "--etcd", "http://127.0.0.1:1", "--limit", "0", "x"],
        vec!["lock", "--etcd", "http://127.0.0.1:1", "--limit", "many", "x"],
        vec!["lock", "--etcd", "http://127.0.0.1:1", "-n", "--timeout", "1", "x"],
        vec!["lock", "--etcd", "http://127.0.0.1:1", "--conflict-exit-code", "7", "x"],
        vec![
            "lock",
            "--etcd",
            "http://127.0.0.1:1",
            "-n",
            "--conflict-exit-code",
            "256",
            "x",
        ],
        vec!["elect", "--etcd", "http://127.0.0.1:1", "-s", "x", "p"],
        vec!["list", "--etcd", "http://127.0.0.1:1", "-n", "x"],
    ] {
        let output = lockline(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(123), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && output.stdout.is_empty(),
            "{args:?}: {stderr}"
        );
    }
}

/// SQL servers on the command line: two servers at once, a URL given to the
/// other engine's flag, TLS or credential flags (they go in the URL), and a
/// `DATABASE_URL` of another scheme or no URL at all. Each is refused in one
/// line, status 123, before anything is contacted, without the password.
#[test]
fn sql_servers_refuse_bad_combinations_in_one_line() {
    let pg = format!("postgres://app:{SECRET}@127.0.0.1:1/app");
    let my = format!("mysql://app:{SECRET}@127.0.0.1:1/app");
    for (args, says) in [
        (
            vec!["lock", "--postgres", &pg, "--mysql", &my, "x"],
            "--postgres and --mysql cannot be used together",
        ),
        (
            vec!["lock", "--etcd", "http://127.0.0.1:2379", "--postgres", &pg, "x"],
            "--etcd and --postgres cannot be used together",
        ),
        (
            vec!["list", "--mysql", &my, "--zookeeper", "127.0.0.1:2181", "x"],
            "--zookeeper and --mysql cannot be used together",
        ),
        (vec!["lock", "--postgres", &my, "x"], "goes to --mysql"),
        (vec!["lock", "--mysql", &pg, "x"], "goes to --postgres"),
        (
            vec!["lock", "--postgres", &pg, "--cacert", "ca.pem", "x"],
            "put them in the URL",
        ),
        (
            vec!["lock", "--mysql", &my, "--user", "app", "x"],
            "put them in the URL",
        ),
    ] {
        let stderr = assert_refused_without_secret(&args, 123);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    for (url, says) in [
        (
            format!("sqlite://{SECRET}.db"),
            "DATABASE_URL has the scheme sqlite://, which lockline does not speak",
        ),
        (format!("host=db password={SECRET}"), "DATABASE_URL is not a URL"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_lockline"))
            .args(["lock", "x", "true"])
            .env_remove("ETCDCTL_ENDPOINTS")
            .env_remove("ZOOKEEPER_CONNECT")
            .env("DATABASE_URL", &url)
            .output()
            .expect("run lockline");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(123), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says) && !stderr.contains(SECRET), "{stderr}");
    }
}
