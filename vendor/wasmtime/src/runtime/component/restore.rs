//! Sluice patch: returning a component instance to the state it was made in,
//! so one instance can serve request after request with nothing of one seen
//! by the next, at a fraction of the cost of making a new one.
//!
//! [`Instance::checkpoint`] is taken right after instantiation: of each
//! core instance, what `vm::CoreCheckpoint` keeps. [`Instance::restore`]
//! returns every core instance to it (linear memories reset from their
//! copy-on-write images as the pooling allocator resets a slot for reuse),
//! after checking that no call is under way and no handle is live, and
//! renumbers the handle tables as new.
//!
//! What instantiation itself writes is not recorded: a component whose core
//! modules have a `start` function may have written its memories then, and
//! restoring would undo that. The caller checks that there is none.

use crate::component::Instance;
use crate::prelude::*;
use crate::runtime::vm::CoreCheckpoint;
use crate::store::{InstanceId, StoreOpaque};
use crate::{AsContextMut, Engine};
use wasmtime_environ::component::{RuntimeComponentInstanceIndex, RuntimeInstanceIndex};

/// The state of a component instance right after it was made.
pub struct Checkpoint {
    instance: Instance,
    cores: Vec<(InstanceId, CoreCheckpoint)>,
}

impl Instance {
    /// The state of this instance now, to return to with
    /// [`Instance::restore`]; `None` if some core instance has state a
    /// checkpoint cannot hold (a GC heap, passive element segments, a shared
    /// memory, a memory without a copy-on-write image) or the engine does
    /// not use the pooling allocator.
    ///
    /// # Panics
    ///
    /// Panics if `store` does not own this instance.
    pub fn checkpoint(&self, mut store: impl AsContextMut) -> Option<Checkpoint> {
        let store = store.as_context_mut().0;
        // Only the pooling allocator resets a memory in place.
        #[cfg(feature = "pooling-allocator")]
        let pooled = store.engine().allocator().as_pooling().is_some();
        #[cfg(not(feature = "pooling-allocator"))]
        let pooled = false;
        if !pooled {
            return None;
        }
        let ids = self.core_instances(store);
        let mut cores = Vec::new();
        for id in ids {
            cores.push((id, store.instance_mut(id).checkpoint()?));
        }
        Some(Checkpoint {
            instance: *self,
            cores,
        })
    }

    /// Returns this instance to `checkpoint`, which was taken from it. An
    /// error if a call into it is under way or has not finished cleanly (it
    /// trapped, or was abandoned), or it holds a handle (a resource); the
    /// instance must then be dropped, as also after any other error.
    ///
    /// # Panics
    ///
    /// Panics if `store` does not own this instance.
    pub fn restore(&self, mut store: impl AsContextMut, checkpoint: &Checkpoint) -> Result<()> {
        let store = store.as_context_mut().0;
        // The store's id too: a checkpoint's tables point into its store.
        if checkpoint.instance.id() != self.id() {
            bail!("a checkpoint restores only the instance it was taken from");
        }
        self.check_idle(store)?;
        let engine: Engine = store.engine().clone();
        let (allocator, tunables) = (engine.allocator(), engine.tunables());
        for (id, core) in &checkpoint.cores {
            store.instance_mut(*id).restore(core, |memory| {
                allocator.reset_memory_in_place(memory, tunables)
            })?;
        }
        Ok(())
    }

    fn core_instances(&self, store: &StoreOpaque) -> Vec<InstanceId> {
        let component = self.id().get(store);
        let count = component.component().env_component().num_runtime_instances;
        (0..count)
            .map(|i| component.instance(RuntimeInstanceIndex::from_u32(i)))
            .collect()
    }

    /// No call is in the instance, the last one left it cleanly, and it
    /// holds no handle; its handle tables are then renumbered as new.
    fn check_idle(&self, store: &mut StoreOpaque) -> Result<()> {
        // A trap poisons the whole store: nothing in it may be entered again.
        if store.trapped() {
            bail!("a call into this instance's store trapped");
        }
        let mut component = self.id().get_mut(store);
        let count = component
            .component()
            .env_component()
            .num_runtime_component_instances;
        for i in 0..count {
            let i = RuntimeComponentInstanceIndex::from_u32(i);
            // SAFETY: the flags of a sub-instance of this live instance.
            if !unsafe { component.instance_flags(i).may_leave() } {
                bail!("a call into this instance is under way or did not finish");
            }
            if !component
                .as_mut()
                .instance_state(i)
                .handle_table()
                .is_empty()
            {
                bail!("this instance holds handles");
            }
        }
        for i in 0..count {
            let i = RuntimeComponentInstanceIndex::from_u32(i);
            component
                .as_mut()
                .instance_state(i)
                .handle_table()
                .reset_if_empty();
        }
        Ok(())
    }
}
