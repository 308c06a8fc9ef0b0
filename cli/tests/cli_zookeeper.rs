//! The `lockline` program against a real ZooKeeper: a killed holder is
//! replaced within the session timeout + 1 s.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions};
use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_replaced_within_the_session_timeout_plus_one_second() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let timeout = Duration::from_secs(2);
    let mut holder = Command::new(env!("CARGO_BIN_EXE_lockline"))
        .args([
            "lock",
            "--zookeeper",
            &ensemble.connect_string(),
            "--ttl",
            "2",
            "killed/lock",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the holder");
    let mut first = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("the holder prints its node");
    assert!(first.starts_with("/killed/lock/_c_"), "{first:?}");

    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client
        .session_with(SessionOptions::new().with_ttl(Duration::from_secs(5)))
        .await
        .expect("session");
    let mutex = session.mutex("killed/lock").expect("mutex");
    let waits = client.stats().waits;
    let waiter = tokio::spawn(async move { mutex.lock().await });
    client.wait_for_stats(|s| s.waits > waits).await;

    holder.kill().expect("SIGKILL the holder");
    let killed_at = Instant::now();
    holder.wait().expect("reap");
    let guard = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    let took = killed_at.elapsed();
    assert!(took <= timeout + Duration::from_secs(1), "took {took:?} after the kill");
    guard.release().await.expect("release");
}
