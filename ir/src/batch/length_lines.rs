//! Reader for length files in text form: one length per line.
//!
//! Blank lines are skipped; `#` starts a comment that runs to the end of the line (a whole line
//! or after a value); spaces, tabs and `\r` around a value are ignored. Anything else on a line
//! must be one length (see [`super::length`]). Works on bytes, line by line, without
//! allocating per line: the 1M-line Wikipedia list is read in milliseconds.

use super::{batch_error, length};
use crate::error::Result;

/// Parses the lengths of a text length file; `source_name` names it in errors.
pub(super) fn parse(source_name: &str, bytes: &[u8]) -> Result<Vec<u32>> {
    // One length per ~7 bytes is typical; reserving avoids most regrowth on large files.
    let mut lengths = Vec::with_capacity(bytes.len() / 6);
    for (index, line) in bytes.split(|&byte| byte == b'\n').enumerate() {
        let value = match line.iter().position(|&byte| byte == b'#') {
            Some(comment) => &line[..comment],
            None => line,
        }
        .trim_ascii();
        if value.is_empty() {
            continue;
        }
        let length = length::from_digits(value).map_err(|message| {
            batch_error(source_name, format!("line {}: {message}", index + 1))
        })?;
        lengths.push(length);
    }
    Ok(lengths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_blanks_and_comments() {
        let text = b"# lengths\n12\n\n  7 \r\n3 # trailing comment\n\t\n5";
        assert_eq!(parse("f.txt", text).unwrap(), vec![12, 7, 3, 5]);
    }

    #[test]
    fn errors_name_file_line_and_value() {
        let message = parse("f.txt", b"12\n# c\nabc\n").unwrap_err().to_string();
        assert_eq!(
            message,
            "f.txt: line 3: length 'abc' is not a whole number: \
             a length is a whole number of tokens from 0 to 4294967295"
        );
        let message = parse("f.txt", b"1\n-4\n").unwrap_err().to_string();
        assert!(
            message.starts_with("f.txt: line 2: length -4 is negative"),
            "{message}"
        );
        assert_eq!(parse("f.txt", b"0\n").unwrap(), vec![0]);
        let message = parse("f.txt", b"5000000000\n").unwrap_err().to_string();
        assert!(
            message.starts_with("f.txt: line 1: length 5000000000 is too large"),
            "{message}"
        );
    }

    #[test]
    fn empty_input_gives_no_lengths() {
        assert!(parse("f.txt", b"\n# nothing\n").unwrap().is_empty());
    }
}
