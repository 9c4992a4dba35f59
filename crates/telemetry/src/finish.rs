//! The end of a request: its record becomes metrics, an access log line
//! and spans, here and nowhere else.

use std::sync::LazyLock;
use std::time::Duration;

use crate::metrics::{self, Label, metrics};
use crate::record::RequestRecord;

/// The empty label value, shared rather than allocated per request.
static EMPTY: LazyLock<Label> = LazyLock::new(|| Label::from(""));

impl RequestRecord {
    /// Ends the request: the metrics, the access log line, the spans.
    pub fn finish(self) {
        if self.handed_off {
            return;
        }
        let duration = self.elapsed();
        self.count(duration);
        crate::access::log(&self, duration);
        crate::trace::export(&self, duration);
    }

    fn count(&self, duration: Duration) {
        let m = metrics();
        let empty = || EMPTY.clone();
        let (route, model) = (self.route.clone().unwrap_or_else(empty), self.model.clone().unwrap_or_else(empty));
        let labels = metrics::RequestLabels {
            route: route.clone(),
            model: model.clone(),
            backend: self.backend.clone().unwrap_or_else(empty),
            status_class: metrics::status_class(self.status),
            error_code: self.error_code.unwrap_or(""),
        };
        m.requests.get_or_create(&labels).inc();
        // Latency and tokens only for routed requests: they are the ones
        // with a model and a route to tell apart.
        let Some(operation) = self.operation.filter(|_| self.route.is_some()) else { return };
        m.request_duration
            .get_or_create(&metrics::RouteLabels { route: route.clone(), model: model.clone() })
            .observe(duration.as_secs_f64());
        let response_model = self.response_model.as_deref().map_or_else(empty, |m2| m.response_model_label(m2));
        let gen_ai = metrics::GenAiLabels {
            gen_ai_operation_name: operation,
            gen_ai_provider_name: self.provider,
            gen_ai_request_model: model.clone(),
            gen_ai_response_model: response_model.clone(),
        };
        m.gen_ai_request_duration.get_or_create(&gen_ai).observe(duration.as_secs_f64());
        if let Some(first) = self.first_byte.filter(|_| (200..300).contains(&self.status)) {
            m.gen_ai_time_to_first_token.get_or_create(&gen_ai).observe(first.as_secs_f64());
        }
        let Some(tokens) = self.tokens else { return };
        let consumer = self.consumer.as_deref().map_or_else(empty, |c| m.consumer_label(c));
        for (token_type, count) in [("input", tokens.input), ("output", tokens.output)] {
            let usage = metrics::TokenUsageLabels {
                gen_ai_operation_name: operation,
                gen_ai_provider_name: self.provider,
                gen_ai_request_model: model.clone(),
                gen_ai_response_model: response_model.clone(),
                gen_ai_token_type: token_type,
            };
            m.gen_ai_token_usage.get_or_create(&usage).observe(count as f64);
            let labels = metrics::TokenLabels {
                route: route.clone(),
                model: model.clone(),
                consumer: consumer.clone(),
                token_type,
            };
            m.tokens.get_or_create(&labels).inc_by(count);
        }
    }
}
