//! Where desired config comes from. A source publishes the whole desired
//! state on a watch channel: the gateway only ever needs the latest.

mod file;

pub use file::FileSource;

use std::future::Future;

use sluice_core::{DesiredConfig, ResourceError};
use tokio::sync::watch;

#[derive(Clone, Debug)]
pub enum ConfigUpdate {
    /// Everything that should be served now.
    Desired(DesiredConfig),
    /// The source could not be read as a whole (e.g. a file does not parse).
    /// Applying the rest could silently drop what the bad part declares, so
    /// the gateway keeps its last good config and reports these.
    Invalid(Vec<ResourceError>),
}

pub trait ConfigSource: Send + 'static {
    /// Publishes the current desired config, then again after every change,
    /// until the receiving side is dropped.
    fn run(self, updates: watch::Sender<Option<ConfigUpdate>>) -> impl Future<Output = ()> + Send;
}
