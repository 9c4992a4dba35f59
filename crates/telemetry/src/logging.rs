//! The process's logs: JSON lines or text on stderr, written by a thread of
//! their own so that logging never blocks the data plane.
//!
//! Lines are appended to a buffer under a lock and written out in batches
//! every [`FLUSH_EVERY`]: waking a writer thread per line, as a channel to
//! it would, cost about 10 µs of CPU per request on a gateway pinned to
//! one core (measured with the access log on). A full buffer drops lines
//! and counts them; it never makes a request wait.

use std::cell::RefCell;
use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(LogFormat::Json),
            "text" => Ok(LogFormat::Text),
            _ => Err(format!("`{s}` is not a log format: json or text")),
        }
    }
}

impl LogFormat {
    /// JSON unless stderr is a terminal: pod logs go to collectors.
    pub fn default_for_stderr() -> Self {
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) { LogFormat::Text } else { LogFormat::Json }
    }
}

/// How often buffered lines are written out.
const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// The most bytes of lines held between two writes; past it, lines are
/// dropped (and counted) until the next write. At 50 ms a batch, room for
/// well over 100,000 access lines a second.
const MAX_BUFFERED_BYTES: usize = 8 << 20;

/// Lines waiting for the writer thread.
struct Buffer {
    lines: Mutex<Vec<u8>>,
    dropped: AtomicU64,
}

static BUFFER: Buffer = Buffer { lines: Mutex::new(Vec::new()), dropped: AtomicU64::new(0) };
static FORMAT: OnceLock<LogFormat> = OnceLock::new();
static ACCESS_LOG: AtomicBool = AtomicBool::new(false);

impl Buffer {
    /// Appends whole lines, or drops them if the buffer is full.
    fn push(&self, lines: &[u8]) {
        let mut buffer = self.lines.lock();
        if buffer.len() + lines.len() > MAX_BUFFERED_BYTES {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        buffer.extend_from_slice(lines);
    }

    /// Writes out what is buffered, with a line for what was dropped.
    fn flush(&self, spare: &mut Vec<u8>) {
        {
            let mut buffer = self.lines.lock();
            std::mem::swap(&mut *buffer, spare);
        }
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let line =
                format!("{} WARN sluice::log: {dropped} log lines dropped: stderr could not keep up\n", timestamp());
            spare.extend_from_slice(line.as_bytes());
        }
        if !spare.is_empty() {
            // Nowhere to report a failing stderr.
            let _ = std::io::stderr().lock().write_all(spare);
            spare.clear();
        }
    }
}

/// Flushes the buffered lines when dropped; keep it until exit.
pub struct LogGuard {
    stop: std::sync::mpsc::Sender<()>,
    writer: Option<JoinHandle<()>>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        BUFFER.flush(&mut Vec::new());
    }
}

/// Sets up logging to stderr: `RUST_LOG` filters (`info` by default).
pub fn init(format: LogFormat) -> LogGuard {
    let _ = FORMAT.set(format);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(Buffered);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).with_span_list(false).init(),
        // Colour only for a person at a terminal, not in files or pod logs.
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::Builder::new()
        .name("sluice-log".into())
        .spawn(move || {
            let mut spare = Vec::new();
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(FLUSH_EVERY) {
                BUFFER.flush(&mut spare);
            }
        })
        .ok();
    LogGuard { stop, writer }
}

/// Turns the access log on (it is off until then).
pub fn enable_access_log() {
    ACCESS_LOG.store(true, Ordering::Relaxed);
}

/// Writes one access log line, if the access log is on.
pub(crate) fn write_access<F: FnOnce(LogFormat, &mut String)>(line: F) {
    if !ACCESS_LOG.load(Ordering::Relaxed) {
        return;
    }
    let Some(format) = FORMAT.get() else { return };
    // Written into this thread's string rather than a new one each time.
    thread_local!(static LINE: RefCell<String> = RefCell::new(String::with_capacity(1024)));
    let write = |line: F, out: &mut String| {
        out.clear();
        line(*format, out);
        out.push('\n');
        BUFFER.push(out.as_bytes());
    };
    let mut line = Some(line);
    let _ = LINE.try_with(|out| {
        if let Ok(mut out) = out.try_borrow_mut()
            && let Some(line) = line.take()
        {
            write(line, &mut out);
            // One long line should not keep its size for good.
            if out.capacity() > 16 << 10 {
                *out = String::with_capacity(1024);
            }
        }
    });
    // The thread is exiting, or a line is being written already.
    if let Some(line) = line {
        write(line, &mut String::new());
    }
}

/// The tracing subscriber's writer: each event is formatted whole, then
/// handed to the buffer in one piece.
struct Buffered;

impl Write for Buffered {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        BUFFER.push(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buffered {
    type Writer = Buffered;

    fn make_writer(&'a self) -> Buffered {
        Buffered
    }
}

/// The current time as the other log lines print it (RFC 3339, UTC).
pub(crate) fn timestamp() -> String {
    let mut out = String::with_capacity(32);
    write_timestamp(&mut out, std::time::SystemTime::now());
    out
}

/// `time` as tracing-subscriber's `SystemTime` writes it
/// (`2026-12-06T14:30:00.123456Z`), its date and time of day formatted once
/// a second per thread: through `core::fmt`, the whole stamp was about
/// 2,400 instructions of each access line (callgrind, the plain hop).
pub(crate) fn write_timestamp(out: &mut String, time: std::time::SystemTime) {
    use std::cell::Cell;
    // The second (since the epoch) and its `YYYY-MM-DDTHH:MM:SS`.
    thread_local!(static SECOND: Cell<Option<(u64, [u8; 19])>> = const { Cell::new(None) });
    let since = time.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let second = since.as_secs();
    let cached = SECOND.try_with(Cell::get).ok().flatten().filter(|(at, _)| *at == second);
    let date = match cached {
        Some((_, date)) => date,
        None => {
            let date = date_and_time(second);
            let _ = SECOND.try_with(|cell| cell.set(Some((second, date))));
            date
        }
    };
    out.push_str(std::str::from_utf8(&date).unwrap_or("0000-00-00T00:00:00"));
    out.push('.');
    push_zero_padded(out, since.subsec_micros(), 6);
    out.push('Z');
}

/// `value` in decimal, zeros before it up to `width` digits.
pub(crate) fn push_zero_padded(out: &mut String, value: u32, width: usize) {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(value);
    for _ in digits.len()..width {
        out.push('0');
    }
    out.push_str(digits);
}

/// `YYYY-MM-DDTHH:MM:SS` of `second` since the epoch, UTC; years past 9999
/// (which tracing-subscriber writes with a `+`) come out as 9999-12-31.
fn date_and_time(second: u64) -> [u8; 19] {
    let mut date = *b"9999-12-31T23:59:59";
    let formatted = i64::try_from(second)
        .ok()
        .and_then(|second| chrono::DateTime::from_timestamp(second, 0))
        .map(|time| time.format("%Y-%m-%dT%H:%M:%S").to_string());
    if let Some(formatted) = formatted
        && formatted.len() == date.len()
    {
        date.copy_from_slice(formatted.as_bytes());
    }
    date
}
