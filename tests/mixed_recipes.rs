//! Recipes that cannot share a queue are refused on one name (memory backend).

use lockline::{Client, EntryKind, Error, MemoryBackend};

#[tokio::test]
async fn a_semaphore_and_a_mutex_never_share_a_name() {
    let store = MemoryBackend::new();
    let holder = Client::new(store.clone()).session().await.expect("session");
    let other = Client::new(store.clone()).session().await.expect("session");

    let guard = holder.mutex("mixed/a").expect("mutex").lock().await.expect("lock");
    match other.semaphore("mixed/a", 3).expect("semaphore").acquire().await {
        Err(Error::InvalidName { name, reason }) => {
            assert_eq!(name, "mixed/a");
            assert!(reason.contains("semaphore") && reason.contains("mutex"), "{reason}");
        }
        other => panic!("a permit beside a mutex holder must be refused, got {other:?}"),
    }
    guard.release().await.expect("release");

    let permit = holder
        .semaphore("mixed/b", 2)
        .expect("semaphore")
        .acquire()
        .await
        .expect("acquire");
    for refused in [
        other.mutex("mixed/b").expect("mutex").try_lock().await.map(|_| ()),
        other.rwlock("mixed/b").expect("rwlock").read().await.map(|_| ()),
        other
            .election("mixed/b")
            .expect("election")
            .campaign(b"x")
            .await
            .map(|_| ()),
    ] {
        assert!(matches!(refused, Err(Error::InvalidName { .. })), "{refused:?}");
    }
    other.flush().await;
    assert_eq!(store.keys("mixed/b").len(), 1, "a refused contender left an entry");
    permit.release().await.expect("release");
}

#[test]
fn which_kinds_queue_together() {
    use EntryKind::*;
    for a in [Mutex, Read, Write, Election] {
        for b in [Mutex, Read, Write, Election] {
            assert!(a.queues_with(b), "{a:?} with {b:?}");
        }
        assert!(!a.queues_with(Semaphore) && !Semaphore.queues_with(a));
    }
    assert!(Semaphore.queues_with(Semaphore));
    for a in [Mutex, Read, Write, Election, Semaphore, Foreign] {
        assert!(!a.queues_with(Foreign) && !Foreign.queues_with(a));
    }
}

/// A trailing '/' is kept on the memory backend, as on etcd: `a/` and `a`
/// are two names.
#[tokio::test]
async fn a_trailing_slash_names_its_own_lock() {
    let session = Client::memory().session().await.expect("session");
    let plain = session.mutex("slash").expect("mutex").lock().await.expect("lock");
    let slashed = session
        .mutex("slash/")
        .expect("a trailing '/' is accepted")
        .try_lock()
        .await
        .expect("try_lock")
        .expect("another lock");
    slashed.release().await.expect("release");
    plain.release().await.expect("release");
    assert!(matches!(session.mutex("slash//"), Err(Error::InvalidName { .. })));
}
