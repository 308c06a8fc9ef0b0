//! Apache Curator's `InterProcessMutex` as a benchmark peer: the Java driver
//! `examples/BenchCurator.java`, compiled with `javac` against Debian's jars
//! (`libcurator-recipes-java`, `libslf4j-java`), run as one JVM per
//! measurement; and CPU time read from `/proc` and `getrusage`.
//! Shared by `bench_zookeeper` and `profile_zookeeper`, each using part of it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use lockline_bench::BoxResult;

/// Curator's recipes jar; its manifest's class path brings the framework,
/// client, ZooKeeper and Guava jars.
const CURATOR: &str = "/usr/share/java/curator-recipes.jar";
/// A no-op slf4j binding, so the driver's output is only its own lines.
const SLF4J_NOP: &str = "/usr/share/java/slf4j-nop.jar";

/// The compiled driver: its class directory, removed when dropped.
#[derive(Debug)]
pub struct Driver {
    classes: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.classes);
    }
}

/// What one run of the driver measured over its window.
#[derive(Debug, Clone)]
pub struct Outcome<S> {
    /// Grants within the window.
    pub grants: u64,
    /// Their rate.
    pub grants_per_sec: f64,
    /// The JVM's CPU time (user and system) over the window, in ms.
    pub client_cpu_ms: f64,
    /// What the caller's snapshot read when the window started and ended.
    pub at_start: S,
    /// See `at_start`.
    pub at_end: S,
}

impl Driver {
    /// Compiles `BenchCurator.java` into a fresh temporary directory.
    pub fn compile() -> BoxResult<Driver> {
        let classes = std::env::temp_dir().join(format!("lockline-bench-curator-{}", std::process::id()));
        std::fs::create_dir_all(&classes)?;
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/BenchCurator.java");
        let status = Command::new("javac")
            .arg("-d")
            .arg(&classes)
            .args(["-cp", CURATOR, source])
            .status()?;
        if !status.success() {
            return Err(format!("compiling the Curator driver failed: {status}").into());
        }
        Ok(Driver { classes })
    }

    fn classes(&self) -> &Path {
        &self.classes
    }

    /// Runs `contenders` Curator contenders on `path` through `connect`:
    /// `warmup` seconds unmeasured, then a window of `seconds`, calling
    /// `snapshot` as the window starts and as it ends.
    pub fn run<S>(
        &self,
        connect: &str,
        path: &str,
        contenders: usize,
        seconds: f64,
        warmup: f64,
        mut snapshot: impl FnMut() -> S,
    ) -> BoxResult<Outcome<S>> {
        let classpath = format!("{}:{CURATOR}:{SLF4J_NOP}", self.classes().display());
        let mut child = Command::new("java")
            .args([
                "-cp",
                &classpath,
                "BenchCurator",
                connect,
                path,
                &contenders.to_string(),
                &seconds.to_string(),
                &warmup.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout from the Curator driver")?;
        let (mut at_start, mut at_end) = (None, None);
        let (mut grants, mut rate, mut cpu) = (None, None, None);
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            match line.split_once(' ') {
                None if line == "window_start" => at_start = Some(snapshot()),
                None if line == "window_end" => at_end = Some(snapshot()),
                Some(("grants", n)) => grants = n.trim().parse().ok(),
                Some(("grants_per_sec", n)) => rate = n.trim().parse().ok(),
                Some(("client_cpu_ms", n)) => cpu = n.trim().parse().ok(),
                _ => {}
            }
        }
        let status = child.wait()?;
        match (at_start, at_end, grants, rate, cpu) {
            (Some(at_start), Some(at_end), Some(grants), Some(grants_per_sec), Some(client_cpu_ms))
                if status.success() =>
            {
                Ok(Outcome {
                    grants,
                    grants_per_sec,
                    client_cpu_ms,
                    at_start,
                    at_end,
                })
            }
            _ => Err(format!("the Curator driver failed ({status})").into()),
        }
    }
}

/// A process's CPU time (user and system) so far, in ms, from
/// `/proc/PID/stat`; NaN when it cannot be read.
pub fn process_cpu_ms(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // The fields after the command name (which may hold spaces) in parentheses.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ')'.
    let ticks = |at: usize| fields.get(at).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) * 1000.0 / per_second
}

/// This process's CPU time (user and system) so far, in ms (`getrusage`).
pub fn own_cpu_ms() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return f64::NAN;
    }
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    ms(usage.ru_utime) + ms(usage.ru_stime)
}
