//! RBAC without extra grants: by default every key lockline writes for a
//! lock (its entries, the markers of abandoned acquires, the hand-over
//! markers of lock-delay) lies in the key range of the lock's name, so a role
//! on `locks/` is enough for `locks/a`, as it is for `etcdctl lock` and Go's
//! `concurrency.Mutex`; and none of those keys is taken for a contender by
//! `etcdctl` or Go on the same name.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use lockline::conformance::{bounded, spawn_queued, until};
use lockline::{Client, Error, SessionOptions, Write};
use lockline_etcd::etcd_client::{self, Permission};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, LineChild, TcpProxy};

const ROOT_PASSWORD: &str = "root-pw-6b1";
const DANA_PASSWORD: &str = "dana-pw-0c7";
const ERIN_PASSWORD: &str = "erin-pw-a52";
const FRANK_PASSWORD: &str = "frank-pw-9d4";

/// A cluster with auth enabled and these users:
/// - `dana`: read-write on the prefix `locks/` only;
/// - `erin`: read-write on the prefix `jobs/nightly` (a lock's name) only;
/// - `frank`: read-write on `jobs/weekly/` (a lock's prefix) and `markers/`.
struct Secured {
    cluster: EtcdCluster,
}

impl Secured {
    async fn start() -> Self {
        let cluster = EtcdCluster::start().expect("start etcd");
        let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .expect("connect");
        admin.user_add("root", ROOT_PASSWORD, None).await.expect("root");
        admin.role_add("root").await.expect("root role");
        admin.user_grant_role("root", "root").await.expect("grant root");
        let roles = [
            ("dana", DANA_PASSWORD, vec!["locks/"]),
            ("erin", ERIN_PASSWORD, vec!["jobs/nightly"]),
            ("frank", FRANK_PASSWORD, vec!["jobs/weekly/", "markers/"]),
        ];
        for (user, password, prefixes) in roles {
            admin.role_add(user).await.expect("role");
            for prefix in prefixes {
                admin
                    .role_grant_permission(user, Permission::read_write(prefix).with_prefix())
                    .await
                    .expect("grant");
            }
            admin.user_add(user, password, None).await.expect("user");
            admin.user_grant_role(user, user).await.expect("grant role");
        }
        admin.auth_enable().await.expect("enable auth");
        Secured { cluster }
    }

    fn backend(&self, user: &str, password: &str) -> Etcd {
        Etcd::new(self.cluster.endpoints()).with_user(user, password)
    }

    /// Every key, read as root.
    async fn keys(&self) -> Vec<String> {
        let options = etcd_client::ConnectOptions::new().with_user("root", ROOT_PASSWORD);
        let mut root = etcd_client::Client::connect(self.cluster.endpoints(), Some(options))
            .await
            .expect("connect as root");
        let all = root
            .get(
                "",
                Some(etcd_client::GetOptions::new().with_all_keys().with_keys_only()),
            )
            .await
            .expect("read every key");
        all.kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect()
    }
}

fn quick() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(4))
}

/// Builds the Go peer (`tests/go/lockpeer`) once, offline.
fn lockpeer() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("go-lockpeer-grants");
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/go/lockpeer/main.go");
        lockline_testkit::go_build(source.as_ref(), &out).expect("build the Go peer (Debian golang-go)");
        out
    })
}

/// A user's session with its append held on the way through a proxy, then
/// cancelled: the attempt leaves its abandoned-attempt marker. The session
/// goes on through the proxy.
async fn cancel_an_append(secured: &Secured, name: &str) -> (TcpProxy, lockline::Session) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", secured.cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]).with_user("dana", DANA_PASSWORD));
    let session = client.session_with(quick()).await.expect("session as dana");
    let mutex = session.mutex(name).expect("mutex");
    proxy.set_requests_held(true);
    let acquire = tokio::spawn(async move { mutex.lock().await });
    until("the append is on its way", || proxy.held_requests() > 0).await;
    acquire.abort();
    let _ = acquire.await;
    proxy.set_requests_held(false);
    bounded("background cleanup", session.flush()).await;
    (proxy, session)
}

/// With a role on `locks/` only: an acquire cancelled in flight leaves its
/// marker, a release hands over to a lock-delayed waiter at once (its
/// hand-over marker was written and read), every key is under `locks/`, and
/// with all those markers alive `etcdctl lock` and Go's `Mutex`, as the
/// same user, take the same name at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_on_the_parent_prefix_alone_covers_entries_and_markers() {
    let secured = Secured::start().await;
    let (_proxy, abandoning) = cancel_an_append(&secured, "locks/a").await;

    let holders = Client::new(secured.backend("dana", DANA_PASSWORD));
    let holder = holders.session_with(quick()).await.expect("session as dana");
    let waiters = Client::new(secured.backend("dana", DANA_PASSWORD));
    let waiter = waiters
        .session_with(quick().with_lock_delay(Duration::from_secs(60)))
        .await
        .expect("lock-delayed session as dana");
    let guard = bounded("lock locks/a", holder.mutex("locks/a").expect("mutex").lock())
        .await
        .expect("dana may lock locks/a with a role on locks/ alone");
    let mutex = waiter.mutex("locks/a").expect("mutex");
    let queued = spawn_queued(&waiters, async move { mutex.lock().await }).await;
    guard.release().await.expect("release");
    // A release that looked like a loss would hold the waiter back 60 s,
    // past the bound.
    let granted = bounded("the waiter's grant after a release", queued)
        .await
        .expect("task")
        .expect("granted");
    assert_eq!(waiters.stats().lock_delays, 0, "the release was taken for a loss");
    granted.release().await.expect("release");

    let keys = secured.keys().await;
    let holder_marker = format!("locks/a\0lockline/released-{}", holder.id());
    assert!(
        keys.contains(&holder_marker),
        "no hand-over marker {holder_marker:?}: {keys:?}"
    );
    let abandoned = format!("locks/a\0lockline/{}-", abandoning.id());
    assert!(
        keys.iter().any(|k| k.starts_with(&abandoned)),
        "no abandoned-attempt marker {abandoned:?}...: {keys:?}"
    );
    assert!(
        keys.iter().all(|k| k.starts_with("locks/")),
        "a key outside locks/: {keys:?}"
    );
    assert!(
        keys.iter().all(|k| !k.starts_with("locks/a/")),
        "a key left under locks/a/: {keys:?}"
    );

    // Every lockline session is alive with its markers; none holds locks/a.
    let status = secured
        .cluster
        .etcdctl(&secured.cluster.endpoints())
        .arg(format!("--user=dana:{DANA_PASSWORD}"))
        .args(["lock", "locks/a", "true"])
        .status()
        .expect("etcdctl lock");
    assert!(status.success(), "etcdctl lock locks/a as dana: {status:?}");
    let mut command = Command::new(lockpeer());
    command
        .args(["mutex", &secured.cluster.endpoints().join(","), "locks/a"])
        .env("LOCKPEER_USER", format!("dana:{DANA_PASSWORD}"));
    let mut go = LineChild::spawn(command).expect("start the Go peer");
    let line = go.line(Duration::from_secs(10));
    assert!(
        line.as_deref().is_some_and(|l| l.starts_with("held locks/a/")),
        "Go's Mutex on locks/a as dana, beside lockline's markers: {line:?}"
    );
    go.close_stdin();
    assert_eq!(go.line(Duration::from_secs(10)).as_deref(), Some("released"));
    go.wait().expect("the Go peer exits");
    for session in [holder, waiter, abandoning] {
        session.close().await.expect("close");
    }
}

/// A role on the lock's name itself (`jobs/nightly`, no `/`) is enough; one
/// on its prefix alone (`jobs/weekly/`) is not, since nothing inside it can
/// be written without Go taking it for a contender: the refusal says what to
/// grant, and a marker prefix the role covers works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_on_the_name_is_enough_and_one_on_its_prefix_needs_a_marker_prefix() {
    let secured = Secured::start().await;
    let erin = Client::new(secured.backend("erin", ERIN_PASSWORD));
    let session = erin.session_with(quick()).await.expect("session as erin");
    let guard = bounded(
        "lock jobs/nightly",
        session.mutex("jobs/nightly").expect("mutex").lock(),
    )
    .await
    .expect("a role on the name covers entries and markers");
    guard.release().await.expect("release");
    session.close().await.expect("close");

    let frank = Client::new(secured.backend("frank", FRANK_PASSWORD));
    let session = frank.session_with(quick()).await.expect("session as frank");
    let refused = session.mutex("jobs/weekly").expect("mutex").lock().await;
    let Err(error @ Error::PermissionDenied { .. }) = &refused else {
        panic!("expected PermissionDenied, got {refused:?}");
    };
    let shown = error.to_string();
    assert!(
        shown.contains("with_marker_prefix") && shown.contains("NAME/"),
        "the error does not say what to grant: {shown}"
    );
    let moved = Client::new(secured.backend("frank", FRANK_PASSWORD).with_marker_prefix("markers/"));
    let session = moved.session_with(quick()).await.expect("session as frank");
    let guard = bounded("lock jobs/weekly", session.mutex("jobs/weekly").expect("mutex").lock())
        .await
        .expect("markers under a granted prefix");
    guard.release().await.expect("release");
    session.close().await.expect("close");
}

/// A fenced write cannot forge a marker: keys in a lock's marker range, or
/// under the marker prefix a backend was given, are refused before anything
/// is sent; other keys are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_cannot_forge_a_marker() {
    let cluster = EtcdCluster::start().expect("start etcd");
    for (backend, forged) in [
        (Etcd::new(cluster.endpoints()), "locks/b\0lockline/released-1f"),
        (Etcd::new(cluster.endpoints()), "other\0lockline/1f-x"),
        (
            Etcd::new(cluster.endpoints()).with_marker_prefix("markers/"),
            "markers/released-1f",
        ),
        (
            Etcd::new(cluster.endpoints()).with_marker_prefix("markers/"),
            "locks/b\0lockline/released-1f",
        ),
    ] {
        let session = Client::new(backend).session().await.expect("session");
        let guard = session.mutex("locks/a").expect("mutex").lock().await.expect("lock");
        match guard.write_if_held([Write::put(forged, "")]).await {
            Err(Error::InvalidName { name, reason }) => {
                assert_eq!(name, forged);
                assert!(reason.contains("marker"), "{reason}");
            }
            other => panic!("a write to {forged:?} must be refused, got {other:?}"),
        }
        guard
            .write_if_held([Write::put("state/count", "x")])
            .await
            .expect("an ordinary key is written");
        guard.release().await.expect("release");
        session.close().await.expect("close");
    }
    let keys = cluster.keys("").expect("keys");
    assert!(
        keys.iter().all(|k| !k.ends_with("released-1f") && !k.ends_with("1f-x")),
        "{keys:?}"
    );
}
