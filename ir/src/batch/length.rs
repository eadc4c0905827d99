//! What a valid document length is, and the messages for the ways a value can fail to be one.
//!
//! A length is a whole number of tokens from 0 to `u32::MAX` (a zero-length document is read,
//! then skipped and counted by [`super::Dataset::parse`]). Every reader (text lines, JSON,
//! JSONL, the tokenizer) funnels its raw values through these checks so that a bad value gets
//! the same wording whatever the file format. Messages name the value and what would be valid;
//! the caller adds the file and the line.

/// The rule every length must satisfy, appended to each message.
const VALID: &str = "a length is a whole number of tokens from 0 to 4294967295";

use crate::quote;

/// Checks an unsigned integer length.
pub(super) fn from_u64(value: u64) -> Result<u32, String> {
    match u32::try_from(value) {
        Ok(length) => Ok(length),
        Err(_) => Err(format!("length {value} is too large: {VALID}")),
    }
}

/// Checks a signed integer length.
pub(crate) fn from_i64(value: i64) -> Result<u32, String> {
    match u64::try_from(value) {
        Ok(unsigned) => from_u64(unsigned),
        Err(_) => Err(format!("length {value} is negative: {VALID}")),
    }
}

/// Checks a floating-point length: integral values are accepted (`12.0` from a float column),
/// fractional ones are not.
pub(super) fn from_f64(value: f64) -> Result<u32, String> {
    if !value.is_finite() || value.fract() != 0.0 {
        return Err(format!("length {value} is not a whole number: {VALID}"));
    }
    if value < 0.0 {
        return Err(format!("length {value} is negative: {VALID}"));
    }
    if value > f64::from(u32::MAX) {
        return Err(format!("length {value} is too large: {VALID}"));
    }
    from_u64(value as u64)
}

/// Checks a JSON value.
pub(super) fn from_json(value: &serde_json::Value) -> Result<u32, String> {
    use serde_json::Value;
    match value {
        Value::Number(number) => {
            if let Some(unsigned) = number.as_u64() {
                from_u64(unsigned)
            } else if let Some(signed) = number.as_i64() {
                from_i64(signed)
            } else {
                from_f64(number.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(text) => Err(a_string(text)),
        other => Err(format!(
            "length {} is not a number: {VALID}",
            quote(&other.to_string())
        )),
    }
}

/// Checks the text of one length (a line of a text file, already trimmed): decimal digits,
/// parsed without allocation because a million-line file goes through here.
pub(super) fn from_digits(text: &[u8]) -> Result<u32, String> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(not_a_number(&String::from_utf8_lossy(text)));
    }
    let mut value: u64 = 0;
    for &digit in digits {
        value = match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(digit - b'0')))
        {
            Some(next) => next,
            None => {
                let shown = quote(&String::from_utf8_lossy(text));
                let problem = if negative { "negative" } else { "too large" };
                return Err(format!("length {shown} is {problem}: {VALID}"));
            }
        };
    }
    if negative && value != 0 {
        return Err(format!(
            "length {} is negative: {VALID}",
            String::from_utf8_lossy(text)
        ));
    }
    from_u64(value)
}

/// The message for a JSON string where a length (a JSON number) belongs.
pub(super) fn a_string(text: &str) -> String {
    format!("length {} is a string, not a number: {VALID}", quote(text))
}

/// The message for a value that is not a number at all.
pub(super) fn not_a_number(text: &str) -> String {
    format!("length {} is not a whole number: {VALID}", quote(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_accept_every_valid_length() {
        assert_eq!(from_digits(b"1"), Ok(1));
        assert_eq!(from_digits(b"0042"), Ok(42));
        assert_eq!(from_digits(b"4294967295"), Ok(u32::MAX));
    }

    #[test]
    fn digits_name_each_problem() {
        assert_eq!(from_digits(b"0"), Ok(0));
        let negative = from_digits(b"-5").unwrap_err();
        assert!(negative.starts_with("length -5 is negative"), "{negative}");
        let large = from_digits(b"4294967296").unwrap_err();
        assert!(
            large.starts_with("length 4294967296 is too large"),
            "{large}"
        );
        let huge = from_digits(b"99999999999999999999999").unwrap_err();
        assert!(huge.contains("is too large"), "{huge}");
        let text = from_digits(b"12a").unwrap_err();
        assert!(
            text.starts_with("length '12a' is not a whole number"),
            "{text}"
        );
        let float = from_digits(b"3.5").unwrap_err();
        assert!(float.contains("'3.5' is not a whole number"), "{float}");
        assert!(float.ends_with("from 0 to 4294967295"), "{float}");
    }

    #[test]
    fn floats_must_be_integral_and_in_range() {
        assert_eq!(from_f64(12.0), Ok(12));
        assert!(from_f64(12.5).unwrap_err().contains("not a whole number"));
        assert!(from_f64(-3.0).unwrap_err().contains("negative"));
        assert!(from_f64(1e20).unwrap_err().contains("too large"));
    }

    #[test]
    fn long_values_are_shortened() {
        let long = "x".repeat(500);
        let message = not_a_number(&long);
        assert!(message.len() < 140, "{message}");
        assert!(message.contains("...'"), "{message}");
    }
}
