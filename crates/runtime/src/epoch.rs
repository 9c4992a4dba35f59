//! The thread that advances the engine's epoch, which is how a guest that
//! runs too long is stopped and how a busy guest yields to tokio. It ticks
//! only while some call into a guest may be running: an idle gateway on a
//! 1 ms ticker spent 2.6% of a core on it (a VM's timer wake-ups).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use wasmtime::Engine;

/// How often the epoch advances while guests run: the granularity of plugin
/// deadlines and of cooperative yields back to tokio. Spin uses 10 ms: tried
/// here, five requests beside two spinning plugins took longer than the
/// spinners' 3 s deadline (tests/e2e/failures.rs), each waiting out their
/// slices.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// How often a parked ticker looks whether its engine is gone (a thread
/// lingering that long after its engine costs nothing).
const PARKED_CHECK: Duration = Duration::from_secs(10);

pub(crate) struct EpochTicker {
    start: Instant,
    /// The latest deadline of any call armed so far, in nanoseconds since
    /// `start`.
    until: AtomicU64,
    parked: AtomicBool,
    thread: OnceLock<Thread>,
    /// Epochs advanced, for tests.
    ticks: AtomicU64,
}

impl EpochTicker {
    /// Starts the ticker of `engine`; it ends once the engine is dropped.
    pub fn start(engine: &Engine) -> Arc<EpochTicker> {
        let ticker = Arc::new(EpochTicker {
            start: Instant::now(),
            until: AtomicU64::new(0),
            parked: AtomicBool::new(false),
            thread: OnceLock::new(),
            ticks: AtomicU64::new(0),
        });
        let (weak, this) = (engine.weak(), ticker.clone());
        let handle = std::thread::Builder::new()
            .name("sluice-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    this.ticks.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(TICK);
                    this.park_while_no_call_runs();
                }
            })
            .expect("spawning the epoch thread at start-up");
        let _ = ticker.thread.set(handle.thread().clone());
        ticker
    }

    /// Keeps ticking until past `deadline`: called before every call into a
    /// guest, which must be stopped at its deadline.
    pub fn keep_ticking_until(&self, deadline: Instant) {
        self.until.fetch_max(self.nanos(deadline), Ordering::SeqCst);
        // SeqCst on both sides: either the ticker sees the new deadline
        // before it parks, or this sees it parked and wakes it.
        if self.parked.load(Ordering::SeqCst)
            && let Some(thread) = self.thread.get()
        {
            thread.unpark();
        }
    }

    /// Parks once two ticks have passed since the latest deadline: every
    /// call still running then has seen a tick past its deadline, and trapped.
    fn park_while_no_call_runs(&self) {
        let idle = || self.nanos(Instant::now()) > self.until.load(Ordering::SeqCst) + 2 * TICK.as_nanos() as u64;
        if !idle() {
            return;
        }
        self.parked.store(true, Ordering::SeqCst);
        if idle() {
            std::thread::park_timeout(PARKED_CHECK);
        }
        self.parked.store(false, Ordering::SeqCst);
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }

    #[cfg(test)]
    fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_only_until_past_the_latest_deadline() {
        let engine = Engine::new(wasmtime::Config::new().epoch_interruption(true)).unwrap();
        let ticker = EpochTicker::start(&engine);
        std::thread::sleep(Duration::from_millis(50));
        let parked_at = ticker.ticks();
        std::thread::sleep(Duration::from_millis(100));
        assert!(ticker.ticks() <= parked_at + 1, "ticked while no call was armed: {parked_at} → {}", ticker.ticks());

        ticker.keep_ticking_until(Instant::now() + Duration::from_millis(200));
        std::thread::sleep(Duration::from_millis(100));
        let running = ticker.ticks() - parked_at;
        // 1 ms ticks: about 100, far fewer on a busy machine, but not 1.
        assert!(running >= 5, "{running} ticks in 100 ms with a call armed");

        std::thread::sleep(Duration::from_millis(200));
        let after = ticker.ticks();
        std::thread::sleep(Duration::from_millis(100));
        assert!(ticker.ticks() <= after + 1, "ticked past the deadline: {after} → {}", ticker.ticks());
    }
}
