//! Sluice's telemetry: Prometheus metrics, OpenTelemetry traces and the
//! logs. The data plane fills in one [`RequestRecord`] per request; when the
//! request ends, its metrics, access log line and spans are all made from
//! it, in one place.

mod access;
mod context;
mod export;
mod finish;
pub mod logging;
mod memo;
pub mod metrics;
pub mod otlp_metrics;
pub mod plugin_metrics;
pub mod record;
pub mod request_id;
#[cfg(test)]
mod stand_in;
pub mod trace;

pub use logging::LogFormat;
pub use metrics::{Label, metrics};
pub use record::{Attempt, Hook, OutboundSpan, Outcome, PluginId, RequestRecord, Tokens};
