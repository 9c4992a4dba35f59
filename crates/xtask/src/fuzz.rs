//! `cargo xtask fuzz`: runs the fuzz targets in crates/fuzz/tests/fuzz.rs
//! long, one after the other, and prints how many inputs each ran.
//!
//! The default engine is libFuzzer, coverage-guided, through cargo-bolero
//! (installed once per machine into the user's cache directory). It builds
//! on the stable toolchain without a sanitizer (safe Rust needs none), into
//! its own target directory. If cargo-bolero cannot be installed, or with
//! `--engine random`, the targets run as the tests they are, on random
//! inputs, for the same time.
//!
//! Each target's output goes to target/fuzz/logs/<target>.log; libFuzzer
//! keeps its corpus in target/fuzz/corpus/<target> across runs and writes
//! failing inputs to target/fuzz/crashes/<target>.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::toolchain::run_logged;
use crate::{cargo, display, output, step, target_dir};

/// The cargo-bolero release that drives the bolero in crates/fuzz.
const CARGO_BOLERO_VERSION: &str = "0.13.5";
const PACKAGE: &str = "sluice-fuzz";
/// The test target in crates/fuzz that holds the fuzz targets, and only them.
const TEST_TARGET: &str = "fuzz";

#[derive(clap::Args)]
pub struct Args {
    /// Seconds to run each target.
    #[arg(long, default_value_t = 60)]
    time: u64,
    /// `libfuzzer` (coverage-guided, the default) or `random`.
    #[arg(long, default_value = "libfuzzer")]
    engine: Engine,
    /// Targets to run (test names in crates/fuzz/tests/fuzz.rs); all if none.
    targets: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Engine {
    Libfuzzer,
    Random,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Libfuzzer => "libfuzzer",
            Engine::Random => "random",
        }
    }
}

/// How one target's run went.
struct Outcome {
    target: String,
    engine: Engine,
    seconds: f64,
    executions: Option<u64>,
    passed: bool,
    log: PathBuf,
}

pub fn main(args: Args) -> Result<()> {
    let all = targets()?;
    let targets = if args.targets.is_empty() { all.clone() } else { args.targets.clone() };
    if let Some(unknown) = targets.iter().find(|t| !all.contains(t)) {
        bail!("no fuzz target `{unknown}`; the targets are: {}", all.join(", "));
    }
    let engine = match args.engine {
        Engine::Libfuzzer => match ensure_cargo_bolero() {
            Ok(()) => Engine::Libfuzzer,
            Err(error) => {
                println!("cargo-bolero is not available ({error:#}); running the random engine instead");
                Engine::Random
            }
        },
        Engine::Random => Engine::Random,
    };
    let dir = target_dir().join("fuzz");
    fs::create_dir_all(dir.join("logs"))?;

    let mut outcomes = Vec::new();
    for target in &targets {
        step(&format!("Fuzzing {target} for {} s ({})", args.time, engine.name()));
        let log = dir.join("logs").join(format!("{target}.log"));
        let started = Instant::now();
        let passed = match engine {
            Engine::Libfuzzer => libfuzzer(target, args.time, &dir, &log)?,
            Engine::Random => random(target, args.time, &log)?,
        };
        let text = fs::read_to_string(&log).unwrap_or_default();
        let executions = match engine {
            Engine::Libfuzzer => libfuzzer_executions(&text),
            Engine::Random => random_executions(&text),
        };
        if !passed {
            print_failure(&text, &log);
        }
        let seconds = started.elapsed().as_secs_f64();
        outcomes.push(Outcome { target: target.clone(), engine, seconds, executions, passed, log });
    }

    println!();
    // Wall-clock seconds: the first libFuzzer run includes its build.
    println!("{:<16} {:<10} {:>9} {:>12}  result", "target", "engine", "wall s", "executions");
    for o in &outcomes {
        let executions = o.executions.map_or_else(|| "?".to_string(), |n| n.to_string());
        let result = if o.passed { "ok".to_string() } else { format!("FAILED, see {}", o.log.display()) };
        println!("{:<16} {:<10} {:>9.0} {:>12}  {result}", o.target, o.engine.name(), o.seconds, executions);
    }
    let failed: Vec<&str> = outcomes.iter().filter(|o| !o.passed).map(|o| o.target.as_str()).collect();
    if !failed.is_empty() {
        bail!("fuzzing found failures in {}: the failing inputs are in the logs named above", failed.join(", "));
    }
    Ok(())
}

/// The fuzz targets: the tests of crates/fuzz/tests/fuzz.rs.
fn targets() -> Result<Vec<String>> {
    let list = output(cargo().args(["test", "--workspace", "--test", TEST_TARGET, "--", "--list"]))?;
    Ok(list.lines().filter_map(|line| line.strip_suffix(": test")).map(String::from).collect())
}

/// One target under libFuzzer; whether it found nothing.
fn libfuzzer(target: &str, seconds: u64, dir: &Path, log: &Path) -> Result<bool> {
    let mut cmd = Command::new(cargo_bolero_path()?);
    cmd.args(["test", "--engine", "libfuzzer", "--sanitizer", "NONE"])
        // The dev profile keeps debug assertions and overflow checks, which
        // turn more wrong states into failures; dependencies are optimised.
        .args(["--profile", "dev", "--package", PACKAGE])
        .arg("--target-dir")
        .arg(dir.join("libfuzzer"))
        .arg("--corpus-dir")
        .arg(dir.join("corpus").join(target))
        .arg("--crashes-dir")
        .arg(dir.join("crashes").join(target))
        .arg(format!("-T{seconds}s"))
        // Counts the executions even when a run ends on a crash.
        .arg("--engine-args=-print_final_stats=1")
        .arg(target);
    run_to_log(&mut cmd, log)
}

/// One target as a test on random inputs for `seconds`; whether it passed.
fn random(target: &str, seconds: u64, log: &Path) -> Result<bool> {
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--test", TEST_TARGET, target, "--", "--exact", "--nocapture"])
        .env("BOLERO_RANDOM_TEST_TIME_MS", (seconds * 1000).to_string())
        // bolero prints the failing input; a backtrace would bury it.
        .env("RUST_BACKTRACE", "0");
    run_to_log(&mut cmd, log)
}

/// Runs `cmd` with its output going to `log` (replaced); whether it succeeded.
fn run_to_log(cmd: &mut Command, log: &Path) -> Result<bool> {
    println!("$ {}  > {}", display(cmd), log.display());
    let file = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("cannot run `{}`", display(cmd)))?;
    Ok(status.success())
}

/// libFuzzer's count of inputs run: its final stats, or its `Done` line.
fn libfuzzer_executions(log: &str) -> Option<u64> {
    let stat = log.lines().rev().find_map(|line| line.strip_prefix("stat::number_of_executed_units:"));
    let done = || log.lines().rev().find_map(|line| line.strip_prefix("Done ")?.split_whitespace().next());
    stat.or_else(done)?.trim().parse().ok()
}

/// bolero's count of inputs run, from the line it prints as a test ends:
/// `test NAME ... run time: … | rng inputs: N | …`.
fn random_executions(log: &str) -> Option<u64> {
    let line = log.lines().rev().find(|line| line.contains("rng inputs:"))?;
    let counts = line.split(" | ").filter_map(|part| {
        let (_, n) = part.split_once("inputs: ")?;
        n.trim().parse::<u64>().ok()
    });
    Some(counts.sum())
}

/// The lines of a failure worth seeing at once: the panic and its message,
/// the seed that replays it, where libFuzzer wrote the input. The input
/// itself is in the log.
fn print_failure(text: &str, log: &Path) {
    let lines: Vec<&str> = text.lines().collect();
    println!("failure, from {}:", log.display());
    let marks = ["BOLERO_RANDOM_SEED=", "ERROR: libFuzzer", "Test unit written", "Base64:"];
    for (i, line) in lines.iter().enumerate() {
        if line.contains("panicked at") && !line.contains("bolero") {
            // The panic's message follows its location.
            lines.iter().skip(i).take(4).for_each(|line| println!("  {line}"));
        } else if marks.iter().any(|mark| line.contains(mark)) {
            println!("  {line}");
        }
    }
}

/// A per-version install of cargo-bolero in the user's cache directory,
/// shared by every checkout on the machine.
fn cargo_bolero_path() -> Result<PathBuf> {
    let cache = crate::toolchain::sluice_cache_dir()?;
    Ok(cache.join(format!("cargo-bolero-{CARGO_BOLERO_VERSION}")).join("bin/cargo-bolero"))
}

fn ensure_cargo_bolero() -> Result<()> {
    let path = cargo_bolero_path()?;
    let wanted = format!("cargo-bolero {CARGO_BOLERO_VERSION}");
    let installed = Command::new(&path).arg("--version").output();
    if installed.is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == wanted) {
        println!("{wanted}: installed at {}", path.display());
        return Ok(());
    }
    let root = path.parent().and_then(Path::parent).context("cargo-bolero path has no root")?;
    step(&format!("Installing {wanted} (once per machine; it takes a few minutes)"));
    let log = target_dir().join("fuzz").join("logs").join("cargo-bolero-install.log");
    fs::create_dir_all(log.parent().context("log path has no parent")?)?;
    // libFuzzer only: the AFL engine builds AFL from C sources.
    run_logged(
        cargo()
            .args(["install", "--locked", "--no-default-features", "--features", "libfuzzer", "--root"])
            .arg(root)
            .args(["--version", CARGO_BOLERO_VERSION, "cargo-bolero"]),
        &log,
    )
}
