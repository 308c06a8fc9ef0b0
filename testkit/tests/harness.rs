//! The harness itself: each kind of server starts with 1 and 3 members, serves
//! its own CLI, and keeps serving after a member of 3 is killed.

use std::process::Output;

use lockline_testkit::{EtcdCluster, ZkEnsemble, ZkOptions};

fn run(mut command: std::process::Command) -> Output {
    let output = command.output().expect("run the server's CLI");
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn etcd_put_get(cluster: &EtcdCluster, endpoints: &[String], key: &str, value: &str) {
    let mut put = cluster.etcdctl(endpoints);
    put.args(["put", key, value]);
    run(put);
    let mut get = cluster.etcdctl(endpoints);
    get.args(["get", key, "--print-value-only"]);
    assert_eq!(stdout(&run(get)).trim(), value);
}

#[test]
fn etcd_single_member_serves_its_cli() {
    let cluster = EtcdCluster::start().expect("start etcd");
    etcd_put_get(&cluster, &cluster.endpoints(), "harness/one", "v1");
    assert!(cluster
        .metrics(0)
        .is_some_and(|m| m.contains("etcd_debugging_mvcc_put_total")));
}

#[test]
fn etcd_three_members_survive_a_killed_member() {
    let mut cluster = EtcdCluster::start_cluster(3).expect("start etcd");
    let all = cluster.endpoints();
    etcd_put_get(&cluster, &all, "harness/three", "before");
    let pid = cluster.member(0).pid().expect("running");
    cluster.member(0).kill().expect("kill n1");
    assert!(!cluster.member(0).is_running());
    // The process is really gone.
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    let rest = vec![cluster.endpoint(1), cluster.endpoint(2)];
    let mut get = cluster.etcdctl(&rest);
    get.args(["get", "harness/three", "--print-value-only"]);
    assert_eq!(stdout(&run(get)).trim(), "before");
    etcd_put_get(&cluster, &rest, "harness/three", "after");
}

#[test]
fn etcd_paused_member_resumes() {
    let mut cluster = EtcdCluster::start().expect("start etcd");
    cluster.member(0).pause().expect("pause");
    let mut get = cluster.etcdctl(&cluster.endpoints());
    get.args(["get", "harness/paused"]);
    assert!(
        !get.output().expect("run etcdctl").status.success(),
        "a paused server answered"
    );
    cluster.member(0).resume().expect("resume");
    etcd_put_get(&cluster, &cluster.endpoints(), "harness/paused", "thawed");
}

fn zk_create_get(ensemble: &ZkEnsemble, server: &str, path: &str, value: &str) {
    let mut create = ensemble.cli(server);
    create.args(["create", path, value]);
    run(create);
    zk_get(ensemble, server, path, value);
}

fn zk_get(ensemble: &ZkEnsemble, server: &str, path: &str, value: &str) {
    let mut get = ensemble.cli(server);
    get.args(["get", path]);
    let out = stdout(&run(get));
    assert!(
        out.lines().any(|line| line.trim() == value),
        "get {path} printed {out:?}"
    );
}

#[test]
fn zookeeper_standalone_serves_its_cli() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    assert_eq!(ensemble.mode(0).as_deref(), Some("standalone"));
    zk_create_get(&ensemble, &ensemble.address(0), "/harness-one", "v1");
    assert!(ensemble
        .four_letter(0, "mntr")
        .is_some_and(|m| m.contains("zk_watch_count")));
}

#[test]
fn zookeeper_three_members_survive_a_killed_member() {
    let mut ensemble = ZkEnsemble::start_with(3, &ZkOptions::default()).expect("start ZooKeeper");
    let modes: Vec<_> = (0..3).filter_map(|i| ensemble.mode(i)).collect();
    assert_eq!(modes.iter().filter(|m| *m == "leader").count(), 1, "modes: {modes:?}");
    let leader = (0..3)
        .find(|&i| ensemble.mode(i).as_deref() == Some("leader"))
        .expect("a leader");
    let other = (leader + 1) % 3;
    zk_create_get(&ensemble, &ensemble.address(other), "/harness-three", "before");
    ensemble.member(leader).kill().expect("kill the leader");
    // The two left elect a new leader among themselves.
    let new_leader = ensemble.wait_leader().expect("a new leader");
    assert_ne!(new_leader, leader);
    ensemble.wait_serving(other).expect("a survivor serves");
    zk_get(&ensemble, &ensemble.address(other), "/harness-three", "before");
}

#[test]
fn a_panicking_test_still_stops_its_servers() {
    let (pid_tx, pid_rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let mut cluster = EtcdCluster::start().expect("start etcd");
        let dir = format!("{cluster:?}");
        pid_tx
            .send((cluster.member(0).pid().expect("running"), dir))
            .expect("send");
        panic!("a test failing while it holds a cluster");
    })
    .join();
    assert!(outcome.is_err(), "the thread was meant to panic");
    let (pid, debug) = pid_rx.recv().expect("pid");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "etcd {pid} outlived the panic"
    );
    let dir = debug
        .split("dir: \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the cluster's directory in its Debug output");
    assert!(!std::path::Path::new(dir).exists(), "{dir} outlived the panic");
}
