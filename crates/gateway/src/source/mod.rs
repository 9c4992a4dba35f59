//! Where desired config comes from. A source publishes the whole desired
//! state on a watch channel: the gateway only ever needs the latest.

mod file;

pub use file::FileSource;

use std::future::Future;

pub use sluice_core::ConfigUpdate;
use tokio::sync::watch;

pub trait ConfigSource: Send + 'static {
    /// Publishes the current desired config, then again after every change,
    /// until the receiving side is dropped.
    fn run(self, updates: watch::Sender<Option<ConfigUpdate>>) -> impl Future<Output = ()> + Send;
}
