//! A lock-delayed session whose role may read the marker prefix but not
//! write it cannot leave its lock-delay flag: it queues without one. That
//! must never drop the lock-delay's protection (a holder's loss still holds
//! it back) and must be said in the log for what it is: with no flag of its
//! own, the releases before its waits write no marker, so it takes each of
//! them for a loss and is held back after it. One test per binary: the log
//! subscriber is the process's global one.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, SessionOptions};
use lockline_etcd::etcd_client::{self, Permission};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

const ROOT_PASSWORD: &str = "root-pw-4e1";
const FULL_PASSWORD: &str = "full-pw-8a2";
const NO_FLAGS_PASSWORD: &str = "noflags-pw-2b7";
const MARKERS: &str = "markers/";
const DELAY: Duration = Duration::from_secs(2);

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

fn options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delayed_waiter_that_may_not_flag_is_held_back_never_granted_early_and_says_why() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .init();

    let cluster = EtcdCluster::start().expect("start etcd");
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect");
    admin.user_add("root", ROOT_PASSWORD, None).await.expect("root");
    admin.role_add("root").await.expect("root role");
    admin.user_grant_role("root", "root").await.expect("grant root");
    admin.role_add("full").await.expect("role");
    for permission in [
        Permission::read_write("locks/").with_prefix(),
        Permission::read_write(MARKERS).with_prefix(),
    ] {
        admin.role_grant_permission("full", permission).await.expect("grant");
    }
    admin.role_add("no-flags").await.expect("role");
    for permission in [
        Permission::read_write("locks/").with_prefix(),
        Permission::read(MARKERS).with_prefix(),
    ] {
        admin
            .role_grant_permission("no-flags", permission)
            .await
            .expect("grant");
    }
    for (user, password, role) in [
        ("full", FULL_PASSWORD, "full"),
        ("noflags", NO_FLAGS_PASSWORD, "no-flags"),
    ] {
        admin.user_add(user, password, None).await.expect("user");
        admin.user_grant_role(user, role).await.expect("grant role");
    }
    admin.auth_enable().await.expect("enable auth");
    let mut root = etcd_client::Client::connect(
        cluster.endpoints(),
        Some(etcd_client::ConnectOptions::new().with_user("root", ROOT_PASSWORD)),
    )
    .await
    .expect("connect as root");

    let backend = |user: &str, password: &str| {
        Etcd::new(cluster.endpoints())
            .with_user(user, password)
            .with_marker_prefix(MARKERS)
    };
    let holders = Client::new(backend("full", FULL_PASSWORD));
    let waiters = Client::new(backend("noflags", NO_FLAGS_PASSWORD));
    let waiter = bounded("session", waiters.session_with(options().with_lock_delay(DELAY)))
        .await
        .expect("lock-delayed session");

    // The holder's loss: held back for the delay.
    let holder = bounded("session", holders.session_with(options()))
        .await
        .expect("session");
    let guard = bounded("lock", holder.mutex("locks/a").expect("mutex").lock())
        .await
        .expect("lock");
    let mutex = waiter.mutex("locks/a").expect("mutex");
    let queued = spawn_queued(&waiters, async move {
        let granted = mutex.lock().await;
        (Instant::now(), granted)
    })
    .await;
    let flags = root
        .get(
            format!("{MARKERS}lock-delay-"),
            Some(etcd_client::GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("get")
        .count();
    assert_eq!(
        flags, 0,
        "the role may not write the marker prefix, yet a flag is there"
    );
    let lease = i64::from_str_radix(holder.id(), 16).expect("hex lease id");
    let lost_at = Instant::now();
    root.lease_revoke(lease).await.expect("revoke");
    let (at, granted) = bounded("the grant after the loss", queued).await.expect("task");
    assert!(
        at - lost_at >= DELAY,
        "a waiter without its flag was granted {:?} after the holder's loss",
        at - lost_at
    );
    granted.expect("granted").release().await.expect("release");
    drop(guard);

    // A clean release: with no flag, no marker; held back, never early.
    let holder = bounded("session", holders.session_with(options()))
        .await
        .expect("session");
    let guard = bounded("lock", holder.mutex("locks/b").expect("mutex").lock())
        .await
        .expect("lock");
    let mutex = waiter.mutex("locks/b").expect("mutex");
    let queued = spawn_queued(&waiters, async move { mutex.lock().await }).await;
    let before = waiters.stats().lock_delays;
    guard.release().await.expect("release");
    let granted = bounded("the grant after the release", queued)
        .await
        .expect("task")
        .expect("granted");
    assert_eq!(
        waiters.stats().lock_delays,
        before + 1,
        "a release before a waiter without a flag was told from a loss: how?"
    );
    granted.release().await.expect("release");

    let log = captured.text();
    let line = log
        .lines()
        .find(|line| line.contains("WARN") && line.contains("lock-delay"))
        .unwrap_or_else(|| panic!("no warning about the lock-delay flag in the log:\n{log}"));
    assert!(
        line.contains("flag") && line.contains("held back"),
        "the warning does not say that this session's own lock-delayed waits are held back after releases: {line}"
    );
}
