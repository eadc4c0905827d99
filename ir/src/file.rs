//! Reading the files a user names, whole. A regular file is read at its size (a large JSONL
//! corpus to tokenize is legitimate); a stream — a pipe, standard input, a device such as
//! `/dev/zero` — is refused once it passes [`MAX_INPUT_BYTES`], instead of growing a buffer
//! until the machine runs out of memory.

use std::io::Read;
use std::path::Path;

/// The most a stream may hold: 2 GiB (a length file of 300 million documents; the step and
/// schedule files slimpack writes are far below it).
pub const MAX_INPUT_BYTES: u64 = 2 << 30;

/// The bytes of `path`: a regular file whole, a stream up to [`MAX_INPUT_BYTES`].
pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let metadata = file.metadata()?;
    if metadata.is_file() {
        let mut bytes = Vec::with_capacity(metadata.len() as usize);
        file.read_to_end(&mut bytes)?;
        return Ok(bytes);
    }
    read_from(file)
}

/// The bytes of a stream (standard input, a pipe), or an error past [`MAX_INPUT_BYTES`].
pub fn read_from(source: impl Read) -> std::io::Result<Vec<u8>> {
    read_limited(source, MAX_INPUT_BYTES)
}

fn read_limited(source: impl Read, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    source.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "more than {} from a stream (a pipe or device): slimpack reads its inputs \
                 whole; give a file",
                size(max)
            ),
        ));
    }
    Ok(bytes)
}

fn size(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{bytes} bytes")
    }
}

/// The text of `path` (UTF-8), read as [`read`] reads.
pub fn read_to_string(path: &Path) -> std::io::Result<String> {
    utf8(read(path)?)
}

/// The text of a stream (UTF-8), or an error past [`MAX_INPUT_BYTES`].
pub fn read_string_from(source: impl Read) -> std::io::Result<String> {
    utf8(read_from(source)?)
}

fn utf8(bytes: Vec<u8>) -> std::io::Result<String> {
    String::from_utf8(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_fits_and_refuses_past_the_bound() {
        assert_eq!(read_from(&b"12\n"[..]).unwrap(), b"12\n");
        assert_eq!(read_limited(&b"1234"[..], 4).unwrap(), b"1234");
        // An endless source (as /dev/zero) stops one byte past the bound.
        let error = read_limited(std::io::repeat(0), 4).unwrap_err();
        assert!(error.to_string().contains("more than 4 bytes"), "{error}");
        assert_eq!(size(MAX_INPUT_BYTES), "2 GiB");
        assert!(read_string_from(&b"\xff"[..]).is_err());
    }
}
