//! `sluice:plugin/metrics`: the counters and histograms a plugin declares
//! from `configure`, kept and exported by `sluice_telemetry::plugin_metrics`
//! under the plugin's namespace and name.

use sluice_telemetry::plugin_metrics::{self, Declaration, Kind};

use crate::bindings::v3::sluice::plugin::metrics as wit;
use crate::host::PluginState;

impl wit::Host for PluginState {
    fn declare(&mut self, metrics: Vec<wit::Metric>) -> wasmtime::Result<Result<(), String>> {
        if !self.configuring {
            return Ok(Err("metrics are declared from configure".into()));
        }
        if std::mem::replace(&mut self.metrics_declared, true) {
            return Ok(Err("metrics are declared once".into()));
        }
        let declarations: Vec<Declaration> = metrics.into_iter().map(declaration).collect();
        if let Err(why) = plugin_metrics::check(&declarations) {
            return Ok(Err(why));
        }
        if let Some(declared) = self.metrics.get() {
            // Another instance of this version configured alike: the same
            // config declares the same, unless `configure` is not
            // deterministic.
            return Ok(match declared.declarations().eq(declarations.iter()) {
                true => Ok(()),
                false => Err("metrics declared differently than by this version's first instance".into()),
            });
        }
        let (namespace, name) = self.plugin.split_once('/').unwrap_or(("", &self.plugin));
        let _ = self.metrics.set(plugin_metrics::register(namespace, name, declarations));
        Ok(Ok(()))
    }

    fn add(&mut self, name: String, labels: Vec<String>, value: u64) -> wasmtime::Result<()> {
        if !self.metrics.get().is_some_and(|metrics| metrics.add(&name, &labels, value)) {
            tracing::debug!(plugin = &*self.plugin, metric = %name, "a value for a counter it did not declare so ignored");
        }
        Ok(())
    }

    fn observe(&mut self, name: String, labels: Vec<String>, value: f64) -> wasmtime::Result<()> {
        if !self.metrics.get().is_some_and(|metrics| metrics.observe(&name, &labels, value)) {
            tracing::debug!(plugin = &*self.plugin, metric = %name, "a value for a histogram it did not declare so ignored");
        }
        Ok(())
    }
}

fn declaration(metric: wit::Metric) -> Declaration {
    Declaration {
        name: metric.name,
        help: metric.help,
        kind: match metric.kind {
            wit::MetricKind::Counter => Kind::Counter,
            wit::MetricKind::Histogram => Kind::Histogram,
        },
        labels: metric.labels,
        max_values: metric.max_values,
        buckets: metric.buckets,
    }
}
