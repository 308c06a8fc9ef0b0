//! Mutexes, read/write locks and elections of one name share one queue: a
//! reader waits for a mutex holder, an election leader and an `etcdctl lock`
//! holder of its name (etcd readers read every entry of the name, not only
//! writers'), as it does on the memory backend.

use std::time::Duration;

use lockline::Client;
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_waits_for_a_mutex_holder_of_the_same_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let holder = client.session().await.expect("session");
    let reader = client.session().await.expect("session");
    let guard = holder.mutex("mix/rw").expect("mutex").lock().await.expect("lock");
    let read = reader.rwlock("mix/rw").expect("rwlock").try_read().await;
    let granted = matches!(read, Ok(Some(_)));
    assert!(
        !granted,
        "a reader was granted while mutex holder {} (token {}) held the name: {read:?}",
        guard.key(),
        guard.token()
    );
    drop(read);
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_waits_for_an_election_leader_of_the_same_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let leader = client.session().await.expect("session");
    let reader = client.session().await.expect("session");
    let leadership = leader
        .election("mix/el")
        .expect("election")
        .campaign(b"me")
        .await
        .expect("campaign");
    let read = reader.rwlock("mix/el").expect("rwlock").try_read().await;
    assert!(
        !matches!(read, Ok(Some(_))),
        "a reader was granted beside leader {}: {read:?}",
        leadership.key()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_waits_for_an_etcdctl_lock_holder() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut holder = cluster
        .etcdctl(&cluster.endpoints())
        .args(["lock", "mix/go", "sleep", "30"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("etcdctl lock");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let probe = client.session().await.expect("session");
    let m = probe.mutex("mix/go").expect("mutex");
    // Wait until etcdctl holds.
    let mut held = false;
    for _ in 0..100 {
        if !m.contenders().await.expect("list").is_empty() {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(held, "etcdctl never took the lock");
    let read = probe.rwlock("mix/go").expect("rwlock").try_read().await;
    let granted = matches!(read, Ok(Some(_)));
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(
        !granted,
        "a reader was granted while etcdctl lock held the name: {read:?}"
    );
}

/// Control: the same mixes on the memory backend (which reads every entry
/// kind that can block a reader) are refused or wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_memory_backend_too_a_reader_waits_for_a_mutex_and_refuses_a_permit() {
    let client = Client::new(lockline::MemoryBackend::new());
    let holder = client.session().await.expect("session");
    let reader = client.session().await.expect("session");
    let guard = holder.mutex("mix/rw").expect("mutex").lock().await.expect("lock");
    let read = reader.rwlock("mix/rw").expect("rwlock").try_read().await;
    assert!(matches!(read, Ok(None)), "{read:?}");
    guard.release().await.expect("release");
    let permit = holder
        .semaphore("mix/s", 1)
        .expect("semaphore")
        .acquire()
        .await
        .expect("permit");
    let read = reader.rwlock("mix/s").expect("rwlock").try_read().await;
    assert!(matches!(read, Err(lockline::Error::InvalidName { .. })), "{read:?}");
    permit.release().await.expect("release");
}
