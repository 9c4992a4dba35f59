//! The thread that advances the engine's epoch, which is how a guest that
//! runs too long is stopped and how a busy guest yields to tokio. It ticks
//! only while some call into a guest may be running: an idle gateway on a
//! 1 ms ticker spent 2.6% of a core on it (a VM's timer wake-ups). And it
//! ticks every 1 ms only while some call has run through a whole tick,
//! every 10 ms while calls are short: each tick wakes a thread, and with the
//! gateway on one core, as the benches run it, a 1 ms ticker put 1% of
//! fresh instances at 60–75 µs against 17–24 with rarer ticks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use wasmtime::Engine;

/// How often the epoch advances while a call runs long: the granularity of
/// its deadline and of its cooperative yields back to tokio. Spin uses 10
/// ms: tried here for every call, five requests beside two spinning plugins
/// took longer than the spinners' 3 s deadline (tests/e2e/failures.rs), each
/// waiting out their slices.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// How often it advances while no call has run through a whole tick: a
/// spinning guest is found within two of these (and then yields every
/// `TICK`), and a deadline is met within one (10% of the default 100 ms).
pub(crate) const SLOW_TICK: Duration = Duration::from_millis(10);

/// How often a parked ticker looks whether its engine is gone (a thread
/// lingering that long after its engine costs nothing).
const PARKED_CHECK: Duration = Duration::from_secs(10);

pub(crate) struct EpochTicker {
    start: Instant,
    /// The latest deadline of any call armed so far, in nanoseconds since
    /// `start`.
    until: AtomicU64,
    /// Ticks every `TICK` until then, in nanoseconds since `start`.
    fast_until: AtomicU64,
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
            fast_until: AtomicU64::new(0),
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
                    std::thread::sleep(this.period());
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

    /// A call into a guest has seen a second tick, so it has run through a
    /// whole tick: ticks every `TICK` while it may still run (it says so
    /// again at each tick), so it yields to tokio that often.
    pub fn call_runs_long(&self) {
        self.fast_until.fetch_max(self.nanos(Instant::now() + 2 * SLOW_TICK), Ordering::Relaxed);
    }

    fn period(&self) -> Duration {
        let fast = self.nanos(Instant::now()) < self.fast_until.load(Ordering::Relaxed);
        if fast { TICK } else { SLOW_TICK }
    }

    /// Parks once two slow ticks have passed since the latest deadline:
    /// every call still running then has seen a tick past its deadline, and
    /// trapped.
    fn park_while_no_call_runs(&self) {
        let idle = || self.nanos(Instant::now()) > self.until.load(Ordering::SeqCst) + 2 * SLOW_TICK.as_nanos() as u64;
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

        ticker.keep_ticking_until(Instant::now() + Duration::from_millis(400));
        std::thread::sleep(Duration::from_millis(100));
        let slow = ticker.ticks() - parked_at;
        // 10 ms ticks: at most 11 (a sleep is never short), fewer on a busy
        // machine, but not 1.
        assert!((3..=11).contains(&slow), "{slow} ticks in 100 ms with a call armed");

        let at = ticker.ticks();
        for _ in 0..10 {
            ticker.call_runs_long();
            std::thread::sleep(Duration::from_millis(10));
        }
        let fast = ticker.ticks() - at;
        // 1 ms ticks: about 100, far fewer on a busy machine, but more
        // than 10 ms ticks could be.
        assert!(fast >= 20, "{fast} ticks in 100 ms with a call running long");

        std::thread::sleep(Duration::from_millis(400));
        let after = ticker.ticks();
        std::thread::sleep(Duration::from_millis(100));
        assert!(ticker.ticks() <= after + 1, "ticked past the deadline: {after} → {}", ticker.ticks());
    }
}
