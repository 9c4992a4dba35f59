//! A real Prometheus (Debian's `prometheus`) on a free loopback port with its
//! own storage, scraping `/metrics` of the given targets every second, for
//! tests of what the gateway exports.
//!
//! It scrapes itself too, as job `prometheus`; the targets are job `sluice`.
//! The first scrape comes about 6 s after the start: Prometheus hands
//! discovered targets to its scrapers every 5 s, the first batch included.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::http::{Client, empty};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const INSTALL_HINT: &str = "install it with `apt-get install -y prometheus` (or set SLUICE_PROMETHEUS)";
const LOG_TAIL_LINES: usize = 40;

/// One element of an instant vector: the series' labels (`__name__`
/// included) and its value.
pub type Sample = (BTreeMap<String, String>, f64);

/// A running Prometheus, killed when dropped.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: TempDir,
    client: Client,
}

impl Prometheus {
    /// The job name of the targets given to [`Prometheus::start`].
    pub const JOB: &str = "sluice";

    /// Starts Prometheus scraping `http://<target>/metrics` for each of
    /// `targets`, and returns once it is ready (`/-/ready`). Panics with its
    /// log if it does not start.
    pub async fn start(targets: &[SocketAddr]) -> Prometheus {
        let dir =
            tempfile::Builder::new().prefix("sluice-e2e-prometheus").tempdir().expect("creating a Prometheus dir");
        let binary =
            std::env::var_os("SLUICE_PROMETHEUS").map_or_else(|| PathBuf::from("/usr/bin/prometheus"), PathBuf::from);
        assert!(binary.is_file(), "{} is missing: {INSTALL_HINT}", binary.display());
        let client = Client::http1();
        let (child, addr) = crate::start_on_free_ports("Prometheus", async || {
            let addr = free_port();
            std::fs::write(dir.path().join("prometheus.yml"), config_yaml(addr, targets))
                .expect("writing prometheus.yml");
            let mut child = spawn(&binary, dir.path(), addr);
            match wait_ready(&mut child, &client, addr, dir.path()).await {
                Ok(()) => Ok((child, addr)),
                Err(log) => {
                    crate::kill(&mut child);
                    Err(log)
                }
            }
        })
        .await;
        Prometheus { child, addr, dir, client }
    }

    /// `127.0.0.1:<port>`: its HTTP API and its own /metrics.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Runs an instant query (`/api/v1/query`) now. Panics unless it
    /// succeeds with a vector, e.g. on a PromQL syntax error.
    pub async fn query(&self, promql: &str) -> Vec<Sample> {
        let reply = self.client.get(&self.url(&format!("/api/v1/query?query={}", encode(promql)))).await;
        parse_vector(promql, &reply.json())
    }

    /// Runs `promql` until it returns a non-empty vector, and returns that.
    /// Panics after `within` with the targets' health (and, as it drops,
    /// Prometheus shows the end of its log).
    pub async fn wait_for(&self, promql: &str, within: Duration) -> Vec<Sample> {
        let deadline = Instant::now() + within;
        loop {
            let samples = self.query(promql).await;
            if !samples.is_empty() {
                return samples;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out after {within:?} waiting for `{promql}` to return a sample (it returned none); \
                     targets: {}",
                    self.targets_health().await,
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `/api/v1/targets`: each target's scrape URL, health and last error.
    pub async fn targets(&self) -> Value {
        self.client.get(&self.url("/api/v1/targets")).await.json()
    }

    /// Prometheus' log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// One line per active target: `<job> <scrapeUrl> <health> <lastError>`.
    async fn targets_health(&self) -> String {
        let targets = self.targets().await;
        let active = targets["data"]["activeTargets"].as_array().cloned().unwrap_or_default();
        if active.is_empty() {
            return format!("none active yet ({targets})");
        }
        let lines: Vec<String> = active
            .iter()
            .map(|target| {
                format!(
                    "\n  {} {} {} {}",
                    target["labels"]["job"].as_str().unwrap_or("?"),
                    target["scrapeUrl"].as_str().unwrap_or("?"),
                    target["health"].as_str().unwrap_or("?"),
                    target["lastError"].as_str().unwrap_or(""),
                )
            })
            .collect();
        lines.concat()
    }

    fn log_tail(&self) -> String {
        log_tail(self.dir.path())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        crate::kill(&mut self.child);
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

/// Scrapes every second (the shortest interval that keeps its timeout
/// below it), itself as job `prometheus` and `targets` as job `sluice`.
fn config_yaml(addr: SocketAddr, targets: &[SocketAddr]) -> String {
    let targets: Vec<String> = targets.iter().map(|target| format!("'{target}'")).collect();
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n\
         \x20 - job_name: prometheus\n    static_configs:\n      - targets: ['{addr}']\n\
         \x20 - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
        targets.join(", "),
        job = Prometheus::JOB,
    )
}

fn spawn(binary: &Path, dir: &Path, addr: SocketAddr) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("prometheus.log"))
        .expect("opening the Prometheus log");
    Command::new(binary)
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={addr}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("cloning a log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}: {INSTALL_HINT}", binary.display()))
}

/// Polls `/-/ready` until it answers 200; on failure, the end of the log.
async fn wait_ready(child: &mut Child, client: &Client, addr: SocketAddr, dir: &Path) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let url = format!("http://{addr}/-/ready");
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("it exited ({status})\n{}", log_tail(dir)));
        }
        let request = hyper::Request::get(&url).body(empty()).expect("a valid GET request");
        if let Ok(reply) = client.try_send(request).await
            && reply.status == 200
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("not ready after {READY_TIMEOUT:?}\n{}", log_tail(dir)))
}

fn log_tail(dir: &Path) -> String {
    crate::log_tail(&dir.join("prometheus.log"), LOG_TAIL_LINES)
}

/// The samples of a `/api/v1/query` answer, which must be a vector.
fn parse_vector(promql: &str, answer: &Value) -> Vec<Sample> {
    assert_eq!(answer["status"], "success", "query `{promql}` failed: {answer}");
    assert_eq!(answer["data"]["resultType"], "vector", "query `{promql}` is not an instant vector: {answer}");
    let result = answer["data"]["result"].as_array().unwrap_or_else(|| panic!("no result for `{promql}`: {answer}"));
    result
        .iter()
        .map(|series| {
            let labels = series["metric"]
                .as_object()
                .unwrap_or_else(|| panic!("a series without labels: {series}"))
                .iter()
                .map(|(name, value)| (name.clone(), value.as_str().unwrap_or_default().to_string()))
                .collect();
            // [<unix time>, "<value>"]; the value may be "NaN" or "+Inf",
            // which f64's parser takes.
            let value = series["value"][1]
                .as_str()
                .and_then(|value| value.parse().ok())
                .unwrap_or_else(|| panic!("a sample without a value: {series}"));
            (labels, value)
        })
        .collect()
}

/// Percent-encodes a query parameter: everything but RFC 3986's unreserved
/// characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_answer_parses_into_labels_and_values() {
        let answer = serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"__name__": "up", "job": "sluice"}, "value": [1.5, "1"]},
            {"metric": {"__name__": "x"}, "value": [1.5, "+Inf"]},
        ]}});
        let samples = parse_vector("up", &answer);
        assert_eq!(samples[0].0["job"], "sluice");
        assert_eq!(samples[0].1, 1.0);
        assert_eq!(samples[1].1, f64::INFINITY);
    }

    #[test]
    fn promql_is_percent_encoded() {
        assert_eq!(encode(r#"up{job="a b"}"#), "up%7Bjob%3D%22a%20b%22%7D");
    }
}
