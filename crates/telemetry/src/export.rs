//! The one runtime OTLP exports run on, traces and metrics alike.
//!
//! tonic and hyper need a tokio runtime, and the process's may be busy,
//! single-threaded, or gone by the time the last spans and metrics go out.
//! So both signals export on this one: a single worker thread, started by
//! the first signal set up and kept for the life of the process (a static
//! is never dropped, so never inside another runtime, where that panics).

use std::sync::OnceLock;

use parking_lot::Mutex;
use tokio::runtime::Runtime;

/// The export runtime, started on first use.
pub(crate) fn runtime() -> std::io::Result<&'static Runtime> {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    // One start at a time: a second runtime built in a race would be
    // dropped, perhaps on a runtime's thread.
    static STARTING: Mutex<()> = Mutex::new(());
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let _starting = STARTING.lock();
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .thread_name("sluice-otlp")
        .enable_all()
        .build()?;
    Ok(RUNTIME.get_or_init(|| runtime))
}
