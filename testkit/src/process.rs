use std::fmt;
use std::fs::File;
use std::io::{Error, ErrorKind, Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::Result;

/// A port on 127.0.0.1 that was free a moment ago, for a server a test is
/// about to start.
///
/// It is taken from below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), never twice in one process:
/// a port from that range could be handed, between this call and the
/// server's bind, to any outgoing connection or `bind(0)` of the tests
/// running beside it, and the server would then never start.
///
/// # Errors
///
/// When no port can be bound.
pub fn free_port() -> Result<u16> {
    static NEXT: OnceLock<Mutex<u16>> = OnceLock::new();
    let (low, high) = below_ephemeral();
    let span = high - low;
    let next = NEXT.get_or_init(|| Mutex::new(low + spread(std::process::id(), span)));
    let mut next = next.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..span {
        let port = *next;
        *next = if port + 1 >= high { low } else { port + 1 };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Where a process with id `pid` starts taking ports, within `span`.
/// Processes run side by side (test binaries launched one after another)
/// have ids close together: started at `pid % span`, each would walk into
/// the ports of the next, and take one that a server there has just let go
/// of to restart on it. A multiplicative hash puts nearby ids far apart.
fn spread(pid: u32, span: u16) -> u16 {
    let hashed = (u64::from(pid).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % u64::from(span.max(1));
    u16::try_from(hashed).unwrap_or(0)
}

/// The ports servers are given: from 10000 up to the start of the kernel's
/// ephemeral range (32768 unless configured otherwise).
fn below_ephemeral() -> (u16, u16) {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if ephemeral_start > 12000 {
        (10000, ephemeral_start)
    } else {
        // An unusual configuration: take ports above the range's usual end.
        (61000, 65000)
    }
}

type SpawnRequest = (Command, mpsc::Sender<Result<Child>>);

/// Every server is forked from this one thread, which lives as long as the
/// process: `PR_SET_PDEATHSIG` fires when the forking *thread* exits, so a
/// short-lived thread (a tokio blocking thread, a test thread) must not fork.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // If the thread cannot start, `rx` is dropped and every spawn reports
        // "spawner thread is gone".
        let _ = std::thread::Builder::new()
            .name("lockline-testkit-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            });
        Mutex::new(tx)
    })
}

/// Starts `command` so that it is killed (SIGKILL) when this process dies, even
/// when this process is killed outright: `PR_SET_PDEATHSIG`, forked from one
/// long-lived thread. For helper processes a test starts and must not outlive it.
///
/// # Errors
///
/// When the program cannot be started.
pub fn spawn_tied_to_this_process(mut command: Command) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .map_err(|_| Error::other("spawner lock poisoned"))?
        .send((command, tx))
        .map_err(|_| Error::other("spawner thread is gone"))?;
    rx.recv().map_err(|_| Error::other("spawner thread is gone"))?
}

/// A system account a server runs as because it refuses to run as root
/// (PostgreSQL) or should not (MariaDB).
///
/// The switch is made by the forked child before it execs (`setgid`,
/// `setgroups(0)`, `setuid`), and `PR_SET_PDEATHSIG` is set after it: a
/// change of credentials clears that signal, so a server that switched users
/// by itself (`mariadbd --user`) would outlive a killed test process.
#[derive(Debug, Clone)]
pub(crate) struct SystemUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl SystemUser {
    /// The account `name` when this process runs as root, `None` otherwise (the
    /// server then runs as the current user).
    ///
    /// # Errors
    ///
    /// When this process is root and the account does not exist.
    pub(crate) fn for_server(name: &str) -> Result<Option<Self>> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        Self::lookup(name).map(Some)
    }

    /// Looks `name` up in the password database (`getpwnam_r`).
    fn lookup(name: &str) -> Result<Self> {
        let c_name = std::ffi::CString::new(name).map_err(Error::other)?;
        let mut buffer = vec![0u8; 4096];
        loop {
            // SAFETY: an all-zero passwd is a valid value to be overwritten.
            let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
            let mut found: *mut libc::passwd = std::ptr::null_mut();
            // SAFETY: every pointer is valid for the call; the buffer's length is passed.
            let code = unsafe {
                libc::getpwnam_r(
                    c_name.as_ptr(),
                    &mut entry,
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    &mut found,
                )
            };
            if code == libc::ERANGE && buffer.len() < 1 << 20 {
                buffer.resize(buffer.len() * 2, 0);
                continue;
            }
            if code != 0 {
                return Err(Error::from_raw_os_error(code));
            }
            if found.is_null() {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("no system user {name:?} (its Debian package creates it)"),
                ));
            }
            return Ok(SystemUser {
                name: name.to_owned(),
                uid: entry.pw_uid,
                gid: entry.pw_gid,
            });
        }
    }

    /// The account's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Makes `command` run as this account.
    pub(crate) fn apply(&self, command: &mut Command) {
        use std::os::unix::process::CommandExt;
        command.uid(self.uid).gid(self.gid);
    }

    /// Gives `path` (not what is under it) to this account.
    pub(crate) fn chown(&self, path: &Path) -> Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .map_err(|e| Error::new(e.kind(), format!("chown {} to {}: {e}", path.display(), self.name)))
    }
}

/// One server process of a cluster, with its log file.
pub struct Member {
    name: String,
    command: Command,
    user: Option<SystemUser>,
    child: Option<Child>,
    log: PathBuf,
    paused: bool,
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Member")
            .field("name", &self.name)
            .field("pid", &self.pid())
            .field("paused", &self.paused)
            .finish()
    }
}

impl Member {
    pub(crate) fn start(name: &str, program: &str, args: &[String], log: PathBuf, cwd: &Path) -> Result<Self> {
        Self::start_as(name, program, args, log, cwd, None)
    }

    /// Like [`Member::start`], but as `user` when one is given (every start
    /// and restart), with `HOME` set to `cwd`.
    pub(crate) fn start_as(
        name: &str,
        program: &str,
        args: &[String],
        log: PathBuf,
        cwd: &Path,
        user: Option<&SystemUser>,
    ) -> Result<Self> {
        let mut command = Command::new(program);
        command.args(args).current_dir(cwd).stdin(Stdio::null());
        if user.is_some() {
            command.env("HOME", cwd);
        }
        let mut member = Member {
            name: name.to_owned(),
            command,
            user: user.cloned(),
            child: None,
            log,
            paused: false,
        };
        member.spawn()?;
        Ok(member)
    }

    fn spawn(&mut self) -> Result<()> {
        let out = File::options().create(true).append(true).open(&self.log)?;
        let err = out.try_clone()?;
        let mut command = Command::new(self.command.get_program());
        command
            .args(self.command.get_args())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some(dir) = self.command.get_current_dir() {
            command.current_dir(dir);
        }
        for (key, value) in self.command.get_envs() {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        if let Some(user) = &self.user {
            user.apply(&mut command);
        }
        self.child = Some(spawn_tied_to_this_process(command).map_err(|e| {
            Error::new(
                e.kind(),
                format!("cannot start {} ({:?}): {e}", self.name, self.command.get_program()),
            )
        })?);
        self.paused = false;
        Ok(())
    }

    /// The member's name (`n1`, `n2`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (it may be paused).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    fn signal(&self, signal: libc::c_int) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| Error::other(format!("{} is not running", self.name)))?;
        let pid = libc::pid_t::try_from(pid).map_err(Error::other)?;
        // SAFETY: plain kill(2) on our own child's pid.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(Error::last_os_error());
        }
        Ok(())
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    ///
    /// # Errors
    ///
    /// When it is not running.
    pub fn kill(&mut self) -> Result<()> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| Error::other(format!("{} is not running", self.name)))?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Stops the process with SIGTERM and waits for it (SIGKILL after 10 s).
    ///
    /// # Errors
    ///
    /// When it is not running.
    pub fn stop(&mut self) -> Result<()> {
        if self.paused {
            self.resume()?;
        }
        self.signal(libc::SIGTERM)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if child.try_wait()?.is_some() {
                    self.child = None;
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill()
    }

    /// Freezes the process with SIGSTOP: it holds its sockets but answers nothing.
    ///
    /// # Errors
    ///
    /// When it is not running.
    pub fn pause(&mut self) -> Result<()> {
        self.signal(libc::SIGSTOP)?;
        self.paused = true;
        Ok(())
    }

    /// Thaws a paused process with SIGCONT.
    ///
    /// # Errors
    ///
    /// When it is not running.
    pub fn resume(&mut self) -> Result<()> {
        self.signal(libc::SIGCONT)?;
        self.paused = false;
        Ok(())
    }

    /// Starts the process again with the same command line and data.
    ///
    /// # Errors
    ///
    /// When it is still running or cannot be started.
    pub fn restart(&mut self) -> Result<()> {
        if self.is_running() {
            return Err(Error::other(format!("{} is still running", self.name)));
        }
        self.spawn()
    }

    /// The last `bytes` of the member's log.
    pub fn log_tail(&self, bytes: u64) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log) {
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = file.seek(SeekFrom::Start(len.saturating_sub(bytes)));
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// Polls `ready` every 50 ms until it returns true, the process exits, or
    /// `timeout` passes.
    pub(crate) fn wait_ready(&mut self, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Ok(());
            }
            if !self.is_running() {
                return Err(Error::new(
                    ErrorKind::BrokenPipe,
                    format!("{} exited while starting; log:\n{}", self.name, self.log_tail(4000)),
                ));
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{} not ready within {timeout:?}; log:\n{}",
                        self.name,
                        self.log_tail(4000)
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends `request` to 127.0.0.1:`port` and reads the whole answer (one
/// connection, as ZooKeeper's four-letter words and HTTP/1.0 want).
pub(crate) fn exchange(port: u16, request: &[u8], timeout: Duration) -> Option<String> {
    use std::io::Write;
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&address, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    stream.write_all(request).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

#[cfg(test)]
mod tests {
    use super::spread;

    /// Test binaries started one after another have ids a few apart: their
    /// first ports must not be (each walks up from its first, and a
    /// neighbour within reach would take the ports it restarts servers on).
    #[test]
    fn processes_with_nearby_ids_start_far_apart() {
        let span = 22_768;
        let starts: Vec<u16> = (16_300..16_340).map(|pid| spread(pid, span)).collect();
        for (i, a) in starts.iter().enumerate() {
            for b in &starts[i + 1..] {
                let gap = a.abs_diff(*b).min(span - a.abs_diff(*b));
                assert!(gap >= 64, "starts {a} and {b} are {gap} ports apart");
            }
            assert!(*a < span);
        }
    }
}
