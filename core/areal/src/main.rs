//! The `areal` binary: the command line of `areal-cli` with every built-in plugin, the
//! testkit's plugins (its bigram job, `sdk/testkit/testkit.toml`) and `areal bench`.

// Naming the crate links its `inventory` registrations into the binary.
use areal_testkit as _;

// glibc's allocator serialises the engine's many small cross-thread allocations on its arena
// locks: `areal bench controller` ran at 36 000 rollouts/s with it and 90 000 with mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` (the same index in mimalloc v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> std::process::ExitCode {
    // By default mimalloc returns freed memory to the OS after 10 ms, so burn's large tensors
    // are page-faulted in again on every step: training ran 10-20% slower than with glibc.
    // Never purging keeps them mapped (the process's footprint is its peak, as with glibc).
    // SAFETY: `mi_option_set` stores an integer option; mimalloc reads it at its next purge.
    #[allow(unsafe_code, reason = "mimalloc's options are set through its C API")]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
    }
    areal_cli::main_with(std::env::args_os(), &[areal_bench::extension()])
}
