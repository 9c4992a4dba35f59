//! Where desired config comes from. A source publishes the whole desired
//! state on a watch channel, the latest only: standalone mode's
//! [`FileSource`] here, and the Kubernetes feed in `sluice-controller`
//! (which cannot depend on this crate). Both have the same shape, an
//! `async fn run(self, updates: watch::Sender<Option<ConfigUpdate>>)`.

mod file;

pub use file::FileSource;
pub use sluice_core::ConfigUpdate;
