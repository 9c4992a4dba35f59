use super::*;

fn descriptor(media_type: &str) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.into(),
        digest: format!("sha256:{}", "0".repeat(64)),
        size: 10,
        ..Default::default()
    }
}

fn manifest(config: &str, layers: &[&str]) -> OciImageManifest {
    OciImageManifest {
        schema_version: 2,
        media_type: Some(mt::OCI_MANIFEST.into()),
        config: descriptor(config),
        layers: layers.iter().map(|m| descriptor(m)).collect(),
        subject: None,
        artifact_type: None,
        annotations: None,
    }
}

#[test]
fn detects_each_accepted_layout() {
    let cases = [
        (mt::WASM_CONFIG, mt::WASM_LAYER, Format::CncfWasm),
        ("application/vnd.module.wasm.config.v1+json", mt::ISTIO_WASM_LAYER, Format::IstioWasm),
        ("application/vnd.oci.image.config.v1+json", mt::OCI_LAYER_TAR_GZIP, Format::ImageTar),
        ("application/vnd.docker.container.image.v1+json", mt::DOCKER_LAYER_TAR_GZIP, Format::ImageTar),
        ("application/vnd.oci.image.config.v1+json", mt::OCI_LAYER_TAR, Format::ImageTar),
    ];
    for (config, layer, expected) in cases {
        let manifest = manifest(config, &[layer]);
        let (format, found) = detect(&manifest).unwrap();
        assert_eq!((format, found.media_type.as_str()), (expected, layer));
    }
}

#[test]
fn refuses_other_layouts_naming_their_media_types() {
    let helm =
        manifest("application/vnd.cncf.helm.config.v1+json", &["application/vnd.cncf.helm.chart.content.v1.tar+gzip"]);
    let err = detect(&helm).unwrap_err().to_string();
    assert!(err.contains("application/vnd.cncf.helm.config.v1+json"), "{err}");
    assert!(err.contains("application/vnd.cncf.helm.chart.content.v1.tar+gzip"), "{err}");

    let two = manifest(mt::WASM_CONFIG, &[mt::WASM_LAYER, mt::WASM_LAYER]);
    assert!(detect(&two).unwrap_err().to_string().contains("exactly one layer, this one has 2"));
    let none = manifest(mt::WASM_CONFIG, &[]);
    assert!(matches!(detect(&none), Err(OciError::UnsupportedFormat { .. })));
}

fn index(platforms: &[(&str, &str)]) -> OciImageIndex {
    let entries = platforms
        .iter()
        .enumerate()
        .map(|(i, (os, arch))| {
            serde_json::from_value(serde_json::json!({
                "mediaType": mt::OCI_MANIFEST,
                "digest": format!("sha256:{i:064}"),
                "size": 100,
                "platform": {"os": os, "architecture": arch},
            }))
            .unwrap()
        })
        .collect();
    OciImageIndex {
        schema_version: 2,
        media_type: Some(mt::OCI_INDEX.into()),
        manifests: entries,
        artifact_type: None,
        annotations: None,
    }
}

#[test]
fn chooses_the_wasm_entry_of_an_index() {
    let multi = index(&[("linux", "amd64"), ("wasip2", "wasm"), ("linux", "arm64")]);
    assert_eq!(choose_index_entry(&multi).unwrap().digest, format!("sha256:{:064}", 1));
    let single = index(&[("linux", "amd64")]);
    assert_eq!(choose_index_entry(&single).unwrap().digest, format!("sha256:{:064}", 0));
    let none = index(&[("linux", "amd64"), ("linux", "arm64")]);
    let err = choose_index_entry(&none).unwrap_err().to_string();
    assert!(err.contains("linux/amd64, linux/arm64"), "{err}");
}

fn tar_with(files: &[(&str, &[u8])], gzip: bool) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, *data).unwrap();
    }
    gzipped_if(builder.into_inner().unwrap(), gzip)
}

#[test]
fn extracts_plugin_wasm_from_plain_and_gzipped_tars() {
    let module = b"\0asm-module-bytes".as_slice();
    for gzip in [false, true] {
        let layer = tar_with(&[("runtime-config.json", b"{}"), ("./plugin.wasm", module)], gzip);
        assert_eq!(extract_plugin_wasm(&layer, 1024, &[]).unwrap(), module, "gzip={gzip}");
    }
}

#[test]
fn a_tar_without_plugin_wasm_is_refused_listing_its_entries() {
    let layer = tar_with(&[("etc/passwd", b"root"), ("bin/plugin.wasm", b"x")], true);
    let err = extract_plugin_wasm(&layer, 1024, &[mt::OCI_LAYER_TAR_GZIP.into()]).unwrap_err().to_string();
    assert!(err.contains("etc/passwd") && err.contains("bin/plugin.wasm"), "{err}");
    assert!(err.contains(mt::OCI_LAYER_TAR_GZIP), "{err}");
    assert!(extract_plugin_wasm(b"not a tar at all, certainly", 1024, &[]).is_err());
}

#[test]
fn an_oversized_plugin_wasm_in_a_tar_is_refused() {
    let layer = tar_with(&[("plugin.wasm", &[7u8; 2048])], true);
    match extract_plugin_wasm(&layer, 1000, &[]) {
        Err(OciError::TooLarge { size, max }) => assert_eq!((size, max), (2048, 1000)),
        other => panic!("{other:?}"),
    }
}

fn gzipped_if(tar: Vec<u8>, gzip: bool) -> Vec<u8> {
    if !gzip {
        return tar;
    }
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut encoder, &tar).unwrap();
    encoder.finish().unwrap()
}

/// A tar of raw entries: (entry type, name, data), headers as given.
fn raw_tar(entries: &[(tar::EntryType, &str, &[u8])], gzip: bool) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (kind, name, data) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(*kind);
        header.set_path(name).unwrap();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append(&header, *data).unwrap();
    }
    gzipped_if(builder.into_inner().unwrap(), gzip)
}

fn over_limit(result: Result<Vec<u8>, OciError>) -> (String, u64) {
    match result {
        Err(OciError::OverLimit { what, max }) => (what, max),
        other => panic!("expected OverLimit, got {other:?}"),
    }
}

#[test]
fn unpacking_stops_at_the_module_limit_plus_the_tar_overhead() {
    let padding = vec![0u8; (TAR_OVERHEAD_BYTES + 4096) as usize];
    let module = b"\0asm-module".as_slice();
    let bomb = tar_with(&[("padding", &padding), ("plugin.wasm", module)], true);
    assert!(bomb.len() < 64 * 1024, "the bomb is small: {}", bomb.len());
    let (what, max) = over_limit(extract_plugin_wasm(&bomb, 1024, &[]));
    assert_eq!((what.as_str(), max), ("the decompressed image layer", 1024 + TAR_OVERHEAD_BYTES));
    // The same padding under a larger module limit is fine.
    assert_eq!(extract_plugin_wasm(&bomb, 8192, &[]).unwrap(), module);
}

#[test]
fn pax_headers_and_long_names_are_capped_and_honoured() {
    use tar::EntryType;
    let module = b"\0asm-module".as_slice();
    let huge = vec![b'a'; MAX_TAR_METADATA_BYTES as usize + 1];
    for (kind, what) in [
        (EntryType::XHeader, "a PAX header"),
        (EntryType::XGlobalHeader, "a PAX header"),
        (EntryType::GNULongName, "a GNU long name"),
        (EntryType::GNULongLink, "a GNU long name"),
    ] {
        for gzip in [false, true] {
            let layer = raw_tar(&[(kind, "meta", &huge), (EntryType::Regular, "plugin.wasm", module)], gzip);
            let (found, max) = over_limit(extract_plugin_wasm(&layer, 4 << 20, &[]));
            assert!(found.starts_with(what), "{kind:?}: {found}");
            assert_eq!(max, MAX_TAR_METADATA_BYTES);
        }
    }
    // Within the limit, a long name or a PAX path names the next entry.
    let named = |kind, data: &[u8]| raw_tar(&[(kind, "meta", data), (EntryType::Regular, "other", module)], true);
    assert_eq!(extract_plugin_wasm(&named(EntryType::GNULongName, b"plugin.wasm\0"), 1024, &[]).unwrap(), module);
    assert_eq!(extract_plugin_wasm(&named(EntryType::XHeader, b"20 path=plugin.wasm\n"), 1024, &[]).unwrap(), module);
    let renamed = named(EntryType::XHeader, b"18 path=other.bin\n");
    let layer = raw_tar(
        &[(EntryType::XHeader, "meta", b"18 path=other.bin\n"), (EntryType::Regular, "plugin.wasm", module)],
        false,
    );
    assert!(extract_plugin_wasm(&layer, 1024, &[]).unwrap_err().to_string().contains("other.bin"));
    assert!(extract_plugin_wasm(&renamed, 1024, &[]).is_err());
    // A PAX size that disagrees with the header would be read differently
    // by another tar reader: refused.
    let sized = named(EntryType::XHeader, b"12 size=999\n20 path=plugin.wasm\n");
    let error = extract_plugin_wasm(&sized, 1024, &[]).unwrap_err().to_string();
    assert!(error.contains("PAX size record"), "{error}");
}

#[test]
fn wasm_config_uses_the_spec_field_names() {
    let config = WasmConfig {
        created: "2026-01-01T00:00:00Z".into(),
        author: None,
        architecture: "wasm".into(),
        os: "wasip2".into(),
        layer_digests: vec!["sha256:ab".into()],
        component: Some(WasmConfigComponent { exports: vec!["e".into()], imports: vec!["i".into()], target: None }),
    };
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(json["layerDigests"][0], "sha256:ab");
    assert_eq!(json["component"]["exports"][0], "e");
    assert_eq!(json["component"]["imports"][0], "i");
    assert!(json["component"]["target"].is_null());
    assert_eq!(serde_json::from_value::<WasmConfig>(json).unwrap(), config);
}
