//! The canonical text form of the step IR.
//!
//! Printed in a stable order with names renumbered from positions (`%st` stages, `%r` replicas,
//! `%d<i>` samples, `%d<i>.<j>` their slices, `%f`/`%b` packs), so the same IR prints the same
//! bytes and `print(parse(print(ir))) == print(ir)`. The parser accepts any `%name` and reports
//! errors as `source:line:column: message`. Grammar, one statement per line:
//!
//! ```text
//! step phase=<phase> {
//!   model name="..." layers=N hidden=N heads=N kv_heads=N head_dim=N ffn=N vocab=N dtype=bf16 recompute=none tied_embeddings=false
//!   gpu name="..." peak_flops=F hbm_bytes=N hbm_bandwidth=F
//!   cluster name="..." gpus_per_node=N intra_bandwidth=F intra_latency=F inter_bandwidth=F inter_latency=F
//!   parallel tp=N [cp=N] pp=N dp=N
//!   batch source="..." [context=N] documents=N documents_cut=N
//!   %st0 = stage layers=A..B [recompute=none|selective|full|block:K]   (the stage's own mode)
//!   %r0 = replica dp=[i, j]
//!   %d0 = sample len=N doc=N piece=N [on %r0]
//!     %d0.0 = slice A..B                      (belongs to the sample above)
//!   %f0 = pack fwd|bwd on %r0 [cap=N] [%d0.0, %d1.0]
//!   schedule %r0 %st0 [%f0, %f1, %b0, ...]
//! }
//! ```

mod lexer;
mod names;
mod parse;
mod print;

pub use names::Names;
pub use parse::parse;
pub use print::print;
