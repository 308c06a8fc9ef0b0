//! lockline's own exit statuses, distinct from a command's: 122 for a
//! cluster out of reach (a closed port, a blackholed one), 123 for bad
//! arguments, 124 for `--timeout`, 125 for a session lost while waiting,
//! 126 and 127 for a command that cannot be run or is not found, and a
//! command's own status 1 passed through. Real etcd, ZooKeeper, Redis,
//! PostgreSQL and MariaDB.
//! (120, a lost lock, is in `command_dies_with_lock.rs`,
//! `output_and_status.rs` and `elect.rs`; 121, refused credentials, in
//! `secure_cli.rs`.)

mod support;

use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use lockline_testkit::{free_port, EtcdCluster, TcpProxy, ZkEnsemble};
use support::{eventually, lockline, Running};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run(subcommand: &str, server: &[String], args: &[&str]) -> Output {
    lockline(subcommand, server).args(args).output().expect("run lockline")
}

fn assert_status(out: &Output, status: i32, says: &str, what: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "{what}: {stderr}");
    assert!(stderr.contains(says), "{what}: no {says:?} in {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
}

/// Every status a command and a server can produce, on one server.
fn statuses(server: &[String]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let not_executable = dir.path().join("script.sh");
    std::fs::write(&not_executable, "#!/bin/sh\necho ran\n").expect("write");
    std::fs::set_permissions(&not_executable, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let not_executable = not_executable.to_str().expect("utf-8");
    let directory = dir.path().to_str().expect("utf-8");

    let out = run("lock", server, &["status/a", "sh", "-c", "exit 1"]);
    assert_status(&out, 1, "holding", "a command's status 1");
    let out = run("elect", server, &["status/e", "p", "sh", "-c", "exit 1"]);
    assert_status(&out, 1, "holding", "a leader's command's status 1");
    for subcommand in ["lock", "elect"] {
        let mut args = vec!["status/nf"];
        if subcommand == "elect" {
            args.push("p");
        }
        let mut missing = args.clone();
        missing.push("/nonexistent/lockline-test-command");
        let out = run(subcommand, server, &missing);
        assert_status(&out, 127, "cannot run", "a command that does not exist");
        for path in [not_executable, directory] {
            let mut cannot = args.clone();
            cannot.push(path);
            let out = run(subcommand, server, &cannot);
            assert_status(&out, 126, "cannot run", "a command that cannot be run");
        }
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    }
    // The lock was released each time: a bounded wait gets it at once.
    let out = run("lock", server, &["--timeout", "10", "status/nf", "true"]);
    assert_status(&out, 0, "holding", "the lock was released after 127 and 126");

    // --timeout 0 is one try: granted when free, on lock and on elect.
    let out = run("lock", server, &["--timeout", "0", "status/zero", "true"]);
    assert_status(&out, 0, "holding", "lock --timeout 0 on a free lock");
    let out = run("elect", server, &["--timeout", "0", "status/zero-e", "p", "true"]);
    assert_status(&out, 0, "holding", "elect --timeout 0 on a free election");

    let out = run("lock", server, &["a//b", "true"]);
    assert_status(&out, 123, "invalid name", "an invalid name");

    // --timeout, on lock and on elect, while another lockline holds.
    for (subcommand, args) in [("lock", vec!["status/busy"]), ("elect", vec!["status/busy-e", "first"])] {
        let mut command = lockline(subcommand, server);
        command.args(&args);
        let holder = Running::spawn("holder", command);
        holder.stdout_line();
        let mut waiter = args.clone();
        if subcommand == "elect" {
            waiter[1] = "second";
        }
        let mut timed = vec!["--timeout", "0.5"];
        timed.extend(waiter);
        timed.push("true");
        let out = run(subcommand, server, &timed);
        assert_status(&out, 124, "not acquired", "--timeout ran out");
        timed[1] = "0";
        let out = run(subcommand, server, &timed);
        assert_status(&out, 124, "one try", "--timeout 0 on a taken one");
        holder.signal(libc::SIGTERM);
    }
}

#[test]
fn statuses_on_etcd() {
    let cluster = EtcdCluster::start().expect("start etcd");
    statuses(&["--etcd".to_owned(), cluster.endpoints().join(",")]);
}

#[test]
fn statuses_on_zookeeper() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    statuses(&["--zookeeper".to_owned(), ensemble.connect_string()]);
}

#[test]
fn statuses_on_redis() {
    let server = lockline_testkit::RedisServer::start().expect("start redis");
    statuses(&["--redis".to_owned(), server.url()]);
}

/// Nothing listens on the port, or the port swallows every byte: 122,
/// "unavailable", on both backends.
#[test]
fn an_unreachable_cluster_exits_122() {
    let port = free_port().expect("port");
    let out = run(
        "lock",
        &["--etcd".into(), format!("http://127.0.0.1:{port}")],
        &["x", "true"],
    );
    assert_status(&out, 122, "unavailable", "etcd on a closed port");
    let out = run("list", &["--zookeeper".into(), format!("127.0.0.1:{port}")], &["x"]);
    assert_status(&out, 122, "unavailable", "ZooKeeper on a closed port");

    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    proxy.blackhole();
    let out = run(
        "elect",
        &["--etcd".into(), format!("http://{}", proxy.address())],
        &["x", "p", "true"],
    );
    assert_status(&out, 122, "unavailable", "etcd behind a blackhole");
    drop(cluster);
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    proxy.blackhole();
    let out = run("lock", &["--zookeeper".into(), proxy.address()], &["x", "true"]);
    assert_status(&out, 122, "unavailable", "ZooKeeper behind a blackhole");
}

/// The waiter's session is revoked on the server while it waits in line:
/// the wait fails with 125 (not 120: nothing was held), and no command ran.
#[test]
fn a_session_lost_while_waiting_exits_125() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let server = vec!["--etcd".to_owned(), cluster.endpoints().join(",")];
    let mut command = lockline("lock", &server);
    command.arg("status/lost-wait");
    let holder = Running::spawn("holder", command);
    let held = holder.stdout_line();
    let mut command = lockline("lock", &server);
    command.args(["status/lost-wait", "sh", "-c", "echo ran"]);
    let mut waiter = Running::spawn("waiter", command);
    let mut keys = Vec::new();
    eventually("the waiter queues", || {
        keys = cluster.keys("status/lost-wait/").expect("keys");
        keys.len() == 2
    });
    let queued = keys.iter().find(|k| **k != held).expect("the waiter's key");
    let lease = queued.rsplit('/').next().expect("lease");
    let out = cluster
        .etcdctl(&cluster.endpoints())
        .args(["lease", "revoke", lease])
        .output()
        .expect("etcdctl");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status = waiter.exits();
    assert_eq!(status.code(), Some(125), "{status:?}");
    assert!(waiter.rest_of_stdout().is_empty(), "the command ran");
    holder.signal(libc::SIGTERM);
}

/// The command ran with the lock held, then the release could not reach the
/// cluster (a silent partition): 125, lockline's own failure, not 122 nor
/// the command's status.
#[test]
fn a_release_that_cannot_reach_the_cluster_exits_125() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let dir = tempfile::tempdir().expect("temp dir");
    let go = dir.path().join("go");
    let made = std::process::Command::new("mkfifo").arg(&go).status().expect("mkfifo");
    assert!(made.success());
    // A long TTL: the release fails (request timeout) long before the
    // session could be declared lost.
    let mut command = lockline("lock", &["--etcd".into(), format!("http://{}", proxy.address())]);
    command.args([
        "--ttl",
        "60",
        "status/release",
        "sh",
        "-c",
        "read _ < \"$0\"",
        go.to_str().expect("path"),
    ]);
    let mut holder = Running::spawn("holder", command);
    holder.holding();
    proxy.blackhole();
    std::fs::write(&go, "\n").expect("let the command finish");
    assert_eq!(holder.exits().code(), Some(125), "a failed release");
}

#[test]
fn statuses_on_postgres() {
    let (_server, args) = support::postgres();
    statuses(&args);
}

#[test]
fn statuses_on_mariadb() {
    let (_server, args) = support::mariadb();
    statuses(&args);
}
