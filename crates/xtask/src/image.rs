//! `cargo xtask image`: the container image, built here with Debian's
//! buildah as the repository's `Containerfile` builds it elsewhere (no base
//! image can be pulled here, so no `buildah bud` of the Containerfile): a
//! static `x86_64-unknown-linux-musl` release binary in an image `FROM
//! scratch`, with CA certificates, a passwd/group entry for uid 65532, an
//! empty `/var/cache/sluice` owned by it and `/tmp`. Keep the two in step.
//!
//! buildah's storage is ours, under `target/containers/`, so neither this
//! task nor the tests read or write the machine's global image store. The
//! image is also written as an OCI archive, `target/image/sluice.oci.tar`,
//! which `cargo xtask test` hands to the tests (`SLUICE_IMAGE_ARCHIVE`).
//!
//! The release build is cargo's, cached in target/ like any other; the
//! image is made again only when its inputs (the binary, the CA bundle,
//! this recipe) hash differently from the stamp the last build left.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::toolchain::{self, absolute};
use crate::{cargo, output, run, step, target_dir};

/// The target of the static binary the image holds.
pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

/// The environment variable that gives the tests the OCI archive.
pub const ARCHIVE_ENV: &str = "SLUICE_IMAGE_ARCHIVE";

/// The image's name in our buildah storage (and in the archive).
pub const IMAGE_NAME: &str = "localhost/sluice:dev";

/// buildah and podman (which the tests run the image with) and runc (the
/// runtime that works here; crun fails on setrlimit), musl-gcc for the C in
/// ring and mimalloc, and objcopy.
const PACKAGES: &[&str] = &["buildah", "podman", "runc", "musl-tools", "binutils"];

/// The user the gateway runs as: distroless's `nonroot`, which
/// deploy/kubernetes/deployment.yaml's securityContext names too.
const UID: u32 = 65532;

/// The CA bundle the gateway trusts (rustls-native-certs reads it), from the
/// build machine's ca-certificates package.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The working container's name, so a run that failed half-way is cleaned
/// up by the next one.
const WORKING_CONTAINER: &str = "sluice-image-build";

/// Bump when the recipe below changes, so the stamp no longer matches.
const RECIPE_VERSION: u32 = 2;

#[derive(clap::Args)]
pub struct Args {
    /// Also push the image to REGISTRY/REPO:TAG and print its digest (TLS is
    /// not required for a loopback registry).
    #[arg(long, value_name = "REFERENCE")]
    push: Option<String>,
}

pub fn main(args: Args) -> Result<()> {
    build()?;
    if let Some(reference) = args.push {
        push(&reference)?;
    }
    Ok(())
}

/// Builds the binary and, if it changed, the image; returns the absolute
/// path of the OCI archive.
pub fn build() -> Result<PathBuf> {
    step("Setup: the musl target and the container tools");
    toolchain::ensure_debian_packages(PACKAGES)?;
    toolchain::ensure_wasm_targets(&[MUSL_TARGET])?;

    step(&format!("Building the static release binary ({MUSL_TARGET})"));
    let started = Instant::now();
    run(cargo().args(["build", "--release", "--target", MUSL_TARGET, "-p", "sluice"]))?;
    println!("built in {:.1} s", started.elapsed().as_secs_f64());
    let built = target_dir().join(MUSL_TARGET).join("release").join("sluice");

    let dir = absolute(&target_dir().join("image"))?;
    fs::create_dir_all(&dir)?;
    // The release profile keeps line tables for backtraces in tests and
    // benches: 153 MiB of the binary's 206. The image drops them and keeps
    // the symbols, so a panic's backtrace still names its functions.
    let binary = dir.join("sluice");
    run(Command::new("objcopy").arg("--strip-debug").arg(&built).arg(&binary))?;
    let archive = dir.join("sluice.oci.tar");
    let stamp_path = dir.join("stamp");
    let source = Source::read()?;
    let stamp = stamp(&binary, &source)?;

    step("Building the container image");
    let buildah = Buildah::new()?;
    let current = fs::read_to_string(&stamp_path).is_ok_and(|old| old == stamp)
        && archive.is_file()
        && buildah
            .command()
            .args(["inspect", "--type", "image", IMAGE_NAME])
            .output()
            .is_ok_and(|o| o.status.success());
    if current {
        println!("{IMAGE_NAME}: up to date (the binary and the recipe are unchanged)");
    } else {
        let _ = fs::remove_file(&stamp_path);
        buildah.build(&binary, &dir, &source)?;
        buildah.write_archive(&archive)?;
        fs::write(&stamp_path, &stamp)?;
    }
    print_sizes(&buildah, &binary, &archive)?;
    println!("{ARCHIVE_ENV}={}", archive.display());
    Ok(archive)
}

/// Pushes the built image to `reference` and prints the digest the registry
/// names it by.
pub fn push(reference: &str) -> Result<()> {
    step(&format!("Pushing {IMAGE_NAME} to {reference}"));
    let reference = reference.strip_prefix("docker://").unwrap_or(reference);
    let digest_file = tempfile::NamedTempFile::new()?;
    let mut cmd = Buildah::new()?.command();
    cmd.args(["push", "--digestfile"]).arg(digest_file.path());
    if is_loopback(reference) {
        cmd.arg("--tls-verify=false");
    }
    run(cmd.arg(IMAGE_NAME).arg(format!("docker://{reference}")))?;
    let digest = fs::read_to_string(digest_file.path())?.trim().to_owned();
    if !digest.starts_with("sha256:") {
        bail!("buildah wrote no digest (got {digest:?})");
    }
    let repository = reference.rsplit_once(':').filter(|(_, tag)| !tag.contains('/')).map_or(reference, |(r, _)| r);
    println!("pushed {reference}\ndigest {digest}\n{repository}@{digest}");
    Ok(())
}

/// Whether a reference's registry is this machine, which serves plain HTTP.
fn is_loopback(reference: &str) -> bool {
    let host = reference.split('/').next().unwrap_or_default();
    let host = host.rsplit_once(':').filter(|(_, port)| port.parse::<u16>().is_ok()).map_or(host, |(h, _)| h);
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

/// What the image says of the source it was built from.
struct Source {
    /// The commit, or `unknown` outside a checkout.
    revision: String,
    /// The commit's time: the image's creation time and every file's mtime,
    /// so the same binary makes the same image, byte for byte.
    epoch: u64,
    created: String,
}

impl Source {
    fn read() -> Result<Source> {
        let git = |args: &[&str]| output(Command::new("git").args(args)).ok().map(|out| out.trim().to_owned());
        let revision = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
        let epoch = git(&["log", "-1", "--format=%ct"]).and_then(|t| t.parse().ok()).unwrap_or(0);
        let created = git(&["log", "-1", "--format=%cI"]).unwrap_or_else(|| "1970-01-01T00:00:00Z".into());
        Ok(Source { revision, epoch, created })
    }

    fn labels(&self) -> Vec<(&'static str, String)> {
        vec![
            ("org.opencontainers.image.title", "sluice".into()),
            (
                "org.opencontainers.image.description",
                "An AI gateway whose policies are WebAssembly component plugins".into(),
            ),
            ("org.opencontainers.image.version", env!("CARGO_PKG_VERSION").into()),
            ("org.opencontainers.image.revision", self.revision.clone()),
            ("org.opencontainers.image.created", self.created.clone()),
            ("org.opencontainers.image.licenses", env!("CARGO_PKG_LICENSE").into()),
        ]
    }
}

/// The hash of everything the image is made of.
fn stamp(binary: &Path, source: &Source) -> Result<String> {
    let mut hasher = Sha256::new();
    for path in [binary, Path::new(CA_BUNDLE)] {
        hasher.update(fs::read(path).with_context(|| format!("cannot read {}", path.display()))?);
    }
    hasher.update(format!("recipe {RECIPE_VERSION} {} {:?}", source.epoch, source.labels()));
    Ok(format!("{}\n", hex::encode(hasher.finalize())))
}

/// buildah with its storage under target/containers/.
struct Buildah {
    root: PathBuf,
    runroot: PathBuf,
}

impl Buildah {
    fn new() -> Result<Buildah> {
        let base = absolute(&target_dir().join("containers"))?;
        Ok(Buildah { root: base.join("storage"), runroot: base.join("runroot") })
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new("buildah");
        cmd.arg("--root").arg(&self.root).arg("--runroot").arg(&self.runroot).args(["--storage-driver", "vfs"]);
        // No `buildah run` here, but should one be added: no namespaces
        // needed beyond a chroot, which is what works in this sandbox.
        cmd.env("BUILDAH_ISOLATION", "chroot");
        cmd
    }

    fn build(&self, binary: &Path, dir: &Path, source: &Source) -> Result<()> {
        // The files that are not the binary or the CA bundle.
        let context = dir.join("context");
        if context.exists() {
            fs::remove_dir_all(&context)?;
        }
        fs::create_dir_all(context.join("empty"))?;
        fs::write(context.join("passwd"), format!("sluice:x:{UID}:{UID}:sluice:/nonexistent:/sbin/nologin\n"))?;
        fs::write(context.join("group"), format!("sluice:x:{UID}:\n"))?;

        // Left behind by a run that failed half-way, if any.
        let _ = self.command().args(["rm", WORKING_CONTAINER]).output();
        let ctr = output(self.command().args(["from", "--name", WORKING_CONTAINER, "scratch"]))?.trim().to_owned();
        let copy = |options: &[&str], from: &Path, to: &str| {
            run(self.command().arg("copy").args(options).arg(&ctr).arg(from).arg(to))
        };
        copy(&["--chmod", "0755"], binary, "/sluice")?;
        copy(&["--chmod", "0644"], Path::new(CA_BUNDLE), CA_BUNDLE)?;
        copy(&["--chmod", "0644"], &context.join("passwd"), "/etc/passwd")?;
        copy(&["--chmod", "0644"], &context.join("group"), "/etc/group")?;
        // The only place the gateway writes (compiled plugins, pulled
        // modules): a volume, owned by the user so a fresh named volume is.
        // Parents first, root's: a copy creates missing parents with the
        // copied directory's owner.
        let owner = format!("{UID}:{UID}");
        copy(&["--chmod", "0755"], &context.join("empty"), "/var/cache")?;
        copy(&["--chown", &owner, "--chmod", "0755"], &context.join("empty"), "/var/cache/sluice")?;
        copy(&["--chmod", "1777"], &context.join("empty"), "/tmp")?;

        let mut config = self.command();
        config.args(["config", "--created-by", "cargo xtask image", "--os", "linux", "--arch", "amd64"]);
        config.args(["--user", &owner, "--entrypoint", r#"["/sluice"]"#, "--workingdir", "/"]);
        // The default --cache-dir and --oci-cache-dir are
        // $XDG_CACHE_HOME/sluice/{compiled,oci}: on the volume.
        config.args(["--env", "XDG_CACHE_HOME=/var/cache", "--volume", "/var/cache/sluice"]);
        // Data plane, admin, probes, metrics, as deploy/kubernetes has them.
        for port in ["8080/tcp", "9901/tcp", "9902/tcp", "9903/tcp"] {
            config.args(["--port", port]);
        }
        for (name, value) in source.labels() {
            config.arg("--label").arg(format!("{name}={value}"));
        }
        run(config.arg(&ctr))?;
        run(self
            .command()
            .args(["commit", "--rm", "--quiet", "--identity-label=false", "--timestamp"])
            .arg(source.epoch.to_string())
            .arg(&ctr)
            .arg(IMAGE_NAME))
    }

    fn write_archive(&self, archive: &Path) -> Result<()> {
        // Written aside and renamed: a reader never sees half an archive.
        let partial = archive.with_extension("tar.partial");
        let _ = fs::remove_file(&partial);
        run(self
            .command()
            .args(["push", "--quiet", IMAGE_NAME])
            .arg(format!("oci-archive:{}:{IMAGE_NAME}", partial.display())))?;
        fs::rename(&partial, archive)?;
        Ok(())
    }
}

fn print_sizes(buildah: &Buildah, binary: &Path, archive: &Path) -> Result<()> {
    let size = output(buildah.command().args(["images", "--noheading", "--format", "{{.Size}}", IMAGE_NAME]))?;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!(
        "image {IMAGE_NAME}: {} unpacked, {:.1} MiB compressed ({}); binary {:.1} MiB",
        size.trim(),
        mib(fs::metadata(archive)?.len()),
        archive.display(),
        mib(fs::metadata(binary)?.len()),
    );
    Ok(())
}
