//! Leader election under a network partition: a leader that can no longer
//! reach the API server stops writing status before its Lease can expire
//! for the other replicas, so two replicas never write at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_tests::{Gateway, KubeCluster, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// A TCP relay to the API server that can be cut: once `partitioned`, it
/// stops passing bytes either way but keeps every connection open, so
/// requests hang as they do behind a broken network rather than failing.
async fn partitionable_relay(upstream: String, partitioned: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else { return };
            let Ok(server) = TcpStream::connect(&upstream).await else { continue };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(pipe(client_read, server_write, partitioned.clone()));
            tokio::spawn(pipe(server_read, client_write, partitioned.clone()));
        }
    });
    format!("https://{addr}")
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    partitioned: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else { return };
        if n == 0 {
            return;
        }
        if partitioned.load(Ordering::Acquire) {
            // Dropped on the floor, the connection left open.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn wait_for_log(gateway: &Gateway, line: &str, within: Duration) -> Option<Instant> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if gateway.log().contains(line) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test]
async fn a_partitioned_leader_stops_writing_before_its_lease_can_expire() {
    let cluster = KubeCluster::shared().await;
    let crds = repo_root().join("crds/sluice.dev.yaml");
    cluster.kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()]).await;
    let ns = "partition";
    cluster.kubectl_ok(&["create", "namespace", ns]).await;

    let partitioned = Arc::new(AtomicBool::new(false));
    let relay =
        partitionable_relay(cluster.server().trim_start_matches("https://").to_string(), partitioned.clone()).await;
    let kubeconfig = std::fs::read_to_string(cluster.kubeconfig()).unwrap().replace(&cluster.server(), &relay);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, kubeconfig).unwrap();

    let gateway = Gateway::start_kubernetes(&path, ns, "replica-p", Options::default()).await;
    wait_for_log(&gateway, "leading: writing status", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("never led; log:\n{}", gateway.log()));

    // The partition: from now on nothing this replica sends arrives. Its
    // last renewal was at most a few seconds ago; the others may take the
    // Lease 15 s (the lease duration) after it. It must stop first.
    let cut = Instant::now();
    partitioned.store(true, Ordering::Release);
    let stopped = wait_for_log(&gateway, "no longer leading", Duration::from_secs(20)).await;
    let stopped = stopped.unwrap_or_else(|| panic!("still leading 20 s into the partition; log:\n{}", gateway.log()));
    let after = stopped - cut;
    assert!(
        after < Duration::from_secs(11),
        "stopped leading {after:?} into the partition, too close to the lease's expiry"
    );
}
