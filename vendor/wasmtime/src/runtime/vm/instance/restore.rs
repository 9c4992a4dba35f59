//! Sluice patch: returning a core instance to the state it was made in.
//!
//! A core instance's state is its defined linear memories, tables and
//! globals, and the lengths of its passive data segments (`data.drop`). A
//! [`CoreCheckpoint`], taken right after instantiation, keeps the globals,
//! the data lengths and the tables' elements (small), and each memory's
//! initial size; restoring writes them back and resets each memory's
//! copy-on-write slot the way the pooling allocator resets a slot for its
//! next instance (the dirty pages found with `PAGEMAP_SCAN` and copied back
//! from the image, the rest decommitted).
//!
//! Only instances whose whole state is that are checkpointed: no GC heap
//! or GC references, no passive element segments, no shared memories, and
//! every defined memory backed by a copy-on-write image.

use super::Instance;
use super::InstanceLayout;
use crate::prelude::*;
use crate::runtime::vm::table::{SavedFuncrefs, TableElementType};
use crate::runtime::vm::vmcontext::{VMGlobalDefinition, VMMemoryDefinition};
use crate::store::InstanceId;
use core::pin::Pin;
use wasmtime_environ::{
    DefinedGlobalIndex, DefinedMemoryIndex, DefinedTableIndex, EntityRef, RuntimeDataIndex,
};

/// What [`Instance::restore`] returns an instance to.
pub struct CoreCheckpoint {
    id: InstanceId,
    globals: Vec<[u8; 16]>,
    data_lengths: Vec<u32>,
    memories: Vec<DefinedMemoryIndex>,
    tables: Vec<(DefinedTableIndex, SavedFuncrefs)>,
}

impl Instance {
    /// The state of this instance now, or `None` if it has state a
    /// checkpoint cannot hold (see the module's documentation).
    pub(crate) fn checkpoint(self: Pin<&mut Self>) -> Option<CoreCheckpoint> {
        let module = self.env_module().clone();
        if module.needs_gc_heap || !module.passive_elements.is_empty() {
            return None;
        }
        let defined_globals = (0..module.num_defined_globals()).map(DefinedGlobalIndex::new);
        let mut globals = Vec::new();
        for index in defined_globals {
            if module.globals[module.global_index(index)]
                .wasm_ty
                .is_vmgcref_type()
            {
                return None;
            }
            // SAFETY: a defined global's definition, in this instance's vmctx.
            globals.push(unsafe { self.global_ptr(index).cast::<[u8; 16]>().read() });
        }
        let data_lengths = (0..self.offsets().num_runtime_data)
            .map(|i| {
                let offset = self
                    .offsets()
                    .vmctx_runtime_data_length(RuntimeDataIndex::from_u32(i));
                // SAFETY: the `u32` length of a data segment in this vmctx.
                unsafe { *self.vmctx_plus_offset::<u32>(offset) }
            })
            .collect();
        let mut memories = Vec::new();
        for (index, (_, memory)) in self.memories.iter() {
            if memory.as_shared_memory().is_some() || memory.needs_init() {
                return None;
            }
            memories.push(index);
        }
        let mut tables = Vec::new();
        for (index, (_, table)) in self.tables.iter() {
            if table.element_type() != TableElementType::Func {
                return None;
            }
            tables.push((index, table.save_funcrefs()?));
        }
        Some(CoreCheckpoint {
            id: self.id,
            globals,
            data_lengths,
            memories,
            tables,
        })
    }

    /// Returns this instance to `checkpoint`, taken from it. Its memories are
    /// reset with `reset_memory`. On an error the instance's state is
    /// unknown, and it must not run again.
    pub(crate) fn restore(
        mut self: Pin<&mut Self>,
        checkpoint: &CoreCheckpoint,
        mut reset_memory: impl FnMut(&mut crate::runtime::vm::Memory) -> Result<bool>,
    ) -> Result<()> {
        if checkpoint.id != self.id {
            bail!("a checkpoint restores only the instance it was taken from");
        }
        for &index in &checkpoint.memories {
            let memory = &mut self.as_mut().memories_mut()[index].1;
            if !reset_memory(memory)? {
                bail!("this memory cannot be reset in place");
            }
            let definition: VMMemoryDefinition = memory.vmmemory();
            self.set_memory(index, definition);
        }
        for (index, saved) in &checkpoint.tables {
            let table = &mut self.as_mut().tables_mut()[*index].1;
            if !table.restore_funcrefs(saved) {
                bail!("this table cannot be restored in place");
            }
            let definition = table.vmtable();
            self.as_mut().set_table(*index, definition);
        }
        for (i, global) in checkpoint.globals.iter().enumerate() {
            let ptr = self
                .global_ptr(DefinedGlobalIndex::new(i))
                .cast::<[u8; 16]>();
            // SAFETY: the definition the checkpoint read this value from.
            unsafe { ptr.write(*global) };
        }
        for (i, length) in checkpoint.data_lengths.iter().enumerate() {
            let offset = self
                .offsets()
                .vmctx_runtime_data_length(RuntimeDataIndex::from_u32(i as u32));
            // SAFETY: as in `checkpoint`.
            unsafe { *self.as_mut().vmctx_plus_offset_mut::<u32>(offset) = *length };
        }
        Ok(())
    }
}

const _: () = assert!(core::mem::size_of::<VMGlobalDefinition>() == 16);
