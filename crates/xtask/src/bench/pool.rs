//! `cargo xtask bench --pool FILE…`: the round-by-round table of results
//! files, pooled. The p99 at a fixed rate moves several fold between runs
//! on this VM, so one run's median says little; each round's ratio (against
//! `envoy-proxy-wasm`'s added p99 in the same round) can be pooled over
//! runs, and two systems compared round by round, where the host's drift
//! between rounds cancels.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use super::report::{ADDED_P99_AT, ROUNDS_TABLE_HEAD, median};
use super::systems::RATIO_BASE;

/// One system's added p99 at one rate in one round of one file.
#[derive(Debug, PartialEq)]
struct Cell {
    /// Which file and which round in it: cells of one round are paired.
    run: usize,
    round: u32,
    system: String,
    rate: u32,
    added_ms: f64,
    /// Against the base system's in the same round, where the file has it.
    ratio: Option<f64>,
}

pub fn main(files: &[PathBuf]) -> Result<()> {
    let mut cells = Vec::new();
    for (run, file) in files.iter().enumerate() {
        let text = fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
        let found = parse(&text, run);
        if found.is_empty() {
            bail!(
                "{} has no round-by-round table (a run of one round has none, nor do runs from before 2026-12-04 21:28)",
                file.display()
            );
        }
        cells.extend(found);
    }
    print!("{}", render(&cells, files.len()));
    Ok(())
}

/// The cells of a results file's round-by-round table.
fn parse(text: &str, run: usize) -> Vec<Cell> {
    let mut lines = text.lines().skip_while(|line| !line.starts_with(ROUNDS_TABLE_HEAD));
    let Some(header) = lines.next() else { return Vec::new() };
    // "| system | round | added p99 at 500/s | … | CPU per request (µs) |"
    let rates: Vec<Option<u32>> = header
        .split('|')
        .skip(3)
        .map(|title| title.trim().strip_prefix(ADDED_P99_AT)?.strip_suffix("/s")?.parse().ok())
        .collect();
    let mut cells = Vec::new();
    for line in lines.skip(1).take_while(|line| line.starts_with('|')) {
        let columns: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(system), Some(Ok(round))) = (columns.get(1), columns.get(2).map(|c| c.parse::<u32>())) else {
            continue;
        };
        for (rate, cell) in rates.iter().zip(&columns[3..]) {
            // "+0.328 (0.52)", "+0.328" without a base, "—" without direct.
            let (Some(rate), Some(added)) = (rate, cell.split(' ').next().and_then(|ms| ms.parse::<f64>().ok())) else {
                continue;
            };
            let ratio = cell.split_once('(').and_then(|(_, rest)| rest.strip_suffix(')')?.parse().ok());
            cells.push(Cell { run, round, system: system.to_string(), rate: *rate, added_ms: added, ratio });
        }
    }
    cells
}

fn render(cells: &[Cell], files: usize) -> String {
    let mut systems: Vec<&str> = Vec::new();
    for cell in cells {
        if !systems.contains(&cell.system.as_str()) {
            systems.push(&cell.system);
        }
    }
    let mut rates: Vec<u32> = cells.iter().map(|cell| cell.rate).collect();
    rates.sort_unstable();
    rates.dedup();
    let mut out = format!(
        "Pooled over {files} file(s): each system's added p99 per round, and its ratio to `{RATIO_BASE}`'s in \
         the same round.\n\n| system | rate | rounds | added p99 (ms), median | × `{RATIO_BASE}`, median | rounds at \
         or under 0.5× |\n|---|---:|---:|---:|---:|---:|\n"
    );
    for system in &systems {
        for &rate in &rates {
            let own: Vec<&Cell> = cells.iter().filter(|c| c.system == *system && c.rate == rate).collect();
            let Some(added) = median(own.iter().map(|c| Some(c.added_ms))) else { continue };
            let ratios: Vec<f64> = own.iter().filter_map(|c| c.ratio).collect();
            let ratio = median(ratios.iter().map(|r| Some(*r))).map_or("—".into(), |r| format!("{r:.2}"));
            let under = ratios.iter().filter(|r| **r <= 0.5).count();
            let _ = writeln!(
                out,
                "| {system} | {rate}/s | {} | {added:+.3} | {ratio} | {under} of {} |",
                own.len(),
                ratios.len()
            );
        }
    }
    out.push_str(
        "\nPaired round by round: one system's added p99 minus another's in the same round.\n\n| system | minus | \
         rate | rounds | difference (ms), median | rounds the first is over |\n|---|---|---:|---:|---:|---:|\n",
    );
    let by_round: BTreeMap<(usize, u32, &str, u32), f64> =
        cells.iter().map(|c| ((c.run, c.round, c.system.as_str(), c.rate), c.added_ms)).collect();
    for (i, first) in systems.iter().enumerate() {
        for second in &systems[i + 1..] {
            for &rate in &rates {
                let differences: Vec<f64> = by_round
                    .iter()
                    .filter(|((_, _, system, r), _)| system == first && *r == rate)
                    .filter_map(|(&(run, round, _, _), own)| Some(own - by_round.get(&(run, round, *second, rate))?))
                    .collect();
                let Some(difference) = median(differences.iter().map(|d| Some(*d))) else { continue };
                let (rounds, over) = (differences.len(), differences.iter().filter(|d| **d > 0.0).count());
                let _ = writeln!(
                    out,
                    "| {first} | {second} | {rate}/s | {rounds} | {difference:+.3} | {over} of {rounds} |"
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN_A: &str = "# Sluice side by side\n\nRound by round, the added p99 …:\n\n\
        | system | round | added p99 at 500/s | added p99 at 2000/s | CPU per request (µs) |\n\
        |---|---:|---:|---:|---:|\n\
        | sluice-plain | 1 | +0.300 (0.60) | +0.100 (0.20) | 24.0 |\n\
        | sluice-plain | 2 | +0.200 (0.40) | — | 25.0 |\n\
        | envoy-proxy-wasm | 1 | +0.500 (1.00) | +0.500 (1.00) | 90.0 |\n\
        | envoy-proxy-wasm | 2 | +0.500 (1.00) | +0.400 (1.00) | 91.0 |\n\
        \nThe end.\n";
    const RUN_B: &str = "| system | round | added p99 at 500/s | CPU per request (µs) |\n|---|---:|---:|---:|\n\
        | sluice-plain | 1 | +0.100 (0.25) | 24.0 |\n\
        | envoy-proxy-wasm | 1 | +0.400 (1.00) | 90.0 |\n";

    #[test]
    fn a_results_files_rounds_are_read_with_their_rates() {
        let cells = parse(RUN_A, 0);
        assert_eq!(cells.len(), 7, "{cells:?}");
        assert_eq!(
            cells[0],
            Cell { run: 0, round: 1, system: "sluice-plain".into(), rate: 500, added_ms: 0.3, ratio: Some(0.6) }
        );
        // The missing cell is skipped, not read as zero.
        assert!(!cells.iter().any(|c| c.system == "sluice-plain" && c.round == 2 && c.rate == 2000));
        assert!(parse("# a one-round run\n\n| system | failed / sent |\n", 0).is_empty());
    }

    #[test]
    fn runs_are_pooled_and_systems_paired_within_rounds() {
        let cells: Vec<Cell> = parse(RUN_A, 0).into_iter().chain(parse(RUN_B, 1)).collect();
        let table = render(&cells, 2);
        // 500/s: ratios 0.60, 0.40, 0.25 over three rounds of two files.
        assert!(table.contains("| sluice-plain | 500/s | 3 | +0.200 | 0.40 | 2 of 3 |"), "{table}");
        assert!(table.contains("| sluice-plain | 2000/s | 1 | +0.100 | 0.20 | 1 of 1 |"), "{table}");
        // Paired: -0.2, -0.3 and -0.3 ms; round 1 of each file is its own pair.
        assert!(table.contains("| sluice-plain | envoy-proxy-wasm | 500/s | 3 | -0.300 | 0 of 3 |"), "{table}");
        assert!(table.contains("| sluice-plain | envoy-proxy-wasm | 2000/s | 1 | -0.400 | 0 of 1 |"), "{table}");
    }
}
