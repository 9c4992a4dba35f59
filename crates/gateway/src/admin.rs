//! The admin listener: liveness, readiness, and what is being served.

use http::StatusCode;
use hyper::body::Incoming;

use crate::body::{Body, error_response, full, json_response};
use crate::gateway::Gateway;

pub fn handle(gateway: &Gateway, request: http::Request<Incoming>) -> http::Response<Body> {
    match request.uri().path() {
        "/healthz" => http::Response::new(full("ok\n")),
        "/readyz" if gateway.is_ready() => http::Response::new(full("ready\n")),
        "/readyz" => {
            let mut response = http::Response::new(full("waiting for the first config\n"));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        }
        "/admin/config" => config(gateway),
        path => error_response(&sluice_core::ApiError::not_found(path)),
    }
}

fn config(gateway: &Gateway) -> http::Response<Body> {
    let snapshot = gateway.snapshot();
    let report = gateway.report.load();
    let mut view = serde_json::to_value(snapshot.view()).unwrap_or_default();
    let errors: Vec<_> = report.source_errors.iter().chain(&report.build.errors).collect();
    view["ready"] = gateway.is_ready().into();
    view["errors"] = serde_json::to_value(errors).unwrap_or_default();
    let body = serde_json::to_vec_pretty(&view).unwrap_or_default();
    json_response(StatusCode::OK, body)
}
