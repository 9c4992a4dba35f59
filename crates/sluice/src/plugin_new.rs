//! `sluice plugin new NAME --lang rust|python|js|c`: writes a standalone
//! plugin project, outside any checkout of this repository: the plugin
//! (every hook, each with a visible effect), its build (a Makefile), a local
//! test that serves it through `sluice run` against `sluice echo-upstream`
//! (test.sh), a GatewayPlugin for it, a README, and the WIT.
//!
//! The WIT and the templates (crates/sluice/templates/) are compiled into
//! the binary, so a project is written for the interface of the gateway
//! that wrote it, with nothing to download. Plain file writes only: the
//! command adds no startup cost to the gateway's own.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

#[derive(clap::Args)]
pub struct NewArgs {
    /// The plugin's name, e.g. `tenant-tag`: lower-case ASCII letters and
    /// digits, words joined by single dashes, starting with a letter.
    name: String,
    /// The language to write it in.
    #[arg(long, value_enum)]
    lang: Lang,
    /// The project directory to create [default: ./NAME]; it must not exist.
    #[arg(long, value_name = "PATH")]
    dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
    C,
}

/// The WIT this binary serves, `wit/` of its source tree: the main package
/// and the WASI packages it names. `tests::the_embedded_wit_is_all_of_wit`
/// fails when a file is added there and not here.
const WIT: &[(&str, &str)] = &[
    ("wit/plugin.wit", include_str!("../../../wit/plugin.wit")),
    ("wit/deps/cli.wit", include_str!("../../../wit/deps/cli.wit")),
    ("wit/deps/clocks.wit", include_str!("../../../wit/deps/clocks.wit")),
    ("wit/deps/filesystem.wit", include_str!("../../../wit/deps/filesystem.wit")),
    ("wit/deps/http.wit", include_str!("../../../wit/deps/http.wit")),
    ("wit/deps/io.wit", include_str!("../../../wit/deps/io.wit")),
    ("wit/deps/random.wit", include_str!("../../../wit/deps/random.wit")),
    ("wit/deps/sockets.wit", include_str!("../../../wit/deps/sockets.wit")),
];

/// A file of a project: its path (with placeholders) and its text.
type Template = (&'static str, &'static str);

/// Every language's files, besides the language's own.
const COMMON: &[Template] = &[
    ("test.sh", include_str!("../templates/test.sh")),
    ("config/{{name}}.yaml", include_str!("../templates/plugin.yaml")),
];

const README: &str = include_str!("../templates/README.md");

/// The WASI preview 1 reactor adapter, which turns the C plugin's wasi-libc
/// core module into a component: the file the crate
/// wasi-preview1-component-adapter-provider 48 (the gateway's wasmtime)
/// ships, as `cargo xtask` writes it to target/tools/ for the C example.
/// tests/e2e/plugin_new.rs checks the two are the same.
const C_ADAPTER: (&str, &[u8]) =
    ("wasi_snapshot_preview1.reactor.wasm", include_bytes!("../templates/c/wasi_snapshot_preview1.reactor.wasm"));

/// What differs between languages.
struct Language {
    title: &'static str,
    files: &'static [Template],
    gitignore: &'static str,
    /// README fragments: rows of the file table, the build section, and how
    /// to build for the world fetched with wkg.
    readme_files: &'static str,
    readme_build: &'static str,
    readme_wkg: &'static str,
    /// More GatewayPlugin `spec` lines, for the interpreted languages.
    spec_extra: &'static str,
}

impl Lang {
    fn language(self) -> Language {
        match self {
            Lang::Rust => Language {
                title: "Rust",
                files: &[
                    ("Cargo.toml", include_str!("../templates/rust/Cargo.toml")),
                    ("Makefile", include_str!("../templates/rust/Makefile")),
                    ("src/lib.rs", include_str!("../templates/rust/src/lib.rs")),
                ],
                gitignore: include_str!("../templates/rust/gitignore"),
                readme_files: include_str!("../templates/rust/readme-files.md"),
                readme_build: include_str!("../templates/rust/readme-build.md"),
                readme_wkg: include_str!("../templates/rust/readme-wkg.md"),
                spec_extra: "",
            },
            Lang::Python => Language {
                title: "Python",
                files: &[
                    ("app.py", include_str!("../templates/python/app.py")),
                    ("Makefile", include_str!("../templates/python/Makefile")),
                ],
                gitignore: include_str!("../templates/python/gitignore"),
                readme_files: include_str!("../templates/python/readme-files.md"),
                readme_build: include_str!("../templates/python/readme-build.md"),
                readme_wkg: include_str!("../templates/python/readme-wkg.md"),
                spec_extra: "  # A Python instance takes milliseconds to start: reuse instances, and\n  \
                             # leave room in the deadline (which covers instantiation) for a busy host.\n  \
                             isolation: Reused\n  timeoutMs: 1000\n",
            },
            Lang::Js => Language {
                title: "JavaScript",
                files: &[
                    ("filter.js", include_str!("../templates/js/filter.js")),
                    ("build.mjs", include_str!("../templates/js/build.mjs")),
                    ("package.json", include_str!("../templates/js/package.json")),
                    ("package-lock.json", include_str!("../templates/js/package-lock.json")),
                    ("Makefile", include_str!("../templates/js/Makefile")),
                ],
                gitignore: include_str!("../templates/js/gitignore"),
                readme_files: include_str!("../templates/js/readme-files.md"),
                readme_build: include_str!("../templates/js/readme-build.md"),
                readme_wkg: include_str!("../templates/js/readme-wkg.md"),
                spec_extra: "  # A JavaScript instance takes about a millisecond to start: leave room\n  \
                             # in the deadline (which covers instantiation) for a busy host.\n  \
                             timeoutMs: 1000\n",
            },
            Lang::C => Language {
                title: "C",
                files: &[
                    ("filter.c", include_str!("../templates/c/filter.c")),
                    ("Makefile", include_str!("../templates/c/Makefile")),
                ],
                gitignore: include_str!("../templates/c/gitignore"),
                readme_files: include_str!("../templates/c/readme-files.md"),
                readme_build: include_str!("../templates/c/readme-build.md"),
                readme_wkg: include_str!("../templates/c/readme-wkg.md"),
                spec_extra: "",
            },
        }
    }
}

pub fn run(args: NewArgs) -> anyhow::Result<()> {
    check_name(&args.name)?;
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(&args.name));
    let files = project(&args.name, args.lang)?;
    write_project(&dir, &files)?;
    let shown = dir.display();
    println!(
        "Created {shown}: a {} plugin, `{}`, for sluice:plugin@{}. Next:\n\n  \
         cd {shown}\n  \
         make          # builds {}.wasm (README.md says what it needs)\n  \
         make test     # serves it through `sluice run` and checks each hook\n\n\
         README.md says what each file is, and how to push the plugin and apply its GatewayPlugin.",
        args.lang.language().title,
        args.name,
        wit_version()?,
        args.name,
    );
    Ok(())
}

/// Refuses a name that is not lower-case words joined by single dashes,
/// starting with a letter: it names the Cargo package, the npm package, the
/// `.wasm` file, the header `x-NAME` and the Kubernetes resources.
fn check_name(name: &str) -> anyhow::Result<()> {
    let valid_word =
        |word: &str| !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let starts_with_letter = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    if !starts_with_letter || !name.split('-').all(valid_word) || name.len() > 63 {
        bail!(
            "`{name}` is not a plugin name: use lower-case ASCII letters and digits, words joined by single \
             dashes, starting with a letter, at most 63 characters (e.g. `tenant-tag`)"
        );
    }
    // Names a Rust crate cannot take without shadowing the standard library.
    if ["core", "std", "alloc", "test", "proc-macro"].contains(&name) {
        bail!("`{name}` is the name of a Rust standard crate; choose another");
    }
    Ok(())
}

/// `0.3.2`, from the `package sluice:plugin@0.3.2;` line of the WIT.
fn wit_version() -> anyhow::Result<&'static str> {
    let plugin_wit = WIT[0].1;
    plugin_wit
        .lines()
        .find_map(|line| line.trim().strip_prefix("package sluice:plugin@")?.strip_suffix(';'))
        .context("the embedded wit/plugin.wit has no `package sluice:plugin@VERSION;` line")
}

/// What a project holds: each file's path in it and its bytes.
fn project(name: &str, lang: Lang) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let language = lang.language();
    let wit_version = wit_version()?;
    let lib_name = name.replace('-', "_");
    let fill = |text: &str| {
        text.replace("{{files}}", language.readme_files)
            .replace("{{build}}", language.readme_build)
            .replace("{{wkg_build}}", language.readme_wkg)
            .replace("{{spec_extra}}", language.spec_extra)
            .replace("{{lang_title}}", language.title)
            .replace("{{sluice_version}}", env!("CARGO_PKG_VERSION"))
            .replace("{{wit_version}}", wit_version)
            .replace("{{lib_name}}", &lib_name)
            .replace("{{name}}", name)
    };
    let mut templates: Vec<Template> = COMMON.iter().chain(language.files).copied().collect();
    templates.extend([("README.md", README), (".gitignore", language.gitignore)]);
    let mut files: Vec<(String, Vec<u8>)> =
        templates.iter().map(|(path, text)| (fill(path), fill(text).into_bytes())).collect();
    for (path, text) in WIT {
        files.push(((*path).to_owned(), text.as_bytes().to_vec()));
    }
    if lang == Lang::C {
        files.push((C_ADAPTER.0.to_owned(), C_ADAPTER.1.to_vec()));
    }
    Ok(files)
}

/// Creates `dir` (which must not exist; its parents may not either) and
/// writes `files` into it; on failure, removes it again.
fn write_project(dir: &Path, files: &[(String, Vec<u8>)]) -> anyhow::Result<()> {
    if let Some(parent) = dir.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    // create_dir, not create_dir_all: it fails if the directory is there,
    // even if it was made a moment ago.
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            bail!("{} exists already: choose a new directory with --dir, or remove it", dir.display())
        }
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
    }
    let written = files.iter().try_for_each(|(path, bytes)| write_file(&dir.join(path), bytes));
    if let Err(error) = written {
        fs::remove_dir_all(dir).ok();
        return Err(error.context(format!("removed {} again", dir.display())));
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    // The test script is run directly.
    #[cfg(unix)]
    if path.extension().is_some_and(|extension| extension == "sh") {
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot make {} executable", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LANGS: [Lang; 4] = [Lang::Rust, Lang::Python, Lang::Js, Lang::C];

    #[test]
    fn the_embedded_wit_is_all_of_wit() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut on_disk = Vec::new();
        for dir in ["wit", "wit/deps"] {
            for entry in fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "wit") {
                    on_disk.push(path.strip_prefix(&root).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        on_disk.sort();
        let mut embedded: Vec<String> = WIT.iter().map(|(path, _)| (*path).to_owned()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk, "add the new file to WIT in plugin_new.rs");
        assert_eq!(wit_version().unwrap().split('.').count(), 3);
    }

    #[test]
    fn every_placeholder_is_filled() {
        for lang in LANGS {
            for (path, bytes) in project("tenant-tag", lang).unwrap() {
                let Ok(text) = String::from_utf8(bytes) else {
                    assert_eq!(path, C_ADAPTER.0);
                    continue;
                };
                for placeholder in [&path, &text] {
                    // Lower-case placeholders only: C's `{{NULL, 0}}` is code.
                    let open = placeholder.match_indices("{{").find(|(at, _)| {
                        placeholder[at + 2..].split("}}").next().is_some_and(|inner| {
                            !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                        })
                    });
                    assert!(open.is_none(), "{lang:?}: {path} has an unfilled placeholder");
                }
            }
        }
    }

    #[test]
    fn names_are_checked() {
        for good in ["a", "tenant-tag", "v2-guard", "x1"] {
            check_name(good).unwrap();
        }
        for bad in ["", "Tenant", "-a", "a-", "a--b", "1a", "a_b", "a.b", "std", &"a".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn an_existing_directory_is_refused_and_left_alone() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("taken");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("keep"), "mine").unwrap();
        let error = write_project(&dir, &project("taken", Lang::Rust).unwrap()).unwrap_err();
        assert!(error.to_string().contains("exists already"), "{error}");
        assert_eq!(fs::read_to_string(dir.join("keep")).unwrap(), "mine");
        assert!(!dir.join("Cargo.toml").exists());
    }
}
