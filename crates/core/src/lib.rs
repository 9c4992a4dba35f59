//! The Sluice domain: what a gateway is asked to serve, independent of where
//! the ask came from (a directory of YAML, or the Kubernetes API) and of how
//! it is served (hyper, wasmtime).

pub mod config;
pub mod error;

pub use config::{
    ApiKeySource, BackendDecl, DesiredConfig, FailurePolicy, Isolation, PluginDecl, PluginSource, PullPolicy, ResourceError, ResourceKey,
    RouteDecl,
};
pub use error::{ApiError, ErrorType};
