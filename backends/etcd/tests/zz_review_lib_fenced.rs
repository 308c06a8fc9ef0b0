//! Review probes of `write_if_held` and namespaces on a real etcd.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use lockline::{Client, Error, SessionOptions, Write};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, LineChild};

/// A holder whose whole runtime (keepalive task included) is blocked past
/// its lease's TTL, as a GC pause or SIGSTOP would. The lease expires, a
/// waiter takes the lock and writes. The stale holder's first action on
/// waking is a fenced write: refused with `SessionLost`, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_wakes_and_writes_nothing() {
    let cluster = EtcdCluster::start().expect("etcd");
    let endpoints = cluster.endpoints();
    let (held_tx, held_rx) = mpsc::channel::<String>();
    let (pause_tx, pause_rx) = mpsc::channel::<Duration>();
    let (result_tx, result_rx) = mpsc::channel::<String>();
    let stale = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        rt.block_on(async move {
            let session = Client::new(Etcd::new(endpoints))
                .session_with(SessionOptions::new().with_ttl(Duration::from_secs(2)))
                .await
                .expect("session");
            let guard = session
                .mutex("review/paused")
                .expect("mutex")
                .lock()
                .await
                .expect("lock");
            guard
                .write_if_held([Write::put("review/state", "stale-1")])
                .await
                .expect("first write");
            held_tx.send(guard.key().to_owned()).ok();
            let pause = pause_rx.recv().expect("pause");
            std::thread::sleep(pause);
            let late = guard.write_if_held([Write::put("review/state", "stale-2")]).await;
            result_tx.send(format!("{late:?}")).ok();
        });
    });
    let key = held_rx.recv().expect("held");
    let other = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let waiter = {
        let m = other.mutex("review/paused").expect("mutex");
        tokio::spawn(async move { m.lock().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    pause_tx.send(Duration::from_secs(6)).expect("pause");
    let newer = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("granted after the lease expired")
        .expect("task")
        .expect("lock");
    newer
        .write_if_held([Write::put("review/state", "newer")])
        .await
        .expect("newer writes");
    let late = result_rx.recv_timeout(Duration::from_secs(30)).expect("result");
    stale.join().expect("thread");
    eprintln!("stale holder {key}: late write -> {late}");
    assert_eq!(
        other.read("review/state").await.expect("read").as_deref(),
        Some(&b"newer"[..])
    );
    assert!(late.starts_with("Err(SessionLost"), "promised SessionLost, got {late}");
    newer.release().await.expect("release");
}

/// Fenced writes through the backend racing with the guard's release: once
/// the release returned, none lands; the next holder's value stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_racing_with_release() {
    let cluster = EtcdCluster::start().expect("etcd");
    let a = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let b = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    for round in 0..10 {
        let name = format!("review/race-{round}");
        let guard = a.mutex(&name).expect("mutex").lock().await.expect("lock");
        let entry = guard.entry().clone();
        let remote = Arc::clone(a.backend_session());
        let writer = tokio::spawn(async move {
            let mut landed_after = 0;
            let mut released_seen = false;
            for i in 0..200 {
                let ok = remote
                    .write_if_held(&entry, &[Write::put("review/race-state", format!("a-{i}"))])
                    .await
                    .expect("write");
                if !ok {
                    released_seen = true;
                } else if released_seen {
                    landed_after += 1;
                }
            }
            landed_after
        });
        tokio::task::yield_now().await;
        guard.release().await.expect("release");
        let next = b.mutex(&name).expect("mutex").lock().await.expect("lock");
        next.write_if_held([Write::put("review/race-state", "b")])
            .await
            .expect("b writes");
        let landed_after = writer.await.expect("task");
        assert_eq!(landed_after, 0, "a write landed after one was refused");
        assert_eq!(
            b.read("review/race-state").await.expect("read").as_deref(),
            Some(&b"b"[..]),
            "round {round}: the released holder's write overwrote the next holder's"
        );
        next.release().await.expect("release");
    }
}

/// Under a namespace, the shape check must look at the full key: `cafe`
/// under namespace `billing/` is `billing/cafe`, a holder of lock `billing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_write_faking_a_holder_outside() {
    let cluster = EtcdCluster::start().expect("etcd");
    let ns = Client::new(Etcd::new(cluster.endpoints()).with_namespace("billing/"))
        .session()
        .await
        .expect("session");
    let guard = ns.mutex("jobs").expect("mutex").lock().await.expect("lock");
    let written = guard.write_if_held([Write::put("cafe", "x")]).await;
    eprintln!("namespace billing/, put \"cafe\" (etcd key billing/cafe): {written:?}");
    guard.release().await.expect("release");
    let plain = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let free = plain
        .mutex("billing")
        .expect("mutex")
        .try_lock()
        .await
        .expect("try_lock");
    eprintln!("plain lock \"billing\" free afterwards: {}", free.is_some());
    assert!(
        written.is_err() || free.is_some(),
        "a namespaced fenced write made a persistent fake holder of lock \"billing\""
    );
}

/// A fenced write of an ordinary-looking key under another lock's prefix
/// (`jobs/state`) blocks `etcdctl lock jobs` for good ("Keys that would
/// block a lock are refused").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_blocks_etcdctl_lock_of_a_parent_name() {
    let cluster = EtcdCluster::start().expect("etcd");
    let s = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let guard = s.mutex("review/mine").expect("mutex").lock().await.expect("lock");
    let written = guard.write_if_held([Write::put("jobs/state", "x")]).await;
    eprintln!("put jobs/state -> {written:?}");
    guard.release().await.expect("release");
    let mut command = cluster.etcdctl(&cluster.endpoints());
    command.args(["lock", "jobs"]).stderr(std::process::Stdio::null());
    let mut etcdctl = LineChild::spawn(command).expect("etcdctl");
    let line = etcdctl.line(Duration::from_secs(8));
    eprintln!("etcdctl lock jobs after the write: {line:?}");
    let _ = etcdctl.signal_and_wait(libc::SIGINT);
    let mut command = cluster.etcdctl(&cluster.endpoints());
    command.args(["lock", "review"]).stderr(std::process::Stdio::null());
    let mut control = LineChild::spawn(command).expect("etcdctl");
    let ctl = control.line(Duration::from_secs(8));
    let _ = control.signal_and_wait(libc::SIGINT);
    assert!(ctl.is_some(), "control: etcdctl lock review");
    assert!(
        written.is_err() || line.is_some(),
        "a fenced write was accepted that keeps `etcdctl lock jobs` waiting for good"
    );
}

/// Interop with etcdctl under a namespace, both ways, and names that do not
/// collide inside/outside the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_interop_and_collisions() {
    let cluster = EtcdCluster::start().expect("etcd");
    let ns = Client::new(Etcd::new(cluster.endpoints()).with_namespace("team/"));
    let plain = Client::new(Etcd::new(cluster.endpoints()));
    let (sn, sp) = (ns.session().await.expect("s"), plain.session().await.expect("s"));
    // Same name inside and outside: independent.
    let inside = sn.mutex("x").expect("m").lock().await.expect("lock");
    let outside = sp
        .mutex("x")
        .expect("m")
        .try_lock()
        .await
        .expect("try")
        .expect("outside free");
    // lockline (namespaced) holds team/x: etcdctl lock team/x must wait.
    let mut command = cluster.etcdctl(&cluster.endpoints());
    command.args(["lock", "team/x"]).stderr(std::process::Stdio::null());
    let mut etcdctl = LineChild::spawn(command).expect("etcdctl");
    assert_eq!(etcdctl.line(Duration::from_secs(2)), None, "etcdctl got a held lock");
    inside.release().await.expect("release");
    let key = etcdctl
        .line(Duration::from_secs(10))
        .expect("etcdctl granted after release");
    assert!(key.starts_with("team/x/"), "{key}");
    // Now lockline (namespaced) must wait for etcdctl.
    let m = sn.mutex("x").expect("m");
    assert!(m.try_lock().await.expect("try").is_none(), "etcdctl holder ignored");
    let e = m.lock_timeout(Duration::ZERO).await.expect_err("held by etcdctl");
    eprintln!("lock_timeout(0) behind etcdctl: {e}");
    etcdctl.signal_and_wait(libc::SIGINT).expect("exit");
    let g = m.lock_timeout(Duration::from_secs(5)).await.expect("after etcdctl");
    // Election interop under the namespace.
    let leader = sn.election("el").expect("e").campaign(b"v1").await.expect("campaign");
    let mut command = cluster.etcdctl(&cluster.endpoints());
    command
        .args(["elect", "-l", "team/el"])
        .stderr(std::process::Stdio::null());
    let mut observer = LineChild::spawn(command).expect("etcdctl elect -l");
    let k = observer.line(Duration::from_secs(5));
    let v = observer.line(Duration::from_secs(5));
    eprintln!("etcdctl elect -l team/el: {k:?} {v:?}");
    assert_eq!(v.as_deref(), Some("v1"));
    let _ = observer.signal_and_wait(libc::SIGINT);
    leader.resign().await.expect("resign");
    g.release().await.expect("release");
    outside.release().await.expect("release");
    let _ = Error::Closed { session: String::new() };
}
