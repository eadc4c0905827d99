//! A bounded run of every fuzz target (`slimpack::fuzz`) in `cargo test`: each target's
//! committed corpus (`fuzz/corpus/<target>/`), then seeded mutations of it (byte flips,
//! insertions of the grammar's tokens, deletions, truncations, splices). The inputs are the
//! same on every run; a panic fails the test and names the input's seed.

use std::path::Path;

use slimpack::fuzz::TARGETS;

/// Mutated inputs per target.
const MUTATIONS: usize = 3000;

/// Tokens the readers' grammars give meaning to, inserted by mutations.
const TOKENS: &[&str] = &[
    "[",
    "]",
    "{",
    "}",
    "=",
    ",",
    "%",
    "..",
    ":",
    "\"",
    "\n",
    "#",
    "0",
    "1",
    "-1",
    "4294967295",
    "4294967296",
    "18446744073709551616",
    "NaN",
    "inf",
    "1e309",
    "null",
    "true",
    "[[[[",
    "}}}",
    "%r0",
    "%s0",
    "%f0",
    "dp=",
    "size=0",
    "cap=",
    "stage",
    "replica",
    "pack",
    "schedule",
    "\"samples\":[]",
    "\"stages\":[]",
    "\"dp\":0",
    "\"len\":0",
    "tp=0",
    "pp=",
    "[batch]",
    "[model]",
    "count = 0",
    "\u{feff}",
    "\u{0}",
];

/// xorshift64*: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four random edits of `input`, with `other` for splices.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut data = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(6) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let token = TOKENS[rng.below(TOKENS.len())].as_bytes();
                data.splice(at..at, token.iter().copied());
            }
            2 if at < data.len() => {
                let end = (at + 1 + rng.below(16)).min(data.len());
                data.drain(at..end);
            }
            3 => data.truncate(at),
            4 if !other.is_empty() => {
                let from = rng.below(other.len());
                let end = (from + 1 + rng.below(64)).min(other.len());
                data.splice(at..at, other[from..end].iter().copied());
            }
            _ if !data.is_empty() => {
                // Replace a digit run's neighbourhood with a large or odd number.
                let i = rng.below(data.len());
                if data[i].is_ascii_digit() {
                    let number = ["0", "99999999999", "-3", "4294967295", "7"][rng.below(5)];
                    data.splice(i..i + 1, number.bytes());
                }
            }
            _ => {}
        }
    }
    data
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn smoke(name: &str) {
    let (_, target) = TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a target of that name");
    let inputs = corpus(name);
    assert!(!inputs.is_empty(), "fuzz/corpus/{name} is empty");
    for input in &inputs {
        target(input);
    }
    let mut rng = Rng(0x5eed_0000 ^ name.len() as u64);
    for case in 0..MUTATIONS {
        let input = &inputs[case % inputs.len()];
        let other = &inputs[rng.below(inputs.len())];
        let mutated = mutate(&mut rng, input, other);
        let outcome = std::panic::catch_unwind(|| target(&mutated));
        assert!(
            outcome.is_ok(),
            "{name}: mutation {case} panicked on {:?}",
            String::from_utf8_lossy(&mutated)
        );
    }
}

#[test]
fn every_target_has_a_test_here() {
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "ir_text",
            "schedule_json",
            "lengths",
            "config_toml",
            "pipeline"
        ]
    );
}

#[test]
fn ir_text() {
    smoke("ir_text");
}

#[test]
fn schedule_json() {
    smoke("schedule_json");
}

#[test]
fn lengths() {
    smoke("lengths");
}

#[test]
fn config_toml() {
    smoke("config_toml");
}

#[test]
fn pipeline() {
    smoke("pipeline");
}
