//! `sluice push`, `sluice pull`, `sluice inspect` and `sluice sign`:
//! plugins in OCI registries, signed as cosign signs images.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use sluice_oci::{Credentials, Progress, PublicKeys, PullPolicy, Reference, Registry, RegistryOptions, SigningKey};

/// How to reach registries; shared by the OCI subcommands.
#[derive(clap::Args)]
pub struct RegistryArgs {
    /// Reach this registry (HOST or HOST:PORT) over plain HTTP. Loopback
    /// registries always are. Repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST")]
    insecure_registries: Vec<String>,
    /// Also trust the CA certificates in this PEM file. Repeatable.
    #[arg(long = "ca-bundle", value_name = "PEM")]
    ca_bundles: Vec<PathBuf>,
    /// Docker config.json with registry credentials [default:
    /// $DOCKER_CONFIG/config.json or ~/.docker/config.json].
    #[arg(long, value_name = "PATH")]
    docker_config: Option<PathBuf>,
    /// Credentials that win over the docker config: a docker config JSON, a
    /// `username:password` file, or a directory with `username` and
    /// `password` files. The last two name no registry: they are offered
    /// only to the registries named with --credentials-registry.
    #[arg(long, value_name = "PATH")]
    credentials_file: Option<PathBuf>,
    /// A registry (HOST or HOST:PORT) the --credentials-file is for; needed
    /// unless that file is a docker config JSON, which names its own.
    /// Repeatable.
    #[arg(long = "credentials-registry", value_name = "HOST", requires = "credentials_file")]
    credentials_registries: Vec<String>,
    /// Where pulled modules are cached [default: $XDG_CACHE_HOME/sluice/oci].
    #[arg(long, env = "SLUICE_OCI_CACHE_DIR", value_name = "DIR")]
    oci_cache_dir: Option<PathBuf>,
    /// The largest module accepted on pull, in bytes.
    #[arg(long, default_value_t = sluice_oci::DEFAULT_MAX_MODULE_BYTES)]
    max_module_bytes: u64,
}

impl RegistryArgs {
    pub fn registry(&self) -> anyhow::Result<Registry> {
        let cache_dir = match &self.oci_cache_dir {
            Some(dir) => dir.clone(),
            None => crate::default_cache_dir("oci")
                .context("no --oci-cache-dir, and neither XDG_CACHE_HOME nor HOME is set")?,
        };
        let mut options = RegistryOptions::new(cache_dir);
        options.insecure_registries = self.insecure_registries.clone();
        options.ca_bundles = self.ca_bundles.clone();
        options.max_module_bytes = self.max_module_bytes;
        options.credentials = Credentials {
            docker_config: self.docker_config.clone(),
            credentials_file: self.credentials_file.clone(),
            registries: self.credentials_registries.clone(),
        };
        Ok(Registry::new(options)?)
    }
}

#[derive(clap::Args)]
pub struct PushArgs {
    /// The component to push (a .wasm file).
    file: PathBuf,
    /// Where to push it: REGISTRY/REPOSITORY:TAG.
    reference: String,
    /// A manifest annotation, e.g. org.opencontainers.image.source=https://…; repeatable.
    #[arg(long = "annotation", value_name = "KEY=VALUE", value_parser = key_value)]
    annotations: Vec<(String, String)>,
    /// Also sign the pushed manifest with this key, as `cosign sign --key`
    /// does (`cosign verify --key` accepts it): cosign's own `cosign.key`
    /// (its password from COSIGN_PASSWORD) or a PKCS#8 PEM EC P-256 key.
    #[arg(long, value_name = "KEY")]
    sign: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(clap::Args)]
pub struct SignArgs {
    /// REGISTRY/REPOSITORY:TAG (signs what it names now) or …@sha256:DIGEST.
    reference: String,
    /// cosign's `cosign.key` (its password from COSIGN_PASSWORD) or a PKCS#8
    /// PEM EC P-256 key.
    #[arg(long, value_name = "KEY")]
    key: PathBuf,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(clap::Args)]
pub struct PullArgs {
    /// REGISTRY/REPOSITORY:TAG, …@sha256:DIGEST, or both.
    reference: String,
    /// Write the module here (default: standard output, unless it is a terminal).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Refuse the module unless its sha256 is this.
    #[arg(long, value_name = "SHA256")]
    expected_sha256: Option<String>,
    /// Refuse the module unless a cosign signature of its manifest verifies
    /// under this public key (PEM, `cosign.pub`); repeatable, any of them.
    #[arg(long = "verify-key", value_name = "PUB")]
    verify_keys: Vec<PathBuf>,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(clap::Args)]
pub struct InspectArgs {
    /// REGISTRY/REPOSITORY:TAG, …@sha256:DIGEST, or both.
    reference: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

pub async fn push(args: PushArgs) -> anyhow::Result<()> {
    let reference: Reference = args.reference.parse()?;
    let module = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    // Before anything is pushed: a key that cannot be read stops the push.
    let key = args.sign.as_deref().map(signing_key).transpose()?;
    let registry = args.registry.registry()?;
    let annotations: BTreeMap<String, String> = args.annotations.into_iter().collect();
    let started = std::time::Instant::now();
    let pushed = registry
        .push(module, &reference, annotations, progress_on_terminal())
        .await
        .with_context(|| format!("pushing {} to {reference}", args.file.display()))?;
    tracing::debug!(elapsed = ?started.elapsed(), "pushed");
    println!("manifest {}", pushed.manifest_digest);
    println!("layer    {}", pushed.layer_digest);
    println!("size     {}", pushed.size);
    println!("pinned   {}/{}@{}", reference.registry(), reference.repository(), pushed.manifest_digest);
    if let Some(key) = key {
        let signed = registry
            .sign(&reference.with_digest(&pushed.manifest_digest), &key)
            .await
            .with_context(|| format!("signing {reference}"))?;
        println!("signature {}", signed.signature_reference);
    }
    Ok(())
}

pub async fn sign(args: SignArgs) -> anyhow::Result<()> {
    let reference: Reference = args.reference.parse()?;
    let key = signing_key(&args.key)?;
    let signed =
        args.registry.registry()?.sign(&reference, &key).await.with_context(|| format!("signing {reference}"))?;
    println!("manifest  {}", signed.manifest_digest);
    println!("signature {}", signed.signature_reference);
    Ok(())
}

/// A signing key file, decrypted with COSIGN_PASSWORD as cosign does.
fn signing_key(path: &std::path::Path) -> anyhow::Result<SigningKey> {
    use std::io::Read as _;
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(64 * 1024 + 1).read_to_end(&mut pem))
        .with_context(|| format!("reading the key {}", path.display()))?;
    let password = std::env::var_os("COSIGN_PASSWORD").map(|p| p.into_encoded_bytes());
    SigningKey::from_pem(&pem, password.as_deref()).map_err(|e| anyhow::anyhow!("the key {}: {e}", path.display()))
}

pub async fn pull(args: PullArgs) -> anyhow::Result<()> {
    let reference: Reference = args.reference.parse()?;
    if args.output.is_none() && std::io::stdout().is_terminal() {
        bail!("not writing a binary module to a terminal; use -o FILE");
    }
    let keys = if args.verify_keys.is_empty() {
        None
    } else {
        let pems = args
            .verify_keys
            .iter()
            .map(|path| std::fs::read(path).with_context(|| format!("reading the key {}", path.display())))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Some(PublicKeys::from_pems(&pems).map_err(|e| anyhow::anyhow!("--verify-key: {e}"))?)
    };
    let registry = args.registry.registry()?;
    // The command line wants what the tag names now, not what it named last time.
    let pulled = registry
        .pull_verified(&reference, PullPolicy::Always, args.expected_sha256.as_deref(), None, keys.as_ref())
        .await?;
    match &args.output {
        Some(path) => std::fs::write(path, &pulled.module).with_context(|| format!("writing {}", path.display()))?,
        None => std::io::stdout().write_all(&pulled.module).context("writing the module to standard output")?,
    }
    eprintln!(
        "pulled {reference}: manifest {}, module {} ({} bytes, {} layout, from {:?})",
        pulled.manifest_digest,
        pulled.module_digest,
        pulled.module.len(),
        pulled.format,
        pulled.origin
    );
    Ok(())
}

pub async fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let reference: Reference = args.reference.parse()?;
    let inspection = args.registry.registry()?.inspect(&reference).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&inspection)?);
        return Ok(());
    }
    let mut out = String::new();
    let mut line = |key: &str, value: String| out.push_str(&format!("{key:<12}{value}\n"));
    line("reference", inspection.reference.clone());
    line(
        "manifest",
        format!(
            "{} ({})",
            inspection.manifest_digest,
            inspection.manifest_media_type.as_deref().unwrap_or("no mediaType")
        ),
    );
    if inspection.image_manifest_digest != inspection.manifest_digest {
        line("image", format!("{} (chosen from the index)", inspection.image_manifest_digest));
    }
    if let Some(artifact_type) = &inspection.artifact_type {
        line("artifact", artifact_type.clone());
    }
    line("format", inspection.format.to_string());
    let c = &inspection.config;
    line("config", format!("{} {} {} bytes", c.media_type, c.digest, c.size));
    for layer in &inspection.layers {
        line("layer", format!("{} {} {} bytes", layer.media_type, layer.digest, layer.size));
    }
    line("module", format!("{} {} bytes", inspection.module_digest, inspection.module_size));
    for (key, value) in &inspection.annotations {
        line("annotation", format!("{key}={value}"));
    }
    for import in &inspection.component.imports {
        line("import", import.clone());
    }
    for export in &inspection.component.exports {
        line("export", export.clone());
    }
    print!("{out}");
    Ok(())
}

/// A percentage on stderr while pushing, for a person watching a terminal.
fn progress_on_terminal() -> Option<Progress> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    Some(Arc::new(|sent, total| {
        let percent = (sent * 100).checked_div(total).unwrap_or(100);
        eprint!("\rpushing {percent:>3}% ({:.1}/{:.1} MB)", sent as f64 / 1e6, total as f64 / 1e6);
        if sent >= total {
            eprintln!();
        }
    }))
}

fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}
