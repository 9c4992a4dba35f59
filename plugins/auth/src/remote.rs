//! `jwt.remote`: keys fetched from the identity provider, by `jwksUri` or by
//! OIDC discovery from `issuer`. The config is read by every build, so that
//! `auth` can refuse it by name; fetching needs the `remote` feature (the
//! auth-remote plugin, which imports outbound HTTP and shared state, and so
//! needs `spec.egress` and `spec.state` on its GatewayPlugin).

mod config;
#[cfg(feature = "remote")]
pub(crate) mod keys;

pub use config::RemoteConfig;
#[cfg(feature = "remote")]
pub use keys::RemoteKeys;
#[cfg(not(feature = "remote"))]
pub use unsupported::RemoteKeys;

/// Without the `remote` feature: a config with `jwt.remote` is refused,
/// naming the plugin that has it.
#[cfg(not(feature = "remote"))]
mod unsupported {
    use super::config::RemoteConfig;
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
