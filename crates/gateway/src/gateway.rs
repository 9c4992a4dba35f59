use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use sluice_core::ResourceError;
use sluice_runtime::Runtime;
use tokio::sync::watch;

use crate::snapshot::{self, BuildReport, Snapshot};
use crate::source::ConfigUpdate;
use crate::upstream::UpstreamClient;

#[derive(Clone, Debug)]
pub struct Settings {
    /// Largest request body accepted; larger ones get a 413.
    pub max_body_bytes: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self { max_body_bytes: 4 * 1024 * 1024 }
    }
}

/// The data plane's shared state. Requests load the current snapshot once
/// and keep it to the end; the config loop replaces it whole.
pub struct Gateway {
    pub(crate) snapshot: ArcSwap<Snapshot>,
    pub(crate) report: ArcSwap<Report>,
    pub(crate) ready: AtomicBool,
    pub(crate) runtime: Runtime,
    pub(crate) upstream: UpstreamClient,
    pub(crate) settings: Settings,
}

/// What the admin API tells about the last config change.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    /// Problems with the source itself (e.g. a YAML file that does not
    /// parse): while any exist, nothing from the source is applied.
    pub source_errors: Vec<ResourceError>,
    pub build: BuildReport,
}

impl Gateway {
    pub fn new(runtime: Runtime, settings: Settings) -> Result<Arc<Self>, crate::upstream::ClientError> {
        Ok(Arc::new(Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            report: ArcSwap::from_pointee(Report::default()),
            ready: AtomicBool::new(false),
            upstream: UpstreamClient::new()?,
            runtime,
            settings,
        }))
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Applies every update from a config source: builds the next snapshot
    /// in full (every plugin compiled, configured and instantiated once),
    /// then swaps it in. Runs until the source goes away.
    pub async fn follow(self: Arc<Self>, mut updates: watch::Receiver<Option<ConfigUpdate>>) {
        loop {
            let update = updates.borrow_and_update().clone();
            if let Some(update) = update {
                self.apply(update).await;
            }
            if updates.changed().await.is_err() {
                return;
            }
        }
    }

    async fn apply(&self, update: ConfigUpdate) {
        let desired = match update {
            ConfigUpdate::Desired(desired) => desired,
            ConfigUpdate::Invalid(errors) => {
                for error in &errors {
                    tracing::error!(resource = %error.resource, "{}; keeping the last good config", error.message);
                }
                let build = self.report.load().build.clone();
                self.report.store(Arc::new(Report { source_errors: errors, build }));
                return;
            }
        };
        let previous = self.snapshot.load_full();
        let (next, build) = snapshot::build(&self.runtime, &desired, &previous).await;
        for error in &build.errors {
            tracing::error!(resource = %error.resource, "{}", error.message);
        }
        tracing::info!(
            generation = next.generation,
            routes = next.routes().len(),
            errors = build.errors.len(),
            "config applied"
        );
        self.snapshot.store(Arc::new(next));
        self.report.store(Arc::new(Report { source_errors: Vec::new(), build }));
        self.ready.store(true, Ordering::Release);
    }
}
