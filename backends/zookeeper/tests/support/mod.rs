//! Helpers shared by the ZooKeeper backend's tests: a side client that looks
//! at the server directly, and the opcodes the fault-injecting proxy picks.

#![allow(dead_code)] // each test file uses its own subset

use std::path::PathBuf;
use std::process::Command;

use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::zookeeper_client as zk;

/// ZooKeeper opcodes, for losing or failing the answers to chosen requests.
pub const CREATE: &[i32] = &[1, 15, 19, 21];
pub const DELETE: &[i32] = &[2];
/// A `multi` (14): lockline's release, a delete with the release mark. The
/// proxy reads no path out of a `multi` (its first operation's header comes
/// first), so rules on it take the path prefix `""`: the next `multi` of any
/// session through that proxy.
pub const MULTI: &[i32] = &[14];
pub const EXISTS: &[i32] = &[3];
pub const LIST: &[i32] = &[8, 12];

/// A plain ZooKeeper client on the ensemble, beside the ones under test.
pub async fn side_client(ensemble: &ZkEnsemble) -> zk::Client {
    zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("side client")
}

/// The children of `dir`, sorted; none when it does not exist.
pub async fn children(side: &zk::Client, dir: &str) -> Vec<String> {
    match side.list_children(dir).await {
        Ok(mut children) => {
            children.sort();
            children
        }
        Err(zk::Error::NoNode) => Vec::new(),
        Err(error) => panic!("list {dir}: {error}"),
    }
}

/// The `pause_probe` example (a contender in a process of its own): built
/// by a plain `cargo test`, and built here when a test runs alone
/// (`cargo test --test paused_zookeeper`).
pub fn probe() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let debug = exe.parent().and_then(|deps| deps.parent()).expect("target dir");
    let probe = debug.join("examples").join("pause_probe");
    if !probe.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "lockline-zookeeper", "--example", "pause_probe"])
            .status()
            .expect("run cargo");
        assert!(status.success(), "building the pause_probe example failed");
    }
    probe
}
