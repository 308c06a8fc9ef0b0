//! `lockline elect NAME PROPOSAL [COMMAND]` and `lockline elect -l NAME` on
//! etcd, ZooKeeper, Redis, PostgreSQL and MariaDB: a leader without a command prints its key and leads
//! until a signal, then resigns (exit 0); a candidate with a command runs it
//! once elected, with `LOCKLINE_KEY` and `LOCKLINE_TOKEN`, its output alone on
//! standard output; a listener prints every leader's key and value; a lost
//! leadership exits 120; a signal while campaigning leaves the queue at
//! once. On etcd, `etcdctl elect` and `lockline elect` see
//! each other's leaders, both ways.

mod support;

use lockline_testkit::{EtcdCluster, ZkEnsemble};
use support::{eventually, lockline, Running};

fn elect(server: &[String], args: &[&str]) -> std::process::Command {
    let mut command = lockline("elect", server);
    command.args(args);
    command
}

fn leaders_follow_each_other(server: &[String], key_prefix: &str) {
    let first = Running::spawn("first", elect(server, &["jobs/leader", "node-a"]));
    let first_key = first.stdout_line();
    assert!(first_key.starts_with(key_prefix), "{first_key}");

    let listener = Running::spawn("listener", elect(server, &["-l", "jobs/leader"]));
    assert_eq!(listener.stdout_line(), first_key);
    assert_eq!(listener.stdout_line(), "node-a");

    // The second leader's command leads until the test has seen the
    // listener report it: it blocks reading a FIFO the test writes to then
    // (a leadership shorter than a round trip may pass unseen).
    let dir = tempfile::tempdir().expect("temp dir");
    let go = dir.path().join("go");
    let made = std::process::Command::new("mkfifo").arg(&go).status().expect("mkfifo");
    assert!(made.success());
    let second = Running::spawn(
        "second",
        elect(
            server,
            &[
                "jobs/leader",
                "node-b",
                "--",
                "sh",
                "-c",
                "echo \"$LOCKLINE_KEY $LOCKLINE_TOKEN\"; read _ < \"$0\"; echo done",
                go.to_str().expect("path"),
            ],
        ),
    );
    let mut second = second;
    // The second candidate waits while the first leads: it is in the queue,
    // behind the first.
    eventually("the second candidate queues", || {
        let out = lockline("list", server).arg("jobs/leader").output().expect("list");
        String::from_utf8_lossy(&out.stdout).lines().count() == 2
    });
    assert!(!second.has_exited(), "the second candidate ran while the first led");

    let mut first = first;
    first.signal(libc::SIGTERM);
    assert_eq!(
        first.exits().code(),
        Some(0),
        "a leader ended by a signal resigns and exits 0"
    );

    let (second_key, token) = second.holding();
    assert_eq!(second.stdout_line(), format!("{second_key} {token}"));
    // The listener sees the second leader while it leads.
    assert_eq!(listener.stdout_line(), second_key);
    assert_eq!(listener.stdout_line(), "node-b");
    std::fs::write(&go, "\n").expect("let the second leader's command finish");
    assert_eq!(second.stdout_line(), "done");
    assert_eq!(second.exits().code(), Some(0));
    assert!(second.rest_of_stdout().is_empty());
    let mut listener = listener;
    listener.signal(libc::SIGINT);
    assert_eq!(listener.exits().code(), Some(0), "a listener ended by a signal exits 0");
}

#[test]
fn leaders_follow_each_other_on_etcd() {
    let cluster = EtcdCluster::start().expect("start etcd");
    leaders_follow_each_other(&["--etcd".to_owned(), cluster.endpoints().join(",")], "jobs/leader/");
}

#[test]
fn leaders_follow_each_other_on_zookeeper() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    leaders_follow_each_other(&["--zookeeper".to_owned(), ensemble.connect_string()], "/jobs/leader/");
}

#[test]
fn leaders_follow_each_other_on_redis() {
    let server = lockline_testkit::RedisServer::start().expect("start redis");
    leaders_follow_each_other(&["--redis".to_owned(), server.url()], "{jobs/leader}:e:");
}

/// The leader's lease revoked on the server while its command runs: the
/// command is stopped and `lockline elect` exits 120.
#[test]
fn a_lost_leadership_exits_120() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let server = ["--etcd".to_owned(), cluster.endpoints().join(",")];
    let mut leader = Running::spawn("leader", elect(&server, &["jobs/lost", "node-a", "sleep", "600"]));
    let (key, _) = leader.holding();
    support::revoke(&cluster, &key);
    assert_eq!(leader.exits().code(), Some(120));
}

/// `etcdctl elect` leads and `lockline elect -l` shows its key and value;
/// `lockline elect` leads and `etcdctl elect -l` shows its key and value,
/// and `etcdctl elect` queues behind it until it resigns.
#[test]
fn etcdctl_and_lockline_see_each_others_leaders() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let server = ["--etcd".to_owned(), cluster.endpoints().join(",")];

    let mut command = cluster.etcdctl(&cluster.endpoints());
    command.args(["elect", "interop/elect", "from-etcdctl"]);
    let mut etcdctl = Running::spawn("etcdctl elect", command);
    let etcdctl_key = etcdctl.stdout_line();
    assert_eq!(etcdctl.stdout_line(), "from-etcdctl");
    let listener = Running::spawn("listener", elect(&server, &["--listen", "interop/elect"]));
    assert_eq!(listener.stdout_line(), etcdctl_key);
    assert_eq!(listener.stdout_line(), "from-etcdctl");
    let mut candidate = Running::spawn("lockline elect", elect(&server, &["interop/elect", "from-lockline"]));
    eventually("lockline queues behind etcdctl", || {
        cluster.keys("interop/elect/").expect("keys").len() == 2
    });
    assert!(!candidate.has_exited());
    etcdctl.signal(libc::SIGINT);
    etcdctl.exits();
    let lockline_key = candidate.stdout_line();
    assert_eq!(listener.stdout_line(), lockline_key);
    assert_eq!(listener.stdout_line(), "from-lockline");

    let mut command = cluster.etcdctl(&cluster.endpoints());
    command.args(["elect", "-l", "interop/elect"]);
    let etcdctl_listener = Running::spawn("etcdctl elect -l", command);
    assert_eq!(etcdctl_listener.stdout_line(), lockline_key);
    assert_eq!(etcdctl_listener.stdout_line(), "from-lockline");

    let mut command = cluster.etcdctl(&cluster.endpoints());
    command.args(["elect", "interop/elect", "etcdctl-again"]);
    let etcdctl_again = Running::spawn("etcdctl elect again", command);
    eventually("etcdctl queues behind lockline", || {
        cluster.keys("interop/elect/").expect("keys").len() == 2
    });
    candidate.signal(libc::SIGTERM);
    assert_eq!(candidate.exits().code(), Some(0));
    let again_key = etcdctl_again.stdout_line();
    assert_eq!(etcdctl_again.stdout_line(), "etcdctl-again");
    assert_eq!(listener.stdout_line(), again_key);
    assert_eq!(listener.stdout_line(), "etcdctl-again");
}

/// A listener whose standard output is closed (`lockline elect -l NAME |
/// head -2`) stops, with status 125, at the next leader it cannot print.
#[test]
fn a_listener_whose_reader_went_away_exits_125() {
    use std::io::{BufRead, BufReader};

    let cluster = EtcdCluster::start().expect("start etcd");
    let server = ["--etcd".to_owned(), cluster.endpoints().join(",")];
    let mut first = Running::spawn("first", elect(&server, &["jobs/head", "node-a"]));
    let key = first.stdout_line();
    let mut listener = elect(&server, &["-l", "jobs/head"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the listener");
    let mut reader = BufReader::new(listener.stdout.take().expect("stdout"));
    let (mut shown_key, mut shown_value) = (String::new(), String::new());
    reader.read_line(&mut shown_key).expect("read");
    reader.read_line(&mut shown_value).expect("read");
    assert_eq!((shown_key.trim(), shown_value.trim()), (key.as_str(), "node-a"));
    drop(reader);
    first.signal(libc::SIGTERM);
    assert_eq!(first.exits().code(), Some(0));
    let second = Running::spawn("second", elect(&server, &["jobs/head", "node-b"]));
    second.stdout_line();
    let end = std::time::Instant::now() + support::BOUND;
    let status = loop {
        if let Some(status) = listener.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < end,
            "the listener runs on with nobody reading"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(125));
}

/// SIGTERM to a candidate waiting behind the leader: it exits 143 and its
/// entry is gone from the queue at once (not after its TTL), on both
/// backends.
fn a_signal_while_campaigning_leaves_the_queue(server: &[String]) {
    let leader = Running::spawn("leader", elect(server, &["jobs/quit", "node-a"]));
    let key = leader.stdout_line();
    let mut candidate = Running::spawn(
        "candidate",
        elect(server, &["--ttl", "60", "jobs/quit", "node-b", "true"]),
    );
    let queued = || {
        let out = lockline("list", server).arg("jobs/quit").output().expect("list");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|line| line.split('\t').next().unwrap_or_default().to_owned())
            .collect::<Vec<String>>()
    };
    eventually("the candidate queues", || queued().len() == 2);
    candidate.signal(libc::SIGTERM);
    assert_eq!(candidate.exits().code(), Some(128 + libc::SIGTERM));
    assert_eq!(queued(), [key], "the signalled candidate's entry stayed");
    leader.signal(libc::SIGTERM);
}

#[test]
fn a_signal_while_campaigning_leaves_the_queue_on_etcd() {
    let cluster = EtcdCluster::start().expect("start etcd");
    a_signal_while_campaigning_leaves_the_queue(&["--etcd".to_owned(), cluster.endpoints().join(",")]);
}

#[test]
fn a_signal_while_campaigning_leaves_the_queue_on_zookeeper() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    a_signal_while_campaigning_leaves_the_queue(&["--zookeeper".to_owned(), ensemble.connect_string()]);
}

#[test]
fn leaders_follow_each_other_on_postgres() {
    let (_server, args) = support::postgres();
    leaders_follow_each_other(&args, "jobs/leader/");
}

#[test]
fn leaders_follow_each_other_on_mariadb() {
    let (_server, args) = support::mariadb();
    leaders_follow_each_other(&args, "jobs/leader/");
}
