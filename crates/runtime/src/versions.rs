//! Which version of the plugin world a component was built for, and its
//! calls in the runtime's (0.3) types: a 0.2 component's are translated
//! here, and nowhere else.

use wasmtime::Store;
use wasmtime::component::{Component, Instance, InstancePre, Linker, Resource};

use crate::bindings::{
    ChunkAction, DirectResponse, Hooks, RequestAction, Response, ResponseAction, ResponseEdits, ResponseSummary, v2, v3,
};
use crate::host::PluginState;
use crate::request::PluginRequest;

use v2::sluice::plugin::types as old;

/// The interface version a component exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    V2,
    V3,
}

impl Version {
    /// 0.2 if the component exports 0.2's filter; otherwise 0.3, and
    /// linking says what is missing.
    pub fn of(component: &Component) -> Version {
        let engine = component.engine();
        let exports_v2 =
            component.component_type().exports(engine).any(|(name, _)| name == "sluice:plugin/filter@0.2.0");
        if exports_v2 { Version::V2 } else { Version::V3 }
    }
}

/// Adds the host side of both versions.
pub(crate) fn add_to_linker(linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    use wasmtime::component::HasSelf;
    v3::StatefulPlugin::add_to_linker::<_, HasSelf<_>>(linker, |state| state)?;
    v2::Plugin::add_to_linker::<_, HasSelf<_>>(linker, |state| state)?;
    crate::borrowed::add_to_linker(linker)
}

/// A component ready to instantiate, in its version, with where its
/// exports are (found once, not per instance).
#[derive(Clone)]
pub(crate) enum PluginPre {
    V2(InstancePre<PluginState>, v2::PluginIndices),
    V3(InstancePre<PluginState>, v3::StatefulPluginIndices),
}

impl PluginPre {
    pub fn new(linker: &Linker<PluginState>, component: &Component) -> wasmtime::Result<PluginPre> {
        let pre = linker.instantiate_pre(component)?;
        Ok(match Version::of(component) {
            Version::V2 => {
                let indices = v2::PluginIndices::new(&pre)?;
                PluginPre::V2(pre, indices)
            }
            Version::V3 => {
                let indices = v3::StatefulPluginIndices::new(&pre)?;
                PluginPre::V3(pre, indices)
            }
        })
    }

    pub async fn instantiate_async(&self, store: &mut Store<PluginState>) -> wasmtime::Result<Plugin> {
        Ok(self.instantiate_with_instance(store).await?.1)
    }

    /// A new instance, and its exports.
    pub async fn instantiate_with_instance(
        &self,
        store: &mut Store<PluginState>,
    ) -> wasmtime::Result<(Instance, Plugin)> {
        Ok(match self {
            PluginPre::V2(pre, indices) => {
                let instance = pre.instantiate_async(&mut *store).await?;
                (instance, Plugin::V2(indices.load(store, &instance)?))
            }
            PluginPre::V3(pre, indices) => {
                let instance = pre.instantiate_async(&mut *store).await?;
                (instance, Plugin::V3(indices.load(store, &instance)?))
            }
        })
    }

    pub fn engine(&self) -> &wasmtime::Engine {
        match self {
            PluginPre::V2(pre, _) | PluginPre::V3(pre, _) => pre.engine(),
        }
    }

    /// Whether the component imports an interface whose name starts with
    /// `prefix` (e.g. `sluice:plugin/state@`, any version).
    pub fn imports_interface(&self, prefix: &str) -> bool {
        let (PluginPre::V2(pre, _) | PluginPre::V3(pre, _)) = self;
        let component = pre.component();
        component.component_type().imports(component.engine()).any(|(name, _)| name.starts_with(prefix))
    }
}

/// An instance's exports, in its version.
pub(crate) enum Plugin {
    V2(v2::Plugin),
    V3(v3::StatefulPlugin),
}

impl Plugin {
    pub fn new(store: &mut Store<PluginState>, component: &Component, instance: &Instance) -> wasmtime::Result<Plugin> {
        Ok(match Version::of(component) {
            Version::V2 => Plugin::V2(v2::Plugin::new(store, instance)?),
            Version::V3 => Plugin::V3(v3::StatefulPlugin::new(store, instance)?),
        })
    }

    pub async fn configure(
        &self,
        store: &mut Store<PluginState>,
        config: &str,
    ) -> wasmtime::Result<Result<Hooks, String>> {
        Ok(match self {
            Plugin::V2(plugin) => plugin.sluice_plugin_filter().call_configure(store, config).await?.map(hooks_from),
            Plugin::V3(plugin) => plugin.sluice_plugin_filter().call_configure(store, config).await?,
        })
    }

    /// Runs the request hook on `request`, leaving the plugin's edits in it.
    /// Edits it could not apply are in `request.invalid`.
    pub async fn request_filter(
        &self,
        store: &mut Store<PluginState>,
        request: &mut PluginRequest,
    ) -> wasmtime::Result<RequestAction> {
        match self {
            Plugin::V3(plugin) => {
                // The guest borrows the request for this call only; it lives
                // in the store meanwhile and comes back either way.
                store.data_mut().serving = Some(std::mem::take(request));
                let borrowed = Resource::new_borrow(crate::host::SERVING);
                let action = plugin.sluice_plugin_filter().call_request_filter(&mut *store, borrowed).await;
                *request = store.data_mut().serving.take().unwrap_or_default();
                action
            }
            Plugin::V2(plugin) => {
                let view = old::Request {
                    method: request.method.clone(),
                    path: request.path.clone(),
                    headers: crate::headers::to_pairs(&request.headers),
                    body: request.body.bytes().to_vec(),
                    model: request.model.clone(),
                    route: request.route.clone(),
                };
                match plugin.sluice_plugin_filter().call_request_filter(store, &view).await? {
                    old::RequestAction::Continue(edits) => {
                        request.edit_headers(&edits.set_headers, &edits.remove_headers);
                        if let Some(body) = edits.body {
                            request.set_body(body);
                        }
                        Ok(RequestAction::Continue)
                    }
                    old::RequestAction::Respond(direct) => Ok(RequestAction::Respond(DirectResponse {
                        status: direct.status,
                        headers: direct.headers,
                        body: direct.body,
                    })),
                }
            }
        }
    }

    pub async fn response_filter(
        &self,
        store: &mut Store<PluginState>,
        response: &Response,
    ) -> wasmtime::Result<ResponseAction> {
        match self {
            Plugin::V3(plugin) => plugin.sluice_plugin_filter().call_response_filter(store, response).await,
            Plugin::V2(plugin) => {
                let view = old::Response { status: response.status, headers: response.headers.clone() };
                let old::ResponseAction::Continue(edits) =
                    plugin.sluice_plugin_filter().call_response_filter(store, &view).await?;
                Ok(ResponseAction::Continue(ResponseEdits {
                    set_headers: edits.set_headers,
                    remove_headers: edits.remove_headers,
                }))
            }
        }
    }

    pub async fn response_chunk(&self, store: &mut Store<PluginState>, data: &str) -> wasmtime::Result<ChunkAction> {
        match self {
            Plugin::V3(plugin) => plugin.sluice_plugin_filter().call_response_chunk(store, data).await,
            Plugin::V2(plugin) => Ok(match plugin.sluice_plugin_filter().call_response_chunk(store, data).await? {
                old::ChunkAction::Pass => ChunkAction::Pass,
                old::ChunkAction::Replace(data) => ChunkAction::Replace(data),
                old::ChunkAction::Drop => ChunkAction::Drop,
                old::ChunkAction::Stop(data) => ChunkAction::Stop(data),
            }),
        }
    }

    pub async fn response_body(
        &self,
        store: &mut Store<PluginState>,
        body: &[u8],
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        match self {
            Plugin::V3(plugin) => plugin.sluice_plugin_filter().call_response_body(store, body).await,
            Plugin::V2(plugin) => plugin.sluice_plugin_filter().call_response_body(store, body).await,
        }
    }

    pub async fn response_end(&self, store: &mut Store<PluginState>, summary: ResponseSummary) -> wasmtime::Result<()> {
        match self {
            Plugin::V3(plugin) => plugin.sluice_plugin_filter().call_response_end(store, summary).await,
            Plugin::V2(plugin) => {
                let usage = summary.usage.map(|u| old::Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    total_tokens: u.total_tokens,
                });
                let summary = old::ResponseSummary {
                    status: summary.status,
                    streamed: summary.streamed,
                    usage,
                    body_bytes: summary.body_bytes,
                    completed: summary.completed,
                    duration_ms: summary.duration_ms,
                };
                plugin.sluice_plugin_filter().call_response_end(store, summary).await
            }
        }
    }
}

fn hooks_from(old: old::Hooks) -> Hooks {
    let pairs = [
        (old::Hooks::REQUEST, Hooks::REQUEST),
        (old::Hooks::RESPONSE_HEAD, Hooks::RESPONSE_HEAD),
        (old::Hooks::RESPONSE_CHUNK, Hooks::RESPONSE_CHUNK),
        (old::Hooks::RESPONSE_BODY, Hooks::RESPONSE_BODY),
        (old::Hooks::RESPONSE_END, Hooks::RESPONSE_END),
    ];
    pairs
        .into_iter()
        .filter(|(old_hook, _)| old.contains(*old_hook))
        .fold(Hooks::empty(), |hooks, (_, hook)| hooks | hook)
}
