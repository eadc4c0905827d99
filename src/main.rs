//! The `slimpack` command line (DESIGN §3.8). Each subcommand lives in `cli/<name>.rs`.
//!
//! Contract: `--report json` prints one JSON object on stdout; human text goes to stderr; bad
//! input exits with status 2 and one line `error: ...` naming the file, flag or value.

mod cli;

#[global_allocator]
static ALLOCATOR: slimpack_runtime::cpu::CountingAllocator =
    slimpack_runtime::cpu::CountingAllocator::new();

fn main() {
    std::process::exit(cli::main());
}
