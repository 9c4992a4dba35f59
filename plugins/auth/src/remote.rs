//! `jwt.remote`: keys fetched from the identity provider, by `jwksUri` or by
//! OIDC discovery from `issuer`. The config is read by every build, so that
//! `auth` can refuse it by name; fetching needs the `remote` feature (the
//! auth-remote plugin, which imports outbound HTTP and shared state, and so
//! needs `spec.egress` and `spec.state` on its GatewayPlugin).

use serde::Deserialize;

#[cfg(feature = "remote")]
pub(crate) mod keys;
#[cfg(feature = "remote")]
pub use keys::RemoteKeys;
#[cfg(not(feature = "remote"))]
pub use unsupported::RemoteKeys;

/// `jwt.remote`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub struct RemoteConfig {
    /// The JWKS's URL.
    jwks_uri: Option<String>,
    /// The issuer whose `/.well-known/openid-configuration` names the
    /// JWKS's URL. Also the accepted `iss` unless `jwt.issuer` says otherwise.
    issuer: Option<String>,
    /// Each outbound call's timeout (connecting, and each wait for bytes).
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u32,
    /// The floor on how long a fetched set (or a discovered URL) is used
    /// before it is fetched again, whatever its `Cache-Control` says.
    #[serde(default = "default_min_cache_seconds")]
    min_cache_seconds: u64,
    /// The ceiling: how long a key the identity provider withdrew may still
    /// be trusted.
    #[serde(default = "default_max_cache_seconds")]
    max_cache_seconds: u64,
    /// At most one fetch per this many seconds, whatever asks for it (an
    /// unknown `kid`, an expired set, a failed fetch), across every instance
    /// and, with a Redis store, every replica.
    #[serde(default = "default_min_refresh_interval_seconds")]
    min_refresh_interval_seconds: u64,
    /// How long past its expiry a set is still used while fetching fails
    /// (with the inline keys); 0: not at all.
    #[serde(default = "default_stale_if_error_seconds")]
    stale_if_error_seconds: u64,
}

fn default_timeout_ms() -> u32 {
    1000
}

fn default_min_cache_seconds() -> u64 {
    60
}

fn default_max_cache_seconds() -> u64 {
    3600
}

fn default_min_refresh_interval_seconds() -> u64 {
    30
}

fn default_stale_if_error_seconds() -> u64 {
    86_400
}

impl RemoteConfig {
    /// The issuer discovery starts from, if that is how keys are found.
    pub fn issuer(&self) -> Option<&str> {
        self.issuer.as_deref()
    }
}

/// Without the `remote` feature: a config with `jwt.remote` is refused,
/// naming the plugin that has it.
#[cfg(not(feature = "remote"))]
mod unsupported {
    use super::RemoteConfig;
    use crate::jwk::Key;

    pub enum RemoteKeys {}

    impl RemoteKeys {
        pub fn new(_: RemoteConfig) -> Result<RemoteKeys, String> {
            Err("jwt.remote (jwksUri, issuer): fetching keys from the identity provider needs the auth-remote \
                 plugin (plugins/dist/auth-remote.wasm), granted spec.egress and spec.state; this build \
                 verifies with the inline jwt.jwks only, and needs no grant"
                .into())
        }

        pub fn select(&self, _: Option<&str>) -> Selection {
            match *self {}
        }
    }

    #[allow(dead_code)]
    pub struct Selection;

    impl Selection {
        pub fn keys<'a>(&'a self, _: Option<&'a str>) -> std::iter::Empty<&'a Key> {
            std::iter::empty()
        }

        pub fn is_none(&self) -> bool {
            true
        }

        pub fn with_inline(&self) -> bool {
            true
        }
    }
}
