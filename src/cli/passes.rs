//! `slimpack passes`: the pass registry and the strategies, listed.

use clap::Args;

use slimpack::tune::strategy::STRATEGIES;
use slimpack_passes::registry::PASSES;

#[derive(Debug, Args)]
pub struct PassesArgs {
    /// Also print each pass's description and options, and each strategy's source and deviations.
    #[arg(long, short)]
    verbose: bool,
}

pub fn run(args: PassesArgs) -> anyhow::Result<()> {
    let width = PASSES.iter().map(|p| p.name.len()).max().unwrap_or(0);
    println!("Passes (use in --passes 'a,b{{opt=value}},...'):");
    for pass in PASSES {
        println!("  {:width$}  {}", pass.name, pass.summary);
        if args.verbose {
            println!("  {:width$}  {}", "", pass.description);
            for option in pass.options {
                println!("  {:width$}    {}=  {}", "", option.name, option.describe());
            }
        }
    }
    let width = STRATEGIES.iter().map(|s| s.name.len()).max().unwrap_or(0);
    println!("\nStrategies (use with --strategy NAME):");
    for strategy in STRATEGIES {
        println!("  {:width$}  {}", strategy.name, strategy.summary);
        if args.verbose {
            println!("  {:width$}  source: {}", "", strategy.source);
            println!("  {:width$}  deviations: {}", "", strategy.deviations);
        }
    }
    Ok(())
}
