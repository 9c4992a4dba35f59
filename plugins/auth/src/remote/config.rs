//! `jwt.remote`: where the keys come from and how long they are kept,
//! read by both builds (`auth` refuses it, `auth-remote` uses it).

use serde::Deserialize;

/// `jwt.remote`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub struct RemoteConfig {
    /// The JWKS's URL.
    pub(crate) jwks_uri: Option<String>,
    /// The issuer whose `/.well-known/openid-configuration` names the
    /// JWKS's URL. Also the accepted `iss` unless `jwt.issuer` says otherwise.
    pub(crate) issuer: Option<String>,
    /// Each outbound call's timeout (connecting, and each wait for bytes).
    #[serde(default = "default_timeout_ms")]
    pub(crate) timeout_ms: u32,
    /// The floor on how long a fetched set (or a discovered URL) is used
    /// before it is fetched again, whatever its `Cache-Control` says.
    #[serde(default = "default_min_cache_seconds")]
    pub(crate) min_cache_seconds: u64,
    /// The ceiling: how long a key the identity provider withdrew may still
    /// be trusted.
    #[serde(default = "default_max_cache_seconds")]
    pub(crate) max_cache_seconds: u64,
    /// At most one fetch per this many seconds, whatever asks for it (an
    /// unknown `kid`, an expired set, a failed fetch), across every instance
    /// and, with a Redis store, every replica.
    #[serde(default = "default_min_refresh_interval_seconds")]
    pub(crate) min_refresh_interval_seconds: u64,
    /// How long past its expiry a set is still used while fetching fails
    /// (with the inline keys); 0: not at all.
    #[serde(default = "default_stale_if_error_seconds")]
    pub(crate) stale_if_error_seconds: u64,
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
