//! The real cosign CLI, for signature interop tests: key pairs made by
//! `cosign generate-key-pair`, artifacts signed by `cosign sign --key` and
//! checked by `cosign verify --key`, against the tests' loopback registry.
//!
//! Nothing here can reach Fulcio or Rekor, so every run is key-based and
//! offline: `--tlog-upload=false` to sign, `--insecure-ignore-tlog=true` to
//! verify, plain HTTP to the loopback registry, and a `HOME` and `TUF_ROOT`
//! of its own so no run reads or writes the user's sigstore state.
//!
//! `cargo xtask test` builds the binary from the Go module proxy once per
//! machine (crates/xtask/src/gotool.rs, `COSIGN`) and passes its path in
//! `SLUICE_COSIGN_BIN`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tempfile::TempDir;

/// Set by `cargo xtask test`.
const BIN_ENV: &str = "SLUICE_COSIGN_BIN";
/// The binary crates/xtask/src/gotool.rs builds, under the cache directory
/// (keep in sync: `COSIGN` there).
const CACHE_PATH: &str = "sluice/cosign/cosign-v2.6.5/bin/cosign";
const BUILD_HINT: &str = "run `cargo xtask test` (it builds cosign from the Go module proxy, once)";
/// One cosign command; signing and verifying on loopback take well under a second.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The cosign binary, and a home directory of its own.
pub struct Cosign {
    binary: PathBuf,
    home: TempDir,
}

/// A key pair `cosign generate-key-pair` wrote: `<name>.key` (encrypted
/// with `password`) and `<name>.pub`.
#[derive(Clone, Debug)]
pub struct CosignKeyPair {
    pub private: PathBuf,
    pub public: PathBuf,
    pub password: String,
}

/// How a cosign command ended.
#[derive(Debug)]
pub struct CosignRun {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl CosignRun {
    /// Panics with the output unless the command succeeded.
    pub fn assert_success(&self, what: &str) -> &CosignRun {
        assert!(self.success, "{what} failed:\n--- stdout ---\n{}--- stderr ---\n{}", self.stdout, self.stderr);
        self
    }
}

impl Cosign {
    pub fn new() -> Cosign {
        let home = tempfile::Builder::new().prefix("sluice-e2e-cosign").tempdir().expect("creating a cosign home");
        Cosign { binary: binary(), home }
    }

    /// A new key pair in this cosign's home, encrypted with `password`.
    pub async fn generate_key_pair(&self, name: &str, password: &str) -> CosignKeyPair {
        let prefix = self.home.path().join(name);
        let prefix_text = prefix.display().to_string();
        self.run(&["generate-key-pair", "--output-key-prefix", &prefix_text], Some(password))
            .await
            .assert_success("cosign generate-key-pair");
        let pair = CosignKeyPair {
            private: prefix.with_extension("key"),
            public: prefix.with_extension("pub"),
            password: password.to_string(),
        };
        assert!(pair.private.is_file() && pair.public.is_file(), "cosign wrote no key pair at {prefix_text}.*");
        pair
    }

    /// `cosign sign --key`, offline: the classic `.sig` layout in the
    /// reference's repository, no transparency log.
    pub async fn sign(&self, key: &CosignKeyPair, reference: &str) -> CosignRun {
        let key_path = key.private.display().to_string();
        self.run(
            &[
                "sign",
                "--key",
                &key_path,
                "--tlog-upload=false",
                "--allow-http-registry",
                "--allow-insecure-registry",
                "--yes",
                reference,
            ],
            Some(&key.password),
        )
        .await
    }

    /// `cosign verify --key`, offline (no transparency log to check).
    pub async fn verify(&self, public_key: &Path, reference: &str) -> CosignRun {
        let key_path = public_key.display().to_string();
        self.run(
            &[
                "verify",
                "--key",
                &key_path,
                "--insecure-ignore-tlog=true",
                "--allow-http-registry",
                "--allow-insecure-registry",
                reference,
            ],
            None,
        )
        .await
    }

    /// Runs cosign with `args`, `COSIGN_PASSWORD` set to `password` if
    /// given, straight to loopback whatever proxy the machine has.
    pub async fn run(&self, args: &[&str], password: Option<&str>) -> CosignRun {
        let mut command = tokio::process::Command::new(&self.binary);
        command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        for proxy in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
            command.env_remove(proxy);
        }
        command
            .env("NO_PROXY", "*")
            .env("HOME", self.home.path())
            .env("TUF_ROOT", self.home.path().join("tuf"))
            .env("DOCKER_CONFIG", self.home.path().join("docker"))
            .env_remove("COSIGN_PASSWORD")
            .env_remove("COSIGN_EXPERIMENTAL")
            .current_dir(self.home.path());
        if let Some(password) = password {
            command.env("COSIGN_PASSWORD", password);
        }
        let output = tokio::time::timeout(RUN_TIMEOUT, command.output())
            .await
            .unwrap_or_else(|_| panic!("cosign {args:?} did not finish within {RUN_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("running {}: {e}", self.binary.display()));
        CosignRun {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Default for Cosign {
    fn default() -> Self {
        Cosign::new()
    }
}

/// `$SLUICE_COSIGN_BIN`, else the path under the cache directory.
fn binary() -> PathBuf {
    crate::cached_tool(BIN_ENV, CACHE_PATH, BUILD_HINT)
}
