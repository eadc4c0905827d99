//! The `slimpack` command line (the contract is in the README). Each subcommand lives in
//! `cli/<name>.rs`: it parses its arguments, calls the library, prints.
//!
//! Contract: `--report json` prints one JSON object on stdout; human text goes to stderr; bad
//! input exits with status 2 and one line `error: ...` naming the file, flag or value.

mod cli;

/// The runtime's counting allocator measures the real peak memory of executed steps (`run`,
/// `validate`, `calibrate`). Every other command only plans, and counting would cost it a
/// large share of its time: [`choose_allocator_mode`] switches it to the allocator underneath
/// (mimalloc, uncounted) for those, before the first allocation.
#[global_allocator]
static ALLOCATOR: slimpack_runtime::cpu::CountingAllocator =
    slimpack_runtime::cpu::CountingAllocator::new();

/// Subcommands that never execute a step, so need no allocation counting.
const PLANNING_COMMANDS: [&str; 7] = [
    "compile", "opt", "passes", "simulate", "schema", "bench", "plan",
];

/// Runs before `main` (and before any allocation; glibc passes the program's arguments to
/// `.init_array` functions): when the subcommand only plans, the allocator passes through.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[used]
#[link_section = ".init_array"]
static CHOOSE_ALLOCATOR_MODE: extern "C" fn(
    std::ffi::c_int,
    *const *const std::ffi::c_char,
    *const *const std::ffi::c_char,
) = choose_allocator_mode;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn choose_allocator_mode(
    argc: std::ffi::c_int,
    argv: *const *const std::ffi::c_char,
    _envp: *const *const std::ffi::c_char,
) {
    if argc < 2 || argv.is_null() {
        return;
    }
    // SAFETY: glibc passes the argument vector of `argc` valid C strings.
    let command = unsafe { std::ffi::CStr::from_ptr(*argv.add(1)) };
    if PLANNING_COMMANDS
        .iter()
        .any(|name| name.as_bytes() == command.to_bytes())
    {
        slimpack_runtime::cpu::CountingAllocator::pass_through();
    }
}

fn main() {
    std::process::exit(cli::main());
}
