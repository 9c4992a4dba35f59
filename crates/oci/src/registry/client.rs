//! The [`Registry`] handle: options, the cache, the transport and the
//! per-key locks that the pull, push and inspect sides share.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use oci_client::secrets::RegistryAuth;
use parking_lot::Mutex;

use super::transport::Transport;
use super::types::RegistryOptions;
use crate::auth::PullCredentials;
use crate::cache::Cache;
use crate::error::OciError;
use crate::reference::Reference;

/// A registry client for plugin components. Cheap to clone; clones share
/// connections, the cache and the in-flight pull deduplication.
#[derive(Clone)]
pub struct Registry {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) options: RegistryOptions,
    pub(super) transport: Transport,
    pub(super) cache: Cache,
    /// Per-key locks: pulls of the same reference, and downloads of the same
    /// blob, run one at a time, so concurrent callers share one download.
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl Registry {
    pub fn new(options: RegistryOptions) -> Result<Registry, OciError> {
        options.credentials.check()?;
        let transport = Transport::new(&options.ca_bundles, options.insecure_registries.clone())?;
        let cache = Cache::open(&options.cache_dir)?;
        Ok(Registry { inner: Arc::new(Inner { options, transport, cache, locks: Mutex::new(HashMap::new()) }) })
    }

    pub fn options(&self) -> &RegistryOptions {
        &self.inner.options
    }

    /// The push client for this reference's registry, with the configured
    /// credentials as they are now.
    pub(super) async fn client(&self, reference: &Reference) -> Result<(oci_client::Client, RegistryAuth), OciError> {
        let auth = self.inner.options.credentials.for_registry(reference.registry())?;
        self.inner.transport.client(reference, auth).await
    }

    /// What a pull of `reference` presents: its own credentials if it has
    /// any, the configured ones otherwise.
    pub(super) fn auth(
        &self,
        reference: &Reference,
        credentials: Option<&PullCredentials>,
    ) -> Result<RegistryAuth, OciError> {
        match credentials {
            Some(credentials) => credentials.for_registry(reference.registry()),
            None => self.inner.options.credentials.for_registry(reference.registry()),
        }
    }

    pub(super) async fn lock(&self, key: String) -> tokio::sync::OwnedMutexGuard<()> {
        let mutex = {
            let mut locks = self.inner.locks.lock();
            if locks.len() > 256 {
                locks.retain(|_, lock| lock.strong_count() > 0);
            }
            match locks.get(&key).and_then(Weak::upgrade) {
                Some(mutex) => mutex,
                None => {
                    let mutex = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(key, Arc::downgrade(&mutex));
                    mutex
                }
            }
        };
        mutex.lock_owned().await
    }
}
