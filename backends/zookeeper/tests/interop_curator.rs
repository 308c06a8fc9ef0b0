//! Interop with Apache Curator (Debian `libcurator-recipes-java`), compiled here
//! from `tests/curator/CuratorPeer.java` with `javac` against Debian's jars:
//! Curator's `InterProcessMutex`, `InterProcessReadWriteLock` and `LeaderLatch`
//! and lockline's exclude each other on the same path, in both directions; a
//! path holding a Curator `InterProcessSemaphoreV2` is refused, not shared.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, Error};
use lockline_testkit::{LineChild, ZkEnsemble};
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

/// Curator's recipes jar; its manifest's class path brings the framework,
/// client, ZooKeeper and Guava jars.
const CURATOR: &str = "/usr/share/java/curator-recipes.jar";
/// A no-op slf4j binding, so the peer's output is only its own lines.
const SLF4J_NOP: &str = "/usr/share/java/slf4j-nop.jar";

/// Compiles the Curator peer once per test run.
fn classes() -> &'static PathBuf {
    static CLASSES: OnceLock<PathBuf> = OnceLock::new();
    CLASSES.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("curator-peer");
        std::fs::create_dir_all(&out).expect("class directory");
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/curator/CuratorPeer.java");
        let status = Command::new("javac")
            .arg("-d")
            .arg(&out)
            .args(["-cp", CURATOR, source])
            .status()
            .expect("run javac (Debian default-jdk-headless)");
        assert!(status.success(), "compiling the Curator peer failed: {status}");
        out
    })
}

/// The Curator peer holding `recipe` (`mutex`, `read`, `write`, `latch`,
/// `semaphore`) on `path` until its stdin closes.
fn curator(ensemble: &ZkEnsemble, recipe: &str, path: &str) -> LineChild {
    let classpath = format!("{}:{CURATOR}:{SLF4J_NOP}", classes().display());
    let mut command = Command::new("java");
    command
        .args([
            "-cp",
            &classpath,
            "CuratorPeer",
            &ensemble.connect_string(),
            recipe,
            path,
        ])
        .stderr(std::process::Stdio::null());
    LineChild::spawn(command).expect("start the Curator peer")
}

/// Closes the peer's stdin: it lets go, says so and exits.
fn curator_release(peer: &mut LineChild) {
    peer.close_stdin();
    assert_eq!(peer.line(Duration::from_secs(20)).as_deref(), Some("released"));
    peer.wait().expect("the Curator peer exits");
}

/// A client watching `path`'s children: resolves when one is added (a
/// contender queues).
async fn children_change(ensemble: &ZkEnsemble, path: &str) -> (zk::Client, zk::OneshotWatcher) {
    let side = zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("side client");
    let (_, _, watcher) = side.get_and_watch_children(path).await.expect("watch");
    (side, watcher)
}

/// lockline takes `acquire` while Curator holds `recipe`; it must queue, then
/// be granted once Curator lets go.
macro_rules! lockline_waits_behind_curator {
    ($ensemble:expr, $recipe:expr, $path:expr, |$session:ident| $try:expr, |$queued:ident| $acquire:expr) => {{
        let mut peer = curator(&$ensemble, $recipe, $path);
        let held = peer.line(Duration::from_secs(30)).expect("Curator holds");
        assert!(held.starts_with("held") || held.starts_with("leader"), "{held}");
        let client = Client::new(ZooKeeper::new($ensemble.connect_string()));
        let $session = client.session().await.expect("session");
        assert!($try, "Curator's {} was ignored", $recipe);
        let $queued = $session.clone();
        let waiter = spawn_queued(&client, async move { $acquire }).await;
        assert!(!waiter.is_finished());
        curator_release(&mut peer);
        bounded("lockline takes over", waiter).await.expect("task")
    }};
}

/// Curator's `recipe` must queue while lockline holds `guard`, then hold once
/// lockline lets go.
async fn curator_waits_behind(
    ensemble: &ZkEnsemble,
    recipe: &str,
    path: &str,
    release: impl std::future::Future<Output = ()>,
) {
    let (_side, queued) = children_change(ensemble, path).await;
    let mut peer = curator(ensemble, recipe, path);
    bounded("Curator queues", queued.changed()).await;
    assert!(
        peer.line(Duration::from_millis(500)).is_none(),
        "Curator's {recipe} was granted beside lockline's holder"
    );
    release.await;
    let held = peer
        .line(Duration::from_secs(10))
        .expect("Curator holds after lockline");
    assert!(held.starts_with("held") || held.starts_with("leader"), "{held}");
    curator_release(&mut peer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_waits_while_a_curator_mutex_holds() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let guard = lockline_waits_behind_curator!(
        ensemble,
        "mutex",
        "/interop/mutex-a",
        |session| session
            .mutex("interop/mutex-a")
            .expect("mutex")
            .try_lock()
            .await
            .expect("try_lock")
            .is_none(),
        |queued| queued.mutex("interop/mutex-a").expect("mutex").lock().await
    )
    .expect("lock");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_mutex_waits_while_lockline_holds() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let guard = session
        .mutex("interop/mutex-b")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    curator_waits_behind(&ensemble, "mutex", "/interop/mutex-b", async move {
        guard.release().await.expect("release")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_reads_wait_while_a_curator_write_lock_holds() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let guard = lockline_waits_behind_curator!(
        ensemble,
        "write",
        "/interop/rw-a",
        |session| session
            .rwlock("interop/rw-a")
            .expect("rwlock")
            .try_read()
            .await
            .expect("try_read")
            .is_none(),
        |queued| queued.rwlock("interop/rw-a").expect("rwlock").read().await
    )
    .expect("read");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_writes_wait_while_a_curator_read_lock_holds_and_reads_share_it() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let guard = lockline_waits_behind_curator!(
        ensemble,
        "read",
        "/interop/rw-b",
        |session| {
            let rwlock = session.rwlock("interop/rw-b").expect("rwlock");
            let reader = rwlock
                .try_read()
                .await
                .expect("try_read")
                .expect("readers share with Curator's");
            reader.release().await.expect("release");
            rwlock.try_write().await.expect("try_write").is_none()
        },
        |queued| queued.rwlock("interop/rw-b").expect("rwlock").write().await
    )
    .expect("write");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_read_and_write_locks_wait_while_lockline_writes() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let rwlock = session.rwlock("interop/rw-c").expect("rwlock");
    for recipe in ["read", "write"] {
        let guard = rwlock.write().await.expect("write");
        curator_waits_behind(&ensemble, recipe, "/interop/rw-c", async move {
            guard.release().await.expect("release")
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_write_lock_waits_while_lockline_reads() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let guard = session
        .rwlock("interop/rw-d")
        .expect("rwlock")
        .read()
        .await
        .expect("read");
    curator_waits_behind(&ensemble, "write", "/interop/rw-d", async move {
        guard.release().await.expect("release")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_campaigns_behind_a_curator_leader_latch() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let mut peer = curator(&ensemble, "latch", "/interop/latch-a");
    assert_eq!(
        peer.line(Duration::from_secs(30)).as_deref(),
        Some("leader curator"),
        "Curator leads"
    );
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let election = session.election("interop/latch-a").expect("election");
    let leader = election.leader().await.expect("leader").expect("a leader");
    assert_eq!(leader.value(), b"curator", "LeaderLatch's participant id is the value");
    let candidate = election.clone();
    let campaign = spawn_queued(&client, async move { candidate.campaign(b"from-lockline").await }).await;
    assert!(!campaign.is_finished());
    curator_release(&mut peer);
    let leadership = bounded("lockline leads", campaign)
        .await
        .expect("task")
        .expect("campaign");
    leadership.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_leader_latch_waits_while_lockline_leads() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let leadership = session
        .election("interop/latch-b")
        .expect("election")
        .campaign(b"from-lockline")
        .await
        .expect("campaign");
    curator_waits_behind(&ensemble, "latch", "/interop/latch-b", async move {
        leadership.resign().await.expect("resign")
    })
    .await;
}

/// Curator's `InterProcessSemaphoreV2` keeps its leases one level down
/// (`<path>/leases`), where lockline's queue cannot see them: a path holding
/// one is refused, where lockline used to grant beside Curator's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_refuses_a_path_holding_a_curator_semaphore() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let mut peer = curator(&ensemble, "semaphore", "/interop/sem");
    let held = peer.line(Duration::from_secs(30)).expect("Curator holds a lease");
    // The lease's node name is lockline's own semaphore node name; only its
    // place (one level down, under `leases`) differs.
    assert!(held.starts_with("held _c_") && held.contains("-lease-"), "{held}");

    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = client.session().await.expect("session");
    let semaphore = session.semaphore("interop/sem", 1).expect("semaphore");
    match bounded("lockline decides", semaphore.acquire()).await {
        Err(Error::InvalidName { reason, .. }) => assert!(reason.contains("foreign recipe"), "{reason}"),
        other => panic!("a permit beside Curator's lease must be refused, got {other:?}"),
    }
    assert!(matches!(
        session.mutex("interop/sem").expect("mutex").try_lock().await,
        Err(Error::InvalidName { .. })
    ));
    session.flush().await;
    let side = zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("side client");
    // Only Curator's own children: `leases`, and `locks` unless the server's
    // container reaper has already removed that emptied container.
    let children = side.list_children("/interop/sem").await.expect("list");
    assert!(children.contains(&"leases".to_owned()), "{children:?}");
    assert!(
        children.iter().all(|c| c == "leases" || c == "locks"),
        "lockline left an entry behind: {children:?}"
    );
    curator_release(&mut peer);
}
