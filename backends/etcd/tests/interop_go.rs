//! Interop with etcd's Go `concurrency` package (Debian
//! `golang-etcd-server-dev`), built here from `tests/go/lockpeer` in GOPATH
//! mode, offline: a Go `Mutex` / `Election` and lockline's exclude each other on
//! the same name, in both directions, with the trailing-slash names of etcd's Go
//! examples (`NewMutex(s, "/my-lock/")`, keys `/my-lock//<lease>`); and which
//! revision a Go holder must hand to a resource fenced with lockline's tokens.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use lockline::conformance::{bounded, spawn_queued};
use lockline::Client;
use lockline_etcd::etcd_client::{self, EventType, WatchOptions};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, LineChild};

/// Builds the Go peer once per test run, offline, against Debian's etcd sources.
fn lockpeer() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("go-lockpeer");
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/go/lockpeer/main.go");
        lockline_testkit::go_build(source.as_ref(), &out).expect("build the Go peer (Debian golang-go)");
        out
    })
}

/// The Go peer holding a `Mutex` (`mutex`) or leading an `Election` (`elect`)
/// until its stdin closes.
fn go_peer(cluster: &EtcdCluster, args: &[&str]) -> LineChild {
    let mut command = Command::new(lockpeer());
    command.arg(args[0]).arg(cluster.endpoints().join(",")).args(&args[1..]);
    LineChild::spawn(command).expect("start the Go peer")
}

/// `held KEY HEADER_REVISION CREATE_REVISION` (or `leader ...`), split.
fn held_line(line: &str, word: &str) -> (String, i64, i64) {
    let parts: Vec<&str> = line.split(' ').collect();
    assert_eq!((parts.len(), parts[0]), (4, word), "unexpected line {line:?}");
    (
        parts[1].to_owned(),
        parts[2].parse().expect("header revision"),
        parts[3].parse().expect("create revision"),
    )
}

/// Closes the Go peer's stdin; it unlocks (or resigns), says so and exits.
fn go_release(peer: &mut LineChild, word: &str) {
    peer.close_stdin();
    assert_eq!(peer.line(Duration::from_secs(10)).as_deref(), Some(word));
    peer.wait().expect("the Go peer exits");
}

/// Resolves once some client puts a key under `prefix` (a contender queues).
async fn queued_under(cluster: &EtcdCluster, prefix: &str) -> impl std::future::Future<Output = ()> {
    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    let mut stream = raw
        .watch(prefix, Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    async move {
        let _client = raw;
        loop {
            let response = stream.message().await.expect("watch").expect("stream");
            if response.events().iter().any(|e| e.event_type() == EventType::Put) {
                return;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_waits_while_a_go_mutex_holds_a_trailing_slash_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut go = go_peer(&cluster, &["mutex", "/my-lock/"]);
    let held = go.line(Duration::from_secs(20)).expect("Go holds the lock");
    let (go_key, _, _) = held_line(&held, "held");
    assert!(go_key.starts_with("/my-lock//"), "{go_key}");

    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let mutex = session.mutex("/my-lock/").expect("a trailing '/' is accepted on etcd");
    assert!(
        mutex.try_lock().await.expect("try_lock").is_none(),
        "Go's lock was ignored"
    );
    let contenders = mutex.contenders().await.expect("list");
    assert_eq!(contenders.first().map(|e| e.key.as_str()), Some(go_key.as_str()));

    let waiter = spawn_queued(&client, async move { mutex.lock().await }).await;
    assert!(!waiter.is_finished());
    go_release(&mut go, "released");
    let guard = bounded("lockline takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    // The very key Go would write for this session's lease.
    assert_eq!(guard.key(), format!("/my-lock//{}", session.id()));
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_mutex_waits_while_lockline_holds_a_trailing_slash_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let guard = session.mutex("/my-lock/").expect("mutex").lock().await.expect("lock");
    assert_eq!(guard.key(), format!("/my-lock//{}", session.id()));

    let queued = queued_under(&cluster, "/my-lock//").await;
    let mut go = go_peer(&cluster, &["mutex", "/my-lock/"]);
    bounded("Go queues", queued).await;
    assert!(go.line(Duration::from_millis(300)).is_none(), "Go took a held lock");

    guard.release().await.expect("release");
    let held = go
        .line(Duration::from_secs(10))
        .expect("Go gets the lock after lockline");
    let (go_key, _, _) = held_line(&held, "held");
    assert!(go_key.starts_with("/my-lock//"), "{go_key}");
    go_release(&mut go, "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_campaigns_behind_a_go_leader_of_a_trailing_slash_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut go = go_peer(&cluster, &["elect", "/my-election/", "from-go"]);
    let leader = go.line(Duration::from_secs(20)).expect("Go leads");
    let (go_key, _, _) = held_line(&leader, "leader");
    assert!(go_key.starts_with("/my-election//"), "{go_key}");

    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let election = session.election("/my-election/").expect("election");
    let seen = election.leader().await.expect("leader").expect("a leader");
    assert_eq!((seen.key(), seen.value()), (go_key.as_str(), &b"from-go"[..]));

    let candidate = election.clone();
    let campaign = spawn_queued(&client, async move { candidate.campaign(b"from-lockline").await }).await;
    assert!(!campaign.is_finished());
    go_release(&mut go, "resigned");
    let leadership = bounded("lockline leads", campaign)
        .await
        .expect("task")
        .expect("campaign");
    assert_eq!(leadership.key(), format!("/my-election//{}", session.id()));
    leadership.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_candidate_campaigns_behind_a_lockline_leader_of_a_trailing_slash_name() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let leadership = session
        .election("/my-election/")
        .expect("election")
        .campaign(b"from-lockline")
        .await
        .expect("campaign");
    assert_eq!(leadership.key(), format!("/my-election//{}", session.id()));

    let queued = queued_under(&cluster, "/my-election//").await;
    let mut go = go_peer(&cluster, &["elect", "/my-election/", "from-go"]);
    bounded("Go campaigns", queued).await;
    assert!(
        go.line(Duration::from_millis(300)).is_none(),
        "Go leads beside lockline"
    );

    leadership.resign().await.expect("resign");
    let leader = go.line(Duration::from_secs(10)).expect("Go leads after lockline");
    held_line(&leader, "leader");
    let now = session
        .election("/my-election/")
        .expect("election")
        .leader()
        .await
        .expect("leader")
        .expect("a leader");
    assert_eq!(now.value(), b"from-go");
    go_release(&mut go, "resigned");
}

/// A Go holder that had to wait reports `m.Header().Revision` (the revision
/// at which it saw its turn) above its key's create revision; lockline's
/// token for that same holder is the create revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_holder_s_fencing_token_is_its_key_s_create_revision_not_its_header_revision() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let mutex = session.mutex("fenced/").expect("mutex");
    let guard = mutex.lock().await.expect("lock");

    let queued = queued_under(&cluster, "fenced//").await;
    let mut go = go_peer(&cluster, &["mutex", "fenced/"]);
    bounded("Go queues", queued).await;
    let lockline_token = guard.token().get();
    guard.release().await.expect("release");

    let held = go.line(Duration::from_secs(10)).expect("Go gets the lock");
    let (go_key, header_revision, create_revision) = held_line(&held, "held");
    let contenders = mutex.contenders().await.expect("list");
    let holder = contenders.first().expect("Go's entry");
    assert_eq!(holder.key, go_key);
    assert_eq!(
        i64::try_from(holder.token.get()).expect("token"),
        create_revision,
        "lockline's token for Go's holder is its key's create revision"
    );
    assert!(create_revision > i64::try_from(lockline_token).expect("token"));
    assert!(
        header_revision > create_revision,
        "Go's header revision {header_revision} is not the create revision {create_revision}"
    );
    go_release(&mut go, "released");
}

/// The same with `etcdctl lock NAME COMMAND`: `ETCD_LOCK_REV` is Go's header
/// revision, not the key's create revision (the fencing token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_rev_is_not_the_fencing_token() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let guard = session.mutex("fenced-ctl").expect("mutex").lock().await.expect("lock");

    let queued = queued_under(&cluster, "fenced-ctl/").await;
    // The command prints the lock's key and revision, then the key's create
    // revision as etcd reports it, while etcdctl holds the lock.
    let script = format!(
        "echo \"$ETCD_LOCK_KEY $ETCD_LOCK_REV\"; ETCDCTL_API=3 etcdctl --endpoints={} get \"$ETCD_LOCK_KEY\" -w fields | grep '\"CreateRevision\"'",
        cluster.endpoints().join(",")
    );
    let mut command = cluster.etcdctl(&cluster.endpoints());
    command.args(["lock", "fenced-ctl", "--", "sh", "-c", &script]);
    let mut etcdctl = LineChild::spawn(command).expect("start etcdctl");
    bounded("etcdctl queues", queued).await;
    guard.release().await.expect("release");

    let first = etcdctl.line(Duration::from_secs(10)).expect("etcdctl runs its command");
    let (key, lock_rev) = first.split_once(' ').expect("KEY REV");
    assert!(key.starts_with("fenced-ctl/"), "{key}");
    let lock_rev: i64 = lock_rev.parse().expect("ETCD_LOCK_REV");
    let second = etcdctl
        .line(Duration::from_secs(10))
        .expect("the key's create revision");
    let create_revision: i64 = second
        .rsplit(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected line {second:?}"));
    assert!(
        lock_rev > create_revision,
        "ETCD_LOCK_REV {lock_rev} should differ from the create revision {create_revision}"
    );
    etcdctl.wait().expect("etcdctl exits");
}
