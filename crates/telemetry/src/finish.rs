//! The end of a request: its record becomes metrics, an access log line
//! and spans, here and nowhere else.

use std::sync::LazyLock;
use std::time::Duration;

use crate::memo::Key;
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
        // Borrowed: they are cloned into labels only when this thread's
        // table misses.
        fn value(label: &Option<Label>) -> &Label {
            label.as_ref().unwrap_or(&EMPTY)
        }
        let (route, model, backend) = (value(&self.route), value(&self.model), value(&self.backend));
        let (status_class, error_code) = (metrics::status_class(self.status), self.error_code.unwrap_or(""));
        // Routed requests also get latency and tokens: they are the ones
        // with a model and a route to tell apart.
        let operation = self.operation.filter(|_| self.route.is_some());
        let response_model =
            operation.map(|_| self.response_model.as_deref().map_or_else(empty, |m2| m.response_model_label(m2)));
        let consumer =
            operation.and(self.tokens).map(|_| self.consumer.as_deref().map_or_else(empty, |c| m.consumer_label(c)));
        crate::memo::with(|handles| {
            let labels = || metrics::RequestLabels {
                route: route.clone(),
                model: model.clone(),
                backend: backend.clone(),
                status_class,
                error_code,
            };
            let key = Key::of([route, model, backend, status_class, error_code]);
            handles.requests.get(key, labels, &m.requests).inc();
            let (Some(operation), Some(response_model)) = (operation, response_model) else { return };
            let labels = || metrics::RouteLabels { route: route.clone(), model: model.clone() };
            let seconds = duration.as_secs_f64();
            handles.request_duration.get(Key::of([route, model]), labels, &m.request_duration).observe(seconds);
            let provider = self.provider;
            let gen_ai = || metrics::GenAiLabels {
                gen_ai_operation_name: operation,
                gen_ai_provider_name: provider,
                gen_ai_request_model: model.clone(),
                gen_ai_response_model: response_model.clone(),
            };
            let key = Key::of([operation, provider, model, &response_model]);
            handles.gen_ai_request_duration.get(key, gen_ai, &m.gen_ai_request_duration).observe(seconds);
            if let Some(first) = self.first_byte.filter(|_| (200..300).contains(&self.status)) {
                let histogram = handles.gen_ai_time_to_first_token.get(key, gen_ai, &m.gen_ai_time_to_first_token);
                histogram.observe(first.as_secs_f64());
            }
            let (Some(tokens), Some(consumer)) = (self.tokens, consumer) else { return };
            for (token_type, count) in [("input", tokens.input), ("output", tokens.output)] {
                let usage = || metrics::TokenUsageLabels {
                    gen_ai_operation_name: operation,
                    gen_ai_provider_name: provider,
                    gen_ai_request_model: model.clone(),
                    gen_ai_response_model: response_model.clone(),
                    gen_ai_token_type: token_type,
                };
                let key = Key::of([operation, provider, model, &response_model, token_type]);
                handles.gen_ai_token_usage.get(key, usage, &m.gen_ai_token_usage).observe(count as f64);
                let labels = || metrics::TokenLabels {
                    route: route.clone(),
                    model: model.clone(),
                    consumer: consumer.clone(),
                    token_type,
                };
                let key = Key::of([route, model, &consumer, token_type]);
                handles.tokens.get(key, labels, &m.tokens).inc_by(count);
            }
        });
    }
}
