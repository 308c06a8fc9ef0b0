//! Helpers shared by the ZooKeeper backend's tests: a side client that looks
//! at the server directly, and the opcodes the fault-injecting proxy picks.

#![allow(dead_code)] // each test file uses its own subset

use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::zookeeper_client as zk;

/// ZooKeeper opcodes, for losing or failing the answers to chosen requests.
pub const CREATE: &[i32] = &[1, 15, 19, 21];
pub const DELETE: &[i32] = &[2];
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
