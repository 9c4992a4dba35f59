//! Registry credentials from a docker config.json and/or an explicit file.
//!
//! Every credential is bound to registry hosts, as docker's `config.json`
//! binds each of its entries: a credential is never offered to a host that
//! a plugin reference happens to name. A docker config names its hosts; a
//! `username:password` file or a basic-auth directory names none, so it is
//! used only for the registries listed with it (skopeo's `--creds` likewise
//! applies to the one image named with it), and refused with none listed.
//!
//! Files are read on each network operation, not once: a Kubernetes Secret
//! mounted as a volume is updated in place, and a rotated password should be
//! picked up without a restart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use crate::digest::sha256_digest;
use crate::error::OciError;

/// Where registry credentials come from. An explicit `credentials_file` wins
/// over the docker config; with neither, access is anonymous.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// A docker `config.json` (its `auths`). `None` means the default,
    /// `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`, if it exists.
    pub docker_config: Option<PathBuf>,
    /// Explicit credentials, in any of these shapes:
    /// - a docker config JSON (a mounted `.dockerconfigjson` Secret), each
    ///   entry for its own registry host;
    /// - a directory holding `username` and `password` files (a mounted
    ///   `kubernetes.io/basic-auth` Secret), for the hosts in `registries`;
    /// - a text file `username:password`, for the hosts in `registries`.
    pub credentials_file: Option<PathBuf>,
    /// The registries (`host` or `host:port`) `credentials_file` is for.
    /// Required for the two shapes that name no host; for a docker config
    /// JSON, a further restriction when not empty.
    pub registries: Vec<String>,
}

#[derive(Deserialize, Default)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, DockerAuth>,
}

#[derive(Deserialize, Default)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl Credentials {
    /// The credentials to present to `registry` (`host[:port]`).
    pub(crate) fn for_registry(&self, registry: &str) -> Result<RegistryAuth, OciError> {
        if let Some(path) = &self.credentials_file {
            return explicit(path, registry, &self.registries);
        }
        let path = match &self.docker_config {
            Some(path) => path.clone(),
            None => match default_docker_config() {
                Some(path) if path.is_file() => path,
                _ => return Ok(RegistryAuth::Anonymous),
            },
        };
        from_docker_config(&path, registry)
    }

    /// Refuses, before any pull, a `credentials_file` that names no registry
    /// when none is listed. A file that cannot be read yet is left to the
    /// first pull, which reports it.
    pub(crate) fn check(&self) -> Result<(), OciError> {
        match &self.credentials_file {
            Some(path) if self.registries.is_empty() && names_no_registry(path) == Some(true) => Err(unbound(path)),
            _ => Ok(()),
        }
    }
}

fn default_docker_config() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker").join("config.json"))
}

/// Whether `path` is one of the shapes that name no registry host (a
/// directory, or text that is not JSON); `None` if it cannot be read.
fn names_no_registry(path: &Path) -> Option<bool> {
    if path.is_dir() {
        return Some(true);
    }
    let text = std::fs::read_to_string(path).ok()?;
    Some(!text.trim_start().starts_with('{'))
}

fn unbound(path: &Path) -> OciError {
    OciError::Credentials {
        path: path.to_path_buf(),
        reason: "a username:password file or a username/password directory names no registry, and credentials \
                 are only offered to the registries they are for: name them with --credentials-registry HOST \
                 (repeatable), or use a docker config JSON, whose entries name their hosts"
            .into(),
    }
}

fn explicit(path: &Path, registry: &str, registries: &[String]) -> Result<RegistryAuth, OciError> {
    let bad = |reason: String| OciError::Credentials { path: path.to_path_buf(), reason };
    let text = if path.is_dir() { None } else { Some(std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?) };
    // A docker config names its hosts; the other shapes name none.
    let docker_config = text.as_deref().is_some_and(|text| text.trim_start().starts_with('{'));
    if !docker_config && registries.is_empty() {
        return Err(unbound(path));
    }
    if !registries.is_empty() && !registries.iter().any(|r| same_host(auth_key_host(r), registry)) {
        return Ok(RegistryAuth::Anonymous);
    }
    match text {
        Some(text) if docker_config => docker_config_entry(&text, registry).map_err(bad),
        Some(text) => {
            let line = text.trim_end_matches(['\r', '\n']);
            let (username, password) = line
                .split_once(':')
                .ok_or_else(|| bad("expected username:password, a docker config JSON, or a directory".into()))?;
            Ok(RegistryAuth::Basic(username.to_string(), password.to_string()))
        }
        None => {
            let read = |name: &str| std::fs::read_to_string(path.join(name)).map_err(|e| bad(format!("{name}: {e}")));
            // Secret values often end with the newline `echo` added.
            let username = read("username")?.trim_end_matches(['\r', '\n']).to_string();
            let password = read("password")?.trim_end_matches(['\r', '\n']).to_string();
            Ok(RegistryAuth::Basic(username, password))
        }
    }
}

/// Who a pull presents itself as, for the cache's access records:
/// `anonymous`, or a hash of the credential and the registry it goes to
/// (kubelet likewise records a hash of a pull Secret, never the Secret).
pub(crate) fn identity(registry: &str, auth: &RegistryAuth) -> String {
    let secret = match auth {
        RegistryAuth::Anonymous => return ANONYMOUS.to_string(),
        RegistryAuth::Basic(username, password) => format!("basic\0{username}\0{password}"),
        RegistryAuth::Bearer(token) => format!("bearer\0{token}"),
    };
    sha256_digest(format!("sluice-oci-credential\0{registry}\0{secret}").as_bytes())
}

/// The identity of a pull without credentials.
pub(crate) const ANONYMOUS: &str = "anonymous";

/// Credentials handed over in memory, e.g. from a Kubernetes pull Secret,
/// for one plugin's own reference.
#[derive(Clone, PartialEq, Eq)]
pub enum PullCredentials {
    /// A `kubernetes.io/basic-auth` Secret: offered to the registry of the
    /// reference it is handed over with, which its owner chose.
    Basic { username: String, password: String },
    /// A docker `config.json` text; the entry for the registry's host is used.
    DockerConfigJson(String),
    /// Nothing is offered: not the credentials the registry client was
    /// given for its own use.
    Anonymous,
}

impl std::fmt::Debug for PullCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PullCredentials::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            PullCredentials::DockerConfigJson(_) => f.write_str("DockerConfigJson(<redacted>)"),
            PullCredentials::Anonymous => f.write_str("Anonymous"),
        }
    }
}

impl PullCredentials {
    pub(crate) fn for_registry(&self, registry: &str) -> Result<RegistryAuth, OciError> {
        match self {
            PullCredentials::Basic { username, password } => {
                Ok(RegistryAuth::Basic(username.clone(), password.clone()))
            }
            PullCredentials::DockerConfigJson(text) => docker_config_entry(text, registry)
                .map_err(|reason| OciError::Credentials { path: PathBuf::from("<pull secret>"), reason }),
            PullCredentials::Anonymous => Ok(RegistryAuth::Anonymous),
        }
    }
}

fn from_docker_config(path: &Path, registry: &str) -> Result<RegistryAuth, OciError> {
    let bad = |reason: String| OciError::Credentials { path: path.to_path_buf(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    docker_config_entry(&text, registry).map_err(bad)
}

fn docker_config_entry(text: &str, registry: &str) -> Result<RegistryAuth, String> {
    let bad = |reason: String| reason;
    let config: DockerConfig = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    // Keys may be written as URLs ("https://host/v1/") as well as bare hosts.
    let entry = config.auths.iter().find(|(key, _)| same_host(auth_key_host(key), registry)).map(|(_, entry)| entry);
    let Some(entry) = entry else { return Ok(RegistryAuth::Anonymous) };
    if let (Some(username), Some(password)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(username.clone(), password.clone()));
    }
    if let Some(auth) = &entry.auth {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|e| bad(format!("auths.{registry}.auth is not base64: {e}")))?;
        let decoded = String::from_utf8(decoded).map_err(|_| bad(format!("auths.{registry}.auth is not UTF-8")))?;
        let (username, password) =
            decoded.split_once(':').ok_or_else(|| bad(format!("auths.{registry}.auth is not username:password")))?;
        return Ok(RegistryAuth::Basic(username.to_string(), password.to_string()));
    }
    Ok(RegistryAuth::Anonymous)
}

fn auth_key_host(key: &str) -> &str {
    let key = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

/// Host names are case-insensitive.
fn same_host(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(auth: RegistryAuth) -> (String, String) {
        match auth {
            RegistryAuth::Basic(u, p) => (u, p),
            other => panic!("expected basic auth, got {other:?}"),
        }
    }

    fn with(docker_config: Option<PathBuf>, credentials_file: Option<PathBuf>, registries: &[&str]) -> Credentials {
        Credentials { docker_config, credentials_file, registries: registries.iter().map(|r| r.to_string()).collect() }
    }

    #[test]
    fn reads_docker_config_by_host_in_both_spellings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let encoded = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{encoded}"}},
                   "https://ghcr.io/v1/": {{"username": "bob", "password": "pw"}}}}}}"#
            ),
        )
        .unwrap();
        let credentials = with(Some(path), None, &[]);
        assert_eq!(basic(credentials.for_registry("127.0.0.1:5000").unwrap()), ("alice".into(), "s3cret".into()));
        assert_eq!(basic(credentials.for_registry("ghcr.io").unwrap()), ("bob".into(), "pw".into()));
        assert_eq!(basic(credentials.for_registry("GHCR.io").unwrap()), ("bob".into(), "pw".into()));
        assert_eq!(credentials.for_registry("quay.io").unwrap(), RegistryAuth::Anonymous);
    }

    #[test]
    fn an_explicit_file_wins_in_each_of_its_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let docker = dir.path().join("docker.json");
        std::fs::write(&docker, r#"{"auths": {"r.example": {"username": "from-docker", "password": "x"}}}"#).unwrap();

        let text = dir.path().join("userpass");
        std::fs::write(&text, "carol:pa:ss\n").unwrap();
        let credentials = with(Some(docker.clone()), Some(text), &["r.example"]);
        assert_eq!(basic(credentials.for_registry("r.example").unwrap()), ("carol".into(), "pa:ss".into()));

        let secret = dir.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("username"), "dave\n").unwrap();
        std::fs::write(secret.join("password"), "pw\n").unwrap();
        let credentials = with(None, Some(secret), &["r.example:5000"]);
        assert_eq!(basic(credentials.for_registry("r.example:5000").unwrap()), ("dave".into(), "pw".into()));

        let credentials = with(None, Some(docker), &[]);
        assert_eq!(basic(credentials.for_registry("r.example").unwrap()).0, "from-docker");
    }

    /// A credential that names no host is offered to the listed registries
    /// only, and refused outright with none listed; a listed registry also
    /// narrows a docker config.
    #[test]
    fn credentials_go_only_to_the_registries_they_are_for() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("userpass");
        std::fs::write(&text, "carol:pw\n").unwrap();
        let secret = dir.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("username"), "dave").unwrap();
        std::fs::write(secret.join("password"), "pw").unwrap();
        for file in [&text, &secret] {
            let unbound = with(None, Some(file.clone()), &[]);
            let error = unbound.check().unwrap_err().to_string();
            assert!(error.contains("--credentials-registry"), "{error}");
            assert!(unbound.for_registry("evil.example").is_err(), "{}", file.display());

            let bound = with(None, Some(file.clone()), &["private.example:5000", "https://other.example"]);
            bound.check().unwrap();
            assert!(matches!(bound.for_registry("private.example:5000").unwrap(), RegistryAuth::Basic(..)));
            assert!(matches!(bound.for_registry("other.example").unwrap(), RegistryAuth::Basic(..)));
            for elsewhere in ["evil.example", "private.example", "private.example:5001"] {
                assert_eq!(bound.for_registry(elsewhere).unwrap(), RegistryAuth::Anonymous, "{elsewhere}");
            }
        }
        let docker = dir.path().join("docker.json");
        let auths = r#"{"auths": {"a.example": {"username": "a", "password": "x"}, "b.example": {"username": "b", "password": "y"}}}"#;
        std::fs::write(&docker, auths).unwrap();
        let narrowed = with(None, Some(docker), &["a.example"]);
        narrowed.check().unwrap();
        assert_eq!(basic(narrowed.for_registry("a.example").unwrap()).0, "a");
        assert_eq!(narrowed.for_registry("b.example").unwrap(), RegistryAuth::Anonymous);
    }

    #[test]
    fn identities_tell_credentials_apart_and_hide_them() {
        let basic = |u: &str, p: &str| RegistryAuth::Basic(u.into(), p.into());
        assert_eq!(identity("r", &RegistryAuth::Anonymous), ANONYMOUS);
        let one = identity("r", &basic("u", "pw"));
        assert!(!one.contains("pw") && one.starts_with("sha256:"), "{one}");
        assert_eq!(one, identity("r", &basic("u", "pw")));
        for other in
            [identity("r", &basic("u", "pw2")), identity("r", &basic("u2", "pw")), identity("s", &basic("u", "pw"))]
        {
            assert_ne!(one, other);
        }
    }

    #[test]
    fn unreadable_or_malformed_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        let credentials = with(Some(missing.clone()), None, &[]);
        let err = credentials.for_registry("r").unwrap_err().to_string();
        assert!(err.contains("missing.json"), "{err}");

        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, "no colon here").unwrap();
        let credentials = with(None, Some(garbage), &["r"]);
        assert!(matches!(credentials.for_registry("r"), Err(OciError::Credentials { .. })));
    }
}
