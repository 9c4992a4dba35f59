//! Counters and histograms (`sluice:plugin/metrics`, WIT 0.3.2), exported on
//! the gateway's `/metrics` (and over OTLP) as `sluice_plugin_<name>`, with
//! the label `plugin` and those declared. Declared once, from `configure`
//! (the plugin's `new`); recorded from any hook. Always granted.
//!
//! ```text
//! metrics::declare(&[
//!     Metric::counter("verdicts", "Requests by verdict").labels(&["verdict"]).max_values(4),
//!     Metric::histogram("lookup_seconds", "Time spent in the lookup"),
//! ])?;
//! metrics::add("verdicts", &["allow"], 1);
//! ```
//!
//! On `wasm32` these call the host. Natively (unit tests) a declaration is
//! checked as the gateway checks it, and values are kept per thread for
//! [`crate::testing::counter`] and [`crate::testing::observations`].

pub use crate::bindings::sluice::plugin::metrics::{Metric, MetricKind};

/// The distinct values a label takes unless [`Metric::max_values`] says
/// otherwise: each is a series the gateway keeps.
pub const DEFAULT_MAX_VALUES: u32 = 16;

impl Metric {
    /// A counter; without labels unless [`Metric::labels`] names some.
    pub fn counter(name: &str, help: &str) -> Metric {
        Metric::new(name, help, MetricKind::Counter)
    }

    /// A histogram, with the gateway's duration buckets (in seconds) unless
    /// [`Metric::buckets`] sets others.
    pub fn histogram(name: &str, help: &str) -> Metric {
        Metric::new(name, help, MetricKind::Histogram)
    }

    fn new(name: &str, help: &str, kind: MetricKind) -> Metric {
        Metric {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            labels: Vec::new(),
            max_values: DEFAULT_MAX_VALUES,
            buckets: Vec::new(),
        }
    }

    /// Label names (at most 4): every `add` or `observe` gives a value for
    /// each, in this order.
    pub fn labels(mut self, labels: &[&str]) -> Metric {
        self.labels = labels.iter().map(|l| l.to_string()).collect();
        self
    }

    /// The distinct values each label may take (at most 64; the gateway may
    /// cap it lower). A later new value is counted as `other`.
    pub fn max_values(mut self, max: u32) -> Metric {
        self.max_values = max;
        self
    }

    /// A histogram's bucket bounds, ascending (at most 16).
    pub fn buckets(mut self, bounds: &[f64]) -> Metric {
        self.buckets = bounds.to_vec();
        self
    }
}

/// Declares the plugin's metrics: once, from `new`. The error says what the
/// gateway refused (a second call, a bad name, too many metrics or labels);
/// returned from `new`, it rejects the config, so the plugin is not served.
pub fn declare(metrics: &[Metric]) -> Result<(), String> {
    imp::declare(metrics)
}

/// Adds `value` to counter `name`, with a value for each declared label, in
/// order. An undeclared name or a wrong number of values is ignored (the
/// gateway logs it once): metrics never fail a request.
pub fn add(name: &str, labels: &[&str], value: u64) {
    imp::add(name, labels, value)
}

/// Records `value` in histogram `name`, as [`add`] does.
pub fn observe(name: &str, labels: &[&str], value: f64) {
    imp::observe(name, labels, value)
}

/// What [`crate::testing::counter`] reads.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn counter(name: &str, labels: &[&str]) -> u64 {
    imp::counter(name, labels)
}

/// What [`crate::testing::observations`] reads.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn observations(name: &str, labels: &[&str]) -> Vec<f64> {
    imp::observations(name, labels)
}

/// What [`crate::testing::reset_metrics`] does.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn reset() {
    imp::reset()
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::Metric;
    use crate::bindings::sluice::plugin::metrics as host;

    pub fn declare(metrics: &[Metric]) -> Result<(), String> {
        host::declare(metrics)
    }

    pub fn add(name: &str, labels: &[&str], value: u64) {
        host::add(name, &owned(labels), value)
    }

    pub fn observe(name: &str, labels: &[&str], value: f64) {
        host::observe(name, &owned(labels), value)
    }

    fn owned(labels: &[&str]) -> Vec<String> {
        labels.iter().map(|l| l.to_string()).collect()
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::cell::RefCell;
    use std::collections::{HashMap, HashSet};

    use super::{Metric, MetricKind};
    use crate::LogLevel;

    /// The gateway's limits, from the WIT.
    const MAX_METRICS: usize = 16;
    const MAX_NAME: usize = 64;
    const MAX_HELP: usize = 256;
    const MAX_LABELS: usize = 4;
    const MAX_VALUES: u32 = 64;
    const MAX_BUCKETS: usize = 16;

    struct Series {
        metric: Metric,
        /// Each label's values so far, up to `max_values`.
        seen: Vec<Vec<String>>,
        counts: HashMap<Vec<String>, u64>,
        observations: HashMap<Vec<String>, Vec<f64>>,
    }

    impl Series {
        /// The label values as the gateway keeps them: past `max_values`
        /// distinct ones, a new value is `other`.
        fn key(&mut self, labels: &[&str]) -> Vec<String> {
            let max = self.metric.max_values as usize;
            let seen = self.seen.iter_mut();
            labels
                .iter()
                .zip(seen)
                .map(|(value, seen)| {
                    // As the gateway: a value over 128 bytes is `other`.
                    if value.len() > 128 {
                        return "other".to_string();
                    }
                    if !seen.iter().any(|v| v == value) {
                        if seen.len() >= max {
                            return "other".to_string();
                        }
                        seen.push(value.to_string());
                    }
                    value.to_string()
                })
                .collect()
        }
    }

    #[derive(Default)]
    struct Registry {
        declared: bool,
        series: Vec<Series>,
        /// Names already logged for a value ignored.
        logged: HashSet<String>,
    }

    impl Registry {
        /// The series `name` of `kind` for `labels`, or why the value is ignored.
        fn series(&mut self, name: &str, kind: MetricKind, labels: &[&str]) -> Option<&mut Series> {
            let found = self.series.iter().position(|s| s.metric.name == name && s.metric.kind == kind);
            let why = match found {
                None => "not declared, or of another kind",
                Some(i) if self.series[i].metric.labels.len() != labels.len() => "a value for each label is needed",
                Some(i) => return Some(&mut self.series[i]),
            };
            if self.logged.insert(name.to_string()) {
                crate::host::log(LogLevel::Warn, "metric value ignored", &[("metric", name), ("why", why)]);
            }
            None
        }
    }

    thread_local! {
        static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
    }

    /// `[a-z][a-z0-9_]*`.
    fn valid_name(name: &str) -> bool {
        name.starts_with(|c: char| c.is_ascii_lowercase())
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    }

    fn check(metrics: &[Metric]) -> Result<(), String> {
        if metrics.len() > MAX_METRICS {
            return Err(format!("{} metrics: at most {MAX_METRICS}", metrics.len()));
        }
        for (i, metric) in metrics.iter().enumerate() {
            let name = &metric.name;
            if !valid_name(name) || name.len() > MAX_NAME {
                return Err(format!("metric name `{name}`: [a-z][a-z0-9_]*, at most {MAX_NAME} bytes"));
            }
            if metrics[..i].iter().any(|m| m.name == *name) {
                return Err(format!("metric `{name}` is declared twice"));
            }
            if metric.help.len() > MAX_HELP || metric.help.contains(['\n', '\r']) {
                return Err(format!("metric `{name}`: help is one line of at most {MAX_HELP} bytes"));
            }
            if metric.labels.len() > MAX_LABELS {
                return Err(format!("metric `{name}`: {} labels, at most {MAX_LABELS}", metric.labels.len()));
            }
            for (j, label) in metric.labels.iter().enumerate() {
                if !valid_name(label) {
                    return Err(format!("metric `{name}`: label `{label}`: [a-z][a-z0-9_]*"));
                }
                if ["namespace", "plugin", "le"].contains(&label.as_str()) {
                    return Err(format!("metric `{name}`: the label `{label}` is the gateway's"));
                }
                if metric.labels[..j].contains(label) {
                    return Err(format!("metric `{name}`: label `{label}` is named twice"));
                }
            }
            if metric.max_values == 0 || metric.max_values > MAX_VALUES {
                return Err(format!("metric `{name}`: max-values {}, at most {MAX_VALUES}", metric.max_values));
            }
            if metric.kind == MetricKind::Counter && !metric.buckets.is_empty() {
                return Err(format!("metric `{name}`: a counter has no buckets"));
            }
            if metric.buckets.len() > MAX_BUCKETS {
                return Err(format!("metric `{name}`: {} buckets, at most {MAX_BUCKETS}", metric.buckets.len()));
            }
            if metric.buckets.iter().any(|b| !b.is_finite()) || metric.buckets.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("metric `{name}`: bucket bounds must be finite and ascending"));
            }
        }
        Ok(())
    }

    pub fn declare(metrics: &[Metric]) -> Result<(), String> {
        REGISTRY.with_borrow_mut(|registry| {
            // Whatever the outcome: the gateway takes one call.
            if std::mem::replace(&mut registry.declared, true) {
                return Err("metrics are declared once, from configure".into());
            }
            check(metrics)?;
            registry.series = metrics
                .iter()
                .map(|metric| Series {
                    metric: metric.clone(),
                    seen: vec![Vec::new(); metric.labels.len()],
                    counts: HashMap::new(),
                    observations: HashMap::new(),
                })
                .collect();
            Ok(())
        })
    }

    pub fn add(name: &str, labels: &[&str], value: u64) {
        REGISTRY.with_borrow_mut(|registry| {
            if let Some(series) = registry.series(name, MetricKind::Counter, labels) {
                let key = series.key(labels);
                let count = series.counts.entry(key).or_default();
                *count = count.saturating_add(value);
            }
        })
    }

    pub fn observe(name: &str, labels: &[&str], value: f64) {
        REGISTRY.with_borrow_mut(|registry| {
            if let Some(series) = registry.series(name, MetricKind::Histogram, labels) {
                let key = series.key(labels);
                series.observations.entry(key).or_default().push(value);
            }
        })
    }

    fn key(labels: &[&str]) -> Vec<String> {
        labels.iter().map(|l| l.to_string()).collect()
    }

    pub fn counter(name: &str, labels: &[&str]) -> u64 {
        REGISTRY.with_borrow(|registry| {
            let series = registry.series.iter().find(|s| s.metric.name == name);
            series.and_then(|s| s.counts.get(&key(labels)).copied()).unwrap_or(0)
        })
    }

    pub fn observations(name: &str, labels: &[&str]) -> Vec<f64> {
        REGISTRY.with_borrow(|registry| {
            let series = registry.series.iter().find(|s| s.metric.name == name);
            series.and_then(|s| s.observations.get(&key(labels)).cloned()).unwrap_or_default()
        })
    }

    pub fn reset() {
        REGISTRY.set(Registry::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{counter, observations, reset_metrics};

    fn refused(metrics: &[Metric]) -> String {
        reset_metrics();
        declare(metrics).expect_err("refused")
    }

    #[test]
    fn values_are_recorded_per_label_values_and_new_values_past_the_cap_are_other() {
        declare(&[
            Metric::counter("calls", "Calls by result").labels(&["result"]).max_values(2),
            Metric::histogram("call_seconds", "Call durations").buckets(&[0.1, 1.0]),
        ])
        .unwrap();
        add("calls", &["ok"], 1);
        add("calls", &["ok"], 2);
        add("calls", &["refused"], 1);
        add("calls", &["timeout"], 1);
        add("calls", &["failed"], 4);
        observe("call_seconds", &[], 0.25);
        observe("call_seconds", &[], 0.5);
        assert_eq!(counter("calls", &["ok"]), 3);
        assert_eq!(counter("calls", &["refused"]), 1);
        assert_eq!(counter("calls", &["timeout"]), 0);
        assert_eq!(counter("calls", &["other"]), 5);
        assert_eq!(observations("call_seconds", &[]), [0.25, 0.5]);
        // Ignored: undeclared, the wrong kind, the wrong number of values.
        add("nothing", &[], 1);
        add("call_seconds", &[], 1);
        observe("calls", &["ok"], 1.0);
        add("calls", &[], 1);
        add("calls", &["ok", "extra"], 1);
        assert_eq!(counter("calls", &["ok"]), 3);
        assert_eq!(counter("nothing", &[]), 0);
        assert_eq!(observations("calls", &["ok"]), [0.0; 0]);
    }

    #[test]
    fn a_second_declaration_is_refused() {
        declare(&[Metric::counter("a", "A")]).unwrap();
        assert_eq!(declare(&[Metric::counter("b", "B")]), Err("metrics are declared once, from configure".into()));
        add("a", &[], 1);
        assert_eq!(counter("a", &[]), 1, "the first declaration stands");
    }

    #[test]
    fn declarations_are_checked_as_the_gateway_checks_them() {
        let many: Vec<Metric> = (0..17).map(|i| Metric::counter(&format!("m{i}"), "")).collect();
        assert_eq!(refused(&many), "17 metrics: at most 16");
        for name in ["", "Calls", "9lives", "a-b", &"a".repeat(65)] {
            assert!(refused(&[Metric::counter(name, "")]).starts_with("metric name `"), "{name}");
        }
        let c = |name: &str| Metric::counter(name, "help");
        assert_eq!(refused(&[c("a"), c("a")]), "metric `a` is declared twice");
        let help = "metric `a`: help is one line of at most 256 bytes";
        assert_eq!(refused(&[Metric::counter("a", &"h".repeat(257))]), help);
        assert_eq!(refused(&[Metric::counter("a", "two\nlines")]), help);
        assert_eq!(refused(&[c("a").labels(&["b", "c", "d", "e", "f"])]), "metric `a`: 5 labels, at most 4");
        assert_eq!(refused(&[c("a").labels(&["Verdict"])]), "metric `a`: label `Verdict`: [a-z][a-z0-9_]*");
        assert_eq!(refused(&[c("a").labels(&["b", "b"])]), "metric `a`: label `b` is named twice");
        assert_eq!(refused(&[c("a").labels(&["plugin"])]), "metric `a`: the label `plugin` is the gateway's");
        assert_eq!(refused(&[c("a").max_values(65)]), "metric `a`: max-values 65, at most 64");
        let h = || Metric::histogram("h", "help");
        let buckets: Vec<f64> = (1..=17).map(f64::from).collect();
        assert_eq!(refused(&[h().buckets(&buckets)]), "metric `h`: 17 buckets, at most 16");
        let unordered = "metric `h`: bucket bounds must be finite and ascending";
        assert_eq!(refused(&[h().buckets(&[1.0, 1.0])]), unordered);
        assert_eq!(refused(&[h().buckets(&[1.0, f64::NAN])]), unordered);
        // At every limit, accepted.
        reset_metrics();
        let full = c(&"a".repeat(64)).labels(&["b", "c", "d", "e"]).max_values(64);
        assert_eq!(declare(&[full, Metric::histogram("h", &"h".repeat(256)).buckets(&buckets[..16])]), Ok(()));
    }
}
