//! The process's logs: JSON lines or text, written by a background thread so
//! that logging never blocks the data plane (a full buffer drops lines and
//! counts them, it does not wait).

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_appender::non_blocking::{NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;
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

/// Lines waiting for the writer thread; past it, lines are dropped.
const BUFFERED_LINES: usize = 64 * 1024;

/// Where logs go, once logging is set up.
static WRITER: OnceLock<(NonBlocking, LogFormat)> = OnceLock::new();
static ACCESS_LOG: AtomicBool = AtomicBool::new(false);

/// Turns the access log on (it is off until then).
pub fn enable_access_log() {
    ACCESS_LOG.store(true, Ordering::Relaxed);
}

/// Sets up logging to stderr: `RUST_LOG` filters (`info` by default).
/// Keep the guard until exit: dropping it flushes what is buffered.
pub fn init(format: LogFormat) -> WorkerGuard {
    let (writer, guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(BUFFERED_LINES)
        .lossy(true)
        .thread_name("sluice-log")
        .finish(std::io::stderr());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer.clone());
    match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).with_span_list(false).init(),
        // Colour only for a person at a terminal, not in files or pod logs.
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
    let _ = WRITER.set((writer, format));
    guard
}

/// Writes one access log line, if the access log is on.
pub(crate) fn write_access(line: impl FnOnce(LogFormat, &mut String)) {
    if !ACCESS_LOG.load(Ordering::Relaxed) {
        return;
    }
    let Some((writer, format)) = WRITER.get() else { return };
    let mut out = String::with_capacity(512);
    line(*format, &mut out);
    out.push('\n');
    // One write is one line for the writer thread; a full buffer drops it.
    let _ = writer.clone().write(out.as_bytes());
}

/// The current time as the other log lines print it (RFC 3339, UTC).
pub(crate) fn timestamp() -> String {
    let mut out = String::with_capacity(32);
    let _ = SystemTime.format_time(&mut Writer::new(&mut out));
    out
}
