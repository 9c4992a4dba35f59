//! Load from `oha`, and what it measured.
//!
//! Latency is measured open loop: oha sends at a fixed rate whatever the
//! responses do, and with `--latency-correction` times each request from
//! when it was due, so a stall counts against every request queued behind
//! it (a closed loop would send fewer requests during the stall and hide
//! it). Throughput is measured closed loop: many connections, each sending
//! its next request as soon as the last one is answered.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::systems::pinned;
use crate::{display, output};

/// One oha run's shape.
pub struct Load<'a> {
    /// Requests per second, or `None` for as fast as the system answers.
    rate: Option<u32>,
    connections: u32,
    duration: &'a str,
}

impl<'a> Load<'a> {
    pub fn fixed(rate: u32, connections: u32, duration: &'a str) -> Self {
        Load { rate: Some(rate), connections, duration }
    }

    pub fn closed(connections: u32, duration: &'a str) -> Self {
        Load { rate: None, connections, duration }
    }
}

/// What one oha run measured.
pub struct Measurement {
    /// Responses with status 200.
    pub ok: u64,
    /// Other statuses and errors (refused or reset connections, timeouts).
    pub failed: u64,
    /// What the failures were ("HTTP 503", or oha's error message), and how
    /// many of each.
    pub failures: BTreeMap<String, u64>,
    /// How long the run took, in seconds.
    pub seconds: f64,
    /// Latency percentiles over every response, in seconds (`None` when
    /// nothing was answered).
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
}

impl Measurement {
    pub fn total(&self) -> u64 {
        self.ok + self.failed
    }

    /// Successful responses per second.
    pub fn ok_per_second(&self) -> f64 {
        self.ok as f64 / self.seconds
    }
}

/// Runs oha against `url`, POSTing `body` with `headers`, pinned to `core`.
pub fn run(url: &str, body: &Path, headers: &[(&str, String)], load: &Load, core: u32) -> Result<Measurement> {
    let mut cmd = pinned(core, "oha");
    cmd.args(["--no-tui", "--output-format", "json"])
        .args(["-c", &load.connections.to_string()])
        .args(["-z", load.duration])
        // Let requests in flight at the deadline finish rather than count
        // as errors.
        .arg("-w")
        .args(["-m", "POST", "-T", "application/json", "-D"])
        .arg(body);
    if let Some(rate) = load.rate {
        cmd.args(["-q", &rate.to_string(), "--latency-correction"]);
    }
    for (name, value) in headers {
        cmd.args(["-H", &format!("{name}: {value}")]);
    }
    cmd.arg(url);
    println!("$ {}", display(&cmd));
    let report = output(&mut cmd)?;
    parse(&report).with_context(|| format!("reading oha's report on {url}"))
}

fn parse(report: &str) -> Result<Measurement> {
    let report: Value = serde_json::from_str(report).context("oha's output is not JSON")?;
    let counts = |map: &Value| -> Vec<(String, u64)> {
        let entries = map.as_object().into_iter().flatten();
        entries.filter_map(|(name, count)| Some((name.clone(), count.as_u64()?))).collect()
    };
    let statuses = counts(&report["statusCodeDistribution"]);
    let errors = counts(&report["errorDistribution"]);
    let ok = statuses.iter().find(|(status, _)| status == "200").map_or(0, |(_, count)| *count);
    let answered: u64 = statuses.iter().map(|(_, count)| count).sum();
    let mut failures = BTreeMap::new();
    let other_statuses = statuses.into_iter().filter(|(status, _)| status != "200");
    for (failure, count) in other_statuses.map(|(status, count)| (format!("HTTP {status}"), count)).chain(errors) {
        *failures.entry(failure).or_default() += count;
    }
    let seconds = report["summary"]["total"].as_f64().context("oha's report has no summary.total")?;
    let percentile = |name: &str| report["latencyPercentiles"][name].as_f64().filter(|_| answered > 0);
    Ok(Measurement {
        ok,
        failed: failures.values().sum(),
        failures,
        seconds,
        p50: percentile("p50"),
        p99: percentile("p99"),
        p999: percentile("p99.9"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_count_other_statuses_and_errors() {
        let report = r#"{"summary": {"total": 2.0},
            "latencyPercentiles": {"p50": 0.001, "p99": 0.002, "p99.9": 0.003},
            "statusCodeDistribution": {"200": 90, "401": 6},
            "errorDistribution": {"connection closed": 4}}"#;
        let m = parse(report).unwrap();
        assert_eq!((m.ok, m.failed, m.total()), (90, 10, 100));
        let failures: Vec<(&str, u64)> = m.failures.iter().map(|(what, n)| (what.as_str(), *n)).collect();
        assert_eq!(failures, [("HTTP 401", 6), ("connection closed", 4)]);
        assert_eq!(m.ok_per_second(), 45.0);
        assert_eq!((m.p50, m.p99, m.p999), (Some(0.001), Some(0.002), Some(0.003)));
    }

    #[test]
    fn a_run_with_no_response_has_no_latency() {
        let report = r#"{"summary": {"total": 1.0}, "latencyPercentiles": {"p50": null},
            "statusCodeDistribution": {}, "errorDistribution": {"connection refused": 7}}"#;
        let m = parse(report).unwrap();
        assert_eq!((m.ok, m.failed, m.p50), (0, 7, None));
    }
}
