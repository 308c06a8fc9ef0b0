//! Lock-mode nodes (`_c_<attempt>-dlm-<seq>`) and the value block
//! (`lockline-value-block`) are no contenders to kazoo's and Curator's
//! recipes: a peer queueing after them holds at once (with the patterns
//! kazoo is told to see lockline's other recipes). lockline sees the peer's
//! node in the queue and refuses to queue a lock mode beside it.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use lockline::backend::{AppendRequest, Conflicts, EntryKind, QueueUpdate};
use lockline::conformance::bounded;
use lockline::{Client, Error, LockMode, Session};
use lockline_testkit::{LineChild, ZkEnsemble};
use lockline_zookeeper::ZooKeeper;

/// Debian's interpreter, the one `python3-kazoo` installs into.
const PYTHON: &str = "/usr/bin/python3";
/// Curator's recipes jar (its manifest brings the rest) and a quiet slf4j.
const CURATOR: &str = "/usr/share/java/curator-recipes.jar";
const SLF4J_NOP: &str = "/usr/share/java/slf4j-nop.jar";

fn kazoo(ensemble: &ZkEnsemble, path: &str, recipe: &str) -> LineChild {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kazoo/hold_lock.py");
    let mut command = Command::new(PYTHON);
    command.args([script, &ensemble.connect_string(), path, recipe]);
    LineChild::spawn(command).expect("start the kazoo helper")
}

/// Compiles the Curator peer once per test run.
fn classes() -> &'static PathBuf {
    static CLASSES: OnceLock<PathBuf> = OnceLock::new();
    CLASSES.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("curator-peer-lock-modes");
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

fn curator(ensemble: &ZkEnsemble, path: &str, recipe: &str) -> LineChild {
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

/// A granted lock-mode entry under `name`, created before any peer, and a
/// written value block beside it.
async fn lock_mode_holder(ensemble: &ZkEnsemble, name: &str) -> Session {
    let session = Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session()
        .await
        .expect("session");
    let remote = session.backend_session();
    let request = AppendRequest {
        dir: name,
        kind: EntryKind::Dlm,
        attempt: "holder",
        value: b"EX:granted",
        conflicts: Conflicts::All,
        nearest: 0,
    };
    let entry = remote.append(&request).await.expect("append").entry;
    let queue = remote.read_queue(name).await.expect("read");
    let update = QueueUpdate {
        dir: name,
        unchanged: &[(&entry, queue.slots[0].version)],
        present: &[],
        set: &[],
        delete: &[],
        block: Some(b"value block"),
    };
    remote.update_queue(&update).await.expect("update").expect("applied");
    session
}

/// The peer holds at once; lockline's read of the queue shows the peer's
/// node after its own, as `kind`.
async fn peer_holds_beside(mut peer: LineChild, session: &Session, name: &str, kind: EntryKind) {
    let held = peer
        .line(Duration::from_secs(30))
        .expect("the peer holds beside the lock-mode entry");
    assert!(held.starts_with("held") || held.starts_with("leader"), "{held}");
    let queue = bounded("read", session.backend_session().read_queue(name))
        .await
        .expect("read");
    let kinds: Vec<EntryKind> = queue.slots.iter().map(|s| s.entry.kind).collect();
    assert_eq!(kinds, [EntryKind::Dlm, kind]);
    assert_eq!(queue.block.as_deref(), Some(&b"value block"[..]));
    // lockline refuses to queue a lock mode beside the peer's node.
    let resource = session.resource(name).expect("resource");
    match bounded("a lock mode beside a peer", resource.try_lock(LockMode::Nl)).await {
        Err(Error::InvalidName { .. }) => {}
        other => panic!("a lock mode must not queue beside {kind:?}: {other:?}"),
    }
    peer.close_stdin();
    assert_eq!(peer.line(Duration::from_secs(20)).as_deref(), Some("released"));
    peer.wait().expect("the peer exits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_locks_do_not_take_lock_mode_nodes_for_contenders() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    for (recipe, kind) in [
        ("lock", EntryKind::Mutex),
        ("read", EntryKind::Read),
        ("write", EntryKind::Mutex),
    ] {
        let name = format!("dlm/kazoo-{recipe}");
        let holder = lock_mode_holder(&ensemble, &name).await;
        let peer = kazoo(&ensemble, &format!("/{name}"), recipe);
        peer_holds_beside(peer, &holder, &name, kind).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_recipes_do_not_take_lock_mode_nodes_for_contenders() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    for (recipe, kind) in [
        ("mutex", EntryKind::Mutex),
        ("read", EntryKind::Read),
        ("write", EntryKind::Write),
        ("latch", EntryKind::Election),
    ] {
        let name = format!("dlm/curator-{recipe}");
        let holder = lock_mode_holder(&ensemble, &name).await;
        let peer = curator(&ensemble, &format!("/{name}"), recipe);
        peer_holds_beside(peer, &holder, &name, kind).await;
    }
}
