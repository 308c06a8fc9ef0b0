//! Fencing and fenced writes: a stale holder's release and writes are
//! refused by the server; a live holder's land, all or nothing.

use super::*;

/// A released guard's entry is fenced: a stale guard whose entry was deleted by
/// someone else cannot delete the newer holder's entry, and learns of its loss.
pub async fn fenced_release_spares_newer_holder<F: Fixture>(fixture: &F) {
    let name = unique("fence");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let stale = lock(&sa.mutex(&name).expect("mutex")).await;
    // Someone else deletes the holder's entry.
    let removed = bounded("remove", sb.backend_session().remove(stale.entry()))
        .await
        .expect("remove");
    assert!(removed);
    bounded("the stale holder learns of the loss", stale.lost()).await;
    assert!(!stale.is_held());
    // The same session takes the lock again: on etcd, the same key.
    let newer = lock(&sa.mutex(&name).expect("mutex")).await;
    assert!(newer.token() > stale.token());
    match bounded("stale release", stale.release()).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("a stale release must report the loss, got {other:?}"),
    }
    assert!(newer.is_held());
    assert_eq!(
        keys(&sb.mutex(&name).expect("mutex")).await,
        vec![newer.key().to_owned()]
    );
    // And a contender of another session still waits for the newer holder.
    assert!(bounded("try_lock", sb.mutex(&name).expect("mutex").try_lock())
        .await
        .expect("try_lock")
        .is_none());
    newer.release().await.expect("release");
}

/// The primitive itself: removing an old entry never removes a newer entry of
/// the same session under the same name.
pub async fn fenced_remove_primitive<F: Fixture>(fixture: &F) {
    let name = unique("fence-primitive");
    let client = fixture.client().await;
    let s = session(fixture, &client).await;
    let first = lock(&s.mutex(&name).expect("mutex")).await;
    let old = first.entry().clone();
    first.release().await.expect("release");
    let second = lock(&s.mutex(&name).expect("mutex")).await;
    assert!(!bounded("remove", s.backend_session().remove(&old))
        .await
        .expect("remove"));
    assert!(second.is_held());
    assert_eq!(
        keys(&s.mutex(&name).expect("mutex")).await,
        vec![second.key().to_owned()]
    );
    second.release().await.expect("release");
}

/// A lock name for fenced-write cases, absolute so that the same text is a
/// valid key on every backend, and the base of the keys those cases write.
fn fenced_names(what: &str) -> (String, String) {
    let name = format!("/{}", unique(what));
    let data = format!("{name}-data");
    (name, data)
}

async fn read(session: &Session, key: &str) -> Option<Vec<u8>> {
    bounded("read", session.read(key)).await.expect("read")
}

fn bytes(text: &str) -> Option<Vec<u8>> {
    Some(text.as_bytes().to_vec())
}

/// A holder's fenced writes land, all of them in one call, and every
/// session reads them back; puts overwrite and create, deletes remove (a
/// missing key is no error); an empty batch checks the fence alone.
pub async fn fenced_write_lands_while_held<F: Fixture>(fixture: &F) {
    let (name, data) = fenced_names("fenced");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let (one, two, three) = (
        format!("{data}/one"),
        format!("{data}/two"),
        format!("{data}/deep/three"),
    );
    assert_eq!(read(&sb, &one).await, None);
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    bounded(
        "write",
        holder.write_if_held([Write::put(&one, "1"), Write::put(&two, "2"), Write::put(&three, "3")]),
    )
    .await
    .expect("a holder's fenced write lands");
    assert_eq!(read(&sb, &one).await, bytes("1"));
    assert_eq!(read(&sb, &two).await, bytes("2"));
    assert_eq!(read(&sb, &three).await, bytes("3"));
    bounded(
        "write",
        holder.write_if_held([
            Write::put(&one, "1b"),
            Write::delete(&two),
            Write::delete(format!("{data}/never-written")),
        ]),
    )
    .await
    .expect("overwrite and delete");
    assert_eq!(read(&sb, &one).await, bytes("1b"));
    assert_eq!(read(&sb, &two).await, None);
    assert_eq!(read(&sa, &three).await, bytes("3"));
    bounded("write", holder.write_if_held([]))
        .await
        .expect("an empty batch checks the fence");
    holder.release().await.expect("release");
    // Guarded state outlives the lock and the session.
    sa.close().await.expect("close");
    assert_eq!(read(&sb, &one).await, bytes("1b"));
}

/// After its session expired and a newer holder was granted, a stale
/// holder's fenced writes (several in one call) fail with `SessionLost` and
/// change nothing, whether the client knows of the loss yet (the backend
/// primitive, fenced on the server) or not; the newer holder's land.
pub async fn fenced_write_refused_after_session_loss<F: Fixture>(fixture: &F) {
    let (name, data) = fenced_names("fenced-loss");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let (one, two, three) = (format!("{data}/one"), format!("{data}/two"), format!("{data}/three"));
    let holder = lock(&sa.mutex(&name).expect("mutex")).await;
    bounded(
        "write",
        holder.write_if_held([Write::put(&one, "1"), Write::put(&two, "2")]),
    )
    .await
    .expect("write");
    let waiter = queue_waiter(&b, sb.mutex(&name).expect("mutex")).await;
    fixture.expire(&sa).await;
    let newer = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    let stale_batch = [
        Write::put(&one, "stale"),
        Write::delete(&two),
        Write::put(&three, "stale"),
    ];
    match bounded(
        "a stale write through the backend",
        sa.backend_session().write_if_held(holder.entry(), &stale_batch),
    )
    .await
    {
        Ok(false) | Err(Error::SessionLost { .. }) => {}
        // A backend whose connection the expiry broke cannot tell whether
        // the write reached the server before it broke: it says so, and the
        // reads below show that nothing landed.
        Err(Error::Unavailable { .. }) => {}
        other => panic!("the server must refuse a lost session's fenced write, got {other:?}"),
    }
    bounded("the holder learns of the loss", holder.lost()).await;
    match bounded("a stale write", holder.write_if_held(stale_batch.clone())).await {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("a lost holder's fenced write must fail with SessionLost, got {other:?}"),
    }
    assert_eq!(read(&sb, &one).await, bytes("1"), "a stale write landed");
    assert_eq!(read(&sb, &two).await, bytes("2"), "a stale delete landed");
    assert_eq!(read(&sb, &three).await, None, "a stale create landed");
    bounded(
        "write",
        newer.write_if_held([Write::put(&one, "newer"), Write::delete(&two)]),
    )
    .await
    .expect("the newer holder writes");
    assert_eq!(read(&sb, &one).await, bytes("newer"));
    assert_eq!(read(&sb, &two).await, None);
    newer.release().await.expect("release");
}

/// After its entry was deleted by someone else and the same session took
/// the lock again (on etcd: the same key, a newer create revision), the
/// stale holder's fenced writes fail with `LockLost` and change nothing:
/// the fence is the entry itself, not its key.
pub async fn fenced_write_refused_after_entry_deleted<F: Fixture>(fixture: &F) {
    let (name, data) = fenced_names("fenced-deleted");
    let (a, b) = (fixture.client().await, fixture.client().await);
    let (sa, sb) = (session(fixture, &a).await, session(fixture, &b).await);
    let (one, two) = (format!("{data}/one"), format!("{data}/two"));
    let stale = lock(&sa.mutex(&name).expect("mutex")).await;
    bounded("write", stale.write_if_held([Write::put(&one, "1")]))
        .await
        .expect("write");
    let removed = bounded("remove", sb.backend_session().remove(stale.entry()))
        .await
        .expect("remove");
    assert!(removed);
    let batch = [Write::put(&one, "stale"), Write::put(&two, "stale")];
    let refused = bounded(
        "a stale write",
        sa.backend_session().write_if_held(stale.entry(), &batch),
    )
    .await
    .expect("write_if_held");
    assert!(!refused, "the server applied a write fenced on a deleted entry");
    bounded("the stale holder learns of the loss", stale.lost()).await;
    let newer = lock(&sa.mutex(&name).expect("mutex")).await;
    assert!(newer.token() > stale.token());
    let refused = bounded(
        "a stale write",
        sa.backend_session().write_if_held(stale.entry(), &batch),
    )
    .await
    .expect("write_if_held");
    assert!(
        !refused,
        "the server applied a write fenced on an older entry of the same key"
    );
    match bounded("a stale write", stale.write_if_held(batch.clone())).await {
        Err(Error::LockLost { key }) => assert_eq!(key, stale.key()),
        other => panic!("a stale holder's fenced write must fail with LockLost, got {other:?}"),
    }
    assert_eq!(read(&sb, &one).await, bytes("1"), "a stale write landed");
    assert_eq!(read(&sb, &two).await, None, "a stale write landed");
    bounded("write", newer.write_if_held(batch))
        .await
        .expect("the newer holder writes");
    assert_eq!(read(&sb, &two).await, bytes("stale"));
    newer.release().await.expect("release");
}

/// A batch with one bad write (an empty key, a key twice, a key under the
/// lock's own entries) is refused whole with a typed error: nothing of it is
/// written; reads refuse an empty key too.
pub async fn fenced_write_batch_is_all_or_nothing<F: Fixture>(fixture: &F) {
    let (name, data) = fenced_names("fenced-batch");
    let client = fixture.client().await;
    let s = session(fixture, &client).await;
    let (one, two) = (format!("{data}/one"), format!("{data}/two"));
    let holder = lock(&s.mutex(&name).expect("mutex")).await;
    bounded("write", holder.write_if_held([Write::put(&one, "1")]))
        .await
        .expect("write");
    let refused = [
        (
            vec![Write::put(&one, "2"), Write::put(&two, "2"), Write::put("", "x")],
            "an empty key",
        ),
        (
            vec![Write::put(&one, "2"), Write::put(&two, "2"), Write::delete(&one)],
            "a key twice",
        ),
        (
            vec![Write::put(&two, "2"), Write::put(format!("{name}/state"), "x")],
            "a key under the lock's own entries",
        ),
    ];
    for (batch, what) in refused {
        match bounded("a refused batch", holder.write_if_held(batch)).await {
            Err(Error::InvalidName { .. } | Error::InvalidOptions { .. }) => {}
            other => panic!("a batch with {what} must be refused, got {other:?}"),
        }
        assert_eq!(
            read(&s, &one).await,
            bytes("1"),
            "a batch with {what} was partly written"
        );
        assert_eq!(read(&s, &two).await, None, "a batch with {what} was partly written");
    }
    match bounded("read", s.read("")).await {
        Err(Error::InvalidName { .. }) => {}
        other => panic!("an empty key must be refused, got {other:?}"),
    }
    assert!(holder.is_held());
    holder.release().await.expect("release");
}

/// A value too large for the server (a campaign's, a proclaim's, a fenced
/// write's) is refused at once with `InvalidOptions` saying so, never
/// retried until the caller gives up, and leaves no entry. `key` is a
/// fenced-write key valid on the backend under test. Not for the memory
/// backend, which has no size limit.
pub async fn values_too_large_are_refused(client: &Client, key: &str) {
    let session = bounded("open a session", client.session()).await.expect("session");
    let huge = vec![b'a'; 3 << 20];
    let too_large = |what: &str, outcome: crate::Result<()>| match outcome {
        Err(Error::InvalidOptions { reason }) => assert!(reason.contains("too large"), "{what}: {reason}"),
        other => panic!("{what}: expected InvalidOptions, got {other:?}"),
    };
    let name = unique("large");
    let election = session.election(&name).expect("election");
    too_large(
        "campaign",
        bounded("campaign", election.campaign(&huge)).await.map(drop),
    );
    assert!(
        bounded("queue", session.queue(&name)).await.expect("queue").is_empty(),
        "no candidate left behind"
    );
    let guard = lock(&session.mutex(&unique("large-m")).expect("mutex")).await;
    too_large(
        "fenced write",
        bounded(
            "fenced write",
            guard.write_if_held([crate::Write::put(key, huge.clone())]),
        )
        .await,
    );
    let leadership = bounded("campaign", election.campaign(b"small"))
        .await
        .expect("campaign");
    too_large("proclaim", bounded("proclaim", leadership.proclaim(&huge)).await);
    assert!(leadership.is_held() && guard.is_held());
    guard.release().await.expect("release");
    leadership.resign().await.expect("resign");
}
