//! The `lockline` program on a real PostgreSQL (`--postgres URL`) and a real
//! MariaDB (`--mysql URL`), each started by the testkit on a free port: a
//! command runs under the lock with `LOCKLINE_KEY` and `LOCKLINE_TOKEN`,
//! concurrent `lockline lock`s exclude each other and are granted in line,
//! `DATABASE_URL` stands in for the flags (after the other servers'
//! variables), refused credentials exit 121, and an unreachable or silent
//! database exits 122 within the connect deadline. No message shows the
//! database password. (`list`, `elect` and the other exit statuses run on
//! both engines in `list.rs`, `elect.rs`, `exit_statuses.rs` and
//! `killed_holder.rs`; refused combinations of flags in `cli_arguments/refusals.rs`.)

mod support;

use std::process::Output;
use std::time::{Duration, Instant};

use lockline_testkit::{free_port, TcpProxy};
use support::{eventually, holding, lockline, Running};

/// The password in `SCHEME://USER:PASSWORD@HOST...`.
fn password(url: &str) -> String {
    let (_, rest) = url.split_once("://").expect("a URL");
    let (credentials, _) = rest.rsplit_once('@').expect("credentials in the URL");
    let (_, password) = credentials.split_once(':').expect("a password in the URL");
    assert!(!password.is_empty());
    password.to_owned()
}

/// Runs `lockline <subcommand> <server> <args>`, checks that neither output
/// shows the password of `url`, and returns the output.
fn run(subcommand: &str, server: &[String], args: &[&str], url: &str) -> Output {
    let out = lockline(subcommand, server).args(args).output().expect("run lockline");
    assert_no_password(&out, url);
    out
}

fn assert_no_password(out: &Output, url: &str) {
    let secret = password(url);
    for (what, bytes) in [("standard output", &out.stdout), ("standard error", &out.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        assert!(!text.contains(&secret), "the password on {what}: {text}");
        assert!(!text.contains("panicked"), "{text}");
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `lock NAME COMMAND`: the command runs with the lock held, sees the held key
/// and fencing token in `LOCKLINE_KEY` and `LOCKLINE_TOKEN`, has standard
/// output to itself, and its status is passed on; the lock is released
/// afterwards, and the next holder's token is higher.
fn a_command_runs_under_the_lock_with_its_token(server: &[String]) {
    let url = &server[1];
    let out = run(
        "lock",
        server,
        &["cmd/lock", "sh", "-c", "echo \"$LOCKLINE_KEY $LOCKLINE_TOKEN\"; exit 7"],
        url,
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "the command's status: {stderr}");
    let (key, token) = stderr
        .lines()
        .find_map(holding)
        .unwrap_or_else(|| panic!("no holding line in {stderr}"));
    assert!(key.starts_with("cmd/lock/"), "{key}");
    assert!(token > 0);
    assert_eq!(
        text(&out.stdout),
        format!("{key} {token}\n"),
        "the command's output alone"
    );

    let out = run(
        "lock",
        server,
        &["--timeout", "5", "cmd/lock", "sh", "-c", "echo $LOCKLINE_TOKEN"],
        url,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let next: u64 = text(&out.stdout).trim().parse().expect("a token");
    assert!(next > token, "tokens {token} then {next}");
}

#[test]
fn a_command_runs_under_the_lock_with_its_token_on_postgres() {
    let (_server, args) = support::postgres();
    a_command_runs_under_the_lock_with_its_token(&args);
}

#[test]
fn a_command_runs_under_the_lock_with_its_token_on_mariadb() {
    let (_server, args) = support::mariadb();
    a_command_runs_under_the_lock_with_its_token(&args);
}

/// A holder without a command, and four `lockline lock NAME COMMAND`
/// queued behind it: none runs while the holder holds; once it lets go they
/// run one at a time (each command checks that no other is inside), in the
/// order of the queue `list` showed, with increasing tokens.
fn concurrent_locks_exclude_each_other(server: &[String]) {
    let url = &server[1];
    let dir = tempfile::tempdir().expect("temp dir");
    let dir_path = dir.path().to_str().expect("UTF-8 path");
    let mut command = lockline("lock", server);
    command.arg("excl/lock");
    let mut holder = Running::spawn("holder", command);
    let held = holder.stdout_line();
    let (_, held_token) = holder.holding();

    // Inside: a directory only one may create; each records its token.
    let critical = "mkdir \"$0/inside\" || exit 99; echo \"$LOCKLINE_TOKEN\" >> \"$0/tokens\"; \
                    rmdir \"$0/inside\"";
    let mut waiters = Vec::new();
    for n in 0..4 {
        let mut command = lockline("lock", server);
        command.args(["excl/lock", "sh", "-c", critical, dir_path]);
        waiters.push(Running::spawn(&format!("waiter {n}"), command));
        // One at a time, so that the queue's order is known.
        eventually("the waiter queues", || {
            let out = run("list", server, &["excl/lock"], url);
            text(&out.stdout).lines().count() == n + 2
        });
    }
    let out = run("list", server, &["excl/lock"], url);
    let queue: Vec<(String, u64)> = text(&out.stdout)
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            (fields[0].to_owned(), fields[2].parse().expect("a token"))
        })
        .collect();
    assert_eq!(queue[0], (held.clone(), held_token), "the holder first: {queue:?}");
    assert!(
        !dir.path().join("tokens").exists(),
        "a waiter ran while the holder held"
    );
    assert!(waiters.iter_mut().all(|w| !w.has_exited()), "a waiter ended early");

    holder.signal(libc::SIGTERM);
    assert_eq!(holder.exits().code(), Some(0), "the holder releases on SIGTERM");
    for waiter in &mut waiters {
        assert_eq!(waiter.exits().code(), Some(0), "a command found another inside (99)");
    }
    let tokens: Vec<u64> = std::fs::read_to_string(dir.path().join("tokens"))
        .expect("tokens")
        .lines()
        .map(|t| t.parse().expect("a token"))
        .collect();
    let queued: Vec<u64> = queue[1..].iter().map(|(_, token)| *token).collect();
    assert_eq!(tokens, queued, "granted in the order of the queue");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]) && tokens[0] > held_token,
        "{tokens:?}"
    );
    assert!(text(&run("list", server, &["excl/lock"], url).stdout).is_empty());
}

#[test]
fn concurrent_locks_exclude_each_other_on_postgres() {
    let (_server, args) = support::postgres();
    concurrent_locks_exclude_each_other(&args);
}

#[test]
fn concurrent_locks_exclude_each_other_on_mariadb() {
    let (_server, args) = support::mariadb();
    concurrent_locks_exclude_each_other(&args);
}

/// `DATABASE_URL` picks the database when no flag or other server variable
/// does; a flag wins over it (a bad `DATABASE_URL` is then not even read),
/// and so do `ETCDCTL_ENDPOINTS` and `ZOOKEEPER_CONNECT`. A wrong password
/// exits 121, without showing it.
fn database_url_stands_in_for_the_flag(server: &[String]) {
    let url = &server[1];
    let by_env = |args: &[&str], vars: &[(&str, &str)]| {
        let mut command = lockline("lock", &[]);
        command.args(args).env("DATABASE_URL", url);
        for (name, value) in vars {
            command.env(name, value);
        }
        let out = command.output().expect("run lockline");
        assert_no_password(&out, url);
        out
    };
    let out = by_env(&["env/lock", "sh", "-c", "echo $LOCKLINE_TOKEN"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).trim().parse::<u64>().is_ok(), "{}", text(&out.stdout));
    let listed = lockline("list", &[])
        .arg("env/lock")
        .env("DATABASE_URL", url)
        .output()
        .expect("run list");
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed.stderr));

    // The more specific variable wins: nothing listens on this etcd port.
    let closed = format!("http://127.0.0.1:{}", free_port().expect("port"));
    let out = by_env(&["env/lock", "true"], &[("ETCDCTL_ENDPOINTS", &closed)]);
    assert_eq!(out.status.code(), Some(122), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("etcd"), "{}", text(&out.stderr));

    // A flag wins over a DATABASE_URL of any scheme.
    let out = lockline("lock", server)
        .args(["env/lock", "true"])
        .env("DATABASE_URL", "sqlite://db.sqlite")
        .output()
        .expect("run lockline");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let secret = password(url);
    let wrong = url.replacen(&format!(":{secret}@"), ":wrong-Zr81@", 1);
    let out = lockline("lock", &[server[0].clone(), wrong])
        .args(["env/lock", "true"])
        .output()
        .expect("run lockline");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(121), "{stderr}");
    assert!(!stderr.contains("wrong-Zr81"), "the password shown: {stderr}");
}

#[test]
fn database_url_stands_in_for_the_flag_on_postgres() {
    let (_server, args) = support::postgres();
    database_url_stands_in_for_the_flag(&args);
}

#[test]
fn database_url_stands_in_for_the_flag_on_mariadb() {
    let (_server, args) = support::mariadb();
    database_url_stands_in_for_the_flag(&args);
}

/// How long a session may take to open before `lockline` gives up: the
/// session's connect timeout (5 s), plus room for a loaded machine.
const CONNECT_DEADLINE: Duration = Duration::from_secs(5);
const SLACK: Duration = Duration::from_secs(5);

/// Runs `lockline lock --FLAG URL x true` and checks it exits 122 within the
/// connect deadline, naming the address it could not reach.
fn unreachable(flag: &str, url: &str, address: &str, what: &str) {
    let started = Instant::now();
    let out = run("lock", &[flag.to_owned(), url.to_owned()], &["x", "true"], url);
    let took = started.elapsed();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(122), "{what}: {stderr}");
    assert!(
        stderr.contains("unavailable") && stderr.contains(address),
        "{what}: the message does not say what could not be reached: {stderr}"
    );
    assert!(took < CONNECT_DEADLINE + SLACK, "{what}: took {took:?}");
    assert!(out.stdout.is_empty(), "{what}");
}

/// Nothing listens on the port (refused at once), or the database is behind
/// a silent partition (answers nothing): 122 within the connect deadline,
/// with a message that names the address, on both engines.
#[test]
fn an_unreachable_database_exits_122_within_the_connect_deadline() {
    let port = free_port().expect("port");
    let closed = format!("127.0.0.1:{port}");
    unreachable(
        "--postgres",
        &format!("postgres://app:s3cret-Pw@{closed}/app"),
        &closed,
        "PostgreSQL on a closed port",
    );
    unreachable(
        "--mysql",
        &format!("mysql://app:s3cret-Pw@{closed}/app"),
        &closed,
        "MariaDB on a closed port",
    );

    let (pg, args) = support::postgres();
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", pg.port())).expect("proxy");
    proxy.blackhole();
    let url = args[1].replacen(&format!("127.0.0.1:{}", pg.port()), &proxy.address(), 1);
    unreachable("--postgres", &url, &proxy.address(), "PostgreSQL behind a blackhole");
    drop(pg);

    let (maria, args) = support::mariadb();
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", maria.port())).expect("proxy");
    proxy.blackhole();
    let url = args[1].replacen(&format!("127.0.0.1:{}", maria.port()), &proxy.address(), 1);
    unreachable("--mysql", &url, &proxy.address(), "MariaDB behind a blackhole");
}
