//! What the `scale_*` examples share: their flags, a counting global
//! allocator, a TCP proxy that counts the bytes crossing it, and the two
//! modes themselves ([`many_locks`], [`many_sessions`]), to which each
//! backend brings its client and its server's view ([`ScaleServer`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod modes;

pub use modes::{acquire_all, many_locks, many_sessions, run, ScaleServer};

type Result<T> = std::io::Result<T>;

/// The options of the scale examples:
/// `[--locks N] [--in-flight K] [--sessions M] [--ttl SECONDS] [--ttls T]`.
///
/// - `--locks N` (default 100,000; 0 skips it): locks held on one session;
/// - `--in-flight K` (default 64): acquires (or session opens) in flight at once;
/// - `--sessions M` (default 1,000; 0 skips it): sessions in one process, each
///   holding one lock;
/// - `--ttl SECONDS` (default 10): every session's TTL;
/// - `--ttls T` (default 2): how many TTLs the keepalive traffic is counted over.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleArgs {
    /// Locks held on one session (mode b); 0 skips that mode.
    pub locks: usize,
    /// Acquires, or session opens, in flight at once.
    pub in_flight: usize,
    /// Sessions in one process, one lock each (mode c); 0 skips that mode.
    pub sessions: usize,
    /// Every session's TTL.
    pub ttl: Duration,
    /// How many TTLs the keepalive traffic of mode c is counted over.
    pub ttls: u32,
}

impl Default for ScaleArgs {
    fn default() -> Self {
        ScaleArgs {
            locks: 100_000,
            in_flight: 64,
            sessions: 1_000,
            ttl: Duration::from_secs(10),
            ttls: 2,
        }
    }
}

impl ScaleArgs {
    /// Parses the program's arguments.
    ///
    /// # Errors
    ///
    /// A message naming the bad argument.
    pub fn from_env() -> std::result::Result<Self, String> {
        Self::parse(std::env::args().skip(1))
    }

    /// Parses the given arguments.
    ///
    /// # Errors
    ///
    /// A message naming the bad argument.
    pub fn parse(args: impl IntoIterator<Item = String>) -> std::result::Result<Self, String> {
        let mut parsed = ScaleArgs::default();
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let number = |max: u64| -> std::result::Result<u64, String> {
                value
                    .replace('_', "")
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n <= max)
                    .ok_or_else(|| format!("{flag} takes a whole number up to {max}, not {value:?}"))
            };
            match flag.as_str() {
                "--locks" => parsed.locks = number(10_000_000)? as usize,
                "--in-flight" => parsed.in_flight = number(100_000)?.max(1) as usize,
                "--sessions" => parsed.sessions = number(100_000)? as usize,
                "--ttl" => parsed.ttl = Duration::from_secs(number(3_600)?.max(1)),
                "--ttls" => parsed.ttls = number(100)?.max(1) as u32,
                other => return Err(format!("unknown flag {other:?}")),
            }
        }
        Ok(parsed)
    }
}

/// A global allocator that counts the heap this process has allocated and
/// not yet freed, over the system allocator:
///
/// ```no_run
/// #[global_allocator]
/// static HEAP: lockline_bench::scale::CountingAlloc = lockline_bench::scale::CountingAlloc::new();
///
/// fn main() {}
/// ```
///
/// A few relaxed atomic additions per allocation and per free. Live blocks
/// are also counted by size, in classes of [`SIZE_CLASS`] bytes, to tell
/// which objects a measurement's heap went to.
#[derive(Debug)]
pub struct CountingAlloc {
    bytes: AtomicUsize,
    blocks: AtomicUsize,
    by_size: [AtomicUsize; SIZE_CLASSES],
}

/// The width of [`CountingAlloc`]'s size classes, in bytes.
pub const SIZE_CLASS: usize = 16;
const SIZE_CLASSES: usize = 256;

fn size_class(size: usize) -> usize {
    (size.saturating_sub(1) / SIZE_CLASS).min(SIZE_CLASSES - 1)
}

impl Default for CountingAlloc {
    fn default() -> Self {
        Self::new()
    }
}

impl CountingAlloc {
    /// Nothing counted yet.
    pub const fn new() -> Self {
        CountingAlloc {
            bytes: AtomicUsize::new(0),
            blocks: AtomicUsize::new(0),
            by_size: [const { AtomicUsize::new(0) }; SIZE_CLASSES],
        }
    }

    /// Live blocks by size class: element `i` counts blocks of
    /// `i * SIZE_CLASS + 1 ..= (i + 1) * SIZE_CLASS` bytes; the last element
    /// also every larger block.
    pub fn live_blocks_by_size(&self) -> Vec<usize> {
        self.by_size.iter().map(|n| n.load(Ordering::Relaxed)).collect()
    }

    /// The size classes whose live blocks grew by at least `min_per_unit`
    /// per unit (per held lock, say) from `before` (an earlier
    /// [`live_blocks_by_size`](Self::live_blocks_by_size)) to now, largest
    /// growth first, as `"≤48 B ×3.00"` items.
    pub fn growth_by_size(&self, before: &[usize], units: usize, min_per_unit: f64) -> Vec<String> {
        let now = self.live_blocks_by_size();
        let mut grown: Vec<(usize, f64)> = now
            .iter()
            .zip(before)
            .enumerate()
            .map(|(class, (now, before))| (class, (*now as f64 - *before as f64) / units.max(1) as f64))
            .filter(|(_, per)| *per >= min_per_unit)
            .collect();
        grown.sort_by(|a, b| b.1.total_cmp(&a.1));
        grown
            .iter()
            .map(|(class, per)| {
                if *class == SIZE_CLASSES - 1 {
                    format!(">{} B ×{per:.2}", class * SIZE_CLASS)
                } else {
                    format!("≤{} B ×{per:.2}", (class + 1) * SIZE_CLASS)
                }
            })
            .collect()
    }

    fn count(&self, size: usize) {
        self.bytes.fetch_add(size, Ordering::Relaxed);
        self.blocks.fetch_add(1, Ordering::Relaxed);
        self.by_size[size_class(size)].fetch_add(1, Ordering::Relaxed);
    }

    fn uncount(&self, size: usize) {
        self.bytes.fetch_sub(size, Ordering::Relaxed);
        self.blocks.fetch_sub(1, Ordering::Relaxed);
        self.by_size[size_class(size)].fetch_sub(1, Ordering::Relaxed);
    }

    /// Heap bytes allocated and not yet freed (as requested, before the
    /// allocator's own rounding and headers).
    pub fn live_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Heap blocks allocated and not yet freed.
    pub fn live_blocks(&self) -> usize {
        self.blocks.load(Ordering::Relaxed)
    }
}

// SAFETY: every call is passed on to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            self.count(layout.size());
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            self.count(layout.size());
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(block, layout) };
        self.uncount(layout.size());
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            self.uncount(layout.size());
            self.count(new_size);
        }
        moved
    }
}

/// A TCP proxy on a free loopback port in front of one server that counts
/// the bytes going each way, for traffic per session: the client connects
/// to [`address`](Self::address) instead of the server.
///
/// Two threads per connection (small stacks), which end when either side
/// closes; the accepting thread ends on drop.
#[derive(Debug)]
pub struct CountingProxy {
    address: String,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    to_server: AtomicU64,
    to_client: AtomicU64,
    connections: AtomicU64,
    stop: AtomicBool,
}

const PUMP_STACK: usize = 64 * 1024;

impl CountingProxy {
    /// Starts a proxy to `target` (`127.0.0.1:PORT`).
    ///
    /// # Errors
    ///
    /// When no port can be bound or the thread cannot be started.
    pub fn start(target: &str) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?.to_string();
        let counts = Arc::new(Counts::default());
        let target = target.to_owned();
        let shared = Arc::clone(&counts);
        std::thread::Builder::new()
            .name("counting-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if shared.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(&target) else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    shared.connections.fetch_add(1, Ordering::Relaxed);
                    for (from, to, up) in [(&client, &server, true), (&server, &client, false)] {
                        let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                            continue;
                        };
                        let counts = Arc::clone(&shared);
                        let _ = std::thread::Builder::new()
                            .stack_size(PUMP_STACK)
                            .spawn(move || pump(from, to, &counts, up));
                    }
                }
            })?;
        Ok(CountingProxy { address, counts })
    }

    /// The proxy's address, `127.0.0.1:PORT`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Bytes sent by clients towards the server so far.
    pub fn bytes_to_server(&self) -> u64 {
        self.counts.to_server.load(Ordering::Relaxed)
    }

    /// Bytes sent by the server towards clients so far.
    pub fn bytes_to_client(&self) -> u64 {
        self.counts.to_client.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.counts.connections.load(Ordering::Relaxed)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.counts.stop.store(true, Ordering::SeqCst);
        // Wake the accepting thread so that it sees the flag.
        let _ = TcpStream::connect(&self.address);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, counts: &Counts, up: bool) {
    let counter = if up { &counts.to_server } else { &counts.to_client };
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                counter.fetch_add(n as u64, Ordering::Relaxed);
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use super::ScaleArgs;
    use std::time::Duration;

    fn parse(line: &str) -> Result<ScaleArgs, String> {
        ScaleArgs::parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(parse("").expect("defaults"), ScaleArgs::default());
        let custom = parse("--locks 10_000 --sessions 0 --in-flight 8 --ttl 5 --ttls 3").expect("custom");
        assert_eq!(
            (custom.locks, custom.sessions, custom.in_flight, custom.ttl, custom.ttls),
            (10_000, 0, 8, Duration::from_secs(5), 3)
        );
        for bad in ["--locks", "--locks x", "--locks -1", "--ttl 99999", "--speed 2"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
