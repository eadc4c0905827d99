//! Pipeline strings: `assign-dp,slice{size=8192},pack-fwd`.
//!
//! Grammar: `pipeline := entry (',' entry)*`, `entry := name ('{' key '=' value (',' key '=' value)* '}')?`.
//! Names are checked against the registry and options against the pass's declared options
//! while parsing, so a typo is reported before any pass runs.

use indexmap::IndexMap;

use crate::error::{PassError, Result};
use crate::pass::{Pass, PassOptions};
use crate::registry::{lookup, PassInfo};

/// One parsed pipeline entry.
pub struct PipelineEntry {
    pub info: &'static PassInfo,
    pub options: PassOptions,
}

impl PipelineEntry {
    /// Creates the pass.
    pub fn create(&self) -> Result<Box<dyn Pass>> {
        (self.info.create)(&self.options)
    }

    /// The entry as it would be written in a pipeline string.
    pub fn render(&self) -> String {
        format!("{}{}", self.info.name, self.options.render())
    }
}

/// Parses a pipeline string. An empty string is the empty pipeline.
pub fn parse_pipeline(text: &str) -> Result<Vec<PipelineEntry>> {
    let chars: Vec<char> = text.chars().collect();
    let mut entries = Vec::new();
    let mut i = 0;
    let error = |column: usize, message: String| PassError::PipelineSyntax {
        pipeline: text.to_string(),
        column: column + 1,
        message,
    };
    let skip_spaces = |i: &mut usize| {
        while *i < chars.len() && chars[*i].is_whitespace() {
            *i += 1;
        }
    };
    skip_spaces(&mut i);
    if i == chars.len() {
        return Ok(entries);
    }
    loop {
        skip_spaces(&mut i);
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '-') {
            i += 1;
        }
        if start == i {
            return Err(error(start, "expected a pass name".into()));
        }
        // A name runs on into any letter (`slicé`): the whole word is what is unknown.
        let mut end = i;
        while end < chars.len() && chars[end].is_alphanumeric() {
            end += 1;
        }
        if end > i {
            let word: String = chars[start..end].iter().collect();
            return Err(error(
                start,
                format!("'{word}' is not a pass name (ASCII letters, digits and '-')"),
            ));
        }
        let name: String = chars[start..i].iter().collect();
        let info = lookup(&name)?;
        let mut values = IndexMap::new();
        skip_spaces(&mut i);
        if chars.get(i) == Some(&'{') {
            i += 1;
            loop {
                skip_spaces(&mut i);
                let key_start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '-' || chars[i] == '_')
                {
                    i += 1;
                }
                if key_start == i {
                    return Err(error(
                        key_start,
                        format!("expected an option name in '{name}{{...}}'"),
                    ));
                }
                let key: String = chars[key_start..i].iter().collect();
                skip_spaces(&mut i);
                if chars.get(i) != Some(&'=') {
                    return Err(error(i, format!("expected '=' after option '{key}'")));
                }
                i += 1;
                let value_start = i;
                while i < chars.len() && !matches!(chars[i], ',' | '}') {
                    i += 1;
                }
                let value: String = chars[value_start..i]
                    .iter()
                    .collect::<String>()
                    .trim()
                    .to_string();
                if value.is_empty() {
                    return Err(error(value_start, format!("option '{key}' has no value")));
                }
                if values.insert(key.clone(), value).is_some() {
                    return Err(error(key_start, format!("option '{key}' is given twice")));
                }
                match chars.get(i) {
                    Some(',') => i += 1,
                    Some('}') => {
                        i += 1;
                        break;
                    }
                    _ => return Err(error(i, format!("unclosed '{{' after pass '{name}'"))),
                }
            }
        }
        let options = PassOptions::new(info.name, values, info.options);
        options.check_known(info.options)?;
        entries.push(PipelineEntry { info, options });
        skip_spaces(&mut i);
        match chars.get(i) {
            None => break,
            Some(',') => i += 1,
            Some(other) => {
                return Err(error(
                    i,
                    format!("expected ',' between passes, found '{other}'"),
                ))
            }
        }
    }
    Ok(entries)
}

/// Renders a parsed pipeline back to its canonical string.
pub fn render_pipeline(entries: &[PipelineEntry]) -> String {
    entries
        .iter()
        .map(PipelineEntry::render)
        .collect::<Vec<_>>()
        .join(",")
}
