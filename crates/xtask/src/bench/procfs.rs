//! CPU time and memory of a process tree, from /proc (Linux only).
//!
//! A system is measured as its whole tree (nginx's master and workers);
//! /proc/PID/stat already sums all threads of a process (Envoy's workers,
//! Sluice's tokio and tokenizer threads).

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

use crate::output;

/// utime + stime of `root` and its descendants, plus the time of those
/// that exited and were waited for (cutime + cstime), in seconds.
pub fn tree_cpu_seconds(root: u32) -> Result<f64> {
    let mut ticks = 0;
    for pid in tree(root)? {
        // A process that exits between the listing and here has moved its
        // time to its parent's cutime, already read or read next.
        if let Ok(stat) = Stat::read(pid) {
            ticks += stat.utime + stat.stime + stat.cutime + stat.cstime;
        }
    }
    Ok(ticks as f64 / clock_ticks_per_second())
}

/// The sum of VmRSS over `root` and its descendants, in bytes. Pages shared
/// between them (nginx's master and worker) are counted in each.
pub fn tree_rss_bytes(root: u32) -> Result<u64> {
    let mut kib = 0;
    for pid in tree(root)? {
        let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let rss = status.lines().find_map(|line| line.strip_prefix("VmRSS:"));
        if let Some(value) = rss.and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok()) {
            kib += value;
        }
    }
    Ok(kib * 1024)
}

/// The pid of our child process with `marker` (a path unique to it) in its
/// command line. `Running` hides its child's pid; this finds it again.
pub fn child_with_arg(marker: &Path) -> Result<u32> {
    let marker = marker.to_string_lossy();
    let ours = std::process::id();
    let mut found = Vec::new();
    for (pid, stat) in all_processes()? {
        if stat.ppid != ours {
            continue;
        }
        // Arguments are NUL-separated; nginx rewrites its own into one
        // title, which keeps the original command line.
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker.as_ref()) {
            found.push(pid);
        }
    }
    match found[..] {
        [pid] => Ok(pid),
        [] => bail!("no child process of ours has {marker} in its command line"),
        _ => bail!("several child processes have {marker} in their command line: {found:?}"),
    }
}

/// A process as of now: its pid, and its start time, so that a pid reused
/// by another process later is not taken for it.
pub struct Process {
    pub pid: u32,
    start_time: u64,
}

impl Process {
    /// Whether it still runs (a zombie does not).
    pub fn is_running(&self) -> bool {
        Stat::read(self.pid).is_ok_and(|stat| stat.start_time == self.start_time && stat.state != 'Z')
    }
}

/// The processes descended from `root`, without `root` itself.
pub fn descendants(root: u32) -> Result<Vec<Process>> {
    let mut found = Vec::new();
    for pid in tree(root)?.into_iter().filter(|&pid| pid != root) {
        if let Ok(stat) = Stat::read(pid) {
            found.push(Process { pid, start_time: stat.start_time });
        }
    }
    Ok(found)
}

/// `root` and every process descended from it.
fn tree(root: u32) -> Result<Vec<u32>> {
    let parents: HashMap<u32, u32> = all_processes()?.into_iter().map(|(pid, stat)| (pid, stat.ppid)).collect();
    if !parents.contains_key(&root) {
        bail!("process {root} is gone");
    }
    let descends = |mut pid: u32| {
        // Parent links end at pid 0 (init's parent); the bound guards
        // against a cycle from pid reuse during the walk.
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match parents.get(&pid) {
                Some(&parent) if parent != 0 => pid = parent,
                _ => return false,
            }
        }
        false
    };
    Ok(parents.keys().copied().filter(|&pid| descends(pid)).collect())
}

fn all_processes() -> Result<Vec<(u32, Stat)>> {
    let mut processes = Vec::new();
    for entry in fs::read_dir("/proc").context("cannot list /proc")? {
        let Some(pid) = entry?.file_name().to_str().and_then(|name| name.parse().ok()) else { continue };
        if let Ok(stat) = Stat::read(pid) {
            processes.push((pid, stat));
        }
    }
    Ok(processes)
}

/// The fields of /proc/PID/stat used here (times in clock ticks).
struct Stat {
    state: char,
    ppid: u32,
    utime: u64,
    stime: u64,
    cutime: u64,
    cstime: u64,
    /// Clock ticks after boot.
    start_time: u64,
}

impl Stat {
    fn read(pid: u32) -> Result<Stat> {
        let text = fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // The command name (field 2) is in parentheses and may hold spaces
        // or parentheses itself: the fields after it start after the last ')'.
        let after_name = text.rsplit_once(')').context("malformed /proc stat")?.1;
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // fields[0] is field 3 (state) of proc(5).
        let field = |number: usize| -> Result<u64> {
            let value = fields.get(number - 3).context("short /proc stat")?;
            Ok(value.parse()?)
        };
        Ok(Stat {
            state: fields.first().and_then(|state| state.chars().next()).context("no state in /proc stat")?,
            ppid: u32::try_from(field(4)?)?,
            utime: field(14)?,
            stime: field(15)?,
            cutime: field(16)?,
            cstime: field(17)?,
            start_time: field(22)?,
        })
    }
}

/// Steal time of CPU `core` since boot, in seconds: the time its vCPU
/// wanted to run while the hypervisor ran something else (a VM's
/// neighbours). A process pinned there loses that time to no one it can see.
pub fn core_steal_seconds(core: u32) -> Result<f64> {
    let stat = fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let ticks = steal_ticks(&stat, core).with_context(|| format!("no steal time of cpu{core} in /proc/stat"))?;
    Ok(ticks as f64 / clock_ticks_per_second())
}

/// The steal field of `cpuN` in /proc/stat: user nice system idle iowait
/// irq softirq steal … (proc(5)), in clock ticks.
fn steal_ticks(stat: &str, core: u32) -> Option<u64> {
    let name = format!("cpu{core}");
    let line = stat.lines().find(|line| line.split_whitespace().next() == Some(name.as_str()))?;
    line.split_whitespace().nth(8)?.parse().ok()
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        // 100 on every Linux this runs on; getconf says for sure.
        output(Command::new("getconf").arg("CLK_TCK")).ok().and_then(|out| out.trim().parse().ok()).unwrap_or(100.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_the_eighth_value_of_the_cores_own_line() {
        let stat = "cpu  9 0 8 7 0 0 0 99 0 0\n\
                    cpu0 1 2 3 4 5 6 7 8 9 10\n\
                    cpu1 11 12 13 14 15 16 17 18 19 20\n\
                    cpu10 21 22 23 24 25 26 27 28 29 30\n\
                    intr 1 2 3\n";
        assert_eq!(steal_ticks(stat, 0), Some(8));
        assert_eq!(steal_ticks(stat, 1), Some(18));
        assert_eq!(steal_ticks(stat, 10), Some(28));
        assert_eq!(steal_ticks(stat, 2), None);
        assert_eq!(steal_ticks("cpu3 1 2 3\n", 3), None, "a kernel without steal time");
    }

    #[test]
    fn this_machine_reports_steal_for_cpu0() {
        assert!(core_steal_seconds(0).is_ok_and(|seconds| seconds >= 0.0));
    }
}
