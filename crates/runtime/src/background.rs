//! Work the gateway does besides serving (compiling modules, making
//! snapshots) yields the CPU to requests: its threads run at a lower
//! priority, so a config change under load costs requests little latency.

// Calls that need `unsafe`, each block with a SAFETY: comment saying why
// it is sound (clippy::undocumented_unsafe_blocks checks there is one).
#![allow(unsafe_code)]

/// The nice value of background threads: at 10 a busy request thread gets
/// about nine times their share of a contended core, yet background work
/// still finishes under sustained load (at 19 it could all but stop).
const NICE: libc::c_int = 10;

/// Lowers the calling thread's priority. Linux keeps a nice value per
/// thread, and `PRIO_PROCESS` with 0 names the calling one. It cannot be
/// raised again without privileges: call it only on threads that do
/// nothing else.
pub(crate) fn lower_this_thread() {
    // SAFETY: setpriority has no memory effects; a failure only leaves the
    // priority as it was.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, NICE);
    }
}

/// Cranelift compiles on rayon's global pool: its threads start lowered.
/// Only the first call builds the pool; later ones (another runtime in the
/// same process) find it built.
pub(crate) fn lower_compile_threads() {
    let _ = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("sluice-compile-{i}"))
        .start_handler(|_| lower_this_thread())
        .build_global();
}

/// Gives the memory freed by a compile back to the system. Cranelift
/// allocates tens of MiB while it compiles, on its own threads' malloc
/// arenas, and glibc keeps what they free: measured with three plugins,
/// 64 MiB of RSS after their snapshots compiled, a third of it such free
/// arena memory. `malloc_trim` returns the free pages of every arena.
pub(crate) fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Bounds what glibc keeps of freed memory, process-wide. By default it
/// raises its mmap and trim thresholds as large blocks are freed (up to 32
/// and 64 MiB), and `malloc_trim` never shrinks the free top of a thread's
/// heap: after Cranelift compiled a regex guard on the rayon threads, their
/// heaps kept about 15 MiB free but resident, more than the guard's code and
/// snapshot (`cargo bench -p sluice-tests --bench plugins`: RSS per loaded
/// version, prompt-guard 12.6 → 7.7 MiB, auth 7.1 → 6.8). Fixed at 1 MiB,
/// blocks that large come from the system and go back to it when freed,
/// and a heap's free top beyond it is returned as it is freed. Requests
/// allocate far less than that at a time.
pub(crate) fn bound_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

/// Runs `job` on a thread of its own at background priority; its result,
/// or the panic's message.
pub(crate) async fn run<T: Send + 'static>(name: &str, job: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            lower_this_thread();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            return_freed_memory();
            let _ = done.send(result);
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    match result.await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(panic)) => Err(panic_message(panic)),
        Err(_) => Err("the thread ended without an answer".into()),
    }
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    match panic.downcast::<String>() {
        Ok(message) => *message,
        Err(panic) => panic.downcast_ref::<&str>().map_or("(no message)", |m| m).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of_this_thread() -> libc::c_int {
        // SAFETY: as above; -1 is a valid nice value, errno is not checked.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
    }

    #[tokio::test]
    async fn background_jobs_run_lowered_and_leave_the_caller_alone() {
        let before = nice_of_this_thread();
        let nice = run("test-background", nice_of_this_thread).await.unwrap();
        // Already lower than NICE (a CI run under `nice -n 19`) stays so
        // unless the process may raise it.
        assert!(nice == NICE || (nice == before && before > NICE), "nice {nice}, caller {before}");
        assert_eq!(nice_of_this_thread(), before);
        let panicked = run("test-background", || panic!("boom")).await;
        assert_eq!(panicked.unwrap_err(), "boom");
    }
}
