//! Server work per grant on ZooKeeper: lockline's mutex against Apache
//! Curator's `InterProcessMutex`, counted request by request.
//!
//! ```text
//! cargo run --release -p lockline-zookeeper --example profile_zookeeper [-- --seconds 3 --contenders 1,2,4,16]
//! ```
//!
//! It starts a standalone ZooKeeper and a proxy in front of it that follows
//! ZooKeeper's framing (the testkit's `TcpProxy::start_zookeeper`). For each
//! N, N contenders (each its own session and connection) take and release
//! one lock with zero hold time: first lockline's, in this process, then
//! Curator's, N clients in one JVM (`examples/BenchCurator.java`, compiled
//! with `javac` against Debian's `libcurator-recipes-java`). After a second
//! of warm-up, every request that reaches the proxy within the window is
//! counted by opcode, with the watches set (`exists`, `getData`,
//! `getChildren` with a watch, `addWatch`) and the watch events delivered,
//! and divided by the grants made in the window.
//!
//! The counts do not depend on the machine's load; the rates do, and are not
//! printed here (see `bench_zookeeper`).

use std::time::Duration;

use lockline::Client;
use lockline_bench::{usage_exit, BenchArgs, BoxResult, Contenders, Sampling};
use lockline_testkit::{TcpProxy, ZkCounts, ZkEnsemble, ZkJvm, ZkOptions};
use lockline_zookeeper::ZooKeeper;

mod peers {
    pub(crate) mod curator;
}

/// Seconds of unmeasured handoffs before each window.
const WARMUP: f64 = 1.0;

/// The opcodes shown in their own column, in order, with their names.
const COLUMNS: [(i32, &str); 10] = [
    (1, "create"),
    (15, "create2"),
    (2, "delete"),
    (14, "multi"),
    (3, "exists"),
    (4, "getData"),
    (5, "setData"),
    (8, "getChildren"),
    (12, "getChildren2"),
    (9, "sync"),
];

/// ZooKeeper's ping opcode: a client library's keepalive.
const PING: i32 = 11;

struct Row {
    client: &'static str,
    n: usize,
    grants: u64,
    counts: ZkCounts,
}

impl Row {
    /// Prints the row; returns what the `other` column holds, by opcode.
    fn print(&self) -> Option<String> {
        let per = |count: u64| count as f64 / self.grants.max(1) as f64;
        let mut line = format!("| {} | {} | {} |", self.client, self.n, self.grants);
        let mut total = 0;
        for (opcode, _) in COLUMNS {
            let count = self.counts.requests_of(opcode);
            total += count;
            line.push_str(&format!(" {:.2} |", per(count)));
        }
        let pings = self.counts.requests_of(PING);
        let listed: u64 = COLUMNS.iter().map(|&(opcode, _)| self.counts.requests_of(opcode)).sum();
        let all: u64 = self.counts.requests.values().sum();
        let other = all - listed - pings;
        total += other;
        line.push_str(&format!(
            " {:.2} | {:.2} | **{:.2}** | {:.2} | {:.2} |",
            per(other),
            per(pings),
            per(total),
            per(self.counts.watches_set),
            per(self.counts.events),
        ));
        println!("{line}");
        let others: Vec<String> = self
            .counts
            .requests
            .iter()
            .filter(|(opcode, _)| **opcode != PING && !COLUMNS.iter().any(|(listed, _)| listed == *opcode))
            .map(|(opcode, count)| format!("opcode {opcode}: {:.2}", per(*count)))
            .collect();
        (!others.is_empty()).then(|| format!("{} at N = {}: {}", self.client, self.n, others.join(", ")))
    }
}

async fn lockline_row(connect: &str, proxy: &TcpProxy, n: usize, seconds: f64, name: &str) -> BoxResult<Row> {
    let contenders = Contenders::open(n, name, || Client::new(ZooKeeper::new(connect))).await?;
    let contest = contenders.contest(Sampling::Window);
    tokio::time::sleep(Duration::from_secs_f64(WARMUP)).await;
    let (before, granted_before) = (proxy.zk_counts(), contenders.counts().grants);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let (after, granted_after) = (proxy.zk_counts(), contenders.counts().grants);
    contest.stop().await?;
    contenders.close().await?;
    Ok(Row {
        client: "lockline",
        n,
        grants: granted_after - granted_before,
        counts: after.since(&before),
    })
}

fn curator_row(
    driver: &peers::curator::Driver,
    connect: &str,
    proxy: &TcpProxy,
    n: usize,
    seconds: f64,
    path: &str,
) -> BoxResult<Row> {
    let outcome = driver.run(connect, path, n, seconds, WARMUP, || proxy.zk_counts())?;
    Ok(Row {
        client: "Curator",
        n,
        grants: outcome.grants,
        counts: outcome.at_end.since(&outcome.at_start),
    })
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = BenchArgs::from_env()
        .unwrap_or_else(|message| usage_exit(&message, "profile_zookeeper", &BenchArgs::usage("")));
    let ensemble = ZkEnsemble::start_with(
        1,
        &ZkOptions {
            jvm: ZkJvm::FastStart,
            ..ZkOptions::default()
        },
    )?;
    let proxy = TcpProxy::start_zookeeper(&ensemble.address(0))?;
    let connect = proxy.address();
    let driver = peers::curator::Driver::compile()?;
    println!(
        "ZooKeeper requests per grant, zero hold time, each contender its own session; {} s windows after {WARMUP} s of warm-up",
        args.seconds
    );
    println!();
    let mut header = String::from("| client | N | grants |");
    let mut rule = String::from("|---|---:|---:|");
    for (_, name) in COLUMNS {
        header.push_str(&format!(" {name} |"));
        rule.push_str("---:|");
    }
    header.push_str(" other | ping | requests (no ping) | watches set | watch events |");
    rule.push_str("---:|---:|---:|---:|---:|");
    println!("{header}");
    println!("{rule}");
    let mut others = Vec::new();
    for (round, &n) in args.contenders.iter().enumerate() {
        let ours = lockline_row(&connect, &proxy, n, args.seconds, &format!("profile/lockline-{round}")).await?;
        others.extend(ours.print());
        let curator = curator_row(
            &driver,
            &connect,
            &proxy,
            n,
            args.seconds,
            &format!("/profile/curator-{round}"),
        )?;
        others.extend(curator.print());
    }
    println!();
    for other in others {
        println!("other, {other}");
    }
    println!(
        "(per grant; `other` is every other opcode but ping; lockline confirms its session with `sync`, \
         a client library's keepalive is `ping`)"
    );
    Ok(())
}
