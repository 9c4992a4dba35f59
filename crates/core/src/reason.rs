//! Condition reasons: the CamelCase words status conditions, load reports,
//! Events and the admin view use to say why. Spelled once, here, so the data
//! plane and the controller cannot drift apart.

// Accepted
pub const ACCEPTED: &str = "Accepted";
/// The spec is not valid (beyond what the CRD schema and CEL catch).
pub const INVALID: &str = "Invalid";
/// The spec names something this gateway refuses to read for it (a host file
/// or environment variable in Kubernetes mode).
pub const NOT_PERMITTED: &str = "NotPermitted";
pub const MODEL_CONFLICT: &str = "ModelConflict";
/// Another MCPRoute serves the path already.
pub const PATH_CONFLICT: &str = "PathConflict";
/// The route's namespace may not claim one of its models: the gateway's
/// operator grants models to namespaces.
pub const MODEL_NOT_PERMITTED: &str = "ModelNotPermitted";
/// The MCPRoute's namespace may not claim its path: the gateway's operator
/// grants MCP paths to namespaces.
pub const PATH_NOT_PERMITTED: &str = "PathNotPermitted";

// ResolvedRefs
pub const RESOLVED_REFS: &str = "ResolvedRefs";
pub const NOT_CHECKED: &str = "NotChecked";
pub const PLUGIN_NOT_FOUND: &str = "PluginNotFound";
pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
pub const SECRET_KEY_NOT_FOUND: &str = "SecretKeyNotFound";
pub const INVALID_SECRET_VALUE: &str = "InvalidSecretValue";
pub const UNSUPPORTED_SECRET_TYPE: &str = "UnsupportedSecretType";

// Ready
pub const LOADED: &str = "Loaded";
pub const PROGRESSING: &str = "Progressing";
pub const PENDING: &str = "Pending";
pub const NO_REPLICAS: &str = "NoReplicas";
pub const LOAD_FAILED: &str = "LoadFailed";
pub const PULL_FAILED: &str = "PullFailed";
pub const DIGEST_MISMATCH: &str = "DigestMismatch";
/// The plugin must be signed (`spec.verify`) and its manifest has no cosign
/// signature.
pub const SIGNATURE_MISSING: &str = "SignatureMissing";
/// The plugin must be signed and no signature verifies its manifest digest
/// under the listed keys (another key, another digest, unreadable).
pub const SIGNATURE_INVALID: &str = "SignatureInvalid";
pub const INVALID_REFERENCE: &str = "InvalidReference";
pub const CHAIN_NOT_READY: &str = "ChainNotReady";

// Events
pub const SWAPPED: &str = "Swapped";
