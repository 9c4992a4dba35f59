//! The gateway's CPU time in nanoseconds, for benches that measure a few
//! thousand requests: `Gateway::cpu_seconds` reads /proc/PID/stat, whose
//! 10 ms ticks are too coarse for that. This sums the run time of the
//! gateway's live threads from their schedstat; a thread that exits during
//! a measurement takes its time with it, so it suits cases that keep to the
//! serving threads (no DNS, no token counting), as the benches that use it do.

use sluice_tests::Gateway;

/// The CPU time the gateway's live threads have used, in seconds.
pub fn cpu_seconds(gateway: &Gateway) -> f64 {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", gateway.pid())).expect("reading /proc");
    let ns: u64 = tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}
