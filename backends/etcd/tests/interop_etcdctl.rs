//! Interop with etcd's own client: `etcdctl lock` and lockline exclude each
//! other on the same name, in both directions (the Go `concurrency` layout).

use std::time::Duration;

use lockline::conformance::{bounded, spawn_queued};
use lockline::Client;
use lockline_etcd::etcd_client::{EventType, WatchOptions};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, LineChild};

/// `etcdctl lock NAME` (or `elect ...`) running in the background.
fn run_etcdctl(cluster: &EtcdCluster, args: &[&str]) -> LineChild {
    let mut command = cluster.etcdctl(&cluster.endpoints());
    command.args(args).stderr(std::process::Stdio::null());
    LineChild::spawn(command).expect("start etcdctl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_waits_while_etcdctl_holds() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut etcdctl = run_etcdctl(&cluster, &["lock", "interop/a"]);
    let key = etcdctl.line(Duration::from_secs(10)).expect("etcdctl holds the lock");
    assert!(key.starts_with("interop/a/"), "{key}");

    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let mutex = session.mutex("interop/a").expect("mutex");
    assert!(
        mutex.try_lock().await.expect("try_lock").is_none(),
        "etcdctl's lock was ignored"
    );
    let contenders = mutex.contenders().await.expect("list");
    assert_eq!(contenders.first().map(|e| e.key.as_str()), Some(key.as_str()));

    let waiter = spawn_queued(&client, async move { mutex.lock().await }).await;
    assert!(!waiter.is_finished());
    etcdctl.signal_and_wait(libc::SIGINT).expect("etcdctl exits");
    let guard = bounded("lockline takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(guard.is_held());
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_waits_while_lockline_holds() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let guard = session.mutex("interop/b").expect("mutex").lock().await.expect("lock");

    // Watch the lock's prefix to see etcdctl queue behind us.
    let mut raw = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    let mut watch = raw
        .watch("interop/b/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    let etcdctl = run_etcdctl(&cluster, &["lock", "interop/b"]);
    bounded("etcdctl queues", async {
        loop {
            let response = watch.message().await.expect("watch").expect("stream");
            if response.events().iter().any(|e| e.event_type() == EventType::Put) {
                break;
            }
        }
    })
    .await;
    assert!(
        etcdctl.line(Duration::from_millis(300)).is_none(),
        "etcdctl took a held lock"
    );

    guard.release().await.expect("release");
    let key = etcdctl
        .line(Duration::from_secs(10))
        .expect("etcdctl gets the lock after us");
    assert!(key.starts_with("interop/b/"), "{key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_sees_the_leader_etcdctl_elect_made() {
    use futures::StreamExt;
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut etcdctl = run_etcdctl(&cluster, &["elect", "interop/election", "from-etcdctl"]);
    let key = etcdctl.line(Duration::from_secs(10)).expect("etcdctl leads");
    assert!(key.starts_with("interop/election/"), "{key}");

    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let election = session.election("interop/election").expect("election");
    let leader = election.leader().await.expect("leader").expect("a leader");
    assert_eq!(leader.value(), b"from-etcdctl");
    assert_eq!(leader.key(), key);
    let mut changes = Box::pin(election.observe());
    let seen = bounded("observe", changes.next())
        .await
        .expect("item")
        .expect("observe");
    assert_eq!(seen.map(|l| l.value().to_vec()), Some(b"from-etcdctl".to_vec()));

    // lockline's candidate waits behind etcdctl's leader, and leads after it.
    let candidate = election.clone();
    let campaign = tokio::spawn(async move { candidate.campaign(b"from-lockline").await });
    etcdctl.signal_and_wait(libc::SIGINT).expect("etcdctl exits");
    let leadership = bounded("lockline leads", campaign)
        .await
        .expect("task")
        .expect("campaign");
    let mut seen = bounded("observe", changes.next())
        .await
        .expect("item")
        .expect("observe");
    if seen.is_none() {
        seen = bounded("observe", changes.next())
            .await
            .expect("item")
            .expect("observe");
    }
    assert_eq!(seen.map(|l| l.value().to_vec()), Some(b"from-lockline".to_vec()));
    leadership.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_sees_lockline_s_leader() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let leadership = session
        .election("interop/observed")
        .expect("election")
        .campaign(b"lockline-leader")
        .await
        .expect("campaign");
    let observer = run_etcdctl(&cluster, &["elect", "-l", "interop/observed"]);
    let key = observer
        .line(Duration::from_secs(10))
        .expect("etcdctl prints the leader's key");
    assert_eq!(key, leadership.key());
    let value = observer
        .line(Duration::from_secs(10))
        .expect("etcdctl prints the leader's value");
    assert_eq!(value, "lockline-leader");
    leadership.proclaim(b"lockline-leader-2").await.expect("proclaim");
    let mut lines = Vec::new();
    while let Some(line) = observer.line(Duration::from_secs(10)) {
        lines.push(line.clone());
        if line == "lockline-leader-2" {
            break;
        }
    }
    assert_eq!(
        lines.last().map(String::as_str),
        Some("lockline-leader-2"),
        "etcdctl saw {lines:?}"
    );
    leadership.resign().await.expect("resign");
}

/// etcd's server-side lock API (`Lock` RPC, what `etcdctl lock` and Go's
/// `v3lock` clients call) keeps the Go layout: it and lockline exclude each
/// other, in both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_side_lock_api_and_lockline_exclude_each_other() {
    use lockline_etcd::etcd_client::LockOptions;
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut raw = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    let lease = raw.lease_grant(60, None).await.expect("lease").id();
    let held = raw
        .lock("interop/api", Some(LockOptions::new().with_lease(lease)))
        .await
        .expect("server-side lock");
    let key = String::from_utf8(held.key().to_vec()).expect("utf-8 key");
    assert_eq!(key, format!("interop/api/{lease:x}"));

    // The server's holder blocks lockline.
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let mutex = session.mutex("interop/api").expect("mutex");
    assert!(
        mutex.try_lock().await.expect("try_lock").is_none(),
        "the server's lock was ignored"
    );
    let waiter = spawn_queued(&client, async move { mutex.lock().await }).await;
    raw.unlock(key).await.expect("server-side unlock");
    let guard = bounded("lockline takes over", waiter)
        .await
        .expect("task")
        .expect("lock");

    // lockline's holder blocks the server's lock until it releases.
    let queued = {
        let mut watcher = raw.clone();
        let mut stream = watcher
            .watch("interop/api/", Some(WatchOptions::new().with_prefix()))
            .await
            .expect("watch");
        async move {
            loop {
                let response = stream.message().await.expect("watch").expect("stream");
                if response.events().iter().any(|e| e.event_type() == EventType::Put) {
                    return;
                }
            }
        }
    };
    let mut locker = raw.clone();
    let server = tokio::spawn(async move {
        locker
            .lock("interop/api", Some(LockOptions::new().with_lease(lease)))
            .await
    });
    bounded("the server-side lock queues", queued).await;
    assert!(!server.is_finished(), "the server granted a held lock");
    guard.release().await.expect("release");
    let granted = bounded("the server-side lock is granted", server)
        .await
        .expect("task")
        .expect("server-side lock");
    assert_eq!(granted.key(), format!("interop/api/{lease:x}").as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_campaigns_behind_lockline_s_leader() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let leadership = session
        .election("interop/campaign")
        .expect("election")
        .campaign(b"lockline-leader")
        .await
        .expect("campaign");

    let mut raw = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    let mut watch = raw
        .watch("interop/campaign/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    let etcdctl = run_etcdctl(&cluster, &["elect", "interop/campaign", "from-etcdctl"]);
    bounded("etcdctl campaigns", async {
        loop {
            let response = watch.message().await.expect("watch").expect("stream");
            if response.events().iter().any(|e| e.event_type() == EventType::Put) {
                break;
            }
        }
    })
    .await;
    assert!(
        etcdctl.line(Duration::from_millis(300)).is_none(),
        "etcdctl leads beside lockline"
    );
    leadership.resign().await.expect("resign");
    let key = etcdctl
        .line(Duration::from_secs(10))
        .expect("etcdctl leads after lockline");
    assert!(key.starts_with("interop/campaign/"), "{key}");
}

/// `etcdctl lock` counts every key under the name's prefix, lockline's
/// lock-mode entries included: it waits behind one, and takes the lock once
/// an update removes it. The resource's value block, beside the name, does
/// not hold it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_waits_behind_a_lock_mode_entry() {
    use lockline::backend::{AppendRequest, Conflicts, EntryKind, QueueUpdate};
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let remote = session.backend_session();
    let entry = remote
        .append(&AppendRequest {
            dir: "interop/modes",
            kind: EntryKind::Dlm,
            attempt: "a1",
            value: b"EX granted",
            conflicts: Conflicts::All,
            nearest: 0,
        })
        .await
        .expect("append")
        .entry;
    let read = remote.read_queue("interop/modes").await.expect("read");
    let version = read.slots[0].version;

    let mut raw = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    let mut watch = raw
        .watch("interop/modes/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    let etcdctl = run_etcdctl(&cluster, &["lock", "interop/modes"]);
    bounded("etcdctl queues", async {
        loop {
            let response = watch.message().await.expect("watch").expect("stream");
            if response.events().iter().any(|e| e.event_type() == EventType::Put) {
                break;
            }
        }
    })
    .await;
    assert!(
        etcdctl.line(Duration::from_millis(300)).is_none(),
        "etcdctl took a lock a lock-mode entry holds"
    );

    // The holder leaves and writes the value block in one update.
    let left = remote
        .update_queue(&QueueUpdate {
            dir: "interop/modes",
            unchanged: &[(&entry, version)],
            present: &[],
            set: &[],
            delete: &[&entry],
            block: Some(b"lvb"),
        })
        .await
        .expect("update");
    assert!(left.is_some());
    let key = etcdctl
        .line(Duration::from_secs(10))
        .expect("etcdctl gets the lock once the entry is gone");
    assert!(key.starts_with("interop/modes/"), "{key}");
}
