//! A crowd on one lock, from several processes, against a standalone ZooKeeper this
//! program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-zookeeper --example crowd_zookeeper [-- --seconds 5 --processes 4 --crowd 1000 --compare 16,64 --warmup 20 --fast-start]
//! ```
//!
//! The program re-runs itself as child processes (`lockline_bench::Crowd`),
//! each running its share of the contenders (each its own client and
//! session), which take and release one lock with zero hold time. Measured
//! once every contender has queued: grants/s, wakeups per release (the
//! clients' `stats()`), and handoff latency (a grant's time minus the
//! previous holder's release start, from the grants of every process sorted
//! by fencing token). Each `--compare` count runs in one process and in
//! `--processes`, to show whether the one-process design of `bench_zookeeper`
//! distorts; then `--crowd` contenders run in `--processes`, against the
//! largest `--compare` count.
//!
//! As `bench_zookeeper`, the server runs with production JVM settings
//! (`ZkJvm::Production`, what ZooKeeper's `zkServer.sh` uses) unless
//! `--fast-start` asks for the test harness's; the flags are printed. An
//! unmeasured run of `--warmup` seconds (default 20) at N = 64 comes first,
//! for the JIT.

use lockline::Client;
use lockline_bench::{run_plan, usage_exit, BoxResult, CrowdArgs, CrowdChild};
use lockline_testkit::{ZkEnsemble, ZkJvm, ZkOptions};
use lockline_zookeeper::ZooKeeper;

fn main() -> BoxResult<()> {
    if let Some(child) = CrowdChild::from_env()? {
        let connect = child.args.first().ok_or("crowd child: no connect string")?.clone();
        return child.contend(|| Client::new(ZooKeeper::new(connect.clone())));
    }
    let (args, switches) = CrowdArgs::from_env(&["--fast-start"], 20.0).unwrap_or_else(|message| {
        usage_exit(
            &message,
            "crowd_zookeeper",
            &format!("{} [--fast-start]", CrowdArgs::USAGE),
        )
    });
    let jvm = match switches.is_empty() {
        true => ZkJvm::Production,
        false => ZkJvm::FastStart,
    };
    let ensemble = ZkEnsemble::start_with(
        1,
        &ZkOptions {
            jvm,
            ..ZkOptions::default()
        },
    )?;
    println!(
        "ZooKeeper crowd benchmark: standalone ZooKeeper on {}, {} s per measurement, \
         each contender its own client and session",
        ensemble.address(0),
        args.seconds
    );
    println!("server JVM: {} ({jvm:?})", jvm.flags().join(" "));
    run_plan(&args, &[ensemble.connect_string()])?;
    Ok(())
}
