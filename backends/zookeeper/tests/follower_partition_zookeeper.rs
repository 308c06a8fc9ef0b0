//! A holder connected to a ZooKeeper *follower* that is cut off (silently)
//! from the leader, while the holder still reaches its follower.
//!
//! The follower would keep answering reads from its local copy until its own
//! link to the leader times out (`syncLimit * tickTime`), while the leader,
//! which hears no more of the holder's session, expires it after its timeout
//! and grants the lock to a waiter. lockline confirms its session with `sync`,
//! which only the leader can answer, so the holder's `lost()` still fires
//! before that grant.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockline::{Client, SessionOptions};
use lockline_testkit::{free_port, spawn_tied_to_this_process, TcpProxy};
use lockline_zookeeper::ZooKeeper;

const JAR: &str = "/usr/share/java/zookeeper.jar";

/// Three ZooKeeper members whose quorum traffic between every ordered pair
/// (source, target) goes through its own proxy, so that one member can be
/// cut off from the others silently while its clients still reach it.
struct Ensemble {
    children: Vec<Child>,
    client_ports: Vec<u16>,
    /// proxies[src][dst] = (peer proxy, election proxy); None on the diagonal.
    proxies: Vec<Vec<Option<(TcpProxy, TcpProxy)>>>,
    dir: std::path::PathBuf,
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("LOCKLINE_KEEP_LOGS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        } else {
            println!("logs kept in {}", self.dir.display());
        }
    }
}

fn srvr(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(b"srvr").ok()?;
    let mut out = String::new();
    stream.read_to_string(&mut out).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned())
}

impl Ensemble {
    fn start(sync_limit: u32) -> Ensemble {
        let dir = std::env::temp_dir().join(format!("lockline-zk-{}-{}", std::process::id(), free_port().unwrap()));
        fs::create_dir_all(&dir).unwrap();
        let n = 3;
        let ports: Vec<(u16, u16, u16)> = (0..n)
            .map(|_| (free_port().unwrap(), free_port().unwrap(), free_port().unwrap()))
            .collect();
        let mut proxies: Vec<Vec<Option<(TcpProxy, TcpProxy)>>> = Vec::new();
        for src in 0..n {
            let mut row = Vec::new();
            for (dst, (_, peer, election)) in ports.iter().enumerate() {
                if src == dst {
                    row.push(None);
                } else {
                    row.push(Some((
                        TcpProxy::start(&format!("127.0.0.1:{peer}")).unwrap(),
                        TcpProxy::start(&format!("127.0.0.1:{election}")).unwrap(),
                    )));
                }
            }
            proxies.push(row);
        }
        let mut children = Vec::new();
        for i in 0..n {
            let data = dir.join(format!("n{}", i + 1));
            fs::create_dir_all(&data).unwrap();
            fs::write(data.join("myid"), format!("{}\n", i + 1)).unwrap();
            let mut config = format!(
                "tickTime=200\ninitLimit=20\nsyncLimit={sync_limit}\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
                 minSessionTimeout=1000\nmaxSessionTimeout=60000\nadmin.enableServer=false\n4lw.commands.whitelist=*\n\
                 maxClientCnxns=0\n",
                data.display(),
                ports[i].0
            );
            for (j, (_, peer, election)) in ports.iter().enumerate() {
                let (peer, election) = match &proxies[i][j] {
                    None => (*peer, *election),
                    Some((p, e)) => (port_of(p), port_of(e)),
                };
                config.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", j + 1));
            }
            let cfg = dir.join(format!("n{}.cfg", i + 1));
            fs::write(&cfg, config).unwrap();
            let log = fs::File::create(dir.join(format!("n{}.log", i + 1))).unwrap();
            let mut command = Command::new("java");
            command
                .args([
                    "-Xmx256m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-Dzookeeper.4lw.commands.whitelist=*",
                    "-Dzookeeper.admin.enableServer=false",
                    "-cp",
                    JAR,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                ])
                .arg(&cfg)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log);
            children.push(spawn_tied_to_this_process(command).expect("java"));
        }
        let ensemble = Ensemble {
            children,
            client_ports: ports.iter().map(|p| p.0).collect(),
            proxies,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let modes: Vec<Option<String>> = ensemble.client_ports.iter().map(|p| srvr(*p)).collect();
            if modes.iter().all(Option::is_some) {
                break;
            }
            assert!(Instant::now() < deadline, "ensemble did not start: {modes:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
        ensemble
    }

    fn mode(&self, i: usize) -> Option<String> {
        srvr(self.client_ports[i])
    }

    fn address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.client_ports[i])
    }

    /// Silently cuts member `i` off from every other member (both ways).
    fn isolate_silently(&self, i: usize) {
        for (src, row) in self.proxies.iter().enumerate() {
            for (dst, pair) in row.iter().enumerate() {
                if let Some((peer, election)) = pair {
                    if src == i || dst == i {
                        peer.blackhole();
                        election.blackhole();
                    }
                }
            }
        }
    }

    fn rejoin(&self, i: usize) {
        for (src, row) in self.proxies.iter().enumerate() {
            for (dst, pair) in row.iter().enumerate() {
                if let Some((peer, election)) = pair {
                    if src == i || dst == i {
                        peer.heal();
                        election.heal();
                    }
                }
            }
        }
    }
}

fn port_of(proxy: &TcpProxy) -> u16 {
    proxy.address().rsplit(':').next().unwrap().parse().unwrap()
}

async fn run_case(ttl: Duration, sync_limit: u32) -> (Duration, Duration) {
    let ensemble = tokio::task::spawn_blocking(move || Ensemble::start(sync_limit))
        .await
        .expect("start");
    let modes: Vec<Option<String>> = (0..3).map(|i| ensemble.mode(i)).collect();
    let leader = modes
        .iter()
        .position(|m| m.as_deref() == Some("leader"))
        .unwrap_or_else(|| panic!("no leader: {modes:?}"));
    let follower = (0..3).find(|i| *i != leader).unwrap();
    println!("modes {modes:?}; holder on follower n{}", follower + 1);

    let options = SessionOptions::new().with_ttl(ttl);
    // The holder talks to the follower only; the waiter to the leader.
    let holder = Client::new(ZooKeeper::new(ensemble.address(follower)))
        .session_with(options.clone())
        .await
        .expect("holder session");
    let waiter = Client::new(ZooKeeper::new(ensemble.address(leader)));
    let waiter_session = waiter.session_with(options).await.expect("waiter session");
    let guard = holder.mutex("partial/lock").expect("mutex").lock().await.expect("lock");
    let mutex = waiter_session.mutex("partial/lock").expect("mutex");
    let holder_for_grant = holder.clone();
    let queued = tokio::spawn(async move {
        mutex.lock().await.map(|g| {
            println!("at the grant the holder's session is {:?}", holder_for_grant.state());
            (Instant::now(), g)
        })
    });
    lockline::conformance::wait_for_stats(&waiter, |s| s.waits == 1).await;
    // Let a couple of confirmations go through.
    tokio::time::sleep(Duration::from_millis(500)).await;

    ensemble.isolate_silently(follower);
    let cut = Instant::now();
    let mut states = holder.watch_state();
    let log_states = tokio::spawn(async move {
        let mut seen = vec![(Duration::ZERO, *states.borrow())];
        while states.changed().await.is_ok() {
            seen.push((cut.elapsed(), *states.borrow()));
            if states.borrow().is_over() {
                break;
            }
        }
        seen
    });
    let lost = async {
        guard.lost().await;
        Instant::now()
    };
    let (lost_at, granted) = tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(lost, queued) })
        .await
        .expect("both happen within 60 s");
    let (granted_at, next) = granted.expect("task").expect("granted");
    println!(
        "holder session states after the cut: {:?}",
        log_states.await.expect("states")
    );
    let lost = lost_at - cut;
    let grant = granted_at - cut;
    println!("ttl {ttl:?}: holder lost() {lost:?} after the cut, waiter granted {grant:?} after it");
    next.release().await.ok();
    ensemble.rejoin(follower);
    (lost, grant)
}

/// A follower silently isolated from the leader (TTL 3 s, the follower gives
/// up on its leader after 2 s): the holder's `lost()` fires before the leader
/// expires its session and grants the lock to the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_follower_cut_off_from_the_leader_is_lost_before_the_next_grant() {
    let (lost, grant) = run_case(Duration::from_secs(3), 10).await;
    assert!(
        lost < grant,
        "two holders: the waiter was granted {grant:?} after the cut, the holder's lost() fired only {lost:?} after it"
    );
}

/// The same with the default options (TTL 10 s, margin 2 s) and a follower
/// that notices the lost leader after 5 s (`syncLimit * tickTime`; ZooKeeper's
/// sample configuration gives 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_follower_cut_off_from_the_leader_is_lost_before_the_next_grant_default_options() {
    let (lost, grant) = run_case(Duration::from_secs(10), 25).await;
    assert!(
        lost < grant,
        "two holders: the waiter was granted {grant:?} after the cut, the holder's lost() fired only {lost:?} after it"
    );
}
