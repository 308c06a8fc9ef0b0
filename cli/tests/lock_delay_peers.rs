//! What a lock-delayed `lockline lock` waiter sees behind a peer client's
//! holder: a peer's clean release leaves none of the marks a lockline
//! release leaves (the etcd hand-over marker, the ZooKeeper node's last data
//! change, the Redis channel's `gone`), so the waiter takes it for a loss and
//! is held back for its lock-delay, as docs/sequencers.md and each backend's
//! docs say. Peers: `etcdctl lock`, kazoo's `Lock`, redis-py's `Lock`.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockline_testkit::{EtcdCluster, RedisOptions, RedisServer, ZkEnsemble};
use support::{eventually, lockline, Running, BOUND};

const DELAY: Duration = Duration::from_millis(1500);

/// How many contenders `lockline list` shows for `name`.
fn listed(server: &[String], name: &str) -> usize {
    let out = lockline("list", server).arg(name).output().expect("run list");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// `peer` holds `name` and has said so on standard output; a lock-delayed
/// `lockline lock` queues behind it (`list` then shows `queued`
/// contenders); `release` tells the peer to let go. The waiter must be
/// granted no sooner than the delay after that.
fn held_back_after_a_peer_release(
    server: &[String],
    name: &str,
    mut peer: Running,
    queued: usize,
    release: impl FnOnce(&mut Running),
) {
    let mut command = lockline("lock", server);
    command.args(["--lock-delay", "1.5", name, "true"]);
    let mut waiter = Running::spawn("lockline waiter", command);
    eventually("the waiter queues", || listed(server, name) == queued);

    let released_at = Instant::now();
    release(&mut peer);
    waiter.holding();
    let took = released_at.elapsed();
    eprintln!("granted {took:?} after the peer was told to release (lock-delay {DELAY:?})");
    assert!(
        took >= DELAY,
        "a peer's release handed on at once ({took:?}): the waiter took it for a lockline release"
    );
    assert!(took < DELAY + BOUND, "{took:?}");
    assert!(peer.exits().success(), "the peer released and exited");
    assert_eq!(waiter.exits().code(), Some(0));
}

#[test]
fn an_etcdctl_release_holds_a_lock_delayed_waiter_back() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let server = vec!["--etcd".to_owned(), cluster.endpoints().join(",")];
    // etcdctl gives its command no standard input: the command holds until
    // a file appears, then exits, and etcdctl unlocks.
    let dir = tempfile::tempdir().expect("temporary directory");
    let done = dir.path().join("done");
    let hold = format!("echo held; while [ ! -e '{}' ]; do sleep 0.02; done", done.display());
    let mut command = cluster.etcdctl(&cluster.endpoints());
    command.args(["lock", "peers/etcdctl", "--", "sh", "-c", &hold]);
    let peer = Running::spawn("etcdctl lock", command);
    assert_eq!(peer.stdout_line(), "held");
    held_back_after_a_peer_release(&server, "peers/etcdctl", peer, 2, |_| {
        std::fs::write(&done, b"").expect("tell the command to end");
    });
}

#[test]
fn a_kazoo_release_holds_a_lock_delayed_waiter_back() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let server = vec!["--zookeeper".to_owned(), ensemble.connect_string()];
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../backends/zookeeper/tests/kazoo/hold_lock.py"
    );
    let mut command = Command::new("/usr/bin/python3");
    command
        .args([script, &ensemble.connect_string(), "/peers/kazoo", "lock"])
        .stdin(Stdio::piped());
    let peer = Running::spawn("kazoo Lock", command);
    assert!(peer.stdout_line().starts_with("held "), "kazoo did not take the lock");
    held_back_after_a_peer_release(&server, "peers/kazoo", peer, 2, Running::close_stdin);
}

#[test]
fn a_redis_py_release_holds_a_lock_delayed_waiter_back() {
    let redis = RedisServer::start_with(&RedisOptions {
        keyspace_events: "Kgx".into(),
        ..RedisOptions::default()
    })
    .expect("start redis");
    let server = vec!["--redis".to_owned(), redis.url()];
    let driver = r#"
import sys, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
lock = r.lock(sys.argv[2], timeout=60)
lock.acquire(blocking=True)
print("held", flush=True)
sys.stdin.read()
lock.release()
"#;
    let mut command = Command::new("/usr/bin/python3");
    command
        .args(["-c", driver, &redis.port().to_string(), "peers/redis-py"])
        .stdin(Stdio::piped());
    let peer = Running::spawn("redis-py Lock", command);
    assert_eq!(peer.stdout_line(), "held");
    // redis-py's lock is the plain key, not an entry of the queue: the
    // queue shows the lockline waiter alone.
    held_back_after_a_peer_release(&server, "peers/redis-py", peer, 1, Running::close_stdin);
}
