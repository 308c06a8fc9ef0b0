//! A contender process paused (SIGSTOP) past its session's timeout learns on
//! resuming that its *session* was lost (`SessionLost`), not that someone
//! deleted its entry (`LockLost`): it asks the server, and counts its own loss
//! deadline, before choosing.

use std::process::Command;
use std::time::Duration;

use lockline::conformance::bounded;
use lockline::Client;
use lockline_testkit::{LineChild, ZkEnsemble};
use lockline_zookeeper::zookeeper_client::{self as zk, EventType};
use lockline_zookeeper::ZooKeeper;

mod support;
use support::probe;

fn spawn(ensemble: &ZkEnsemble, name: &str, role: &str) -> LineChild {
    let mut command = Command::new(probe());
    command.args([&ensemble.connect_string(), name, role, "2000"]);
    LineChild::spawn(command).expect("start the probe")
}

/// Resolves once the only node under `dir` is deleted.
async fn deleted(side: &zk::Client, dir: &str) {
    let children = side.list_children(dir).await.expect("list");
    assert_eq!(children.len(), 1, "{dir}: {children:?}");
    let (stat, watcher) = side
        .check_and_watch_stat(&format!("{dir}/{}", children[0]))
        .await
        .expect("watch");
    assert!(stat.is_some());
    assert_eq!(watcher.changed().await.event_type, EventType::NodeDeleted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_and_waiter_learn_their_session_was_lost() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let side = zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("side client");
    let holder = Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session()
        .await
        .expect("session");
    let first = holder.mutex("paused/queue").expect("mutex").lock().await.expect("lock");

    let waiter = spawn(&ensemble, "paused/queue", "wait");
    assert_eq!(waiter.line(Duration::from_secs(20)).as_deref(), Some("queued"));
    let held = spawn(&ensemble, "paused/held", "hold");
    assert_eq!(held.line(Duration::from_secs(20)).as_deref(), Some("held"));

    // Frozen past the 2 s session timeout: the server expires both sessions
    // and deletes their nodes while neither process can notice.
    let queue = side.list_children("/paused/queue").await.expect("list");
    assert_eq!(queue.len(), 2, "holder and waiter queued: {queue:?}");
    let waiter_node = queue
        .iter()
        .map(|node| format!("/paused/queue/{node}"))
        .find(|path| path != first.key())
        .expect("the waiter's node");
    let (_, waiter_gone) = side
        .check_and_watch_stat(&waiter_node)
        .await
        .expect("watch the waiter's node");
    waiter.signal(libc::SIGSTOP).expect("pause the waiter");
    held.signal(libc::SIGSTOP).expect("pause the holder");
    bounded("the holder's session expires", deleted(&side, "/paused/held")).await;
    let event = bounded("the waiter's session expires", waiter_gone.changed()).await;
    assert_eq!(event.event_type, EventType::NodeDeleted);
    waiter.signal(libc::SIGCONT).expect("resume the waiter");
    held.signal(libc::SIGCONT).expect("resume the holder");

    assert_eq!(
        held.line(Duration::from_secs(20)).as_deref(),
        Some("release: SessionLost"),
        "a paused holder whose session expired"
    );
    assert_eq!(
        waiter.line(Duration::from_secs(20)).as_deref(),
        Some("lock: SessionLost"),
        "a paused waiter whose session expired"
    );
    first.release().await.expect("release");
}
