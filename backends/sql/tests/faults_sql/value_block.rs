//! The lock value block after a crash that ends a PW or EX holder's lock
//! (right after a grant, a hand-over, a chain of them, conversions down and
//! up, a PW grant behind a release that wrote nothing): read back as not
//! valid, never valid (on PostgreSQL a block write that only moves the
//! holder it names does not wait for the disk).

use super::*;

on_both!(
    a_crash_right_after_an_ex_grant_leaves_the_value_block_not_valid,
    a_crash_right_after_an_ex_hand_over_leaves_the_value_block_not_valid,
    a_crash_after_a_down_and_an_up_conversion_leaves_the_value_block_not_valid,
    a_crash_after_a_chain_of_hand_overs_leaves_the_value_block_not_valid,
    a_crash_after_a_pw_grant_behind_a_release_without_a_write_leaves_the_value_block_not_valid,
    a_crash_after_a_release_that_wrote_and_an_ex_grant_leaves_the_value_block_not_valid,
);

/// The value block after a crash that takes an EX holder's lock: not valid,
/// with the value last written. Here the holder is the first since the
/// block was last written with no holder named, and the crash comes right
/// after its grant: the grant's naming of it reached the disk before the
/// grant was told (on PostgreSQL a write that names a holder where none was
/// waits for the disk; a crash that lost it would leave the value valid).
async fn a_crash_right_after_an_ex_grant_leaves_the_value_block_not_valid(db: Db) {
    let client = crash_client(&db);
    let session = crash_session(&client).await;
    written_v1(&session, "crash/grant").await;
    let held = locked(&session, "crash/grant", LockMode::Ex).await;
    assert!(held.value().valid, "the value block after a release is valid");
    crash_and_restart_then_read_block(db, &client, held, "crash/grant").await;
}

/// The same when the crash comes right after a hand-over from one EX
/// holder to the next that left the value as it was: the block names one
/// of the two, both gone with the crash (on PostgreSQL that write need not
/// wait for the disk: lost, it leaves the block naming the first holder).
async fn a_crash_right_after_an_ex_hand_over_leaves_the_value_block_not_valid(db: Db) {
    let client = crash_client(&db);
    let (a, b) = (crash_session(&client).await, crash_session(&client).await);
    written_v1(&a, "crash/hand-over").await;
    let first = locked(&a, "crash/hand-over", LockMode::Ex).await;
    let waiter = waiting_for_ex(&b, "crash/hand-over");
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    first.release().await.expect("release");
    let next = bounded("the hand-over", waiter).await.expect("task").expect("lock");
    assert!(next.value().valid, "the value block after a hand-over is valid");
    crash_and_restart_then_read_block(db, &client, next, "crash/hand-over").await;
}

/// Crashes the database with `held` holding `name` in PW or EX, then takes
/// the lock in EX in a new session: its value must be `v1`, not valid.
async fn crash_and_restart_then_read_block(db: Db, client: &Client, held: lockline::ResourceGuard, name: &str) {
    let crashed = crash_and_restart(db).await;
    bounded("the holder hears of it", held.lost()).await;
    let fresh = crash_session(client).await;
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
        "a PW or EX holder lost its lock in the crash: the value block must read not valid, got {value:?}"
    );
    drop(crashed);
}

fn crash_client(db: &Db) -> Client {
    Client::new(Sql::new(db.url()).without_restart_grace())
}

async fn crash_session(client: &Client) -> Session {
    bounded("a session", client.session_with(options(3000)))
        .await
        .expect("session")
}

/// An EX holder writes `v1` and releases: the block is valid, names nobody.
async fn written_v1(session: &Session, name: &str) {
    let mut first = locked(session, name, LockMode::Ex).await;
    first.set_value(b"v1").expect("set the value");
    first.release().await.expect("release");
}

/// EX, then down to PR (a block write that only clears the holder named:
/// no wait for the disk on PostgreSQL), then up to EX again (names the
/// holder where none was), then the crash.
async fn a_crash_after_a_down_and_an_up_conversion_leaves_the_value_block_not_valid(db: Db) {
    let client = crash_client(&db);
    let session = crash_session(&client).await;
    let name = "crash/convert";
    written_v1(&session, name).await;
    let mut held = locked(&session, name, LockMode::Ex).await;
    held.convert(LockMode::Pr).await.expect("down to PR");
    held.convert(LockMode::Ex).await.expect("up to EX");
    assert!(held.value().valid, "valid before the crash");
    crash_and_restart_then_read_block(db, &client, held, name).await;
}

/// Three EX holders in a row, each handing over to the next with the value
/// as it was (two block writes that only move the holder named), then the
/// crash with the third holding.
async fn a_crash_after_a_chain_of_hand_overs_leaves_the_value_block_not_valid(db: Db) {
    let client = crash_client(&db);
    let (a, b, c) = (
        crash_session(&client).await,
        crash_session(&client).await,
        crash_session(&client).await,
    );
    let name = "crash/chain";
    written_v1(&a, name).await;
    let first = locked(&a, name, LockMode::Ex).await;
    let waits = client.stats().waits;
    let second = waiting_for_ex(&b, name);
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
    let third = waiting_for_ex(&c, name);
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits + 1).await;
    first.release().await.expect("release");
    let second = bounded("the first hand-over", second)
        .await
        .expect("task")
        .expect("lock");
    second.release().await.expect("release");
    let third = bounded("the second hand-over", third)
        .await
        .expect("task")
        .expect("lock");
    assert!(third.value().valid, "valid before the crash");
    crash_and_restart_then_read_block(db, &client, third, name).await;
}

/// An EX holder that never wrote releases (the block's holder cleared, no
/// wait for the disk), a PW holder is granted, then the crash.
async fn a_crash_after_a_pw_grant_behind_a_release_without_a_write_leaves_the_value_block_not_valid(db: Db) {
    let client = crash_client(&db);
    let session = crash_session(&client).await;
    let name = "crash/pw";
    written_v1(&session, name).await;
    let quiet = locked(&session, name, LockMode::Ex).await;
    quiet.release().await.expect("release");
    let reader = locked(&session, name, LockMode::Pr).await;
    reader.release().await.expect("release");
    let held = locked(&session, name, LockMode::Pw).await;
    assert!(held.value().valid, "valid before the crash");
    crash_and_restart_then_read_block(db, &client, held, name).await;
}

/// A holder that wrote releases (a new value: waits for the disk), the
/// next EX holder is granted by a hand-over of the same value, crash.
async fn a_crash_after_a_release_that_wrote_and_an_ex_grant_leaves_the_value_block_not_valid(db: Db) {
    let client = crash_client(&db);
    let (a, b) = (crash_session(&client).await, crash_session(&client).await);
    let name = "crash/wrote";
    let mut first = locked(&a, name, LockMode::Ex).await;
    let waits = client.stats().waits;
    let next = waiting_for_ex(&b, name);
    lockline::conformance::wait_for_stats(&client, |s| s.waits > waits).await;
    first.set_value(b"v1").expect("set the value");
    first.release().await.expect("release");
    let next = bounded("the hand-over", next).await.expect("task").expect("lock");
    assert!(next.value().valid, "valid before the crash");
    assert_eq!(next.value().bytes, b"v1");
    crash_and_restart_then_read_block(db, &client, next, name).await;
}

/// `name` locked in `mode` by `session`.
async fn locked(session: &Session, name: &str, mode: LockMode) -> lockline::ResourceGuard {
    let resource = session.resource(name).expect("resource");
    bounded("the lock", resource.lock(mode)).await.expect("lock")
}

/// A task of `session` waiting for `name` in EX.
fn waiting_for_ex(session: &Session, name: &str) -> tokio::task::JoinHandle<lockline::Result<lockline::ResourceGuard>> {
    let resource = session.resource(name).expect("resource");
    tokio::spawn(async move { resource.lock(LockMode::Ex).await })
}
