//! The lock value block after a crash right after an EX grant or hand-over:
//! read back as not valid.

use super::*;

on_both!(
    a_crash_right_after_an_ex_grant_leaves_the_value_block_not_valid,
    a_crash_right_after_an_ex_hand_over_leaves_the_value_block_not_valid,
);

/// The value block after a crash that takes an EX holder's lock: not valid,
/// with the value last written. Here the holder is the first since the
/// block was last written with no holder named, and the crash comes right
/// after its grant: the grant's naming of it reached the disk before the
/// grant was told (on PostgreSQL a write that names a holder where none was
/// waits for the disk; a crash that lost it would leave the value valid).
async fn a_crash_right_after_an_ex_grant_leaves_the_value_block_not_valid(db: Db) {
    let client = Client::new(Sql::new(db.url()).without_restart_grace());
    let session = client.session_with(options(3000)).await.expect("session");
    let resource = session.resource("crash/grant").expect("resource");
    let mut first = resource.lock(LockMode::Ex).await.expect("lock");
    first.set_value(b"v1").expect("set the value");
    first.release().await.expect("release");
    let held = resource.lock(LockMode::Ex).await.expect("lock again");
    assert!(held.value().valid, "the value block after a release is valid");
    crash_and_restart_then_read_block(db, &client, held, "crash/grant").await;
}

/// The same when the crash comes right after a hand-over from one EX
/// holder to the next that left the value as it was: the block names one
/// of the two, both gone with the crash (on PostgreSQL that write need not
/// wait for the disk: lost, it leaves the block naming the first holder).
async fn a_crash_right_after_an_ex_hand_over_leaves_the_value_block_not_valid(db: Db) {
    let client = Client::new(Sql::new(db.url()).without_restart_grace());
    let (a, b) = (
        client.session_with(options(3000)).await.expect("session"),
        client.session_with(options(3000)).await.expect("session"),
    );
    let mut first = a
        .resource("crash/hand-over")
        .expect("resource")
        .lock(LockMode::Ex)
        .await
        .expect("lock");
    first.set_value(b"v1").expect("set the value");
    first.release().await.expect("release");
    let first = a
        .resource("crash/hand-over")
        .expect("resource")
        .lock(LockMode::Ex)
        .await
        .expect("lock");
    let waiter = {
        let resource = b.resource("crash/hand-over").expect("resource");
        tokio::spawn(async move { resource.lock(LockMode::Ex).await })
    };
    client.wait_for_stats(|s| s.waits >= 1).await;
    first.release().await.expect("release");
    let next = bounded("the hand-over", waiter).await.expect("task").expect("lock");
    assert!(next.value().valid, "the value block after a hand-over is valid");
    crash_and_restart_then_read_block(db, &client, next, "crash/hand-over").await;
}

/// Crashes the database with `held` holding `name` in EX, then takes the
/// lock in EX in a new session: its value must be `v1`, not valid.
async fn crash_and_restart_then_read_block(db: Db, client: &Client, held: lockline::ResourceGuard, name: &str) {
    let crashed = crash_and_restart(db).await;
    bounded("the holder hears of it", held.lost()).await;
    let fresh = bounded("a new session", client.session_with(options(3000)))
        .await
        .expect("a new session");
    let again = bounded(
        "the lock after the crash",
        fresh.resource(name).expect("resource").lock(LockMode::Ex),
    )
    .await
    .expect("lock after the crash");
    let value = again.value();
    assert_eq!(value.bytes, b"v1", "the value last written is kept");
    assert!(
        !value.valid,
        "an EX holder lost its lock in the crash: the value block must read not valid, got {value:?}"
    );
    drop(crashed);
}
