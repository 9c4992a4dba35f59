//! The Sluice data plane: serves the OpenAI API, runs each route's plugin
//! chain, and forwards to OpenAI-compatible upstreams. Configuration arrives
//! from a config source (`sluice-standalone`'s files, `sluice-controller`'s
//! feed) as [`sluice_core::ConfigUpdate`]s and is served from an immutable
//! [`Snapshot`] swapped atomically, so a request runs start to end on one
//! version. No Kubernetes type is compiled here.

mod admin;
mod backend_api;
mod balance;
mod body;
mod chain;
mod fallback;
mod forward;
#[doc(hidden)]
pub mod fuzzing;
mod gateway;
mod headers;
mod json;
mod mcp;
mod proxy;
mod request_body;
mod response;
mod server;
mod snapshot;
mod sse;
mod target;
mod upstream;

pub use admin::refresh_metrics;
pub use body::ResponseBuffers;
pub use gateway::{Gateway, Settings};
pub use mcp::session::{KeyError as McpKeyError, SessionKeys as McpSessionKeys};
pub use server::{serve_admin, serve_data_plane, serve_metrics, serve_probes};
pub use snapshot::{BuildReport, Snapshot};
