//! Metrics that plugins declare (`sluice:plugin/metrics`): counters and
//! histograms exported as `sluice_plugin_<name>`, with the labels
//! `namespace` and `plugin` before the ones the plugin declared.
//!
//! Every series is bounded by what the plugin declared: at most
//! [`MAX_METRICS`] metrics, [`MAX_LABELS`] labels each, and per label at
//! most its `max-values` distinct values (itself at most the gateway's cap),
//! past which a value counts as `other`. Plugins of every tenant share the
//! names, so one plugin's declaration never changes how another's is
//! exported: a name declared as a counter by some plugins and a histogram by
//! others is exported twice, the histograms' under `<name>_histogram`, and
//! each family's help is that of the first plugin in `namespace/plugin`
//! order, whatever order they loaded in.
//!
//! A plugin's metrics are registered by its namespace and name, and kept
//! while a version of it that declared them lives: a new version that
//! declares the same carries the counts on, one that declares otherwise
//! replaces them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

/// What a label value past its cap counts as: `metrics::OTHER`, which
/// this file cannot name without the two importing each other (a test
/// checks they agree).
const OTHER: &str = "other";

/// Metrics one plugin may declare.
pub const MAX_METRICS: usize = 16;
/// Labels one metric may have, besides `namespace` and `plugin`.
pub const MAX_LABELS: usize = 4;
/// The most distinct values a label may take, whatever a plugin declares.
pub const MAX_VALUES: u32 = 64;
/// A histogram's bucket bounds, at most.
pub const MAX_BUCKETS: usize = 16;
/// The longest label value kept; a longer one counts as `other`.
const MAX_VALUE_BYTES: usize = 128;
const MAX_NAME_BYTES: usize = 64;
const MAX_HELP_BYTES: usize = 256;

/// The default buckets of a histogram that declares none: durations, in
/// seconds.
const DEFAULT_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Counter,
    Histogram,
}

/// One metric as a plugin declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct Declaration {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub labels: Vec<String>,
    pub max_values: u32,
    pub buckets: Vec<f64>,
}

/// Checks a plugin's declarations, with the gateway's cap on label values;
/// the reason names the metric.
pub fn check(declarations: &[Declaration]) -> Result<(), String> {
    if declarations.len() > MAX_METRICS {
        return Err(format!("{} metrics declared; at most {MAX_METRICS}", declarations.len()));
    }
    let mut names = HashSet::new();
    for d in declarations {
        let what = format!("metric `{}`", d.name.chars().take(MAX_NAME_BYTES).collect::<String>());
        if !is_name(&d.name) {
            return Err(format!("{what}: a name is [a-z][a-z0-9_]*, at most {MAX_NAME_BYTES} bytes"));
        }
        if !names.insert(d.name.as_str()) {
            return Err(format!("{what} is declared twice"));
        }
        if d.help.len() > MAX_HELP_BYTES || d.help.contains(['\n', '\r']) {
            return Err(format!("{what}: its help is one line of at most {MAX_HELP_BYTES} bytes"));
        }
        if d.labels.len() > MAX_LABELS {
            return Err(format!("{what}: at most {MAX_LABELS} labels"));
        }
        let mut labels = HashSet::new();
        for label in &d.labels {
            if !is_name(label) || label == "namespace" || label == "plugin" || label == "le" {
                return Err(format!(
                    "{what}: label `{label}` is not [a-z][a-z0-9_]*, or is one the gateway sets (namespace, plugin, le)"
                ));
            }
            if !labels.insert(label) {
                return Err(format!("{what}: label `{label}` is declared twice"));
            }
        }
        if d.max_values == 0 || d.max_values > MAX_VALUES {
            return Err(format!("{what}: max-values is 1 to {MAX_VALUES}"));
        }
        if d.kind == Kind::Counter && !d.buckets.is_empty() {
            return Err(format!("{what}: a counter has no buckets"));
        }
        let ascending = d.buckets.windows(2).all(|pair| pair[0] < pair[1]);
        if d.buckets.len() > MAX_BUCKETS || !ascending || d.buckets.iter().any(|b| !b.is_finite()) {
            return Err(format!("{what}: buckets are at most {MAX_BUCKETS} finite bounds, ascending"));
        }
    }
    Ok(())
}

fn is_name(name: &str) -> bool {
    name.len() <= MAX_NAME_BYTES
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A plugin's declared metrics and their series.
#[derive(Debug)]
pub struct PluginMetrics {
    namespace: String,
    plugin: String,
    metrics: Vec<Metric>,
}

#[derive(Debug)]
struct Metric {
    declaration: Declaration,
    /// Per label, the values seen so far (at most `max_values`).
    seen: Mutex<Vec<HashSet<String>>>,
    series: Mutex<HashMap<Vec<String>, Series>>,
}

#[derive(Debug)]
enum Series {
    Counter(Counter),
    Histogram(Histogram),
}

impl PluginMetrics {
    /// Adds `value` to counter `name`; false if there is no such counter or
    /// the label values do not match its labels.
    pub fn add(&self, name: &str, labels: &[String], value: u64) -> bool {
        self.record(name, Kind::Counter, labels, |series| {
            if let Series::Counter(counter) = series {
                counter.inc_by(value);
            }
        })
    }

    /// Records `value` in histogram `name`, as [`PluginMetrics::add`] does.
    pub fn observe(&self, name: &str, labels: &[String], value: f64) -> bool {
        self.record(name, Kind::Histogram, labels, |series| {
            if let Series::Histogram(histogram) = series {
                histogram.observe(value);
            }
        })
    }

    fn record(&self, name: &str, kind: Kind, labels: &[String], apply: impl FnOnce(&Series)) -> bool {
        let Some(metric) = self.metrics.iter().find(|m| m.declaration.name == name && m.declaration.kind == kind)
        else {
            return false;
        };
        let declaration = &metric.declaration;
        if labels.len() != declaration.labels.len() {
            return false;
        }
        let values: Vec<String> = {
            let mut seen = metric.seen.lock();
            labels
                .iter()
                .zip(seen.iter_mut())
                .map(|(value, seen)| {
                    if value.len() > MAX_VALUE_BYTES {
                        return OTHER.to_string();
                    }
                    if seen.contains(value.as_str()) {
                        return value.clone();
                    }
                    if seen.len() < declaration.max_values as usize {
                        seen.insert(value.clone());
                        return value.clone();
                    }
                    OTHER.to_string()
                })
                .collect()
        };
        let mut series = metric.series.lock();
        let series = series.entry(values).or_insert_with(|| match kind {
            Kind::Counter => Series::Counter(Counter::default()),
            Kind::Histogram => {
                let buckets = match declaration.buckets.is_empty() {
                    true => DEFAULT_BUCKETS.to_vec(),
                    false => declaration.buckets.clone(),
                };
                Series::Histogram(Histogram::new(buckets))
            }
        });
        apply(series);
        true
    }

    pub fn declarations(&self) -> impl Iterator<Item = &Declaration> {
        self.metrics.iter().map(|m| &m.declaration)
    }
}

/// The plugins' metrics the gateway exports, by `(namespace, plugin)`.
type Registered = BTreeMap<(String, String), Weak<PluginMetrics>>;

static REGISTERED: LazyLock<Mutex<Registered>> = LazyLock::new(Mutex::default);

/// The metrics of plugin `namespace/plugin` as `declarations` describe
/// them (checked with [`check`]): the ones registered already if they were
/// declared alike, so counts carry on across versions; else new ones,
/// which the gateway exports from now on.
pub fn register(namespace: &str, plugin: &str, declarations: Vec<Declaration>) -> Arc<PluginMetrics> {
    let key = (namespace.to_string(), plugin.to_string());
    let mut registered = REGISTERED.lock();
    registered.retain(|_, metrics| metrics.strong_count() > 0);
    if let Some(existing) = registered.get(&key).and_then(Weak::upgrade)
        && existing.declarations().eq(declarations.iter())
    {
        return existing;
    }
    let metrics = declarations
        .into_iter()
        .map(|declaration| Metric {
            seen: Mutex::new(vec![HashSet::new(); declaration.labels.len()]),
            series: Mutex::default(),
            declaration,
        })
        .collect();
    let registered_metrics = Arc::new(PluginMetrics { namespace: key.0.clone(), plugin: key.1.clone(), metrics });
    registered.insert(key, Arc::downgrade(&registered_metrics));
    registered_metrics
}

/// Encodes every registered plugin's metrics: the collector the gateway's
/// registry holds.
#[derive(Debug)]
pub(crate) struct PluginCollector;

impl Collector for PluginCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let plugins: Vec<Arc<PluginMetrics>> = REGISTERED.lock().values().filter_map(Weak::upgrade).collect();
        // By exported name and kind, in `namespace/plugin` order (the map's).
        let mut families: BTreeMap<(String, Kind), Vec<(&PluginMetrics, &Metric)>> = BTreeMap::new();
        for plugin in &plugins {
            for metric in &plugin.metrics {
                let d = &metric.declaration;
                families.entry((d.name.clone(), d.kind)).or_default().push((plugin, metric));
            }
        }
        let both: HashSet<&str> = families
            .keys()
            .filter(|(name, kind)| *kind == Kind::Histogram && families.contains_key(&(name.clone(), Kind::Counter)))
            .map(|(name, _)| name.as_str())
            .collect();
        for ((name, kind), members) in &families {
            let exported = match both.contains(name.as_str()) && *kind == Kind::Histogram {
                true => format!("sluice_plugin_{name}_histogram"),
                false => format!("sluice_plugin_{name}"),
            };
            let help = &members[0].1.declaration.help;
            let metric_type = match kind {
                Kind::Counter => MetricType::Counter,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut family = encoder.encode_descriptor(&exported, help, None, metric_type)?;
            for (plugin, metric) in members {
                let series = metric.series.lock();
                for (values, series) in series.iter() {
                    let mut labels: Vec<(&str, &str)> =
                        vec![("namespace", plugin.namespace.as_str()), ("plugin", plugin.plugin.as_str())];
                    labels.extend(
                        metric.declaration.labels.iter().map(String::as_str).zip(values.iter().map(String::as_str)),
                    );
                    let encoder = family.encode_family(&labels)?;
                    match series {
                        Series::Counter(counter) => counter.encode(encoder)?,
                        Series::Histogram(histogram) => histogram.encode(encoder)?,
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
