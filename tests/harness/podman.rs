//! The container image `cargo xtask image` builds, run with Debian's podman.
//!
//! The image comes as an OCI archive (`SLUICE_IMAGE_ARCHIVE`, set by `cargo
//! xtask test`), loaded into a store of podman's own in a temporary
//! directory: tests never read or write the machine's image store, and
//! nothing outlives them. The flags are the ones that work in this sandbox:
//! the `vfs` storage driver, `runc` (crun fails on setrlimit and hybrid
//! cgroups here), host networking, and a containers.conf without default
//! ulimits.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use serde_json::Value;
use tempfile::TempDir;

/// The OCI archive of the image under test.
pub const IMAGE_ARCHIVE_ENV: &str = "SLUICE_IMAGE_ARCHIVE";

const CONTAINERS_CONF: &str = "\
[containers]
# podman's default nofile/nproc limits cannot be set in this sandbox.
default_ulimits = []
log_driver = \"k8s-file\"

[engine]
# No systemd here: no journald, no systemd cgroup manager.
cgroup_manager = \"cgroupfs\"
events_logger = \"file\"
";

/// podman with a store of its own and the image loaded in it.
pub struct Podman {
    store: Arc<Store>,
    image: String,
    archive: PathBuf,
}

/// The store's directory; removed when the last user is gone.
struct Store {
    dir: TempDir,
}

impl Store {
    fn args(&self) -> Vec<std::ffi::OsString> {
        let dir = self.dir.path();
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        for (flag, leaf) in [("--root", "root"), ("--runroot", "runroot"), ("--tmpdir", "tmp")] {
            args.push(flag.into());
            args.push(dir.join(leaf).into());
        }
        args.extend(["--storage-driver", "vfs", "--runtime", "runc"].map(Into::into));
        args
    }

    fn command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("podman");
        command.args(self.args()).env("CONTAINERS_CONF", self.dir.path().join("containers.conf"));
        command.stdin(std::process::Stdio::null()).kill_on_drop(true);
        command
    }

    /// For `Drop`, which cannot await.
    fn blocking_command(&self) -> std::process::Command {
        let mut command = std::process::Command::new("podman");
        command.args(self.args()).env("CONTAINERS_CONF", self.dir.path().join("containers.conf"));
        command.stdin(std::process::Stdio::null());
        command
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Containers left by a failed test: their shm mounts would keep
        // the directory from being removed.
        let _ = self.blocking_command().args(["rm", "--all", "--force", "--time", "0"]).output();
    }
}

impl Podman {
    /// Loads the image from `$SLUICE_IMAGE_ARCHIVE` into a fresh store.
    pub async fn load() -> Podman {
        let archive = std::env::var_os(IMAGE_ARCHIVE_ENV).map(PathBuf::from).unwrap_or_else(|| {
            panic!(
                "{IMAGE_ARCHIVE_ENV} is not set: run `cargo xtask test`, which builds the image and sets it, or \
                 `cargo xtask image` and then {IMAGE_ARCHIVE_ENV}=$PWD/target/image/sluice.oci.tar cargo test ..."
            )
        });
        assert!(
            archive.is_file(),
            "{IMAGE_ARCHIVE_ENV}={} is not a file: run `cargo xtask image` (or `cargo xtask test`)",
            archive.display()
        );
        let dir = tempfile::Builder::new().prefix("sluice-e2e-podman").tempdir().expect("creating a podman dir");
        std::fs::write(dir.path().join("containers.conf"), CONTAINERS_CONF).expect("writing containers.conf");
        let store = Arc::new(Store { dir });
        let mut podman = Podman { store, image: String::new(), archive };
        let loaded = podman.ok(&["load", "--quiet", "--input", &podman.archive.to_string_lossy()]).await;
        // "Loaded image: localhost/sluice:dev" (or "Loaded image(s): ...").
        podman.image = loaded
            .lines()
            .find_map(|line| line.split_once(": ").filter(|(head, _)| head.starts_with("Loaded image")))
            .map(|(_, name)| name.trim().to_string())
            .unwrap_or_else(|| panic!("podman load named no image: {loaded}"));
        podman
    }

    /// The loaded image's name.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The archive it was loaded from.
    pub fn archive(&self) -> &Path {
        &self.archive
    }

    /// Runs `podman ARGS` (with this store) and returns how it went.
    pub async fn output(&self, args: &[&str]) -> Output {
        self.store.command().args(args).output().await.expect("running podman (install it: `cargo xtask image`)")
    }

    /// Runs `podman ARGS`; panics with its output unless it succeeds.
    /// Returns its stdout.
    pub async fn ok(&self, args: &[&str]) -> String {
        let output = self.output(args).await;
        assert!(
            output.status.success(),
            "`podman {}` failed ({}):\n{}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `podman image inspect` of the image: its config, size and labels.
    pub async fn inspect_image(&self) -> Value {
        let json = self.ok(&["image", "inspect", &self.image]).await;
        let inspected: Value = serde_json::from_str(&json).expect("podman image inspect prints JSON");
        inspected[0].clone()
    }

    /// `podman run --detach --network host OPTIONS IMAGE ARGS`, named `name`;
    /// panics if podman cannot create or start it.
    pub async fn start(&self, name: &str, options: &[String], args: &[String]) -> Container {
        let mut command: Vec<String> = vec!["run".into(), "--detach".into(), "--name".into(), name.into()];
        command.extend(["--network".into(), "host".into()]);
        command.extend(options.iter().cloned());
        command.push(self.image.clone());
        command.extend(args.iter().cloned());
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        self.ok(&command).await;
        Container { store: self.store.clone(), name: name.to_string() }
    }
}

/// A container, removed (killed first) when dropped.
pub struct Container {
    store: Arc<Store>,
    name: String,
}

impl Container {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Everything it wrote to stdout and stderr so far.
    pub async fn logs(&self) -> String {
        let output = self.store.command().args(["logs", &self.name]).output().await.expect("running podman logs");
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
    }

    /// `podman inspect` of the container.
    pub async fn inspect(&self) -> Value {
        let output = self.store.command().args(["inspect", &self.name]).output().await.expect("running podman");
        assert!(output.status.success(), "podman inspect {}: {}", self.name, String::from_utf8_lossy(&output.stderr));
        let inspected: Value = serde_json::from_slice(&output.stdout).expect("podman inspect prints JSON");
        inspected[0].clone()
    }

    /// Whether its process is still running.
    pub async fn is_running(&self) -> bool {
        self.inspect().await["State"]["Running"] == true
    }

    /// The process id of its entrypoint, as this machine sees it.
    pub async fn pid(&self) -> u32 {
        let pid = self.inspect().await["State"]["Pid"].as_u64().expect("a running container has a pid");
        u32::try_from(pid).expect("a pid fits u32")
    }

    /// `podman stop`: SIGTERM, then SIGKILL after `seconds`. Returns the
    /// exit code.
    pub async fn stop(&self, seconds: u32) -> i64 {
        let output = self.store.command().args(["stop", "--time", &seconds.to_string(), &self.name]).output().await;
        let output = output.expect("running podman stop");
        assert!(output.status.success(), "podman stop {}: {}", self.name, String::from_utf8_lossy(&output.stderr));
        self.inspect().await["State"]["ExitCode"].as_i64().expect("a stopped container has an exit code")
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let mut command = self.store.blocking_command();
        if std::thread::panicking()
            && let Ok(logs) = self.store.blocking_command().args(["logs", &self.name]).output()
        {
            eprintln!(
                "--- container {} log ---\n{}{}--- end of container log ---",
                self.name,
                String::from_utf8_lossy(&logs.stdout),
                String::from_utf8_lossy(&logs.stderr)
            );
        }
        let _ = command.args(["rm", "--force", "--time", "0", &self.name]).output();
    }
}
