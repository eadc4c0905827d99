//! The `slimpack` command line (the contract is in the README). Each subcommand lives in
//! `cli/<name>.rs`: it parses its arguments, calls the library, prints.
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
