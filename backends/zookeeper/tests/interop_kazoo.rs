//! Interop with kazoo (Debian `python3-kazoo`): a kazoo `Lock` and lockline
//! exclude each other on the same path, in both directions.

use std::process::Command;
use std::time::Duration;

use lockline::conformance::{bounded, spawn_queued};
use lockline::Client;
use lockline_testkit::{LineChild, ZkEnsemble};
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

/// Debian's interpreter, the one `python3-kazoo` installs into.
const PYTHON: &str = "/usr/bin/python3";

/// The kazoo helper holding a kazoo `Lock` on `path` until its stdin closes.
fn kazoo_lock(ensemble: &ZkEnsemble, path: &str) -> LineChild {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kazoo/hold_lock.py");
    let mut command = Command::new(PYTHON);
    command.args([script, &ensemble.connect_string(), path]);
    LineChild::spawn(command).expect("start the kazoo helper")
}

/// Closes kazoo's stdin: it releases the lock and exits.
fn kazoo_release(kazoo: &mut LineChild) {
    kazoo.close_stdin();
    assert_eq!(kazoo.line(Duration::from_secs(10)).as_deref(), Some("released"));
    kazoo.wait().expect("kazoo exits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_waits_while_kazoo_holds() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let mut kazoo = kazoo_lock(&ensemble, "/interop/a");
    let held = kazoo.line(Duration::from_secs(20)).expect("kazoo holds the lock");
    assert!(held.starts_with("held ") && held.contains("__lock__"), "{held}");

    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let mutex = session.mutex("interop/a").expect("mutex");
    assert!(
        mutex.try_lock().await.expect("try_lock").is_none(),
        "kazoo's lock was ignored"
    );
    let waiter = spawn_queued(&client, async move { mutex.lock().await }).await;
    assert!(!waiter.is_finished());
    kazoo_release(&mut kazoo);
    let guard = bounded("lockline takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(guard.is_held());
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_waits_while_lockline_holds() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let guard = session.mutex("interop/b").expect("mutex").lock().await.expect("lock");

    let side = zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("side client");
    let (_, _, queued) = side.get_and_watch_children("/interop/b").await.expect("watch");
    let mut kazoo = kazoo_lock(&ensemble, "/interop/b");
    bounded("kazoo queues", queued.changed()).await;
    assert_eq!(side.list_children("/interop/b").await.expect("list").len(), 2);
    assert!(
        kazoo.line(Duration::from_millis(500)).is_none(),
        "kazoo took a held lock"
    );

    guard.release().await.expect("release");
    let held = kazoo
        .line(Duration::from_secs(10))
        .expect("kazoo gets the lock after lockline");
    assert!(held.starts_with("held "), "{held}");
    kazoo_release(&mut kazoo);
}
