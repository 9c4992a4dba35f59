//! Registry credentials from a docker config.json and/or an explicit file.
//!
//! Files are read on each network operation, not once: a Kubernetes Secret
//! mounted as a volume is updated in place, and a rotated password should be
//! picked up without a restart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use crate::error::OciError;

/// Where registry credentials come from. An explicit `credentials_file` wins
/// over the docker config; with neither, access is anonymous.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// A docker `config.json` (its `auths`). `None` means the default,
    /// `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`, if it exists.
    pub docker_config: Option<PathBuf>,
    /// Explicit credentials, in any of these shapes:
    /// - a directory holding `username` and `password` files (a mounted
    ///   `kubernetes.io/basic-auth` Secret), used for every registry;
    /// - a docker config JSON (a mounted `.dockerconfigjson` Secret), used per registry host;
    /// - a text file `username:password`, used for every registry.
    pub credentials_file: Option<PathBuf>,
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
            return explicit(path, registry);
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
}

fn default_docker_config() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker").join("config.json"))
}

fn explicit(path: &Path, registry: &str) -> Result<RegistryAuth, OciError> {
    let bad = |reason: String| OciError::Credentials { path: path.to_path_buf(), reason };
    if path.is_dir() {
        let read = |name: &str| std::fs::read_to_string(path.join(name)).map_err(|e| bad(format!("{name}: {e}")));
        // Secret values often end with the newline `echo` added.
        let username = read("username")?.trim_end_matches(['\r', '\n']).to_string();
        let password = read("password")?.trim_end_matches(['\r', '\n']).to_string();
        return Ok(RegistryAuth::Basic(username, password));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    if text.trim_start().starts_with('{') {
        return from_docker_config(path, registry);
    }
    let line = text.trim_end_matches(['\r', '\n']);
    let (username, password) = line
        .split_once(':')
        .ok_or_else(|| bad("expected username:password, a docker config JSON, or a directory".into()))?;
    Ok(RegistryAuth::Basic(username.to_string(), password.to_string()))
}

/// Credentials handed over in memory, e.g. from a Kubernetes pull Secret.
#[derive(Clone, PartialEq, Eq)]
pub enum PullCredentials {
    Basic {
        username: String,
        password: String,
    },
    /// A docker `config.json` text; the entry for the registry's host is used.
    DockerConfigJson(String),
}

impl std::fmt::Debug for PullCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PullCredentials::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            PullCredentials::DockerConfigJson(_) => f.write_str("DockerConfigJson(<redacted>)"),
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
    let entry = config.auths.iter().find(|(key, _)| auth_key_host(key) == registry).map(|(_, entry)| entry);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(auth: RegistryAuth) -> (String, String) {
        match auth {
            RegistryAuth::Basic(u, p) => (u, p),
            other => panic!("expected basic auth, got {other:?}"),
        }
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
        let credentials = Credentials { docker_config: Some(path), credentials_file: None };
        assert_eq!(basic(credentials.for_registry("127.0.0.1:5000").unwrap()), ("alice".into(), "s3cret".into()));
        assert_eq!(basic(credentials.for_registry("ghcr.io").unwrap()), ("bob".into(), "pw".into()));
        assert_eq!(credentials.for_registry("quay.io").unwrap(), RegistryAuth::Anonymous);
    }

    #[test]
    fn an_explicit_file_wins_in_each_of_its_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let docker = dir.path().join("docker.json");
        std::fs::write(&docker, r#"{"auths": {"r.example": {"username": "from-docker", "password": "x"}}}"#).unwrap();

        let text = dir.path().join("userpass");
        std::fs::write(&text, "carol:pa:ss\n").unwrap();
        let credentials = Credentials { docker_config: Some(docker.clone()), credentials_file: Some(text) };
        assert_eq!(basic(credentials.for_registry("r.example").unwrap()), ("carol".into(), "pa:ss".into()));

        let secret = dir.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("username"), "dave\n").unwrap();
        std::fs::write(secret.join("password"), "pw\n").unwrap();
        let credentials = Credentials { docker_config: None, credentials_file: Some(secret) };
        assert_eq!(basic(credentials.for_registry("anything").unwrap()), ("dave".into(), "pw".into()));

        let credentials = Credentials { docker_config: None, credentials_file: Some(docker) };
        assert_eq!(basic(credentials.for_registry("r.example").unwrap()).0, "from-docker");
    }

    #[test]
    fn unreadable_or_malformed_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        let credentials = Credentials { docker_config: Some(missing.clone()), credentials_file: None };
        let err = credentials.for_registry("r").unwrap_err().to_string();
        assert!(err.contains("missing.json"), "{err}");

        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, "no colon here").unwrap();
        let credentials = Credentials { docker_config: None, credentials_file: Some(garbage) };
        assert!(matches!(credentials.for_registry("r"), Err(OciError::Credentials { .. })));
    }
}
