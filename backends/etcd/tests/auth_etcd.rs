//! etcd with authentication on: users, roles and permissions decide who may
//! take, read or break which lock, and every refusal is a typed error at once.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, Error, SessionOptions, SessionState};
use lockline_etcd::etcd_client::{self, Permission};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

const ROOT_PASSWORD: &str = "root-pw-9f2";
const ALICE_PASSWORD: &str = "alice-pw-71c";
const BOB_PASSWORD: &str = "bob-pw-33a";
const CAROL_PASSWORD: &str = "carol-pw-5d0";

/// A cluster with auth enabled and these users:
/// - `alice`: read-write on `locks/` only;
/// - `carol`: read-write on `locks/` and on [`lockline_etcd::MARKER_PREFIX`];
/// - `bob`: read on `locks/` only.
struct Secured {
    cluster: EtcdCluster,
}

impl Secured {
    async fn start() -> Self {
        Self::on(EtcdCluster::start().expect("start etcd")).await
    }

    async fn on(cluster: EtcdCluster) -> Self {
        let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .expect("connect");
        admin.user_add("root", ROOT_PASSWORD, None).await.expect("root");
        admin.role_add("root").await.expect("root role");
        admin.user_grant_role("root", "root").await.expect("grant root");
        let roles = [
            ("locks-rw", vec![Permission::read_write("locks/").with_prefix()]),
            (
                "locks-and-markers-rw",
                vec![
                    Permission::read_write("locks/").with_prefix(),
                    Permission::read_write(lockline_etcd::MARKER_PREFIX).with_prefix(),
                ],
            ),
            ("locks-ro", vec![Permission::read("locks/").with_prefix()]),
        ];
        for (role, permissions) in roles {
            admin.role_add(role).await.expect("role");
            for permission in permissions {
                admin.role_grant_permission(role, permission).await.expect("grant");
            }
        }
        for (user, password, role) in [
            ("alice", ALICE_PASSWORD, "locks-rw"),
            ("carol", CAROL_PASSWORD, "locks-and-markers-rw"),
            ("bob", BOB_PASSWORD, "locks-ro"),
        ] {
            admin.user_add(user, password, None).await.expect("user");
            admin.user_grant_role(user, role).await.expect("grant role");
        }
        admin.auth_enable().await.expect("enable auth");
        Secured { cluster }
    }

    fn backend(&self, user: &str, password: &str) -> Etcd {
        Etcd::new(self.cluster.endpoints()).with_user(user, password)
    }

    async fn root(&self) -> etcd_client::Client {
        let options = etcd_client::ConnectOptions::new().with_user("root", ROOT_PASSWORD);
        etcd_client::Client::connect(self.cluster.endpoints(), Some(options))
            .await
            .expect("connect as root")
    }

    fn alice(&self) -> Client {
        Client::new(
            self.backend("alice", ALICE_PASSWORD)
                .with_marker_prefix("locks/__lockline_abandoned__/"),
        )
    }

    /// Every key, read as root.
    async fn keys(&self) -> Vec<String> {
        let all = self
            .root()
            .await
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

/// A refusal must come back at once: well inside one request timeout, with
/// no retry loop behind it.
const AT_ONCE: Duration = Duration::from_secs(3);

fn quick() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(4))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_read_write_on_locks_can_lock_there_and_nowhere_else() {
    let secured = Secured::start().await;
    let session = bounded("session as alice", secured.alice().session_with(quick()))
        .await
        .expect("session as alice");
    let guard = bounded("lock locks/a", session.mutex("locks/a").expect("mutex").lock())
        .await
        .expect("alice may lock locks/a");
    assert!(guard.key().starts_with("locks/a/"), "{}", guard.key());

    let started = Instant::now();
    let refused = session.mutex("other/a").expect("mutex").lock().await;
    let took = started.elapsed();
    let Err(Error::PermissionDenied { operation, key, .. }) = &refused else {
        panic!("expected PermissionDenied on other/a, got {refused:?}");
    };
    assert_eq!(*operation, "queue on");
    assert!(key.starts_with("other/a/"), "{key}");
    assert!(took < AT_ONCE, "the refusal took {took:?}");
    let shown = refused.unwrap_err().to_string();
    assert!(
        shown.contains("other/a") && shown.contains("permission denied"),
        "{shown}"
    );

    session.flush().await;
    let keys = secured.keys().await;
    assert!(
        keys.iter().all(|k| !k.starts_with("other/")),
        "an entry was left: {keys:?}"
    );
    guard.release().await.expect("release");
    session.close().await.expect("close");
}

/// Markers moved under a prefix of their own ([`lockline_etcd::MARKER_PREFIX`])
/// need a grant there too: without one the refusal says what to grant and
/// leaves nothing behind; with one, that placement works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_marker_prefix_outside_the_grant_the_error_says_so_and_nothing_is_left() {
    let secured = Secured::start().await;
    let client = Client::new(
        secured
            .backend("alice", ALICE_PASSWORD)
            .with_marker_prefix(lockline_etcd::MARKER_PREFIX),
    );
    let session = client.session_with(quick()).await.expect("session as alice");
    let refused = session.mutex("locks/b").expect("mutex").lock().await;
    let Err(error @ Error::PermissionDenied { .. }) = &refused else {
        panic!("expected PermissionDenied, got {refused:?}");
    };
    let shown = error.to_string();
    assert!(
        shown.contains("with_marker_prefix") && shown.contains("locks/b"),
        "the error does not say how to fix it: {shown}"
    );
    session.flush().await;
    let keys = secured.keys().await;
    assert!(
        keys.iter().all(|k| !k.starts_with("locks/b")),
        "an entry was left: {keys:?}"
    );

    // With the marker prefix granted too, that placement works.
    let carol = Client::new(
        secured
            .backend("carol", CAROL_PASSWORD)
            .with_marker_prefix(lockline_etcd::MARKER_PREFIX),
    );
    let session = carol.session_with(quick()).await.expect("session as carol");
    let guard = bounded("lock locks/b", session.mutex("locks/b").expect("mutex").lock())
        .await
        .expect("carol may lock locks/b");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_user_can_list_and_read_the_leader_but_not_lock() {
    let secured = Secured::start().await;
    let alice = secured.alice().session_with(quick()).await.expect("alice");
    let held = alice.mutex("locks/r").expect("mutex").lock().await.expect("lock");
    let leading = alice
        .election("locks/leader")
        .expect("election")
        .campaign(b"alice")
        .await
        .expect("campaign");

    let bob = Client::new(secured.backend("bob", BOB_PASSWORD))
        .session_with(quick())
        .await
        .expect("a session as bob");
    let contenders = bob
        .mutex("locks/r")
        .expect("mutex")
        .contenders()
        .await
        .expect("contenders");
    assert_eq!(contenders.len(), 1);
    assert_eq!(contenders[0].key, held.key());
    let leader = bob
        .election("locks/leader")
        .expect("election")
        .leader()
        .await
        .expect("leader")
        .expect("someone leads");
    assert_eq!(leader.value(), b"alice");
    assert_eq!(leader.token(), leading.token());

    let started = Instant::now();
    let refused = bob.mutex("locks/r").expect("mutex").lock().await;
    assert!(
        matches!(&refused, Err(Error::PermissionDenied { key, .. }) if key.starts_with("locks/r/")),
        "{refused:?}"
    );
    assert!(started.elapsed() < AT_ONCE, "the refusal took {:?}", started.elapsed());
    // bob's refused attempt left nothing: alice's entry is still the only one.
    bob.flush().await;
    let contenders = bob
        .mutex("locks/r")
        .expect("mutex")
        .contenders()
        .await
        .expect("contenders");
    assert_eq!(contenders.len(), 1, "{contenders:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_authentication_error_that_hides_the_password() {
    let secured = Secured::start().await;
    let started = Instant::now();
    let client = Client::new(secured.backend("alice", "not-alices-password-XYZ"));
    let refused = client.session_with(quick()).await;
    let Err(error @ Error::AuthenticationFailed { .. }) = &refused else {
        panic!("expected AuthenticationFailed, got {refused:?}");
    };
    assert!(started.elapsed() < AT_ONCE, "the refusal took {:?}", started.elapsed());
    let shown = format!("{error} {error:?}");
    assert!(shown.contains("alice"), "the error does not name the user: {shown}");
    assert!(
        !shown.contains("not-alices-password-XYZ"),
        "the error shows the password: {shown}"
    );

    let unknown = Client::new(secured.backend("mallory", "x")).session_with(quick()).await;
    assert!(
        matches!(unknown, Err(Error::AuthenticationFailed { .. })),
        "{unknown:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credentials_on_a_cluster_with_auth_is_a_typed_refusal() {
    let secured = Secured::start().await;
    let client = Client::new(Etcd::new(secured.cluster.endpoints()));
    let started = Instant::now();
    let outcome = match client.session_with(quick()).await {
        Err(error) => Err(error),
        Ok(session) => session.mutex("locks/n").expect("mutex").lock().await.map(drop),
    };
    assert!(
        matches!(
            outcome,
            Err(Error::AuthenticationFailed { .. } | Error::PermissionDenied { .. })
        ),
        "{outcome:?}"
    );
    assert!(started.elapsed() < AT_ONCE, "the refusal took {:?}", started.elapsed());
}

/// Keys for etcd's JWT tokens (ES256), made with openssl; the directory goes
/// with the value.
fn jwt_keys() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let private = dir.path().join("jwt.key");
    let public = dir.path().join("jwt.pub");
    for args in [
        vec![
            "ecparam",
            "-genkey",
            "-name",
            "prime256v1",
            "-noout",
            "-out",
            private.to_str().unwrap(),
        ],
        vec![
            "ec",
            "-in",
            private.to_str().unwrap(),
            "-pubout",
            "-out",
            public.to_str().unwrap(),
        ],
    ] {
        let out = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let flag = format!(
        "jwt,pub-key={},priv-key={},sign-method=ES256,ttl=2s",
        public.display(),
        private.display()
    );
    (dir, flag)
}

/// Tokens that expire every 2 s (etcd's JWT tokens with `ttl=2s`): a session
/// holding and a session waiting across several expiries keep working, the
/// holder is never declared lost, and the waiter is granted at the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_tokens_are_renewed_while_holding_and_waiting() {
    let (_keys, flag) = jwt_keys();
    let cluster = EtcdCluster::start_with_flags(&["--auth-token".to_owned(), flag]).expect("etcd with JWT tokens");
    let secured = Secured::on(cluster).await;
    let holder = secured.alice().session_with(quick()).await.expect("holder session");
    let waiter = secured.alice().session_with(quick()).await.expect("waiter session");
    let held = holder.mutex("locks/t").expect("mutex").lock().await.expect("lock");
    let queued = waiter.mutex("locks/t").expect("mutex");
    let waiting = tokio::spawn(async move { queued.lock().await });
    // No event marks a token's expiry: let three lifetimes pass.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        holder.state(),
        lockline::SessionState::Live,
        "the holder's session suffered"
    );
    assert!(held.is_held(), "the holder was told it lost the lock");
    assert!(
        !waiting.is_finished(),
        "the waiter stopped waiting: {:?}",
        waiting.await
    );
    // Requests after the expiry: a read, a release, the handoff.
    let contenders = holder
        .mutex("locks/t")
        .expect("mutex")
        .contenders()
        .await
        .expect("contenders");
    assert_eq!(contenders.len(), 2, "{contenders:?}");
    held.release().await.expect("release after the token expired");
    let granted = bounded("the waiter is granted", waiting)
        .await
        .expect("task")
        .expect("lock after the token expired");
    granted.release().await.expect("release");
    holder.close().await.expect("close");
    waiter.close().await.expect("close");
}

/// etcd forgets a simple token unused for `--auth-token-ttl` (here 1 s): a
/// lock held, or waited for, past that renews its token, and the release and
/// the handoff both work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_token_the_server_forgot_is_renewed() {
    let cluster = EtcdCluster::start_with_flags(&["--auth-token-ttl".to_owned(), "1".to_owned()]).expect("etcd");
    let secured = Secured::on(cluster).await;
    let holder = secured.alice().session_with(quick()).await.expect("holder");
    let guard = holder.mutex("locks/idle").expect("mutex").lock().await.expect("lock");
    let waiter_client = secured.alice();
    let waiter = waiter_client.session_with(quick()).await.expect("waiter");
    let mutex = waiter.mutex("locks/idle").expect("mutex");
    let waiting = spawn_queued(&waiter_client, async move { mutex.lock().await }).await;
    // No event marks the server forgetting a token: let three lifetimes pass.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(guard.is_held());
    guard.release().await.expect("release after the token was forgotten");
    let granted = bounded("the waiter is granted", waiting)
        .await
        .expect("task")
        .expect("lock after the token was forgotten");
    granted.release().await.expect("release");
}

/// A waiter whose role is revoked while it waits: its acquire fails with a
/// refusal; its entry, which it may no longer delete, ends with its session
/// (declared lost, no longer renewed), so the lock is free again within the
/// TTL instead of for as long as the waiter's process runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_role_is_revoked_gives_the_lock_back_within_its_ttl() {
    let secured = Secured::start().await;
    let short = quick().with_ttl(Duration::from_secs(3));
    let carol = Client::new(secured.backend("carol", CAROL_PASSWORD));
    let session = carol.session_with(short.clone()).await.expect("carol's session");
    let guard = session.mutex("locks/b").expect("mutex").lock().await.expect("lock");

    let alice = secured.alice();
    let alice_session = alice.session_with(short).await.expect("alice's session");
    let mutex = alice_session.mutex("locks/b").expect("mutex");
    let waiter = spawn_queued(&alice, async move { mutex.lock().await }).await;

    let mut root = secured.root().await;
    root.user_revoke_role("alice", "locks-rw").await.expect("revoke");
    guard.release().await.expect("release");
    let outcome = bounded("alice's acquire ends", waiter).await.expect("task");
    match &outcome {
        Err(error) => assert!(error.is_refusal(), "{error:?}"),
        Ok(guard) => panic!("alice, without rights, was granted {}", guard.key()),
    }
    // Alice's cleanup is refused: her session is given up, never renewed again.
    bounded("alice's cleanup", alice_session.flush()).await;
    assert_eq!(alice.stats().cleanup_failures, 1, "{:?}", alice.stats());
    assert_eq!(
        bounded("alice's session ends", alice_session.lost()).await,
        SessionState::Lost
    );
    // Carol gets the lock back once Alice's lease has run out.
    let again = bounded(
        "carol gets the lock again",
        session.mutex("locks/b").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    let left: Vec<String> = secured
        .keys()
        .await
        .into_iter()
        .filter(|k| k.starts_with("locks/b/"))
        .collect();
    assert_eq!(left, [again.key().to_owned()], "only carol's entry is left");
    again.release().await.expect("release");
    session.close().await.expect("close");
}

/// A request in flight while the cluster's users or roles change is refused
/// with "revision of auth store is old" (etcd checks permissions again when
/// it applies the request). Go's client authenticates again and retries, and
/// so does lockline: handoffs between two sessions while an administrator
/// changes another user's roles, over and over, never fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_of_users_or_roles_elsewhere_do_not_fail_requests_in_flight() {
    let secured = Secured::start().await;
    let a = secured.alice().session_with(quick()).await.expect("session a");
    let b = secured.alice().session_with(quick()).await.expect("session b");
    let mut root = secured.root().await;
    root.user_add("zed", "zed-pw", None).await.expect("add a user");
    root.role_add("zed-role").await.expect("add a role");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let changing = std::sync::Arc::clone(&stop);
    // At most a few hundred changes: enough to hit requests in flight many
    // times, not so many that the server's fsyncs starve the handoffs on a
    // small machine (a release then outlives its request timeout).
    let changes = tokio::spawn(async move {
        let mut changes = 0u32;
        while !changing.load(std::sync::atomic::Ordering::Relaxed) && changes < 400 {
            root.user_grant_role("zed", "zed-role").await.expect("grant");
            root.user_revoke_role("zed", "zed-role").await.expect("revoke");
            changes += 2;
        }
        changes
    });
    for round in 0..40 {
        for session in [&a, &b] {
            let guard = session
                .mutex("locks/c")
                .expect("mutex")
                .lock()
                .await
                .unwrap_or_else(|e| panic!("lock in round {round}: {e:?}"));
            guard
                .release()
                .await
                .unwrap_or_else(|e| panic!("release in round {round}: {e:?}"));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let changes = changes.await.expect("changes");
    assert!(changes > 2, "the roles did not change while the sessions worked");
    assert_eq!(a.state(), SessionState::Live);
    assert_eq!(b.state(), SessionState::Live);
}

/// With JWT tokens, which carry the auth revision they were issued at, a
/// change of users or roles makes every earlier token stale: a waiter whose
/// watch is opened or re-opened after such a change is still granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_granted_across_a_change_of_roles_with_jwt_tokens() {
    let (_keys, flag) = jwt_keys();
    let flag = flag.replace("ttl=2s", "ttl=10m");
    let cluster = EtcdCluster::start_with_flags(&["--auth-token".to_owned(), flag]).expect("etcd with JWT tokens");
    let secured = Secured::on(cluster).await;
    let holder = secured.alice().session_with(quick()).await.expect("holder");
    let guard = holder.mutex("locks/j").expect("mutex").lock().await.expect("lock");
    let mut root = secured.root().await;
    root.user_add("zed", "zed-pw", None).await.expect("add a user");
    // The waiter arrives after the change, with a token issued before it.
    let waiter_client = secured.alice();
    let waiter = waiter_client.session_with(quick()).await.expect("waiter");
    root.role_add("zed-role").await.expect("add a role");
    let mutex = waiter.mutex("locks/j").expect("mutex");
    let waiting = spawn_queued(&waiter_client, async move { mutex.lock().await }).await;
    root.user_grant_role("zed", "zed-role").await.expect("grant");
    guard.release().await.expect("release");
    let granted = bounded("the waiter is granted", waiting)
        .await
        .expect("task")
        .expect("lock across the change");
    granted.release().await.expect("release");
}
