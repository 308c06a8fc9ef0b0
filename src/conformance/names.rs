//! Options and names: bad input gets a typed error; recipe words and nested
//! names are locks of their own.

use super::*;

/// Names a backend cannot store and absurd options get typed errors.
pub async fn invalid_input_is_rejected<F: Fixture>(fixture: &F) {
    let client = fixture.client().await;
    let s = session(fixture, &client).await;
    // A trailing '/' ("a/") is etcd-only: each backend's tests check it.
    for name in ["", "/", "a//b", "a//", "a/../b", "nul\0byte", "bell\u{7}"] {
        match s.mutex(name) {
            Err(Error::InvalidName { .. }) => {}
            other => panic!("name {name:?} must be refused, got {other:?}"),
        }
    }
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_secs(2 * 24 * 3600),
    ] {
        match client.session_with(SessionOptions::new().with_ttl(ttl)).await {
            Err(Error::InvalidOptions { .. }) => {}
            other => panic!("ttl {ttl:?} must be refused, got {other:?}"),
        }
    }
    let margin_too_big = SessionOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_safety_margin(Duration::from_secs(3));
    assert!(matches!(
        client.session_with(margin_too_big).await,
        Err(Error::InvalidOptions { .. })
    ));
}

/// Lock names under one base: nested names (`db`, `db/read`, `db/x`) and
/// names whose segments are recipe words of some backend's layout.
const WORD_NAMES: &[&str] = &[
    "db",
    "db/read",
    "db/write",
    "db/semaphore",
    "db/x",
    "db/lock",
    "db/election",
    "db/latch",
    "db/lease",
    "db/__READ__",
    "db/__WRIT__",
    "db/__lock__",
    "read",
    "write/read",
    "semaphore",
    "election",
    "lock",
    "latch",
    "lease",
    "__READ__",
];

/// Lock names whose segments are recipe words (`read`, `write`, `semaphore`,
/// `election`, `lock`, `latch`, `lease`, `__READ__`, ...) and nested names
/// (`db` with `db/read` and `db/x`) are separate locks on every backend: all
/// can be held at once, a waiter is granted when its own lock is released
/// while the others stay held, and each name still excludes.
pub async fn recipe_words_and_nested_names_are_separate_locks<F: Fixture>(fixture: &F) {
    let base = unique("words");
    let names: Vec<String> = WORD_NAMES.iter().map(|n| format!("{base}/{n}")).collect();
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);

    // Every name held at once by one session: none blocks another.
    let mut held = Vec::new();
    for name in &names {
        let guard = bounded("try_lock", sa.mutex(name).expect("mutex").try_lock())
            .await
            .expect("try_lock");
        held.push(guard.unwrap_or_else(|| panic!("{name} is blocked by other locks")));
    }
    // Each still excludes another session, nested keys created after the
    // holder's notwithstanding.
    for name in &names {
        let other = bounded("try_lock", sb.mutex(name).expect("mutex").try_lock())
            .await
            .expect("try_lock");
        assert!(other.is_none(), "{name} granted to a second session");
    }
    // A waiter is granted when its own lock's holder leaves, while every
    // other lock stays held (released in reverse, so that each waiter's
    // nearest keys under its prefix belong to other locks).
    let mut granted = Vec::new();
    for (name, guard) in names.iter().zip(held).rev() {
        let mutex = sb.mutex(name).expect("mutex");
        let waiter = queue_waiter(&b, mutex).await;
        guard.release().await.expect("release");
        let next = bounded(&format!("{name}: the waiter is granted"), waiter)
            .await
            .expect("task")
            .expect("lock");
        granted.push(next);
    }
    for guard in granted {
        guard.release().await.expect("release");
    }

    // The other recipes too.
    let rw_names = [
        format!("{base}/rw"),
        format!("{base}/rw/read"),
        format!("{base}/rw/write"),
    ];
    let mut writers = Vec::new();
    for name in &rw_names {
        let write = bounded("try_write", sa.rwlock(name).expect("rwlock").try_write())
            .await
            .expect("try_write");
        writers.push(write.unwrap_or_else(|| panic!("rwlock {name} is blocked by other locks")));
        let read = bounded("try_read", sb.rwlock(name).expect("rwlock").try_read())
            .await
            .expect("try_read");
        assert!(read.is_none(), "rwlock {name}: a reader beside a writer");
    }
    let sem_names = [
        format!("{base}/sem"),
        format!("{base}/sem/semaphore"),
        format!("{base}/sem/lock"),
    ];
    let mut permits = Vec::new();
    for name in &sem_names {
        let permit = bounded("try_acquire", sa.semaphore(name, 1).expect("semaphore").try_acquire())
            .await
            .expect("try_acquire");
        permits.push(permit.unwrap_or_else(|| panic!("semaphore {name} is blocked by other locks")));
        let second = bounded("try_acquire", sb.semaphore(name, 1).expect("semaphore").try_acquire())
            .await
            .expect("try_acquire");
        assert!(second.is_none(), "semaphore {name}: two permits of one");
    }
    let el_names = [
        format!("{base}/el"),
        format!("{base}/el/election"),
        format!("{base}/el/latch"),
    ];
    let mut leaders = Vec::new();
    for name in &el_names {
        let leading = bounded(
            &format!("{name}: campaign"),
            sa.election(name).expect("election").campaign(b"a"),
        )
        .await
        .expect("campaign");
        leaders.push(leading);
    }
    for guard in writers {
        guard.release().await.expect("release");
    }
    for permit in permits {
        permit.release().await.expect("release");
    }
    for leading in leaders {
        leading.resign().await.expect("resign");
    }

    // Mutual exclusion on every name at once, two sessions contending on each.
    let inside: Vec<Arc<AtomicUsize>> = names.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (name, inside) in names.iter().zip(&inside) {
        for session in [&sa, &sb] {
            let mutex = session.mutex(name).expect("mutex");
            let (inside, name) = (Arc::clone(inside), name.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    let guard = lock(&mutex).await;
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "{name}: two holders at once");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        bounded("a contender finishes", task).await.expect("contender task");
    }
    for name in &names {
        assert!(
            keys(&sa.mutex(name).expect("mutex")).await.is_empty(),
            "{name}: entries left"
        );
    }
}
