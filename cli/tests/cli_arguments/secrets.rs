//! A password on the command line, in another argument, in a URL or in the
//! environment, wherever it stands, is never shown.

use super::*;

/// etcdctl users write `--user=root:PASSWORD` and `--password=PASSWORD`
/// (pflag's form): an option lockline does not know this way must not be
/// echoed whole, and one it knows is used (nothing answers there: 122).
#[test]
fn options_written_with_equals_never_show_the_password() {
    let [user, password, zk_auth] = secret_options();
    let misspelt = format!("--pasword={SECRET}");
    for (args, status) in [
        (vec!["lock", "--etcd", "http://127.0.0.1:1", user.as_str(), "x"], 122),
        (
            vec![
                "lock",
                "--etcd",
                "http://127.0.0.1:1",
                "--user",
                "root",
                password.as_str(),
                "x",
            ],
            122,
        ),
        (vec!["lock", "--zookeeper", "127.0.0.1:1", zk_auth.as_str(), "x"], 122),
        (
            vec!["lock", "--etcd", "http://127.0.0.1:1", misspelt.as_str(), "x"],
            123,
        ),
    ] {
        assert_refused_without_secret(&args, status);
    }
}

/// A flag that takes a value takes the next argument even when it begins
/// with '-' (so `--ttl -1` is refused by its parser): when that argument is
/// a secret option written with '=', the refusal names the option and never
/// shows its value. Found by the `cli_args` fuzz target.
#[test]
fn an_option_taken_as_a_value_never_shows_its_secret() {
    let [user, password, zk_auth] = secret_options();
    for (flag, secret, option) in [
        ("--ttl", user.as_str(), "--user"),
        ("--timeout", password.as_str(), "--password"),
        ("--kill-after", zk_auth.as_str(), "--zk-auth"),
        ("--lock-delay", user.as_str(), "--user"),
        ("--limit", password.as_str(), "--password"),
        ("--conflict-exit-code", user.as_str(), "--user"),
    ] {
        let args = ["lock", "--etcd", "http://127.0.0.1:1", flag, secret, "--", "make"];
        let stderr = assert_refused_without_secret(&args, 123);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("{flag} needs a value, but the option {option} follows it")),
            "{args:?}: {stderr}"
        );
    }
}

/// A secret option written where another flag expects a value is that
/// flag's value; a message about it, from clap or from the checks after
/// parsing (a certificate file, an ACL policy), never shows the password.
#[test]
fn a_secret_option_in_the_wrong_place_never_shows_its_password() {
    let [user, password, zk_auth] = secret_options();
    for (flag, secret, says) in [
        (
            "--shared=",
            user.as_str(),
            "--shared takes no value, but was given the option --user",
        ),
        (
            "--nonblock=",
            password.as_str(),
            "--nonblock takes no value, but was given the option --password",
        ),
        (
            "--cacert",
            password.as_str(),
            "cannot read the CA certificate --password=***",
        ),
        (
            "--cacert",
            zk_auth.as_str(),
            "cannot read the CA certificate --zk-auth=digest:bob:***",
        ),
        (
            "--zk-acl",
            password.as_str(),
            "\"--password=***\" is not open or creator",
        ),
    ] {
        let joined = format!("{flag}{secret}");
        let args: Vec<&str> = if flag.ends_with('=') {
            vec!["lock", "--etcd", "http://127.0.0.1:1", joined.as_str(), "x"]
        } else {
            vec!["lock", "--etcd", "http://127.0.0.1:1", flag, secret, "x"]
        };
        let stderr = assert_refused_without_secret(&args, 123);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// The same inside another argument, in a URL, or in the environment: an
/// outside review's cases. A value that is itself an option (`--password
/// --`) is not taken for the password, so it hides nothing else.
#[test]
fn secrets_inside_other_arguments_and_the_environment_are_hidden() {
    let acl = format!("--zk-acl=--password={SECRET}");
    let auth = format!("--zk-auth=--password={SECRET}");
    let etcd = format!("--etcd=--password={SECRET}");
    let redis = format!("unix:///nonexistent/lockline.sock?db=1&pass={SECRET}");
    let url = format!("http://u:{SECRET}/x@127.0.0.1:1");
    let acl_url = format!("--redis=redis://:{SECRET}@127.0.0.1:1");
    let cacert = format!("--cacert=--password={SECRET}");
    let help = format!("--user=root:{SECRET}");
    for args in [
        vec!["lock", "--etcd", "http://127.0.0.1:1", acl.as_str(), "x"],
        vec![
            "lock",
            "--etcd",
            "http://127.0.0.1:1",
            "--zk-acl",
            acl_url.as_str(),
            "x",
        ],
        vec!["lock", "--etcd", "http://127.0.0.1:1", cacert.as_str(), "x"],
        vec!["lock", "--zookeeper", "127.0.0.1:1", auth.as_str(), "x"],
        vec!["lock", "--zookeeper", "127.0.0.1:1", "--zk-auth", SECRET, "x"],
        vec!["lock", etcd.as_str(), "x"],
        vec!["list", "--etcd", url.as_str(), "x"],
        vec![
            "lock",
            "--etcd",
            "http://127.0.0.1:1",
            "--user",
            "root",
            "--password",
            "--",
            acl.as_str(),
            "x",
        ],
    ] {
        let stderr = assert_refused_without_secret(&args, 123);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains("***"), "{args:?}: {stderr}");
    }
    // A secret option taken for a command's name is named, never shown.
    let stderr = assert_refused_without_secret(&["help", help.as_str(), "a"], 123);
    assert!(stderr.contains("unknown command \"--user\""), "{stderr}");
    let stderr = assert_refused_without_secret(&["list", "--redis", redis.as_str(), "x"], 122);
    assert!(stderr.contains("pass=***"), "{stderr}");
    let output = Command::new(env!("CARGO_BIN_EXE_lockline"))
        .args(["lock", "--zookeeper", "127.0.0.1:1", "x"])
        .env("LOCKLINE_ZK_AUTH", SECRET)
        .output()
        .expect("run lockline");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(123), "{stderr}");
    assert!(!stderr.contains(SECRET) && stderr.contains("***"), "{stderr}");
}

/// The backend's own messages pass through `lockline`: a password it might
/// show (an unencoded `/` in it, or one in the query of a URL without a
/// path) is hidden all the same.
#[test]
fn a_database_password_is_hidden_in_every_message() {
    for args in [
        vec![
            "lock",
            "--postgres",
            "postgres://app:a/hunter2-Qv93@127.0.0.1:1/app",
            "x",
        ],
        vec![
            "lock",
            "--postgres",
            "postgres://app@127.0.0.1:1?password=hunter2-Qv93",
            "x",
        ],
        vec!["lock", "--mysql", "mysql://app@127.0.0.1:1?password=hunter2-Qv93", "x"],
        vec!["lock", "--mysql", "mysql://app:hunter2-Qv93@127.0.0.1:1/app", "x"],
    ] {
        let output = lockline(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(matches!(output.status.code(), Some(122 | 123)), "{args:?}: {stderr}");
        assert!(!stderr.is_empty() && !stderr.contains(SECRET), "{args:?}: {stderr}");
    }
}
