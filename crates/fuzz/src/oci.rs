//! What a registry sends a pull: manifests and indexes (parsed, digests
//! checked, the layout and layer chosen), the Wasm config, and image layers
//! (tar or tar+gzip) that `plugin.wasm` is unpacked from with limits, then
//! validated as a component.

use std::io::Write;

use bolero::TypeGenerator;
use serde_json::{Value, json};
use sluice_oci::fuzzing::{Resolved, TAR_OVERHEAD_BYTES, extract_plugin_wasm, resolve};
use sluice_oci::{Format, OciError, WasmConfig, inspect_component, media_types as mt};

use crate::json::{Mutation, mutate};
use crate::pick;

/// A manifest or index, a Wasm config, as JSON.
#[derive(Clone, Debug, TypeGenerator)]
pub struct Manifest {
    pub document: Document,
    pub config: Config,
    pub mutation: Mutation,
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Document {
    Image {
        media_type: u8,
        config: Descriptor,
        #[generator(bolero::produce::<Vec<Descriptor>>().with().len(0..4usize))]
        layers: Vec<Descriptor>,
    },
    Index {
        #[generator(bolero::produce::<Vec<Entry>>().with().len(0..5usize))]
        entries: Vec<Entry>,
    },
    Raw(Vec<u8>),
}

#[derive(Clone, Debug, TypeGenerator)]
pub struct Descriptor {
    pub media_type: u8,
    pub digest: Digest,
    pub size: i64,
}

#[derive(Clone, Debug, TypeGenerator)]
pub struct Entry {
    pub digest: Digest,
    pub platform: Option<(u8, u8)>,
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Digest {
    /// `sha256:` and 64 hex digits from this byte.
    Valid(u8),
    Known(u8),
    Other(#[generator(bolero::produce::<String>().with().len(0..80usize))] String),
}

const MEDIA_TYPES: &[&str] = &[
    mt::WASM_LAYER,
    mt::ISTIO_WASM_LAYER,
    mt::OCI_LAYER_TAR,
    mt::OCI_LAYER_TAR_GZIP,
    mt::DOCKER_LAYER_TAR,
    mt::DOCKER_LAYER_TAR_GZIP,
    mt::WASM_CONFIG,
    mt::OCI_MANIFEST,
    mt::OCI_INDEX,
    "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
    "",
];

/// Digests that must never name a file or a URL.
const BAD_DIGESTS: &[&str] = &[
    "sha256:../../../../etc/passwd",
    "sha256:0000000000000000000000000000000000000000000000000000000000000000/..",
    "sha256:ABCDEF0000000000000000000000000000000000000000000000000000000000",
    "sha512:00",
    "sha256:",
    "",
];

const PLATFORMS: &[&str] = &["linux", "wasi", "wasip1", "wasip2", "wasm", "amd64", ""];

/// A Wasm config (`application/vnd.wasm.config.v0+json`), some fields left out.
#[derive(Clone, Debug, TypeGenerator)]
pub struct Config {
    pub created: Option<String>,
    pub author: Option<String>,
    pub os: Option<u8>,
    #[generator(bolero::produce::<Vec<Digest>>().with().len(0..3usize))]
    pub layer_digests: Vec<Digest>,
    pub component: Option<(Vec<String>, Vec<String>, Option<String>)>,
    pub mutation: Mutation,
}

fn digest(d: &Digest) -> String {
    match d {
        Digest::Valid(b) => format!("sha256:{}", format!("{b:02x}").repeat(32)),
        Digest::Known(i) => pick(BAD_DIGESTS, *i).to_string(),
        Digest::Other(s) => s.clone(),
    }
}

fn descriptor(d: &Descriptor) -> Value {
    json!({"mediaType": pick(MEDIA_TYPES, d.media_type), "digest": digest(&d.digest), "size": d.size})
}

impl Document {
    fn render(&self) -> Vec<u8> {
        let value = match self {
            Document::Raw(bytes) => return bytes.clone(),
            Document::Image { media_type, config, layers } => json!({
                "schemaVersion": 2,
                "mediaType": pick(MEDIA_TYPES, *media_type),
                "config": descriptor(config),
                "layers": layers.iter().map(descriptor).collect::<Vec<_>>(),
            }),
            Document::Index { entries } => json!({
                "schemaVersion": 2,
                "mediaType": mt::OCI_INDEX,
                "manifests": entries.iter().map(|e| {
                    let mut entry = json!({"mediaType": mt::OCI_MANIFEST, "digest": digest(&e.digest), "size": 100});
                    if let Some((os, arch)) = e.platform {
                        entry["platform"] = json!({"os": pick(PLATFORMS, os), "architecture": pick(PLATFORMS, arch)});
                    }
                    entry
                }).collect::<Vec<_>>(),
            }),
        };
        serde_json::to_vec(&value).unwrap_or_default()
    }
}

impl Config {
    fn render(&self) -> Vec<u8> {
        let mut value = json!({"architecture": "wasm"});
        if let Some(created) = &self.created {
            value["created"] = json!(created);
        }
        if let Some(author) = &self.author {
            value["author"] = json!(author);
        }
        if let Some(os) = self.os {
            value["os"] = json!(pick(PLATFORMS, os));
        }
        value["layerDigests"] = json!(self.layer_digests.iter().map(digest).collect::<Vec<_>>());
        if let Some((exports, imports, target)) = &self.component {
            value["component"] = json!({"exports": exports, "imports": imports, "target": target});
        }
        let mut bytes = serde_json::to_vec(&value).unwrap_or_default();
        mutate(&mut bytes, &self.mutation);
        bytes
    }
}

/// `sha256:` and 64 lowercase hex digits: the only digest shape that may
/// become a cache path or a blob URL.
fn well_formed(digest: &str) -> bool {
    digest
        .strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

pub fn check_manifest(input: &Manifest) {
    let mut bytes = input.document.render();
    mutate(&mut bytes, &input.mutation);
    match resolve(&bytes) {
        Ok(Resolved::Image { format, layer_digest, media_types, .. }) => {
            assert!(well_formed(&layer_digest), "layer digest {layer_digest:?} passed");
            assert!(!media_types.is_empty());
            // Checked against what was generated, when it was not mangled.
            if let (Document::Image { layers, .. }, Mutation::None) = (&input.document, &input.mutation) {
                let [layer] = layers.as_slice() else { panic!("{} layers accepted", layers.len()) };
                let expected = match pick(MEDIA_TYPES, layer.media_type) {
                    mt::WASM_LAYER => Format::CncfWasm,
                    mt::ISTIO_WASM_LAYER => Format::IstioWasm,
                    _ => Format::ImageTar,
                };
                assert_eq!(format, expected);
            }
        }
        Ok(Resolved::Index { entry_digest }) => {
            assert!(well_formed(&entry_digest), "index entry digest {entry_digest:?} passed");
            if let (Document::Index { entries }, Mutation::None) = (&input.document, &input.mutation)
                && entries.len() > 1
            {
                // Of several, only a wasm/wasi entry is chosen (digests may repeat).
                let wasm = |e: &&Entry| {
                    e.platform.is_some_and(|(os, arch)| {
                        pick(PLATFORMS, arch) == "wasm" || matches!(pick(PLATFORMS, os), "wasi" | "wasip1" | "wasip2")
                    })
                };
                let chosen = entries.iter().filter(|e| digest(&e.digest) == entry_digest).find(wasm);
                assert!(chosen.is_some(), "chose {entry_digest}, which no wasm/wasi entry has");
            }
        }
        Err(_) => {}
    }

    // A config that parses survives a round trip unchanged.
    if let Ok(config) = serde_json::from_slice::<WasmConfig>(&input.config.render()) {
        let again = serde_json::to_vec(&config).expect("a config serializes");
        assert_eq!(serde_json::from_slice::<WasmConfig>(&again).expect("and parses again"), config);
    }
}

/// An image layer: tar entries, maybe gzipped, maybe mangled.
#[derive(Clone, Debug, TypeGenerator)]
pub struct Layer {
    #[generator(bolero::produce::<Vec<TarEntry>>().with().len(0..6usize))]
    pub entries: Vec<TarEntry>,
    pub gnu: bool,
    pub gzip: bool,
    /// The module size limit: small, so that it is hit.
    #[generator(0..4096u64)]
    pub max: u64,
    pub mutation: Mutation,
}

#[derive(Clone, Debug, TypeGenerator)]
pub struct TarEntry {
    pub kind: u8,
    pub name: Name,
    pub data: Data,
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Name {
    Known(u8),
    Other(#[generator(bolero::produce::<String>().with().len(0..24usize))] String),
}

const NAMES: &[&str] = &[
    "plugin.wasm",
    "./plugin.wasm",
    "/plugin.wasm",
    ".//plugin.wasm",
    "dir/plugin.wasm",
    "plugin.wasm/",
    "PLUGIN.WASM",
    "plugin.wasm\0trailing",
    "runtime-config.json",
    "meta",
];

const KINDS: &[tar::EntryType] = &[
    tar::EntryType::Regular,
    tar::EntryType::Regular,
    tar::EntryType::Continuous,
    tar::EntryType::Directory,
    tar::EntryType::Symlink,
    tar::EntryType::Link,
    tar::EntryType::XHeader,
    tar::EntryType::XGlobalHeader,
    tar::EntryType::GNULongName,
    tar::EntryType::GNULongLink,
    tar::EntryType::GNUSparse,
];

#[derive(Clone, Debug, TypeGenerator)]
pub enum Data {
    Known(u8),
    Bytes(#[generator(bolero::produce::<Vec<u8>>().with().len(0..64usize))] Vec<u8>),
    /// This many bytes of one value: past the module limit.
    Fill(u16, u8),
    /// Past the module limit plus the tar overhead: a bomb once gzipped.
    Huge,
}

/// The smallest valid component: its header.
const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

/// PAX records and long names that rename or resize the next entry, and
/// module headers.
const DATA: &[&[u8]] = &[
    b"20 path=plugin.wasm\n",
    b"18 path=other.bin\n",
    b"12 size=999\n",
    b"10 size=0\n",
    b"9 size=\n",
    b"99999999999999999999 path=x\n",
    b"plugin.wasm\0",
    EMPTY_COMPONENT,
    b"\0asm\x01\0\0\0",
    b"",
];

impl TarEntry {
    fn data(&self) -> Vec<u8> {
        match &self.data {
            Data::Known(i) => pick(DATA, *i).to_vec(),
            Data::Bytes(bytes) => bytes.clone(),
            Data::Fill(len, byte) => vec![*byte; usize::from(*len)],
            Data::Huge => vec![0; TAR_OVERHEAD_BYTES as usize + 8192],
        }
    }

    fn name(&self) -> Vec<u8> {
        match &self.name {
            Name::Known(i) => pick(NAMES, *i).as_bytes().to_vec(),
            Name::Other(s) => s.as_bytes().to_vec(),
        }
    }
}

impl Layer {
    pub fn render(&self) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for entry in &self.entries {
            let mut header = if self.gnu { tar::Header::new_gnu() } else { tar::Header::new_ustar() };
            header.set_entry_type(pick(KINDS, entry.kind));
            // Written as is: `set_path` would refuse or normalise the names
            // a hostile layer carries.
            let name = entry.name();
            let field = &mut header.as_old_mut().name;
            let n = name.len().min(field.len());
            field[..n].copy_from_slice(&name[..n]);
            let data = entry.data();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            // Appending to a Vec cannot fail.
            builder.append(&header, data.as_slice()).unwrap_or_default();
        }
        let mut bytes = builder.into_inner().unwrap_or_default();
        if self.gzip {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(&bytes).unwrap_or_default();
            bytes = encoder.finish().unwrap_or_default();
        }
        mutate(&mut bytes, &self.mutation);
        bytes
    }

    /// What a pull must make of a layer that was not mangled, has no
    /// metadata entries and nothing near the unpacked limit: the first
    /// regular file named `plugin.wasm`, within the limit.
    fn expected(&self) -> Option<Expected> {
        let plain = matches!(self.mutation, Mutation::None)
            && self.entries.iter().all(|e| {
                let kind = pick(KINDS, e.kind);
                !(kind.is_pax_local_extensions()
                    || kind.is_pax_global_extensions()
                    || kind.is_gnu_longname()
                    || kind.is_gnu_longlink()
                    || kind.is_gnu_sparse()
                    || matches!(e.data, Data::Huge))
            });
        if !plain {
            return None;
        }
        let module = self.entries.iter().find(|e| {
            let name = e.name();
            let name = &name[..name.len().min(100)];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            let name = String::from_utf8_lossy(name);
            name.trim_start_matches("./").trim_start_matches('/') == "plugin.wasm" && pick(KINDS, e.kind).is_file()
        });
        Some(match module.map(TarEntry::data) {
            None => Expected::Missing,
            Some(data) if data.len() as u64 > self.max => Expected::TooLarge(data.len() as u64),
            Some(data) => Expected::Module(data),
        })
    }
}

#[derive(Debug)]
enum Expected {
    Module(Vec<u8>),
    TooLarge(u64),
    Missing,
}

pub fn check_layer(layer: &Layer) {
    let bytes = layer.render();
    let result = extract_plugin_wasm(&bytes, layer.max, &[]);
    if let Ok(module) = &result {
        assert!(module.len() as u64 <= layer.max, "{} bytes over the limit of {}", module.len(), layer.max);
        let _ = inspect_component(module);
    }
    match (layer.expected(), &result) {
        (None, _) => {}
        (Some(Expected::Module(expected)), Ok(module)) => assert_eq!(module, &expected),
        (Some(Expected::TooLarge(size)), Err(OciError::TooLarge { size: found, .. })) => assert_eq!(*found, size),
        (Some(Expected::Missing), Err(OciError::UnsupportedFormat { .. })) => {}
        (Some(expected), result) => panic!("expected {expected:?}, got {result:?}"),
    }
}

/// A component, or bytes that start like one: for the validator.
#[derive(Clone, Debug, TypeGenerator)]
pub struct Component {
    #[generator(bolero::produce::<Vec<u8>>().with().len(0..256usize))]
    pub body: Vec<u8>,
}

pub fn check_component(input: &Component) {
    let mut bytes = EMPTY_COMPONENT.to_vec();
    bytes.extend_from_slice(&input.body);
    let _ = inspect_component(&bytes);
}
