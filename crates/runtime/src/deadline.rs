//! Deadlines and limits of calls into a guest, and what a failed call was.

use std::time::{Duration, Instant};

use wasmtime::{PoolConcurrencyLimitError, Store};

use crate::PluginError;
use crate::host::{DeadlineExceeded, PluginState};
use crate::memory::Refused;

/// Per-plugin limits, from the GatewayPlugin spec.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Deadline for each call into the guest (instantiation included).
    pub timeout: Duration,
    pub max_memory_bytes: usize,
}

/// Starts the deadline for the next call into the guest, and returns it.
pub(crate) fn arm(store: &mut Store<PluginState>, timeout: Duration) -> Instant {
    let deadline = Instant::now() + timeout;
    let state = store.data_mut();
    state.ticker.keep_ticking_until(deadline);
    state.deadline = deadline;
    state.ticked = false;
    state.memory.refused = None;
    state.state_failed = None;
    store.set_epoch_deadline(1);
    deadline
}

/// For calls that run none of the plugin's code (Wizer's accessors, which
/// read a global or a memory's bounds): no deadline, so the epoch need not
/// tick for them.
pub(crate) fn arm_trusted(store: &mut Store<PluginState>) {
    store.data_mut().memory.refused = None;
    // About 35 years of 1 ms ticks.
    store.set_epoch_deadline(1 << 40);
}

/// Runs a call into the guest until `deadline` in wall-clock time. The
/// epoch deadline stops guest code that runs; this stops a call that waits
/// in the host. The abandoned call leaves its instance in an unknown state:
/// the caller discards it.
pub(crate) async fn within<T>(
    deadline: Instant,
    call: impl Future<Output = wasmtime::Result<T>>,
) -> wasmtime::Result<T> {
    match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), call).await {
        Ok(result) => result,
        Err(_) => Err(wasmtime::Error::new(DeadlineExceeded)),
    }
}

pub(crate) fn classify(store: &Store<PluginState>, error: wasmtime::Error, timeout: Duration) -> PluginError {
    let memory = &store.data().memory;
    if let Some(why) = &store.data().state_failed {
        // Whatever it failed on then (a trap, its deadline), the store
        // failed first.
        PluginError::StateUnavailable(why.clone())
    } else if error.downcast_ref::<DeadlineExceeded>().is_some() {
        PluginError::Timeout(timeout)
    } else if memory.refused == Some(Refused::Plugin) {
        PluginError::MemoryLimit(memory.max_bytes)
    } else if memory.refused == Some(Refused::Budget) {
        PluginError::Overloaded("the memory all plugin instances may hold together is in use".into())
    } else if memory.refused == Some(Refused::NamespaceShare) {
        PluginError::Overloaded("its namespace's share of the memory plugin instances may hold is in use".into())
    } else if memory.refused == Some(Refused::PluginShare) {
        PluginError::Overloaded("its share of the memory plugin instances may hold is in use".into())
    } else if let Some(pool) = error.chain().find_map(|e| e.downcast_ref::<PoolConcurrencyLimitError>()) {
        PluginError::Overloaded(format!("plugin instance pool: {pool}"))
    } else {
        // The client gets the trap's cause; the wasm backtrace goes to the log.
        tracing::debug!(plugin = &*store.data().plugin, error = format!("{error:?}"), "plugin trapped");
        match error.downcast_ref::<wasmtime::Trap>() {
            Some(trap) => PluginError::Trap(trap.to_string()),
            // A host function's error, under the wasm backtrace.
            None => PluginError::Trap(error.root_cause().to_string()),
        }
    }
}
