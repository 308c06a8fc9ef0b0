//! A holder whose whole process stalls (its runtime blocked, as a long GC
//! pause or SIGSTOP would) past its session timeout wakes to find another
//! holder: its first act, a fenced write, is refused as `SessionLost` — the
//! deadline counts from the last confirmation, whatever the tracker has had
//! time to notice — and writes nothing (found by review: it was often
//! `Unavailable`, which tells the caller the batch may have landed).

use std::sync::mpsc;
use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, Error, SessionOptions, Write};
use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_wakes_to_session_lost_and_writes_nothing() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    for round in 0..3 {
        let name = format!("paused-write/{round}");
        let state = format!("/paused-write-state-{round}");
        let connect = ensemble.connect_string();
        let (held_tx, held_rx) = mpsc::channel::<()>();
        let (stall_tx, stall_rx) = mpsc::channel::<Duration>();
        let (name_in, state_in) = (name.clone(), state.clone());
        let stale = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let session = Client::new(ZooKeeper::new(connect))
                    .session_with(SessionOptions::new().with_ttl(Duration::from_secs(2)))
                    .await
                    .expect("session");
                let guard = session.mutex(&name_in).expect("mutex").lock().await.expect("lock");
                guard
                    .write_if_held([Write::put(&state_in, "stale-1")])
                    .await
                    .expect("the first write");
                held_tx.send(()).expect("report");
                let stall = stall_rx.recv().expect("stall");
                // The stall itself: nothing of this runtime runs meanwhile.
                std::thread::sleep(stall);
                let late = guard.write_if_held([Write::put(&state_in, "stale-2")]).await;
                (late, guard.is_held())
            })
        });
        held_rx.recv().expect("the stale holder holds");
        let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
        let session = client
            .session_with(SessionOptions::new().with_ttl(Duration::from_secs(10)))
            .await
            .expect("session");
        let waiter = {
            let mutex = session.mutex(&name).expect("mutex");
            tokio::spawn(async move { mutex.lock().await })
        };
        lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
        stall_tx.send(Duration::from_secs(6)).expect("stall");
        let newer = bounded("the waiter is granted after the expiry", waiter)
            .await
            .expect("task")
            .expect("lock");
        newer
            .write_if_held([Write::put(&state, "newer")])
            .await
            .expect("the newer holder writes");
        let (late, held) = tokio::task::spawn_blocking(move || stale.join())
            .await
            .expect("join")
            .expect("the stale holder's thread");
        assert!(
            matches!(late, Err(Error::SessionLost { .. })),
            "round {round}: a stalled holder's write must be SessionLost, got {late:?}"
        );
        assert!(!held);
        assert_eq!(
            session.read(&state).await.expect("read").as_deref(),
            Some(&b"newer"[..]),
            "a stale write landed"
        );
        newer.release().await.expect("release");
    }
}
