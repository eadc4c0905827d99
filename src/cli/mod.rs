//! Argument parsing and dispatch.

pub mod bench;
mod bench_planning;
mod calibrate;
mod compile;
pub mod exit;
mod input;
mod lengths;
mod opt;
mod output;
mod passes;
mod plan;
mod progress;
mod report;
mod run;
mod schema;
mod simulate;
mod validate;

use clap::{Parser, Subcommand};

/// slimpack: compile variable-length LLM training steps into balanced schedules.
#[derive(Debug, Parser)]
#[command(name = "slimpack", version, about, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compile a model + cluster + batch spec into a step (--strategy slimpack unless --strategy
    /// or --passes says otherwise) and report on it.
    Compile(compile::CompileArgs),
    /// Read text IR, run passes over it, print it.
    Opt(opt::OptArgs),
    /// List the passes with one-line summaries.
    Passes(passes::PassesArgs),
    /// Predict the time and memory of a compiled step (scheduled IR or schedule JSON).
    Simulate(simulate::SimulateArgs),
    /// Print the JSON Schema of the schedule JSON (`compile --emit json`).
    Schema(schema::SchemaArgs),
    /// Print a dataset's token counts, one per line (tokenize a JSONL corpus once).
    Lengths(lengths::LengthsArgs),
    /// Plan every step of a dataset's epoch (tuned once) and stream the schedules out.
    Plan(plan::PlanArgs),
    /// Run the strategies side by side on global batches of a dataset, through the simulator.
    Bench(bench::BenchArgs),
    /// Execute a compiled step for real (CPU or CUDA backend), measured against the simulator.
    Run(run::RunArgs),
    /// Measure this machine's kernels into the machine model's calibration tables.
    Calibrate(calibrate::CalibrateArgs),
    /// Validate the simulator against the CPU or CUDA runtime over a suite of schedules.
    Validate(validate::ValidateArgs),
}

/// Runs the command line and returns the process exit status (see [`exit`]).
pub fn main() -> i32 {
    exit::quiet_on_closed_pipe();
    output::guard_unwritable_stdout();
    install_panic_hook();
    let cli = match parse() {
        Ok(cli) => cli,
        Err(error) => {
            // Help and version are not errors; clap's usage errors exit with status 2.
            let _ = error.print();
            return error.exit_code();
        }
    };
    let dispatched = std::panic::catch_unwind(|| dispatch(cli.command));
    match dispatched {
        Ok(Ok(())) => exit::SUCCESS,
        Ok(Err(error)) => {
            say(&format!("error: {}", one_line(&error)));
            exit::status_of(&error)
        }
        // A full disk or device behind stdout: the hook has said so; not a bug.
        Err(payload) if output_failure(&panic_message(payload.as_ref())).is_some() => {
            exit::BAD_INPUT
        }
        // The panic hook has printed the one line that says it is a bug.
        Err(_) => exit::INTERNAL,
    }
}

/// The command line, parsed. A negative number is read as a flag's value (`--context -5`: an
/// invalid value of `--context`), not as an unknown flag `-5`.
fn parse() -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let mut command = Cli::command().mut_subcommands(|sub| {
        sub.mut_args(|arg| {
            let takes_values = arg.get_action().takes_values();
            arg.allow_negative_numbers(takes_values)
        })
    });
    let matches = command.try_get_matches_from_mut(std::env::args_os())?;
    Cli::from_arg_matches(&matches).map_err(|error| error.format(&mut command))
}

/// Writes a line to stderr, ignoring a failure to (there is nowhere left to say it).
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The standard library's print macros panic when their stream cannot be written (stdout on
/// a full disk, `/dev/full`): that is the environment's failure, reported as an error line and
/// exit 2 like any other unwritable output. Returns the line to print, if `message` is one.
fn output_failure(message: &str) -> Option<String> {
    [("stdout", "output"), ("stderr", "error")]
        .iter()
        .find_map(|(stream, name)| {
            let cause = message.strip_prefix(&format!("failed printing to {stream}: "))?;
            let cause = match *stream {
                "stdout" => output::stdout_unwritable().unwrap_or(cause),
                _ => cause,
            };
            Some(format!("error: cannot write to standard {name}: {cause}"))
        })
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Compile(args) => compile::run(args),
        Command::Opt(args) => opt::run(args),
        Command::Passes(args) => passes::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Schema(args) => schema::run(args),
        Command::Lengths(args) => lengths::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Run(args) => run::run(args),
        Command::Calibrate(args) => calibrate::run(args),
        Command::Validate(args) => validate::run(args),
    }
}

/// The longest run without a space an error line keeps whole: longer ones are a user's value
/// (a 10 MB token or number in a step file) and are cut to [`slimpack_ir::clip`]'s excerpt.
const MAX_WORD_CHARS: usize = 200;

/// The error and its causes on one line (`a: b: c`), without repeating a cause that the
/// message already contains, and without any one long value repeated whole.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    // A value from the user's files is shown, but not its control characters: an escape
    // sequence would restyle the terminal, a NUL or a carriage return hide the text.
    let line: String = line
        .chars()
        .map(|c| match c {
            '\n' | '\t' => " ".to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect();
    line.split(' ')
        .map(|word| match word.chars().count() > MAX_WORD_CHARS {
            true => slimpack_ir::clip(word),
            false => std::borrow::Cow::Borrowed(word),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A panic is a bug in slimpack, not bad input: say so in one line, without a backtrace
/// unless RUST_BACKTRACE asks for one (then the standard hook prints it). A failed write to
/// standard output (a closed pipe, a full disk) is no bug: it is one line either way.
fn install_panic_hook() {
    let backtrace = std::env::var_os("RUST_BACKTRACE").is_some_and(|value| value != "0");
    let standard = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = panic_message(info.payload());
        if let Some(line) = output_failure(&message) {
            say(&line);
            return;
        }
        if backtrace {
            return standard(info);
        }
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        say(&format!(
            "internal error (a bug in slimpack, please report it){location}: {message}"
        ));
    }));
}
