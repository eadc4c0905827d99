//! placeholder
#[derive(Debug)]
pub struct VerifyError;
impl std::fmt::Display for VerifyError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("x") } }
