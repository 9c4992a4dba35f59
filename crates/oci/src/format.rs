//! Which artifact layouts hold a plugin, and how to get the module out.

use std::cell::Cell;
use std::fmt;
use std::io::{self, Read};

use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageIndex, OciImageManifest};
use serde::{Deserialize, Serialize};

use crate::error::OciError;
use crate::media_types as mt;

/// Room for tar headers and the files next to `plugin.wasm`, beyond the
/// module limit: what an image layer may hold, compressed or unpacked.
pub(crate) const TAR_OVERHEAD_BYTES: u64 = 1024 * 1024;

/// The largest PAX header or GNU long name or link read from an image
/// layer: Go's archive/tar (`maxSpecialFileSize`), which docker and
/// containerd unpack layers with, reads no more.
pub(crate) const MAX_TAR_METADATA_BYTES: u64 = 1024 * 1024;

/// The layout a module was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// CNCF Wasm OCI artifact: one `application/wasm` layer.
    CncfWasm,
    /// Istio / Envoy Gateway: one `application/vnd.module.wasm.content.layer.v1+wasm` layer.
    IstioWasm,
    /// A container image whose single tar (or tar+gzip) layer holds `plugin.wasm`.
    ImageTar,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::CncfWasm => "cncf-wasm",
            Format::IstioWasm => "istio-wasm",
            Format::ImageTar => "image-tar",
        })
    }
}

/// The media types of a manifest's config and layers, for error messages.
pub(crate) fn media_types(manifest: &OciImageManifest) -> Vec<String> {
    std::iter::once(&manifest.config).chain(&manifest.layers).map(|d| d.media_type.clone()).collect()
}

/// Finds the layout and the one layer holding the module.
pub(crate) fn detect(manifest: &OciImageManifest) -> Result<(Format, &OciDescriptor), OciError> {
    let unsupported = |reason: String| OciError::UnsupportedFormat { media_types: media_types(manifest), reason };
    let [layer] = manifest.layers.as_slice() else {
        return Err(unsupported(format!(
            "a plugin artifact has exactly one layer, this one has {}",
            manifest.layers.len()
        )));
    };
    let format = match layer.media_type.as_str() {
        mt::WASM_LAYER => Format::CncfWasm,
        mt::ISTIO_WASM_LAYER => Format::IstioWasm,
        mt::OCI_LAYER_TAR | mt::OCI_LAYER_TAR_GZIP | mt::DOCKER_LAYER_TAR | mt::DOCKER_LAYER_TAR_GZIP => {
            Format::ImageTar
        }
        other => {
            return Err(unsupported(format!(
                "layer type {other} is not {}, {} or an image tar layer holding plugin.wasm",
                mt::WASM_LAYER,
                mt::ISTIO_WASM_LAYER
            )));
        }
    };
    Ok((format, layer))
}

/// Picks the Wasm entry of an image index: the only one, or the one whose
/// platform is wasm/wasi.
pub(crate) fn choose_index_entry(index: &OciImageIndex) -> Result<&ImageIndexEntry, OciError> {
    if let [only] = index.manifests.as_slice() {
        return Ok(only);
    }
    let is_wasm = |entry: &&ImageIndexEntry| {
        entry.platform.as_ref().is_some_and(|p| {
            p.architecture.to_string() == "wasm" || matches!(p.os.to_string().as_str(), "wasi" | "wasip1" | "wasip2")
        })
    };
    index.manifests.iter().find(is_wasm).ok_or_else(|| OciError::UnsupportedFormat {
        media_types: index.manifests.iter().map(|e| e.media_type.clone()).collect(),
        reason: format!(
            "image index has {} entries and none for platform wasm/wasi (platforms: {})",
            index.manifests.len(),
            index
                .manifests
                .iter()
                .map(|e| e.platform.as_ref().map_or("none".into(), |p| format!("{}/{}", p.os, p.architecture)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// Takes `plugin.wasm` out of an image layer (tar, gzip-compressed or not),
/// reading at most `max` bytes of it, and at most `max` plus
/// [`TAR_OVERHEAD_BYTES`] of unpacked tar in all (a gzip bomb stops there).
///
/// The tar is read entry by entry as stored (`raw`): the `tar` crate would
/// otherwise read a PAX header or GNU long name of any size into memory, so
/// those are read here, each refused over [`MAX_TAR_METADATA_BYTES`].
pub(crate) fn extract_plugin_wasm(layer: &[u8], max: u64, media_types: &[String]) -> Result<Vec<u8>, OciError> {
    let unsupported = |reason: String| OciError::UnsupportedFormat { media_types: media_types.to_vec(), reason };
    // Sniff rather than trust the media type: both lie in the wild.
    let reader: Box<dyn Read + '_> =
        if layer.starts_with(&[0x1f, 0x8b]) { Box::new(flate2::read::GzDecoder::new(layer)) } else { Box::new(layer) };
    let limit = max + TAR_OVERHEAD_BYTES;
    let over = Cell::new(false);
    let mut archive = tar::Archive::new(Capped { inner: reader, left: limit, over: &over });
    // Once the cap is hit, every error the tar reader reports is that.
    let failed = |error: io::Error, context: &str| {
        if over.get() {
            OciError::OverLimit { what: "the decompressed image layer".into(), max: limit }
        } else {
            unsupported(format!("{context}: {error}"))
        }
    };
    let entries = archive.entries().map_err(|e| failed(e, "image layer is not a tar archive"))?.raw(true);
    // A GNU long name or a PAX `path` names the entry that follows it; a
    // PAX `size` sizes it, which a raw read cannot follow (only files over
    // 8 GiB need one), so one that disagrees with the header is refused.
    let mut next_name: Option<Vec<u8>> = None;
    let mut next_size: Option<Vec<u8>> = None;
    let mut seen: Vec<String> = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| failed(e, "image layer is not a readable tar archive"))?;
        let kind = entry.header().entry_type();
        let size = entry.header().size().map_err(|e| failed(e, "tar entry size"))?;
        let long_name = kind.is_gnu_longname() || kind.is_gnu_longlink();
        if long_name || kind.is_pax_local_extensions() || kind.is_pax_global_extensions() {
            let what = if long_name { "a GNU long name" } else { "a PAX header" };
            if size > MAX_TAR_METADATA_BYTES {
                return Err(OciError::OverLimit {
                    what: format!("{what} in the image layer ({size} bytes)"),
                    max: MAX_TAR_METADATA_BYTES,
                });
            }
            let mut data = Vec::with_capacity(size as usize);
            entry.read_to_end(&mut data).map_err(|e| failed(e, "reading the image layer"))?;
            if kind.is_gnu_longname() {
                let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
                data.truncate(end);
                next_name = Some(data);
            } else if kind.is_pax_local_extensions() {
                for record in tar::PaxExtensions::new(&data) {
                    let record = record.map_err(|e| failed(e, "a PAX header"))?;
                    match record.key_bytes() {
                        b"path" => next_name = Some(record.value_bytes().to_vec()),
                        b"size" => next_size = Some(record.value_bytes().to_vec()),
                        _ => {}
                    }
                }
            }
            continue;
        }
        if let Some(pax_size) = next_size.take()
            && pax_size != size.to_string().as_bytes()
        {
            return Err(unsupported(format!(
                "a PAX size record ({}) disagrees with its tar header ({size})",
                String::from_utf8_lossy(&pax_size).chars().take(30).collect::<String>()
            )));
        }
        let name_bytes = next_name.take().unwrap_or_else(|| entry.header().path_bytes().into_owned());
        let name = String::from_utf8_lossy(&name_bytes).trim_start_matches("./").trim_start_matches('/').to_string();
        if name != "plugin.wasm" || !kind.is_file() {
            if seen.len() < 10 {
                seen.push(name.chars().take(200).collect());
            }
            continue;
        }
        if size > max {
            return Err(OciError::TooLarge { size, max });
        }
        let mut module = Vec::with_capacity(size as usize);
        entry
            .take(max + 1)
            .read_to_end(&mut module)
            .map_err(|e| failed(e, "reading plugin.wasm from the image layer"))?;
        if module.len() as u64 > max {
            return Err(OciError::TooLarge { size: module.len() as u64, max });
        }
        return Ok(module);
    }
    Err(unsupported(format!(
        "the image layer has no plugin.wasm at its root (entries: {})",
        if seen.is_empty() { "none".to_string() } else { seen.join(", ") }
    )))
}

/// A reader that fails, and says so in `over`, once more than `left` bytes
/// have come through.
struct Capped<'a, R> {
    inner: R,
    left: u64,
    over: &'a Cell<bool>,
}

impl<R: Read> Read for Capped<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.over.set(true);
            return Err(io::Error::other("over the unpacked size limit"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// The CNCF Wasm artifact config (`application/vnd.wasm.config.v0+json`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// RFC 3339 creation time.
    pub created: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// Always `wasm`.
    pub architecture: String,
    /// `wasip2` for components.
    pub os: String,
    /// The manifest's layer digests, in order.
    pub layer_digests: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<WasmConfigComponent>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct WasmConfigComponent {
    pub exports: Vec<String>,
    pub imports: Vec<String>,
    /// The WIT world the component targets, when known.
    pub target: Option<String>,
}

#[cfg(test)]
mod tests;
