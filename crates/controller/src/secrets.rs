//! The Secrets that resources refer to, and only those.
//!
//! Secrets are watched by metadata alone: a name and a resourceVersion per
//! Secret, never its data, however many Secrets (Helm releases, other
//! applications' certificates) share the watched scope. The data of a Secret
//! is fetched while a GatewayPlugin, AIModelRoute or MCPRoute in its
//! namespace names it, again when its resourceVersion moves, and forgotten
//! when nothing names it any more. So the memory held is bounded by what the
//! resources reference, which their authors control only in their own
//! namespaces.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use parking_lot::RwLock;

use crate::translate;

/// Fetches at once, at most.
const FETCH_CONCURRENCY: usize = 16;

type Key = (String, String);

pub struct ReferencedSecrets {
    client: Client,
    /// Every Secret in scope, by metadata.
    metadata: Store<PartialObjectMeta<Secret>>,
    /// The data of the referenced ones, with the resourceVersion fetched.
    data: RwLock<HashMap<Key, (String, Arc<Secret>)>>,
    version: AtomicU64,
}

impl ReferencedSecrets {
    pub fn new(client: Client, metadata: Store<PartialObjectMeta<Secret>>) -> ReferencedSecrets {
        ReferencedSecrets { client, metadata, data: RwLock::default(), version: AtomicU64::new(0) }
    }

    /// Resolves once the metadata watch has listed.
    pub async fn wait_until_ready(&self) {
        let _ = self.metadata.wait_until_ready().await;
    }

    /// Makes sure the data of `wanted` is current (fetching what is new or
    /// changed), and, when `prune`, forgets every Secret not in it. Whether
    /// every fetch succeeded: a failed one keeps what was known before.
    pub async fn sync(&self, wanted: &HashSet<Key>, prune: bool) -> bool {
        if prune {
            // Forgetting changes nothing a translation can see: nothing names these.
            self.data.write().retain(|key, _| wanted.contains(key));
        }
        let stale: Vec<(Key, Option<String>)> = {
            let data = self.data.read();
            wanted
                .iter()
                .filter_map(|key| {
                    let meta = self.metadata.get(&ObjectRef::new(&key.1).within(&key.0));
                    let version = meta.and_then(|m| m.metadata.resource_version.clone());
                    let known = data.get(key).map(|(v, _)| v);
                    (version.as_ref() != known).then(|| (key.clone(), version))
                })
                .collect()
        };
        let fetches = futures_util::stream::iter(stale)
            .map(|(key, version)| async move {
                // Deleted: forget it without asking.
                let Some(version) = version else { return (key, Ok(None)) };
                let api: Api<Secret> = Api::namespaced(self.client.clone(), &key.0);
                let fetched = api.get_opt(&key.1).await.map(|secret| secret.map(|s| (version, slim(s))));
                (key, fetched)
            })
            .buffer_unordered(FETCH_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        let mut all_fetched = true;
        let mut data = self.data.write();
        let mut changed = false;
        for (key, fetched) in fetches {
            match fetched {
                Ok(Some((version, secret))) => {
                    data.insert(key, (version, Arc::new(secret)));
                    changed = true;
                }
                Ok(None) => changed |= data.remove(&key).is_some(),
                Err(error) => {
                    tracing::warn!(%error, namespace = %key.0, secret = %key.1, "fetching a referenced Secret");
                    all_fetched = false;
                }
            }
        }
        if changed {
            // Under the lock: a reader of the version then the data never
            // sees data older than the version says.
            self.version.fetch_add(1, Ordering::AcqRel);
        }
        all_fetched
    }

    /// As if a Secret's data had changed.
    #[cfg(test)]
    pub fn touch(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Moves on whenever the data held changes.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
}

/// What is kept of a Secret: its name, type and data.
pub fn slim(mut secret: Secret) -> Secret {
    secret.metadata.managed_fields = None;
    secret.metadata.annotations = None;
    secret.metadata.labels = None;
    secret
}

impl translate::Secrets for ReferencedSecrets {
    fn get(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        let data = self.data.read();
        data.get(&(namespace.to_string(), name.to_string())).map(|(_, secret)| secret.clone())
    }
}

/// The Secrets `names` in `namespace`, as keys.
pub fn keys<'a>(namespace: &str, names: impl Iterator<Item = &'a str>) -> impl Iterator<Item = Key> {
    names.map(move |name| (namespace.to_string(), name.to_string()))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    use super::*;

    /// The Secret cache keeps only what it uses of each Secret: not the
    /// annotations or managed fields, which after `kubectl apply` repeat the
    /// data.
    #[test]
    fn a_cached_secret_keeps_its_name_type_and_data_only() {
        let data = std::collections::BTreeMap::from([("key".to_string(), k8s_openapi::ByteString(b"v".to_vec()))]);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns".into()),
                annotations: Some(
                    [("kubectl.kubernetes.io/last-applied-configuration".to_string(), "x".repeat(1 << 20))].into(),
                ),
                labels: Some([("a".to_string(), "b".to_string())].into()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(data.clone()),
            ..Default::default()
        };
        let secret = slim(secret);
        assert_eq!((secret.metadata.name.as_deref(), secret.metadata.namespace.as_deref()), (Some("s"), Some("ns")));
        assert_eq!((secret.type_.as_deref(), secret.data.as_ref()), (Some("Opaque"), Some(&data)));
        assert!(secret.metadata.annotations.is_none() && secret.metadata.labels.is_none());
        assert!(secret.metadata.managed_fields.is_none());
    }
}
