//! The contender processes: each behind its own proxies (one per member), so
//! that one contender's network can be cut silently, and each restartable
//! after the nemesis kills it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use lockline_testkit::{spawn_tied_to_this_process, TcpProxy};

use crate::clock::now_ns;
use crate::contender::ContenderArgs;
use crate::history::{History, Tag, What};

/// One contender slot: its proxies and its current process.
#[derive(Debug)]
pub struct Slot {
    /// The slot's current process tag.
    pub tag: Tag,
    child: Option<Child>,
    /// One proxy per member, in member order.
    pub proxies: Vec<TcpProxy>,
    endpoints: String,
    log: PathBuf,
}

/// Every contender of a run.
#[derive(Debug)]
pub struct Fleet {
    /// The slots, by slot number.
    pub slots: Vec<Slot>,
    program: PathBuf,
    template: ContenderArgs,
    seed: u64,
    history: History,
}

impl Fleet {
    /// Starts `count` contenders running `program contender ...`, each through
    /// its own proxies to `members`. `template` carries everything but the
    /// endpoints, tag and seed.
    ///
    /// # Errors
    ///
    /// When a proxy or a process cannot be started.
    pub fn start(
        count: usize,
        program: &Path,
        members: &[String],
        endpoints: impl Fn(&[String]) -> String,
        template: ContenderArgs,
        logs: &Path,
        history: History,
    ) -> std::io::Result<Fleet> {
        let seed = template.seed;
        let mut fleet = Fleet {
            slots: Vec::new(),
            program: program.to_owned(),
            template,
            seed,
            history,
        };
        for slot in 0..count {
            let proxies = members
                .iter()
                .map(|member| TcpProxy::start(member))
                .collect::<std::io::Result<Vec<_>>>()?;
            let addresses: Vec<String> = proxies.iter().map(TcpProxy::address).collect();
            fleet.slots.push(Slot {
                tag: Tag { slot, incarnation: 0 },
                child: None,
                proxies,
                endpoints: endpoints(&addresses),
                log: logs.join(format!("contender-{slot}.log")),
            });
            fleet.spawn(slot)?;
        }
        Ok(fleet)
    }

    fn spawn(&mut self, slot: usize) -> std::io::Result<()> {
        let tag = self.slots[slot].tag;
        let mut args = self.template.clone();
        args.endpoints = self.slots[slot].endpoints.clone();
        args.tag = tag.to_string();
        args.seed = self
            .seed
            .wrapping_mul(1_000_003)
            .wrapping_add((slot as u64) << 20 | tag.incarnation as u64);
        let out = File::options().create(true).append(true).open(&self.slots[slot].log)?;
        let mut command = Command::new(&self.program);
        command
            .arg("contender")
            .args(args.to_args())
            .stdin(Stdio::piped())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = spawn_tied_to_this_process(command)?;
        self.history.note(tag, What::Spawned { pid: child.id() });
        self.slots[slot].child = Some(child);
        Ok(())
    }

    /// The process id of a slot's process, while it runs.
    pub fn pid(&self, slot: usize) -> Option<u32> {
        self.slots[slot].child.as_ref().map(Child::id)
    }

    /// Sends `signal` to a slot's process.
    pub fn signal(&self, slot: usize, signal: libc::c_int) -> std::io::Result<()> {
        let pid = self
            .pid(slot)
            .ok_or_else(|| std::io::Error::other(format!("contender {slot} is not running")))?;
        let pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
        // SAFETY: kill(2) on our own child.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// SIGKILLs a slot's process and reaps it. The kill is recorded at the
    /// time the signal was sent: where the server frees a dead process's
    /// locks at once (PostgreSQL sees its connections close), the next holder
    /// can be granted before the harness has reaped the process.
    pub fn kill(&mut self, slot: usize) -> std::io::Result<()> {
        if let Some(mut child) = self.slots[slot].child.take() {
            let sent = now_ns();
            child.kill()?;
            child.wait()?;
            self.history.note_at(sent, self.slots[slot].tag, What::Killed);
        }
        Ok(())
    }

    /// Starts a slot's next process (after a kill or a crash).
    ///
    /// # Errors
    ///
    /// When it cannot be started.
    pub fn respawn(&mut self, slot: usize) -> std::io::Result<()> {
        self.slots[slot].tag.incarnation += 1;
        self.spawn(slot)
    }

    /// Slots whose process exited without being killed, reaped now, with
    /// the tail of their log.
    pub fn reap_crashed(&mut self) -> Vec<(usize, String)> {
        let mut crashed = Vec::new();
        for slot in 0..self.slots.len() {
            let exited = match self.slots[slot].child.as_mut() {
                Some(child) => child.try_wait().ok().flatten(),
                None => None,
            };
            if let Some(status) = exited {
                self.slots[slot].child = None;
                self.history.note(self.slots[slot].tag, What::Exited);
                crashed.push((slot, format!("{status}; log: {}", self.log_tail(slot, 1500))));
            }
        }
        crashed
    }

    /// Closes a slot's standard input (a stopped contender then closes its session and exits).
    pub fn close_input(&mut self, slot: usize) {
        if let Some(child) = self.slots[slot].child.as_mut() {
            child.stdin = None;
        }
    }

    /// Waits for a slot's process to exit (after it reported `closed`).
    pub fn wait(&mut self, slot: usize) {
        if let Some(mut child) = self.slots[slot].child.take() {
            let _ = child.wait();
            self.history.note(self.slots[slot].tag, What::Exited);
        }
    }

    /// Whether a slot's process runs.
    pub fn is_running(&self, slot: usize) -> bool {
        self.slots[slot].child.is_some()
    }

    /// The last `bytes` of a slot's log.
    pub fn log_tail(&self, slot: usize, bytes: u64) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.slots[slot].log) {
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = file.seek(SeekFrom::Start(len.saturating_sub(bytes)));
            let _ = file.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
