//! Interop with kazoo (Debian `python3-kazoo`): kazoo's `Lock`, `ReadLock` and
//! `WriteLock` and lockline's exclude each other on the same path, in both
//! directions; lockline campaigns behind a kazoo `Election` leader; and a path
//! holding a kazoo `Semaphore` is refused, not shared.

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
    kazoo(ensemble, path, "lock")
}

/// The kazoo helper holding `recipe` (`lock`, `read`, `write`, `election`,
/// `semaphore`) on `path` until its stdin closes.
fn kazoo(ensemble: &ZkEnsemble, path: &str, recipe: &str) -> LineChild {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kazoo/hold_lock.py");
    let mut command = Command::new(PYTHON);
    command.args([script, &ensemble.connect_string(), path, recipe]);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_readers_share_with_and_writers_wait_behind_a_kazoo_read_lock() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let mut kazoo = kazoo(&ensemble, "/interop/rw-a", "read");
    let held = kazoo.line(Duration::from_secs(20)).expect("kazoo reads");
    assert!(held.contains("__rlock__"), "{held}");

    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let rwlock = session.rwlock("interop/rw-a").expect("rwlock");
    let reader = rwlock.try_read().await.expect("try_read").expect("readers share");
    reader.release().await.expect("release");
    assert!(
        rwlock.try_write().await.expect("try_write").is_none(),
        "kazoo's read lock was ignored by a writer"
    );
    let writer = spawn_queued(&client, async move { rwlock.write().await }).await;
    assert!(!writer.is_finished());
    kazoo_release(&mut kazoo);
    let guard = bounded("lockline writes", writer).await.expect("task").expect("write");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_readers_wait_behind_a_kazoo_write_lock() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let mut kazoo = kazoo(&ensemble, "/interop/rw-b", "write");
    let held = kazoo.line(Duration::from_secs(20)).expect("kazoo writes");
    assert!(held.contains("__lock__"), "{held}");

    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let rwlock = session.rwlock("interop/rw-b").expect("rwlock");
    assert!(
        rwlock.try_read().await.expect("try_read").is_none(),
        "kazoo's write lock was ignored by a reader"
    );
    let reader = spawn_queued(&client, async move { rwlock.read().await }).await;
    assert!(!reader.is_finished());
    kazoo_release(&mut kazoo);
    let guard = bounded("lockline reads", reader).await.expect("task").expect("read");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_read_and_write_locks_wait_while_lockline_writes() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let rwlock = session.rwlock("interop/rw-c").expect("rwlock");
    let side = zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("side client");

    for recipe in ["read", "write"] {
        let guard = rwlock.write().await.expect("write");
        let (_, _, queued) = side.get_and_watch_children("/interop/rw-c").await.expect("watch");
        let mut kazoo = kazoo(&ensemble, "/interop/rw-c", recipe);
        bounded("kazoo queues", queued.changed()).await;
        assert!(
            kazoo.line(Duration::from_millis(500)).is_none(),
            "kazoo's {recipe} lock was granted beside lockline's write lock"
        );
        guard.release().await.expect("release");
        let held = kazoo
            .line(Duration::from_secs(10))
            .expect("kazoo gets the lock after lockline");
        assert!(held.starts_with("held "), "{held}");
        kazoo_release(&mut kazoo);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_write_lock_waits_while_lockline_reads() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let guard = session
        .rwlock("interop/rw-d")
        .expect("rwlock")
        .read()
        .await
        .expect("read");
    let side = zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("side client");
    let (_, _, queued) = side.get_and_watch_children("/interop/rw-d").await.expect("watch");
    let mut kazoo = kazoo(&ensemble, "/interop/rw-d", "write");
    bounded("kazoo queues", queued.changed()).await;
    assert!(
        kazoo.line(Duration::from_millis(500)).is_none(),
        "kazoo's write lock was granted beside lockline's read lock"
    );
    guard.release().await.expect("release");
    let held = kazoo
        .line(Duration::from_secs(10))
        .expect("kazoo writes after lockline");
    assert!(held.starts_with("held "), "{held}");
    kazoo_release(&mut kazoo);
}

/// kazoo's `Election` is a kazoo `Lock` without Curator's patterns: lockline
/// sees its leader and queues behind it (the other direction is not safe:
/// kazoo's election cannot see lockline's candidates, see docs/interop.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_campaigns_behind_a_kazoo_election_leader() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let mut kazoo = kazoo(&ensemble, "/interop/election", "election");
    assert_eq!(kazoo.line(Duration::from_secs(20)).as_deref(), Some("leader"));

    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let election = session.election("interop/election").expect("election");
    let leader = election.leader().await.expect("leader").expect("a leader");
    assert_eq!(leader.value(), b"kazoo");
    let candidate = election.clone();
    let campaign = spawn_queued(&client, async move { candidate.campaign(b"from-lockline").await }).await;
    assert!(!campaign.is_finished());
    kazoo_release(&mut kazoo);
    let leadership = bounded("lockline leads", campaign)
        .await
        .expect("task")
        .expect("campaign");
    leadership.resign().await.expect("resign");
}

/// A kazoo `Semaphore`'s leases carry no sequence number lockline could
/// queue by: a path holding one is refused, where lockline used to grant a
/// lock beside kazoo's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_refuses_a_path_holding_a_kazoo_semaphore() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let mut kazoo = kazoo(&ensemble, "/interop/kazoo-sem", "semaphore");
    let held = kazoo.line(Duration::from_secs(20)).expect("kazoo holds a lease");
    assert!(held.starts_with("held /interop/kazoo-sem/"), "{held}");

    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let mutex = session.mutex("interop/kazoo-sem").expect("mutex");
    match mutex.lock_timeout(Duration::from_secs(10)).await {
        Err(lockline::Error::InvalidName { reason, .. }) => {
            assert!(reason.contains("foreign recipe"), "{reason}")
        }
        other => panic!("a lock beside kazoo's semaphore must be refused, got {other:?}"),
    }
    let semaphore = session.semaphore("interop/kazoo-sem", 2).expect("semaphore");
    assert!(matches!(
        semaphore.try_acquire().await,
        Err(lockline::Error::InvalidName { .. })
    ));
    session.flush().await;
    let side = zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("side client");
    assert_eq!(
        side.list_children("/interop/kazoo-sem").await.expect("list").len(),
        1,
        "lockline left an entry behind"
    );
    kazoo_release(&mut kazoo);
}
