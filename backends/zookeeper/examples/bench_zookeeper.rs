//! Handoff benchmark against a standalone ZooKeeper this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-zookeeper --example bench_zookeeper [-- --seconds 5 --contenders 1,2,4,16,64 --warmup 20 --fast-start]
//! cargo run --release -p lockline-zookeeper --example bench_zookeeper -- --curator-only --seconds 10 [--peer-warmup 5 --repetitions 2]
//! cargo run --release -p lockline-zookeeper --example bench_zookeeper -- --modes-only [--warmup 20 --modes-contenders 1,4,16 --modes-seconds 2 --modes-seed 1]
//! ```
//!
//! The server runs with production JVM settings (what ZooKeeper's own
//! `zkServer.sh` uses: [`ZkJvm::Production`]) unless `--fast-start` asks for
//! the test harness's fast-start flags ([`ZkJvm::FastStart`]); the flags are
//! printed. Before anything is measured, `--warmup` seconds (default 20) of
//! lockline handoffs and `set_data` calls let the JIT compile the server's hot
//! paths.
//!
//! For each N, N contenders (each its own client and ZooKeeper session) take
//! and release one lock with zero hold time for the given number of seconds.
//! Measured in the same run, against the same server:
//!
//! - `lockline`: grants/s of lockline's mutex;
//! - `kazoo`: grants/s of kazoo's `Lock`, N kazoo clients driven by one Python
//!   process (`examples/bench_kazoo.py`, Debian's `python3-kazoo`);
//! - `B_write`: one client's sequential `set_data`/s;
//! - the bare cycle: one zookeeper-client client creating an
//!   ephemeral-sequential node, listing its directory and deleting the node,
//!   one call after the other (what an uncontended acquire and release must
//!   do), cycles/s, compared with lockline's uncontended acquire + release
//!   (N = 1).
//!
//! Wakeups per release are counted by lockline's clients (`stats()`) and on the
//! server (`mntr`: watchers triggered by node deletions and data changes, per
//! release: a release changes its node's data and deletes it in one `multi`,
//! and the waiter's one-shot watch fires on the change).
//!
//! **Side by side with Curator** (last, or alone with `--curator-only`):
//! lockline's mutex against Apache Curator's `InterProcessMutex` (Debian
//! `libcurator-recipes-java`; `examples/BenchCurator.java`, compiled with
//! `javac`), the same workload for both: N contenders, each its own session
//! and connection, zero hold time; lockline's in this process, Curator's in
//! one JVM of their own. Each measurement gets a fresh server (production JVM
//! settings unless `--fast-start`), `--peer-warmup` seconds (default 5) of
//! the client's own handoffs before its window, and the two clients take
//! turns going first (the order flips with each N and each repetition;
//! `--repetitions`, default 2). Printed per N and repetition: grants/s of
//! each, lockline ÷ Curator, client CPU ms per grant (lockline: this
//! process's `getrusage`; Curator: the JVM's own process CPU time) and server
//! CPU ms per grant (`/proc/PID/stat` of the server's JVM) and the requests
//! the server received per grant (`mntr`'s `zk_packets_received`; pings
//! included, though neither client pings a busy connection), all over the
//! window.
//!
//! Latency (p50 / p99, measured in-process): of each `lock()` call (at N = 1
//! an uncontended acquire; at N ≥ 2 it includes the wait in the queue), of
//! each handoff (from the holder starting its release to the moment another
//! contender's `lock()` returns), and of B_write's `set_data` calls. The
//! target line compares the handoff p99 at the largest N with B_write's p50.
//!
//! **Lock modes** (after the tables above, on the same server, or after the
//! warm-up alone with `--modes-only`; `lockline_bench::lock_modes`): for each
//! N of `--modes-contenders` (default 1, 4, 16), lockline's mutex and a
//! `Resource` in EX side by side (EX ÷ mutex), then a mixed workload of the
//! six modes with conversions (grants/s, wakeups per release),
//! `--modes-seconds` each (default 2), with the requests the server
//! received per grant (`zk_packets_received`).

use std::process::Command;
use std::time::Instant;

use lockline::Client;
use lockline_bench::lock_modes::{self, ModesArgs};
use lockline_bench::report::{p99_over, p99_target_line};
use lockline_bench::{ms, sequential, usage_exit, BenchArgs, BoxResult, Contenders, Latencies, OwnFlags, Sampling};
use lockline_testkit::{ZkEnsemble, ZkJvm, ZkOptions};
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

mod peers {
    pub(crate) mod curator;
}

use peers::curator::{own_cpu_ms, process_cpu_ms};

/// The watches the server fired on node deletions and data changes
/// (`zk_sum_node_deleted_watch_count` + `zk_sum_node_changed_watch_count`):
/// a lockline release changes its node's data and deletes it in one
/// transaction, and its waiter's watch fires on the change.
fn fired_watches(ensemble: &ZkEnsemble) -> f64 {
    let mntr = ensemble.four_letter(0, "mntr").unwrap_or_default();
    let get = |name: &str| {
        mntr.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(f64::NAN)
    };
    get("zk_sum_node_deleted_watch_count") + get("zk_sum_node_changed_watch_count")
}

/// The requests the server received (`mntr`'s `zk_packets_received`) per
/// grant of each lock-mode measurement.
struct ZkCounters<'a> {
    ensemble: &'a ZkEnsemble,
    before: f64,
}

impl ZkCounters<'_> {
    fn read(&self) -> f64 {
        let mntr = self.ensemble.four_letter(0, "mntr").unwrap_or_default();
        mntr.lines()
            .find_map(|l| {
                l.strip_prefix("zk_packets_received")
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(f64::NAN)
    }
}

impl lock_modes::ServerCounters for ZkCounters<'_> {
    fn names(&self) -> Vec<String> {
        vec!["requests (server)".to_owned()]
    }

    async fn before(&mut self) -> BoxResult<()> {
        self.before = self.read();
        Ok(())
    }

    async fn per_grant(&mut self, grants: u64) -> BoxResult<Vec<f64>> {
        Ok(vec![(self.read() - self.before) / grants.max(1) as f64])
    }
}

/// One client's sequential `set_data`/s on `path`, and each call's latency.
async fn b_write(ensemble: &ZkEnsemble, seconds: f64, path: &str) -> BoxResult<(f64, Latencies)> {
    let client = zk::Client::connect(&ensemble.connect_string()).await?;
    client
        .create(path, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()))
        .await?;
    Ok(sequential(seconds, async |n| {
        client.set_data(path, n.to_string().as_bytes(), None).await.map(drop)
    })
    .await?)
}

/// One client's bare create + list + delete cycles/s under `dir`.
async fn bare_cycle(ensemble: &ZkEnsemble, seconds: f64, dir: &str) -> BoxResult<f64> {
    let client = zk::Client::connect(&ensemble.connect_string()).await?;
    client
        .create(dir, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()))
        .await?;
    let node = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{dir}/entry-");
    let (cycles, _) = sequential(seconds, async |_| {
        let (_, sequence) = client.create(&prefix, b"", &node).await?;
        client.list_children(dir).await?;
        client.delete(&format!("{prefix}{sequence}"), None).await
    })
    .await?;
    Ok(cycles)
}

struct Run {
    grants_per_sec: f64,
    wakeups_per_release: f64,
    server_watches_per_release: f64,
    acquire: Latencies,
    handoff: Latencies,
}

async fn lockline_run(ensemble: &ZkEnsemble, n: usize, seconds: f64, name: &str) -> BoxResult<Run> {
    let contenders = Contenders::open(n, name, || Client::new(ZooKeeper::new(ensemble.connect_string()))).await?;
    let sum_before = fired_watches(ensemble);
    let mut contest = contenders.contest(Sampling::Window);
    contest.run_for(seconds).await;
    let outcome = contest.stop().await?;
    let sum_after = fired_watches(ensemble);
    let counts = contenders.counts();
    contenders.close().await?;
    Ok(Run {
        grants_per_sec: outcome.grants_per_sec(),
        wakeups_per_release: counts.wakeups as f64 / counts.releases.max(1) as f64,
        server_watches_per_release: (sum_after - sum_before) / counts.releases.max(1) as f64,
        acquire: outcome.acquire,
        handoff: outcome.handoff,
    })
}

/// kazoo's grants/s, and its acquire and handoff latencies (`p50 / p99` in ms).
struct KazooRun {
    grants_per_sec: f64,
    acquire: String,
    handoff: String,
}

fn kazoo_run(ensemble: &ZkEnsemble, n: usize, seconds: f64, path: &str) -> BoxResult<KazooRun> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bench_kazoo.py");
    let output = Command::new("/usr/bin/python3")
        .args([
            script,
            &ensemble.connect_string(),
            path,
            &n.to_string(),
            &seconds.to_string(),
        ])
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = |name: &str| stdout.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let grants_per_sec = line("grants_per_sec ").and_then(|v| v.parse().ok());
    match (grants_per_sec, line("acquire_ms "), line("handoff_ms ")) {
        (Some(grants_per_sec), Some(acquire), Some(handoff)) => Ok(KazooRun {
            grants_per_sec,
            acquire: acquire.to_owned(),
            handoff: handoff.to_owned(),
        }),
        _ => Err(format!(
            "kazoo benchmark failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into()),
    }
}

/// This example's own flags.
struct Flags {
    jvm: ZkJvm,
    /// Seconds of warm-up before the first measurement (`--warmup`).
    warmup: f64,
    /// Only the side-by-side comparison with Curator (`--curator-only`).
    curator_only: bool,
    /// Seconds of a client's own handoffs before each side-by-side window.
    peer_warmup: f64,
    /// Side-by-side repetitions.
    repetitions: usize,
}

/// A number of seconds within `0..=600` given to `flag`, or `default`.
fn seconds_flag(own: &OwnFlags, flag: &str, default: f64) -> Result<f64, String> {
    match own.value(flag) {
        None => Ok(default),
        Some(value) => {
            let seconds: f64 = value.parse().map_err(|_| format!("bad {flag} {value:?}"))?;
            if !(0.0..=600.0).contains(&seconds) {
                return Err(format!("{flag} must be within 0..=600"));
            }
            Ok(seconds)
        }
    }
}

/// This example's own flags (`--fast-start`, `--warmup S`, `--curator-only`,
/// `--peer-warmup S`, `--repetitions R`) and the [`BenchArgs`].
fn parse_args() -> Result<(Flags, ModesArgs, BenchArgs), String> {
    let (modes, own, rest) = ModesArgs::take(
        std::env::args().skip(1),
        &["--fast-start", "--curator-only"],
        &["--warmup", "--peer-warmup", "--repetitions"],
    )?;
    let jvm = if own.switch("--fast-start") {
        ZkJvm::FastStart
    } else {
        ZkJvm::Production
    };
    let repetitions = match own.value("--repetitions") {
        None => 2,
        Some(value) => match value.parse() {
            Ok(n @ 1..=20) => n,
            _ => return Err(format!("bad --repetitions {value:?} (1 to 20)")),
        },
    };
    let flags = Flags {
        jvm,
        warmup: seconds_flag(&own, "--warmup", 20.0)?,
        curator_only: own.switch("--curator-only"),
        peer_warmup: seconds_flag(&own, "--peer-warmup", 5.0)?,
        repetitions,
    };
    Ok((flags, modes, BenchArgs::parse(rest)?))
}

/// One client's window in the side-by-side comparison.
struct PeerRun {
    grants_per_sec: f64,
    client_cpu_ms_per_grant: f64,
    server_cpu_ms_per_grant: f64,
    /// Requests the server received per grant (pings included).
    requests_per_grant: f64,
}

/// What the server had done at one moment: its CPU time (ms) and the
/// requests it had received (`mntr`'s `zk_packets_received`).
#[derive(Clone, Copy)]
struct ServerCounts {
    cpu_ms: f64,
    requests: f64,
}

impl ServerCounts {
    fn read(ensemble: &ZkEnsemble, pid: u32) -> ServerCounts {
        let mntr = ensemble.four_letter(0, "mntr").unwrap_or_default();
        let requests = mntr
            .lines()
            .find_map(|line| line.strip_prefix("zk_packets_received"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(f64::NAN);
        ServerCounts {
            cpu_ms: process_cpu_ms(pid),
            requests,
        }
    }

    /// CPU ms and requests per grant from `self` to `end`.
    fn per_grant(self, end: ServerCounts, grants: f64) -> (f64, f64) {
        (
            (end.cpu_ms - self.cpu_ms) / grants,
            (end.requests - self.requests) / grants,
        )
    }
}

/// A fresh standalone server for one side-by-side measurement, and its pid.
fn fresh_server(jvm: ZkJvm) -> BoxResult<(ZkEnsemble, u32)> {
    let mut ensemble = ZkEnsemble::start_with(
        1,
        &ZkOptions {
            jvm,
            ..ZkOptions::default()
        },
    )?;
    let pid = ensemble.member(0).pid().ok_or("the server is not running")?;
    Ok((ensemble, pid))
}

/// lockline's N contenders on a fresh server: `warmup` seconds, then the window.
async fn lockline_peer_run(jvm: ZkJvm, n: usize, seconds: f64, warmup: f64) -> BoxResult<PeerRun> {
    let (ensemble, server) = fresh_server(jvm)?;
    let connect = ensemble.connect_string();
    let contenders = Contenders::open(n, "bench/side-by-side", || Client::new(ZooKeeper::new(connect.clone()))).await?;
    let contest = contenders.contest(Sampling::Window);
    tokio::time::sleep(std::time::Duration::from_secs_f64(warmup)).await;
    let started = Instant::now();
    let before = (
        contenders.counts().grants,
        own_cpu_ms(),
        ServerCounts::read(&ensemble, server),
    );
    tokio::time::sleep(std::time::Duration::from_secs_f64(seconds)).await;
    let after = (
        contenders.counts().grants,
        own_cpu_ms(),
        ServerCounts::read(&ensemble, server),
    );
    let elapsed = started.elapsed().as_secs_f64();
    contest.stop().await?;
    contenders.close().await?;
    let grants = (after.0 - before.0).max(1) as f64;
    let (server_cpu_ms_per_grant, requests_per_grant) = before.2.per_grant(after.2, grants);
    Ok(PeerRun {
        grants_per_sec: (after.0 - before.0) as f64 / elapsed,
        client_cpu_ms_per_grant: (after.1 - before.1) / grants,
        server_cpu_ms_per_grant,
        requests_per_grant,
    })
}

/// Curator's N contenders in one JVM on a fresh server.
fn curator_peer_run(
    driver: &peers::curator::Driver,
    jvm: ZkJvm,
    n: usize,
    seconds: f64,
    warmup: f64,
) -> BoxResult<PeerRun> {
    let (ensemble, server) = fresh_server(jvm)?;
    let outcome = driver.run(
        &ensemble.connect_string(),
        "/bench/side-by-side",
        n,
        seconds,
        warmup,
        || ServerCounts::read(&ensemble, server),
    )?;
    let grants = outcome.grants.max(1) as f64;
    let (server_cpu_ms_per_grant, requests_per_grant) = outcome.at_start.per_grant(outcome.at_end, grants);
    Ok(PeerRun {
        grants_per_sec: outcome.grants_per_sec,
        client_cpu_ms_per_grant: outcome.client_cpu_ms / grants,
        server_cpu_ms_per_grant,
        requests_per_grant,
    })
}

/// lockline against Curator's `InterProcessMutex`, side by side (see the
/// module docs).
async fn side_by_side(flags: &Flags, args: &BenchArgs) -> BoxResult<()> {
    let driver = peers::curator::Driver::compile()?;
    println!(
        "Side by side with Curator's InterProcessMutex: a fresh server per measurement ({:?} JVM), {} s of the \
         client's own handoffs, then a {} s window; the order of the two flips with each N and repetition",
        flags.jvm, flags.peer_warmup, args.seconds
    );
    println!();
    println!(
        "| N | rep | first | lockline grants/s | Curator grants/s | lockline ÷ Curator | \
         client CPU ms/grant: lockline / Curator | server CPU ms/grant: lockline / Curator | \
         requests/grant (server): lockline / Curator |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut ratios: Vec<(usize, f64)> = Vec::new();
    for rep in 0..flags.repetitions {
        for (i, &n) in args.contenders.iter().enumerate() {
            let lockline_first = (rep + i) % 2 == 0;
            let mut ours = None;
            let mut theirs = None;
            for turn in 0..2 {
                if (turn == 0) == lockline_first {
                    ours = Some(lockline_peer_run(flags.jvm, n, args.seconds, flags.peer_warmup).await?);
                } else {
                    theirs = Some(curator_peer_run(
                        &driver,
                        flags.jvm,
                        n,
                        args.seconds,
                        flags.peer_warmup,
                    )?);
                }
            }
            let (Some(ours), Some(theirs)) = (ours, theirs) else {
                continue;
            };
            println!(
                "| {n} | {} | {} | {:.0} | {:.0} | {:.2} | {:.3} / {:.3} | {:.3} / {:.3} | {:.2} / {:.2} |",
                rep + 1,
                if lockline_first { "lockline" } else { "Curator" },
                ours.grants_per_sec,
                theirs.grants_per_sec,
                ours.grants_per_sec / theirs.grants_per_sec,
                ours.client_cpu_ms_per_grant,
                theirs.client_cpu_ms_per_grant,
                ours.server_cpu_ms_per_grant,
                theirs.server_cpu_ms_per_grant,
                ours.requests_per_grant,
                theirs.requests_per_grant,
            );
            ratios.push((n, ours.grants_per_sec / theirs.grants_per_sec));
        }
    }
    // The target: lockline ≥ 1.0 × Curator at every N (the geometric mean
    // of the repetitions).
    let met: Vec<String> = args
        .contenders
        .iter()
        .filter_map(|&n| {
            let of_n: Vec<f64> = ratios.iter().filter(|(m, _)| *m == n).map(|(_, r)| r.ln()).collect();
            (!of_n.is_empty()).then(|| {
                let mean = (of_n.iter().sum::<f64>() / of_n.len() as f64).exp();
                format!("N = {n}: {mean:.2} ({})", lockline_bench::report::verdict(mean >= 1.0))
            })
        })
        .collect();
    println!();
    println!(
        "Target: lockline ≥ 1.0 × Curator's grants/s at every N (geometric mean of the repetitions): {}",
        met.join(", ")
    );
    Ok(())
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let (flags, modes, args) = parse_args().unwrap_or_else(|message| {
        usage_exit(
            &message,
            "bench_zookeeper",
            &BenchArgs::usage(&format!(
                "[--warmup S] [--fast-start] [--curator-only] [--peer-warmup S] [--repetitions R] {}",
                ModesArgs::USAGE
            )),
        )
    });
    if flags.curator_only {
        return side_by_side(&flags, &args).await;
    }
    let (jvm, warmup) = (flags.jvm, flags.warmup);
    let ensemble = ZkEnsemble::start_with(
        1,
        &ZkOptions {
            jvm,
            ..ZkOptions::default()
        },
    )?;
    let seconds = args.seconds;
    if !modes.only {
        println!(
            "ZooKeeper handoff benchmark: standalone ZooKeeper on {}, {seconds} s per measurement",
            ensemble.address(0)
        );
    }
    println!(
        "server JVM: {} ({jvm:?}{})",
        jvm.flags().join(" "),
        match jvm {
            ZkJvm::Production => ": zkServer.sh's settings; --fast-start for the test harness's",
            ZkJvm::FastStart => ": the test harness's fast-start flags",
        }
    );
    if warmup > 0.0 {
        let started = Instant::now();
        lockline_run(&ensemble, 16, warmup * 0.75, "bench/warmup").await?;
        b_write(&ensemble, warmup * 0.25, "/bench-warmup").await?;
        println!(
            "warm-up (not measured): {:.1} s of lockline handoffs at N = 16 and set_data calls",
            started.elapsed().as_secs_f64()
        );
    }
    if !modes.only {
        mutex_tables(&ensemble, &args).await?;
    }
    let on = format!("standalone ZooKeeper on {}", ensemble.address(0));
    let mut counters = ZkCounters {
        ensemble: &ensemble,
        before: 0.0,
    };
    lock_modes::run_with(
        &on,
        &modes,
        "bench/",
        || Client::new(ZooKeeper::new(ensemble.connect_string())),
        &mut counters,
    )
    .await?;
    drop(ensemble);
    if modes.only {
        return Ok(());
    }
    println!();
    side_by_side(&flags, &args).await
}

/// The mutex's tables: lockline and kazoo for each N, the uncontended
/// cycle against the bare one, then the latencies.
async fn mutex_tables(ensemble: &ZkEnsemble, args: &BenchArgs) -> BoxResult<()> {
    let seconds = args.seconds;
    let (b_write, b_write_latency) = b_write(ensemble, seconds, "/bench-b-write").await?;
    println!(
        "B_write (one client's sequential set_data/s): {b_write:.0}; set_data latency p50 / p99: {} ms",
        b_write_latency.p50_p99()
    );
    println!();
    println!(
        "| N | lockline grants/s | kazoo grants/s | lockline / kazoo | lockline / B_write | \
         wakeups/release (client) | watches fired/release (server) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut latency_rows = Vec::new();
    let mut uncontended = None;
    for (round, &n) in args.contenders.iter().enumerate() {
        let ours = lockline_run(ensemble, n, seconds, &format!("bench/lockline-{round}")).await?;
        if n == 1 {
            uncontended = Some(ours.grants_per_sec);
        }
        let kazoo = kazoo_run(ensemble, n, seconds, &format!("/bench/kazoo-{round}"))?;
        println!(
            "| {n} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
            ours.grants_per_sec,
            kazoo.grants_per_sec,
            ours.grants_per_sec / kazoo.grants_per_sec,
            ours.grants_per_sec / b_write,
            ours.wakeups_per_release,
            ours.server_watches_per_release,
        );
        latency_rows.push((n, ours, kazoo));
    }
    if let Some(cycles) = uncontended {
        let bare = bare_cycle(ensemble, seconds, "/bench-bare").await?;
        println!();
        println!(
            "uncontended acquire + release: lockline {cycles:.0}/s, bare create + list + delete {bare:.0}/s: \
             {:.2} x (target >= 0.9)",
            cycles / bare
        );
    }
    println!();
    println!("Latency, ms, p50 / p99 (acquire: each lock() call, uncontended at N = 1; handoff: release start → another contender granted):");
    println!();
    println!("| N | acquire: lockline | kazoo | handoff: lockline | kazoo | lockline handoff p99 / B_write p50 |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let b_write_p50 = b_write_latency.quantile(0.5).map(ms).unwrap_or(f64::NAN);
    for (n, ours, kazoo) in &latency_rows {
        println!(
            "| {n} | {} | {} | {} | {} | {} |",
            ours.acquire.p50_p99(),
            kazoo.acquire,
            ours.handoff.p50_p99(),
            kazoo.handoff,
            p99_over(&ours.handoff, b_write_p50),
        );
    }
    if let Some(line) = p99_target_line(latency_rows.iter().map(|(n, ours, _)| (*n, &ours.handoff)), b_write_p50) {
        println!();
        println!("{line}");
    }
    Ok(())
}
