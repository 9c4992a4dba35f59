//! The results of `cargo xtask bench` as one markdown table, with the
//! machine, the versions and the method above it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::http::{STREAM_CHUNKS, STREAMS};
use super::oha::Measurement;
use super::systems::{DIRECT, RATIO_BASE, System};

/// What one round measured of one system.
pub struct RoundResult {
    /// One per rate, in the order of `--rates`.
    pub fixed: Vec<Measurement>,
    /// CPU time of the system's process tree during each fixed-rate run.
    pub fixed_cpu_seconds: Vec<Option<f64>>,
    pub saturation: Measurement,
    /// CPU time of the system's process tree during the saturation run
    /// (`None` for direct, which has no process of its own).
    pub cpu_seconds: Option<f64>,
    /// Steal time of the system's core during the saturation run (`None`
    /// for direct).
    pub steal_seconds: Option<f64>,
    /// CPU time of the process tree while it was left idle, before any load.
    pub idle_cpu_seconds: Option<f64>,
    /// RSS of the process tree after the saturation run.
    pub rss_bytes: Option<u64>,
    /// Streams from the echo upstream, one at a time, after the load.
    pub streams: Vec<super::http::Streamed>,
}

impl RoundResult {
    /// CPU time per successful request of the saturation run, in seconds.
    fn cpu_per_request(&self) -> Option<f64> {
        self.cpu_seconds.filter(|_| self.saturation.ok > 0).map(|cpu| cpu / self.saturation.ok as f64)
    }

    /// CPU time per successful request of the run at the fixed rate
    /// `rate_index`, in seconds. Every system answers the same requests at
    /// the same pace there; at saturation a system that is not the
    /// bottleneck (a fast one, with oha and the upstream sharing the other
    /// core) does less work per wake-up and so more per request.
    fn cpu_per_request_at(&self, rate_index: usize) -> Option<f64> {
        let ok = self.fixed.get(rate_index)?.ok;
        self.fixed_cpu_seconds.get(rate_index).copied().flatten().filter(|_| ok > 0).map(|cpu| cpu / ok as f64)
    }

    /// The share of a core the system used during the saturation run: under
    /// 100%, it was not the bottleneck.
    fn busy_at_saturation(&self) -> Option<f64> {
        self.share_of_saturation(self.cpu_seconds)
    }

    /// The share of its core the hypervisor gave to others during the
    /// saturation run while the system wanted it: busy + steal near 100% is
    /// a bottleneck that did not get the whole core.
    fn steal_at_saturation(&self) -> Option<f64> {
        self.share_of_saturation(self.steal_seconds)
    }

    /// `seconds` over the saturation run's length.
    fn share_of_saturation(&self, seconds: Option<f64>) -> Option<f64> {
        seconds.filter(|_| self.saturation.seconds > 0.0).map(|seconds| seconds / self.saturation.seconds)
    }

    fn runs(&self) -> impl Iterator<Item = &Measurement> {
        self.fixed.iter().chain([&self.saturation])
    }
}

pub struct SystemResults {
    pub system: &'static System,
    pub rounds: Vec<RoundResult>,
}

/// What the results are stamped with.
pub struct Facts {
    pub command_line: String,
    pub date: String,
    pub machine: String,
    pub versions: Vec<(String, String)>,
    pub load: String,
    pub body: String,
    pub rates: Vec<u32>,
    pub rounds: u32,
    pub fixed_load: String,
    pub saturation_load: String,
    /// (gateway core, load generator and upstream core).
    pub cores: (u32, u32),
    /// Routes each Sluice system had.
    pub routes: u32,
    /// How long each system was left idle.
    pub idle: std::time::Duration,
}

/// One line per measured system and round, printed as the run goes.
pub fn summary_line(round: &RoundResult, rates: &[u32]) -> String {
    let mut line = String::from("  ");
    for (rate, m) in rates.iter().zip(&round.fixed) {
        let _ = write!(line, "{rate}/s p50 {} p99 {} ms; ", ms(m.p50), ms(m.p99));
    }
    let _ = write!(line, "saturation {:.0} req/s", round.saturation.ok_per_second());
    if let Some(cpu) = round.cpu_per_request() {
        let _ = write!(line, ", {:.1} µs CPU/request", cpu * 1e6);
    }
    if let Some((busy, steal)) = round.busy_at_saturation().zip(round.steal_at_saturation()) {
        let _ = write!(line, " (busy {:.0}%, steal {:.0}% of its core)", busy * 100.0, steal * 100.0);
    }
    let failed: u64 = round.runs().map(|m| m.failed).sum();
    let _ = write!(line, ", {failed} failed");
    line
}

pub fn render(facts: &Facts, results: &[SystemResults]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Sluice side by side, {}\n", facts.date);
    let _ = writeln!(out, "`{}`\n", facts.command_line.trim());
    let _ = writeln!(out, "- Machine: {}; load average (1, 5, 15 min) {}.", facts.machine, facts.load);
    let versions: Vec<String> = facts.versions.iter().map(|(tool, version)| format!("{tool}: {version}")).collect();
    let _ = writeln!(out, "- Versions: {}.", versions.join("; "));
    let _ = writeln!(
        out,
        "- Pinning: the system under test on core {}, oha and the upstream (nginx, fixed response) on core {}.",
        facts.cores.0, facts.cores.1
    );
    let _ = writeln!(out, "- Request: POST /v1/chat/completions, {}.", facts.body);
    if facts.routes > 1 {
        let _ = writeln!(
            out,
            "- Routes: each Sluice system serves its route among {} (the rest for other models).",
            facts.routes
        );
    }
    let _ = writeln!(
        out,
        "- Latency: open loop at fixed rates with latency correction, {}; the latency each system adds over \
         direct at the same percentile, in ms, median over {} round(s) of (system − direct in that round). \
         Added p99 × `{RATIO_BASE}`: in each round, the system's added p99 over `{RATIO_BASE}`'s in the same \
         round; the median (min–max) over the rounds where `{RATIO_BASE}` added a positive p99. A ratio of \
         rounds run minutes apart would compare two moods of the host: the p99 at a fixed rate moves several \
         fold between runs, for every system alike.",
        facts.fixed_load, facts.rounds
    );
    let _ = writeln!(
        out,
        "- Saturation: closed loop, {}; throughput counts 200s only. It swings ±30% between runs, and a fast \
         system saturates oha's core first: CPU per request and added latency are the primary figures.",
        facts.saturation_load
    );
    let _ = writeln!(
        out,
        "- CPU per request: utime + stime of the system's process tree (threads and children included) over the \
         saturation run, divided by the 200s it served; median (min–max) over rounds; ratio to `{RATIO_BASE}`. \
         Busy at saturation: that CPU time over the run's length; under 100% the system was not the \
         bottleneck (oha and the upstream share the other core), and its CPU per request there comes out \
         higher than when it is. So the same figure is also given over the run at the highest fixed rate, where \
         every system answers the same requests at the same pace. Steal at saturation: the time the hypervisor ran something else while the \
         system's core wanted to run (/proc/stat), over the run's length; busy + steal near 100% is a system \
         that was the bottleneck but did not get the whole core (a VM's neighbours), and its figures from that \
         round are the least reliable. Idle CPU: the tree's CPU time over {:?} left alone once it served, before the load, median over \
         rounds. RSS: the tree's VmRSS after the saturation run, the largest over rounds. Streams: after the \
         load, {STREAMS} streaming requests one at a time, answered by the echo upstream with \
         {STREAM_CHUNKS} chunks 20 ms apart; the time to the first `data:` event over direct's, in ms.",
        facts.idle
    );
    let _ = writeln!(
        out,
        "- Equivalence: the proxy-wasm filter sets `x-team: search` and prepends a system message; \
         `sluice-decorate`, the decorator-lite systems (`sluice-rust`, `-c`, `-python`, `-js`, each also \
         `-reused`) and `litellm` (a pre-call hook) do the same, checked at an echo upstream before measuring. \
         Streaming responses are not measured yet (the upstream answers with one JSON body).\n"
    );

    let mut header = String::from("| system | failed / sent |");
    let mut rule = String::from("|---|---:|");
    for rate in &facts.rates {
        let _ = write!(header, " added p50 / p99 / p99.9 at {rate}/s (ms) |");
        rule.push_str("---:|");
    }
    for rate in &facts.rates {
        let _ = write!(header, " added p99 × {RATIO_BASE} at {rate}/s |");
        rule.push_str("---:|");
    }
    header.push_str(" saturation (req/s) | CPU per request (µs) | CPU × ");
    header.push_str(RATIO_BASE);
    header.push_str(" | busy at saturation (% of a core) | steal at saturation (% of its core) |");
    // The same figures at the highest fixed rate, where every system does
    // the same work at the same pace.
    let top_rate = facts.rates.iter().enumerate().max_by_key(|(_, rate)| **rate);
    if let Some((_, rate)) = top_rate {
        let _ = write!(header, " CPU per request at {rate}/s (µs) | × {RATIO_BASE} at {rate}/s |");
        rule.push_str("---:|---:|");
    }
    header.push_str(" idle CPU (% of a core) | RSS (MiB) | added time to first event p50 / p99 (ms) |");
    rule.push_str("---:|---:|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(out, "{header}\n{rule}");

    let direct = results.iter().find(|r| r.system.name == DIRECT);
    let base = results.iter().find(|r| r.system.name == RATIO_BASE);
    let base_cpu = base.and_then(cpu_per_request);
    let top_index = top_rate.map(|(index, _)| index);
    let base_cpu_at_top = base.zip(top_index).and_then(|(base, index)| cpu_per_request_at(base, index));
    for result in results {
        let failed: u64 = result.rounds.iter().flat_map(RoundResult::runs).map(|m| m.failed).sum();
        let sent: u64 = result.rounds.iter().flat_map(RoundResult::runs).map(Measurement::total).sum();
        let _ = write!(out, "| {} | {failed} / {sent} |", result.system.name);
        for rate_index in 0..facts.rates.len() {
            let _ = write!(out, " {} |", latency_cell(result, direct, rate_index));
        }
        for rate_index in 0..facts.rates.len() {
            let _ = write!(out, " {} |", p99_ratio_cell(result, direct, base, rate_index));
        }
        let throughput = median(result.rounds.iter().map(|r| Some(r.saturation.ok_per_second())));
        let cpu_cell = micros_cell(result.rounds.iter().map(RoundResult::cpu_per_request).collect());
        let ratio =
            cpu_per_request(result).zip(base_cpu).map_or("—".into(), |(cpu, base)| format!("{:.2}", cpu / base));
        let percent = |share: fn(&RoundResult) -> Option<f64>| {
            median(result.rounds.iter().map(share)).map_or("—".into(), |share| format!("{:.0}", share * 100.0))
        };
        let (busy, steal) = (percent(RoundResult::busy_at_saturation), percent(RoundResult::steal_at_saturation));
        let mut at_top = String::new();
        if let Some(index) = top_index {
            let cpu = micros_cell(result.rounds.iter().map(|r| r.cpu_per_request_at(index)).collect());
            let ratio = cpu_per_request_at(result, index)
                .zip(base_cpu_at_top)
                .map_or("—".into(), |(cpu, base)| format!("{:.2}", cpu / base));
            let _ = write!(at_top, " {cpu} | {ratio} |");
        }
        let idle = median(result.rounds.iter().map(|r| r.idle_cpu_seconds));
        let idle = idle.map_or("—".into(), |cpu| format!("{:.2}", cpu / facts.idle.as_secs_f64() * 100.0));
        let rss = result.rounds.iter().filter_map(|r| r.rss_bytes).max();
        let rss = rss.map_or("—".into(), |bytes| format!("{:.1}", bytes as f64 / (1024.0 * 1024.0)));
        let throughput = throughput.map_or("—".into(), |t| format!("{t:.0}"));
        let ttft = stream_cell(result, direct);
        let _ = writeln!(
            out,
            " {throughput} | {cpu_cell} | {ratio} | {busy} | {steal} |{at_top} {idle} | {rss} | {ttft} |"
        );
    }

    for result in results {
        let mut failures = BTreeMap::new();
        for m in result.rounds.iter().flat_map(RoundResult::runs) {
            for (what, count) in &m.failures {
                *failures.entry(what.as_str()).or_insert(0) += count;
            }
        }
        if !failures.is_empty() {
            let listed: Vec<String> = failures.iter().map(|(what, count)| format!("{what} × {count}")).collect();
            let _ = writeln!(out, "\nFailures of `{}`: {}.", result.system.name, listed.join(", "));
        }
    }

    let _ = writeln!(out, "\nThe `direct` row shows absolute latency. The systems:\n");
    for result in results {
        let _ = writeln!(out, "- `{}`: {}.", result.system.name, result.system.about);
    }
    if facts.rounds > 1 {
        out.push_str(&rounds_table(&facts.rates, results, direct, base));
    }
    out
}

/// How the round-by-round table's header begins, and how its rate columns
/// are titled (`{ADDED_P99_AT}{rate}/s`): `pool.rs` finds and reads the
/// table by them.
pub(super) const ROUNDS_TABLE_HEAD: &str = "| system | round |";
pub(super) const ADDED_P99_AT: &str = "added p99 at ";

/// Each round's added p99 at each rate (with its ratio to `RATIO_BASE`'s in
/// the same round) and CPU per request: what the medians above are taken
/// over, so that runs can be pooled and a round that swung shows.
fn rounds_table(
    rates: &[u32],
    results: &[SystemResults],
    direct: Option<&SystemResults>,
    base: Option<&SystemResults>,
) -> String {
    let mut out = String::from("\nRound by round, the added p99 in ms (× `");
    out.push_str(RATIO_BASE);
    out.push_str("`'s in that round) and the CPU per request at saturation:\n\n");
    out.push_str(ROUNDS_TABLE_HEAD);
    let mut rule = String::from("|---|---:|");
    for rate in rates {
        let _ = write!(out, " {ADDED_P99_AT}{rate}/s |");
        rule.push_str("---:|");
    }
    let _ = writeln!(out, " CPU per request (µs) |\n{rule}---:|");
    for result in results.iter().filter(|result| result.system.name != DIRECT) {
        for (round, measured) in result.rounds.iter().enumerate() {
            let _ = write!(out, "| {} | {} |", result.system.name, round + 1);
            for rate_index in 0..rates.len() {
                let _ = match direct.and_then(|direct| added_p99(result, direct, base, round, rate_index)) {
                    Some((own, Some(ratio))) => write!(out, " {:+.3} ({ratio:.2}) |", own * 1e3),
                    Some((own, None)) => write!(out, " {:+.3} |", own * 1e3),
                    None => write!(out, " — |"),
                };
            }
            let cpu = measured.cpu_per_request().map_or("—".into(), |cpu| format!("{:.1}", cpu * 1e6));
            let _ = writeln!(out, " {cpu} |");
        }
    }
    out
}

/// "p50 / p99 / p99.9" added over direct at one rate (absolute for direct).
fn latency_cell(result: &SystemResults, direct: Option<&SystemResults>, rate_index: usize) -> String {
    let is_direct = result.system.name == DIRECT;
    let pick = [|m: &Measurement| m.p50, |m: &Measurement| m.p99, |m: &Measurement| m.p999];
    let cells: Vec<String> = pick
        .iter()
        .map(|percentile| {
            let per_round = (0..result.rounds.len()).map(|round| match direct {
                _ if is_direct => percentile(result.rounds[round].fixed.get(rate_index)?),
                Some(direct) => added(result, direct, round, rate_index, *percentile),
                None => None,
            });
            match median(per_round) {
                Some(value) if is_direct => format!("{:.3}", value * 1e3),
                Some(value) => format!("{:+.3}", value * 1e3),
                None => "—".into(),
            }
        })
        .collect();
    cells.join(" / ")
}

/// The latency `result` added over direct at one percentile, rate and round.
fn added(
    result: &SystemResults,
    direct: &SystemResults,
    round: usize,
    rate_index: usize,
    percentile: fn(&Measurement) -> Option<f64>,
) -> Option<f64> {
    let own = percentile(result.rounds.get(round)?.fixed.get(rate_index)?)?;
    let baseline = percentile(direct.rounds.get(round)?.fixed.get(rate_index)?)?;
    Some(own - baseline)
}

/// The added p99 over `base`'s, round by round (the two ran minutes apart
/// at most), as "median (min–max)". Rounds where `base` added nothing
/// measurable at p99 give no ratio.
fn p99_ratio_cell(
    result: &SystemResults,
    direct: Option<&SystemResults>,
    base: Option<&SystemResults>,
    rate_index: usize,
) -> String {
    let (Some(direct), Some(base)) = (direct, base) else { return "—".into() };
    if result.system.name == DIRECT {
        return "—".into();
    }
    let ratios: Vec<Option<f64>> = (0..result.rounds.len())
        .filter_map(|round| added_p99(result, direct, Some(base), round, rate_index)?.1.map(Some))
        .collect();
    match (median(ratios.iter().copied()), min_max(&ratios)) {
        (Some(median), Some((min, max))) if ratios.len() > 1 => format!("{median:.2} ({min:.2}–{max:.2})"),
        (Some(median), _) => format!("{median:.2}"),
        _ => "—".into(),
    }
}

/// The p99 `result` added over direct in one round at one rate, and its
/// ratio to what `base` added in the same round (none where `base` added
/// nothing measurable).
fn added_p99(
    result: &SystemResults,
    direct: &SystemResults,
    base: Option<&SystemResults>,
    round: usize,
    rate_index: usize,
) -> Option<(f64, Option<f64>)> {
    let p99 = |m: &Measurement| m.p99;
    let own = added(result, direct, round, rate_index, p99)?;
    let reference = base.and_then(|base| added(base, direct, round, rate_index, p99)).filter(|r| *r > 0.0);
    Some((own, reference.map(|reference| own / reference)))
}

fn cpu_per_request(result: &SystemResults) -> Option<f64> {
    median(result.rounds.iter().map(RoundResult::cpu_per_request))
}

fn cpu_per_request_at(result: &SystemResults, rate_index: usize) -> Option<f64> {
    median(result.rounds.iter().map(|r| r.cpu_per_request_at(rate_index)))
}

/// A per-round figure in seconds as µs: the median, and with several
/// rounds the least and most in brackets.
fn micros_cell(values: Vec<Option<f64>>) -> String {
    match (median(values.iter().copied()), min_max(&values)) {
        (Some(median), Some((min, max))) if values.len() > 1 => {
            format!("{:.1} ({:.1}–{:.1})", median * 1e6, min * 1e6, max * 1e6)
        }
        (Some(median), _) => format!("{:.1}", median * 1e6),
        _ => "—".into(),
    }
}

/// The median, or `None` if any value is missing (a figure from some rounds
/// only would not be comparable).
pub(super) fn median(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut values: Vec<f64> = values.collect::<Option<_>>()?;
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    Some(if values.len().is_multiple_of(2) { (values[middle - 1] + values[middle]) / 2.0 } else { values[middle] })
}

fn min_max(values: &[Option<f64>]) -> Option<(f64, f64)> {
    let values: Vec<f64> = values.iter().copied().collect::<Option<_>>()?;
    let min = values.iter().copied().reduce(f64::min)?;
    let max = values.iter().copied().reduce(f64::max)?;
    Some((min, max))
}

fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("—".into(), |s| format!("{:.3}", s * 1e3))
}

/// The added time to the first event, p50 / p99 over all rounds' streams,
/// against direct's at the same percentile.
fn stream_cell(result: &SystemResults, direct: Option<&SystemResults>) -> String {
    let percentiles = |result: &SystemResults| {
        let mut firsts: Vec<f64> =
            result.rounds.iter().flat_map(|r| &r.streams).map(|s| s.first_event.as_secs_f64() * 1e3).collect();
        firsts.sort_by(f64::total_cmp);
        let at = |p: usize| firsts.get((firsts.len() * p / 100).min(firsts.len().saturating_sub(1))).copied();
        at(50).zip(at(99))
    };
    match (percentiles(result), direct.and_then(percentiles)) {
        (Some((p50, p99)), Some((d50, d99))) if result.system.name != DIRECT => {
            format!("{:+.3} / {:+.3}", p50 - d50, p99 - d99)
        }
        (Some((p50, p99)), _) => format!("{p50:.3} / {p99:.3}"),
        _ => "—".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_and_odd_counts_and_missing_values() {
        assert_eq!(median([Some(3.0), Some(1.0), Some(2.0)].into_iter()), Some(2.0));
        assert_eq!(median([Some(4.0), Some(1.0)].into_iter()), Some(2.5));
        assert_eq!(median([Some(4.0), None].into_iter()), None);
        assert_eq!(median(std::iter::empty()), None);
    }

    fn system(name: &str) -> &'static System {
        super::super::systems::SYSTEMS.iter().find(|s| s.name == name).unwrap()
    }

    /// A system measured over rounds with these p99s (ms) at one rate.
    fn measured(name: &str, p99s: &[f64]) -> SystemResults {
        let run = |p99: Option<f64>| Measurement {
            ok: 1,
            failed: 0,
            failures: BTreeMap::new(),
            seconds: 1.0,
            p50: Some(0.0),
            p99,
            p999: Some(0.0),
        };
        let rounds = p99s
            .iter()
            .map(|p99| RoundResult {
                fixed: vec![run(Some(p99 / 1e3))],
                fixed_cpu_seconds: vec![None],
                saturation: run(None),
                cpu_seconds: None,
                steal_seconds: None,
                idle_cpu_seconds: None,
                rss_bytes: None,
                streams: Vec::new(),
            })
            .collect();
        SystemResults { system: system(name), rounds }
    }

    /// The ratio pairs each round with the reference's same round, not the
    /// medians of rounds that ran apart; a round where the reference added
    /// nothing at p99 gives no ratio.
    #[test]
    fn added_p99_is_compared_round_by_round() {
        let direct = measured(DIRECT, &[1.0, 1.0, 5.0, 1.0]);
        let base = measured(RATIO_BASE, &[3.0, 2.0, 9.0, 0.5]);
        let chain = measured("sluice-chain-reused", &[2.0, 3.0, 6.0, 9.0]);
        // Rounds: (2-1)/(3-1) = 0.5, (3-1)/(2-1) = 2, (6-5)/(9-5) = 0.25;
        // the last has the reference under direct.
        assert_eq!(p99_ratio_cell(&chain, Some(&direct), Some(&base), 0), "0.50 (0.25–2.00)");
        // The ratio of the medians (1.5 added by each) would say 1.00.
        assert_eq!(latency_cell(&chain, Some(&direct), 0), "+0.000 / +1.500 / +0.000");
        assert_eq!(latency_cell(&base, Some(&direct), 0), "+0.000 / +1.500 / +0.000");
        assert_eq!(p99_ratio_cell(&base, Some(&direct), Some(&base), 0), "1.00 (1.00–1.00)");
        assert_eq!(p99_ratio_cell(&direct, Some(&direct), Some(&base), 0), "—");
        assert_eq!(p99_ratio_cell(&chain, Some(&direct), None, 0), "—");
        let quiet = measured(RATIO_BASE, &[1.0, 0.5, 5.0, 1.0]);
        assert_eq!(p99_ratio_cell(&chain, Some(&direct), Some(&quiet), 0), "—");

        // Each round as measured: the ratios the cell took its median of.
        let table = rounds_table(&[500], &[direct, base, chain], None, None);
        assert!(table.contains("| sluice-chain-reused | 4 | — | — |"), "{table}");
        assert!(table.contains("| envoy-proxy-wasm | 1 |"), "{table}");
        assert!(!table.contains("| direct |"), "direct is the baseline, not a row: {table}");
        let results = [measured(DIRECT, &[1.0, 1.0, 5.0, 1.0]), measured(RATIO_BASE, &[3.0, 2.0, 9.0, 0.5])];
        let chain = measured("sluice-chain-reused", &[2.0, 3.0, 6.0, 9.0]);
        let table = rounds_table(&[500], &[chain], Some(&results[0]), Some(&results[1]));
        let rows: Vec<&str> = table.lines().filter(|line| line.starts_with("| sluice-chain-reused")).collect();
        assert_eq!(
            rows,
            [
                "| sluice-chain-reused | 1 | +1.000 (0.50) | — |",
                "| sluice-chain-reused | 2 | +2.000 (2.00) | — |",
                "| sluice-chain-reused | 3 | +1.000 (0.25) | — |",
                "| sluice-chain-reused | 4 | +8.000 | — |",
            ]
        );
    }
}
