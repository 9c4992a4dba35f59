//! The process's logs: JSON lines or text on stderr, written by a thread of
//! their own so that logging never blocks the data plane.
//!
//! Lines are appended to a buffer under a lock and written out in batches
//! every [`FLUSH_EVERY`]: waking a writer thread per line, as a channel to
//! it would, cost about 10 µs of CPU per request on a gateway pinned to
//! one core (measured with the access log on). A full buffer drops lines
//! and counts them; it never makes a request wait.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

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
pub(crate) fn write_access(line: impl FnOnce(LogFormat, &mut String)) {
    if !ACCESS_LOG.load(Ordering::Relaxed) {
        return;
    }
    let Some(format) = FORMAT.get() else { return };
    let mut out = String::with_capacity(768);
    line(*format, &mut out);
    out.push('\n');
    BUFFER.push(out.as_bytes());
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
    let _ = SystemTime.format_time(&mut Writer::new(&mut out));
    out
}
