//! Interop with etcd's own client: `etcdctl lock` and lockline exclude each
//! other on the same name, in both directions (the Go `concurrency` layout).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lockline::conformance::bounded;
use lockline::Client;
use lockline_etcd::etcd_client::{EventType, WatchOptions};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

/// `etcdctl lock NAME` running in the background, its stdout lines on a channel.
struct EtcdctlLock {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl EtcdctlLock {
    fn start(cluster: &EtcdCluster, name: &str) -> Self {
        let mut command = cluster.etcdctl(&cluster.endpoints());
        let mut child = command
            .args(["lock", name])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcdctl lock");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        EtcdctlLock { child, lines }
    }

    /// The key etcdctl printed once it held the lock.
    fn held_key(&self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// Stops etcdctl the way a user does (SIGINT): it releases the lock.
    fn interrupt(&mut self) {
        let pid = libc_pid(self.child.id());
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGINT) };
        self.child.wait().expect("etcdctl exits");
    }
}

impl Drop for EtcdctlLock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn libc_pid(pid: u32) -> libc::pid_t {
    libc::pid_t::try_from(pid).expect("pid fits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_waits_while_etcdctl_holds() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut etcdctl = EtcdctlLock::start(&cluster, "interop/a");
    let key = etcdctl
        .held_key(Duration::from_secs(10))
        .expect("etcdctl holds the lock");
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

    let waits = client.stats().waits;
    let waiter = tokio::spawn(async move { mutex.lock().await });
    client.wait_for_stats(|s| s.waits > waits).await;
    assert!(!waiter.is_finished());
    etcdctl.interrupt();
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
    let etcdctl = EtcdctlLock::start(&cluster, "interop/b");
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
        etcdctl.held_key(Duration::from_millis(300)).is_none(),
        "etcdctl took a held lock"
    );

    guard.release().await.expect("release");
    let key = etcdctl
        .held_key(Duration::from_secs(10))
        .expect("etcdctl gets the lock after us");
    assert!(key.starts_with("interop/b/"), "{key}");
}

/// `etcdctl elect NAME [VALUE]` (or `-l NAME` to observe), stdout lines on a channel.
fn etcdctl_elect(cluster: &EtcdCluster, args: &[&str]) -> EtcdctlLock {
    let mut command = cluster.etcdctl(&cluster.endpoints());
    let mut child = command
        .arg("elect")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcdctl elect");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    EtcdctlLock { child, lines }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_sees_the_leader_etcdctl_elect_made() {
    use futures::StreamExt;
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut etcdctl = etcdctl_elect(&cluster, &["interop/election", "from-etcdctl"]);
    let key = etcdctl.held_key(Duration::from_secs(10)).expect("etcdctl leads");
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
    etcdctl.interrupt();
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
    let observer = etcdctl_elect(&cluster, &["-l", "interop/observed"]);
    let key = observer
        .held_key(Duration::from_secs(10))
        .expect("etcdctl prints the leader's key");
    assert_eq!(key, leadership.key());
    let value = observer
        .held_key(Duration::from_secs(10))
        .expect("etcdctl prints the leader's value");
    assert_eq!(value, "lockline-leader");
    leadership.proclaim(b"lockline-leader-2").await.expect("proclaim");
    let mut lines = Vec::new();
    while let Some(line) = observer.held_key(Duration::from_secs(10)) {
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
