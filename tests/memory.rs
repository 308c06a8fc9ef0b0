//! Behaviour specific to the in-process backend.

use std::time::Duration;

use lockline::backend::{AppendRequest, Conflicts};
use lockline::{Client, EntryKind, MemoryBackend, SessionOptions, SessionState};

/// A session whose every handle is gone without `close()` (a crashed process)
/// expires one TTL later, and its entries go with it.
#[tokio::test(start_paused = true)]
async fn an_abandoned_session_expires_after_its_ttl() {
    let store = MemoryBackend::new();
    let ttl = Duration::from_secs(3);
    let crashed = Client::new(store.clone())
        .session_with(SessionOptions::new().with_ttl(ttl))
        .await
        .expect("session");
    let request = AppendRequest {
        dir: "crash",
        kind: EntryKind::Mutex,
        attempt: "a1",
        value: b"",
        conflicts: Conflicts::All,
        nearest: 1,
    };
    crashed.backend_session().append(&request).await.expect("append");
    assert_eq!(store.keys("crash").len(), 1);
    drop(crashed);

    let survivor = Client::new(store.clone()).session().await.expect("session");
    let started = tokio::time::Instant::now();
    let guard = survivor.mutex("crash").expect("mutex").lock().await.expect("lock");
    assert!(
        started.elapsed() >= ttl,
        "granted after {:?}, before the TTL",
        started.elapsed()
    );
    assert_eq!(store.keys("crash"), vec![guard.key().to_owned()]);
}

#[tokio::test]
async fn expire_ends_a_session_and_its_entries() {
    let store = MemoryBackend::new();
    let session = Client::new(store.clone()).session().await.expect("session");
    let _guard = session.mutex("x").expect("mutex").lock().await.expect("lock");
    assert!(store.expire(session.id()));
    assert_eq!(session.state(), SessionState::Lost);
    assert!(store.keys("x").is_empty());
    assert!(!store.expire(session.id()), "a session expires once");
}

#[tokio::test]
async fn separate_stores_do_not_contend() {
    let a = Client::memory().session().await.expect("session");
    let b = Client::memory().session().await.expect("session");
    let _held = a.mutex("same").expect("mutex").lock().await.expect("lock");
    assert!(b.mutex("same").expect("mutex").try_lock().await.expect("try").is_some());
}

/// A lock-mode append gives the queue as read with it (its own entry
/// last); a value watch until watches past the values it does not want
/// and ends with the first it wants, or `None` once the entry goes.
#[tokio::test]
async fn lock_mode_appends_read_the_queue_and_value_watches_skip_unwanted_values() {
    let store = MemoryBackend::new();
    let session = Client::new(store.clone()).session().await.expect("session");
    let remote = std::sync::Arc::clone(session.backend_session());
    let request = AppendRequest {
        dir: "modes",
        kind: EntryKind::Dlm,
        attempt: "a1",
        value: b"start",
        conflicts: Conflicts::All,
        nearest: 0,
    };
    let appended = remote.append(&request).await.expect("append");
    let queue = appended.queue.expect("the queue, read with the append");
    assert_eq!(queue, remote.read_queue("modes").await.expect("read"));
    assert_eq!(queue.slots.last().map(|slot| &slot.entry), Some(&appended.entry));
    let mutex = AppendRequest {
        kind: EntryKind::Mutex,
        dir: "plain",
        ..request
    };
    assert_eq!(remote.append(&mutex).await.expect("append").queue, None);

    let held = appended.entry;
    let watching = {
        let (remote, held) = (std::sync::Arc::clone(&remote), held.clone());
        tokio::spawn(async move {
            remote
                .watch_value_until(&held, b"start", &|v| v.starts_with(b"wanted"))
                .await
        })
    };
    for value in [&b"unwanted-1"[..], b"unwanted-2", b"wanted"] {
        write_value(&remote, "modes", &held, value).await;
        tokio::task::yield_now().await;
    }
    let heard = watching.await.expect("join").expect("watch");
    assert_eq!(heard.as_deref(), Some(&b"wanted"[..]));

    let watching = {
        let (remote, held) = (std::sync::Arc::clone(&remote), held.clone());
        tokio::spawn(async move { remote.watch_value_until(&held, b"wanted", &|_| false).await })
    };
    write_value(&remote, "modes", &held, b"other").await;
    assert!(remote.remove(&held).await.expect("remove"));
    assert_eq!(watching.await.expect("join").expect("watch"), None);
}

/// A lock-mode append with a window reads back only that many entries
/// before its own (and its own); without one, or with one wider than the
/// queue, the whole queue. An EX request behind a long queue of holders
/// waits on the nearest, and is granted once every holder is gone.
#[tokio::test]
async fn a_lock_mode_append_reads_its_window_of_the_queue() {
    use lockline::LockMode;
    let store = MemoryBackend::new();
    let session = Client::new(store.clone()).session().await.expect("session");
    let remote = std::sync::Arc::clone(session.backend_session());
    let append = |attempt: &'static str, nearest: usize| lock_mode_append(&remote, "window", attempt, b"", nearest);
    for attempt in ["a1", "a2", "a3", "a4", "a5"] {
        append(attempt, 0).await;
    }
    let windowed = append("a6", 2).await;
    let keys = |appended: &lockline::backend::Appended| -> Vec<String> {
        let queue = appended.queue.as_ref().expect("the queue, read with the append");
        queue.slots.iter().map(|slot| slot.entry.key.clone()).collect()
    };
    let all = store.keys("window");
    assert_eq!(all.len(), 6);
    assert_eq!(keys(&windowed), all[3..].to_vec());
    assert_eq!(keys(&append("a7", 100).await).len(), 7);
    assert_eq!(keys(&append("a8", 0).await).len(), 8);
    drop(remote);
    session.close().await.expect("close");

    // Through the API: more holders than an EX request's window. Its window
    // holds only NL holders, which do not block it; the whole queue holds a
    // PR holder before them, which does.
    let client = Client::memory();
    let reader = client.session().await.expect("session");
    let pr = reader
        .resource("w")
        .expect("resource")
        .lock(LockMode::Pr)
        .await
        .expect("PR");
    let mut nl = Vec::new();
    for _ in 0..5 {
        let s = client.session().await.expect("session");
        nl.push(s.resource("w").expect("resource").lock(LockMode::Nl).await.expect("NL"));
    }
    let writer = client.session().await.expect("session");
    let resource = writer.resource("w").expect("resource");
    assert!(
        resource.try_lock(LockMode::Ex).await.expect("try").is_none(),
        "an EX granted beside a PR holder outside its window"
    );
    let waiting = tokio::spawn(async move { resource.lock(LockMode::Ex).await });
    tokio::time::timeout(Duration::from_secs(20), client.wait_for_stats(|s| s.waits >= 1))
        .await
        .expect("the EX request waits");
    assert!(!waiting.is_finished(), "granted beside a PR holder");
    pr.release().await.expect("release");
    let guard = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("granted once the PR holder is gone")
        .expect("task")
        .expect("EX");
    assert_eq!(guard.mode(), LockMode::Ex);
    assert_eq!(nl.len(), 5, "beside the NL holders");
}

/// A waiter's read after its wake gives the lock-mode queue only through
/// the first request that waits for EX and was never granted (a value
/// beginning with `WAITING_EX`), saying it is a prefix; a queue with no
/// such request before its last entry, whole.
#[tokio::test]
async fn a_woken_read_gives_the_queue_through_the_first_waiting_ex_request() {
    use lockline::backend::WAITING_EX;
    let store = MemoryBackend::new();
    let session = Client::new(store.clone()).session().await.expect("session");
    let remote = std::sync::Arc::clone(session.backend_session());
    let waiting = [WAITING_EX, &b"0 0 0 0 00000000"[..]].concat();
    let append = |attempt: &'static str, value: Vec<u8>| {
        let remote = std::sync::Arc::clone(&remote);
        async move { lock_mode_append(&remote, "prefix", attempt, &value, 0).await.entry }
    };
    let read = || {
        let remote = std::sync::Arc::clone(&remote);
        async move {
            let (queue, whole) = remote.read_queue_woken("prefix").await.expect("read");
            let keys: Vec<String> = queue.slots.iter().map(|slot| slot.entry.key.clone()).collect();
            (keys, whole)
        }
    };
    let held = append("held", b"dlm2 EX EX 1 0 0 0 00000000".to_vec()).await;
    let reader = append("reader", b"dlm2 - PR 0 0 0 0 00000000".to_vec()).await;
    assert_eq!(read().await, (vec![held.key.clone(), reader.key.clone()], true));
    let writer = append("writer", waiting.clone()).await;
    assert_eq!(
        read().await,
        (vec![held.key.clone(), reader.key.clone(), writer.key.clone()], true),
        "ending at the last entry is the whole queue"
    );
    append("behind", b"dlm2 - PR 0 0 0 0 00000000".to_vec()).await;
    assert_eq!(read().await, (vec![held.key, reader.key, writer.key], false));
    assert_eq!(remote.read_queue("prefix").await.expect("read").slots.len(), 4);
}

/// Appends a lock-mode entry to `dir` through the backend session, reading
/// back `nearest` entries before it (0: the whole queue).
async fn lock_mode_append(
    remote: &std::sync::Arc<dyn lockline::backend::BackendSession>,
    dir: &str,
    attempt: &str,
    value: &[u8],
    nearest: usize,
) -> lockline::backend::Appended {
    let request = AppendRequest {
        dir,
        kind: EntryKind::Dlm,
        attempt,
        value,
        conflicts: Conflicts::All,
        nearest,
    };
    remote.append(&request).await.expect("append")
}

/// A waiter's watch of the entry that blocks it
/// (`BackendSession::watch_blocker_until`) hears only the owner's writes
/// while the value seen is a request never granted or a lock held in its
/// mode: another session's grant of the request is watched past unheard
/// (in an EX chain a release's grant wakes no one but the request), and
/// the owner's next write ends the watch with that write's value. Behind a
/// conversion every writer is heard again, and the entry's removal ends
/// the watch.
#[tokio::test]
async fn a_blocker_watch_hears_only_the_owner_while_the_entry_is_waiting_or_settled() {
    let store = MemoryBackend::new();
    let session = || async { Client::new(store.clone()).session().await.expect("session") };
    let (owner, watcher, other) = (session().await, session().await, session().await);
    let remotes = [&owner, &watcher, &other].map(|s| std::sync::Arc::clone(s.backend_session()));
    let [owner_remote, watcher_remote, other_remote] = remotes;
    let waiting = b"dlm2 - EX 0 128 0 0 00000001";
    let entry = lock_mode_append(&owner_remote, "quiet", "a1", waiting, 0).await.entry;
    let watch = |seen: &'static [u8]| {
        let (remote, entry) = (std::sync::Arc::clone(&watcher_remote), entry.clone());
        tokio::spawn(async move { remote.watch_blocker_until(&entry, seen, &|_| true).await })
    };

    // Waiting, then granted by another session: unheard; the owner's mark is heard.
    let watching = watch(waiting);
    tokio::task::yield_now().await;
    let granted = b"dlm2 EX EX 0 128 0 0 00000002";
    write_value(&other_remote, "quiet", &entry, granted).await;
    tokio::task::yield_now().await;
    let marked_by_owner = b"dlm2 EX EX 0 192 0 0 00000003";
    write_value(&owner_remote, "quiet", &entry, marked_by_owner).await;
    let heard = bounded(watching).await.expect("join").expect("watch");
    assert_eq!(
        heard.as_deref(),
        Some(&marked_by_owner[..]),
        "heard another session's grant"
    );

    // Converting: another session's write is heard.
    let converting = b"dlm2 EX PR 0 192 0 7 00000004";
    write_value(&owner_remote, "quiet", &entry, converting).await;
    let watching = watch(converting);
    tokio::task::yield_now().await;
    let conversion_granted = b"dlm2 PR PR 0 192 0 0 00000005";
    write_value(&other_remote, "quiet", &entry, conversion_granted).await;
    let heard = bounded(watching).await.expect("join").expect("watch");
    assert_eq!(heard.as_deref(), Some(&conversion_granted[..]));

    // Settled again: the owner's removal ends the watch.
    let watching = watch(conversion_granted);
    tokio::task::yield_now().await;
    assert!(owner_remote.remove(&entry).await.expect("remove"));
    assert_eq!(bounded(watching).await.expect("join").expect("watch"), None);
}

/// `step`, or a panic after 10 s: a watch that should end never hangs the test.
async fn bounded<T>(step: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), step)
        .await
        .expect("the watch did not end within 10 s")
}

/// `remote` sets `entry`'s value under `dir` (an update of the queue, as a
/// lock-mode write is).
async fn write_value(
    remote: &std::sync::Arc<dyn lockline::backend::BackendSession>,
    dir: &str,
    entry: &lockline::backend::Entry,
    value: &[u8],
) {
    let set = [(entry, value)];
    let update = lockline::backend::QueueUpdate {
        dir,
        unchanged: &[],
        present: &[entry],
        set: &set,
        delete: &[],
        block: None,
    };
    remote.update_queue(&update).await.expect("update").expect("applied");
}
