//! `lockline list NAME` prints the queue in order, the holder first, one
//! tab-separated line per contender (key, owner, fencing token, kind), no
//! header; on etcd, ZooKeeper, Redis, PostgreSQL and MariaDB. A listing that cannot be written exits 125.

mod support;

use lockline_testkit::{EtcdCluster, RedisServer, ZkEnsemble};
use support::{eventually, lockline, Running};

/// The `list` lines of `name`, split on tabs.
fn list(server: &[String], name: &str) -> Vec<Vec<String>> {
    let out = lockline("list", server).arg(name).output().expect("run list");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| line.split('\t').map(str::to_owned).collect())
        .collect()
}

fn the_holder_is_listed_first(server: &[String]) {
    assert!(list(server, "listed/lock").is_empty(), "a queue nobody joined");

    let mut command = lockline("lock", server);
    command.arg("listed/lock");
    let mut holder = Running::spawn("holder", command);
    let held = holder.stdout_line();
    let mut command = lockline("lock", server);
    command.args(["listed/lock", "true"]);
    let mut waiter = Running::spawn("waiter", command);

    let mut lines = Vec::new();
    eventually("the waiter queues", || {
        lines = list(server, "listed/lock");
        lines.len() == 2
    });
    for line in &lines {
        assert_eq!(line.len(), 4, "{line:?}");
        assert_eq!(line[3], "mutex", "{line:?}");
        assert!(!line[1].is_empty(), "{line:?}");
    }
    assert_eq!(lines[0][0], held, "the holder is not first: {lines:?}");
    assert_ne!(lines[1][0], held, "{lines:?}");
    let tokens: Vec<u64> = lines.iter().map(|l| l[2].parse().expect("a token")).collect();
    assert!(tokens[0] < tokens[1], "{lines:?}");
    assert!(!waiter.has_exited(), "the waiter ran while the holder held");
    // A listing that cannot be written is a failure, not an empty success.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = lockline("list", server)
        .arg("listed/lock")
        .stdout(full)
        .output()
        .expect("run list");
    assert_eq!(out.status.code(), Some(125), "{}", String::from_utf8_lossy(&out.stderr));

    holder.signal(libc::SIGTERM);
    assert_eq!(holder.exits().code(), Some(0));
    let (key, token) = waiter.holding();
    assert_eq!(
        (key, token),
        (lines[1][0].clone(), tokens[1]),
        "the waiter holds what list said"
    );
    assert_eq!(waiter.exits().code(), Some(0));
    assert!(list(server, "listed/lock").is_empty());
}

#[test]
fn the_holder_is_listed_first_on_etcd() {
    let cluster = EtcdCluster::start().expect("start etcd");
    the_holder_is_listed_first(&["--etcd".to_owned(), cluster.endpoints().join(",")]);
}

#[test]
fn the_holder_is_listed_first_on_zookeeper() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    the_holder_is_listed_first(&["--zookeeper".to_owned(), ensemble.connect_string()]);
}

#[test]
fn the_holder_is_listed_first_on_redis() {
    let server = RedisServer::start().expect("start redis");
    the_holder_is_listed_first(&["--redis".to_owned(), server.url()]);
}

#[test]
fn the_holder_is_listed_first_on_postgres() {
    let (_server, args) = support::postgres();
    the_holder_is_listed_first(&args);
}

#[test]
fn the_holder_is_listed_first_on_mariadb() {
    let (_server, args) = support::mariadb();
    the_holder_is_listed_first(&args);
}
