//! `cargo xtask new-plugin <name>`: starts a first-party plugin in
//! plugins/<name>, a Rust crate on the SDK with a unit test, adds it to the
//! plugins workspace and builds it into plugins/dist/<name>.wasm.
//!
//! The template sets one request header from its config: the smallest
//! plugin that shows config parsing, a hook and a test. If the build fails,
//! the new crate is removed and plugins/Cargo.toml and Cargo.lock restored,
//! so a failed run leaves nothing behind.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::{cargo_metadata, plugins, step};

const PLUGINS_DIR: &str = "plugins";
const MANIFEST: &str = "plugins/Cargo.toml";
const LOCKFILE: &str = "plugins/Cargo.lock";

#[derive(clap::Args)]
pub struct Args {
    /// The plugin's name, e.g. `tenant-tag`: lower-case ASCII letters and
    /// digits, words joined by single dashes, starting with a letter.
    name: String,
}

pub fn main(args: Args) -> Result<()> {
    let name = args.name.as_str();
    let type_name = type_name(name)?;
    let metadata = cargo_metadata(MANIFEST)?;
    let taken = metadata["packages"].as_array().into_iter().flatten().any(|package| package["name"] == name);
    if taken {
        bail!("{MANIFEST} has a package named `{name}` already");
    }

    let dir = Path::new(PLUGINS_DIR).join(name);
    if dir.exists() {
        bail!("{} exists already", dir.display());
    }

    step(&format!("Creating {PLUGINS_DIR}/{name} and adding it to {MANIFEST}"));
    let manifest = fs::read_to_string(MANIFEST).with_context(|| format!("cannot read {MANIFEST}"))?;
    // Cargo adds the new package to the lockfile as it builds.
    let lockfile = fs::read(LOCKFILE).with_context(|| format!("cannot read {LOCKFILE}"))?;
    let result = create(Path::new(PLUGINS_DIR), name, &type_name)
        .and_then(|()| add_member(&manifest, name))
        .and_then(|updated| fs::write(MANIFEST, updated).with_context(|| format!("cannot write {MANIFEST}")))
        // The wasm build, published to plugins/dist/ like every first-party plugin.
        .and_then(|()| plugins::build_only(&[name]));
    if let Err(error) = result {
        fs::remove_dir_all(&dir).ok();
        fs::write(MANIFEST, &manifest).ok();
        fs::write(LOCKFILE, &lockfile).ok();
        return Err(error.context(format!("removed {PLUGINS_DIR}/{name} again and restored {MANIFEST} and {LOCKFILE}")));
    }

    let lib_name = name.replace('-', "_");
    println!(
        r#"
Created {PLUGINS_DIR}/{name}: Cargo.toml, README.md and src/lib.rs, which sets the
request header `x-{name}` to its config's `value`. Next:

  cargo test --manifest-path plugins/Cargo.toml -p {name}
  cargo xtask plugins
    # -> plugins/dist/{name}.wasm (and every other plugin and example), or by hand:
  cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml -p {name}
    # -> plugins/target/wasm32-wasip2/release/{lib_name}.wasm

and load it in the quickstart: see "Starting a new plugin" in plugins/README.md."#
    );
    Ok(())
}

/// The plugin's Rust type: `tenant-tag` becomes `TenantTag`. Refuses a name
/// that is not lower-case words joined by single dashes, or whose type
/// would clash with a name the template uses.
fn type_name(name: &str) -> Result<String> {
    let valid_word =
        |word: &str| word.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) && !word.is_empty();
    let starts_with_letter = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    if !starts_with_letter || !name.split('-').all(valid_word) || name.len() > 64 {
        bail!(
            "`{name}` is not a plugin name: use lower-case ASCII letters and digits, words joined by single \
             dashes, starting with a letter, at most 64 characters (e.g. `tenant-tag`)"
        );
    }
    // `cargo xtask plugins` publishes the examples as example-<language>.wasm.
    if name.starts_with("example-") {
        bail!("`{name}`: plugins/dist/example-*.wasm are the decorator-lite examples; choose another name");
    }
    let type_name: String = name
        .split('-')
        .map(|word| {
            let (first, rest) = word.split_at(1);
            first.to_ascii_uppercase() + rest
        })
        .collect();
    if TEMPLATE_NAMES.contains(&type_name.as_str()) {
        bail!("`{name}` would be the type `{type_name}`, which the template uses for something else");
    }
    Ok(type_name)
}

/// Type names the template's lib.rs uses, which the plugin's own must not
/// shadow; `Self` is a keyword.
const TEMPLATE_NAMES: &[&str] = &["Action", "ApiError", "Config", "Deserialize", "Plugin", "Request", "Self"];

/// Writes the template into `plugins_dir/name`, which must not exist yet.
fn create(plugins_dir: &Path, name: &str, type_name: &str) -> Result<()> {
    let dir = plugins_dir.join(name);
    if dir.exists() {
        bail!("{} exists already", dir.display());
    }
    fs::create_dir_all(dir.join("src")).with_context(|| format!("cannot create {}", dir.display()))?;
    for (file, template) in [("Cargo.toml", CARGO_TOML), ("README.md", README), ("src/lib.rs", LIB_RS)] {
        let text = template.replace("{name}", name).replace("{Type}", type_name);
        fs::write(dir.join(file), text).with_context(|| format!("cannot write {}/{file}", dir.display()))?;
    }
    Ok(())
}

/// `manifest` (the plugins workspace's Cargo.toml) with `name` appended to
/// its `members` list, everything else as it was.
fn add_member(manifest: &str, name: &str) -> Result<String> {
    let start = manifest.find("\nmembers = [").with_context(|| format!("no `members = [` line in {MANIFEST}"))?;
    let end = start
        + manifest[start..].find("\n]").with_context(|| format!("no `]` line closing the members in {MANIFEST}"))?;
    let (before, after) = manifest.split_at(end);
    let comma = if before.trim_end().ends_with([',', '[']) { "" } else { "," };
    Ok(format!("{}{comma}\n    \"{name}\",{after}", before.trim_end()))
}

const CARGO_TOML: &str = r#"[package]
name = "{name}"
description = "Sluice plugin: sets the x-{name} request header"
version.workspace = true
edition.workspace = true
rust-version.workspace = true
license.workspace = true
publish.workspace = true

# A core module for wasm32-unknown-unknown, which `cargo xtask plugins` makes
# a component (or a component straight from `--target wasm32-wasip2`, which
# instantiates slower); the unit tests build natively.
[lib]
crate-type = ["cdylib"]

[dependencies]
serde.workspace = true
# The SDK, a path dependency (plugins/sdk) through the workspace.
sluice-plugin-sdk.workspace = true
"#;

const README: &str = r#"# {name}

Sets the request header `x-{name}` to the configured value. (Generated by
`cargo xtask new-plugin`: replace this with what the plugin does.)

| field | required | meaning |
|---|---|---|
| `value` | yes | the header's value, not empty |

`configure` rejects an empty `value` or an unknown field.

```yaml
apiVersion: sluice.dev/v1alpha1
kind: GatewayPlugin
metadata:
  name: {name}
spec:
  source:
    file: ../../plugins/dist/{name}.wasm   # relative to this YAML file
  config:
    value: hello
```

Test, build and try it: see "Starting a new plugin" in
[`../README.md`](../README.md#starting-a-new-plugin).
"#;

const LIB_RS: &str = r##"//! Sets the request header `x-{name}` to the configured value.

use serde::Deserialize;
use sluice_plugin_sdk::prelude::{Action, ApiError, Plugin, Request, export_plugin};

const HEADER: &str = "x-{name}";

/// The GatewayPlugin's `spec.config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    /// The header's value.
    value: String,
}

#[derive(Debug)]
struct {Type}(Config);

impl Plugin for {Type} {
    /// Prefixes config errors, so operators see which plugin refused.
    const NAME: &'static str = "{name}";
    type Config = Config;
    /// Nothing is kept from the request hook to the response hooks.
    type State = ();

    /// Runs when an instance is configured: an error rejects the config and
    /// shows in /admin/config.
    fn new(config: Config) -> Result<Self, String> {
        if config.value.is_empty() {
            return Err("`value` must not be empty".into());
        }
        Ok({Type}(config))
    }

    // `hooks` declares the request hook only, by default. To use another hook,
    // implement it (`on_response`, `on_chunk`, `on_body`, `on_end`) and
    // return it from `hooks` too.

    /// Reads and edits the request in place, through `req`.
    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        req.set_header(HEADER, &self.0.value);
        Ok(Action::Continue)
    }
}

export_plugin!({Type});

#[cfg(test)]
mod tests {
    use sluice_plugin_sdk::testing::request_with_headers;

    use super::*;

    #[test]
    fn sets_the_configured_header_and_refuses_an_empty_value() {
        let plugin = sluice_plugin_sdk::configure::<{Type}>(r#"{"value": "hello"}"#).unwrap();
        let req = request_with_headers("gpt-4o-mini", &[]);
        assert_eq!(plugin.on_request(&req, &mut ()), Ok(Action::Continue));
        assert_eq!(req.header(HEADER).as_deref(), Some("hello"));

        let error = sluice_plugin_sdk::configure::<{Type}>(r#"{"value": ""}"#).unwrap_err();
        assert_eq!(error, "{name}: `value` must not be empty");
    }
}
"##;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_come_from_the_words_of_the_name() {
        assert_eq!(type_name("tenant-tag").unwrap(), "TenantTag");
        assert_eq!(type_name("guard2").unwrap(), "Guard2");
        assert_eq!(type_name("a-1b").unwrap(), "A1b");
    }

    #[test]
    fn names_that_cannot_be_a_crate_a_type_or_a_dist_file_are_refused() {
        let too_long = "a".repeat(65);
        for name in ["", "Tag", "2fa", "-tag", "tag-", "tenant--tag", "tenant_tag", "t\u{e9}", "a/b", &too_long] {
            let error = type_name(name).unwrap_err().to_string();
            assert!(error.contains("is not a plugin name"), "{name:?}: {error}");
        }
        assert!(type_name("example-c").unwrap_err().to_string().contains("decorator-lite examples"));
        for name in ["plugin", "config", "api-error", "self"] {
            assert!(type_name(name).unwrap_err().to_string().contains("the template uses"), "{name}");
        }
    }

    #[test]
    fn the_template_is_filled_in_and_an_existing_plugin_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        create(dir.path(), "tenant-tag", "TenantTag").unwrap();
        let lib = fs::read_to_string(dir.path().join("tenant-tag/src/lib.rs")).unwrap();
        assert!(lib.contains("struct TenantTag(Config);"), "{lib}");
        assert!(lib.contains(r#"const HEADER: &str = "x-tenant-tag";"#), "{lib}");
        assert!(lib.contains("export_plugin!(TenantTag);"), "{lib}");
        let manifest = fs::read_to_string(dir.path().join("tenant-tag/Cargo.toml")).unwrap();
        assert!(manifest.starts_with("[package]\nname = \"tenant-tag\"\n"), "{manifest}");
        assert!(manifest.contains("sluice-plugin-sdk.workspace = true"), "{manifest}");
        let readme = fs::read_to_string(dir.path().join("tenant-tag/README.md")).unwrap();
        assert!(readme.contains("file: ../../plugins/dist/tenant-tag.wasm"), "{readme}");
        // Every placeholder is filled in.
        for text in [&lib, &manifest, &readme] {
            assert!(!text.contains("{name}") && !text.contains("{Type}"), "{text}");
        }

        fs::write(dir.path().join("tenant-tag/src/lib.rs"), "// my work").unwrap();
        let error = create(dir.path(), "tenant-tag", "TenantTag").unwrap_err().to_string();
        assert!(error.contains("exists already"), "{error}");
        assert_eq!(fs::read_to_string(dir.path().join("tenant-tag/src/lib.rs")).unwrap(), "// my work");
    }

    #[test]
    fn a_member_is_appended_to_the_workspace_and_the_rest_kept() {
        let manifest = "# comment\n[workspace]\nmembers = [\n    \"sdk\",\n    \"deny\",\n]\n\n[profile.release]\n";
        assert_eq!(
            add_member(manifest, "tenant-tag").unwrap(),
            "# comment\n[workspace]\nmembers = [\n    \"sdk\",\n    \"deny\",\n    \"tenant-tag\",\n]\n\n[profile.release]\n"
        );
        // A last member without a trailing comma gets one.
        let bare = "[workspace]\nmembers = [\n    \"sdk\"\n]\n";
        assert_eq!(add_member(bare, "x").unwrap(), "[workspace]\nmembers = [\n    \"sdk\",\n    \"x\",\n]\n");
        assert!(add_member("[workspace]\n", "x").is_err());
    }

    #[test]
    fn the_real_workspace_manifest_takes_a_member() {
        // The one this command edits: it must keep the shape add_member reads.
        let manifest = fs::read_to_string(crate::repo_root().join(MANIFEST)).unwrap();
        let updated = add_member(&manifest, "tenant-tag").unwrap();
        assert_eq!(updated.replace("    \"tenant-tag\",\n", ""), manifest);
    }
}
