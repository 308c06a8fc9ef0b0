//! Odd command lines: each is one line on standard error, exit status 123, no
//! panic, and never shows a password.

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

/// `--help` prints the whole help on standard output and exits 0; a
/// command's `--help` (also after its options) prints that command's help,
/// with what applies to it: the server flags, the variables and the exit
/// statuses; `--version` prints the version. A `--help` after the lock name
/// belongs to the command, not to lockline.
#[test]
fn help_and_version_go_to_stdout_with_status_0() {
    // Every command's help tells these.
    let common = [
        "--zookeeper",
        "ZOOKEEPER_CONNECT",
        "--postgres <URL>",
        "--mysql <URL>",
        "DATABASE_URL",
        "sslmode=require",
        "--cacert",
        "--zk-auth",
        "ETCDCTL_ENDPOINTS",
        "Exit statuses",
        "1     check: the sequencer is not current",
        "120   the lock (or leadership) was lost",
        "121   credentials or permission refused",
        "122   cluster unreachable",
        "123   bad arguments",
        "124   --timeout ran out",
        "125   any other lockline failure",
        "126   COMMAND found but could not be run",
        "127   COMMAND not found",
        "128+N",
    ];
    let whole = [
        "usage: lockline lock",
        "lockline elect [OPTIONS] NAME PROPOSAL",
        "lockline elect -l|--listen",
        "lockline list",
        "lockline check [OPTIONS] SEQUENCER",
        "lockline completions",
        "--print-key",
        "--kill-after",
        "LOCKLINE_TOKEN",
        "LOCKLINE_SEQUENCER",
        "--lock-delay <SECS>",
        "--verbose",
        "--listen",
        "lock-delay until TIME",
        "-s, --shared",
        "--limit <N>",
        "-n, --nonblock",
        "--conflict-exit-code <STATUS>",
        "--mode <MODE>",
        "lock-MODE",
    ];
    let lock = [
        "usage: lockline lock [-s|--limit N|--mode MODE] [-n] [OPTIONS] NAME",
        "-s, --shared",
        "--limit <N>",
        "--mode <MODE>",
        "[possible values: NL, CR, CW, PR, PW, EX]",
        "lock-PW (say) under --mode PW",
        "-n, --nonblock",
        "--conflict-exit-code <STATUS>",
        "lock -n: NAME is taken",
        "--print-key",
        "--kill-after",
        "--lock-delay <SECS>",
        "LOCKLINE_TOKEN",
        "LOCKLINE_SEQUENCER",
    ];
    let help = |args: &[&str]| {
        let output = lockline(args);
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        assert!(
            output.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8 help")
    };
    for (args, parts) in [
        (vec!["--help"], &whole[..]),
        (vec!["-h"], &whole[..]),
        (vec!["help"], &whole[..]),
        (vec!["lock", "--help"], &lock[..]),
        (vec!["help", "lock"], &lock[..]),
        (
            vec!["lock", "--etcd", "http://127.0.0.1:1", "--ttl", "3", "-h"],
            &lock[..],
        ),
    ] {
        let stdout = help(&args);
        for part in common.iter().chain(parts) {
            assert!(stdout.contains(part), "{args:?}: no {part:?} in the help");
        }
    }
    let version = lockline(&["--version"]);
    assert_eq!(version.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("lockline {}", env!("CARGO_PKG_VERSION"))
    );
    // The command's own flag: lockline tries to lock (and fails, nothing
    // listens there: 122) instead of printing its help.
    let output = lockline(&[
        "lock",
        "--etcd",
        "http://127.0.0.1:1",
        "--timeout",
        "1",
        "x",
        "ls",
        "--help",
    ]);
    assert_eq!(output.status.code(), Some(122));
    assert!(!String::from_utf8_lossy(&output.stdout).contains("usage:"));
    for (args, says) in [
        (vec!["elect", "--help"], "usage: lockline elect [OPTIONS] NAME PROPOSAL"),
        (vec!["list", "-h"], "usage: lockline list [OPTIONS] NAME"),
        (vec!["elect", "-l", "--help"], "lockline elect -l|--listen"),
        (vec!["check", "--help"], "usage: lockline check [OPTIONS] SEQUENCER"),
        (
            vec!["check", "--etcd", "http://127.0.0.1:1", "--verbose", "-h"],
            "usage: lockline check",
        ),
    ] {
        let stdout = help(&args);
        assert!(stdout.contains(says), "{args:?}: {stdout}");
        for part in common {
            assert!(stdout.contains(part), "{args:?}: no {part:?} in the help");
        }
    }
}

/// `lockline completions SHELL` prints a completion script that the shell
/// reads without error and that knows the commands and their flags.
#[test]
fn completions_are_scripts_that_know_the_commands() {
    let script = |shell: &str| {
        let output = lockline(&["completions", shell]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{shell}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8 script")
    };
    let bash = script("bash");
    for word in [
        "lock",
        "elect",
        "list",
        "check",
        "--etcd",
        "--zookeeper",
        "--kill-after",
    ] {
        assert!(bash.contains(word), "bash: no {word}");
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("lockline.bash");
    std::fs::write(&path, &bash).expect("write the script");
    let checked = Command::new("bash").arg("-n").arg(&path).output().expect("run bash -n");
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    // Sourced, it completes `lockline l` with the commands that begin so.
    let completed = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && COMP_WORDS=(lockline l) COMP_CWORD=1 COMP_LINE='lockline l' COMP_POINT=10 && _lockline lockline l lockline && echo \"${{COMPREPLY[@]}}\"",
            path.display()
        ))
        .output()
        .expect("run bash");
    let words = String::from_utf8_lossy(&completed.stdout);
    assert!(
        words.split_whitespace().any(|w| w == "lock") && words.split_whitespace().any(|w| w == "list"),
        "completions of `lockline l`: {words:?} {}",
        String::from_utf8_lossy(&completed.stderr)
    );
    for shell in ["zsh", "fish"] {
        let text = script(shell);
        for word in ["lockline", "elect", "zookeeper"] {
            assert!(text.contains(word), "{shell}: no {word}");
        }
    }
    let zsh = script("zsh");
    assert!(
        zsh.starts_with("#compdef lockline"),
        "zsh: {}",
        &zsh[..zsh.len().min(80)]
    );
    let fish = script("fish");
    assert!(fish.contains("complete -c lockline"), "fish");
    let bad = lockline(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(123));
    // A refusal names what is wrong, on one line: the shells there are, the
    // argument not given.
    for (args, says) in [
        (
            &["completions", "tcsh"][..],
            "[possible values: bash, elvish, fish, powershell, zsh]",
        ),
        (&["completions"][..], "not provided: <SHELL>"),
    ] {
        let stderr = assert_refused_without_secret(args, 123);
        assert!(
            stderr.contains(says) && stderr.trim_end().lines().count() == 1,
            "{args:?}: {stderr}"
        );
    }
}

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

/// `--help`, the program's documentation and the command's chapter of the
/// documentation (`docs/cli.md`, linked from the README) name the same flags,
/// variables and exit statuses.
#[test]
fn the_help_the_docs_and_the_readme_agree() {
    let help = String::from_utf8(lockline(&["--help"]).stdout).expect("UTF-8 help");
    let section = include_str!("../../docs/cli.md");
    let secure = include_str!("../../docs/security.md");
    assert!(section.starts_with("# The `lockline` command"), "the command's chapter");
    let docs = include_str!("../src/lockline.md");
    let words = |text: &str, keep: fn(&str) -> bool| {
        let mut words: Vec<String> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .map(|word| word.trim_end_matches('-').to_owned())
            .filter(|word| keep(word))
            .collect();
        words.sort();
        words.dedup();
        words
    };
    // `--flag` stands for any flag in the help's `--flag=VALUE`.
    let flag = |word: &str| word.starts_with("--") && word.len() > 2 && word != "--flag";
    // The environment's, not an example URL's `VERIFY_IDENTITY`.
    let variable = |word: &str| {
        ["LOCKLINE_", "ETCDCTL_", "ZOOKEEPER_", "DATABASE_"]
            .iter()
            .any(|prefix| word.starts_with(prefix))
    };
    let flags = words(&help, flag);
    assert!(flags.contains(&"--lock-delay".to_owned()), "{flags:?}");
    for flag in &flags {
        assert!(section.contains(flag.as_str()), "{flag} is not in docs/cli.md");
        assert!(docs.contains(flag.as_str()), "{flag} is not in the program's docs");
    }
    for flag in words(section, flag).iter().chain(&words(docs, flag)) {
        // `cargo install --path cli` is cargo's.
        assert!(
            help.contains(flag.as_str()) || flag == "--path",
            "{flag} is documented but not in --help"
        );
    }
    let variables = words(&help, variable);
    assert!(variables.contains(&"LOCKLINE_SEQUENCER".to_owned()), "{variables:?}");
    for variable in &variables {
        // The command's chapter, or the secure clusters' one (`ETCDCTL_CACERT`, ...).
        assert!(
            section.contains(variable.as_str()) || secure.contains(variable.as_str()),
            "{variable} is not in docs/cli.md or docs/security.md"
        );
        assert!(
            docs.contains(variable.as_str()),
            "{variable} is not in the program's docs"
        );
    }
    let statuses: Vec<&str> = help
        .split_once("Exit statuses:")
        .expect("the statuses")
        .1
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|status| status.parse::<u8>().is_ok())
        .collect();
    assert!(statuses.contains(&"1") && statuses.contains(&"123"), "{statuses:?}");
    for status in statuses {
        let row = format!("\n| {status} |");
        assert!(section.contains(&row), "status {status} is not in docs/cli.md's table");
        assert!(
            docs.contains(&row),
            "status {status} is not in the program's docs table"
        );
    }
}
