//! `lockline` on etcd with a role on `locks/` only, as `etcdctl lock` needs:
//! by default everything it writes for `locks/a` (entries, abandoned-attempt
//! and hand-over markers) is inside that grant, so it locks, and a
//! lock-delayed waiter is handed the lock at once on a release; markers
//! moved with `--marker-prefix` need that prefix granted too.

use std::process::Stdio;
use std::time::{Duration, Instant};

use lockline_testkit::EtcdCluster;

mod support;
use support::{eventually, lockline, Running};

const ROOT_PASSWORD: &str = "root-cli-pw-2e8";
const ALICE_PASSWORD: &str = "alice-cli-pw-7b3";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A cluster with auth on where `alice` has read-write on the prefix
/// `locks/` and nothing else; the server flags that log in as her.
fn locked_down() -> (EtcdCluster, Vec<String>) {
    let cluster = EtcdCluster::start().expect("start etcd");
    let endpoints = cluster.endpoints();
    for args in [
        vec!["user", "add", "root", "--new-user-password", ROOT_PASSWORD],
        vec!["role", "add", "lockers"],
        vec![
            "role",
            "grant-permission",
            "lockers",
            "--prefix=true",
            "readwrite",
            "locks/",
        ],
        vec!["user", "add", "alice", "--new-user-password", ALICE_PASSWORD],
        vec!["user", "grant-role", "alice", "lockers"],
        vec!["auth", "enable"],
    ] {
        let out = cluster.etcdctl(&endpoints).args(&args).output().expect("etcdctl");
        assert!(out.status.success(), "etcdctl {args:?}: {}", text(&out.stderr));
    }
    let server = vec![
        "--etcd".to_owned(),
        endpoints.join(","),
        "--user".to_owned(),
        format!("alice:{ALICE_PASSWORD}"),
    ];
    (cluster, server)
}

/// How many entries `list` shows for `name`.
fn listed(server: &[String], name: &str) -> usize {
    let out = lockline("list", server).arg(name).output().expect("run list");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout).lines().count()
}

#[test]
fn a_role_on_the_parent_prefix_is_enough_to_lock_and_hand_over() {
    let (cluster, server) = locked_down();
    let mut command = lockline("lock", &server);
    command
        .args(["locks/a", "sh", "-c", "read line; exit 0"])
        .stdin(Stdio::piped());
    let mut holder = Running::spawn("holder", command);
    let (key, _) = holder.holding();
    assert!(key.starts_with("locks/a/"), "{key}");

    // A release that looked like a loss would hold this waiter back a
    // minute, past every bound here.
    let mut command = lockline("lock", &server);
    command.args(["--lock-delay", "60", "locks/a", "true"]);
    let mut waiter = Running::spawn("waiter", command);
    eventually("the waiter queues", || listed(&server, "locks/a") == 2);

    let released_at = Instant::now();
    holder.close_stdin();
    waiter.holding();
    let took = released_at.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the release held the waiter back ({took:?})"
    );
    assert_eq!(holder.exits().code(), Some(0), "the holder released");
    assert_eq!(waiter.exits().code(), Some(0), "the waiter ran its command");
    assert_eq!(listed(&server, "locks/a"), 0);

    // What the two sessions wrote, seen as root: all of it under locks/,
    // nothing left under locks/a/ (where etcdctl would see a contender).
    let out = cluster
        .etcdctl(&cluster.endpoints())
        .arg(format!("--user=root:{ROOT_PASSWORD}"))
        .args(["get", "--prefix", "--keys-only", ""])
        .output()
        .expect("etcdctl get");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let keys: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(keys.iter().all(|k| !k.starts_with("locks/a/")), "{keys:?}");
}

#[test]
fn markers_moved_with_marker_prefix_need_that_prefix_granted() {
    let (_cluster, server) = locked_down();
    let out = lockline("lock", &server)
        .args(["--marker-prefix", "__lockline_abandoned__/", "locks/b", "true"])
        .output()
        .expect("run lockline");
    assert_eq!(out.status.code(), Some(121), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("permission denied") && stderr.contains("--marker-prefix"),
        "{stderr}"
    );

    let out = lockline("lock", &server)
        .args(["--marker-prefix", "locks/markers/", "locks/b", "true"])
        .output()
        .expect("run lockline");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}
