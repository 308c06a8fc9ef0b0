//! Names and values at their edges: trailing spaces, a value too big for
//! the server.

use super::*;

/// Names that differ only in trailing spaces are different names (the
/// SQL chapter: "names of 512 bytes and any characters" are separate locks), and
/// so are fenced-write keys.
async fn trailing_spaces_make_different_names(db: Db) {
    let client = Client::new(Sql::new(db.url()));
    let (a, b) = (
        client.session_with(options(10_000)).await.expect("session"),
        client.session_with(options(10_000)).await.expect("session"),
    );
    let held = a.mutex("pad").expect("mutex").lock().await.expect("lock");
    let other = b.mutex("pad ").expect("mutex").try_lock().await.expect("try_lock");
    assert!(
        other.is_some(),
        "\"pad \" is taken while \"pad\" is held: one queue for two names"
    );
    held.write_if_held([lockline::Write::put("cfg", b"plain".to_vec())])
        .await
        .expect("write");
    held.write_if_held([lockline::Write::put("cfg  ", b"padded".to_vec())])
        .await
        .expect("write");
    assert_eq!(
        (a.read("cfg").await.expect("read"), a.read("cfg  ").await.expect("read")),
        (Some(b"plain".to_vec()), Some(b"padded".to_vec())),
        "fenced-write keys \"cfg\" and \"cfg  \" are one key"
    );
    held.release().await.expect("release");
    if let Some(other) = other {
        other.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_trailing_spaces_make_different_names() {
    trailing_spaces_make_different_names(Db::postgres()).await;
}

// Was a defect, now fixed (MariaDB/MySQL, names and keys): the name and key columns are
// utf8mb4_bin (my.rs DDL: entries.name, names.name, data.key), a PAD SPACE
// collation on MariaDB, which compares 'pad' = 'pad '. Two locks whose names
// differ in trailing spaces share one queue (and mixed kinds refuse each
// other), and a fenced write to "cfg  " overwrites "cfg". PostgreSQL keeps
// them apart. (utf8mb4_nopad_bin, or VARBINARY, would.)
// (Fails at 2dbe68e; fixed by 9cd4858: now a regression test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_trailing_spaces_make_different_names() {
    trailing_spaces_make_different_names(Db::mariadb()).await;
}

/// A fenced write of a value too big for the server (above MariaDB's
/// default max_allowed_packet, 16 MB): the write may fail, but the lock must
/// never be granted to another session before its holder hears lost().
async fn a_value_too_big_never_grants_a_held_lock_unannounced(db: Db) {
    let client = Client::new(Sql::new(db.url()));
    let session = client.session_with(options(10_000)).await.expect("session");
    let kept = session.mutex("kept").expect("mutex").lock().await.expect("lock");
    let other = client.session_with(options(10_000)).await.expect("session");
    let waiter = {
        let mutex = other.mutex("kept").expect("mutex");
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (Instant::now(), guard)
        })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    let kept = Arc::new(kept);
    let lost_at = {
        let kept = Arc::clone(&kept);
        tokio::spawn(async move {
            kept.lost().await;
            Instant::now()
        })
    };
    let value = vec![b'v'; 20 << 20];
    let wrote = step(
        "the fenced write",
        kept.write_if_held([lockline::Write::put("blob", value)]),
    )
    .await;
    eprintln!("the fenced write: {wrote:?}");
    let granted = within(Duration::from_secs(1), waiter).await;
    if let Some(granted) = granted {
        let (granted_at, guard) = granted.expect("task");
        let guard = guard.expect("lock");
        let lost_at = step("the holder hears of it", lost_at).await.expect("task");
        assert!(
            lost_at <= granted_at,
            "the waiter was granted {:?} before the holder heard lost() (its connection was closed by the server \
             after a fenced write of a 20 MB value)",
            lost_at - granted_at
        );
        guard.release().await.expect("release");
    } else {
        // The lock stayed with its holder: fine.
        lost_at.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_value_too_big_never_grants_a_held_lock_unannounced() {
    a_value_too_big_never_grants_a_held_lock_unannounced(Db::postgres()).await;
}

// Was a defect, now fixed (safety, MariaDB/MySQL): two holders, the first not told. MariaDB
// answers a statement above max_allowed_packet (here a fenced write of a
// 20 MB value; an election candidate's value does the same) with 1153 "Got
// a packet bigger than 'max_allowed_packet' bytes", SQLSTATE 08S01 (class
// 08: connection exception), and closes the connection: every guard of the
// session is freed at once and the next waiter is granted. error.rs
// `connection_gone` (57P01, 57P02, 08006, 08003, 70100 only) does not take
// it for the connection's end, so session.rs `on_owner!` leaves the session
// Live: its holders keep is_held() and hear lost() only at the next
// heartbeat, up to a keepalive interval (3.3 s here) after the next grant.
// (Fails at 2dbe68e; fixed by 9cd4858: now a regression test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_value_too_big_never_grants_a_held_lock_unannounced() {
    a_value_too_big_never_grants_a_held_lock_unannounced(Db::mariadb()).await;
}
