//! The Sluice domain: what a gateway is asked to serve, independent of where
//! the ask came from (a directory of YAML, or the Kubernetes API) and of how
//! it is served (hyper, wasmtime).

pub mod account;
pub mod backends;
pub mod config;
pub mod error;
pub mod mcp;
pub mod reason;
pub mod redact;
pub mod report;
pub mod routing;

pub use account::Account;
pub use backends::{BackendPolicy, Cidr};
pub use config::{
    ApiKeySource, BackendDecl, ConfigUpdate, DesiredConfig, EgressDestination, EgressGrant, FailurePolicy, Isolation,
    McpAuthorization, McpLimits, McpRouteDecl, McpServerDecl, ModelConflict, Phase, PluginDecl, PluginSource,
    PullPolicy, RegistryCredentials, ResourceError, ResourceKey, RouteDecl, Secret, StateGrant, VerifyKeys,
};
pub use error::{ApiError, ErrorType};
pub use redact::Redactions;
pub use report::{LoadReport, LoadState};
pub use routing::{
    BackendTimeouts, BackendTls, Condition, Conditions, Fallback, OutlierPolicy, Pem, Provider, RetryPolicy,
};
