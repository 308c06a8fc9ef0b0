//! A fault injected at each step of acquire / wait / release / cancel
//! on ZooKeeper. After everything settles, no node of the faulted session may
//! be left in the lock directory, one attempt never holds two nodes, and the
//! lock is not wedged.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, until};
use lockline::{Client, Error, SessionOptions};
use lockline_testkit::{TcpProxy, ZkEnsemble};
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

mod support;
use support::{children, side_client, CREATE, EXISTS, LIST, MULTI};

/// ZooKeeper's "operation timeout" error code: the request was applied, the
/// client is told it failed.
const OPERATION_TIMEOUT: i32 = -7;
const CONNECTION_LOSS: i32 = -4;

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_request_timeout(Duration::from_secs(2))
}

async fn through(proxy: &TcpProxy) -> (Client, lockline::Session) {
    let client = Client::new(ZooKeeper::new(proxy.address()));
    let session = client.session_with(options()).await.expect("session");
    (client, session)
}

async fn direct(ensemble: &ZkEnsemble) -> lockline::Session {
    Client::new(ZooKeeper::new(ensemble.connect_string()))
        .session_with(options())
        .await
        .expect("session")
}

async fn mkdir(side: &zk::Client, dir: &str) {
    match side
        .mkdir(dir, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()))
        .await
    {
        Ok(()) | Err(zk::Error::NodeExists) => {}
        Err(error) => panic!("mkdir {dir}: {error}"),
    }
}

/// Asserts that, once the faulted session's background work is done, the
/// directory holds nothing but `allowed`.
async fn settled(session: &lockline::Session, side: &zk::Client, dir: &str, allowed: &[String]) {
    bounded("background work", session.flush()).await;
    let left: Vec<String> = children(side, dir)
        .await
        .into_iter()
        .filter(|c| !allowed.iter().any(|a| a.ends_with(c.as_str())))
        .collect();
    assert!(left.is_empty(), "{dir}: nodes left behind: {left:?}");
}

/// A waiter whose exists-watch on its predecessor loses its answer (twice)
/// is still granted once the holder releases, with a single node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_exists_watch_while_waiting() {
    let ensemble = ZkEnsemble::start().expect("start");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let side = side_client(&ensemble).await;
    let holder = direct(&ensemble).await;
    let (client, session) = through(&proxy).await;
    let guard = holder.mutex("atk/exists").unwrap().lock().await.unwrap();
    proxy.lose_zk_responses(EXISTS, "/atk/exists/", 3);
    let mutex = session.mutex("atk/exists").unwrap();
    let waiting = tokio::spawn(async move { mutex.lock().await });
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    until("the three answers are lost", || proxy.zk_losses_pending() == 0).await;
    let nodes = children(&side, "/atk/exists").await;
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    guard.release().await.unwrap();
    let got = bounded("granted", waiting).await.unwrap().expect("granted");
    assert_eq!(children(&side, "/atk/exists").await.len(), 1);
    got.release().await.unwrap();
    settled(&session, &side, "/atk/exists", &[]).await;
}

/// The answer to a release's delete is lost: what does `release()` say, and
/// is the lock free afterwards?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_delete_on_release() {
    let ensemble = ZkEnsemble::start().expect("start");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let side = side_client(&ensemble).await;
    let (_client, session) = through(&proxy).await;
    let guard = session.mutex("atk/release").unwrap().lock().await.unwrap();
    // The release is a `multi` (the delete with the release mark), and the
    // only one this session sends here.
    proxy.lose_zk_responses(MULTI, "", 1);
    let result = bounded("release", guard.release()).await;
    assert_eq!(proxy.zk_losses_pending(), 0, "the release's answer was not lost");
    println!("release with a lost delete answer: {result:?}");
    settled(&session, &side, "/atk/release", &[]).await;
    let again = bounded("again", session.mutex("atk/release").unwrap().lock())
        .await
        .expect("lock again");
    again.release().await.unwrap();
    settled(&session, &side, "/atk/release", &[]).await;
}

/// The release's delete is applied but answered with an error on a live
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_delete_on_release() {
    let ensemble = ZkEnsemble::start().expect("start");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let side = side_client(&ensemble).await;
    let (_client, session) = through(&proxy).await;
    for code in [OPERATION_TIMEOUT, CONNECTION_LOSS] {
        let guard = session.mutex("atk/release2").unwrap().lock().await.unwrap();
        proxy.fail_zk_responses(MULTI, "", 1, code);
        let result = bounded("release", guard.release()).await;
        assert_eq!(proxy.zk_losses_pending(), 0, "the release's answer was not failed");
        println!("release with a failed ({code}) delete answer: {result:?}");
        settled(&session, &side, "/atk/release2", &[]).await;
        let again = bounded("again", session.mutex("atk/release2").unwrap().lock())
            .await
            .expect("lock again");
        again.release().await.unwrap();
        settled(&session, &side, "/atk/release2", &[]).await;
    }
}

/// Create applied, answered with an error code on a live connection: one
/// node at most, none left after the acquire fails or is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_create_answer() {
    let ensemble = ZkEnsemble::start().expect("start");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let side = side_client(&ensemble).await;
    mkdir(&side, "/atk/fcreate").await;
    let (_client, session) = through(&proxy).await;
    for code in [OPERATION_TIMEOUT, CONNECTION_LOSS] {
        proxy.fail_zk_responses(CREATE, "/atk/fcreate/", 1, code);
        let result = bounded(
            "lock",
            session
                .mutex("atk/fcreate")
                .unwrap()
                .lock_timeout(Duration::from_secs(6)),
        )
        .await;
        let nodes = children(&side, "/atk/fcreate").await;
        println!(
            "create failed with {code}: {:?}; nodes {nodes:?}",
            result.as_ref().map(|g| g.key().to_owned())
        );
        assert!(nodes.len() <= 1, "two nodes for one attempt: {nodes:?}");
        if let Ok(guard) = result {
            guard.release().await.unwrap();
        }
        settled(&session, &side, "/atk/fcreate", &[]).await;
    }
}

/// The listing after the create, and the retry's look-up, fail with an
/// error code on a live connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_listing_after_create() {
    let ensemble = ZkEnsemble::start().expect("start");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let side = side_client(&ensemble).await;
    mkdir(&side, "/atk/flist").await;
    let (_client, session) = through(&proxy).await;
    for code in [CONNECTION_LOSS, OPERATION_TIMEOUT] {
        proxy.fail_zk_responses(LIST, "/atk/flist", 2, code);
        let result = bounded(
            "lock",
            session.mutex("atk/flist").unwrap().lock_timeout(Duration::from_secs(6)),
        )
        .await;
        let nodes = children(&side, "/atk/flist").await;
        println!(
            "listing failed with {code}: {:?}; nodes {nodes:?}",
            result.as_ref().map(|g| g.key().to_owned())
        );
        assert!(nodes.len() <= 1, "two nodes for one attempt: {nodes:?}");
        if let Ok(guard) = result {
            guard.release().await.unwrap();
        }
        settled(&session, &side, "/atk/flist", &[]).await;
    }
}

/// A lock_timeout that fires while the retry of a lost create is backing off,
/// and the abandon's own listing is lost too: nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_during_lost_create_and_lost_abandon_listing() {
    let ensemble = ZkEnsemble::start().expect("start");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let side = side_client(&ensemble).await;
    mkdir(&side, "/atk/abandon").await;
    let holder = direct(&ensemble).await;
    let guard = holder.mutex("atk/abandon").unwrap().lock().await.unwrap();
    let (_client, session) = through(&proxy).await;
    proxy.lose_zk_responses(CREATE, "/atk/abandon/", 1);
    // The retry's look-up and then the abandon's listing.
    proxy.lose_zk_responses(LIST, "/atk/abandon", 3);
    let result = session
        .mutex("atk/abandon")
        .unwrap()
        .lock_timeout(Duration::from_millis(400))
        .await;
    assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
    settled(&session, &side, "/atk/abandon", &[guard.key().to_owned()]).await;
    guard.release().await.unwrap();
}

/// try_lock on a taken lock whose create answer is lost: the error is
/// reported and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_with_lost_create() {
    let ensemble = ZkEnsemble::start().expect("start");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let side = side_client(&ensemble).await;
    mkdir(&side, "/atk/try").await;
    let holder = direct(&ensemble).await;
    let guard = holder.mutex("atk/try").unwrap().lock().await.unwrap();
    let (_client, session) = through(&proxy).await;
    proxy.lose_zk_responses(CREATE, "/atk/try/", 1);
    let result = session.mutex("atk/try").unwrap().try_lock().await;
    println!(
        "try_lock with a lost create: {:?}",
        result.as_ref().map(|g| g.is_some())
    );
    settled(&session, &side, "/atk/try", &[guard.key().to_owned()]).await;
    // The try_lock's remove of its node is lost too.
    // Its removal is a `multi` (a delete with the release mark).
    proxy.lose_zk_responses(MULTI, "", 1);
    let result = session.mutex("atk/try").unwrap().try_lock().await;
    println!(
        "try_lock with a lost delete: {:?}",
        result.as_ref().map(|g| g.is_some())
    );
    settled(&session, &side, "/atk/try", &[guard.key().to_owned()]).await;
    assert_eq!(proxy.zk_losses_pending(), 0, "the removal's answer was not lost");
    guard.release().await.unwrap();
}

/// rwlock and semaphore: a lost create answer and a lost listing never make
/// a second node; a cancelled waiter leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_and_semaphore_lost_steps() {
    let ensemble = ZkEnsemble::start().expect("start");
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0)).expect("proxy");
    let side = side_client(&ensemble).await;
    mkdir(&side, "/atk/rw").await;
    mkdir(&side, "/atk/sem").await;
    let (_client, session) = through(&proxy).await;
    proxy.lose_zk_responses(CREATE, "/atk/rw/", 1);
    proxy.lose_zk_responses(LIST, "/atk/rw", 1);
    let read = bounded("read", session.rwlock("atk/rw").unwrap().read())
        .await
        .expect("read");
    assert_eq!(children(&side, "/atk/rw").await.len(), 1);
    proxy.lose_zk_responses(CREATE, "/atk/rw/", 1);
    let other = direct(&ensemble).await;
    let read2 = bounded("read2", other.rwlock("atk/rw").unwrap().read())
        .await
        .expect("read2");
    // A writer on the proxied session: its create answer lost, then cancelled.
    let rw = session.rwlock("atk/rw").unwrap();
    let write = tokio::spawn(async move { rw.write().await });
    until("the writer's create answer is lost", || proxy.zk_losses_pending() == 0).await;
    write.abort();
    let _ = write.await;
    drop(read);
    settled(&session, &side, "/atk/rw", &[read2.key().to_owned()]).await;
    read2.release().await.unwrap();

    proxy.lose_zk_responses(CREATE, "/atk/sem/", 2);
    proxy.lose_zk_responses(LIST, "/atk/sem", 2);
    let sem = session.semaphore("atk/sem", 2).unwrap();
    let p1 = bounded("p1", sem.acquire()).await.expect("p1");
    let p2 = bounded("p2", sem.acquire()).await.expect("p2");
    let nodes = children(&side, "/atk/sem").await;
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    drop(p1);
    drop(p2);
    settled(&session, &side, "/atk/sem", &[]).await;
}

/// The same session drops its guard during an outage and asks for the same
/// lock again at once: granted after the outage, one node, nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reacquire_after_drop_during_outage() {
    let ensemble = ZkEnsemble::start().expect("start");
    let proxy = TcpProxy::start(&ensemble.address(0)).expect("proxy");
    let side = side_client(&ensemble).await;
    let client = Client::new(ZooKeeper::new(proxy.address()));
    let session = client.session_with(options()).await.expect("session");
    let other_client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let other = other_client.session_with(options()).await.expect("session");
    let guard = session.mutex("atk/again").unwrap().lock().await.unwrap();
    let mutex = other.mutex("atk/again").unwrap();
    let waiter = tokio::spawn(async move { mutex.lock().await });
    lockline::conformance::wait_for_stats(&other_client, |s| s.waits >= 1).await;
    proxy.blackhole();
    drop(guard);
    let m = session.mutex("atk/again").unwrap();
    let again = tokio::spawn(async move { m.lock().await });
    // The outage: a span of time (3 s, short of the loss deadline).
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.heal();
    let started = Instant::now();
    let first = bounded("the other session", waiter)
        .await
        .unwrap()
        .expect("other granted");
    println!("other granted {:?} after the heal", started.elapsed());
    first.release().await.unwrap();
    let mine = bounded("the same session again", again)
        .await
        .unwrap()
        .expect("granted again");
    assert_eq!(children(&side, "/atk/again").await.len(), 1);
    mine.release().await.unwrap();
    settled(&session, &side, "/atk/again", &[]).await;
}
