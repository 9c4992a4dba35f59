//! The wasmtime patch Sluice carries (`vendor/wasmtime/SLUICE.md`):
//! `component::Instance::checkpoint` and `restore`, which return a used
//! instance to the state it was made in. `PerRequest` isolation rests on
//! it, so it is tested here on its own, with every kind of state a core
//! instance has, including those Wizer keeps out of Sluice's snapshots.

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};

/// `run` answers 0 if it finds the instance as it was made, or the number
/// of the first check that found something left; then it leaves something
/// in each place: a global, memory written (in the data image and past
/// it) and grown, a table written and grown, a passive data segment
/// dropped (`memory.init` from it traps afterwards).
const STATEFUL: &str = r#"
(component
  (core module $m
    (memory (export "memory") 1)
    (global $count (mut i32) (i32.const 0))
    (table $t 1 funcref)
    (data $passive "x")
    (data (i32.const 1000) "image")
    (func $f)
    (elem declare func $f)
    (func (export "run") (result i32)
      (if (i32.ne (global.get $count) (i32.const 0)) (then (return (i32.const 1))))
      (if (i32.ne (i32.load8_u (i32.const 1000)) (i32.const 105)) (then (return (i32.const 2))))
      (if (i32.ne (i32.load8_u (i32.const 40000)) (i32.const 0)) (then (return (i32.const 3))))
      (if (i32.ne (memory.size) (i32.const 1)) (then (return (i32.const 4))))
      (if (i32.ne (table.size $t) (i32.const 1)) (then (return (i32.const 5))))
      (if (i32.eqz (ref.is_null (table.get $t (i32.const 0)))) (then (return (i32.const 6))))
      (memory.init $passive (i32.const 40100) (i32.const 0) (i32.const 1))
      (global.set $count (i32.const 1))
      (i32.store8 (i32.const 1000) (i32.const 0))
      (i32.store8 (i32.const 40000) (i32.const 1))
      (drop (memory.grow (i32.const 2)))
      (i32.store8 (i32.const 100000) (i32.const 1))
      (table.set $t (i32.const 0) (ref.func $f))
      (drop (table.grow $t (ref.func $f) (i32.const 3)))
      (data.drop $passive)
      (i32.const 0))
    (func (export "trap") unreachable))
  (core instance $i (instantiate $m))
  (func (export "run") (result u32) (canon lift (core func $i "run")))
  (func (export "trap") (canon lift (core func $i "trap"))))
"#;

fn engine(keep_resident: usize) -> Engine {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(4)
        .total_core_instances(8)
        .total_memories(8)
        .total_tables(8)
        .max_memory_size(1 << 20);
    if keep_resident > 0 {
        pool.linear_memory_keep_resident(keep_resident).table_keep_resident(keep_resident);
    }
    let mut config = Config::new();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config).unwrap()
}

/// Pages reset by decommitting them, and (where `PAGEMAP_SCAN` is
/// available) dirty pages copied back from the image and kept resident.
const KEEP_RESIDENT: [usize; 2] = [0, 256 << 10];

#[test]
fn a_restored_instance_is_as_it_was_made() {
    for keep_resident in KEEP_RESIDENT {
        let engine = engine(keep_resident);
        let component = Component::new(&engine, wat::parse_str(STATEFUL).unwrap()).unwrap();
        let mut store = Store::new(&engine, ());
        let instance = Linker::new(&engine).instantiate(&mut store, &component).unwrap();
        let checkpoint = instance.checkpoint(&mut store).expect("every state here can be restored");
        let run = instance.get_typed_func::<(), (u32,)>(&mut store, "run").unwrap();
        for round in 0..4 {
            let found = run.call(&mut store, ()).unwrap_or_else(|e| panic!("round {round}: {e:?}"));
            assert_eq!(found, (0,), "round {round}, keep_resident {keep_resident}");
            instance.restore(&mut store, &checkpoint).unwrap();
        }
        // The control: without a restore, the next call finds the state.
        assert_eq!(run.call(&mut store, ()).unwrap(), (0,));
        assert_eq!(run.call(&mut store, ()).unwrap(), (1,));
    }
}

/// A checkpoint restores only the instance it was taken from.
#[test]
fn a_checkpoint_belongs_to_its_instance() {
    let engine = engine(0);
    let component = Component::new(&engine, wat::parse_str(STATEFUL).unwrap()).unwrap();
    let mut store = Store::new(&engine, ());
    let linker = Linker::new(&engine);
    let first = linker.instantiate(&mut store, &component).unwrap();
    let second = linker.instantiate(&mut store, &component).unwrap();
    let checkpoint = first.checkpoint(&mut store).unwrap();
    let error = second.restore(&mut store, &checkpoint).unwrap_err();
    assert!(format!("{error}").contains("only the instance it was taken from"), "{error}");

    // Nor the instance at the same place in another store: its tables
    // point into the first store.
    let mut other = Store::new(&engine, ());
    let same_place = linker.instantiate(&mut other, &component).unwrap();
    let error = same_place.restore(&mut other, &checkpoint).unwrap_err();
    assert!(format!("{error}").contains("only the instance it was taken from"), "{error}");
}

/// An instance holding a handle (here a resource it made and kept) is not
/// restored: the caller drops it instead.
#[test]
fn an_instance_holding_a_handle_is_not_restored() {
    let keeps_a_handle = r#"
    (component
      (type $r (resource (rep i32)))
      (core func $new (canon resource.new $r))
      (core module $m
        (import "" "new" (func $new (param i32) (result i32)))
        (func (export "keep") (result i32) (call $new (i32.const 7))))
      (core instance $i (instantiate $m (with "" (instance (export "new" (func $new))))))
      (func (export "keep") (result u32) (canon lift (core func $i "keep"))))
    "#;
    let engine = engine(0);
    let component = Component::new(&engine, wat::parse_str(keeps_a_handle).unwrap()).unwrap();
    let mut store = Store::new(&engine, ());
    let instance = Linker::new(&engine).instantiate(&mut store, &component).unwrap();
    let checkpoint = instance.checkpoint(&mut store).unwrap();
    // The control: nothing held yet, so it restores.
    instance.restore(&mut store, &checkpoint).unwrap();
    let keep = instance.get_typed_func::<(), (u32,)>(&mut store, "keep").unwrap();
    keep.call(&mut store, ()).unwrap();
    let error = instance.restore(&mut store, &checkpoint).unwrap_err();
    assert!(format!("{error}").contains("holds handles"), "{error}");
}

/// A trap poisons the store (wasmtime refuses to enter it again), so an
/// instance that trapped is not restored: the caller drops it. (Sluice
/// drops an instance whose call failed in any way before asking.)
#[test]
fn an_instance_that_trapped_is_not_restored() {
    let engine = engine(0);
    let component = Component::new(&engine, wat::parse_str(STATEFUL).unwrap()).unwrap();
    let mut store = Store::new(&engine, ());
    let instance = Linker::new(&engine).instantiate(&mut store, &component).unwrap();
    let checkpoint = instance.checkpoint(&mut store).unwrap();
    let trap = instance.get_typed_func::<(), ()>(&mut store, "trap").unwrap();
    assert!(trap.call(&mut store, ()).is_err());
    let error = instance.restore(&mut store, &checkpoint).unwrap_err();
    assert!(format!("{error}").contains("trapped"), "{error}");
}

/// Only the pooling allocator resets a memory in place: with the default
/// (on-demand) allocator there is no checkpoint, rather than a restore
/// that fails.
#[test]
fn without_the_pooling_allocator_there_is_no_checkpoint() {
    let engine = Engine::default();
    let component = Component::new(&engine, wat::parse_str(STATEFUL).unwrap()).unwrap();
    let mut store = Store::new(&engine, ());
    let instance = Linker::new(&engine).instantiate(&mut store, &component).unwrap();
    assert!(instance.checkpoint(&mut store).is_none());
}
