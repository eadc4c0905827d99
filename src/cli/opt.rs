//! `slimpack opt`: text IR in, passes, text IR out.

use anyhow::{bail, Context};
use clap::Args;
use std::path::PathBuf;

use slimpack_ir::text;
use slimpack_passes::{parse_pipeline, run_pipeline, PassError};

use super::compile::PassManagerArgs;

#[derive(Debug, Args)]
pub struct OptArgs {
    /// IR file to read (`-` for standard input).
    input: PathBuf,
    /// Pass pipeline, e.g. 'slice{size=8192}'.
    #[arg(long, default_value = "")]
    passes: String,
    /// Write the IR here instead of standard output.
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    manager: PassManagerArgs,
}

pub fn run(args: OptArgs) -> anyhow::Result<()> {
    super::output::check_distinct(
        &[("input", Some(&args.input))],
        &[("-o", args.output.as_deref())],
    )?;
    let options = args.manager.options()?;
    super::output::check_generated(
        "--dump-dir",
        options.dump_dir.as_deref(),
        super::output::is_dump_name,
        &[("input", Some(&args.input)), ("-o", args.output.as_deref())],
    )?;
    let (source, name) = if args.input.as_os_str() == "-" {
        let source = slimpack_ir::file::read_string_from(std::io::stdin().lock())
            .context("cannot read standard input")?;
        (source, "<stdin>".to_string())
    } else {
        let source = slimpack_ir::file::read_to_string(&args.input)
            .with_context(|| format!("cannot read {}", args.input.display()))?;
        (source, args.input.display().to_string())
    };
    let pipeline = parse_pipeline(&args.passes)?;
    if super::input::is_schedule_json(&source) {
        bail!("{name}: this is schedule JSON; `opt` reads text IR (`simulate` and `run` read schedules)");
    }
    let mut ir = text::parse(&source, &name)?;
    // The file is untrusted and the passes assume a valid step (a broken one can make them
    // fail on an internal invariant): it is verified even with --no-verify, which skips the
    // checks after each pass.
    if !options.verify {
        slimpack_ir::verify::verify(&ir).map_err(|source| PassError::Invalid {
            after: None,
            source,
        })?;
    }
    let records = run_pipeline(&mut ir, &pipeline, &options, &mut std::io::stderr())?;
    args.manager.report_times(&records);
    let printed = text::print(&ir);
    super::output::write(args.output.as_deref(), &printed)?;
    Ok(())
}
