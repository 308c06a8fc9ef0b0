//! Go programs built here, offline, against Debian's Go sources: the peers
//! and benchmark drivers that use etcd's Go `concurrency` package.

use std::path::Path;
use std::process::Command;

use crate::Result;

/// Debian's Go toolchain (`golang-go`).
const GO: &str = "/usr/bin/go";
/// Where Debian installs Go sources (`golang-etcd-server-dev` puts
/// `go.etcd.io/etcd/clientv3/concurrency` there).
const GOPATH: &str = "/usr/share/gocode";

/// Builds the Go program `source` (one `main.go`) into `out` in GOPATH mode,
/// offline (no module proxy), with its build cache beside `out`.
///
/// # Errors
///
/// When `go` cannot run (Debian `golang-go` missing) or the build fails.
pub fn go_build(source: &Path, out: &Path) -> Result<()> {
    let status = Command::new(GO)
        .args(["build", "-o"])
        .arg(out)
        .arg(source)
        .env("GOPATH", GOPATH)
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("GOCACHE", out.with_extension("cache"))
        .status()
        .map_err(|e| std::io::Error::new(e.kind(), format!("run `go build` (Debian golang-go): {e}")))?;
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "building {} failed: {status}",
            source.display()
        )));
    }
    Ok(())
}
