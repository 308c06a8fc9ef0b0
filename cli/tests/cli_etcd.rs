//! The `lockline` program against a real etcd: commands run under the lock
//! with its fencing token, and timeouts and errors give their exit statuses.

use std::process::Command;

use lockline::Client;
use lockline_etcd::Etcd;
use lockline_testkit::{free_port, EtcdCluster};

fn lockline(cluster: &EtcdCluster) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockline"));
    command.args(["lock", "--etcd", &cluster.endpoints().join(",")]);
    command
}

#[test]
fn a_command_runs_under_the_lock_with_its_token() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let output = lockline(&cluster)
        .args(["cmd/lock", "sh", "-c", "echo token=$LOCKLINE_TOKEN; exit 7"])
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // With a command, standard output is the command's alone; the key is on
    // standard error.
    let token: u64 = stdout
        .strip_prefix("token=")
        .and_then(|t| t.trim_end().parse().ok())
        .unwrap_or_else(|| panic!("not only the token in {stdout:?}"));
    assert!(token > 0);
    assert!(
        stderr.contains(&format!("with fencing token {token}")) && stderr.contains("holding cmd/lock/"),
        "{stderr}"
    );
    assert_eq!(output.status.code(), Some(7), "the command's status is passed on");
    // Released afterwards: a second run gets it at once.
    let again = lockline(&cluster)
        .args(["--timeout", "5", "cmd/lock", "true"])
        .output()
        .expect("run");
    assert!(again.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_bad_input_have_their_exit_statuses() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let session = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let guard = session.mutex("busy").expect("mutex").lock().await.expect("lock");
    let timed_out = lockline(&cluster)
        .args(["--timeout", "0.3", "busy", "true"])
        .output()
        .expect("run");
    assert_eq!(timed_out.status.code(), Some(124));
    let bad_name = lockline(&cluster).args(["a//b", "true"]).output().expect("run");
    assert_eq!(bad_name.status.code(), Some(123));
    assert!(String::from_utf8_lossy(&bad_name.stderr).contains("invalid name"));
    let port = free_port().expect("port");
    let unreachable = Command::new(env!("CARGO_BIN_EXE_lockline"))
        .args(["lock", "--etcd", &format!("http://127.0.0.1:{port}"), "x", "true"])
        .output()
        .expect("run");
    assert_eq!(unreachable.status.code(), Some(122));
    assert!(String::from_utf8_lossy(&unreachable.stderr).contains("unavailable"));
    guard.release().await.expect("release");
}
