//! `slimpack schema`: the JSON Schema of the schedule JSON, generated from its types (the copy
//! shipped as docs/schedule.schema.json is checked against it by a test).

use clap::Args;
use std::path::PathBuf;

use slimpack_codegen::schedule_json;

#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// Write the schema here (default: standard output).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

pub fn run(args: SchemaArgs) -> anyhow::Result<()> {
    super::output::check_directory("-o", args.output.as_deref())?;
    let schema = schedule_json::schema();
    super::output::write(args.output.as_deref(), &schema)?;
    Ok(())
}
